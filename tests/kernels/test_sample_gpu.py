"""GPU tests of kernels-src/sample.cu from the BUILT cubin (kernels/kernels.json), against
tools/reference_sample.py.

- Philox4x32-10 on the device equals the numpy reference bit for bit (and Random123's known answers).
- Greedy rows equal numpy's argmax (ties to the smallest index, NaN never wins); their logprob the float32
  log-softmax.
- Each filter: a chi-square goodness of fit of 40,000 draws (one seed, distinct positions) against the
  reference distribution; significance: each configuration must give p > 1e-3. Every draw must fall in the
  kept set, and each draw's logprob must equal the reference's within LOGPROB_ATOL.
- A seeded row gives the same token and logprob (bit for bit) alone and inside batches of 4 and 64 with
  other neighbours.
- Penalties are written into the logits buffer exactly as the reference rounds them; the history append
  entry; the top-n logprobs entry; a captured graph replayed after new parameters are written.

Outputs are poisoned before each launch (token -1, logprob NaN), every buffer has guard regions.
Run on the GPU machine:  KERN_REQUIRE_GPU=1 uv run --frozen pytest -q tests/kernels/test_sample_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda.bindings import driver as cu
from tests.kernels.gpu_helpers import check
from tests.kernels.sample_gpu_helpers import Sampler

from kern_run.sampling import SamplingParams, history_counts
from tools import reference_kernels as ref
from tools import reference_sample as rs

pytestmark = pytest.mark.gpu

QWEN_VOCAB = 151936
LOGPROB_ATOL = 2e-4  # float32 sums of __expf over up to 151,936 terms against float64
DRAWS_ROWS, DRAWS_LAUNCHES = 1000, 40  # 40,000 draws per configuration
P_MIN = 1e-3


def rand_logits(rng, rows, vocab, scale=3.0, dtype="bf16"):
    x = (rng.standard_normal((rows, vocab)) * scale).astype(np.float32)
    return ref.bf16_round(x) if dtype == "bf16" else x


# ------------------------------------------------------------------------------------------- Philox


def test_philox_device_matches_numpy_bit_for_bit(dev):
    rng = np.random.default_rng(7)
    n = 4099
    words = rng.integers(0, 2**32, size=(n, 6), dtype=np.uint64).astype(np.uint32)
    words[:3] = [[0, 0, 0, 0, 0, 0], [0xFFFFFFFF] * 6,
                 [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344, 0xA4093822, 0x299F31D0]]
    d_in, d_out = dev.array(words), dev.alloc(n * 16)
    d_out.poison()
    dev.kernel("kern_philox4x32_10").launch((-(-n // 256),), (256,), [("p", d_in.ptr), ("p", d_out.ptr), ("i", n)])
    got = d_out.download(np.uint32, (n, 4))
    np.testing.assert_array_equal(got, rs.philox4x32_10(words[:, :4], words[:, 4:]))
    np.testing.assert_array_equal(got[:3], [[0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8],
                                            [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD],
                                            [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]])


# ------------------------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("rows,vocab", [(1, QWEN_VOCAB), (8, QWEN_VOCAB), (64, QWEN_VOCAB), (5, 1001)])
def test_greedy_equals_numpy_argmax(dev, rows, vocab, dtype):
    rng = np.random.default_rng(100 + rows + vocab)
    logits = rand_logits(rng, rows, vocab, dtype=dtype)
    if rows > 1:
        logits[1, [17, vocab - 3]] = logits[1].max() + 1.0  # a tie: the smaller index wins
    if rows > 2:
        logits[2, 6] = logits[2].max() + 0.5
        logits[2, 5] = np.nan  # NaN never wins
    if dtype == "bf16":
        logits = ref.bf16_round(logits)  # the edits above as the device holds them
    res = Sampler(dev, rows, vocab, dtype).run(logits, [SamplingParams()] * rows, np.arange(rows))
    want = np.array([rs.greedy(r) for r in logits])
    np.testing.assert_array_equal(res.tokens, want)
    if rows > 1:
        assert res.tokens[1] == 17
    if rows > 2:
        assert res.tokens[2] == 6
    lp = np.array([rs.log_probs(logits[r], 0.0)[want[r]] for r in range(rows)])
    np.testing.assert_allclose(res.logprobs, lp, rtol=0, atol=LOGPROB_ATOL)


def test_all_nan_row_gives_token_0_and_minus_inf_and_past_vocab_limit_writes_nothing(dev):
    logits = np.full((2, 1000), np.nan, dtype=np.float32)
    logits[1, 3] = 1.0
    res = Sampler(dev, 2, 1000).run(logits, [SamplingParams(temperature=1.0, seed=1)] * 2, [0, 1])
    assert res.tokens.tolist() == [0, 3] and res.logprobs[0] == -np.inf and res.logprobs[1] == 0.0
    big = 2**20 + 8  # past the sampler's vocabulary limit
    sampler = Sampler(dev, 1, big)
    res = sampler.run(np.zeros((1, big), dtype=np.float32), [SamplingParams()], [0])
    assert res.tokens.tolist() == [-1] and np.isnan(res.logprobs[0])  # still the poison


# --------------------------------------------------------------------------------------- chi-square

# (name, vocab, dtype, logits scale, params, history or None)
CONFIGS = [
    ("plain T=1", 1000, "bf16", 1.5, dict(temperature=1.0), None),
    ("temperature 0.6", 1000, "bf16", 1.5, dict(temperature=0.6), None),
    ("top_k 20", 1000, "bf16", 1.5, dict(temperature=1.0, top_k=20), None),
    ("top_k 20 scalar path", 999, "bf16", 1.5, dict(temperature=1.0, top_k=20), None),
    ("top_p 0.7 (all 1000 candidates, bitwise)", 1000, "bf16", 1.5, dict(temperature=1.0, top_p=0.7), None),
    ("min_p 0.05", 1000, "bf16", 1.5, dict(temperature=1.0, min_p=0.05), None),
    ("k 50 p 0.9 min_p 0.02 T 0.8", 1000, "bf16", 1.5,
     dict(temperature=0.8, top_k=50, top_p=0.9, min_p=0.02), None),
    ("k 50 p 0.9 min_p 0.02 T 0.8 f32", 1000, "f32", 1.5,
     dict(temperature=0.8, top_k=50, top_p=0.9, min_p=0.02), None),
    ("penalties + top_k 100", 1000, "bf16", 1.5,
     dict(temperature=1.0, top_k=100, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2), "top"),
    ("slow path: top_k 600 above the 512 sampled maxima", 4096, "bf16", 1.0, dict(temperature=1.0, top_k=600), None),
    ("732 candidates, bitwise: k 400 p 0.95", 4096, "f32", 1.0, dict(temperature=1.0, top_k=400, top_p=0.95), None),
    ("slow path: top_k 1500", 4096, "bf16", 1.0, dict(temperature=1.0, top_k=1500), None),
    ("slow path: top_p 0.9 flat", 4096, "bf16", 0.5, dict(temperature=1.0, top_p=0.9), None),
    ("slow path: top_k 1500 top_p 0.8", 4096, "f32", 1.0, dict(temperature=1.0, top_k=1500, top_p=0.8), None),
]


@pytest.mark.parametrize("name,vocab,dtype,scale,kw,history", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_filter_distribution_chi_square(dev, name, vocab, dtype, scale, kw, history):
    rng = np.random.default_rng(2024 + [c[0] for c in CONFIGS].index(name))
    row = rand_logits(rng, 1, vocab, scale, dtype)[0]
    hist_pairs, hist_cap = [], 0
    if history == "top":  # the 30 most probable tokens, counts 1..3
        top = np.argsort(-row)[:30]
        hist_pairs = [(int(t), 1 + i % 3) for i, t in enumerate(top)]
        hist_cap = 32
    p = SamplingParams(seed=1234, **kw)
    penalized = rs.penalize(row, [t for t, _ in hist_pairs], [c for _, c in hist_pairs], p.repetition_penalty,
                            p.presence_penalty, p.frequency_penalty, dtype)
    l = rs.scaled(penalized, p.temperature)
    thr = rs.thresholds(l, p.top_k, p.top_p, p.min_p).thr
    sampler = Sampler(dev, DRAWS_ROWS, vocab, dtype, hist_cap=hist_cap, stats=True)
    logits = np.repeat(row[None, :], DRAWS_ROWS, axis=0)
    counts = np.zeros(vocab, dtype=np.int64)
    for launch in range(DRAWS_LAUNCHES):
        positions = launch * DRAWS_ROWS + np.arange(DRAWS_ROWS)
        res = sampler.run(logits, [p] * DRAWS_ROWS, positions, [hist_pairs] * DRAWS_ROWS if hist_cap else None)
        if launch == 0:
            if hist_cap:
                np.testing.assert_array_equal(res.logits_after[0], penalized)  # the in-place penalties
            # the kernel's threshold (the same in every row): the reference's, or one across a float32
            # rounding boundary (a top-p mass or t_min within 1e-4 relative; then the draws are tested
            # against the distribution at the kernel's threshold)
            thr_dev = res.stats[:, 2]
            assert (thr_dev == thr_dev[0]).all()
            if thr_dev[0] != thr:
                assert rs.rounding_boundary(l, thr, thr_dev[0], p.top_k, p.top_p, p.min_p), (thr, thr_dev[0])
                print(f"{name}: threshold {thr_dev[0]!r} against the reference's {thr!r} (a rounding boundary)")
                thr = thr_dev[0]
            probs = rs.distribution(l, thr)
            logp = rs.log_probs_at(l, thr)
        assert (res.tokens >= 0).all() and (res.tokens < vocab).all(), res.tokens[:8]
        np.testing.assert_allclose(res.logprobs, logp[res.tokens], rtol=0, atol=LOGPROB_ATOL)
        np.add.at(counts, res.tokens, 1)
    stat, df, pval = rs.chi_square(counts, probs)  # raises if a draw fell outside the kept set
    kept = int((probs > 0).sum())
    print(f"{name}: kept {kept} tokens, chi2 {stat:.1f} df {df} p {pval:.3g}")
    assert pval > P_MIN, f"{name}: chi-square {stat:.1f} on {df} df, p = {pval:.3g} <= {P_MIN}"


# ------------------------------------------------------------------------------------ batch invariance

TARGETS = [
    SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=42, repetition_penalty=1.2, frequency_penalty=0.1),
    SamplingParams(temperature=1.0, seed=2**64 - 5),
    SamplingParams(temperature=1.0, top_k=2000, seed=7),  # the slow path
    SamplingParams(temperature=0.7, top_p=0.9, min_p=0.05, seed=99),
]


def neighbour_params(rng, n):
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append(SamplingParams())
        elif kind == 1:
            out.append(SamplingParams(temperature=float(rng.uniform(0.3, 1.5)), seed=int(rng.integers(0, 2**63))))
        elif kind == 2:
            out.append(SamplingParams(temperature=1.0, top_k=int(rng.integers(1, 200)), top_p=0.8,
                                      seed=int(rng.integers(0, 2**63)), presence_penalty=0.5))
        else:
            out.append(SamplingParams(temperature=0.5, min_p=0.1, seed=3))
    return out


@pytest.mark.parametrize("target", range(len(TARGETS)))
def test_seeded_row_same_tokens_alone_and_in_batches_of_4_and_64(dev, target):
    rng = np.random.default_rng(500 + target)
    p = TARGETS[target]
    row = rand_logits(rng, 1, QWEN_VOCAB, 2.0)[0]
    history = history_counts(rng.integers(0, QWEN_VOCAB, 40).tolist() + [int(np.argmax(row))] * 3)
    hist_cap = 64
    steps = range(300, 316)
    results = {}
    for rows, where in ((1, 0), (4, 2), (64, 37)):
        sampler = Sampler(dev, rows, QWEN_VOCAB, hist_cap=hist_cap)
        got = []
        for pos in steps:
            logits = rand_logits(rng, rows, QWEN_VOCAB, 2.0)  # new neighbours every step
            logits[where] = row
            params = neighbour_params(rng, rows)
            params[where] = p
            positions = rng.integers(0, 10**6, rows)
            positions[where] = pos
            hist = [history_counts(rng.integers(0, QWEN_VOCAB, 10).tolist()) for _ in range(rows)]
            hist[where] = history
            res = sampler.run(logits, params, positions, hist)
            assert (res.tokens >= 0).all(), res.tokens
            got.append((int(res.tokens[where]), res.logprobs[where].tobytes()))
        results[rows] = got
    assert results[4] == results[1], "batch of 4 differs from the row alone"
    assert results[64] == results[1], "batch of 64 differs from the row alone"
    assert len({t for t, _ in results[1]}) > 1, "16 positions drew one token: the position does not reach the RNG"


# --------------------------------------------------------------------------------- top-n logprobs


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_top_logprobs_match_reference(dev, dtype):
    rng = np.random.default_rng(77)
    rows, n_top = 6, 5
    logits = rand_logits(rng, rows, QWEN_VOCAB, 3.0, dtype)
    params = [SamplingParams(), SamplingParams(temperature=0.7, seed=1), SamplingParams(temperature=1.0, top_k=3, seed=2),
              SamplingParams(temperature=1.0, top_p=0.5, seed=3), SamplingParams(temperature=1.3, min_p=0.2, seed=4),
              SamplingParams(temperature=0.9, top_k=1, seed=5)]
    sampler = Sampler(dev, rows, QWEN_VOCAB, dtype, stats=True)
    res = sampler.run(logits, params, np.arange(rows) + 10)
    ids_buf, lp_buf = dev.alloc(rows * n_top * 4), dev.alloc(rows * n_top * 4)
    ids_buf.poison()
    lp_buf.poison()
    dev.kernel(f"kern_sample_top_logprobs_{dtype}").launch(
        (rows,), (1024,), [("p", sampler.logits.ptr), ("p", sampler.stats.ptr), ("i", QWEN_VOCAB), ("i", n_top),
                           ("p", ids_buf.ptr), ("p", lp_buf.ptr)])
    ids = ids_buf.download(np.int32, (rows, n_top))
    lps = lp_buf.download(np.float32, (rows, n_top))
    for r, p in enumerate(params):
        t = p.temperature if p.temperature > 0 else 1.0
        np.testing.assert_array_equal(ids[r], rs.top_n(logits[r], t, n_top), err_msg=f"row {r}")
        want = rs.log_probs(logits[r], p.temperature, p.top_k, p.top_p, p.min_p)[ids[r]]
        np.testing.assert_array_equal(np.isinf(lps[r]), np.isinf(want), err_msg=f"row {r}: kept set")
        fin = np.isfinite(want)
        np.testing.assert_allclose(lps[r][fin], want[fin], rtol=0, atol=LOGPROB_ATOL, err_msg=f"row {r}")
        # the chosen token's logprob is one of the kept set's values
        np.testing.assert_allclose(res.logprobs[r], rs.log_probs(logits[r], p.temperature, p.top_k, p.top_p,
                                                                 p.min_p)[res.tokens[r]], atol=LOGPROB_ATOL)
    assert ids[5, 0] == rs.greedy(logits[5]) and res.tokens[5] == ids[5, 0]  # top_k 1 is greedy


# ------------------------------------------------------------------------------------------ history


def test_history_append(dev):
    cap, vocab = 4, 100
    tokens = np.array([[7, 3, -1, -1], [1, 2, 3, 4], [5, -1, -1, -1], [9, -1, -1, -1]], dtype=np.int32)
    counts = np.array([[2, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 0, 0, 0]], dtype=np.int32)
    new = np.array([3, 8, 6, 100], dtype=np.int32)  # found, list full, appended, out of range
    d_t, d_c, d_new = dev.array(tokens), dev.array(counts), dev.array(new)
    dev.kernel("kern_sample_history_append").launch(
        (4,), (32,), [("p", d_t.ptr), ("p", d_c.ptr), ("p", d_new.ptr), ("i", cap), ("i", vocab)])
    np.testing.assert_array_equal(d_t.download(np.int32, (4, cap)),
                                  [[7, 3, -1, -1], [1, 2, 3, 4], [5, 6, -1, -1], [9, -1, -1, -1]])
    np.testing.assert_array_equal(d_c.download(np.int32, (4, cap)),
                                  [[2, 2, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])


# ------------------------------------------------------------------------------------- graph replay


def test_captured_graph_replays_with_new_parameters(dev):
    rows, vocab = 8, QWEN_VOCAB
    rng = np.random.default_rng(11)
    logits = rand_logits(rng, rows, vocab)
    greedy = [SamplingParams()] * rows
    sampled = [SamplingParams(temperature=1.0, top_k=50, seed=r) for r in range(rows)]
    direct = Sampler(dev, rows, vocab)
    want_greedy = direct.run(logits, greedy, np.arange(rows))
    want_sampled = direct.run(logits, sampled, np.arange(rows) + 1000)

    graphed = Sampler(dev, rows, vocab)
    stream = check(cu.cuStreamCreate(1), "cuStreamCreate")  # non-blocking: capturable
    graphed.write(logits, greedy, np.arange(rows))
    check(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL), "BeginCapture")
    graphed.launch(stream=stream, sync=False)
    graph = check(cu.cuStreamEndCapture(stream), "EndCapture")
    exe = check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    try:
        for params, positions, want in ((greedy, np.arange(rows), want_greedy),
                                        (sampled, np.arange(rows) + 1000, want_sampled)):
            graphed.write(logits, params, positions)  # new parameters, same graph
            check(cu.cuCtxSynchronize(), "cuCtxSynchronize")  # the uploads ran on the legacy stream
            check(cu.cuGraphLaunch(exe, stream), "cuGraphLaunch")
            check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
            got = graphed.read()
            np.testing.assert_array_equal(got.tokens, want.tokens)
            np.testing.assert_array_equal(got.logprobs, want.logprobs)
        assert not np.array_equal(want_greedy.tokens, want_sampled.tokens)
    finally:
        check(cu.cuGraphExecDestroy(exe), "cuGraphExecDestroy")
        check(cu.cuGraphDestroy(graph), "cuGraphDestroy")
        check(cu.cuStreamDestroy(stream), "cuStreamDestroy")
