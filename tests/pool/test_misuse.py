"""Misuse raises before anything changes: non-int lengths / sizes, and `Prefix.insert` refusals."""

from __future__ import annotations

import gc
from typing import Any, Callable

import pytest
from pool_testkit import K, Memory, invariant, pool_state, retired

from kern_pool import (
    Capacity,
    Closed,
    Host,
    Layout,
    Misuse,
    Pool,
    PooledState,
    Prefix,
    Resident,
    block_bytes_for,
    check_prefix,
    host_split,
    host_units,
)
from kern_pool.prefix import Parked
from kern_pool.sizing import GIB, MIB

P = 16
NOT_COUNTS = [17.5, 20.0, "20", True, None]  # a float, an integral float, a string, a bool, None


def test_a_float_checkpoint_length_takes_no_slot() -> None:
    pool = Pool(Layout.simple(P, 8, slots=3))
    a = pool.lease(20)
    before = pool_state(pool)
    free = (pool.free_pages, pool.free_slots)
    with pytest.raises(Misuse):
        pool.checkpoint(a, 17.5)  # type: ignore[arg-type]
    gc.collect()
    assert (pool.free_pages, pool.free_slots) == free and pool_state(pool) == before
    invariant(pool)


def _pool_calls(pool: Pool) -> dict[str, Callable[[Any], object]]:
    """Each public pool entry point with one length argument left open; every other argument valid."""
    a = pool.lease(20)
    a.advance_to(20)
    cp = pool.checkpoint(a, 20)
    calls: dict[str, Callable[[Any], object]] = {
        "lease": lambda v: pool.lease(v),
        "grow": lambda v: pool.grow(a, v),
        "Lease.grow": lambda v: a.grow(v),
        "checkpoint": lambda v: pool.checkpoint(a, v),
        "retire": lambda v: pool.retire(a, v),
        "lease_from": lambda v: pool.lease_from(cp, v),
        "fork prefix": lambda v: pool.fork(a, v, 40),
        "fork tokens": lambda v: pool.fork(a, 20, v),
        "Lease.slot": lambda v: a.slot(v),
    }
    if not cp.has_slot:  # a shorter prefix is allowed only for pure-KV checkpoints
        calls["lease_from prefix"] = lambda v: pool.lease_from(cp, 40, prefix_tokens=v)
    if pool.layout.has_slots:
        s = pool.lease_slot()  # a slot-only lease: only the type is checked first
        s.advance_to(20)
        calls["checkpoint slot-only"] = lambda v: pool.checkpoint(s, v)
        calls["retire slot-only"] = lambda v: pool.retire(s, v)
    return calls


@pytest.mark.parametrize("slots", [0, 6])  # with free slots: a late check would have taken one
@pytest.mark.parametrize("bad", NOT_COUNTS, ids=repr)
def test_non_int_lengths_are_misuse_before_any_change(slots: int, bad: Any) -> None:
    pool = Pool(Layout.simple(P, 12, slots=slots))
    calls = _pool_calls(pool)
    handles = pool.live_handles()
    for name, call in calls.items():
        if bad is None and name in ("lease_from prefix",):
            continue  # prefix_tokens=None is the default (the checkpoint's length)
        before = pool_state(pool)
        free = (pool.free_pages, pool.free_slots)
        with pytest.raises(Misuse):
            call(bad)
        gc.collect()
        assert pool_state(pool) == before, name
        assert (pool.free_pages, pool.free_slots) == free, name
        assert not any(h.closed for h in handles), name  # retire refused: the lease still runs
        invariant(pool)


def test_wake_lengths_are_misuse_before_any_lease() -> None:
    pool = Pool(Layout.simple(P, 8, slots=3))
    host = Host(pool, 8, 2)
    parked = host.park_now(retired(pool, 20))
    before = pool_state(pool, host)
    free = (pool.free_pages, pool.free_slots, host.free_pages, host.free_slots)
    for bad in NOT_COUNTS:
        for call in (lambda: host.wake(parked, bad, 40), lambda: host.wake(parked, 20, bad)):
            with pytest.raises(Misuse):
                call()
            gc.collect()
            assert pool_state(pool, host) == before
            assert (pool.free_pages, pool.free_slots, host.free_pages, host.free_slots) == free
            invariant(pool, host=host)
    assert not parked.closed
    host.wake(parked, 20, 40).close()  # the entry still wakes
    invariant(pool, host=host)


