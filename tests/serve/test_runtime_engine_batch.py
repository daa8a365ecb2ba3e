"""The batched RuntimeEngine against a fake runtime with the real write_input semantics: per-row inputs and
padding rows, the bucket, block-table / params / history writes (each only when it changed), the packed
readback, top logprobs, and the scheduler at 64 rows giving every request the tokens it gets run alone."""

from __future__ import annotations

import random

import numpy as np
import pytest

import kern_pool
from fake_batch_runtime import (
    VOCAB, FakeBatchRuntime, FakeGen, batched_manifest, expected, facts_of, manifest_dict, unpack_params,
)
from kern_run.errors import ConfigError as RunConfigError
from kern_run.sampling import SamplingParams, pack_params
from kern_run.serve.engine import DecodeRow, PrefillChunk, Sampled, decode_bucket
from kern_run.serve.errors import ConfigError
from kern_run.serve.memory import PoolMemory
from kern_run.serve.runtime_engine import RuntimeEngine
from kern_run.sampling_io import read_sampling_io
from kern_run.serve.scheduler import Scheduler, SchedulerConfig

GREEDY = SamplingParams()
P = 16


@pytest.fixture(scope="module")
def manifest():
    return batched_manifest(hist_cap=64)


def make(manifest, num_pages: int = 256, max_seqs: int | None = None):
    rt = FakeBatchRuntime(manifest, page_tokens=P, num_pages=num_pages)
    engine = RuntimeEngine(FakeGen(rt, facts_of(manifest)), 64, max_seqs=max_seqs)
    return rt, engine


def params_of(sp: SamplingParams) -> tuple:
    return unpack_params(np.frombuffer(pack_params([sp]), dtype=np.uint32))


def writes(rt, name: str) -> list[int]:
    return [w.rows for w in rt.writes if w.name == name]


def prefill_all(rt, engine, prompt: list[int], pages: tuple[int, ...], req_id: int = 0) -> None:
    """K/V of prompt[:-1] through the engine's prefill (chunks of 64)."""
    for lo in range(0, len(prompt) - 1, 64):
        hi = min(lo + 64, len(prompt) - 1)
        engine.prefill(PrefillChunk(req_id, 0, lo, tuple(prompt[lo:hi]), pages))


def test_decode_bucket() -> None:
    assert [decode_bucket(n, 64) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 64)] == [1, 2, 4, 4, 8, 8, 16, 16, 32, 64,
                                                                                      64]
    assert [decode_bucket(n, 48) for n in (32, 33, 48)] == [32, 48, 48]
    for bad in (0, 65):
        with pytest.raises(ValueError, match=f"decode step of {bad} rows: expected 1..64"):
            decode_bucket(bad, 64)


def test_engine_facts(manifest) -> None:
    rt, engine = make(manifest)
    assert (engine.seqs_max, engine.max_seqs, engine.samples, engine.max_top_logprobs) == (64, 64, True, 20)
    assert make(manifest, max_seqs=10)[1].max_seqs == 10
    io = read_sampling_io(manifest)
    assert (io.params, io.params_dtype, io.hist_cap, io.top_program) == ("sample_params", "<u4", 64, "top_logprobs")


