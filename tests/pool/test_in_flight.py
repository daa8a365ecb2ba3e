"""In-flight host copies are holders (issue 29): a park holds its device source and host destination, a wake
the host units it reads, and an entry whose park has not landed is neither a lookup hit nor wakeable.

Each test executes the plans through `Memory` at the moment the copy would run on the device (its `land`), so
a unit released or reused while its copy is in flight shows up as wrong bytes. Every one of them failed before
the fix: the checkpoint's pages went to the next lease at once, lookup and wake took an unlanded entry, a park
sharing an in-flight park's host pages reported `landed` at once, and a wake's host pages went to the next
park.
"""

from __future__ import annotations

import gc

import pytest
from pool_testkit import Memory, invariant, pool_state

from kern_pool import Host, Layout, Lease, NotLanded, ParkedTier, Pool, Prefix, Resident

P = 4


def setup(pages: int = 6, slots: int = 0, host_pages: int = 6, host_slots: int = 0) -> tuple[Pool, Host, Memory]:
    pool = Pool(Layout.simple(page_tokens=P, pages=pages, slots=slots))
    return pool, Host(pool, host_pages, host_slots), Memory(pool)


def written(pool: Pool, mem: Memory, tokens: list[int], lease_tokens: int | None = None) -> Lease:
    """A lease with `tokens` written at positions 0.. (its slot, if any, holding the tuple of them)."""
    lease = pool.lease(lease_tokens if lease_tokens is not None else len(tokens))
    mem.apply(lease.plan)
    mem.fill(lease, tokens)
    if lease.seq_slot_id is not None:
        mem.slots[lease.seq_slot_id] = tuple(tokens)
    return lease


# ---- 2a: a park in flight holds its device source -----------------------------------------------------------


@pytest.mark.parametrize("slots", [0, 3])
def test_closing_a_checkpoint_whose_park_is_in_flight_keeps_its_pages_and_slot(slots: int) -> None:
    pool, host, mem = setup(slots=slots, host_slots=slots)
    cp = pool.retire(written(pool, mem, [1, 2, 3, 4, 5, 6]), 6)
    assert cp is not None
    pages, slot = cp.page_ids(), cp.seq_slot_id
    parked = host.park(host.room(cp))
    cp.close()  # its holder drops it while the copy still reads it
    assert not parked.landed
    assert [pool.page_refs(p) for p in pages] == [1, 1]  # held by the park, not free
    if slots:
        assert pool.refcounts("slot")[slot] == 1  # type: ignore[index]
    invariant(pool, host=host)
    other = written(pool, mem, [9] * 8)  # the next lease: before, it got the same pages and wrote them
    assert set(other.page_ids()).isdisjoint(pages)
    if slots:
        assert other.seq_slot_id not in (None, slot)
    mem.apply(parked.plan)  # the copy runs now
    parked.land()
    assert mem.read_host(parked, 6) == [1, 2, 3, 4, 5, 6]
    if slots:
        assert mem.host_slots[parked.slot_id] == (1, 2, 3, 4, 5, 6)
    assert [pool.page_refs(p) for p in pages] == [0, 0]  # landed: now they return
    other.close()
    parked.close()
    invariant(pool, host=host)
    assert pool.held_pages == 0 and host.free_pages == host.num_pages


# ---- 2b: an unlanded park is no hit and cannot be woken -----------------------------------------------------