@pytest.mark.parametrize("bad", NOT_COUNTS, ids=repr)
def test_host_sizes_must_be_ints(bad: Any) -> None:
    pool = Pool(Layout.simple(P, 4, slots=2))
    for call in (lambda: Host(pool, bad, 2), lambda: Host(pool, 4, bad), lambda: host_split(bad, pool.layout, 64),
                 lambda: host_split(100 * MIB, pool.layout, bad), lambda: host_units(100 * MIB, pool.layout, bad),
                 lambda: Host.from_bytes(pool, 100 * MIB, bad)):
        with pytest.raises(Misuse):
            call()


@pytest.mark.parametrize("bad", NOT_COUNTS, ids=repr)
def test_sizing_values_must_be_ints(bad: Any) -> None:
    kv = PooledState("kv", bytes_per_token=MIB, page_tokens=16)
    calls: list[Callable[[], object]] = [
        lambda: Capacity(tokens=100, seqs=bad),
        lambda: PooledState("kv", bytes_per_token=MIB, page_tokens=bad),
        lambda: PooledState("kv", bytes_per_token=bad, page_tokens=16),
        lambda: PooledState("rec", bytes_per_seq=bad),
        lambda: Layout.simple(P, bad),
        lambda: Layout.simple(P, 4, slots=bad),
        lambda: Layout(page_tokens=P, page_bytes=(MIB,), slot_bytes=(), block_bytes=MIB, num_blocks=bad,
                       initial_pages=2, initial_slots=0),
        lambda: block_bytes_for([bad]),
        lambda: block_bytes_for([72 * MIB], granularity_bytes=bad),
        lambda: Layout.from_capacity([kv], Capacity(tokens=None, seqs=1), free_bytes=bad if bad is not None else 2.5),
    ]
    if bad is not None:  # tokens=None means "fill free memory"
        calls.append(lambda: Capacity(tokens=bad, seqs=1))
    for call in calls:
        with pytest.raises(Misuse):
            call()
    with pytest.raises(Misuse):
        Layout.from_capacity([kv], Capacity(tokens=None, seqs=1), free_bytes=2 * GIB + 0.5)  # type: ignore[arg-type]


# ---- Prefix.insert: refused before anything changes, the caller keeps the checkpoint -------------------


def _world() -> tuple[Pool, Prefix, Any]:
    pool = Pool(Layout.simple(P, 8))
    return pool, Prefix(), pool.lease(40)


def _tree(prefix: Prefix) -> tuple[object, ...]:
    return (prefix.structure(), [(toks, tier, id(kept)) for toks, tier, kept in prefix.entries()])


def test_insert_refuses_a_closed_checkpoint() -> None:
    pool, prefix, lease = _world()
    cp = pool.checkpoint(lease, 20)
    cp.close()
    before = pool_state(pool)
    with pytest.raises(Closed):
        prefix.insert(tuple(range(20)), cp)
    assert len(prefix) == 0 and prefix.lookup(tuple(range(21))) is None
    assert pool_state(pool) == before
    invariant(pool, prefix)


def test_a_filed_checkpoint_closed_by_its_owner_is_never_served() -> None:
    """Closing a checkpoint the tree owns is misuse; lookup used to return a Hit on it (only lease_from then raised
    Closed). It is skipped like a park in flight: an entry on another branch serves the tokens it shares, and evict
    drops the closed one."""
    pool, prefix, lease = _world()
    cp, other = pool.checkpoint(lease, 20), pool.checkpoint(lease, 20)
    branch = tuple(range(10)) + tuple(range(100, 110))
    assert prefix.insert(tuple(range(20)), cp) and prefix.insert(branch, other)
    cp.close()
    hit = prefix.lookup(tuple(range(21)))
    assert hit is not None and hit.kept is other and hit.num_tokens == 10
    hit.close()
    other_hit = prefix.lookup(branch + (7,))
    assert other_hit is not None and other_hit.kept is other and other_hit.num_tokens == 20
    other_hit.close()
    while len(prefix):
        assert prefix.evict() is not None
    assert prefix.lookup(tuple(range(21))) is None and other.closed
    invariant(pool, prefix)


