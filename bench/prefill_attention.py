"""Chunks of the prefill attention entries at the Qwen3-4B shape, launched plainly (no graph), for timing
side by side and for Nsight Compute.

    python bench/prefill_attention.py --prefix 6144 --chunk 2048        # the last chunk of an 8k prompt
    python bench/prefill_attention.py --entry kern_attn_prefill_r32 --entry kern_attn_prefill_wg \
        --cases 0+2048,6144+2048,7680+512                               # a table, entries side by side
    ncu --kernel-name kern_attn_prefill --launch-skip 2 --launch-count 1 --set full \
        python bench/prefill_attention.py --prefix 6144 --chunk 2048

For each case (cached prefix + chunk) and entry, launches the kernel `--reps` times (the first two warm up)
with random q and K/V (bf16, pages in a random order) and reports the median device time (CUDA events) and
TFLOP/s (4 * Hq * D flops per attended (query, key) pair). With several entries the outputs of each case are
also compared with the first entry's (max |difference|, elements that differ). A table is printed last.
bench/kernels.py times the r32 kernel in a graph beside the others.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from cuda.bindings import driver as cu

from kern_run.models.qwen3 import PREFILL_ATTN
from tests.kernels.gpu_helpers import check, open_gpu


HQ, HKV, D, PAGE = 32, 8, 128, 16
# entry -> (query rows per grid.x step, dynamic shared memory bytes, threads); docs/kernels.md "Entries"
ENTRIES = {entry: (rows, smem, threads) for entry, rows, smem, threads in PREFILL_ATTN.values()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", type=int, default=6144, help="cached tokens before the chunk")
    ap.add_argument("--chunk", type=int, default=2048, help="query tokens in the chunk")
    ap.add_argument("--cases", default=None, help="comma list of PREFIX+CHUNK (replaces --prefix / --chunk)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--entry", action="append", choices=sorted(ENTRIES),
                    help="entry to time (repeat for several; default kern_attn_prefill)")
    args = ap.parse_args(argv)
    entries = args.entry or ["kern_attn_prefill"]
    if args.reps < 3:
        ap.error(f"--reps {args.reps}: at least 3 (the first two warm up)")
    cases: list[tuple[int, int]] = []
    for case in (args.cases.split(",") if args.cases is not None else [f"{args.prefix}+{args.chunk}"]):
        parts = case.split("+")
        try:
            prefix, chunk = (int(x) for x in parts) if len(parts) == 2 else (-1, 0)
        except ValueError:
            prefix, chunk = -1, 0
        if prefix < 0 or chunk < 1:
            ap.error(f"case {case!r}: use PREFIX+CHUNK with PREFIX >= 0 and CHUNK >= 1 (e.g. --cases 0+2048,6144+2048)")
        cases.append((prefix, chunk))
    gpu = open_gpu()
    start, end = check(cu.cuEventCreate(0), "cuEventCreate"), check(cu.cuEventCreate(0), "cuEventCreate")
    rows_out: list[tuple[str, str, float, float, str]] = []
    for prefix, chunk in cases:
        rng = np.random.default_rng(0)
        bits = lambda n: (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # noqa: E731
        ctx = prefix + chunk
        pages = -(-ctx // PAGE)
        cache = gpu.alloc(pages * PAGE * 2 * HKV * D * 2)
        cache.upload(bits(pages * PAGE * 2 * HKV * D))

        def arr(a: np.ndarray) -> int:
            buf = gpu.alloc(a.nbytes)
            buf.upload(a)
            return buf.ptr

        q, bt = arr(bits(chunk * HQ * D)), arr(rng.permutation(pages).astype(np.int32))
        cu_q, lens = arr(np.array([0, chunk], dtype=np.int32)), arr(np.array([ctx], dtype=np.int32))
        first: np.ndarray | None = None
        first_raw: np.ndarray | None = None
        for entry in entries:
            out = gpu.alloc(chunk * HQ * D * 2)
            launch_args = [("p", q), ("p", cache.ptr), ("p", bt), ("p", cu_q), ("p", lens), ("p", out.ptr),
                           ("i", HQ), ("i", HKV), ("i", D), ("i", PAGE), ("i", pages), ("i", pages), ("f", D**-0.5)]
            kernel = gpu.kernel(entry)
            rows, smem, threads = ENTRIES[entry]
            times = []
            for _ in range(args.reps):
                check(cu.cuEventRecord(start, 0), "cuEventRecord")
                kernel.launch((-(-chunk // rows), HKV, 1), (threads,), launch_args, sync=False, shared_mem=smem)
                check(cu.cuEventRecord(end, 0), "cuEventRecord")
                check(cu.cuEventSynchronize(end), "cuEventSynchronize")
                times.append(check(cu.cuEventElapsedTime(start, end), "cuEventElapsedTime") * 1000.0)
            us = statistics.median(times[2:])
            pairs = chunk * prefix + chunk * (chunk + 1) / 2
            raw = out.download(np.uint16, (chunk * HQ * D,))  # bf16 bits: a bitwise compare (+0 != -0)
            got = (raw.astype(np.uint32) << 16).view(np.float32)
            if first is None:
                first, first_raw, vs = got, raw, "-"
            else:
                diff = np.abs(got.astype(np.float64) - first)
                vs = f"max |d| {diff.max():.2e}, {int((raw != first_raw).sum())} differ"
            rows_out.append((f"{prefix}+{chunk}", entry, us, 4.0 * HQ * D * pairs / us / 1e6, vs))
            print(f"{entry} prefix={prefix} chunk={chunk}: {us:.1f} us, {rows_out[-1][3]:.1f} TFLOP/s ({vs})",
                  flush=True)
        gpu.free_all()
    print(f"\n{'prefix+chunk':>14}  {'entry':<26} {'us':>9} {'TFLOP/s':>8}  vs {entries[0]}")
    for case, entry, us, tf, vs in rows_out:
        print(f"{case:>14}  {entry:<26} {us:9.1f} {tf:8.1f}  {vs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
