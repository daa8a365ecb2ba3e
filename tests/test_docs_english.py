"""docs/runtime.md and docs/pool.md quoted the (Chinese) runtime specification untranslated; their quotes are in
English now, and every other doc stays so."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
CJK = re.compile(r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef]")


def test_docs_have_no_untranslated_quotes() -> None:
    found = [(doc.name, n, line) for doc in sorted(DOCS.glob("*.md"))
             for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1) if CJK.search(line)]
    assert found == []