def test_insert_refuses_an_already_filed_checkpoint() -> None:
    pool, prefix, lease = _world()
    cp = pool.checkpoint(lease, 20)
    assert prefix.insert(tuple(range(20)), cp)
    tree, before = _tree(prefix), pool_state(pool)
    for toks, tier in [(tuple(range(100, 120)), Resident), (tuple(range(20)), Resident), (tuple(range(20)), Parked)]:
        with pytest.raises(Misuse, match="already filed"):
            prefix.insert(toks, cp, tier)
        assert not cp.closed and _tree(prefix) == tree and pool_state(pool) == before
        invariant(pool, prefix)
    assert prefix.lookup(tuple(range(100, 121))) is None
    hit = prefix.lookup(tuple(range(21)))
    assert hit is not None and hit.kept is cp
    hit.close()
    assert prefix.evict() is not None and cp.closed and len(prefix) == 0
    invariant(pool, prefix)
    # once the tree has let it go, its id is free again: a new checkpoint files normally
    again = pool.checkpoint(lease, 20)
    assert prefix.insert(tuple(range(20)), again) and not again.closed
    invariant(pool, prefix)


def test_insert_refuses_what_is_not_a_kept_prefix() -> None:
    """A live Lease filed instead of its checkpoint was an AttributeError ('Lease' object has no attribute
    'num_tokens'); so was a park callback of `evict` returning one."""
    pool, prefix, lease = _world()
    before = pool_state(pool)
    for bad in (lease, None, 20, (1, 2)):
        with pytest.raises(Misuse, match="not a kept prefix"):
            prefix.insert(tuple(range(20)), bad)  # type: ignore[arg-type]
        assert not lease.closed and len(prefix) == 0 and pool_state(pool) == before
    cp = pool.checkpoint(lease, 20)
    assert prefix.insert(tuple(range(20)), cp)
    with pytest.raises(Misuse, match="not a kept prefix"):
        prefix.evict(lambda kept: lease)  # type: ignore[arg-type, return-value]
    assert not cp.closed and len(prefix) == 1
    invariant(pool, prefix)


def test_insert_length_mismatch_keeps_the_callers_checkpoint() -> None:
    pool, prefix, lease = _world()
    cp = pool.checkpoint(lease, 20)
    before = pool_state(pool)
    free = pool.free_pages
    for toks in (tuple(range(19)), tuple(range(21)), ()):
        with pytest.raises(Misuse):
            prefix.insert(toks, cp)
        assert not cp.closed and len(prefix) == 0
        assert pool.free_pages == free and pool_state(pool) == before
        invariant(pool, prefix)
    assert prefix.insert(tuple(range(20)), cp)  # the caller still owns it and can file it
    invariant(pool, prefix)


def test_insert_refuses_a_tier_that_is_not_a_tier() -> None:
    pool, prefix, lease = _world()
    cp = pool.checkpoint(lease, 20)
    before = pool_state(pool)
    for tier in ("resident", 0, None):
        with pytest.raises(Misuse, match="tier"):
            prefix.insert(tuple(range(20)), cp, tier)  # type: ignore[arg-type]
        assert not cp.closed and len(prefix) == 0 and pool_state(pool) == before
    with pytest.raises(Misuse, match="tier"):
        prefix.count("resident")  # type: ignore[arg-type]
    invariant(pool, prefix)


