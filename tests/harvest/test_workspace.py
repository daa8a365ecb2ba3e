"""workspace.pack: allocations alive at the same launch never share a byte; the others may."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kern_run.harvest.workspace import ALIGN, Lifetime, pack


def test_disjoint_lifetimes_share_and_overlapping_do_not() -> None:
    offsets, total = pack([Lifetime("a", 1000, 0, 1), Lifetime("b", 300, 1, 2), Lifetime("c", 900, 2, 3)])
    assert offsets == {"a": 0, "b": 1024, "c": 0}  # c reuses a's bytes (a is dead after launch 1)
    assert total == 1536


@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 30), st.integers(0, 30)), max_size=40))
def test_live_allocations_never_overlap(raw: list[tuple[int, int, int]]) -> None:
    items = [Lifetime(f"#{i}", n, min(a, b), max(a, b)) for i, (n, a, b) in enumerate(raw)]
    offsets, total = pack(items)
    assert total % ALIGN == 0
    for x in items:
        assert offsets[x.key] % ALIGN == 0 and offsets[x.key] + x.nbytes <= total
        for y in items:
            if x.key < y.key and x.first <= y.last and y.first <= x.last and x.nbytes and y.nbytes:
                assert offsets[x.key] + x.nbytes <= offsets[y.key] or offsets[y.key] + y.nbytes <= offsets[x.key]


def test_many_short_lifetimes_pack_fast() -> None:
    import time

    items = [Lifetime(f"#{i}", 512, i, i + 3) for i in range(60_000)]
    start = time.perf_counter()
    offsets, total = pack(items)
    assert time.perf_counter() - start < 5
    assert total == 4 * 512 and sorted(set(offsets.values())) == [0, 512, 1024, 1536]
