"""Pool operations, plans and refusals, one behaviour per test."""

from __future__ import annotations

import gc

import pytest
from pool_testkit import Memory, invariant, retired

from kern_pool import (
    BlockMove,
    Busy,
    Closed,
    Copies,
    ExceedsPool,
    Layout,
    Misuse,
    PageCopy,
    Pool,
    Remapping,
    SlotCopy,
)
from kern_pool.sizing import MIB


def kv_pool(pages: int, P: int = 4) -> Pool:
    return Pool(Layout.simple(page_tokens=P, pages=pages))


def mixed_pool(pages: int, slots: int, P: int = 4) -> Pool:
    return Pool(Layout.simple(page_tokens=P, pages=pages, slots=slots))


def test_scratch_ids_are_never_leased() -> None:
    pool = mixed_pool(3, 2)
    assert pool.scratch_page_id == 0 and pool.scratch_slot_id == 0
    a = pool.lease(12)
    b = pool.lease_slot()
    assert 0 not in a.page_ids() and a.seq_slot_id != 0 and b.seq_slot_id != 0
    assert kv_pool(1).scratch_slot_id is None
    invariant(pool)


def test_lease_pages_are_ceil_and_lowest_first() -> None:
    pool = kv_pool(6)
    for n, pages in [(0, 0), (1, 1), (4, 1), (5, 2), (8, 2)]:
        with pool.lease(n) as lease:
            assert lease.num_pages == pages
            assert lease.capacity_tokens == 4 * pages
            assert lease.page_ids() == list(range(1, 1 + pages))
    assert pool.free_pages == 6
    invariant(pool)


def test_lease_zeroes_its_slot() -> None:
    pool = mixed_pool(2, 2)
    lease = pool.lease(3)
    assert lease.plan == Copies(zero_slots=(lease.seq_slot_id,))
    invariant(pool)


def test_slot_mapping_and_refusals() -> None:
    pool = kv_pool(4)
    lease = pool.lease(6)
    p = lease.page_ids()
    assert [lease.slot(i) for i in range(6)] == [p[0] * 4 + 0, p[0] * 4 + 1, p[0] * 4 + 2, p[0] * 4 + 3, p[1] * 4, p[1] * 4 + 1]
    assert lease.slot(7) == p[1] * 4 + 3  # reserved even if not yet written
    with pytest.raises(Misuse):
        lease.slot(8)  # beyond the reserved pages
    cp = pool.checkpoint(lease, 6)
    with pytest.raises(Misuse):
        lease.slot(3)  # sealed page
    with pytest.raises(Misuse):
        lease.slot(5)  # checkpointed length inside the shared partial page
    assert lease.slot(6) == p[1] * 4 + 2
    child = pool.lease_from(cp, 8)
    with pytest.raises(Misuse):
        child.slot(5)  # before the prefix
    assert child.slot(6) == child.page_ids()[1] * 4 + 2
    invariant(pool)


def test_grow_before_writing_past_a_page() -> None:
    pool = kv_pool(3)
    lease = pool.lease(4)
    assert lease.num_pages == 1
    lease.grow(5)
    assert lease.num_pages == 2
    lease.grow(3)  # never shrinks
    assert lease.num_pages == 2
    with pytest.raises(ExceedsPool):
        lease.grow(100)
    invariant(pool)


def test_checkpoint_shares_pages_and_copies_slot() -> None:
    pool = mixed_pool(4, 3)
    lease = pool.lease(10)
    lease.advance_to(10)
    cp = pool.checkpoint(lease, 10)
    assert cp.page_ids() == lease.page_ids()
    assert cp.plan == Copies(slot_copies=(SlotCopy(lease.seq_slot_id, cp.seq_slot_id),))
    assert cp.seq_slot_id not in (lease.seq_slot_id, 0)
    assert lease.sealed_pages == 2 and cp.tail_page_id == lease.page_ids()[2]
    assert pool.page_refs(cp.tail_page_id) == 2 and pool.holders(cp.tail_page_id) == 2
    invariant(pool)


def test_retire_is_zero_copy_and_returns_pages_past_the_length() -> None:
    pool = mixed_pool(4, 2)
    lease = pool.lease(16)
    slot = lease.seq_slot_id
    lease.slot(4)  # position 4 written: the slot is at 5 tokens
    cp = pool.retire(lease, 5)
    assert cp is not None and lease.closed
    assert cp.num_pages == 2 and cp.seq_slot_id == slot and cp.plan.empty
    assert pool.free_pages == 2
    assert pool.retire(lease, 5) is None  # a second retire is a checked no-op
    assert lease.close() is False
    invariant(pool)


def test_fork_shares_full_pages_and_copies_the_mid_page() -> None:
    pool = mixed_pool(8, 3)
    parent = pool.lease(7)
    parent.advance_to(7)
    child = pool.fork(parent, 7, 12)
    pp, cp = parent.page_ids(), child.page_ids()
    assert cp[0] == pp[0] and cp[1] != pp[1] and len(cp) == 3
    assert child.plan.page_copies == (PageCopy(pp[1], cp[1]),)
    assert child.plan.slot_copies == (SlotCopy(parent.seq_slot_id, child.seq_slot_id),)
    assert child.prefix_tokens == 7
    invariant(pool)


