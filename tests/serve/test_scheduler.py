"""The scheduler against the fake engine: admission, chunked prefill under the budget, preemption,
cancellation, prefix reuse, park / wake, and a leak check over 10^4 requests."""

from __future__ import annotations

import random

import pytest

from kern_run.serve.errors import ConfigError
from kern_run.serve.scheduler import SchedulerConfig
from serve_testutil import rig


def prompt(seed: int, n: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(1, 900) for _ in range(n)]


def test_one_request_matches_the_engine_alone():
    r = rig()
    p = prompt(1, 19)
    r.add(1, p, 5)
    r.run()
    assert r.out[1] == r.engine.reference(p, 5)
    assert r.finish == {1: "length"}
    # 18 prefill positions in chunks [0, 8) [8, 16) [16, 18), then 5 decode steps
    assert [(c.start, c.stop) for s in r.steps for c in s.prefills] == [(0, 8), (8, 16), (16, 18)]
    assert sum(len(s.decodes) for s in r.steps) == 5


def test_rows_are_capped_and_admission_is_first_come_first_served():
    r = rig(max_seqs=2)
    for i in range(1, 4):
        r.add(i, prompt(i, 3), 4)
    step = r.step()
    assert step.admitted == (1, 2)
    assert r.sched.num_waiting == 1 and r.sched.num_running == 2
    r.run()
    admitted = [s.admitted for s in r.steps if s.admitted]
    assert admitted == [(1, 2), (3,)]
    assert max(len(s.decodes) for s in r.steps) == 2
    for i in range(1, 4):
        assert r.out[i] == r.engine.reference(prompt(i, 3), 4)


def test_a_long_prompt_interleaves_with_decode_one_chunk_per_step():
    r = rig(max_seqs=2, chunk=8)  # budget 8 + 2
    r.add(1, prompt(1, 2), 30)
    r.step()  # admitted: nothing to prefill beyond position 0 ... one chunk [0, 1)
    r.step()
    r.add(2, prompt(2, 41), 3)
    steps_before = len(r.steps)
    r.run()
    later = r.steps[steps_before:]
    chunks = [(c.start, c.stop) for s in later for c in s.prefills]
    assert chunks == [(0, 8), (8, 16), (16, 24), (24, 32), (32, 40)]
    for s in later[:5]:  # request 1 keeps decoding while 2 prefills
        assert [d.req_id for d in s.decodes] == [1]
        assert s.num_tokens <= 10
    assert r.out[1] == r.engine.reference(prompt(1, 2), 30)
    assert r.out[2] == r.engine.reference(prompt(2, 41), 3)


def test_batch_invariant_prefill_cuts_chunks_by_the_budget():
    r = rig(max_seqs=2, chunk=8, budget=11, batch_invariant_prefill=True)
    r.add(1, prompt(1, 2), 20)
    r.step()
    r.add(2, prompt(2, 30), 2)
    r.run()
    spans = [(c.start, c.stop) for s in r.steps for c in s.prefills if c.req_id == 2]
    # a decode row takes 1 of 11: chunks end at multiples of 8 or where the budget of 10 runs out
    assert spans == [(0, 8), (8, 16), (16, 24), (24, 29)]
    assert r.out[2] == r.engine.reference(prompt(2, 30), 2)


def test_prefix_reuse_skips_cached_tokens_aligned_to_the_chunk():
    r = rig(chunk=8)
    shared = prompt(7, 21)
    r.add(1, shared + [5, 6], 3)
    r.run()
    first = [(c.start, c.stop) for s in r.steps for c in s.prefills]
    assert first == [(0, 8), (8, 16), (16, 22)]
    n = len(r.steps)
    r.add(2, shared + [9, 9, 9], 3)
    r.run()
    assert r.steps[n].admitted == (2,)
    assert r.steps[n].reused_tokens == (16,)  # 21 shared tokens, aligned down to the chunk
    assert [(c.start, c.stop) for s in r.steps[n:] for c in s.prefills] == [(16, 23)]
    assert r.out[2] == r.engine.reference(shared + [9, 9, 9], 3)
    assert r.sched.stats.reused_tokens == 16


