"""Host tier: unit split, room / park / wake plans, weak links, refusals."""

from __future__ import annotations

import gc

import pytest
from pool_testkit import Memory, invariant, retired

from kern_pool import (
    Busy,
    Closed,
    Copies,
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
    # full pages are linked to their host copies, and the unchanged partial tail is p2's: not a byte
    assert p3.plan.page_copies == () and p3.host_page_ids() == p2.host_page_ids()
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
    big = retired(pool, 16)
    with pytest.raises(ExceedsPool):
        host.room(big)  # type: ignore[arg-type]
    small = retired(pool, 8)
    room = host.room(small)  # type: ignore[arg-type]
    other = retired(pool, 8)
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
    parked = host.park_now(retired(pool, 12))  # type: ignore[arg-type]
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
    parked = host.park(host.room(retired(pool, 8)))  # type: ignore[arg-type]
    assert parked.close() and not parked.close()
    assert pool.free_pages == 4 and host.free_pages == 4
    with pytest.raises(Closed):
        host.wake(parked, 8, 8)
    invariant(pool, host=host)


def test_room_holds_the_shared_host_chain_until_parked() -> None:
    # a room taken while p1's host chain is shared must keep that chain alive when p1 closes before
    # park(): p2 links to it (copies nothing) and a later park never gets the same host pages
    pool, host, mem = setup(pages=8, host_pages=4)
    a = pool.lease(8)
    mem.fill(a, list(range(1, 9)))
    p1 = host.park_now(pool.checkpoint(a, 8))
    mem.apply(p1.plan)
    assert p1.host_page_ids() == [0, 1]
    room = host.room(pool.checkpoint(a, 8))
    assert room.num_host_pages == 0 and host.free_pages == 2
    p1.close()
    assert host.free_pages == 2  # pages 0, 1 stay: the room holds their chain
    host.check()
    p2 = host.park(room)
    p2.land()
    assert p2.plan.page_copies == () and p2.host_page_ids() == [0, 1]
    b = pool.lease(8)
    mem.fill(b, list(range(11, 19)))
    p3 = host.park_now(pool.checkpoint(b, 8))
    mem.apply(p3.plan)
    assert p3.host_page_ids() == [2, 3] and host.free_pages == 0
    invariant(pool, host=host)
    waking = host.wake(p2, 8, 8)
    mem.apply(waking.plan)
    waking.land()
    assert mem.read(waking.lease, 8) == list(range(1, 9))  # p2's own tokens, not p3's
    for h in (waking.lease, a, b, p2, p3):
        h.close()
    invariant(pool, host=host)
    assert host.free_pages == 4


def test_room_closed_or_dropped_unparked_releases_the_shared_chain() -> None:
    pool, host, mem = setup(pages=8, host_pages=4)
    a = pool.lease(8)
    p1 = host.park_now(pool.checkpoint(a, 8))
    room = host.room(pool.checkpoint(a, 8))
    p1.close()
    host.check()
    assert room.close() and not room.close() and room.closed
    assert host.free_pages == 4  # the room's reference was the chain's last: both pages return
    host.check()
    p1 = host.park_now(pool.checkpoint(a, 8))
    room = host.room(pool.checkpoint(a, 8))
    p1.close()
    del room
    gc.collect()
    assert host.free_pages == 4
    host.check()
    with host.room(pool.checkpoint(a, 6)) as room:  # a `with` block closes it too
        assert room.num_host_pages == 2 and host.free_pages == 2
    assert host.free_pages == 4
    invariant(pool, host=host)


def test_wrong_handles_are_misuse_before_any_change() -> None:
    pool, host, mem = setup(pages=8, host_pages=8)
    a = pool.lease(8)
    parked = host.park_now(pool.checkpoint(a, 6))
    cp = pool.checkpoint(a, 6)
    other_pool = Pool(Layout.simple(page_tokens=P, pages=8))
    other_host = Host(other_pool, 8)
    before = (pool.free_pages, host.free_pages, other_pool.free_pages, other_host.free_pages)
    with pytest.raises(Misuse, match="expected a Checkpoint of this pool, got Parked"):
        pool.lease_from(parked, 8)  # type: ignore[arg-type]
    with pytest.raises(Misuse, match="room\\(\\) needs a Checkpoint, got Parked"):
        host.room(parked)  # type: ignore[arg-type]
    with pytest.raises(Misuse, match="wake\\(\\) needs a Parked from this host, got Checkpoint"):
        host.wake(cp, 6, 8)  # type: ignore[arg-type]
    assert (pool.free_pages, host.free_pages) == before[:2]  # no lease taken (not even one leaked)
    with pytest.raises(Misuse, match="checkpoint of another pool"):
        other_host.room(cp)
    with pytest.raises(Misuse, match="another host"):
        other_host.wake(parked, 6, 8)
    with pytest.raises(Misuse, match="needs a Room"):
        host.park(cp)  # type: ignore[arg-type]
    room = host.room(cp)
    with pytest.raises(Misuse, match="room of another host"):
        other_host.park(room)
    assert not room.closed
    room.close()
    with pytest.raises(Misuse, match="needs a Pool"):
        Host(host, 8)  # type: ignore[arg-type]
    assert (pool.free_pages, host.free_pages, other_pool.free_pages, other_host.free_pages) == before
    invariant(pool, host=host)
    invariant(other_pool, host=other_host)


def test_wake_on_a_pool_without_paged_states() -> None:
    pool = Pool(Layout(page_tokens=0, page_bytes=(), slot_bytes=(MIB,), block_bytes=MIB,
                       num_blocks=4, initial_pages=0, initial_slots=3))
    mem = Memory(pool)
    host = Host(pool, 0, 2)
    lease = pool.lease_slot()
    mem.apply(lease.plan)
    mem.slots[lease.seq_slot_id] = "state"  # type: ignore[index]
    lease.advance_to(5)
    parked = host.park_now(pool.retire(lease, 5))  # type: ignore[arg-type]
    mem.apply(parked.plan)
    assert pool.free_slots == 2 and host.free_slots == 1
    for num_tokens, lease_tokens in ((5, 5), (4, 0)):  # no tokens to reserve; a slot wakes whole
        with pytest.raises(Misuse):
            host.wake(parked, num_tokens, lease_tokens)
    assert pool.free_slots == 2
    waking = host.wake(parked, 5, 0)
    assert waking.plan.page_copies == () and len(waking.plan.slot_copies) == 1
    mem.apply(waking.plan)
    waking.land()
    woken = waking.lease
    assert not woken.paged and woken.prefix_tokens == 5 and woken.page_ids() == []
    assert mem.slots[woken.seq_slot_id] == "state" and pool.free_slots == 1  # type: ignore[index]
    woken.close()
    parked.close()
    assert pool.free_slots == 2 and host.free_slots == 2
    empty = host.park_now(pool.retire(pool.lease_slot(), 0))  # type: ignore[arg-type]
    waking = host.wake(empty, 0, 0)  # divided by page_tokens 0 before the fix
    waking.land()
    woken = waking.lease
    assert waking.plan.page_copies == () and woken.prefix_tokens == 0 and pool.free_slots == 1
    assert waking.plan.slot_copies == (SlotCopy(empty.slot_id, woken.seq_slot_id),)  # type: ignore[arg-type]
    woken.close()
    empty.close()
    invariant(pool, host=host)


def test_slot_only_entry_wakes_slot_only_in_a_pool_with_pages() -> None:
    """A peer rank's slot-only checkpoint in a pool that also has paged states parks its slot and wakes into a
    slot-only lease (before: wake leased pages for it and failed looking for host pages it never had)."""
    pool = Pool(Layout.simple(page_tokens=P, pages=6, slots=3))
    mem = Memory(pool)
    host = Host(pool, 4, 2)
    lease = pool.lease_slot()
    mem.apply(lease.plan)
    mem.slots[lease.seq_slot_id] = "peer state"  # type: ignore[index]
    lease.advance_to(10)
    parked = host.park_now(pool.retire(lease, 10))  # type: ignore[arg-type]
    mem.apply(parked.plan)
    assert not parked.paged and parked.has_slot and parked.host_page_ids() == []
    assert pool.free_pages == 6 and host.free_pages == 4 and host.free_slots == 1
    for num_tokens, lease_tokens in ((10, 10), (10, 12), (4, 0)):  # no tokens to reserve; the slot wakes whole
        with pytest.raises(Misuse):
            host.wake(parked, num_tokens, lease_tokens)
    waking = host.wake(parked, 10, 0)
    assert waking.plan.page_copies == () and len(waking.plan.slot_copies) == 1
    mem.apply(waking.plan)
    waking.land()
    woken = waking.lease
    assert not woken.paged and woken.page_ids() == [] and woken.prefix_tokens == 10
    assert mem.slots[woken.seq_slot_id] == "peer state"  # type: ignore[index]
    assert pool.free_pages == 6 and pool.free_slots == 2
    invariant(pool, host=host)
    paged = host.park_now(retired(pool, 8))  # type: ignore[arg-type]
    assert paged.paged and host.wake(paged, 8, 8).close()  # a paged entry of the same pool still wakes with pages
    woken.close()
    parked.close()
    paged.close()
    invariant(pool, host=host)


def test_settle_runs_before_an_unlanded_entry_releases_anything() -> None:
    """Host(settle=...): a Parked or Waking closed or dropped before land() calls the executor's hook while its
    device pages and host units are still held, so the executor can wait for the copies first; a landed one
    does not call it."""
    calls: list[tuple[str, int, int]] = []
    pool = Pool(Layout.simple(page_tokens=P, pages=4, slots=0))
    host = Host(pool, 4, 0, settle=lambda item: calls.append((type(item).__name__, pool.free_pages, host.free_pages)))
    parked = host.park(host.room(retired(pool, 8)))  # type: ignore[arg-type]
    assert pool.free_pages == 2 and host.free_pages == 2
    assert parked.close()
    assert calls == [("Parked", 2, 2)] and pool.free_pages == 4 and host.free_pages == 4
    parked = host.park_now(retired(pool, 8))  # type: ignore[arg-type]
    waking = host.wake(parked, 8, 8)
    assert pool.free_pages == 2
    del waking
    gc.collect()
    assert calls[1:] == [("Waking", 2, 2)] and pool.free_pages == 4  # dropped: settled, then released
    waking = host.wake(parked, 8, 8)
    assert waking.close() and calls[2:] == [("Waking", 2, 2)] and pool.free_pages == 4
    waking = host.wake(parked, 8, 8)
    waking.land()
    assert waking.close() and parked.close() and len(calls) == 3  # landed entries release without the hook
    invariant(pool, host=host)


def test_waking_lease_copies_is_the_woken_lease_plan() -> None:
    """Waking.lease_copies is the pool's device plan for the woken lease, readable before and after land():
    empty for a pure-KV pool (nothing to zero), the same object the executor runs."""
    pool, host, mem = setup(pages=8, host_pages=8)
    lease = pool.lease(14)
    mem.fill(lease, list(range(14)))
    parked = host.park_now(pool.retire(lease, 14))  # type: ignore[arg-type]
    waking = host.wake(parked, 14, 16)
    before = waking.lease_copies
    assert before == Copies()  # pure-KV layout: the fresh lease has no slot to zero
    waking.land()
    assert waking.lease_copies is before is waking.lease.plan


def _woken(pool: Pool, host: Host, mem: Memory, toks: list[int], slot: bool = False) -> tuple[object, object]:
    """A session of `toks` parked, then woken whole: (the parked entry, the woken lease)."""
    lease = pool.lease(len(toks))
    mem.fill(lease, toks)
    if slot:
        mem.slots[lease.seq_slot_id] = tuple(toks)  # type: ignore[index]
    parked = host.park_now(pool.retire(lease, len(toks)))  # type: ignore[arg-type]
    mem.apply(parked.plan)
    waking = host.wake(parked, len(toks), len(toks) + 4)
    mem.apply(waking.lease_copies)
    mem.apply(waking.plan)
    waking.land()
    return parked, waking.lease


@pytest.mark.parametrize("retire", [True, False])
def test_a_woken_session_parked_again_unchanged_copies_not_a_byte(retire: bool) -> None:
    """runtime.md (K3): "醒来的再睡一个字节不拷": the full pages (weak links), the partial tail page and the slot
    all stay the host's when the session goes back at its woken length while its source is still parked."""
    pool, host, mem = setup(pages=10, slots=3, host_pages=8, host_slots=4)
    toks = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    parked, woken = _woken(pool, host, mem, toks, slot=True)
    cp = pool.retire(woken, 10) if retire else pool.checkpoint(woken, 10)  # type: ignore[arg-type]
    mem.apply(cp.plan)  # type: ignore[union-attr]
    room = host.room(cp)  # type: ignore[arg-type]
    assert room.num_host_pages == 0 and host.free_pages == 5 and host.free_slots == 3  # nothing reserved
    again = host.park(room)
    assert again.plan.page_copies == () and again.plan.slot_copies == ()
    assert again.host_page_ids() == parked.host_page_ids() and again.slot_id == parked.slot_id  # type: ignore[attr-defined]
    again.land()
    invariant(pool, host=host)
    if not retire:
        woken.close()  # type: ignore[attr-defined]
    for entry in (parked, again):
        assert mem.read_host(entry, 10) == toks and mem.host_slots[entry.slot_id] == tuple(toks)  # type: ignore[attr-defined]
    parked.close()  # type: ignore[attr-defined]
    invariant(pool, host=host)
    assert host.free_pages == 5 and host.free_slots == 3  # the shared pages, tail and slot live on in `again`
    waking = host.wake(again, 10, 10)
    mem.apply(waking.plan)
    waking.land()
    assert mem.read(waking.lease, 10) == toks and mem.slots[waking.lease.seq_slot_id] == tuple(toks)  # type: ignore[index]
    waking.lease.close()
    again.close()
    invariant(pool, host=host)
    assert host.free_pages == 8 and host.free_slots == 4


def test_a_longer_or_shorter_re_park_copies_what_changed() -> None:
    pool, host, mem = setup(pages=10, host_pages=12)
    parked, woken = _woken(pool, host, mem, [1, 2, 3, 4, 5, 6])  # tail page: 2 tokens
    shorter = pool.checkpoint(woken, 5)  # type: ignore[arg-type]
    p_short = host.park_now(shorter)
    assert p_short.plan.page_copies == () and p_short.tail_page_id == parked.tail_page_id  # type: ignore[attr-defined]
    mem.write(woken, 6, 7)  # type: ignore[arg-type]
    longer = pool.checkpoint(woken, 7)  # type: ignore[arg-type]
    grown_tail = longer.page_ids()[1]
    p_long = host.park_now(longer)
    assert [c.src_page_id for c in p_long.plan.page_copies] == [grown_tail]  # the grown tail only
    mem.apply(p_long.plan)
    mem.fill(woken, [8, 9], 7)  # type: ignore[arg-type]
    across = pool.retire(woken, 9)  # type: ignore[arg-type]
    new_pages = across.page_ids()[1:]  # type: ignore[union-attr]
    p_across = host.park_now(across)  # type: ignore[arg-type]
    assert [c.src_page_id for c in p_across.plan.page_copies] == new_pages  # page 1 is full now: copied whole
    mem.apply(p_across.plan)
    for entry, toks in ((parked, [1, 2, 3, 4, 5, 6]), (p_short, [1, 2, 3, 4, 5]), (p_long, [1, 2, 3, 4, 5, 6, 7]),
                        (p_across, [1, 2, 3, 4, 5, 6, 7, 8, 9])):
        assert mem.read_host(entry, len(toks)) == toks
    invariant(pool, host=host)
    for entry in (parked, p_long, p_short, p_across):
        entry.close()  # type: ignore[attr-defined]
        invariant(pool, host=host)
    assert host.free_pages == 12


def test_a_tail_shared_by_two_parked_entries_lives_until_both_are_gone() -> None:
    pool, host, mem = setup(pages=10, host_pages=6)
    first, woken = _woken(pool, host, mem, [1, 2, 3, 4, 5, 6])
    second = host.park_now(pool.retire(woken, 6))  # type: ignore[arg-type]
    assert second.plan.page_copies == () and host.free_pages == 4
    tail = first.tail_page_id  # type: ignore[attr-defined]
    first.close()  # type: ignore[attr-defined]
    invariant(pool, host=host)
    assert host.free_pages == 4 and second.tail_page_id == tail  # second still holds the chain and the tail
    assert mem.read_host(second, 6) == [1, 2, 3, 4, 5, 6]
    again = host.park_now(pool.checkpoint(pool.lease(8), 8))  # other sessions never get those host pages
    assert tail not in again.host_page_ids()
    again.close()
    second.close()
    invariant(pool, host=host)
    assert host.free_pages == 6


def test_a_room_holds_the_kept_tail_and_slot_until_parked_or_closed() -> None:
    pool, host, mem = setup(pages=10, slots=3, host_pages=4, host_slots=2)
    parked, woken = _woken(pool, host, mem, [1, 2, 3, 4, 5, 6], slot=True)
    room = host.room(pool.retire(woken, 6))  # type: ignore[arg-type]
    parked.close()  # type: ignore[attr-defined]
    invariant(pool, host=host)
    assert host.free_pages == 2 and host.free_slots == 1  # the room keeps the chain, tail and slot
    assert room.close()
    invariant(pool, host=host)
    assert host.free_pages == 4 and host.free_slots == 2


def test_recycled_device_pages_never_reuse_a_host_tail() -> None:
    """The woken tail page returns to the pool and a new session writes other tokens on the same page id, under
    the same chain node, at the same length: its park copies (host-side state alone cannot tell them apart)."""
    for keep_at_six in (False, True):
        pool, host, mem = setup(pages=10, host_pages=8)
        parked, woken = _woken(pool, host, mem, [1, 2, 3, 4, 5, 6])
        tail_page = woken.page_ids()[1]  # type: ignore[attr-defined]
        at4 = pool.checkpoint(woken, 4)  # type: ignore[arg-type]
        at6 = pool.checkpoint(woken, 6) if keep_at_six else None  # type: ignore[arg-type]
        woken.close()  # type: ignore[attr-defined]
        if at6 is not None:
            at6.close()  # the page stayed held past the lease, then is freed here
        other = pool.lease_from(at4, 8)
        assert other.page_ids()[1] == tail_page
        mem.fill(other, [7, 8], 4)
        cp = pool.retire(other, 6)
        assert cp._chain is at4._chain and cp.tail_page_id == tail_page  # type: ignore[union-attr]
        p2 = host.park_now(cp)  # type: ignore[arg-type]
        assert [c.src_page_id for c in p2.plan.page_copies] == [tail_page]
        mem.apply(p2.plan)
        assert mem.read_host(p2, 6) == [1, 2, 3, 4, 7, 8] and mem.read_host(parked, 6) == [1, 2, 3, 4, 5, 6]
        invariant(pool, host=host)


def test_a_partial_wake_re_parks_on_the_full_host_page() -> None:
    """Woken at 6 of 10 tokens, page 1 came whole from a full host page: parking the session again at 6 keeps
    that page (held as the new entry's tail: the source may go first)."""
    pool, host, mem = setup(pages=10, host_pages=6)
    lease = pool.lease(10)
    mem.fill(lease, list(range(1, 11)))
    parked = host.park_now(pool.retire(lease, 10))  # type: ignore[arg-type]
    mem.apply(parked.plan)
    waking = host.wake(parked, 6, 8)
    mem.apply(waking.plan)
    waking.land()
    again = host.park_now(pool.retire(waking.lease, 6))  # type: ignore[arg-type]
    assert again.plan.page_copies == () and again.host_page_ids() == parked.host_page_ids()[:2]
    parked.close()
    invariant(pool, host=host)
    assert host.free_pages == 4 and mem.read_host(again, 6) == [1, 2, 3, 4, 5, 6]
    again.close()
    invariant(pool, host=host)
    assert host.free_pages == 6


def test_one_host_tier_per_pool() -> None:
    """A second live Host on a pool is refused: the pool's chain nodes hold one weak link to a parked page, and a
    second tier read the first one's links (its room planned too few pages and parked into the other's host
    ids). Once the first tier is dropped, a new one may be made."""
    pool = Pool(Layout.simple(P, 8))
    first = Host(pool, 8)
    with pytest.raises(Misuse, match="this pool already has a host tier"):
        Host(pool, 8)
    lease = pool.lease(4 * P)
    parked = first.park_now(pool.checkpoint(lease, 2 * P))
    assert parked.host_page_ids() == [0, 1]
    parked.close()
    del parked, first
    gc.collect()
    second = Host(pool, 8)
    room = second.room(pool.checkpoint(lease, 4 * P))
    assert room.num_host_pages == 4  # none of the dropped tier's pages counts as already parked
    room.close()
    lease.close()
    second.check()
    pool.check()


def test_a_closed_waking_hands_out_no_lease() -> None:
    """close() before land() releases the woken lease; land() and .lease then raise Closed (before, .lease
    returned the closed lease)."""
    pool, host, mem = setup(pages=8, slots=2, host_pages=8, host_slots=2)
    lease = pool.lease(8)
    mem.fill(lease, list(range(1, 9)))
    parked = host.park_now(pool.checkpoint(lease, 8))
    lease.close()
    waking = host.wake(parked, 8, 8)
    assert waking.close() is True
    with pytest.raises(Closed):
        waking.land()
    with pytest.raises(Closed):
        waking.lease  # noqa: B018
    parked.close()
    invariant(pool, host=host)
    assert pool.free_pages == 8
