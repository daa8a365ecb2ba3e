"""The runtime's host copies in flight, without a GPU (issue 29, points 2 to 4), and its slot cuts at exactly
the position reached (point 1: the runtime's calls are kern_pool's).

`park` / `wake` run on the transfer stream, after an event recorded on the compute stream; `park_now` /
`wake_now` run on the compute stream, which never waits for the transfer stream. A wake of an entry whose
park is still in flight is ordered on the host (`cuEventSynchronize` of the park's event before any of the
wake's copies is issued) or, with `wait=False`, refused (`NotLanded`, nothing issued). What an in-flight copy
reads or writes stays held until its event completes: a checkpoint closed under its park, a parked entry
closed under its wake.

The Recorder (test_pool_exec_cpu.py) records every driver call; `Events` decides which events have completed.
"""

from __future__ import annotations

from typing import Any

import pytest

import kern_pool
from kern_pool import Layout, NotLanded
from kern_runtime import pooled
from kern_runtime.pool_exec import pair_runs
from test_pool_exec_cpu import FakeRuntime, Recorder, rec  # noqa: F401 - rec is the fixture

LAYOUT = Layout.simple(page_tokens=16, pages=8, slots=3)  # one paged state, one per-seq state, 1 MiB each
COPIES = ("cuMemcpyDtoHAsync", "cuMemcpyHtoDAsync")