def test_prefix_reuse_at_any_token_with_batch_invariant_prefill():
    r = rig(chunk=8, batch_invariant_prefill=True)
    shared = prompt(7, 21)
    r.add(1, shared + [5], 3)
    r.run()
    n = len(r.steps)
    r.add(2, shared + [9, 9], 3)
    r.run()
    assert r.steps[n].reused_tokens == (21,)  # mid-page: lease_from copies the page
    assert [(c.start, c.stop) for s in r.steps[n:] for c in s.prefills] == [(21, 22)]
    assert r.out[2] == r.engine.reference(shared + [9, 9], 3)


def test_a_request_arriving_while_the_prefix_owner_decodes_shares_it():
    r = rig(chunk=8)
    shared = prompt(3, 17)
    r.add(1, shared, 20)
    for _ in range(4):
        r.step()
    r.add(2, shared + [4], 2)
    step = r.step()
    assert step.admitted == (2,) and step.reused_tokens == (16,)
    r.run()
    assert r.out[1] == r.engine.reference(shared, 20)
    assert r.out[2] == r.engine.reference(shared + [4], 2)


def test_cancellation_returns_pages_at_once():
    r = rig()
    free0 = r.pool.free_pages
    r.add(1, prompt(1, 30), 50)
    r.add(2, prompt(2, 3), 50)
    r.add(3, prompt(3, 3), 50)
    for _ in range(3):
        r.step()
    assert r.pool.free_pages < free0
    assert r.sched.cancel(2) and r.sched.cancel(1)
    assert not r.sched.cancel(2)
    r.sched.cancel(3)
    r.sched.prefix.clear()
    assert r.pool.free_pages == free0 and r.pool.held_pages == 0
    assert r.sched.idle


def test_a_cancelled_waiting_request_never_runs():
    r = rig(max_seqs=1)
    r.add(1, prompt(1, 3), 3)
    r.add(2, prompt(2, 3), 3)
    r.step()
    r.sched.cancel(2)
    r.run()
    assert r.out[2] == [] and 2 not in r.finish
    assert all(2 not in s.admitted for s in r.steps)


def test_preemption_recomputes_and_changes_no_output():
    # 12 pages of 4 tokens: four requests of 10-token prompts growing to 30 tokens cannot all fit
    r = rig(pages=12, max_seqs=4, chunk=8)
    prompts = {i: prompt(i, 10) for i in range(1, 5)}
    for i, p in prompts.items():
        r.add(i, p, 20)
    r.run()
    assert any(s.preempted for s in r.steps)
    assert r.sched.stats.preemptions == sum(len(s.preempted) for s in r.steps)
    for i, p in prompts.items():
        assert r.out[i] == r.engine.reference(p, 20), i
        assert r.finish[i] == "length"
    # only younger requests are preempted for older ones: request 1 never is
    assert all(1 not in s.preempted for s in r.steps)


def test_pressure_evicts_cached_prefixes_before_preempting():
    r = rig(pages=10, max_seqs=1, chunk=8)
    a = prompt(1, 20)
    r.add(1, a, 2)
    r.run()
    assert r.pool.held_pages == 5  # a's prefill K/V cached: 19 positions in 5 pages
    r.add(2, prompt(2, 24), 8)  # needs 8 pages: a's entry is dropped (no host tier)
    r.run()
    assert r.sched.stats.evictions == 1 and r.sched.stats.preemptions == 0
    assert r.out[2] == r.engine.reference(prompt(2, 24), 8)


@pytest.mark.parametrize("land_after", [0, 3])
def test_pressure_parks_cold_prefixes_and_a_hit_wakes_them(land_after):
    r = rig(pages=10, host_pages=16, max_seqs=1, chunk=8, land_after=land_after)
    a, b = prompt(1, 20), prompt(2, 24)
    r.add(1, a, 2)
    r.run()
    r.add(2, b, 8)
    r.run()
    assert r.sched.stats.parks == 1 and r.sched.stats.evictions == 1
    assert sum(s.parks for s in r.steps) == 1
    n = len(r.steps)
    r.add(3, a + [1, 2], 4)  # hits a's parked prefix (16 tokens aligned)
    r.run()
    woke = [s for s in r.steps[n:] if s.wakes]
    assert len(woke) == 1 and woke[0].admitted == (3,) and woke[0].reused_tokens == (16,)
    assert r.sched.stats.wakes == 1
    assert [(c.start, c.stop) for s in r.steps[n:] for c in s.prefills] == [(16, 21)]
    assert r.out[3] == r.engine.reference(a + [1, 2], 4)
    assert r.out[2] == r.engine.reference(b, 8)


