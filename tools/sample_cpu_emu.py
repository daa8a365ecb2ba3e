"""Run kernels-src/sample.cu on the CPU (no GPU) and check it against tools/reference_sample.py.

The kernel source is compiled with g++ against tools/cpu_emu/ (a stand-in for common.cuh and the CUDA builtins:
one block = 1024 std::threads, real barriers, warp shuffles through an exchange), then each case's rows are
sampled and checked: greedy tokens against numpy's argmax; the threshold (stats) against the reference's (or
one across a float32 rounding boundary); the token against the one this file's model of the kernel's element
order and selection picks for the same Philox uniform; logprobs within 2e-4; the penalized logits bit for bit;
the top-5 logprobs entry. A logic check of the CUDA source where no GPU is at hand, not a substitute for
tests/kernels/test_sample_gpu.py (no memory model, no real warps, float sums differ from the GPU's only where
the source does).

    uv run --frozen python -m tools.sample_cpu_emu [--seed N]     # from the repository root; needs g++ (C++20)

Exit 0 when every row matches, 1 otherwise (the mismatches are printed), 2 without g++.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from kern_run.sampling import SamplingParams, history_counts, pack_history, pack_params
from tools import reference_kernels as ref
from tools import reference_sample as rs

REPO = Path(__file__).resolve().parent.parent
THREADS, CANDIDATES, N_TOP = 1024, 1024, 5


def _key(f) -> np.ndarray:
    b = np.asarray(f, np.float32).view(np.uint32).astype(np.uint64)
    return np.where(b & 0x80000000, (~b) & 0xFFFFFFFF, b | 0x80000000).astype(np.uint64)


def _key_float(k: int) -> np.float32:
    b = (k & 0x7FFFFFFF) if k & 0x80000000 else (~k & 0xFFFFFFFF)
    return np.array([b], np.uint32).view(np.float32)[0]


def walk_order(n: int, v: int) -> list[np.ndarray]:
    """Each thread's element indices in the kernel's walk: groups of v at (t + j * 1024) * v."""
    return [np.array([g + e for g in range(t * v, n, THREADS * v) for e in range(v) if g + e < n], dtype=np.int64)
            for t in range(THREADS)]


def expected_token(row: np.ndarray, p: SamplingParams, u: float, v: int) -> int:
    """The token the kernel's algorithm picks for uniform u (a model of sample.cu in numpy, float64 sums)."""
    n = row.size
    order = walk_order(n, v)
    l = rs.scaled(row, p.temperature)
    tmax = np.array([l[o].max() if o.size else -np.inf for o in order], np.float32)
    m = l.max()
    z = np.exp(l.astype(np.float64) - m).sum()
    use_k, use_p, use_min = 0 < p.top_k < n, p.top_p < 1, p.min_p > 0
    thr = np.float32(m + np.float32(np.log(np.float32(p.min_p)))) if use_min else np.float32(-np.inf)
    fast = not use_k or p.top_k <= CANDIDATES
    if use_k or use_p or use_min:
        pivot = int(_key(thr))
        if fast and (use_k or use_p):
            pivot, mine = 0, _key(tmax)
            mine_p = np.where(tmax > -np.inf, np.exp(tmax.astype(np.float64) - m), 0.0)
            for b in range(31, (0 if use_k else 12) - 1, -1):
                cand = pivot | (1 << b)
                ok = (mine >= cand).sum() >= p.top_k if use_k else mine_p[mine >= cand].sum() >= np.float32(p.top_p) * z
                pivot = cand if ok else pivot
            if not (use_k and use_p):
                pivot = max(pivot, int(_key(thr)))
        if fast:
            cands = np.concatenate([o[_key(l[o]) >= pivot] for o in order])
            fast = cands.size <= CANDIDATES and (not use_k or not use_p or cands.size >= p.top_k)
            if fast:
                cv = l[cands]
                if use_k or use_p:
                    t = rs.thresholds(cv, p.top_k if cands.size > p.top_k else 0, p.top_p, 0.0)
                    t_p = t.t_p if use_p else -np.inf
                    if use_p and not use_k:  # top-p over the whole row: Z from every element
                        mass_ge = np.array([np.exp(cv[cv >= c].astype(np.float64) - m).sum() for c in cv])
                        ok = mass_ge >= float(np.float32(p.top_p)) * z
                        t_p = cv[ok].max() if ok.any() else _key_float(pivot)
                    thr = np.float32(max(thr, t.t_k if use_k else -np.inf, t_p))
                w = np.where(cv >= thr, np.exp(cv.astype(np.float64) - m), 0.0)
                inc = np.cumsum(w)
                return int(cands[np.flatnonzero((w > 0) & (inc > u * inc[-1]))[0]])
        if not fast and (use_k or use_p):
            t = rs.thresholds(l, p.top_k, p.top_p, 0.0)
            thr = np.float32(max(thr, t.t_k, t.t_p))
    seq = np.concatenate(order)
    w = np.where(l[seq] >= thr, np.exp(l[seq].astype(np.float64) - m), 0.0)
    inc = np.cumsum(w)
    return int(seq[np.flatnonzero((w > 0) & (inc > u * inc[-1]))[0]])


