"""Plans: every decision of the pool as plain frozen dataclasses of integers.

The executor (kern-runtime) carries them out on device / pinned host memory; kern-pool never touches
memory. Ids are page ids, slot ids (per-seq state slots), physical block ids and virtual block
indices; a byte offset is always `id * object_bytes` in the state's own virtual range.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PageCopy:
    """Copy page `src_page_id` onto `dst_page_id` in every paged state (all `page_tokens` rows)."""

    src_page_id: int
    dst_page_id: int


@dataclass(frozen=True, slots=True)
class SlotCopy:
    """Copy slot `src_slot_id` onto `dst_slot_id` in every per-seq state (`bytes_per_seq` each)."""

    src_slot_id: int
    dst_slot_id: int


@dataclass(frozen=True, slots=True)
class Copies:
    """Device-side work a handle needs before its first use, in this order: zero, then copy.

    `zero_slots` are slots whose recurrent state must start from zero (a fresh lease); `zero_pages`
    are pages that must read as zero (only newly mapped pages, see `RemapPlan`). Page and slot copies
    are independent of each other.
    """

    page_copies: tuple[PageCopy, ...] = ()
    slot_copies: tuple[SlotCopy, ...] = ()
    zero_pages: tuple[int, ...] = ()
    zero_slots: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        """True when there is nothing to execute."""
        return not (self.page_copies or self.slot_copies or self.zero_pages or self.zero_slots)


@dataclass(frozen=True, slots=True)
class BlockMove:
    """One physical block mapped at (or unmapped from) virtual block `block_index` of state `state_index`.

    `state_index` indexes `Layout.states`; the mapping covers bytes
    `[block_index * block_bytes, (block_index + 1) * block_bytes)` of that state's reserved range.
    """

    state_index: int
    block_index: int
    physical_block_id: int


@dataclass(frozen=True, slots=True)
class RemapPlan:
    """Move physical blocks from one object class to the other.

    Execute in order: wait for the stream event guarding the last user of the removed objects,
    `unmap` every move in `unmap`, `map` every move in `map` (+ set access), zero `zero_pages` /
    `zero_slots` on the stream, then report `Pool.land(plan)`. Until then the added objects are not
    leased and the removed ones are gone from the free lists. `serial` numbers plans from 1.
    """

    serial: int
    unmap: tuple[BlockMove, ...]
    map: tuple[BlockMove, ...]
    removed_pages: tuple[int, ...]
    removed_slots: tuple[int, ...]
    zero_pages: tuple[int, ...]
    zero_slots: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class HostCopies:
    """Copies across the host boundary on the transfer stream.

    `direction` is "park" (src = device page/slot id, dst = host page/slot id) or "wake"
    (src = host id, dst = device id). Contiguous runs may be folded into one 2-D copy by the executor.
    """

    direction: str
    page_copies: tuple[PageCopy, ...] = ()
    slot_copies: tuple[SlotCopy, ...] = ()