class Events:
    """Stands in for `event_done`: an event has completed once `finish()` was called after it was recorded."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.done: set[Any] = set()

    def __call__(self, event: Any) -> bool:
        return event in self.done

    def finish(self) -> None:
        self.done.update(args[0] for name, args in self.rec.calls if name == "cuEventRecord")


@pytest.fixture
def events(rec: Recorder, monkeypatch: pytest.MonkeyPatch) -> Events:
    ev = Events(rec)
    monkeypatch.setattr(pooled, "event_done", ev)
    return ev


def tier(rec: Recorder) -> tuple[FakeRuntime, Any]:
    """A runtime with a host tier of 8 pages + 2 slots, and its transfer stream."""
    rt = FakeRuntime(LAYOUT)
    rt.reserve_host(8, 2)
    return rt, rt._pooled_state.host.stream  # type: ignore[union-attr]


def kept(rt: FakeRuntime, num_tokens: int) -> Any:
    lease = rt.lease(num_tokens + 8)
    lease.slots(0, num_tokens)  # positions written: the slot is at num_tokens
    return rt.retire(lease, num_tokens)


def after_compute(calls: list[tuple[str, tuple]], transfer: Any) -> list[tuple[str, tuple]]:
    """The four calls that order the transfer stream after the compute stream, checked and removed."""
    (create, _), (record, rargs), (wait, wargs), (destroy, dargs) = calls[:4]
    assert (create, record, wait, destroy) == ("cuEventCreate", "cuEventRecord", "cuStreamWaitEvent", "cuEventDestroy")
    event = rargs[0]
    assert rargs == (event, "compute") and wargs == (transfer, event, 0) and dargs == (event,)
    return calls[4:]


def copies_on(calls: list[tuple[str, tuple]], stream: Any) -> list[str]:
    """The names of `calls`, each a copy on `stream`."""
    assert all(name in COPIES and args[-1] == stream for name, args in calls), calls
    return [name for name, _ in calls]


def runs(plan: kern_pool.HostCopies) -> int:
    """Driver copies a host plan takes here: one per run of consecutive ids (one paged, one per-seq state)."""
    return (len(pair_runs((c.src_page_id, c.dst_page_id) for c in plan.page_copies))
            + len(pair_runs((c.src_slot_id, c.dst_slot_id) for c in plan.slot_copies)))


# ---- point 1: with a slot, checkpoint / fork / retire only at the position reached --------------------------


def test_runtime_slot_cuts_are_at_exactly_the_written_position(rec: Recorder) -> None:
    """Positions 0..9 written through `Lease.slots`: a checkpoint, fork or retire at 8 (or 11) is Misuse naming
    both lengths and issues nothing (before: the 10-token slot state was copied and filed as an 8-token one)."""
    rt = FakeRuntime(LAYOUT)
    lease = rt.lease(16)
    lease.slots(0, 10)
    assert lease.reached_tokens == 10
    rec.clear()
    for asked in (8, 11):
        for call in (lambda: rt.checkpoint(lease, asked), lambda: rt.fork(lease, asked, 16),
                     lambda: rt.retire(lease, asked)):
            reached = f", {asked}\\): the lease's per-seq state has reached 10 tokens"
            with pytest.raises(kern_pool.Misuse, match=reached):
                call()
    assert rec.names(*COPIES, "cuMemcpyDtoDAsync") == [] and not lease.closed
    cp = rt.checkpoint(lease, 10)
    assert cp.num_tokens == 10 and rec.names("cuMemcpyDtoDAsync")  # the slot copied
    share = rt.lease_slot()
    share.advance_to(7)  # a slot-only lease writes no position: the caller says how far it is
    kept_share = rt.retire(share, 7)
    assert kept_share is not None and kept_share.num_tokens == 7
    for h in (cp, lease, kept_share):
        h.close()
    rt.kern_pool.check()


# ---- point 4: every mix of park / park_now with wake / wake_now -----------------------------------------------


@pytest.mark.parametrize("park", ["park", "park_now"])
@pytest.mark.parametrize("wake", ["wake", "wake_now"])
def test_every_mix_is_ordered_by_the_events_its_plans_depend_on(rec: Recorder, events: Events, park: str,
                                                                wake: str) -> None:
    rt, transfer = tier(rec)
    cp = kept(rt, 40)
    rec.clear()
    parked = rt.park(rt.room(cp)) if park == "park" else rt.park_now(cp)
    if park == "park":  # after the compute stream, on the transfer stream, then its own event
        rest = after_compute(list(rec.calls), transfer)
        assert copies_on(rest[:-2], transfer) == ["cuMemcpyDtoHAsync"] * runs(parked.plan)
        (create, _), (record, (park_event, stream)) = rest[-2:]
        assert (create, record, stream) == ("cuEventCreate", "cuEventRecord", transfer)
        assert not parked.landed
    else:  # on the compute stream, nothing to wait for
        assert copies_on(list(rec.calls), "compute") == ["cuMemcpyDtoHAsync"] * runs(parked.plan)
        assert parked.landed
    rec.clear()
    issue = rt.wake if wake == "wake" else rt.wake_now
    if park == "park":  # the copy is in flight: refused without waiting, nothing issued
        pool_free = (rt.kern_pool.free_pages, rt.kern_pool.free_slots)
        with pytest.raises(NotLanded, match="its park has not landed"):
            issue(parked, 40, 48, wait=False)
        assert rec.calls == [] and (rt.kern_pool.free_pages, rt.kern_pool.free_slots) == pool_free
    woken = issue(parked, 40, 48)
    plan = (woken if wake == "wake" else None) and woken.inner.plan
    calls = list(rec.calls)
    if park == "park":  # waited on the host for the park's event before any copy of the wake
        assert calls[:2] == [("cuEventSynchronize", (park_event,)), ("cuEventDestroy", (park_event,))]
        calls = calls[2:]
    if wake == "wake":
        rest = after_compute(calls, transfer)
        assert copies_on(rest[:-2], transfer) == ["cuMemcpyHtoDAsync"] * runs(plan)
        assert [name for name, _ in rest[-2:]] == ["cuEventCreate", "cuEventRecord"] and rest[-1][1][1] == transfer
        events.finish()
        woken = rt.awake(woken)
    else:
        pairs = zip(parked.host_page_ids(), woken.page_ids())
        plan = kern_pool.HostCopies("wake", tuple(kern_pool.PageCopy(h, d) for h, d in pairs),
                                    (kern_pool.SlotCopy(parked.slot_id, woken.seq_slot_id),))
        assert copies_on(calls, "compute") == ["cuMemcpyHtoDAsync"] * runs(plan)
    assert woken.prefix_tokens == 40
    woken.close()
    parked.close()
    rt.settle()
    rt.kern_pool.check()
    rt.host_tier.check()


# ---- point 2a: a checkpoint closed under its park ------------------------------------------------------------


def test_a_checkpoint_closed_while_its_park_flies_returns_its_pages_when_the_copy_lands(rec: Recorder,
                                                                                         events: Events) -> None:
    rt, _ = tier(rec)
    pool = rt.kern_pool
    cp = kept(rt, 40)  # 3 pages and a slot
    free = (pool.free_pages, pool.free_slots)
    parked = rt.park(rt.room(cp))
    cp.close()  # before: its pages and slot went to the next lease while the copy still read them
    assert (pool.free_pages, pool.free_slots) == free
    other = rt.lease(48)
    assert set(other.page_ids()).isdisjoint(c.src_page_id for c in parked.plan.page_copies)
    assert not rt.landed(parked)
    events.finish()
    assert rt.landed(parked)  # the park's 3 pages and slot are back; `other` holds 3 pages and a slot
    assert (pool.free_pages, pool.free_slots) == free
    other.close()
    parked.close()
    pool.check()


# ---- point 2c: a park_now reusing an in-flight park's host pages ---------------------------------------------


def test_park_now_sharing_an_in_flight_parks_pages_waits_for_it_before_a_wake(rec: Recorder, events: Events) -> None:
    rt, _ = tier(rec)
    lease = rt.lease(48)
    lease.slots(0, 32)
    first = rt.park(rt.room(rt.checkpoint(lease, 32)))  # host copies of pages 0, 1 in flight
    first_event = next(args[0] for name, args in reversed(rec.calls) if name == "cuEventRecord")
    lease.slots(32, 40)
    second = rt.park_now(rt.checkpoint(lease, 40))  # copies only the tail page; reuses pages 0, 1 on the host
    assert len(second.plan.page_copies) == 1
    assert not second.landed  # before: landed at once, and a wake_now read pages the transfer stream still wrote
    with pytest.raises(NotLanded):
        rt.wake_now(second, 40, 48, wait=False)
    rec.clear()
    woken = rt.wake_now(second, 40, 48)
    assert rec.calls[0] == ("cuEventSynchronize", (first_event,))  # on the host, before any copy of the wake
    assert first.landed and second.landed
    for h in (woken, lease, first, second):
        h.close()
    rt.kern_pool.check()
    rt.host_tier.check()


# ---- point 3: a parked entry closed under its wake -----------------------------------------------------------


def test_a_parked_entry_closed_while_a_wake_reads_it_frees_its_host_units_when_the_wake_lands(
        rec: Recorder, events: Events) -> None:
    rt, _ = tier(rec)
    host = rt.host_tier
    parked = rt.park_now(kept(rt, 40))  # 3 host pages + 1 host slot
    waking = rt.wake(parked, 40, 48)
    parked.close()  # before: its host pages went to the next park while the wake still read them
    assert (host.free_pages, host.free_slots) == (8 - 3, 2 - 1)
    other = rt.park_now(kept(rt, 16))
    assert set(other.host_page_ids()).isdisjoint(c.src_page_id for c in waking.inner.plan.page_copies)
    assert rt.awake(waking) is None  # the wake's event has not completed
    events.finish()
    woken = rt.awake(waking)
    assert woken is not None and (host.free_pages, host.free_slots) == (8 - 1, 2 - 1)
    for h in (woken, other):
        h.close()
    host.check()
    assert isinstance(host, kern_pool.Host)
