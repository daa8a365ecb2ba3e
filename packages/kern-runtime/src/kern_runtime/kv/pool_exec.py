"""kern_pool plans -> driver calls on the compute stream (page / slot copies and zeroing).

Pure planning first: `Copies` and zero lists become a list of `Memset` / `DtoD` operations over the
pooled states' virtual ranges; contiguous runs of ids are folded into one call per state (a lease of
100 fresh pages whose slot and pages are zeroed is one `cuMemsetD8Async` per state, not 100).
`execute` issues them with `cuMemsetD8Async` / `cuMemcpyDtoDAsync` on a stream.

A plan decided elsewhere (another rank's pool, K3: `Runtime.copy` / `copy_out` / `copy_in`) is checked
first by `check_copies` / `check_pairs`: every id an int the caller's predicate accepts (mapped here, not
scratch, inside the host tier), no destination written twice, and no source that is also a destination
(the runs below are issued in id order, which is only the plan's meaning under those two rules).

Address rule (docs/manifest.md "States"): object `i` of a state is `object_bytes` bytes at
`base + i * object_bytes`, where `base` is the start of the state's never-moving virtual range.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kern_pool import Copies, Misuse, PageCopy, SlotCopy
from kern_pool.errors import check_count

from ..cuda.driver import call


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


IdCheck = Callable[[int], str | None]
"""Why an id may not appear in a plan here (a sentence naming the id), or None when it may."""

_PAIR_FIELDS: dict[type, tuple[str, str]] = {
    PageCopy: ("src_page_id", "dst_page_id"),
    SlotCopy: ("src_slot_id", "dst_slot_id"),
}


def check_ids(ids: Any, what: str, why: IdCheck) -> list[int]:
    """`ids` (a tuple or list) as ints, each accepted by `why`; else kern_pool `Misuse` naming `what[i]`."""
    if not isinstance(ids, (tuple, list)):
        raise Misuse(f"{what} must be a tuple of ids, got {type(ids).__name__}")
    out: list[int] = []
    for i, oid in enumerate(ids):
        n = check_count(oid, f"{what}[{i}]")
        reason = why(n)
        if reason is not None:
            raise Misuse(f"{what}[{i}]: {reason}")
        out.append(n)
    return out


def check_pairs(items: Any, kind: type, what: str, src_why: IdCheck, dst_why: IdCheck,
                same_space: bool) -> list[tuple[int, int]]:
    """`items` (a tuple or list of `PageCopy` / `SlotCopy`, per `kind`) as `(src, dst)` pairs, or `Misuse`.

    Every source is accepted by `src_why` and every destination by `dst_why`; no destination is written by
    two different sources; with `same_space` (device -> device) no source is also a destination. These are
    the rules kern_pool's own plans keep and `pair_runs` relies on (it issues runs in source order)."""
    if not isinstance(items, (tuple, list)):
        raise Misuse(f"{what} must be a tuple of {kind.__name__}, got {type(items).__name__}")
    src_field, dst_field = _PAIR_FIELDS[kind]
    pairs: list[tuple[int, int]] = []
    written: dict[int, int] = {}
    for i, item in enumerate(items):
        if not isinstance(item, kind):
            raise Misuse(f"{what}[{i}] must be a kern_pool {kind.__name__}, got {type(item).__name__}")
        src = check_count(getattr(item, src_field), f"{what}[{i}].{src_field}")
        dst = check_count(getattr(item, dst_field), f"{what}[{i}].{dst_field}")
        for field, oid, why in ((src_field, src, src_why), (dst_field, dst, dst_why)):
            reason = why(oid)
            if reason is not None:
                raise Misuse(f"{what}[{i}].{field}: {reason}")
        if written.setdefault(dst, src) != src:
            raise Misuse(f"{what}[{i}]: destination {dst} is written twice (from {written[dst]} and {src})")
        pairs.append((src, dst))
    if same_space:
        both = sorted({s for s, _ in pairs} & set(written))
        if both:
            raise Misuse(f"{what}: id {both[0]} is both a source and a destination; the order of the copies "
                         "would decide what it holds")
    return pairs


def check_copies(copies: Any, page_why: IdCheck, slot_why: IdCheck, what: str = "copy()") -> Copies:
    """`copies` if it is a kern_pool `Copies` whose every id passes (`check_ids` / `check_pairs`) and no id is
    both zeroed and copied from or to (zeroing runs first: a copy from a zeroed id would copy zeros, a copy to
    one would undo the zero), as in kern_pool's own plans; else `Misuse`. Pure: nothing is issued."""
    if not isinstance(copies, Copies):
        raise Misuse(f"{what} needs a kern_pool Copies, got {type(copies).__name__}")
    check_ids(copies.zero_pages, f"{what} zero_pages", page_why)
    check_ids(copies.zero_slots, f"{what} zero_slots", slot_why)
    page_pairs = check_pairs(copies.page_copies, PageCopy, f"{what} page_copies", page_why, page_why,
                             same_space=True)
    slot_pairs = check_pairs(copies.slot_copies, SlotCopy, f"{what} slot_copies", slot_why, slot_why,
                             same_space=True)
    for kind, zeroed, pairs in (("page", copies.zero_pages, page_pairs), ("slot", copies.zero_slots, slot_pairs)):
        both = sorted(set(zeroed) & {i for pair in pairs for i in pair})
        if both:
            raise Misuse(f"{what}: {kind} {both[0]} is both zeroed and copied; zeroing runs first, so the copy "
                         "would read or overwrite the zeros")
    return copies


def execute(ops: Sequence[Op], stream: Any) -> None:
    """Enqueue `ops` on `stream` (asynchronous; nothing waits)."""
    for op in ops:
        if isinstance(op, Memset):
            call("cuMemsetD8Async", op.dst, 0, op.nbytes, stream)
        else:
            call("cuMemcpyDtoDAsync", op.dst, op.src, op.nbytes, stream)