def test_a_request_that_cannot_fit_the_empty_pool_fails_alone():
    r = rig(pages=4, max_seqs=2, max_context=256)
    r.add(1, prompt(1, 40), 2)  # 40 tokens need 10 pages of 4
    r.add(2, prompt(2, 3), 2)
    r.run()
    assert r.finish == {1: "failed", 2: "length"}
    assert r.steps[0].failed[0][0] == 1 and "cannot fit the KV pool" in r.steps[0].failed[0][1]


def test_max_tokens_is_capped_by_the_context():
    r = rig(max_context=12)
    r.add(1, prompt(1, 10), 100)
    r.run()
    assert len(r.out[1]) == 3 and r.finish[1] == "length"  # positions 9, 10, 11


def test_eos_stops_a_request():
    r = rig(eos_every=5)
    stops = frozenset({999})
    for i in range(1, 9):
        r.add(i, prompt(i, 5), 40, stop_ids=stops)
    r.run()
    for i in range(1, 9):
        ref = r.engine.reference(prompt(i, 5), 40, stops)
        assert r.out[i] == ref
        assert r.finish[i] == ("stop" if ref[-1] == 999 else "length")
    assert any(f == "stop" for f in r.finish.values())


def test_continuous_batching_changes_no_output_under_random_load():
    rnd = random.Random(5)
    r = rig(pages=40, host_pages=30, max_seqs=4, chunk=8, land_after=2)
    bases = [prompt(100 + k, 14) for k in range(4)]
    want = {}
    req = 0
    for _ in range(60):
        for _ in range(rnd.randrange(0, 3)):
            req += 1
            p = rnd.choice(bases)[: rnd.randrange(2, 15)] + prompt(req, rnd.randrange(0, 12))
            m = rnd.randrange(1, 16)
            r.add(req, p, m)
            want[req] = r.engine.reference(p, m)
        r.step()
    r.run()
    assert r.out == want
    assert r.sched.stats.reused_tokens > 0 and r.sched.stats.preemptions + r.sched.stats.parks > 0


@pytest.mark.parametrize("grow_ahead", [0, 2])
def test_leak_check_ten_thousand_requests_with_random_cancellations(grow_ahead: int):
    rnd = random.Random(11)
    r = rig(pages=14, host_pages=40, max_seqs=4, chunk=8, land_after=1, grow_ahead=grow_ahead)
    free_pages, free_slots = r.pool.free_pages, r.pool.free_slots
    host_free = r.host.free_pages
    bases = [prompt(200 + k, 12) for k in range(6)]
    live: list[int] = []
    for req in range(10_000):
        p = rnd.choice(bases)[: rnd.randrange(1, 13)] + prompt(req, rnd.randrange(0, 6))
        r.add(req, p, rnd.randrange(1, 6))
        live.append(req)
        if rnd.random() < 0.3:
            victim = live.pop(rnd.randrange(len(live)))
            r.sched.cancel(victim)
        if req % 3 == 0:
            r.step()
            live = [i for i in live if i in r.sched]
    r.run(max_steps=100_000)
    r.memory.poll()
    r.sched.prefix.clear()
    assert r.sched.idle
    assert r.pool.free_pages == free_pages and r.pool.free_slots == free_slots and r.pool.held_pages == 0
    assert r.host.free_pages == host_free
    r.pool.check()
    assert r.sched.stats.parks > 0 and r.sched.stats.wakes > 0 and r.sched.stats.preemptions > 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_seqs=0, chunk_tokens=8, max_context=16), "scheduler max_seqs 0: expected an int >= 1"),
    (dict(max_seqs=2, chunk_tokens=8, max_context=16, token_budget=9),
     "scheduler token_budget 9: expected an int >= chunk_tokens + max_seqs = 10"),
    (dict(max_seqs=1, chunk_tokens=8, max_context=1), "scheduler max_context 1: expected an int >= 2"),
])
def test_config_refusals_name_the_value(kwargs, message):
    with pytest.raises(ConfigError) as err:
        SchedulerConfig(**kwargs)
    assert str(err.value).startswith(message)


# ------------------------------------------------------------------- rows at max_seqs 64