def test_lookup_skips_a_parked_entry_whose_park_has_not_landed() -> None:
    pool, host, mem = setup()
    prefix: Prefix = Prefix()
    toks = [1, 2, 3, 4, 5, 6, 7]
    cp = pool.retire(written(pool, mem, toks), 7)
    parked = host.park(host.room(cp))  # type: ignore[arg-type]
    assert prefix.insert(toks, parked, ParkedTier)
    assert prefix.lookup(toks + [8]) is None  # before: a hit with landed False, woken from pages being written
    assert prefix.lookup(toks[:5] + [9]) is None  # a pure-KV entry serving a shorter prefix: still not landed
    short = pool.retire(written(pool, mem, toks[:3]), 3)
    assert prefix.insert(toks[:3], short, Resident)
    hit = prefix.lookup(toks + [8])
    assert hit is not None and hit.kept is short and hit.num_tokens == 3  # the landed (resident) one serves
    hit.close()
    mem.apply(parked.plan)
    parked.land()
    hit = prefix.lookup(toks + [8])
    assert hit is not None and hit.kept is parked and hit.num_tokens == 7 and hit.tier is ParkedTier
    hit.close()
    prefix.clear()
    invariant(pool, prefix, host)


def test_lookup_finds_a_landed_pure_kv_entry_beside_an_unlanded_one() -> None:
    pool, host, mem = setup(pages=8, host_pages=8)
    prefix: Prefix = Prefix()
    a, b = [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7, 7]
    landed = host.park_now(pool.retire(written(pool, mem, a), 6))  # type: ignore[arg-type]
    mem.apply(landed.plan)
    flying = host.park(host.room(pool.retire(written(pool, mem, b), 6)))  # type: ignore[arg-type]
    assert prefix.insert(b, flying, ParkedTier) and prefix.insert(a, landed, ParkedTier)
    for prompt, want in (([1, 2, 3, 4, 7, 7, 9], 4), ([1, 2, 3, 4, 5, 6, 9], 6), ([1, 2, 3, 9], 3)):
        hit = prefix.lookup(prompt)
        assert hit is not None and hit.kept is landed and hit.num_tokens == want, prompt
        hit.close()
    mem.apply(flying.plan)
    flying.land()
    hit = prefix.lookup([1, 2, 3, 4, 7, 7, 9])
    assert hit is not None and hit.kept is flying and hit.num_tokens == 6
    hit.close()
    prefix.clear()
    invariant(pool, prefix, host)


@pytest.mark.parametrize("slots", [0, 3])
def test_wake_of_an_unlanded_park_is_not_landed_and_changes_nothing(slots: int) -> None:
    pool, host, mem = setup(slots=slots, host_slots=slots)
    parked = host.park(host.room(pool.retire(written(pool, mem, [1, 2, 3, 4, 5]), 5)))  # type: ignore[arg-type]
    before = pool_state(pool, host)
    with pytest.raises(NotLanded, match=r"wake\(\) of Parked\(5 tokens\): its park has not landed"):
        host.wake(parked, 5, 8)
    gc.collect()
    assert pool_state(pool, host) == before
    mem.apply(parked.plan)
    parked.land()
    waking = host.wake(parked, 5, 8)
    mem.apply(waking.lease_copies)
    mem.apply(waking.plan)
    waking.land()
    assert mem.read(waking.lease, 5) == [1, 2, 3, 4, 5]
    waking.lease.close()
    parked.close()
    invariant(pool, host=host)


# ---- 2c: a park sharing an in-flight park's host pages lands with it ----------------------------------------


@pytest.mark.parametrize("now", [True, False])
def test_a_park_reusing_an_in_flight_parks_host_pages_lands_only_with_it(now: bool) -> None:
    pool, host, mem = setup(slots=3, host_slots=3)
    lease = written(pool, mem, list(range(1, 9)), 12)
    first_cp = pool.checkpoint(lease, 8)
    mem.apply(first_cp.plan)
    first = host.park(host.room(first_cp))  # host pages for pages 0, 1: in flight
    mem.fill(lease, [9, 10], 8)
    mem.slots[lease.seq_slot_id] = tuple(range(1, 11))
    second_cp = pool.checkpoint(lease, 10)
    mem.apply(second_cp.plan)
    room = host.room(second_cp)
    assert room.num_host_pages == 1  # pages 0, 1 are (being) parked already: only the tail page is new
    second = host.park_now(second_cp) if now else host.park(room)
    if now:
        room.close()
    mem.apply(second.plan)
    second.land()
    assert not second.landed  # before: landed at once, and a wake read pages still being written
    with pytest.raises(NotLanded):
        host.wake(second, 10, 12)
    assert not first.landed
    mem.apply(first.plan)
    first.land()
    assert first.landed and second.landed
    waking = host.wake(second, 10, 12)
    mem.apply(waking.lease_copies)
    mem.apply(waking.plan)
    waking.land()
    assert mem.read(waking.lease, 10) == list(range(1, 11))
    for h in (waking.lease, lease, first, second):
        h.close()
    invariant(pool, host=host)
    assert host.free_pages == host.num_pages and host.free_slots == host.num_slots


