"""Pooled-state geometry: what a `Capacity` buys, computed by kern_pool's sizing rules.

kern_pool owns the rules (block size: a multiple of the 2 MiB granularity, at most half the smallest
pooled object, capped at 64 MiB; tokens aligned down to whole pages; slots = seqs + 2; one scratch
page and slot 0 as scratch; tokens=None fills free memory less 1 GiB headroom). This module turns
kern_pool's `Layout` into what the runtime allocates: per state, a reserved virtual range (room for
every block of the pool, so later remaps never move it) and the bytes mapped at load (the blocks
covering that state's initial pages or slots; all of them are mapped now).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from kern_manifest import State
from kern_pool import sizing
from kern_pool.errors import PoolError
from kern_pool.sizing import Layout, PooledState

from ..errors import ApiError

__all__ = ["Capacity", "PoolLayout", "plan_pool"]


class Capacity(sizing.Capacity):
    """What `Runtime.load` should hold at once: `tokens` of paged state (None: fill free memory, less 1 GiB) and
    `seqs` sequences (kern_pool's `Capacity`, whose sizing rules it keeps). Raises ApiError, a KernError, unless
    both are ints >= 0 (`tokens` may be None), so an engine catching KernError sees a bad capacity too."""

    __slots__ = ()

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except PoolError as exc:
            raise ApiError(f"Capacity(tokens={self.tokens!r}, seqs={self.seqs!r}): {exc}") from None


@dataclass(frozen=True)
class PoolLayout:
    """The runtime's view of a kern_pool `Layout`.

    `page_tokens` / `num_pages`: paged geometry (None without paged states); page ids are
    0..num_pages-1 and `scratch_page_id` (0) is reserved for writes that must land somewhere harmless.
    `num_slots`: per-seq slots (slot 0 is scratch). `mapped_bytes[state]`: bytes backed by blocks at
    load; `reserve_bytes`: virtual range reserved per state; `block_bytes`: the VMM block size.
    `reserved_pages[state]` (paged states only): pages that fit in the state's reserved range,
    `reserve_bytes // page_bytes`: page ids `0 .. reserved_pages - 1` address memory inside it, whatever
    remaps map there later; what a manifest's `{"pages_of": state}` argument resolves to."""

    layout: Layout
    page_tokens: int | None
    num_pages: int | None
    num_slots: int
    block_bytes: int
    reserve_bytes: int
    mapped_bytes: Mapping[str, int]
    reserved_pages: Mapping[str, int]

    @property
    def scratch_page_id(self) -> int | None:
        return 0 if self.num_pages is not None else None


def _pooled(states: Mapping[str, State]) -> list[PooledState]:
    out = []
    for s in states.values():
        if s.kind == "paged":
            out.append(PooledState(s.name, bytes_per_token=s.bytes_per_token or 0, page_tokens=s.page_tokens or 0))
        elif s.kind == "per_seq":
            out.append(PooledState(s.name, bytes_per_seq=s.bytes_per_seq or 0))
    return out


def plan_pool(states: Mapping[str, State], capacity: Capacity, granularity_bytes: int,
              free_bytes: int | None = None) -> PoolLayout | None:
    """Size the pooled states (None when the manifest has none).

    `free_bytes` (cuMemGetInfo after every other allocation) sizes a capacity.tokens None pool, and bounds one
    of given tokens (kern_pool's `Layout.from_capacity` refuses a layout past it, before anything is reserved).
    Raises ApiError when kern_pool refuses (bad capacity, memory holds no page, a pool past `free_bytes`: "needs
    N bytes ... has M bytes free").
    """
    pooled = _pooled(states)
    if not pooled:
        return None
    try:
        layout = Layout.from_capacity(pooled, capacity, free_bytes=free_bytes, granularity_bytes=granularity_bytes)
    except PoolError as exc:  # Misuse / ExceedsPool
        raise ApiError(f"capacity {capacity}: {exc}") from exc
    block = layout.block_bytes
    mapped: dict[str, int] = {}
    for name, page_bytes in zip(layout.states, layout.page_bytes):
        mapped[name] = -(-layout.initial_pages * page_bytes // block) * block
    for name, slot_bytes in zip(layout.states[len(layout.page_bytes):], layout.slot_bytes):
        mapped[name] = -(-layout.initial_slots * slot_bytes // block) * block
    return PoolLayout(
        layout=layout,
        page_tokens=layout.page_tokens if layout.paged else None,
        num_pages=layout.initial_pages if layout.paged else None,
        num_slots=layout.initial_slots,
        block_bytes=block,
        reserve_bytes=layout.va_bytes_per_state,
        mapped_bytes=mapped,
        reserved_pages={name: layout.va_bytes_per_state // page_bytes
                        for name, page_bytes in zip(layout.states, layout.page_bytes)},
    )
