"""GPU tests of the split-row sampler (kernels-src/sample.cu: a row over cdiv(vocab, 8192) blocks of 512 threads,
the block that takes the row's last ticket merging) from the BUILT cubin, beyond tests/kernels/test_sample_gpu.py
(which runs the same entry through the same helper): the split itself.

- Greedy rows (the short path: one pass over each slice, one merge of the slices' (max, argmax, sum)) equal
  numpy's argmax and the two-stage argmax kernel (kern_argmax_partial / _final) on the same logits, ties across
  slices and inside one to the smallest index, NaN never winning, an all-NaN row giving 0; at 1 and 64 rows, at
  vocabularies below, at, just past and far past one slice, and not a multiple of 8 (element loads).
- Sampled rows: each token is the reference's draw of the row's Philox uniform over the kernel's kept set in index
  order (`reference_sample.draw_agrees`), the threshold is the reference's (or one across a float32 rounding
  boundary), the logprob within 2e-4, the penalized logits bit for bit; rows that take the candidate path and rows
  that need the exact path (a kept set wider than the 8192 candidates), at 1 and 64 rows.
- Chi-square fits (40,000 draws, p > 1e-3) of one configuration of each path at a vocabulary of three slices.
- Every launch leaves every row's ticket at 0 (checked by the helper after each launch); a grid whose x is not
  cdiv(vocab, 8192) writes nothing.

Run on the GPU machine:  KERN_REQUIRE_GPU=1 uv run --frozen pytest -q tests/kernels/test_sample_split_gpu.py
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest
from tests.kernels.sample_gpu_helpers import THREADS, Sampler

from kern_run.sampling import SamplingParams, history_counts, sampler_splits
from tools import reference_kernels as ref
from tools import reference_sample as rs

pytestmark = pytest.mark.gpu

QWEN_VOCAB = 151936
LOGPROB_ATOL = 2e-4
VOCABS = [1000, 8191, 8192, 8193, 20001, QWEN_VOCAB]  # 1, 1, 1, 2, 3 (last slice 3617, odd), 19 slices


def rand_logits(rng, rows, vocab, scale=3.0, dtype="bf16"):
    x = (rng.standard_normal((rows, vocab)) * scale).astype(np.float32)
    return ref.bf16_round(x) if dtype == "bf16" else x


def argmax_kernel(dev, logits: np.ndarray) -> np.ndarray:
    """The two-stage argmax (kernels-src/argmax.cu) over bf16 logits [rows, vocab] -> int64 [rows]."""
    rows, vocab = logits.shape
    chunk = 1024
    chunks = -(-vocab // chunk)
    d_logits = dev.array(ref.bf16_bits(logits))
    pv, pi, out = dev.alloc(rows * chunks * 4), dev.alloc(rows * chunks * 4), dev.alloc(rows * 8)
    out.poison()
    dev.kernel("kern_argmax_partial").launch((chunks, rows), (256,), [("p", d_logits.ptr), ("i", vocab), ("i", chunk),
                                                                       ("p", pv.ptr), ("p", pi.ptr), ("i", chunks)])
    dev.kernel("kern_argmax_final").launch((rows,), (256,), [("p", pv.ptr), ("p", pi.ptr), ("i", chunks),
                                                             ("p", out.ptr)])
    return out.download(np.int64, (rows,))


# ------------------------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("rows", [1, 64])
@pytest.mark.parametrize("vocab", VOCABS)
def test_greedy_short_path_is_the_argmax_with_ties_to_the_smallest_index(dev, vocab, rows, dtype):
    rng = np.random.default_rng(vocab + rows)
    logits = rand_logits(rng, rows, vocab, dtype=dtype)
    last = vocab - 1
    ties = {0: (last, 0), 1: (last - 3, 17 % vocab), 2: (min(8195, last), min(8194, last - 1))}  # across, inside
    for r, (late, early) in ties.items():
        if r < rows:
            logits[r, [late, early]] = logits[r].max() + 1.0
    if rows > 3:
        logits[3, 5] = np.nan  # NaN never wins
        logits[3, 6] = logits[3, ~np.isnan(logits[3])].max() + 0.5
        logits[4] = np.nan  # all NaN: token 0
        logits[5, : vocab // 2] = -np.inf
    if dtype == "bf16":
        logits = ref.bf16_round(logits)
    res = Sampler(dev, rows, vocab, dtype, stats=True).run(logits, [SamplingParams()] * rows, np.arange(rows))
    want = np.array([rs.greedy(row) for row in logits])
    np.testing.assert_array_equal(res.tokens, want)
    for r, (late, early) in ties.items():
        if r < rows:
            assert res.tokens[r] == min(late, early), (r, res.tokens[r])
    if rows > 3:
        assert res.tokens[3] == 6 and res.tokens[4] == 0 and res.logprobs[4] == -np.inf
    if dtype == "bf16":
        np.testing.assert_array_equal(res.tokens, argmax_kernel(dev, logits))
    fin = np.isfinite(res.logprobs)
    lp = np.array([rs.log_probs(logits[r], 0.0)[want[r]] if fin[r] else -np.inf for r in range(rows)])
    np.testing.assert_allclose(res.logprobs[fin], lp[fin], rtol=0, atol=LOGPROB_ATOL)


# ------------------------------------------------------------------------------------------- sampled

# (label, params, logits scale): scale 3 keeps every kept set among the candidates; 0.3 (a flat row) makes the
# nucleus / min-p set / top-k wider than the 8192 candidates (the exact path) at 151936 logits
SAMPLED = [
    ("plain T=1", SamplingParams(temperature=1.0), 3.0),
    ("T 0.7 k 50 p 0.9", SamplingParams(temperature=0.7, top_k=50, top_p=0.9), 3.0),
    ("p 0.9", SamplingParams(temperature=1.0, top_p=0.9), 3.0),
    ("min_p 0.05", SamplingParams(temperature=1.0, min_p=0.05), 3.0),
    ("k 2000", SamplingParams(temperature=1.0, top_k=2000), 3.0),
    ("penalties k 100", SamplingParams(temperature=1.0, top_k=100, repetition_penalty=1.3, presence_penalty=0.4,
                                       frequency_penalty=0.2), 3.0),
    ("flat p 0.5", SamplingParams(temperature=1.0, top_p=0.5), 0.3),
    ("flat min_p 0.001", SamplingParams(temperature=1.0, min_p=0.001), 0.3),
    ("flat k 9000", SamplingParams(temperature=1.0, top_k=9000), 0.3),
    ("flat k 20000 p 0.7", SamplingParams(temperature=1.0, top_k=20000, top_p=0.7), 0.3),
]


@pytest.mark.parametrize("rows", [1, 64])
@pytest.mark.parametrize("vocab", [8193, 20001, QWEN_VOCAB])
@pytest.mark.parametrize("label,params,scale", SAMPLED, ids=[s[0] for s in SAMPLED])
def test_sampled_rows_are_the_references_draw(dev, label, params, scale, vocab, rows):
    rng = np.random.default_rng(zlib.crc32(f"{label} {vocab} {rows}".encode()))
    logits = rand_logits(rng, rows, vocab, scale)
    history = [history_counts(np.argsort(-logits[r])[:20].tolist() + rng.integers(0, vocab, 10).tolist())
               for r in range(rows)]
    seeds = rng.integers(0, 2**63, rows)
    plist = [dataclasses.replace(params, seed=int(seeds[r])) for r in range(rows)]
    positions = rng.integers(0, 10**6, rows)
    res = Sampler(dev, rows, vocab, hist_cap=32, stats=True).run(logits, plist, positions, history)
    for r, p in enumerate(plist):
        pen = rs.penalize(logits[r], [t for t, _ in history[r]], [c for _, c in history[r]], p.repetition_penalty,
                          p.presence_penalty, p.frequency_penalty)
        np.testing.assert_array_equal(res.logits_after[r], pen, err_msg=f"row {r}: the penalized logits")
        l = rs.scaled(pen, p.temperature)
        thr = res.stats[r, 2]
        want = rs.thresholds(l, p.top_k, p.top_p, p.min_p).thr
        assert thr == want or rs.rounding_boundary(l, want, thr, p.top_k, p.top_p, p.min_p), (r, thr, want)
        u = float(rs.sample_uniform(p.seed, int(positions[r])))
        tok = int(res.tokens[r])
        assert rs.draw_agrees(l, thr, u, tok), f"row {r}: token {tok}, the reference's draw {rs.draw(l, thr, u)}"
        assert abs(res.logprobs[r] - rs.log_probs_at(l, thr)[tok]) <= LOGPROB_ATOL, (r, res.logprobs[r])


# --------------------------------------------------------------------------------------- chi-square

SPLIT_CONFIGS = [  # (name, vocab, dtype, scale, params): three slices, the last one shorter and odd
    ("candidates: k 100 p 0.95", 20001, "bf16", 3.0, dict(temperature=1.0, top_k=100, top_p=0.95)),
    ("exact: p 0.99 over a flat row", 20001, "f32", 1.0, dict(temperature=1.0, top_p=0.99)),
]


@pytest.mark.parametrize("name,vocab,dtype,scale,kw", SPLIT_CONFIGS, ids=[c[0] for c in SPLIT_CONFIGS])
def test_split_path_distribution_chi_square(dev, name, vocab, dtype, scale, kw):
    rng = np.random.default_rng(77 + [c[0] for c in SPLIT_CONFIGS].index(name))
    row = rand_logits(rng, 1, vocab, scale, dtype)[0]
    p = SamplingParams(seed=4321, **kw)
    l = rs.scaled(row, p.temperature)
    rows, launches = 1000, 40
    sampler = Sampler(dev, rows, vocab, dtype, stats=True)
    logits = np.repeat(row[None, :], rows, axis=0)
    counts = np.zeros(vocab, dtype=np.int64)
    for launch in range(launches):
        res = sampler.run(logits, [p] * rows, launch * rows + np.arange(rows))
        if launch == 0:
            thr = res.stats[0, 2]
            assert (res.stats[:, 2] == thr).all()
            want = rs.thresholds(l, p.top_k, p.top_p, p.min_p).thr
            assert thr == want or rs.rounding_boundary(l, want, thr, p.top_k, p.top_p, p.min_p), (thr, want)
            probs = rs.distribution(l, thr)
        np.add.at(counts, res.tokens, 1)
    stat, df, pval = rs.chi_square(counts, probs)
    print(f"{name}: kept {int((probs > 0).sum())}, chi2 {stat:.1f} df {df} p {pval:.3g}")
    assert pval > 1e-3, f"{name}: chi-square {stat:.1f} on {df} df, p = {pval:.3g}"


# ------------------------------------------------------------------------------------------ limits


def test_a_grid_other_than_one_block_per_slice_writes_nothing(dev):
    vocab, rows = 20001, 2
    sampler = Sampler(dev, rows, vocab)
    sampler.write(rand_logits(np.random.default_rng(1), rows, vocab), [SamplingParams()] * rows, [0, 1])
    for gx in (sampler_splits(vocab) - 1, sampler_splits(vocab) + 1, rows):
        sampler.kernel.launch((gx, rows), (THREADS,), sampler.args())
        res = sampler.read()
        assert res.tokens.tolist() == [-1, -1] and np.isnan(res.logprobs).all(), gx
    # a block other than 512 threads (at most 512 launch: __launch_bounds__ makes the driver refuse more)
    sampler.kernel.launch((sampler_splits(vocab), rows), (THREADS // 2,), sampler.args())
    assert sampler.read().tokens.tolist() == [-1, -1]