def test_a_chain_of_in_flight_parks_lands_with_its_oldest() -> None:
    pool, host, mem = setup(pages=8, host_pages=8)
    lease = written(pool, mem, list(range(1, 17)))
    parks = [host.park(host.room(pool.checkpoint(lease, n))) for n in (4, 8, 12, 16)]
    for p in reversed(parks[1:]):  # the later copies land first
        mem.apply(p.plan)
        p.land()
    assert [p.landed for p in parks] == [False] * 4
    mem.apply(parks[0].plan)
    parks[0].land()
    assert [p.landed for p in parks] == [True] * 4
    assert mem.read_host(parks[3], 16) == list(range(1, 17))
    for h in (lease, *parks):
        h.close()
    invariant(pool, host=host)


# ---- 3: a wake in flight holds the host units it reads ------------------------------------------------------


@pytest.mark.parametrize("slots", [0, 3])
def test_closing_a_parked_entry_under_an_in_flight_wake_keeps_its_host_units(slots: int) -> None:
    pool, host, mem = setup(pages=8, slots=slots, host_pages=3, host_slots=slots and 2)
    parked = host.park_now(pool.retire(written(pool, mem, [1, 2, 3, 4, 5, 6]), 6))  # type: ignore[arg-type]
    mem.apply(parked.plan)
    host_pages, host_slot = parked.host_page_ids(), parked.slot_id
    waking = host.wake(parked, 6, 8)
    parked.close()  # while the wake still reads its host pages
    free_slots = 1 if slots else 0
    assert (host.free_pages, host.free_slots) == (1, free_slots)  # before: (3, 2), the next park took the same
    invariant(pool, host=host)
    other = host.park(host.room(pool.retire(written(pool, mem, [7]), 1)))  # type: ignore[arg-type]
    assert set(other.host_page_ids()).isdisjoint(host_pages)
    if slots:
        assert host_slot is not None and other.slot_id not in (None, host_slot)
    mem.apply(other.plan)
    other.land()
    mem.apply(waking.lease_copies)
    mem.apply(waking.plan)  # the wake's copy runs only now
    waking.land()
    assert mem.read(waking.lease, 6) == [1, 2, 3, 4, 5, 6]
    if slots:
        assert mem.slots[waking.lease.seq_slot_id] == (1, 2, 3, 4, 5, 6)
    assert (host.free_pages, host.free_slots) == (3 - 1, free_slots)  # landed: the closed entry's units are free
    waking.lease.close()
    other.close()
    invariant(pool, host=host)
    assert host.free_pages == 3


def test_a_partial_wake_holds_only_the_pages_it_reads() -> None:
    pool, host, mem = setup(pages=8, host_pages=4)
    parked = host.park_now(pool.retire(written(pool, mem, list(range(1, 11))), 10))  # type: ignore[arg-type]
    mem.apply(parked.plan)
    waking = host.wake(parked, 5, 8)  # pages 0 and 1 of 3
    parked.close()
    assert host.free_pages == 4 - 2  # the tail page (2) is free at once
    waking.close()  # before landing: releases the lease and the host pages (no executor: nothing in flight)
    assert host.free_pages == 4
    invariant(pool, host=host)