def test_rows_padding_bucket_and_the_packed_readback(manifest) -> None:
    rt, engine = make(manifest)
    a, b = [3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8]
    pa, pb = (1,), (2,)
    prefill_all(rt, engine, a, pa)
    prefill_all(rt, engine, b, pb)
    sb = SamplingParams(temperature=0.7, top_p=0.9, seed=42, logprobs=True)
    rows = [DecodeRow(1, 0, len(a) - 1, a[-1], pa, GREEDY, tuple(a)),
            DecodeRow(2, 5, len(b) - 1, b[-1], pb, sb, tuple(b))]
    rt.writes.clear()
    out = engine.decode(rows)
    assert list(engine.buckets) == [8] and rt.issues[-1] == ("decode", {"tokens": 8, "seqs": 8}, False)
    assert rt.readbacks == [("next_token", 8)]  # 8 bytes a row of the bucket, nothing else
    want_a = expected(a, 1, params_of(GREEDY), None)[0]
    want_b = expected(b, 1, params_of(sb), None)[0]
    assert out == [Sampled(want_a[0]), Sampled(want_b[0], pytest.approx(want_b[1]))]
    buf = rt.buffers
    assert buf["block_table"][0, 0] == 1 and buf["block_table"][5, 0] == 2
    assert not buf["block_table"][1:5].any() and not buf["block_table"][6:8].any()  # padding rows: scratch
    seen = rt.seen[-1]
    assert seen["positions"].tolist() == [7, 0, 0, 0, 0, 5, 0, 0]
    assert seen["seq_lens"].tolist() == [8, 1, 1, 1, 1, 6, 1, 1]
    assert seen["slot_mapping"].tolist() == [16 + 7, 0, 0, 0, 0, 32 + 5, 0, 0]
    assert writes(rt, "token_ids") == writes(rt, "seq_lens") == [8]
    assert writes(rt, "sample_params") == [6]  # rows 0..5: both requests are new
    assert writes(rt, "hist_tokens") == []  # neither penalizes: the history is never read
    assert unpack_params(buf["sample_params"][5]) == params_of(sb)

    # the same requests again: only the per-row inputs are written
    rt.writes.clear()
    rows2 = [DecodeRow(1, 0, len(a), want_a[0], pa, GREEDY), DecodeRow(2, 5, len(b), want_b[0], pb, sb)]
    out2 = engine.decode(rows2)
    assert sorted({w.name for w in rt.writes}) == ["positions", "seq_lens", "slot_mapping", "token_ids"]
    assert [s.token_id for s in out2] == [expected(a, 2, params_of(GREEDY), None)[1][0],
                                          expected(b, 2, params_of(sb), None)[1][0]]

    # row 0 leaves: the bucket stays 8 (row 5), row 0 turns padding (its block-table row rewritten alone)
    rt.writes.clear()
    engine.decode([DecodeRow(2, 5, len(b) + 1, out2[1].token_id, pb, sb)])
    assert writes(rt, "block_table") == [1] and not buf["block_table"][0].any()
    assert rt.seen[-1]["positions"][0] == 0 and engine.buckets[-1] == 8
    assert writes(rt, "sample_params") == [1] and unpack_params(buf["sample_params"][0]) == params_of(GREEDY)
    # row 5 leaves too and a new request takes row 0: bucket 1, rows 1..7 untouched
    rt.writes.clear()
    engine.decode([DecodeRow(3, 0, len(a) - 1, a[-1], pa, sb, tuple(a))])
    assert engine.buckets[-1] == 1 and writes(rt, "sample_params") == [1] and writes(rt, "token_ids") == [1]
    assert unpack_params(buf["sample_params"][5]) == params_of(sb)  # not in the bucket: not rewritten


def test_block_table_rows_are_written_when_they_change(manifest) -> None:
    rt, engine = make(manifest)
    pages = {r: (10 + r,) for r in range(3)}
    seqs = {0: [1] * 9, 1: [2] * 16, 2: [3] * 9}  # row 1: position 15 fills its first page
    for r in range(3):
        prefill_all(rt, engine, seqs[r], pages[r])
    rows = [DecodeRow(r, r, len(seqs[r]) - 1, seqs[r][-1], pages[r], GREEDY, tuple(seqs[r])) for r in range(3)]
    out = engine.decode(rows)
    rt.writes.clear()
    # row 1 grows a page at position 16; rows 0 and 2 stay: rows 0..1 rewritten from the mirror
    pages[1] = (11, 40)
    rows = [DecodeRow(r, r, len(seqs[r]), out[r].token_id, pages[r], GREEDY) for r in range(3)]
    engine.decode(rows)
    assert writes(rt, "block_table") == [2]
    assert rt.buffers["block_table"][1, :3].tolist() == [11, 40, 0] and rt.buffers["block_table"][0, 0] == 10
    assert rt.seen[-1]["slot_mapping"][1] == 40 * 16


def test_prefill_takes_row_0_and_decode_restores_it(manifest) -> None:
    rt, engine = make(manifest)
    a = list(range(5, 25))
    prefill_all(rt, engine, a, (3, 4))
    out = engine.decode([DecodeRow(1, 0, 19, a[-1], (3, 4), GREEDY, tuple(a))])
    c = list(range(30, 50))
    prefill_all(rt, engine, c, (8, 9), req_id=2)  # another request's prefill writes block-table row 0
    assert rt.buffers["block_table"][0, :2].tolist() == [8, 9]
    rt.writes.clear()
    out2 = engine.decode([DecodeRow(1, 0, 20, out[0].token_id, (3, 4), GREEDY)])
    assert writes(rt, "block_table") == [1] and rt.buffers["block_table"][0, :2].tolist() == [3, 4]
    assert [out[0].token_id, out2[0].token_id] == [t for t, _ in expected(a, 2, params_of(GREEDY), None)]


