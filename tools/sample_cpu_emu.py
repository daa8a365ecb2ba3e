"""Run kernels-src/sample.cu on the CPU (no GPU) and check it against tools/reference_sample.py.

The kernel source is compiled with g++ against tools/cpu_emu/ (a stand-in for common.cuh and the CUDA builtins:
a block's threads as std::threads, real barriers, warp shuffles through an exchange; sample_emu.h adds L2 loads,
fences and global / shared atomics). The split sampler's grid (cdiv(vocab, 8192) slices x rows) runs one block at
a time, in row-major order and again in a shuffled order, so the block that takes a row's last ticket and merges
it differs between the two runs: both must give the same outputs bit for bit and leave every ticket at 0. Each
row is checked: greedy tokens against numpy's argmax (ties to the smallest index, across slices); the threshold
(stats) against the reference's (or one across a float32 rounding boundary); the token against the reference's
draw of the same Philox uniform over the kernel's kept set in index order (`reference_sample.draw_agrees`);
logprobs within 2e-4; the penalized logits bit for bit; the top-5 logprobs entry. The cases cover the merge's
paths: greedy, plain temperature, the candidate path (top-k / top-p / min-p over the exported candidates) and
the exact path (a kept set wider than the candidates: a flat row's nucleus, a low min-p, a top-k past them),
vocabularies that are and are not multiples of the slice and of the 16-byte group, ties. Cases marked
`concurrent` (the exact path's) run twice more with several blocks at once (CONCURRENT): every block of a row
together, row-major (the exact path's helper blocks join; their tasks are counted and must be some), and 3 at once
in the shuffled order (a row's blocks not all running: the merge does what no helper takes); their outputs must
equal the one-at-a-time run's bit for bit.
A logic check of the CUDA source where no GPU is at hand, not a substitute for tests/kernels/test_sample_gpu.py
(no GPU memory model, no real warps; concurrency between blocks only in the `concurrent` runs).

    uv run --frozen python -m tools.sample_cpu_emu [--seed N] [--quick]     # from the repository root; g++ (C++20)

Exit 0 when every row matches, 1 otherwise (the mismatches are printed), 2 without g++.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kern_run.sampling import SamplingParams, history_counts, pack_history, pack_params
from tools import reference_kernels as ref
from tools import reference_sample as rs

REPO = Path(__file__).resolve().parent.parent
N_TOP = 5
SHUFFLED_ORDER = 12345  # the driver's second block order (a std::mt19937 seed)
# the concurrent runs of a `concurrent` case: (order, workers); workers None: the case's slices (every block of a row
# running at once, row-major: the exact path's helpers join), 3: fewer (a row's blocks may not all be running)
CONCURRENT = ((0, None), (SHUFFLED_ORDER, 3))
PATHS = {0: "greedy", 1: "plain", 2: "candidates", 3: "exact", -1: "none"}  # sample.cu's SAMPLE_PATH values
G, P, C, X = 0, 1, 2, 3


@dataclass(frozen=True)
class Case:
    """Rows of random logits (normal x scale; `levels` > 0 rounds them to multiples of 1 / levels, for ties) and
    each row's parameters; `tie` plants the row maximum at both ends of the row (greedy must take the first);
    `paths` the merge path each row must take (sample.cu's SAMPLE_PATH), None where either may."""

    dtype: str
    vocab: int
    scale: float
    params: list[SamplingParams] = field(default_factory=list)
    levels: int = 0
    tie: bool = False
    quick: bool = False
    paths: tuple[int | None, ...] = ()
    concurrent: bool = False  # also run with blocks at once (CONCURRENT: a row's blocks together, and fewer)


CASES = [
    Case("bf16", 1000, 1.5, [SamplingParams(), SamplingParams(temperature=1.0, seed=5),
                             SamplingParams(temperature=1.0, top_k=20, seed=6)], tie=True, quick=True, paths=(G, P, C)),
    Case("bf16", 999, 1.5, [SamplingParams(temperature=0.8, top_k=50, top_p=0.9, min_p=0.02, seed=7),
                            SamplingParams(temperature=1.0, top_p=0.7, seed=8)], quick=True, paths=(C, C)),
    Case("f32", 1000, 1.5, [SamplingParams(temperature=1.0, min_p=0.05, seed=9),
                            SamplingParams(temperature=1.2, top_k=5, top_p=0.5, seed=10)], paths=(C, C)),
    Case("bf16", 4096, 1.0, [SamplingParams(temperature=1.0, top_k=600, seed=11),
                             SamplingParams(temperature=1.0, top_k=400, top_p=0.95, seed=12)], paths=(C, C)),
    Case("f32", 4096, 0.5, [SamplingParams(temperature=1.0, top_p=0.9, seed=13),
                            SamplingParams(temperature=1.0, top_k=1500, top_p=0.8, seed=14)], paths=(C, C)),
    # 3 slices, the last one 3617 long and not a multiple of 8 (element loads)
    Case("bf16", 20001, 2.0, [SamplingParams(), SamplingParams(temperature=1.0, seed=31),
                              SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=32),
                              SamplingParams(temperature=1.0, top_p=0.8, min_p=0.01, seed=33)], tie=True, quick=True,
         paths=(G, P, C, C)),
    # 2 slices, the second one logit long: each slice may export 4096, the 4097th largest lies far below the
    # slice max (the export edge's rounds go past the 255 bins of 2^16 keys)
    Case("bf16", 8193, 3.0, [SamplingParams(temperature=1.0, top_k=2000, seed=61),
                             SamplingParams(temperature=0.5, top_p=0.95, seed=62)], quick=True, paths=(C, C)),
    # ties: values on a grid of 1/4, so thresholds fall inside runs of equal logits
    Case("f32", 30000, 1.0, [SamplingParams(temperature=1.0, top_k=100, seed=41),
                             SamplingParams(temperature=1.0, top_k=50, top_p=0.6, seed=42),
                             SamplingParams(temperature=1.0, top_p=0.3, seed=43)], levels=4, paths=(C, C, C)),
    Case("bf16", 151936, 3.0, [SamplingParams(), SamplingParams(temperature=1.0, seed=21),
                               SamplingParams(temperature=0.7, top_k=50, top_p=0.9, seed=22),
                               SamplingParams(temperature=1.0, top_p=0.95, seed=23),
                               SamplingParams(temperature=1.0, min_p=0.05, seed=24),
                               SamplingParams(temperature=1.0, top_p=0.9, seed=25)], tie=True, quick=True,
         paths=(G, P, C, X, C, C)),
    # a flat row: kept sets wider than the 8192 candidates (the merge's exact path)
    Case("bf16", 151936, 0.3, [SamplingParams(temperature=1.0, top_k=9000, seed=51),
                               SamplingParams(temperature=1.0, min_p=0.001, seed=52),
                               SamplingParams(temperature=1.0, top_p=0.5, seed=53),
                               SamplingParams(temperature=1.0, top_k=20000, top_p=0.7, seed=54)], paths=(X, X, X, X)),
    # near-uniform rows, several of them: the exact path in every row (top-p 0.95 over a nucleus of ~140000; a
    # temperature spreads the keys inside the 2^16-key bins, so the later radix rounds split them)
    Case("bf16", 151936, 0.02, [SamplingParams(temperature=1.0, top_p=0.95, seed=71),
                                SamplingParams(temperature=1.0, top_p=0.95, seed=72),
                                SamplingParams(temperature=0.7, top_p=0.95, seed=73),
                                SamplingParams(temperature=1.0, top_k=100000, top_p=0.95, seed=74)],
         paths=(X, X, X, X), concurrent=True),
    # 5 slices (the last 7232 long): the exact path with every block of a row running at once (the helpers) in the
    # quick subset; f32 and a vocabulary that is not a multiple of the 16-byte group
    Case("bf16", 40000, 0.05, [SamplingParams(temperature=1.0, top_p=0.95, seed=81),
                               SamplingParams(temperature=0.7, top_k=20000, top_p=0.9, seed=82),
                               SamplingParams(temperature=1.0, min_p=0.0001, seed=83),
                               SamplingParams(temperature=1.0, top_k=50, seed=84)], quick=True, paths=(X, X, X, C),
         concurrent=True),
    Case("f32", 39999, 0.3, [SamplingParams(temperature=0.9, top_p=0.97, seed=91),
                             SamplingParams(temperature=1.0, top_k=30000, seed=92),
                             SamplingParams(temperature=1.0, top_p=0.9, seed=93)], paths=(X, X, None), concurrent=True),
    Case("bf16", 16384, 2.0, [SamplingParams(temperature=0.7, top_k=50, top_p=0.9, seed=15),
                              SamplingParams(temperature=1.0, top_p=0.9, min_p=0.05, seed=16),
                              SamplingParams(temperature=1.0, repetition_penalty=1.3, presence_penalty=0.4,
                                             frequency_penalty=0.2, top_k=100, seed=17)], quick=True, paths=(C, C, C)),
]


