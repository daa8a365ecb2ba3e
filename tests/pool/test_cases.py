"""Cases other engines got wrong, each checked with the global invariant after every step (P = 4)."""

from __future__ import annotations

import gc

import pytest
from pool_testkit import K, Memory, invariant

from kern_pool import Busy, Closed, ExceedsPool, Host, Layout, Pool, Prefix, Resident, check_prefix
from kern_pool.prefix import Parked

P = 4


def world(pages: int, slots: int = 0) -> tuple[Pool, Prefix, Memory]:
    """A pool whose blocks are pages (`pages` leasable + scratch), its prefix index and memory."""
    pool = Pool(Layout.simple(page_tokens=P, pages=pages, slots=slots))
    return pool, Prefix(), Memory(pool)


def seq(a: int, b: int) -> tuple[int, ...]:
    return tuple(range(a, b + 1))


def cache(pool: Pool, prefix: Prefix, mem: Memory, toks: tuple[int, ...]) -> None:
    """Lease, write `toks`, retire at full length and insert."""
    lease = pool.lease(len(toks))
    mem.apply(lease.plan)
    mem.fill(lease, list(toks))
    cp = pool.retire(lease, len(toks))
    assert cp is not None
    assert prefix.insert(toks, cp)


def test_case1_whole_prompt_cached() -> None:
    pool, prefix, mem = world(4)
    cache(pool, prefix, mem, seq(1, 8))
    invariant(pool, prefix)
    (cp,) = [k for _, _, k in prefix.entries()]
    hit = prefix.lookup(seq(1, 8))
    assert hit is not None and hit.num_tokens == 7  # never the 8-token whole prompt
    lease = pool.lease_from(hit.kept, 8, prefix_tokens=hit.num_tokens, hold=hit)
    invariant(pool, prefix)
    assert lease.page_ids()[0] == cp.page_ids()[0]
    assert [(c.src_page_id, c.dst_page_id) for c in lease.plan.page_copies] == [(cp.page_ids()[1], lease.page_ids()[1])]
    mem.apply(lease.plan)
    mem.write(lease, 7, "x")
    assert mem.read(lease, 8) == [1, 2, 3, 4, 5, 6, 7, "x"]
    assert mem.read(cp, 8) == list(seq(1, 8))
    lease.close()
    invariant(pool, prefix)


def test_case1_with_per_seq_state_the_whole_prompt_never_hits() -> None:
    pool, prefix, mem = world(4, slots=3)
    cache(pool, prefix, mem, seq(1, 8))
    assert prefix.lookup(seq(1, 8)) is None
    hit = prefix.lookup(seq(1, 9))
    assert hit is not None and hit.num_tokens == 8
    hit.close()
    invariant(pool, prefix)


def test_case2_splits() -> None:
    prefix: Prefix = Prefix()
    A, B, D = K(6, name="A"), K(6, name="B"), K(4, name="D")
    prefix.insert((1, 2, 3, 4, 5, 6), A)
    prefix.insert((1, 2, 3, 4, 7, 8), B)
    prefix.insert((1, 2, 9, 9), D)
    check_prefix(prefix)  # children under their own first key, no zero-length or pass-through node
    shape = prefix.structure()
    assert shape == ((), (None, None), (
        ((1, 2), (None, None), (
            ((3, 4), (None, None), (((5, 6), ("resident", None), ()), ((7, 8), ("resident", None), ()))),
            ((9, 9), ("resident", None), ()),
        )),
    ))
    for prompt in [(1, 2, 3), (1, 2, 3, 4, 5, 6, 0), (1, 2, 3, 4, 7, 8, 0), (1, 2, 9, 9, 0)]:
        hit = prefix.lookup(prompt)
        assert hit is not None
        hit.close()
        assert prefix.structure() == shape
    ev = prefix.evict()
    assert ev is not None and A.closes == 1  # A is the least recently used leaf
    check_prefix(prefix)
    hit_b = prefix.lookup((1, 2, 3, 4, 7, 8, 0))
    hit_d = prefix.lookup((1, 2, 9, 9, 0))
    assert hit_b is not None and hit_b.kept is B and hit_b.num_tokens == 6
    assert hit_d is not None and hit_d.kept is D and hit_d.num_tokens == 4
    hit_b.close()
    hit_d.close()