def test_lease_from_shorter_length_only_for_pure_kv() -> None:
    pool = mixed_pool(6, 3)
    cp = retired(pool, 8)
    with pytest.raises(Misuse):
        pool.lease_from(cp, 8, prefix_tokens=5)
    kv = kv_pool(6)
    cp2 = retired(kv, 8)
    child = kv.lease_from(cp2, 9, prefix_tokens=5)
    assert child.prefix_tokens == 5 and child.num_pages == 3
    assert child.page_ids()[0] == cp2.page_ids()[0]
    assert child.plan.page_copies == (PageCopy(cp2.page_ids()[1], child.page_ids()[1]),)
    for bad in (-1, 9):
        with pytest.raises(Misuse):
            kv.lease_from(cp2, 10, prefix_tokens=bad)
    with pytest.raises(Misuse):
        kv.lease_from(cp2, 3)  # fewer tokens than the prefix
    invariant(kv)


@pytest.mark.parametrize("length", [0, 3, 4, 5, 8])
def test_checkpoint_and_fork_at_page_boundaries(length: int) -> None:
    pool = kv_pool(8)
    mem = Memory(pool)
    lease = pool.lease(8)
    mem.fill(lease, list(range(1, 9)))
    cp = pool.checkpoint(lease, length)
    assert cp.num_pages == -(-length // 4)
    assert mem.read(cp, length) == list(range(1, length + 1))
    child = pool.fork(lease, length, length + 1)
    mem.apply(child.plan)
    assert child.num_pages == -(-(length + 1) // 4)
    expected_copies = 1 if length % 4 else 0
    assert len(child.plan.page_copies) == expected_copies
    mem.write(child, length, 99)
    assert mem.read(child, length + 1) == list(range(1, length + 1)) + [99]
    assert mem.read(cp, length) == list(range(1, length + 1))
    assert mem.read(lease, 8) == list(range(1, 9))
    invariant(pool)


def test_close_releases_exactly_once_and_drop_releases() -> None:
    pool = kv_pool(4)
    lease = pool.lease(8)
    cp = pool.checkpoint(lease, 8)
    assert cp.close() is True and cp.close() is False
    with pytest.raises(Closed):
        cp.page_ids()
    with pytest.raises(Closed):
        pool.lease_from(cp, 8)
    with pool.lease(4):
        assert pool.free_pages == 1
    assert pool.free_pages == 2
    del lease
    gc.collect()
    assert pool.free_pages == 4
    invariant(pool)


def test_handles_of_another_pool_are_refused() -> None:
    a, b = kv_pool(2), kv_pool(2)
    lease = a.lease(4)
    with pytest.raises(Misuse):
        b.checkpoint(lease, 4)


def test_handles_of_the_wrong_type_are_refused() -> None:
    pool = kv_pool(4)
    lease = pool.lease(4)
    cp = pool.checkpoint(lease, 4)
    before = pool.free_pages
    for call in (lambda: pool.grow(cp, 8), lambda: pool.checkpoint(cp, 4), lambda: pool.retire(cp, 4),  # type: ignore[arg-type]
                 lambda: pool.fork(cp, 4, 8)):  # type: ignore[arg-type]
        with pytest.raises(Misuse, match="expected a Lease of this pool, got Checkpoint"):
            call()
    with pytest.raises(Misuse, match="expected a Checkpoint of this pool, got Lease"):
        pool.lease_from(lease, 8)  # type: ignore[arg-type]
    with pytest.raises(Misuse, match="expected a Lease of this pool, got NoneType"):
        pool.retire(None, 0)  # type: ignore[arg-type]
    assert pool.free_pages == before and not cp.closed and not lease.closed
    invariant(pool)


def test_exceeds_pool_and_busy_change_nothing() -> None:
    pool = kv_pool(3)
    with pytest.raises(ExceedsPool):
        pool.lease(13)
    held = pool.lease(8)
    before = (pool.free_pages, held.page_ids())
    with pytest.raises(Busy):
        pool.lease(8)
    assert (pool.free_pages, held.page_ids()) == before
    invariant(pool)


def test_misuse_of_lengths() -> None:
    pool = kv_pool(3)
    lease = pool.lease(5)
    for bad in (-1, 9):
        with pytest.raises(Misuse):
            pool.checkpoint(lease, bad)
    with pytest.raises(Misuse):
        pool.fork(lease, 4, 3)
    with pytest.raises(Misuse):
        pool.lease(-1)
    with pytest.raises(Misuse):
        kv_pool(1).lease_slot()


def test_slot_only_lease() -> None:
    pool = mixed_pool(2, 3)
    lease = pool.lease_slot()
    assert not lease.paged and lease.num_pages == 0
    with pytest.raises(Misuse):
        lease.slot(0)
    lease.advance_to(17)  # a slot-only lease writes no position: the caller says how far it is
    cp = pool.checkpoint(lease, 17)
    assert cp.num_tokens == 17 and cp.has_slot and cp.page_ids() == []
    child = pool.lease_from(cp, 0)
    assert child.plan.slot_copies == (SlotCopy(cp.seq_slot_id, child.seq_slot_id),)
    invariant(pool)


# ---- remap between classes ------------------------------------------------------------------------


def remap_pool(num_blocks: int = 12) -> Pool:
    """Pages of 3 MiB and slots of 3 MiB over 2 MiB blocks: objects straddle block boundaries.

    Pages 0..3 cover blocks 0..5 of state 0, slots 0..3 blocks 0..5 of state 1; any blocks beyond 12
    start free."""
    layout = Layout(page_tokens=4, page_bytes=(3 * MIB,), slot_bytes=(3 * MIB,), block_bytes=2 * MIB,
                    num_blocks=num_blocks, initial_pages=4, initial_slots=4)
    return Pool(layout)


def test_initial_mapping_shares_straddling_blocks() -> None:
    pool = remap_pool()
    moves = pool.mapping()
    assert [(m.state_index, m.block_index) for m in moves] == [(0, b) for b in range(6)] + [(1, b) for b in range(6)]
    assert sorted(m.physical_block_id for m in moves) == list(range(12))
    invariant(pool)


def test_remap_takes_highest_free_slot_and_fills_lowest_page_hole() -> None:
    pool = remap_pool(num_blocks=13)  # one block starts free
    held = pool.lease(12)  # pages 1..3, slot 1
    assert held.page_ids() == [1, 2, 3] and held.seq_slot_id == 1
    with pytest.raises(Remapping) as info:
        held.grow(16)
    plan = info.value.plan
    # page 4 = bytes 12..15 MiB = blocks 6, 7: one free block + slot 3 (bytes 9..12 MiB = blocks 4, 5;
    # block 4 is shared with slot 2, so only block 5 is unmapped)
    assert plan.zero_pages == (4,) and plan.removed_slots == (3,) and plan.removed_pages == ()
    assert [(m.state_index, m.block_index) for m in plan.unmap] == [(1, 5)]
    assert [(m.state_index, m.block_index) for m in plan.map] == [(0, 6), (0, 7)]
    assert {m.physical_block_id for m in plan.map} == {12, plan.unmap[0].physical_block_id}
    assert pool.remap_in_flight is plan
    # while it flies: what needs no remap is served, what needs one is refused with the same plan
    other = pool.lease_slot()
    assert other.seq_slot_id == 2
    with pytest.raises(Remapping) as again:
        pool.lease(1)
    assert again.value.plan is plan
    invariant(pool)
    pool.land(plan)
    assert pool.remap_in_flight is None
    assert (1, 4) in {(m.state_index, m.block_index) for m in pool.mapping()}  # straddling block kept
    held.grow(16)
    assert held.page_ids() == [1, 2, 3, 4]
    with pytest.raises(Misuse):
        pool.land(plan)
    invariant(pool)
    held.close()
    other.close()
    invariant(pool)


def test_remap_pages_to_slots_map_only_plan_and_busy_when_held() -> None:
    pool = remap_pool()
    pages = pool.lease(4)  # page 1, slot 1
    assert pages.page_ids() == [1]
    slots = [pool.lease_slot() for _ in range(2)]
    with pytest.raises(Remapping) as info:
        pool.lease_slot()
    plan = info.value.plan
    # slot 4 = blocks 6, 7 of state 1; page 3 frees only block 5 (block 4 shared with page 2), so page 2 goes too
    assert plan.zero_slots == (4,) and plan.removed_pages == (3, 2)
    pool.land(plan)
    slots.append(pool.lease_slot())
    with pytest.raises(Remapping) as info:
        pool.lease_slot()  # slot 5 needs only block 8; one block was left over: map-only plan
    assert info.value.plan.unmap == () and info.value.plan.zero_slots == (5,)
    pool.land(info.value.plan)
    slots.append(pool.lease_slot())
    with pytest.raises(Busy):
        pool.lease_slot()  # no free page to take blocks from, every slot held
    invariant(pool)
    for s in slots:
        s.close()
    pages.close()
    invariant(pool)
    assert pool.free_slots == 5 and pool.free_pages == 1


def test_land_refuses_a_plan_not_in_flight() -> None:
    pool = remap_pool()
    from kern_pool import RemapPlan

    with pytest.raises(Misuse):
        pool.land(RemapPlan(1, (), (), (), (), (), ()))


def test_block_move_is_plain_integers() -> None:
    m = BlockMove(0, 3, 7)
    assert (m.state_index, m.block_index, m.physical_block_id) == (0, 3, 7)
    with pytest.raises(AttributeError):
        m.block_index = 4  # type: ignore[misc]