def build(work: Path, profile: bool = False) -> Path:
    """g++ the driver with kernels-src/sample.cu into work/; `profile`: with -DSAMPLE_PROFILE (the phase stamps,
    written to work/prof.bin by every run_case). Returns the executable."""
    for f in (REPO / "tools" / "cpu_emu").iterdir():
        shutil.copy(f, work / f.name)
    (work / "common.cuh").write_text((REPO / "tools" / "cpu_emu" / "common.cuh").read_text()
                                     + '\n#include "sample_emu.h"\n')
    shutil.copy(REPO / "kernels-src" / "sample.cu", work / "sample.cu")
    exe = work / "driver"
    subprocess.run(["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-DEMU_CONCURRENT_BLOCKS",
                    *(["-DSAMPLE_PROFILE"] if profile else []),
                    f"-I{work}", "-x", "c++", str(work / "driver.cpp"), "-o", str(exe), "-pthread"], check=True)
    return exe


def read_stamps(work: Path, rows: int, vocab: int) -> np.ndarray:
    """The phase stamps of the last run_case of a profile build: uint64 [rows, slices, sample_profile.SLOTS]."""
    splits = -(-vocab // 8192)
    return np.fromfile(work / "prof.bin", np.uint64).reshape(rows, splits, -1)


def run_case(exe: Path, work: Path, dtype: str, logits: np.ndarray, params, positions, hist, cap: int, order: int,
             workers: int = 1):
    """One launch of the sampler (then the top logprobs) on the driver: blocks in `order` (0 row-major, else a
    shuffle's seed), `workers` of them running at once. Returns the outputs, each row's ticket word after the launch,
    the path that merged it, and the exact-path tasks its helper blocks ran."""
    rows, vocab = logits.shape
    (ref.bf16_bits(logits) if dtype == "bf16" else logits.astype(np.float32)).tofile(work / "logits.bin")
    (work / "params.bin").write_bytes(pack_params(params))
    np.asarray(positions, np.int32).tofile(work / "positions.bin")
    tokens, counts = pack_history(hist, cap)
    (work / "ht.bin").write_bytes(tokens)
    (work / "hc.bin").write_bytes(counts)
    subprocess.run([str(exe), dtype, str(rows), str(vocab), str(cap), str(work), str(order), str(workers)], check=True)
    raw = np.fromfile(work / "out.bin", np.uint8)
    tok, lp = raw[: 4 * rows].view(np.int32), raw[4 * rows : 8 * rows].view(np.float32)
    stats = raw[8 * rows : 24 * rows].view(np.float32).reshape(rows, 4)
    after = raw[24 * rows :]
    after = (ref.from_bf16_bits(after.view(np.uint16)) if dtype == "bf16" else after.view(np.float32)).reshape(rows, vocab)
    top = np.fromfile(work / "top.bin", np.uint8)
    ids = top[: 4 * N_TOP * rows].view(np.int32).reshape(rows, N_TOP)
    top_lp = top[4 * N_TOP * rows :].view(np.float32).reshape(rows, N_TOP)
    tail = np.fromfile(work / "tickets.bin", np.int32)
    return (tok, lp, stats, after, ids, top_lp), tail[:rows], tail[rows : 2 * rows], tail[2 * rows :]


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
        u = float(rs.sample_uniform(p.seed, pos))
        if not rs.draw_agrees(l, thr, u, int(tok)):
            faults.append(f"token {tok}, the reference's draw {rs.draw(l, thr, u)}")
    logp = rs.log_probs_at(l, thr)
    if not (0 <= tok < l.size and abs(lp - logp[tok]) <= 2e-4):
        faults.append(f"logprob {lp}, reference {logp[tok] if 0 <= tok < l.size else None}")
    want_ids = rs.top_n(pen, temp, N_TOP)
    want_lp = logp[want_ids]
    fin = np.isfinite(want_lp)
    if not (np.array_equal(ids, want_ids) and np.array_equal(np.isfinite(top_lp), fin)
            and np.allclose(top_lp[fin], want_lp[fin], atol=2e-4)):
        faults.append(f"top logprobs {ids.tolist()} {top_lp.tolist()}, reference {want_ids.tolist()} {want_lp.tolist()}")
    return faults


def case_inputs(rng: np.random.Generator, case: Case):
    rows = len(case.params)
    logits = (rng.standard_normal((rows, case.vocab)) * case.scale).astype(np.float32)
    if case.levels:
        logits = (np.round(logits * case.levels) / case.levels).astype(np.float32)
    if case.tie:  # the row maximum at both ends: the first index wins, across slices
        for r in range(rows):
            logits[r, [case.vocab - 2, 1]] = logits[r].max() + 1.0
    logits = ref.bf16_round(logits) if case.dtype == "bf16" else logits
    positions = rng.integers(0, 10**6, rows)
    hist = [history_counts(np.argsort(-logits[r])[:20].tolist() + rng.integers(0, case.vocab, 10).tolist())
            for r in range(rows)]
    return logits, positions, hist


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of the random logits, positions and histories")
    parser.add_argument("--quick", action="store_true", help="only the cases marked quick (the CPU test's subset)")
    args = parser.parse_args(argv)
    if shutil.which("g++") is None:
        print("sample_cpu_emu: g++ not found (needs a C++20 g++)", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        exe = build(work)
        for case in CASES:
            logits, positions, hist = case_inputs(rng, case)  # drawn for every case: --quick sees the same inputs
            if args.quick and not case.quick:
                continue
            out, tickets, paths, _ = run_case(exe, work, case.dtype, logits, case.params, positions, hist, 64, 0)
            out2, tickets2, paths2, _ = run_case(exe, work, case.dtype, logits, case.params, positions, hist, 64,
                                                 SHUFFLED_ORDER)
            runs = []  # (label, outputs, tickets, paths, helped) of the concurrent runs
            if case.concurrent:
                for order, workers in CONCURRENT:
                    w = workers or -(-case.vocab // 8192)
                    runs.append((f"{w} blocks at once, order {order}",
                                 *run_case(exe, work, case.dtype, logits, case.params, positions, hist, 64, order, w)))
            for label, _, _, _, helped in runs:
                exact_rows = [r for r, want in enumerate(case.paths) if want == X]
                print(f"  {label}: helper tasks per row {helped.tolist()}")
                if label.startswith(f"{-(-case.vocab // 8192)} blocks") and exact_rows and not any(
                        helped[r] for r in exact_rows):
                    bad += 1
                    print(f"  {label}: no helper ran a task of the exact path")
            for r, p in enumerate(case.params):
                faults = check_row(case.dtype, logits[r], p, int(positions[r]), hist[r], *(x[r] for x in out))
                want_path = case.paths[r] if case.paths else None
                if want_path is not None and not paths[r] == paths2[r] == want_path:
                    faults.append(f"merged by path {PATHS[paths[r]]} / {PATHS[paths2[r]]}, expected {PATHS[want_path]}")
                if tickets[r] or tickets2[r]:
                    faults.append(f"ticket left at {tickets[r]} / {tickets2[r]} (expected 0)")
                if not all(np.asarray(a[r]).tobytes() == np.asarray(b[r]).tobytes() for a, b in zip(out, out2)):
                    faults.append("the shuffled block order gives other outputs")
                for label, out3, tickets3, paths3, _ in runs:
                    if not all(np.asarray(a[r]).tobytes() == np.asarray(b[r]).tobytes() for a, b in zip(out, out3)):
                        faults.append(f"{label} gives other outputs")
                    if tickets3[r] or paths3[r] != paths[r]:
                        faults.append(f"{label}: ticket {tickets3[r]}, path {PATHS.get(int(paths3[r]), '?')}")
                bad += bool(faults)
                print(f"{case.dtype} vocab {case.vocab} row {r} [{PATHS.get(int(paths[r]), '?')}] {p}: "
                      f"{'; '.join(faults) or 'ok'}")
    print(f"{bad} row(s) differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
