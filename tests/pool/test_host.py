"""Host tier: unit split, room / park / wake plans, weak links, refusals."""

from __future__ import annotations

import pytest
from pool_testkit import Memory, invariant

from kern_pool import (
    Busy,
    Closed,
    ExceedsPool,
    Host,
    Layout,
    Misuse,
    NotLanded,
    PageCopy,
    Pool,
    SlotCopy,
    host_split,
    host_units,
)
from kern_pool.sizing import MIB

P = 4


def setup(pages: int = 8, slots: int = 0, host_pages: int = 8, host_slots: int = 0) -> tuple[Pool, Host, Memory]:
    pool = Pool(Layout.simple(page_tokens=P, pages=pages, slots=slots))
    return pool, Host(pool, host_pages, host_slots), Memory(pool)


def test_host_split_by_turn() -> None:
    layout = Layout(page_tokens=16, page_bytes=(2 * MIB, 1 * MIB), slot_bytes=(5 * MIB,), block_bytes=2 * MIB,
                    num_blocks=10, initial_pages=2, initial_slots=1)
    # a 64-token turn = 4 pages of 3 MiB + one 5 MiB slot = 17 MiB per unit
    assert host_units(100 * MIB, layout, 64) == 5
    assert host_split(100 * MIB, layout, 64) == (20, 5)
    assert host_split(100 * MIB, layout, 1) == (100 // 8, 100 // 8)
    kv = Layout.simple(page_tokens=16, pages=1)
    assert host_split(10 * MIB, kv, 64) == (10, 0)
    with pytest.raises(Misuse):
        host_split(MIB, kv, 0)


def test_park_copies_every_page_and_slot_then_lands() -> None:
    pool, host, mem = setup(slots=2, host_slots=2)
    lease = pool.lease(10)
    mem.fill(lease, list(range(1, 11)))
    mem.slots[lease.seq_slot_id] = "state"  # type: ignore[index]
    cp = pool.retire(lease, 10)
    assert cp is not None
    room = host.room(cp)
    assert room.num_host_pages == 3 and host.free_pages == 5
    parked = host.park(room)
    assert parked.plan.direction == "park"
    assert parked.plan.page_copies == tuple(PageCopy(d, h) for d, h in zip(cp.page_ids(), parked.host_page_ids()))
    assert parked.plan.slot_copies == (SlotCopy(cp.seq_slot_id, parked.slot_id),)  # type: ignore[arg-type]
    assert not parked.landed and not cp.closed and pool.free_pages == 5  # device pages held until landed
    mem.apply(parked.plan)
    parked.land()
    assert cp.closed and pool.free_pages == 8
    invariant(pool, host=host)
    waking = host.wake(parked, 10, 12)
    with pytest.raises(NotLanded):
        waking.lease  # noqa: B018
    mem.apply(waking.plan)
    waking.land()
    woken = waking.lease
    assert woken.prefix_tokens == 10 and woken.plan.empty  # the slot comes from the host, not zeroed
    assert mem.read(woken, 10) == list(range(1, 11)) and mem.slots[woken.seq_slot_id] == "state"  # type: ignore[index]
    invariant(pool, host=host)
    parked.close()
    woken.close()
    invariant(pool, host=host)
    assert host.free_pages == 8 and host.free_slots == 2


def test_next_turn_parks_only_new_pages_and_a_woken_session_parks_nothing_new() -> None:
    pool, host, mem = setup(pages=8, host_pages=16)
    lease = pool.lease(8)
    turn1 = pool.checkpoint(lease, 8)
    p1 = host.park_now(turn1)
    assert len(p1.plan.page_copies) == 2
    lease.grow(14)
    turn2 = pool.retire(lease, 14)
    room = host.room(turn2)  # type: ignore[arg-type]
    assert room.num_host_pages == 2  # page 3 (full) and the partial page 4; pages 1-2 are on the host
    p2 = host.park(room)
    assert [c.src_page_id for c in p2.plan.page_copies] == turn2.page_ids()[2:]  # type: ignore[union-attr]
    assert p2.host_page_ids()[:2] == p1.host_page_ids()
    p2.land()
    invariant(pool, host=host)
    waking = host.wake(p2, 14, 16)
    waking.land()
    woken = waking.lease
    again = pool.retire(woken, 14)
    p3 = host.park_now(again)  # type: ignore[arg-type]
    # full pages are linked to their host copies; only the partial tail page is copied again
    assert len(p3.plan.page_copies) == 1
    assert p3.host_page_ids()[:3] == p2.host_page_ids()[:3]
    invariant(pool, host=host)
    for p in (p1, p2, p3):
        p.close()
    invariant(pool, host=host)
    assert host.free_pages == 16


def test_host_link_dies_with_its_parked_copy() -> None:
    pool, host, mem = setup(pages=8, host_pages=8)
    lease = pool.lease(8)
    first = host.park_now(pool.checkpoint(lease, 8))
    first.close()
    second = host.park_now(pool.checkpoint(lease, 8))
    assert len(second.plan.page_copies) == 2  # the old host pages were freed: copy again
    invariant(pool, host=host)


def test_room_refusals_hand_the_checkpoint_back() -> None:
    pool, host, mem = setup(pages=8, host_pages=3)
    big = pool.retire(pool.lease(16), 16)
    with pytest.raises(ExceedsPool):
        host.room(big)  # type: ignore[arg-type]
    small = pool.retire(pool.lease(8), 8)
    room = host.room(small)  # type: ignore[arg-type]
    other = pool.retire(pool.lease(8), 8)
    with pytest.raises(Busy) as info:
        host.room(other)  # type: ignore[arg-type]
    assert info.value.checkpoint is other and not other.closed  # type: ignore[union-attr]
    assert room.close() and not room.close()
    assert host.free_pages == 3
    host.check()
    with pytest.raises(Closed):
        host.park(room)
    small.close()  # type: ignore[union-attr]
    with pytest.raises(Closed):
        host.room(small)  # type: ignore[arg-type]


def test_partial_wake_copies_only_needed_pages() -> None:
    pool, host, mem = setup(pages=8, host_pages=8)
    lease = pool.lease(14)
    mem.fill(lease, list(range(14)))
    parked = host.park(host.room(pool.retire(lease, 14)))  # type: ignore[arg-type]
    mem.apply(parked.plan)
    parked.land()
    waking = host.wake(parked, 6, 8)
    assert [c.src_page_id for c in waking.plan.page_copies] == parked.host_page_ids()[:2]
    mem.apply(waking.plan)
    waking.land()
    assert mem.read(waking.lease, 6) == list(range(6))
    with pytest.raises(Misuse):
        host.wake(parked, 15, 16)


def test_refused_wake_changes_nothing_and_closing_a_waking_releases() -> None:
    pool, host, mem = setup(pages=3, host_pages=8)
    parked = host.park_now(pool.retire(pool.lease(12), 12))  # type: ignore[arg-type]
    hold = pool.lease(4)
    with pytest.raises(Busy):
        host.wake(parked, 12, 12)
    invariant(pool, host=host)
    hold.close()
    waking = host.wake(parked, 12, 12)
    assert waking.close() and pool.free_pages == 3
    invariant(pool, host=host)


def test_parked_closed_before_landing_returns_everything() -> None:
    pool, host, mem = setup(pages=4, host_pages=4)
    parked = host.park(host.room(pool.retire(pool.lease(8), 8)))  # type: ignore[arg-type]
    assert parked.close() and not parked.close()
    assert pool.free_pages == 4 and host.free_pages == 4
    with pytest.raises(Closed):
        host.wake(parked, 8, 8)
    invariant(pool, host=host)