def test_case3_in_use_is_never_evicted() -> None:
    pool, prefix, mem = world(4)
    cache(pool, prefix, mem, seq(1, 8))
    invariant(pool, prefix)
    hit = prefix.lookup(seq(1, 9))
    assert hit is not None and hit.num_tokens == 8
    lease = pool.lease_from(hit.kept, 9, hold=hit)
    invariant(pool, prefix)
    with pytest.raises(Busy):
        pool.lease(8)
    assert prefix.evict() is None  # the only entry is in use
    invariant(pool, prefix)
    cp = pool.retire(lease, 9)
    assert cp is not None and prefix.insert(seq(1, 9), cp)
    invariant(pool, prefix)
    evicted = []
    while True:
        try:
            new = pool.lease(8)
            break
        except Busy:
            ev = prefix.evict()
            assert ev is not None
            evicted.append(ev.num_tokens)
            invariant(pool, prefix)
    assert evicted == [9]  # the leaf (the 9-token entry replaced the 8-token one it covers)
    assert new.num_pages == 2
    invariant(pool, prefix)


def test_case3_leaves_first_with_per_seq_entries() -> None:
    pool, prefix, mem = world(4, slots=2)
    cache(pool, prefix, mem, seq(1, 8))  # slot 1 moves to the checkpoint
    hit = prefix.lookup(seq(1, 9))
    lease = pool.lease_from(hit.kept, 9, hold=hit)  # type: ignore[union-attr]
    assert lease.plan.slot_copies[0].src_slot_id == hit.kept.seq_slot_id  # type: ignore[union-attr]
    with pytest.raises(Busy):
        pool.lease(12)  # no free slot and no free page: nothing to remap either
    assert prefix.evict() is None
    invariant(pool, prefix)
    lease.advance_to(9)  # position 8 computed: the slot's state is at 9 tokens
    cp = pool.retire(lease, 9)
    prefix.insert(seq(1, 9), cp)  # type: ignore[arg-type]
    assert len(prefix) == 2  # entries with per-seq state are distinct at every length
    evicted = []
    while True:
        try:
            pool.lease(12)
            break
        except Busy:
            evicted.append(prefix.evict().num_tokens)  # type: ignore[union-attr]
            invariant(pool, prefix)
    assert evicted == [9, 8]  # the leaf before the entry it extends


def test_case4_evicted_means_forgotten() -> None:
    pool, prefix, mem = world(3)
    cache(pool, prefix, mem, seq(1, 4))
    (cp,) = [k for _, _, k in prefix.entries()]
    old_page = cp.page_ids()[0]
    with pytest.raises(Busy):
        pool.lease(12)
    assert prefix.evict() is not None
    assert cp.closed
    big = pool.lease(12)
    invariant(pool, prefix)
    assert old_page in big.page_ids()
    assert prefix.entries() == []
    assert prefix.lookup(seq(1, 5)) is None
    cp2 = pool.retire(big, 12)
    prefix.insert(seq(20, 31), cp2)  # type: ignore[arg-type]
    invariant(pool, prefix)
    assert prefix.lookup(seq(1, 5)) is None
    assert all(old_page not in k.page_ids() or toks == seq(20, 31) for toks, _, k in prefix.entries())


def _indexed_pages(prefix: Prefix) -> set[int]:
    return {p for _, _, k in prefix.entries() for p in k.page_ids()}


def test_case5_release_exactly_once() -> None:
    pool, prefix, mem = world(8)
    for r in range(10):
        toks = seq(10 * r + 1, 10 * r + 4)
        while True:
            try:
                lease = pool.lease(4)
                break
            except Busy:
                assert prefix.evict() is not None
        mem.fill(lease, list(toks))
        while True:
            try:
                lease.grow(5)  # room for a fifth token, never written
                break
            except Busy:
                assert prefix.evict() is not None
        assert lease.num_pages == 2
        cp = pool.retire(lease, 4)
        assert pool.retire(lease, 4) is None and lease.close() is False
        prefix.insert(toks, cp)  # type: ignore[arg-type]
        invariant(pool, prefix)
        assert pool.held_pages == len(_indexed_pages(prefix))
        assert pool.free_pages + len(_indexed_pages(prefix)) == 8


