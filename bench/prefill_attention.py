"""One chunk of kern_attn_prefill at the Qwen3-4B shape, launched plainly (no graph), for Nsight Compute.

    python bench/prefill_attention.py --prefix 6144 --chunk 2048        # the last chunk of an 8k prompt
    ncu --kernel-name kern_attn_prefill --launch-skip 2 --launch-count 1 --set full \\
        python bench/prefill_attention.py --prefix 6144 --chunk 2048

Launches the kernel `--reps` times (the first two warm up) with random q and K/V (bf16, pages in a random
order) and prints the median device time (CUDA events) and TFLOP/s (4 * Hq * D flops per attended
(query, key) pair). bench/kernels.py times the same kernel in a graph beside the others.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "kernels"))

from cuda.bindings import driver as cu  # noqa: E402
from gpu_helpers import Gpu, check  # noqa: E402

sys.path.insert(0, str(REPO / "tools"))
from gen_qwen3 import PREFILL_ATTN  # noqa: E402

HQ, HKV, D, PAGE = 32, 8, 128, 16
# entry -> (query rows per grid.x step, dynamic shared memory bytes); docs/kernels.md "Entries"
ENTRIES = {entry: (rows, smem) for entry, rows, smem in PREFILL_ATTN.values()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", type=int, default=6144, help="cached tokens before the chunk")
    ap.add_argument("--chunk", type=int, default=2048, help="query tokens in the chunk")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--entry", default="kern_attn_prefill", choices=sorted(ENTRIES))
    args = ap.parse_args(argv)
    if args.prefix < 0 or args.chunk < 1 or args.reps < 3:
        ap.error("--prefix >= 0, --chunk >= 1, --reps >= 3")
    gpu = Gpu()
    rng = np.random.default_rng(0)
    bits = lambda n: (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # noqa: E731
    ctx = args.prefix + args.chunk
    pages = -(-ctx // PAGE)
    cache = gpu.alloc(pages * PAGE * 2 * HKV * D * 2)
    cache.upload(bits(pages * PAGE * 2 * HKV * D))

    def arr(a: np.ndarray) -> int:
        buf = gpu.alloc(a.nbytes)
        buf.upload(a)
        return buf.ptr

    launch_args = [("p", arr(bits(args.chunk * HQ * D))), ("p", cache.ptr),
                   ("p", arr(rng.permutation(pages).astype(np.int32))),
                   ("p", arr(np.array([0, args.chunk], dtype=np.int32))), ("p", arr(np.array([ctx], dtype=np.int32))),
                   ("p", gpu.alloc(args.chunk * HQ * D * 2).ptr), ("i", HQ), ("i", HKV), ("i", D), ("i", PAGE),
                   ("i", pages), ("i", pages), ("f", D**-0.5)]
    kernel = gpu.kernel(args.entry)
    rows, smem = ENTRIES[args.entry]
    start, end = check(cu.cuEventCreate(0), "cuEventCreate"), check(cu.cuEventCreate(0), "cuEventCreate")
    times = []
    for _ in range(args.reps):
        check(cu.cuEventRecord(start, 0), "cuEventRecord")
        kernel.launch((-(-args.chunk // rows), HKV, 1), (128,), launch_args, sync=False, shared_mem=smem)
        check(cu.cuEventRecord(end, 0), "cuEventRecord")
        check(cu.cuEventSynchronize(end), "cuEventSynchronize")
        times.append(check(cu.cuEventElapsedTime(start, end), "cuEventElapsedTime") * 1000.0)
    us = statistics.median(times[2:])
    pairs = args.chunk * args.prefix + args.chunk * (args.chunk + 1) / 2
    print(f"{args.entry} prefix={args.prefix} chunk={args.chunk}: {us:.1f} us, "
          f"{4.0 * HQ * D * pairs / us / 1e6:.1f} TFLOP/s")
    gpu.free_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
