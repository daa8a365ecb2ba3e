"""docs/pool.md's runnable example (the python block under "### Example") runs as written, so it stays true."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "pool.md"


def example() -> str:
    """The first python code block after the "### Example" heading of docs/pool.md."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n### Example\n", 1)
    assert len(section) == 2, "docs/pool.md has no '### Example' section"
    match = re.search(r"^```python\n(.*?)^```$", section[1], re.S | re.M)
    assert match is not None, "the '### Example' section of docs/pool.md has no python code block"
    return match.group(1)


def test_the_docs_example_runs() -> None:
    code = example()
    assert len(code.splitlines()) <= 25  # a short example
    for call in ("lease(", "checkpoint(", "fork(", ".insert(", ".lookup(", "close()"):
        assert call in code
    namespace: dict[str, object] = {"__name__": "pool_md_example"}
    exec(compile(code, f"{DOC}:Example", "exec"), namespace)
    pool = namespace["pool"]
    assert pool.free_pages == 8 and pool.live_handles() == []  # type: ignore[attr-defined]
    pool.check()  # type: ignore[attr-defined]
