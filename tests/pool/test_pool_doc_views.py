"""docs/pool.md's read-only views say what the code returns: `free_pages` / `free_slots` are counts (ints), not
the free ids (the doc said "ids free to lease now")."""

from __future__ import annotations

from pathlib import Path

from kern_pool import Layout, Pool

DOC = Path(__file__).resolve().parents[2] / "docs" / "pool.md"


def test_free_pages_and_free_slots_are_counts_as_the_doc_says() -> None:
    pool = Pool(Layout.simple(page_tokens=4, pages=5, slots=3))
    assert (pool.free_pages, pool.free_slots) == (5, 3)
    assert type(pool.free_pages) is int and type(pool.free_slots) is int
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    assert ("`free_pages`, `free_slots` (ints: how many page / slot ids are free to lease now; `Host.free_pages` / "
            "`free_slots` likewise count the host tier's free units)") in text