def test_penalized_history_is_written_once_and_follows_the_device(manifest) -> None:
    rt, engine = make(manifest)
    prompt = [5, 6, 5, 7, 8, 5, 9, 6]
    sp = SamplingParams(temperature=0.9, repetition_penalty=1.3, presence_penalty=0.5, seed=7)
    want = expected(prompt, 30, params_of(sp), cap=64)
    prefill_all(rt, engine, prompt, (1, 2, 3))
    ids = list(prompt)
    got = []
    for step in range(30):
        history = tuple(ids) if step == 0 else None
        out = engine.decode([DecodeRow(1, 0, len(ids) - 1, ids[-1], (1, 2, 3), sp, history)])
        got.append(out[0].token_id)
        ids.append(out[0].token_id)
    assert got == [t for t, _ in want]
    assert writes(rt, "hist_tokens") == [1] and writes(rt, "sample_params") == [1]  # once, at admission


def test_a_skipped_penalized_row_gets_its_history_again(manifest) -> None:
    """A request that skips a step while a higher row decodes is a padding row of that step: the device appended
    a padding token to its history, so the engine writes its history again before it decodes next."""
    rt, engine = make(manifest)
    a, b = [4, 4, 2, 9, 1], [7, 3, 3, 3, 8, 1]
    sa = SamplingParams(temperature=0.5, frequency_penalty=1.5, seed=11)
    prefill_all(rt, engine, a, (1,))
    prefill_all(rt, engine, b, (2,))
    ids_a, ids_b = list(a), list(b)

    def step(rows_for: list[str], first: bool = False) -> None:
        rows = []
        if "a" in rows_for:
            rows.append(DecodeRow(1, 0, len(ids_a) - 1, ids_a[-1], (1,), sa, tuple(ids_a) if first else None))
        if "b" in rows_for:
            rows.append(DecodeRow(2, 1, len(ids_b) - 1, ids_b[-1], (2,), GREEDY, tuple(ids_b) if first else None))
        out = engine.decode(rows)
        for r, s in zip(rows, out):
            (ids_a if r.req_id == 1 else ids_b).append(s.token_id)

    step(["a", "b"], first=True)
    step(["a", "b"])
    step(["b"])  # a skips: row 0 is padding
    n = len(writes(rt, "hist_tokens"))
    step(["a", "b"])
    assert len(writes(rt, "hist_tokens")) == n + 1
    for _ in range(5):
        step(["a", "b"])
    assert ids_a[len(a):] == [t for t, _ in expected(a, len(ids_a) - len(a), params_of(sa), cap=64)]
    assert ids_b[len(b):] == [t for t, _ in expected(b, len(ids_b) - len(b), params_of(GREEDY), None)]


def test_a_history_longer_than_the_cap_keeps_its_first_distinct_ids() -> None:
    manifest = batched_manifest(hist_cap=8)
    rt, engine = make(manifest)
    prompt = list(range(100, 130))  # 30 distinct ids, 8 slots
    sp = SamplingParams(repetition_penalty=1.5)
    prefill_all(rt, engine, prompt, (1, 2, 3))
    ids = list(prompt)
    for step in range(6):
        out = engine.decode([DecodeRow(1, 0, len(ids) - 1, ids[-1], (1, 2, 3), sp,
                                       tuple(ids) if step == 0 else None)])
        ids.append(out[0].token_id)
    assert ids[30:] == [t for t, _ in expected(prompt, 6, params_of(sp), cap=8)]
    assert rt.buffers["hist_tokens"][0].tolist() == list(range(100, 108))