def test_a_request_takes_the_lowest_free_row_and_keeps_it():
    r = rig(max_seqs=8, pages=200)
    for i in range(8):
        r.add(i, prompt(i, 3), 2 if i in (1, 3) else 30)
    r.step()
    assert r.sched.rows() == {i: i for i in range(8)}
    while 1 in r.sched or 3 in r.sched:
        r.step()
    r.add(10, prompt(10, 3), 5)
    r.step()
    # the lowest free row, not the last freed one; 6 rows still need bucket 8, so nothing moved
    assert r.sched.rows() == {0: 0, 2: 2, 4: 4, 5: 5, 6: 6, 7: 7, 10: 1}
    before = dict(r.sched.rows())
    for _ in range(3):
        r.step()
    assert {k: v for k, v in r.sched.rows().items() if k in before} == before  # rows stay where they are


def test_rows_are_compacted_so_the_bucket_fits_the_decoding_rows():
    from kern_run.serve.engine import decode_bucket

    r = rig(max_seqs=64, pages=2000, chunk=8)
    lengths = {i: (12 if i < 40 else 60) for i in range(64)}  # the 24 long ones sit in rows 40..63
    for i in range(64):
        r.add(i, prompt(i, 4), lengths[i])
    r.run()
    steps = [s for s in r.steps if s.decodes]
    assert max(len(s.decodes) for s in steps) == 64
    # every step ran at the bucket of its number of rows: once the short ones left, the long ones moved down
    assert r.engine.buckets == [decode_bucket(len(s.decodes), 64) for s in steps]
    assert 32 in r.engine.buckets
    moved = r.engine.histories - 64  # each request carried its history once at admission, again when moved
    assert 24 <= moved <= 24 * 5  # all 24 below 32 when the short ones leave, then lower as the bucket shrinks
    for i in range(64):
        assert r.out[i] == r.engine.reference(prompt(i, 4), lengths[i]), i


def test_a_seeded_sampled_request_gives_the_same_tokens_alone_and_under_load():
    from kern_run.serve.sampling import SamplingParams

    sp = SamplingParams(temperature=0.8, top_p=0.9, seed=1234)
    p = prompt(77, 9)
    alone = rig(max_seqs=64, pages=600)
    alone.add(0, p, 25, sampling=sp)
    alone.run()
    loaded = rig(max_seqs=64, pages=600)
    for i in range(1, 40):
        loaded.add(i, prompt(i, 5 + i % 7), 10 + i % 13, sampling=SamplingParams(temperature=1.0, seed=i))
    loaded.add(0, p, 25, sampling=sp)
    for i in range(40, 63):
        loaded.add(i, prompt(i, 6), 20)
    loaded.run()
    assert alone.out[0] == loaded.out[0] == alone.engine.reference(p, 25, sampling=sp)
    assert alone.out[0] != alone.engine.reference(p, 25)  # sampling changed the tokens


def test_an_unseeded_sampled_request_gets_its_seed_at_admission():
    from kern_run.serve.sampling import SamplingParams

    r = rig()
    r.add(1, prompt(1, 3), 4, sampling=SamplingParams(temperature=0.5))
    r.add(2, prompt(1, 3), 4)
    assert r.sched.job(1).sampling.seed is not None and r.sched.job(2).sampling.seed is None
    r.run()
    assert len(r.out[1]) == 4


def test_leak_check_ten_thousand_requests_at_64_rows():
    from kern_run.serve.sampling import SamplingParams

    rnd = random.Random(12)
    r = rig(pages=300, host_pages=80, max_seqs=64, chunk=8, land_after=1)
    free_pages, free_slots = r.pool.free_pages, r.pool.free_slots
    host_free = r.host.free_pages
    bases = [prompt(300 + k, 12) for k in range(6)]
    live: list[int] = []
    for req in range(10_000):
        p = rnd.choice(bases)[: rnd.randrange(1, 13)] + prompt(req, rnd.randrange(0, 6))
        sp = SamplingParams(temperature=0.7, seed=req) if req % 3 == 0 else SamplingParams()
        r.add(req, p, rnd.randrange(1, 12), sampling=sp)
        live.append(req)
        if rnd.random() < 0.3:
            r.sched.cancel(live.pop(rnd.randrange(len(live))))
        if req % 40 == 0:
            r.step()
            live = [i for i in live if i in r.sched]
    r.run(max_steps=100_000)
    r.memory.poll()
    r.sched.prefix.clear()
    assert r.sched.idle
    assert r.pool.free_pages == free_pages and r.pool.free_slots == free_slots and r.pool.held_pages == 0
    assert r.host.free_pages == host_free
    r.pool.check()
    assert max(r.engine.rows_seen) > 32
    assert r.sched.stats.parks > 0 and r.sched.stats.wakes > 0
