"""The pipelined decode of RuntimeEngine (serve/ahead.py, docs/serve.md "Pipelined decode") against the fake batch
runtime with DeviceSteps: the step after this one is enqueued before this one's tokens are read (the order of
the runtime's log), tokens are read from the ring, and every request still gets the tokens it gets alone; steps
enqueued ahead that the scheduler did not ask for (a stop id, a cancellation, a new row, top logprobs) are dropped
or used in part, and the block table grows in place so the pipeline runs across page boundaries."""

from __future__ import annotations

import random

import pytest

import kern_pool
from fake_batch_runtime import VOCAB, FakeBatchRuntime, FakeGen, batched_manifest, expected, facts_of, unpack_params
from kern_run.sampling import SamplingParams, pack_params
from kern_run.serve.ahead import AheadStep
from kern_run.serve.engine import DecodeRow, PrefillChunk
from kern_run.serve.memory import PoolMemory
from kern_run.serve.runtime_engine import RuntimeEngine
from kern_run.serve.scheduler import Scheduler, SchedulerConfig

import numpy as np

GREEDY = SamplingParams()
P = 16


@pytest.fixture(scope="module")
def manifest():
    return batched_manifest(hist_cap=64)


def make(manifest, steps: bool = True, num_pages: int = 256):
    rt = FakeBatchRuntime(manifest, page_tokens=P, num_pages=num_pages, steps=steps)
    return rt, RuntimeEngine(FakeGen(rt, facts_of(manifest)), 64)


def params_of(sp: SamplingParams) -> tuple:
    return unpack_params(np.frombuffer(pack_params([sp]), dtype=np.uint32))


def alone(prompt, steps: int, sp: SamplingParams = GREEDY) -> list[int]:
    return [t for t, _ in expected(prompt, steps, params_of(sp), cap=64 if sp.penalizes else None)]


def test_ahead_step_matching() -> None:
    rows = [DecodeRow(1, 0, 9, 5, (1,), GREEDY), DecodeRow(2, 3, 4, 6, (2,), GREEDY)]
    ahead = AheadStep.after(rows, 4, event=None)
    assert ahead.rows == {0: (1, 10), 3: (2, 5)} and not ahead.matches([DecodeRow(1, 0, 10, 7, (1,), GREEDY)])
    ahead.fed(rows, [7, 8])
    nxt = [DecodeRow(1, 0, 10, 7, (1,), GREEDY), DecodeRow(2, 3, 5, 8, (2,), GREEDY)]
    assert ahead.matches(nxt) and ahead.complete(nxt)
    assert ahead.matches(nxt[1:]) and not ahead.complete(nxt[1:])  # request 1 ended: used in part
    for bad in (DecodeRow(1, 0, 10, 9, (1,), GREEDY),  # another token
                DecodeRow(1, 1, 10, 7, (1,), GREEDY),  # moved
                DecodeRow(3, 0, 10, 7, (1,), GREEDY),  # another request
                DecodeRow(1, 0, 10, 7, (1,), GREEDY, history=(1, 2)),  # newly placed
                DecodeRow(1, 0, 10, 7, (1,), SamplingParams(top_logprobs=2))):  # top logprobs: synchronous
        assert not ahead.matches([bad, nxt[1]]), bad


def test_each_step_is_enqueued_before_the_last_one_is_read(manifest) -> None:
    rt, engine = make(manifest)
    assert engine.pipelines
    prompt = list(range(40, 50))
    pages = (1, 2, 3)  # positions 0..47
    engine.prefill(PrefillChunk(0, 0, 0, tuple(prompt[:-1]), pages))
    ids = list(prompt)
    for step in range(20):
        out = engine.decode([DecodeRow(0, 0, len(ids) - 1, ids[-1], pages, GREEDY, tuple(ids) if step == 0 else None)],
                            ahead=True)
        ids.append(out[0].token_id)
    assert ids[len(prompt):] == alone(prompt, 20)
    assert (engine.ahead_used, engine.ahead_dropped) == (19, 0)
    log = [e for e in rt.log if e[0] != "issue" or e[1] == "decode"]
    decodes = [i for i, e in enumerate(log) if e[0] == "issue"]
    waits = [i for i, e in enumerate(log) if e[0] == "wait"]
    assert len(decodes) == 21 and len(waits) == 20  # one step more than asked is in flight at the end
    for k, w in enumerate(waits):  # step k is waited for only after step k + 1 was issued
        assert decodes[k] < decodes[k + 1] < w, (k, log[decodes[k]:w + 1])
        assert log[decodes[k] + 1] == ("event", k + 1) and log[w] == ("wait", k + 1)
    assert not [e for e in rt.log if e[0] == "read"]  # every token from the ring, never next_token
    assert [w.rows for w in rt.writes if w.name == "token_ids"] == [9, 1]  # prefill, the first step only


def test_without_the_hint_or_device_steps_it_reads_synchronously(manifest) -> None:
    for steps, ahead in ((True, False), (False, True)):
        rt, engine = make(manifest, steps=steps)
        prompt = [3, 1, 4, 1, 5]
        engine.prefill(PrefillChunk(0, 0, 0, tuple(prompt[:-1]), (1,)))
        ids = list(prompt)
        for step in range(6):
            out = engine.decode([DecodeRow(0, 0, len(ids) - 1, ids[-1], (1,), GREEDY, tuple(ids) if not step else None)],
                                ahead=ahead)
            ids.append(out[0].token_id)
        assert ids[5:] == alone(prompt, 6) and engine.ahead_used == 0
        assert [e[0] for e in rt.log if e[0] in ("issue", "read")] == ["issue"] + ["issue", "read"] * 6