def test_evict_refuses_a_bad_parked_form_and_keeps_the_entry() -> None:
    pool, prefix, lease = _world()
    cp = pool.checkpoint(lease, 20)
    assert prefix.insert(tuple(range(20)), cp)
    closed = pool.checkpoint(lease, 20)
    closed.close()
    tree = _tree(prefix)
    for park, error in ((lambda kept: closed, Closed), (lambda kept: kept, Misuse), (lambda kept: K(7), Misuse)):
        with pytest.raises(error):
            prefix.evict(park)
        assert _tree(prefix) == tree and not cp.closed
        check_prefix(prefix)
    assert prefix.evict() is not None and cp.closed  # still filed and evictable
    invariant(pool, prefix)


class _Index:
    """An integer type that is not `int` (as numpy's integers): usable wherever `operator.index` is."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def test_integer_types_other_than_int_are_counts() -> None:
    pool = Pool(Layout.simple(P, 8, slots=3))
    lease = pool.lease(_Index(20))  # type: ignore[arg-type]
    assert lease.num_pages == 2
    pool.grow(lease, _Index(40))  # type: ignore[arg-type]
    assert lease.num_pages == 3
    lease.advance_to(_Index(33))  # type: ignore[arg-type]
    cp = pool.checkpoint(lease, _Index(33))  # type: ignore[arg-type]
    assert cp.num_tokens == 33
    for h in (cp, lease):
        h.close()
    invariant(pool)


def test_a_hold_without_close_is_refused_before_anything_is_leased() -> None:
    """lease_from / wake close `hold` with the lease: one without close() is refused at the call (before, the
    AttributeError came when the lease was dropped, after the pages had been handed out)."""
    pool = Pool(Layout.simple(P, 8, slots=0))
    cp = retired(pool, 20)
    host = Host(pool, 4, 0)
    parked = host.park_now(retired(pool, 16))
    before = pool_state(pool, host)
    with pytest.raises(Misuse, match="hold"):
        pool.lease_from(cp, 32, hold=object())
    with pytest.raises(Misuse, match="hold"):
        host.wake(parked, 16, 16, hold=3)
    assert pool_state(pool, host) == before
    held: list[str] = []

    class Hold:
        def close(self) -> None:
            held.append("closed")

    pool.lease_from(cp, 32, hold=Hold()).close()
    assert held == ["closed"]
    for h in (cp, parked):
        h.close()
    invariant(pool, host=host)


# ---- a per-seq (recurrent) state is at one position: checkpoint / fork / retire only there -------------------
# runtime.md, fork (K2): "带循环状态的模型只能在父的当前位置分叉". The pool refuses any length other than the one
# the lease has reached (`reached_tokens`: the inherited prefix, lengths checkpointed or forked at, every
# position handed out by `slot(pos)`, `advance_to`).


def _refused_at(pool: Pool, lease: Any, reached: int, asked: int, host: Host | None = None) -> None:
    """checkpoint / fork / retire of `lease` at `asked` != `reached` are Misuse naming the lease, both lengths,
    and change nothing (the lease keeps running)."""
    before = pool_state(pool, host)
    free = (pool.free_pages, pool.free_slots)
    tokens = 0 if not lease.paged else max(asked, 1)
    for name, call in (("checkpoint", lambda: pool.checkpoint(lease, asked)),
                       ("fork", lambda: pool.fork(lease, asked, tokens)),
                       ("retire", lambda: pool.retire(lease, asked))):
        with pytest.raises(Misuse) as err:
            call()
        assert not isinstance(err.value, Closed)
        text = str(err.value)
        assert text.startswith(f"{name}({lease!r}, {asked})") and f"reached {reached} tokens" in text, text
        assert f"exactly the current position {reached}" in text, text
        gc.collect()
        assert pool_state(pool, host) == before, name
        assert (pool.free_pages, pool.free_slots) == free, name
        assert not lease.closed, name
    assert lease.reached_tokens == reached
    invariant(pool, host=host)


def test_a_slot_checkpoint_is_taken_at_exactly_the_written_position() -> None:
    """The audit's case: positions 0..9 written, then checkpoint(lease, 8) was accepted and filed the 10-token
    state as an 8-token one (before, only a cut below an earlier checkpoint was refused)."""
    pool = Pool(Layout.simple(P, 12, slots=6))
    mem = Memory(pool)
    lease = pool.lease(64)
    mem.fill(lease, list(range(1, 11)))  # positions 0..9
    assert lease.reached_tokens == 10 and lease.frozen_tokens == 0
    _refused_at(pool, lease, 10, 8)
    _refused_at(pool, lease, 10, 11)  # tokens the state has not seen
    cp = pool.checkpoint(lease, 10)
    assert cp.num_tokens == 10 and cp.has_slot
    for h in (cp, lease):
        h.close()
    invariant(pool)


def test_slot_lease_cannot_checkpoint_fork_or_retire_off_its_position() -> None:
    """The first audit's sequence: lease(64), checkpoint(l, 40), then checkpoint(l, 20), fork(l, 10, ...),
    retire(l, 20) were all accepted, copying or moving a slot that holds position 40's state."""
    pool = Pool(Layout.simple(P, 12, slots=6))
    lease = pool.lease(64)
    _refused_at(pool, lease, 0, 40)  # nothing written yet
    lease.advance_to(40)
    cp40 = pool.checkpoint(lease, 40)
    assert lease.frozen_tokens == 40
    for asked in (0, 10, 20, 39, 41):
        _refused_at(pool, lease, 40, asked)
    again = pool.checkpoint(lease, 40)  # at the reached length again
    lease.slot(49)  # position 49 written
    _refused_at(pool, lease, 50, 45)
    later = pool.checkpoint(lease, 50)
    child = pool.fork(lease, 50, 64)
    assert child.plan.slot_copies and child.prefix_tokens == 50 and child.reached_tokens == 50
    lease.advance_to(60)
    kept = pool.retire(lease, 60)
    assert kept is not None and lease.closed and kept.has_slot
    for h in (child, kept, later, again, cp40):
        h.close()
    invariant(pool)
    assert pool.held_pages == 0