CASES = [  # (dtype, vocab, logits scale, rows' parameters)
    ("bf16", 1000, 1.5, [SamplingParams(), SamplingParams(temperature=1.0, seed=5),
                         SamplingParams(temperature=1.0, top_k=20, seed=6)]),
    ("bf16", 999, 1.5, [SamplingParams(temperature=0.8, top_k=50, top_p=0.9, min_p=0.02, seed=7),
                        SamplingParams(temperature=1.0, top_p=0.7, seed=8)]),
    ("f32", 1000, 1.5, [SamplingParams(temperature=1.0, min_p=0.05, seed=9),
                        SamplingParams(temperature=1.2, top_k=5, top_p=0.5, seed=10)]),
    ("bf16", 4096, 1.0, [SamplingParams(temperature=1.0, top_k=600, seed=11),
                         SamplingParams(temperature=1.0, top_k=400, top_p=0.95, seed=12)]),
    ("f32", 4096, 0.5, [SamplingParams(temperature=1.0, top_p=0.9, seed=13),
                        SamplingParams(temperature=1.0, top_k=1500, top_p=0.8, seed=14)]),
    ("bf16", 151936, 3.0, [SamplingParams(), SamplingParams(temperature=1.0, seed=21),
                           SamplingParams(temperature=0.7, top_k=50, top_p=0.9, seed=22),
                           SamplingParams(temperature=1.0, top_p=0.95, seed=23),
                           SamplingParams(temperature=1.0, min_p=0.05, seed=24)]),
    ("bf16", 16384, 2.0, [SamplingParams(temperature=0.7, top_k=50, top_p=0.9, seed=15),
                          SamplingParams(temperature=1.0, top_p=0.9, min_p=0.05, seed=16),
                          SamplingParams(temperature=1.0, repetition_penalty=1.3, presence_penalty=0.4,
                                         frequency_penalty=0.2, top_k=100, seed=17)]),
]


def build(work: Path) -> Path:
    for f in (REPO / "tools" / "cpu_emu").iterdir():
        shutil.copy(f, work / f.name)
    shutil.copy(REPO / "kernels-src" / "sample.cu", work / "sample.cu")
    exe = work / "driver"
    subprocess.run(["g++", "-std=c++20", "-O1", "-ffp-contract=off", f"-I{work}", "-x", "c++", str(work / "driver.cpp"),
                    "-o", str(exe), "-pthread"], check=True)
    return exe


