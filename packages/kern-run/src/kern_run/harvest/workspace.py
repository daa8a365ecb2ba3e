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
    disjoint byte ranges `[offset, offset + nbytes)`. Deterministic (order of first use, then key)."""
    placed: list[tuple[int, int, Lifetime]] = []  # (offset, end, item)
    offsets: dict[str, int] = {}
    for item in sorted(items, key=lambda i: (i.first, i.last, i.key)):
        busy = sorted((o, e) for o, e, other in placed if other.first <= item.last and item.first <= other.last)
        offset = 0
        for o, e in busy:
            if offset + item.nbytes <= o:
                break
            offset = max(offset, _round(e))
        placed.append((offset, offset + item.nbytes, item))
        offsets[item.key] = offset
    total = max((e for _, e, _ in placed), default=0)
    return offsets, _round(total)
