"""Scheduler.steady (when the next step should decode the same rows, one position on: the loop's `ahead` hint)
and `grow_ahead` (pages granted before a decoding row reaches them, never by evicting), against the fake engine;
and the ServeLoop passing the hint to the engine."""

from __future__ import annotations

import random
import time

import pytest

from kern_run.serve.errors import ConfigError
from kern_run.serve.loop import ServeLoop
from kern_run.serve.metrics import Metrics
from kern_run.serve.sampling import GREEDY
from kern_run.serve.scheduler import SchedulerConfig
from serve_testutil import rig


def prompt(seed: int, n: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(1, 900) for _ in range(n)]


def steadies(r, ticks: int) -> list[bool]:
    """steady() of each of `ticks` steps (each step then run)."""
    out = []
    for _ in range(ticks):
        step = r.sched.schedule()
        out.append(r.sched.steady(step))
        for c in step.prefills:
            r.engine.prefill(c)
        tokens = r.engine.decode(step.decodes) if step.decodes else []
        for e in r.sched.complete(step, tokens):
            r.out[e.req_id].append(e.token_id)
    return out


def test_one_request_is_steady_until_its_last_token_and_at_page_ends_without_grow_ahead():
    r = rig(page_tokens=4, chunk=8)
    r.add(1, prompt(1, 3), 8)  # step 0: prefill [0, 2) only; steps 1..8 decode positions 2..9
    got = steadies(r, 9)
    # a prefill-only step is not; then steady unless the lease lacks the next position (4 and 8 start pages) or
    # the token is the 8th
    assert got == [False, True, False, True, True, True, False, True, False]
    assert r.sched.idle and r.out[1] == r.engine.reference(prompt(1, 3), 8)
    r = rig(page_tokens=4, chunk=8, grow_ahead=2)
    r.add(1, prompt(1, 3), 8)
    assert steadies(r, 9) == [False] + [True] * 7 + [False]


def test_grow_ahead_covers_two_more_positions_never_past_the_last_one():
    r = rig(pages=16, page_tokens=4, chunk=8, grow_ahead=2)
    r.add(1, prompt(1, 3), 7)  # positions 0..8 (9 ids): 3 pages at most
    caps = []
    while not r.sched.idle:
        step = r.step()
        if 1 in r.sched and step.decodes:
            caps.append((step.decodes[0].position, r.sched.job(1).lease.capacity_tokens))
    # after the decode of position p the lease holds min(p + 3, 9) positions, rounded up to pages of 4
    assert caps == [(p, -(-min(p + 3, 9) // 4) * 4) for p in range(2, 8)]
    with pytest.raises(ConfigError, match="grow_ahead -1"):
        SchedulerConfig(max_seqs=1, chunk_tokens=8, max_context=64, grow_ahead=-1)


@pytest.mark.parametrize("pages", [5, 6, 7, 8])
def test_grow_ahead_evicts_and_preempts_nothing_more(pages: int):
    """Pages taken early come from the free ones after every row's own growth: in tight pools the same evictions
    and preemptions as without, and the same tokens."""
    runs = []
    for grow in (0, 2):
        r = rig(pages=pages, page_tokens=4, chunk=8, grow_ahead=grow, max_seqs=2)
        r.add(1, prompt(1, 2), 13)
        r.add(2, prompt(2, 6), 7)
        r.add(3, prompt(1, 2)[:1] + prompt(3, 5), 6)
        r.run()
        runs.append((r.out, r.sched.stats.preemptions, r.sched.stats.evictions))
    assert runs[0] == runs[1]
    assert runs[0][0][1] == rig().engine.reference(prompt(1, 2), 13)


def test_other_rows_prefilling_waiting_or_joining_decode():
    r = rig(max_seqs=2, page_tokens=16, chunk=8)
    r.add(1, prompt(1, 2), 30)
    steadies(r, 2)
    r.add(2, prompt(2, 30), 3)  # prefills in 4 chunks of 8 (positions 0..28) while 1 decodes
    got = steadies(r, 5)
    # admitted + chunk [0, 8): 2 stays prefilling -> steady; ... the chunk [24, 29) ends its prefill, so 2 decodes
    # next -> not; then both decode, 2 with 2 of its 3 tokens to come -> steady
    assert got == [True, True, True, False, True]
    r = rig(max_seqs=2, page_tokens=16, chunk=8)
    r.add(1, prompt(1, 2), 30)
    r.add(2, prompt(2, 2), 30)
    steadies(r, 2)
    r.add(3, prompt(3, 2), 3)  # waits: no row is free, so nothing can join until a row ends
    assert steadies(r, 1) == [True]
    r.sched.cancel(2)
    assert steadies(r, 1) == [False]  # a row is free and 3 waits: it joins


def test_the_loop_passes_the_hint_to_the_engine():
    r = rig(page_tokens=64, chunk=8)
    loop = ServeLoop(r.sched, r.engine, Metrics())
    from kern_run.serve.loop import Submission
    got = []
    loop.start()
    try:
        assert loop.try_reserve(8)
        loop.submit(Submission(1, prompt(1, 3), 6, GREEDY, frozenset(), got.append))
        deadline = time.monotonic() + 10
        while len(got) < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        loop.stop()
    assert [t.token_id for t in got] == r.engine.reference(prompt(1, 3), 6)
    assert r.engine.aheads == [True] * 5 + [False]