def test_a_step_whose_next_position_lacks_a_page_is_not_enqueued_ahead(manifest) -> None:
    rt, engine = make(manifest)
    prompt = list(range(1, 16))  # positions 0..14 in page 1; the first decode writes 14, the next would need 16
    engine.prefill(PrefillChunk(0, 0, 0, tuple(prompt[:-1]), (1,)))
    out = engine.decode([DecodeRow(0, 0, 14, prompt[-1], (1,), GREEDY, tuple(prompt))], ahead=True)
    assert engine._ahead is not None  # position 15 is in page 1
    nxt = engine.decode([DecodeRow(0, 0, 15, out[0].token_id, (1,), GREEDY)], ahead=True)
    assert engine._ahead is None and engine.ahead_used == 1  # position 16: no page on the device yet
    ids = prompt + [out[0].token_id, nxt[0].token_id]
    assert ids[15:] == alone(prompt, 2)


def drive(manifest, script, ahead: bool, grow_ahead: int = 2, max_seqs: int = 8, num_pages: int = 400):
    """Run `script` (tick -> [(req_id, prompt, max_tokens, sampling, stop_ids)] to add, or ("cancel", req_id))
    through a scheduler over the engine, as ServeLoop does; returns (tokens per request, engine, rt, sched)."""
    rt, engine = make(manifest, steps=True, num_pages=num_pages)
    pool = kern_pool.Pool(kern_pool.Layout.simple(P, num_pages - 1))
    sched = Scheduler(PoolMemory(pool, executor=rt), SchedulerConfig(max_seqs=max_seqs, chunk_tokens=64,
                                                                      max_context=1024, batch_invariant_prefill=True,
                                                                      grow_ahead=grow_ahead))
    out: dict[int, list[int]] = {}
    for tick in range(3000):
        for item in script.get(tick, ()):
            if item[0] == "cancel":
                sched.cancel(item[1])
            else:
                req, prompt, max_tokens, sp, stops = item
                sched.add(req, prompt, max_tokens, sp, stops)
                out[req] = []
        if sched.idle:
            if tick > max(script):
                break
            continue
        step = sched.schedule()
        for c in step.prefills:
            engine.prefill(c)
        results = engine.decode(step.decodes, ahead=ahead and sched.steady(step)) if step.decodes else []
        for e in sched.complete(step, results):
            out[e.req_id].append(e.token_id)
    assert sched.idle
    sched.prefix.clear()
    assert pool.held_pages == 0
    return out, engine, rt, sched


def _script(seed: int):
    """Requests with stop ids taken from their own greedy output (so some end early, unforeseen), penalties, a
    top-logprobs request, a cancellation and late arrivals that share a prefix."""
    rnd = random.Random(seed)
    base = [rnd.randrange(1, VOCAB) for _ in range(60)]
    kinds = [GREEDY, SamplingParams(temperature=0.8, top_k=40, seed=5),
             SamplingParams(repetition_penalty=1.3, presence_penalty=0.2), GREEDY,
             SamplingParams(temperature=1.1, top_p=0.8, frequency_penalty=0.3, seed=11),
             SamplingParams(top_logprobs=2, logprobs=True)]
    script: dict[int, list] = {}
    want: dict[int, list[int]] = {}
    for req in range(12):
        tick = 0 if req < 6 else 30 + 17 * req
        prompt = base[:rnd.randrange(5, 60)] + [rnd.randrange(1, VOCAB) for _ in range(rnd.randrange(1, 9))]
        sp, max_tokens = kinds[req % 6], rnd.randrange(20, 90)
        full = alone(prompt, max_tokens, sp)
        stops = frozenset({full[rnd.randrange(5, max_tokens)]}) if req % 3 == 1 else frozenset()
        cut = next((i + 1 for i, t in enumerate(full) if t in stops), max_tokens)
        want[req] = full[:cut]
        script.setdefault(tick, []).append((req, prompt, max_tokens, sp, stops))
    script.setdefault(40, []).append(("cancel", 3))
    return script, want


@pytest.mark.parametrize("seed", [1, 2])
def test_requests_get_their_tokens_alone_with_steps_enqueued_ahead(manifest, seed: int) -> None:
    script, want = _script(seed)
    out, engine, rt, _ = drive(manifest, script, ahead=True)
    cancelled = out.pop(3)
    assert cancelled == want[3][:len(cancelled)]
    assert out == {k: v for k, v in want.items() if k != 3}
    assert engine.ahead_used > 50 and engine.ahead_dropped > 0  # both paths ran (top logprobs: synchronous)
    sync, engine0, _, _ = drive(manifest, script, ahead=False)
    assert engine0.ahead_used == 0 and {k: v for k, v in sync.items() if k != 3} == out  # the same tokens


def test_the_pipeline_runs_across_page_boundaries_when_pages_are_granted_ahead(manifest) -> None:
    prompt = list(range(100, 130))
    script = {0: [(0, prompt, 150, GREEDY, frozenset())]}
    for grow, broken in ((2, 0), (0, 10)):  # positions 29..178 cross 10 page starts (32, 48, ..., 176)
        out, engine, rt, sched = drive(manifest, script, ahead=True, grow_ahead=grow)
        assert out[0] == alone(prompt, 150)
        assert engine.ahead_used == 149 - broken, grow  # the step after a missing page is read synchronously
        assert [w.rows for w in rt.writes if w.name == "token_ids"] == [29] + [1] * (1 + broken)