def test_advance_to_only_moves_forward_within_the_pages() -> None:
    pool = Pool(Layout.simple(P, 12, slots=2))
    lease = pool.lease(32)
    lease.advance_to(20)
    with pytest.raises(Misuse, match=r"advance_to\(19\) on .*already reached 20 tokens"):
        lease.advance_to(19)
    with pytest.raises(Misuse, match="beyond the lease's 32 tokens"):
        lease.advance_to(33)
    with pytest.raises(Misuse, match="advance_to\\(\\) num_tokens must be an int >= 0"):
        lease.advance_to(20.0)  # type: ignore[arg-type]
    assert lease.reached_tokens == 20
    lease.close()
    with pytest.raises(Closed):
        lease.advance_to(20)
    share = pool.lease_slot()
    share.advance_to(1000)  # a slot-only lease has no pages to bound it
    assert share.reached_tokens == 1000
    share.close()


def test_fork_of_a_slot_lease_freezes_the_parent_at_the_fork_length() -> None:
    pool = Pool(Layout.simple(P, 12, slots=4))
    parent = pool.lease(64)
    parent.advance_to(40)
    child = pool.fork(parent, 40, 48)  # mid-page: page 2 copied for the child, the slot copied
    assert parent.frozen_tokens == 40
    with pytest.raises(Misuse, match="below 40"):
        parent.slot(39)  # writing below would rewind the state
    assert parent.slot(40) == parent.page_ids()[2] * P + 8
    _refused_at(pool, parent, 41, 40)  # slot(40) handed position 40 out
    _refused_at(pool, child, 40, 39)  # the child's slot is at its prefix
    cp = pool.checkpoint(child, 40)
    for h in (cp, child, parent):
        h.close()
    invariant(pool)


def test_lease_from_and_wake_of_a_slot_checkpoint_start_at_its_length() -> None:
    pool = Pool(Layout.simple(P, 16, slots=6))
    host = Host(pool, 8, 2)
    cp = retired(pool, 40)
    assert cp is not None and cp.has_slot
    resumed = pool.lease_from(cp, 64)
    _refused_at(pool, resumed, 40, 20, host)
    _refused_at(pool, resumed, 40, 41, host)
    parked = host.park_now(cp)
    waking = host.wake(parked, 40, 64)
    waking.land()
    woken = waking.lease
    _refused_at(pool, woken, 40, 39, host)
    pool.checkpoint(woken, 40).close()
    for h in (woken, resumed, parked):
        h.close()
    invariant(pool, host=host)


