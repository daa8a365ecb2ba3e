"""kern_pool plans -> driver calls on the compute stream (page / slot copies and zeroing).

Pure planning first: `Copies` and zero lists become a list of `Memset` / `DtoD` operations over the
pooled states' virtual ranges; contiguous runs of ids are folded into one call per state (a lease of
100 fresh pages whose slot and pages are zeroed is one `cuMemsetD8Async` per state, not 100).
`execute` issues them with `cuMemsetD8Async` / `cuMemcpyDtoDAsync` on a stream.

Address rule (docs/manifest.md "States"): object `i` of a state is `object_bytes` bytes at
`base + i * object_bytes`, where `base` is the start of the state's never-moving virtual range.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kern_pool import Copies

from .driver import call


@dataclass(frozen=True, slots=True)
class ClassGeometry:
    """One object class (pages or slots): per state, the virtual base address and the object size.

    `bases[i]` / `object_bytes[i]` belong to the i-th state of the class (kern_pool `Layout` order).
    """

    bases: tuple[int, ...]
    object_bytes: tuple[int, ...]

    @property
    def num_states(self) -> int:
        return len(self.bases)

    def uniform_stride(self) -> int | None:
        """The common distance between consecutive states' bases when every state has the same object
        size and the bases are equally spaced (and there are at least two states); else None."""
        if len(self.bases) < 2 or len(set(self.object_bytes)) != 1:
            return None
        stride = self.bases[1] - self.bases[0]
        if stride <= 0 or any(b - a != stride for a, b in zip(self.bases, self.bases[1:])):
            return None
        return stride


@dataclass(frozen=True, slots=True)
class Memset:
    """cuMemsetD8Async(dst, 0, nbytes)."""

    dst: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class DtoD:
    """cuMemcpyDtoDAsync(dst, src, nbytes)."""

    dst: int
    src: int
    nbytes: int


Op = Memset | DtoD


def id_runs(ids: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted, de-duplicated ids folded into runs `(first_id, count)` of consecutive ids.

    >>> id_runs([5, 1, 2, 3, 9, 2])
    [(1, 3), (5, 1), (9, 1)]
    """
    out: list[tuple[int, int]] = []
    for i in sorted(set(ids)):
        if out and out[-1][0] + out[-1][1] == i:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((i, 1))
    return out


def pair_runs(pairs: Iterable[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """Copy pairs `(src_id, dst_id)` folded into runs `(src_first, dst_first, count)`.

    Pairs are sorted by source; a pair extends the previous run when both its source and its
    destination follow the run's last ones. Order between runs does not matter: the pool never
    plans two copies onto one destination, and a source is never a destination of the same plan.
    """
    out: list[tuple[int, int, int]] = []
    for src, dst in sorted(set(pairs)):
        if out:
            s0, d0, n = out[-1]
            if s0 + n == src and d0 + n == dst:
                out[-1] = (s0, d0, n + 1)
                continue
        out.append((src, dst, 1))
    return out


def zero_ops(ids: Iterable[int], geometry: ClassGeometry) -> list[Op]:
    """One `Memset` per (state, run of consecutive ids)."""
    runs = id_runs(ids)
    return [Memset(base + first * size, count * size)
            for base, size in zip(geometry.bases, geometry.object_bytes) for first, count in runs]


def copy_ops(pairs: Iterable[tuple[int, int]], geometry: ClassGeometry) -> list[Op]:
    """One `DtoD` per (state, run of pairs whose sources and destinations are both consecutive)."""
    runs = pair_runs(pairs)
    return [DtoD(base + dst * size, base + src * size, count * size)
            for base, size in zip(geometry.bases, geometry.object_bytes) for src, dst, count in runs]


def plan_ops(copies: Copies, pages: ClassGeometry, slots: ClassGeometry) -> list[Op]:
    """A handle's `Copies` as driver operations, in the plan's order: zero first, then copy."""
    ops: list[Op] = []
    ops += zero_ops(copies.zero_pages, pages)
    ops += zero_ops(copies.zero_slots, slots)
    ops += copy_ops(((c.src_page_id, c.dst_page_id) for c in copies.page_copies), pages)
    ops += copy_ops(((c.src_slot_id, c.dst_slot_id) for c in copies.slot_copies), slots)
    return ops


def execute(ops: Sequence[Op], stream: Any) -> None:
    """Enqueue `ops` on `stream` (asynchronous; nothing waits)."""
    for op in ops:
        if isinstance(op, Memset):
            call("cuMemsetD8Async", op.dst, 0, op.nbytes, stream)
        else:
            call("cuMemcpyDtoDAsync", op.dst, op.src, op.nbytes, stream)
