"""docs/runtime.md quoted the (Chinese) runtime specification untranslated; its quotes are in English now. (docs/pool.md
still quotes it in the holder-rule passages another change rewrites.)"""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
CJK = re.compile(r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef]")


def test_runtime_doc_has_no_untranslated_quotes() -> None:
    text = (DOCS / "runtime.md").read_text(encoding="utf-8")
    found = [(n, line) for n, line in enumerate(text.splitlines(), 1) if CJK.search(line)]
    assert found == []