def test_slot_only_lease_is_cut_only_where_the_caller_advanced_it() -> None:
    """A peer rank's slot-only share writes no position: the caller says how far it is (`advance_to`), and the
    pool refuses every other length."""
    pool = Pool(Layout.simple(P, 8, slots=6))
    share = pool.lease_slot()
    _refused_at(pool, share, 0, 40)
    share.advance_to(40)
    cp = pool.checkpoint(share, 40)
    _refused_at(pool, share, 40, 20)
    share.advance_to(48)
    child = pool.fork(share, 48, 0)  # a slot-only fork also marks the parent's position
    assert child.prefix_tokens == 48 and not child.paged
    _refused_at(pool, share, 48, 40)
    _refused_at(pool, child, 48, 47)
    kept = pool.retire(share, 48)
    assert kept is not None and kept.num_tokens == 48 and not kept.paged
    for h in (kept, child, cp):
        h.close()
    invariant(pool)


def test_pure_kv_lease_may_still_be_cut_at_any_length() -> None:
    """Without a slot nothing is lost by going back: the partial page is shared or copied, as before."""
    pool = Pool(Layout.simple(P, 12, slots=0))
    lease = pool.lease(64)
    handles = [pool.checkpoint(lease, 40), pool.checkpoint(lease, 20), pool.fork(lease, 10, 16),
               pool.fork(lease, 45, 48)]
    assert lease.frozen_tokens == 40  # checkpoints freeze their lengths, a pure-KV fork does not
    kept = pool.retire(lease, 5)
    assert kept is not None and kept.num_tokens == 5 and not kept.has_slot
    for h in (kept, *handles):
        h.close()
    invariant(pool)
    assert pool.held_pages == 0


def test_refcounts_is_a_live_view_of_one_kind() -> None:
    """`Pool.refcounts(kind)`: per-id refcounts (the scratch id held by the pool, a leased page at 1), live (a
    lease taken later shows), and only for 'page' or 'slot'."""
    pool = Pool(Layout.simple(P, 8, slots=3))
    pages, slots = pool.refcounts("page"), pool.refcounts("slot")
    assert pages[pool.scratch_page_id] == 1 and slots[pool.scratch_slot_id] == 1
    before = list(pages)
    lease = pool.lease(P)
    (page,) = lease.page_ids()
    assert before[page] == 0 and pages[page] == 1 == pool.page_refs(page)
    assert slots[lease.seq_slot_id] == 1
    for kind in ("pages", "lease", ""):
        with pytest.raises(Misuse, match=r"kind is 'page' or 'slot'"):
            pool.refcounts(kind)
    lease.close()


@pytest.mark.parametrize("bad", [None, object(), "plan"])
def test_land_of_something_not_a_plan_is_misuse(bad: Any) -> None:
    pool = Pool(Layout.simple(P, 4))
    with pytest.raises(Misuse, match=f"land\\(\\) needs the RemapPlan in flight, got {type(bad).__name__}"):
        pool.land(bad)
    pool.check()


@pytest.mark.parametrize("bad", [None, "layout", 16])
def test_pool_needs_a_layout(bad: Any) -> None:
    with pytest.raises(Misuse, match=f"Pool needs a Layout, got {type(bad).__name__}"):
        Pool(bad)


def test_page_refs_refuses_ids_outside_the_pool() -> None:
    """-1 used to read the last page's count (Python indexing), a large id raised IndexError."""
    pool = Pool(Layout.simple(P, 4))
    lease = pool.lease(2 * P)
    assert [pool.page_refs(i) for i in lease.page_ids()] == [1, 1]
    for bad in (-1, 5, 10**6, 1.0):
        with pytest.raises(Misuse, match="page_refs"):
            pool.page_refs(bad)
    lease.close()