def test_top_logprobs_run_the_top_program_only_when_asked(manifest) -> None:
    rt, engine = make(manifest)
    a = [1, 2, 3]
    prefill_all(rt, engine, a, (1,))
    engine.decode([DecodeRow(1, 0, 2, 3, (1,), GREEDY, tuple(a))])
    assert [i[0] for i in rt.issues if i[0] != "prefill"] == ["decode"]
    sp = SamplingParams(logprobs=True, top_logprobs=3)
    rt.issues.clear()
    out = engine.decode([DecodeRow(2, 0, 2, 3, (1,), sp, tuple(a))])
    assert [i[:1] + (i[2],) for i in rt.issues] == [("decode", False), ("top_logprobs", True)]  # eager, behind it
    t = out[0].token_id
    assert out[0].top_logprobs == ((t, -0.125), ((t + 1) % VOCAB, -0.625), ((t + 2) % VOCAB, -1.125))
    assert out[0].logprob is not None and out[0].logprob <= 0
    assert rt.readbacks[-2:] == [("top_ids", 1), ("top_logprobs", 1)]
    rt.buffers["top_ids"][0, 1] = -1  # past the vocabulary: left out
    rt.issues.clear()
    rt._top = lambda rows: None  # keep the ids as set
    out = engine.decode([DecodeRow(2, 0, 3, t, (1,), sp)])
    assert [i for i, _ in out[0].top_logprobs] == [t, (t + 2) % VOCAB]


def test_a_new_request_without_history_is_a_protocol_error(manifest) -> None:
    rt, engine = make(manifest)
    with pytest.raises(ConfigError, match="request 9 is new in the row but carries no history"):
        engine.decode([DecodeRow(9, 0, 0, 1, (1,), GREEDY)])


def test_warm_captures_every_bucket_on_padding(manifest) -> None:
    rt, engine = make(manifest)
    assert engine.warm() == [1, 2, 4, 8, 16, 32, 64]
    decodes = [i[1]["seqs"] for i in rt.issues if i[0] == "decode"]
    assert decodes == [1, 2, 4, 8, 16, 32, 64] and ("top_logprobs", {"tokens": 64, "seqs": 64}, True) in rt.issues
    assert not rt.buffers["block_table"].any()  # every row on the scratch page
    assert make(manifest, max_seqs=5)[1].warm() == [1, 2, 4, 8]


def test_an_argmax_manifest_serves_greedy_rows_of_plain_ids() -> None:
    rt, engine = make(batched_manifest(sampling=False))
    assert (engine.samples, engine.max_seqs, engine.max_top_logprobs) == (False, 64, 0)
    a = [9, 8, 7]
    prefill_all(rt, engine, a, (1,))
    out = engine.decode([DecodeRow(1, 3, 2, 7, (1,), GREEDY, tuple(a))])
    assert list(engine.buckets) == [4] and out == [Sampled(expected(a, 1, params_of(GREEDY), None)[0][0])]
    assert [w.name for w in rt.writes if w.name.startswith(("sample", "hist"))] == []


def test_sampling_block_refusals() -> None:
    from kern_manifest import parse_manifest

    def with_block(block, drop=None):
        m = manifest_dict()
        m["meta"]["caller"]["sampling"] = block
        if drop:
            del m["buffers"][drop]
        return parse_manifest(m)

    base = manifest_dict()["meta"]["caller"]["sampling"]
    for change, drop, needle in (
            ([1], None, r"\$\.meta\.caller\.sampling = \[1\] must be an object"),
            ({"params": 5}, None, r"sampling\.params = 5 must name a buffer"),
            ({}, "hist_counts", r"names buffer 'hist_counts', which the manifest lacks"),
            ({"params": "hist_tokens"}, None, r"rows are 64 x i32, expected 48 bytes"),
            ({"hist_cap": 65}, None, r"hist_cap = 65 with history buffers \[64, 64\]"),
            ({"packing": "plain"}, None, r"sampling\.packing = \"plain\": kern-run reads 'packed' only"),
            ({"sampler": "cpu"}, None, r"sampling\.sampler = \"cpu\""),
            ({"top_logprobs": {**base["top_logprobs"], "program": "nope"}}, None,
             r"top_logprobs\.program names program 'nope', which the manifest lacks"),
            ({"top_logprobs": {**base["top_logprobs"], "n_top": 21}}, None, r"top_logprobs\.n_top = 21"),
            ({"top_logprobs": 3}, None, r"top_logprobs = 3 must be an object")):
        block = change if isinstance(change, list) else {**base, **change}
        with pytest.raises(RunConfigError, match=needle):
            read_sampling_io(with_block(block, drop), "m.json")
    assert read_sampling_io(with_block({k: v for k, v in base.items() if k != "top_logprobs"})).top_n == 0


# ------------------------------------------------------------------- the scheduler over the engine, 64 rows


