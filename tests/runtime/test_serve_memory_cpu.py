"""kern serve's RuntimeMemory over kern-runtime's real pool methods on a recording driver (no GPU): the scheduler
leases, checkpoints, parks on the transfer stream (pages held until the event completes), wakes a parked hit
once its park has landed, and every page and host unit comes back."""

from __future__ import annotations

import pytest

from kern_pool import Layout
from kern_runtime import pooled
from kern_run.serve.memory import RuntimeMemory
from kern_run.serve.sampling import GREEDY
from kern_run.serve.scheduler import Scheduler, SchedulerConfig
from test_pool_exec_cpu import FakeRuntime, Recorder, rec  # noqa: F401 - rec is the fixture


def _drive(sched: Scheduler, steps: int = 500) -> dict[int, int]:
    """Run to idle with a token per decode row (the token is the position): tokens generated per request."""
    counts: dict[int, int] = {}
    for _ in range(steps):
        if sched.idle:
            return counts
        step = sched.schedule()
        for e in sched.complete(step, [r.position for r in step.decodes]):
            counts[e.req_id] = counts.get(e.req_id, 0) + 1
    raise AssertionError("not idle")


def test_parks_land_on_their_event_and_a_parked_hit_wakes(rec: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    done = {"events": False}
    monkeypatch.setattr(pooled, "event_done", lambda event: done["events"])
    rt = FakeRuntime(Layout.simple(page_tokens=4, pages=10))
    rt.reserve_host(pages=12)
    memory = RuntimeMemory(rt, has_host=True)
    sched = Scheduler(memory, SchedulerConfig(max_seqs=1, chunk_tokens=8, max_context=40))
    free0, host0 = rt.kern_pool.free_pages, rt.host_tier.free_pages
    a = list(range(1, 21))
    sched.add(1, a, 2, GREEDY)
    assert _drive(sched) == {1: 2}
    assert rt.kern_pool.held_pages == 5  # a's prefill K/V (19 positions) cached

    sched.add(2, list(range(100, 124)), 8, GREEDY)  # needs 8 of 10 pages: a's entry is parked
    step = sched.schedule()
    assert step.parks == 1 and step.admitted == () and memory.parks_in_flight == 1
    assert sched.schedule().admitted == ()  # the park holds its pages until its event completes
    done["events"] = True
    assert _drive(sched) == {2: 8}
    assert memory.parks_in_flight == 0 and sched.stats.parks == 1

    sched.add(3, a + [7], 3, GREEDY)  # a parked hit: woken (16 tokens, aligned to the chunk)
    step = sched.schedule()
    assert step.admitted == (3,) and step.wakes == 1 and step.reused_tokens == (16,)
    assert _drive(sched) == {3: 3}
    sched.prefix.clear()
    memory.poll()
    assert rt.kern_pool.free_pages == free0 and rt.kern_pool.held_pages == 0
    assert rt.host_tier.free_pages == host0
    rt.kern_pool.check()


def test_cancelling_a_waking_request_returns_its_pages(rec: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pooled, "event_done", lambda event: True)
    rt = FakeRuntime(Layout.simple(page_tokens=4, pages=10))
    rt.reserve_host(pages=12)
    memory = RuntimeMemory(rt, has_host=True)
    sched = Scheduler(memory, SchedulerConfig(max_seqs=1, chunk_tokens=8, max_context=40))
    a = list(range(1, 21))
    sched.add(1, a, 2, GREEDY)
    _drive(sched)
    sched.add(2, list(range(100, 109)), 20, GREEDY)  # grows to 7 pages: a's entry is parked on the way
    _drive(sched)
    assert sched.stats.parks == 1 and rt.kern_pool.held_pages == 2  # b's 8 prefill positions stay cached
    monkeypatch.setattr(pooled, "event_done", lambda event: False)  # the wake's copies stay in flight
    sched.add(3, a + [7], 3, GREEDY)
    assert sched.schedule().wakes == 1
    assert sched.schedule().decodes == ()  # still waking
    held = rt.kern_pool.held_pages
    assert sched.cancel(3)  # closing the Waking waits for its copies (cuEventSynchronize), then frees
    assert rt.kern_pool.held_pages < held and sched.idle
    assert rec.names("cuEventSynchronize")
    sched.prefix.clear()
    assert rt.kern_pool.held_pages == 0