@pytest.mark.parametrize("order", ["insert_then_release", "release_then_insert"])
def test_case5_insert_and_release_orders_agree(order: str) -> None:
    pool, prefix, mem = world(8)
    counts = []
    for r in range(3):
        lease = pool.lease(6)
        cp = pool.checkpoint(lease, 4)
        if order == "insert_then_release":
            prefix.insert(seq(10 * r + 1, 10 * r + 4), cp)
            lease.close()
        else:
            lease.close()
            prefix.insert(seq(10 * r + 1, 10 * r + 4), cp)
        invariant(pool, prefix)
        counts.append((pool.free_pages, pool.held_pages, len(prefix)))
    assert counts == [(7, 1, 1), (6, 2, 2), (5, 3, 3)]


def test_case6_exact_multiples() -> None:
    pool, prefix, mem = world(16)
    lease = pool.lease(4)
    mem.fill(lease, [1, 2, 3, 4])
    with pytest.raises(Exception):
        lease.slot(4)
    lease.grow(5)
    assert lease.num_pages == 2
    mem.write(lease, 4, 5)
    lease.grow(8)
    mem.fill(lease, [6, 7, 8], start=5)
    child = pool.fork(lease, 8, 8)
    assert child.plan.page_copies == () and child.page_ids() == lease.page_ids()
    child.close()
    child = pool.fork(lease, 7, 7)
    assert [c.src_page_id for c in child.plan.page_copies] == [lease.page_ids()[1]]
    child.close()
    invariant(pool)
    for n in range(0, 14):
        with pool.lease(n) as a:
            assert a.num_pages == -(-n // P)
            cp = pool.checkpoint(a, n)
            assert cp.num_pages == -(-n // P)
            with pool.fork(a, n, n) as f:
                assert f.num_pages == -(-n // P)
            with pool.lease_from(cp, n) as b:
                assert b.num_pages == -(-n // P)
            cp.close()
        invariant(pool)


def test_case7_copy_on_write_tails() -> None:
    pool, prefix, mem = world(8)
    parent = pool.lease(6)
    mem.fill(parent, [1, 2, 3, 4, 5, 6])
    child = pool.fork(parent, 6, 7)
    mem.apply(child.plan)
    mem.write(parent, 6, 7)
    mem.write(child, 6, 9)
    pp, cp_ = parent.page_ids(), child.page_ids()
    assert pp[0] == cp_[0] and pool.holders(pp[0]) == 2
    assert pp[1] != cp_[1]
    assert mem.pages[pp[1]][:3] == [5, 6, 7] and mem.pages[cp_[1]][:3] == [5, 6, 9]
    invariant(pool)
    other = pool.lease(6)
    mem.fill(other, [1, 2, 3, 4, 5, 6])
    ck = pool.checkpoint(other, 6)
    a = pool.lease_from(ck, 7)
    b = pool.lease_from(ck, 7)
    mem.apply(a.plan)
    mem.apply(b.plan)
    mem.write(a, 6, "a")
    mem.write(b, 6, "b")
    assert len({a.page_ids()[1], b.page_ids()[1], ck.page_ids()[1]}) == 3
    assert mem.read(a, 7) == [1, 2, 3, 4, 5, 6, "a"] and mem.read(b, 7) == [1, 2, 3, 4, 5, 6, "b"]
    assert mem.pages[ck.page_ids()[1]][:2] == [5, 6] and mem.pages[ck.page_ids()[1]][2] is None
    invariant(pool)


def test_case8_one_source_per_page_across_tiers() -> None:
    pool, prefix, mem = world(6)
    host = Host(pool, num_pages=8)
    cache(pool, prefix, mem, seq(1, 10))
    parked_plans = []

    def park(cp):  # type: ignore[no-untyped-def]
        p = host.park(host.room(cp))
        mem.apply(p.plan)
        parked_plans.append(p.plan)
        p.land()
        return p

    assert prefix.evict(park=park) is not None
    invariant(pool, prefix, host)
    assert pool.free_pages == 6
    cache(pool, prefix, mem, seq(1, 6))
    assert prefix.count(Resident) == 1 and prefix.count(Parked) == 1
    invariant(pool, prefix, host)
    hit = prefix.lookup(seq(1, 11))
    assert hit is not None and hit.tier is Parked and hit.num_tokens == 10
    resident_cp = [k for _, t, k in prefix.entries() if t is Resident][0]
    waking = host.wake(hit.kept, hit.num_tokens, 11, hold=hit)
    assert waking.plan.direction == "wake" and len(waking.plan.page_copies) <= 3
    host_pages = hit.kept.host_page_ids()
    with pytest.raises(Exception):
        waking.lease  # not usable before the copies land  # noqa: B018
    mem.apply(waking.plan)
    waking.land()
    lease = waking.lease
    pages = lease.page_ids()
    # every woken page comes whole from one host page; the second one is the host copy of page 2
    assert [(c.src_page_id, c.dst_page_id) for c in waking.plan.page_copies] == list(zip(host_pages, pages[:3]))
    assert not set(pages) & set(resident_cp.page_ids())
    mem.write(lease, 10, 11)
    assert mem.read(lease, 11) == list(seq(1, 11))
    assert pool.holders(pages[2]) == 1  # token 11 is in the lease's own page
    assert mem.read(resident_cp, 6) == list(seq(1, 6))
    invariant(pool, prefix, host)
    lease.close()
    invariant(pool, prefix, host)


def test_case9_stale_hits() -> None:
    pool, prefix, mem = world(3)
    cache(pool, prefix, mem, seq(1, 8))
    hit = prefix.lookup(seq(1, 9))
    assert hit is not None
    other = pool.lease(4)
    with pytest.raises(Busy):
        pool.lease(4)
    assert prefix.evict() is None  # the pinned entry is skipped
    invariant(pool, prefix)
    with pytest.raises(Busy):
        pool.lease_from(hit.kept, 9, hold=hit)  # fails cleanly
    invariant(pool, prefix)
    other.close()
    lease = pool.lease_from(hit.kept, 9, hold=hit)
    assert lease.page_ids()[:2] == hit.kept.page_ids()
    invariant(pool, prefix)
    lease.close()
    # a released hit may be evicted; using it afterwards fails cleanly
    hit2 = prefix.lookup(seq(1, 9))
    kept = hit2.kept  # type: ignore[union-attr]
    hit2.close()  # type: ignore[union-attr]
    big = pool.lease(4)
    with pytest.raises(Busy):
        pool.lease(8)
    assert prefix.evict() is not None
    with pytest.raises(Closed):
        pool.lease_from(kept, 9)
    invariant(pool, prefix)
    big.close()


def _snapshot(pool: Pool, prefix: Prefix) -> tuple[object, ...]:
    entries = [(toks, tier) for toks, tier, _ in prefix.entries()]
    return (list(pool._pages.refs), pool.free_pages, list(pool._pages.free), entries, prefix.structure())


@pytest.mark.parametrize("blocks", [3, 4])
def test_case10_failed_requests_leave_nothing(blocks: int) -> None:
    pool, prefix, mem = world(blocks)
    cache(pool, prefix, mem, seq(1, 8))
    filler = pool.lease(4) if blocks == 4 else None  # leave exactly one page free
    assert pool.free_pages == 1
    hit = prefix.lookup(seq(1, 9))
    assert hit is not None and hit.num_tokens == 8
    entry = hit._entry
    locks = entry.locks  # type: ignore[union-attr]
    before = _snapshot(pool, prefix)
    # 3 blocks: 4 pages can never fit; 4 blocks: they could after evicting the filler
    with pytest.raises(ExceedsPool if blocks == 3 else Busy):
        pool.lease_from(hit.kept, 16, hold=hit)
    assert _snapshot(pool, prefix) == before and entry.locks == locks  # type: ignore[union-attr]
    assert not hit.closed
    invariant(pool, prefix)
    lease = pool.lease_from(hit.kept, 9, hold=hit)
    mem.write(lease, 8, 9)
    del lease  # dropped mid-way
    gc.collect()
    assert entry.locks == 0  # type: ignore[union-attr]
    assert pool.free_pages == 1 and pool.held_pages == 2 + (filler is not None)
    invariant(pool, prefix)
    again = prefix.lookup(seq(1, 9))
    assert again is not None and again.kept is hit.kept and again.num_tokens == 8
    again.close()
    check_prefix(prefix)