def test_64_rows_through_the_scheduler_match_each_request_alone(manifest) -> None:
    rnd = random.Random(3)
    rt, engine = make(manifest, num_pages=1200)
    pool = kern_pool.Pool(kern_pool.Layout.simple(P, 1199))
    memory = PoolMemory(pool, executor=rt)
    sched = Scheduler(memory, SchedulerConfig(max_seqs=64, chunk_tokens=64, max_context=1024,
                                              batch_invariant_prefill=True))
    bases = [[rnd.randrange(1, VOCAB) for _ in range(70)] for _ in range(3)]
    kinds = [GREEDY, SamplingParams(temperature=0.8, top_k=40, seed=5),
             SamplingParams(temperature=1.1, top_p=0.8, repetition_penalty=1.2, seed=2**64 - 3),
             SamplingParams(presence_penalty=0.4, frequency_penalty=0.2, logprobs=True, top_logprobs=2)]
    reqs = {}
    out: dict[int, list[Sampled]] = {}
    req = 0
    decode_steps = []
    for tick in range(5000):
        if req >= 150 and sched.idle:
            break
        if req < 150 and tick % 2 == 0:
            for _ in range(70 if tick == 0 else min(rnd.randrange(1, 6), 150 - req)):
                prompt = rnd.choice(bases)[:rnd.randrange(1, 70)] + [rnd.randrange(1, VOCAB)
                                                                       for _ in range(rnd.randrange(1, 20))]
                reqs[req] = (prompt, rnd.randrange(60, 90) if tick == 0 else rnd.randrange(1, 40), kinds[req % 4])
                sched.add(req, prompt, reqs[req][1], kinds[req % 4])
                out[req] = []
                req += 1
        if sched.idle:
            continue
        step = sched.schedule()
        for c in step.prefills:
            engine.prefill(c)
        results = engine.decode(step.decodes) if step.decodes else []
        if step.decodes:
            decode_steps.append(len(step.decodes))
        for e in sched.complete(step, results):
            out[e.req_id].append(Sampled(e.token_id, e.logprob, e.top_logprobs))
    assert sched.idle and req == 150
    assert max(decode_steps) == 64 and 64 in engine.buckets
    assert list(engine.buckets) == [decode_bucket(n, 64) for n in decode_steps]  # compaction: no bucket too large
    for i, (prompt, steps, sp) in reqs.items():
        want = expected(prompt, steps, params_of(sp), cap=64 if sp.penalizes else None)
        assert [s.token_id for s in out[i]] == [t for t, _ in want], i
        if sp.logprobs:
            assert [s.logprob for s in out[i]] == pytest.approx([lp for _, lp in want])
            assert all(len(s.top_logprobs) == 2 for s in out[i])
    assert sched.stats.reused_tokens > 0
    sched.prefix.clear()
    assert pool.held_pages == 0


def test_inputs_the_device_advanced_are_not_written_again(manifest) -> None:
    rt, engine = make(manifest)
    prompt = list(range(40, 50))
    pages = (1, 2)
    prefill_all(rt, engine, prompt, pages)
    ids = list(prompt)
    for step in range(20):  # positions 9..28: page 2 (positions 16..31) is already in the row
        out = engine.decode([DecodeRow(1, 0, len(ids) - 1, ids[-1], pages, GREEDY, tuple(ids) if step == 0 else None)])
        ids.append(out[0].token_id)
    assert ids[10:] == [t for t, _ in expected(prompt, 20, params_of(GREEDY), None)]
    assert writes(rt, "token_ids") == [9, 1]  # the prefill chunk, then the first decode step only
    assert engine.advanced_steps == 19
    # with a padding row in the bucket (rows 0 and 2 of bucket 4) every step writes them: the device advanced
    # the padding rows too, off position 0
    rt2, engine2 = make(manifest)
    a, b = [5, 6, 7], [8, 9, 10]
    prefill_all(rt2, engine2, a, (1,))
    prefill_all(rt2, engine2, b, (2,))
    ids_a, ids_b = list(a), list(b)
    for step in range(6):
        ha, hb = (tuple(ids_a), tuple(ids_b)) if step == 0 else (None, None)
        out = engine2.decode([DecodeRow(1, 0, len(ids_a) - 1, ids_a[-1], (1,), GREEDY, ha),
                              DecodeRow(2, 2, len(ids_b) - 1, ids_b[-1], (2,), GREEDY, hb)])
        ids_a.append(out[0].token_id)
        ids_b.append(out[1].token_id)
    assert engine2.advanced_steps == 0 and writes(rt2, "positions")[-6:] == [4] * 6
    assert ids_b[3:] == [t for t, _ in expected(b, 6, params_of(GREEDY), None)]