def run_case(exe: Path, work: Path, dtype: str, logits: np.ndarray, params, positions, hist, cap: int):
    rows, vocab = logits.shape
    (ref.bf16_bits(logits) if dtype == "bf16" else logits.astype(np.float32)).tofile(work / "logits.bin")
    (work / "params.bin").write_bytes(pack_params(params))
    np.asarray(positions, np.int32).tofile(work / "positions.bin")
    tokens, counts = pack_history(hist, cap)
    (work / "ht.bin").write_bytes(tokens)
    (work / "hc.bin").write_bytes(counts)
    subprocess.run([str(exe), dtype, str(rows), str(vocab), str(cap), str(work)], check=True)
    raw = np.fromfile(work / "out.bin", np.uint8)
    tok, lp = raw[: 4 * rows].view(np.int32), raw[4 * rows : 8 * rows].view(np.float32)
    stats = raw[8 * rows : 24 * rows].view(np.float32).reshape(rows, 4)
    after = raw[24 * rows :]
    after = (ref.from_bf16_bits(after.view(np.uint16)) if dtype == "bf16" else after.view(np.float32)).reshape(rows, vocab)
    top = np.fromfile(work / "top.bin", np.uint8)
    ids = top[: 4 * N_TOP * rows].view(np.int32).reshape(rows, N_TOP)
    top_lp = top[4 * N_TOP * rows :].view(np.float32).reshape(rows, N_TOP)
    return tok, lp, stats, after, ids, top_lp


def check_row(dtype, raw_row, p, pos, pairs, tok, lp, stats, after, ids, top_lp) -> list[str]:
    faults = []
    pen = rs.penalize(raw_row, [t for t, _ in pairs], [c for _, c in pairs], p.repetition_penalty, p.presence_penalty,
                      p.frequency_penalty, dtype)
    if not np.array_equal(after, pen):
        faults.append("penalized logits differ")
    temp = p.temperature if p.temperature > 0 else 1.0
    l = rs.scaled(pen, temp)
    thr = stats[2]
    if p.greedy:
        want = rs.greedy(pen)
        if tok != want:
            faults.append(f"greedy token {tok}, numpy {want}")
    else:
        t = rs.thresholds(l, p.top_k, p.top_p, p.min_p)
        if thr != t.thr and not rs.rounding_boundary(l, t.thr, thr, p.top_k, p.top_p, p.min_p):
            faults.append(f"threshold {thr!r}, reference {t.thr!r}")
        want = expected_token(pen, p, float(rs.sample_uniform(p.seed, pos)), 8 if dtype == "bf16" else 4)
        if tok != want:
            faults.append(f"token {tok}, the order model {want}")
    logp = rs.log_probs_at(l, thr)
    if not abs(lp - logp[tok]) <= 2e-4:
        faults.append(f"logprob {lp}, reference {logp[tok]}")
    want_ids = rs.top_n(pen, temp, N_TOP)
    want_lp = logp[want_ids]
    fin = np.isfinite(want_lp)
    if not (np.array_equal(ids, want_ids) and np.array_equal(np.isfinite(top_lp), fin)
            and np.allclose(top_lp[fin], want_lp[fin], atol=2e-4)):
        faults.append(f"top logprobs {ids.tolist()} {top_lp.tolist()}, reference {want_ids.tolist()} {want_lp.tolist()}")
    return faults


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of the random logits, positions and histories")
    args = parser.parse_args(argv)
    if shutil.which("g++") is None:
        print("sample_cpu_emu: g++ not found (needs a C++20 g++)", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        exe = build(work)
        for dtype, vocab, scale, params in CASES:
            rows = len(params)
            logits = (rng.standard_normal((rows, vocab)) * scale).astype(np.float32)
            logits = ref.bf16_round(logits) if dtype == "bf16" else logits
            positions = rng.integers(0, 10**6, rows)
            hist = [history_counts(np.argsort(-logits[r])[:20].tolist() + rng.integers(0, vocab, 10).tolist())
                    for r in range(rows)]
            out = run_case(exe, work, dtype, logits, params, positions, hist, 64)
            for r, p in enumerate(params):
                faults = check_row(dtype, logits[r], p, int(positions[r]), hist[r], *(x[r] for x in out))
                bad += bool(faults)
                print(f"{dtype} vocab {vocab} row {r} {p}: {'; '.join(faults) or 'ok'}")
    print(f"{bad} row(s) differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
