"""Packing the step's intermediate allocations into one workspace buffer by their lifetimes.

An intermediate allocation is used by the launches `first .. last` of the step (its lifetime; the step's own
allocator freed it after `last`, and its contents before `first` are never read: the step allocated it fresh).
Two allocations whose lifetimes do not overlap may share bytes. `pack` places each at a fixed offset of the
workspace, at its size with the var at its max (the manifest allocates buffers there; smaller var values use a
prefix), so allocations alive at the same launch never overlap for any value of the var. First fit, in order of
first use, at `ALIGN`-byte offsets (the step's allocator returned 256-byte aligned memory, and Triton kernels are
specialised on 16-byte divisible pointers).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

ALIGN = 256


@dataclass(frozen=True)
class Lifetime:
    """An allocation to place: `key` names it, `nbytes` its size at the var's max, `first`/`last` the launch
    indices that use it (inclusive)."""

    key: str
    nbytes: int
    first: int
    last: int


def _round(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def pack(items: Sequence[Lifetime]) -> tuple[dict[str, int], int]:
    """({key: byte offset}, workspace bytes) placing every item so that two items with overlapping lifetimes get
    disjoint byte ranges `[offset, offset + nbytes)`. Deterministic (order of first use, then key). Items are
    placed in order of first use, so an item placed earlier whose lifetime ended before the current one's first use
    can overlap no later item and leaves the set searched: the cost is the number of items times the number alive
    at once (the miner bounds that, addresses.MAX_LIVE)."""
    active: list[tuple[int, int, int]] = []  # (offset, end, last) of placed items still alive, sorted by offset
    offsets: dict[str, int] = {}
    total = 0
    for item in sorted(items, key=lambda i: (i.first, i.last, i.key)):
        active = [a for a in active if a[2] >= item.first]
        offset = 0
        for o, e, _ in active:
            if offset + item.nbytes <= o:
                break
            offset = max(offset, _round(e))
        bisect.insort(active, (offset, offset + item.nbytes, item.last))
        offsets[item.key] = offset
        total = max(total, offset + item.nbytes)
    return offsets, _round(total)
