"""The batched decode attention entries side by side (kernels-src/attention_decode.cu), one layer of the Qwen3-4B
shape (32 q heads, 8 kv heads, head_dim 128, pages of 16 tokens) at `rows x ctx` points: microseconds per launch
(or per partial + reduce pair) and the percent of 4.3 TB/s that every row's K/V read once (+ q in, out) would take.

    python bench/decode_attention.py [--cases 64x576,64x2048,8x576,1x576] [--variants gqa,stream]
                                     [--defines "GQ_PROBE=8;GQ_PROBE=24"] [--split-tokens 64,256] [--json out.json]

Variants: `gqa` / `stream` (kern_attn_decode_partial_gqa / _stream, then kern_attn_decode_reduce), `gqa-partial`
(the gqa partial alone), `reduce` (the reduce alone, over partials the gqa partial wrote before). `--defines "A B;C"`
also times the partial variants on attention_decode.cu compiled here with each semicolon-separated set of -D flags
(timing probes such as GQ_PROBE, kernels-src/attention_decode.cu; a probe's results are not checked).
Each variant is captured into a CUDA graph of REPS back-to-back launches over the same inputs (no PDL) and timed by
CUDA events over REPLAYS replays; the median is reported. The K/V bytes are random (a 64 MiB block repeated), the
pages of each row a random permutation, every row at context ctx with split_tokens 64 and 16 splits (the
builder's; `--split-tokens A,B` times every case at each minimum split length, a row per length). Prints a table
last; writes JSON to --json, else $OUT/bench-decode-attention.json when OUT is set. Exit 3 without a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from cuda.bindings import driver as cu
from kern_run.models.qwen3 import EARLY_PARTIALS

from bench.decode import write_json
from bench.kernels import REPLAYS, REPS, time_graph
from tests.kernels.gpu_helpers import Kernel, check, open_gpu
from tools import reference_kernels as ref

ROOT = Path(__file__).resolve().parents[1]
PEAK_BYTES_PER_S = 4.3e12
HQ, HKV, D, PAGE = 32, 8, 128, 16
SPLIT_TOKENS, NUM_SPLITS = 64, 16
VARIANTS = ("gqa", "gqa-partial", "reduce", "stream")
PARTIALS = {"gqa": "gqa", "gqa-partial": "gqa", "stream": "stream"}  # variant -> its EARLY_PARTIALS entry


def parse_cases(text: str) -> list[tuple[int, int]]:
    """'64x576,1x2048' -> [(64, 576), (1, 2048)]; raises SystemExit naming a malformed item."""
    out = []
    for item in filter(None, text.split(",")):
        try:
            rows, ctx = (int(v) for v in item.split("x"))
        except ValueError:
            raise SystemExit(f"--cases: {item!r} is not ROWSxCTX") from None
        if not (1 <= rows <= 256 and 1 <= ctx <= 65536):
            raise SystemExit(f"--cases: {item!r} outside 1..256 rows x 1..65536 tokens")
        out.append((rows, ctx))
    return out


def parse_split_tokens(text: str) -> list[int]:
    """'64,256' -> [64, 256]; raises SystemExit naming an item that is not a positive multiple of 16 (a page)."""
    out = []
    for item in filter(None, text.split(",")):
        if not item.isdigit() or int(item) < 16 or int(item) % 16:
            raise SystemExit(f"--split-tokens: {item!r} is not a positive multiple of 16")
        out.append(int(item))
    return out or [SPLIT_TOKENS]


def floor_us(rows: int, ctx: int) -> float:
    """Every row's K and V read once, q read and the output written once (bf16), at 4.3 TB/s."""
    return rows * (ctx * HKV * D * 2 * 2 + HQ * D * 2 * 2) / PEAK_BYTES_PER_S * 1e6


def carveout_100(kernel: Kernel) -> Kernel:
    """`kernel` preferring the largest shared-memory carveout, as every launch of the builder's manifests does."""
    attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    check(cu.cuFuncSetAttribute(kernel.func, attr, 100), f"cuFuncSetAttribute({kernel.name}, carveout)")
    return kernel


def probe_kernels(gpu, defines: str, work: Path) -> dict[str, Kernel]:
    """The partial entries (EARLY_PARTIALS name -> Kernel) of attention_decode.cu compiled here with the build
    tool's flags and -D for each word of `defines`."""
    names = sorted(set(PARTIALS.values()))
    kernels = gpu.probe_kernels("attention_decode", defines.split(), [EARLY_PARTIALS[n][0] for n in names], work)
    return {name: carveout_100(kernels[EARLY_PARTIALS[name][0]]) for name in names}


class Case:
    """One layer's inputs for `rows` rows at context `ctx` on the device, and the launches of each variant."""

    def __init__(self, gpu, rng, rows: int, ctx: int, split_tokens: int = SPLIT_TOKENS) -> None:
        self.rows, self.ctx, self.split_tokens = rows, ctx, split_tokens
        pages_per_seq = -(-ctx // PAGE)
        pages = rows * pages_per_seq
        self.cache = gpu.alloc(pages * PAGE * 2 * HKV * D * 2)
        block = gpu.array(ref.bf16_bits((rng.standard_normal(1 << 25) * 0.5).astype(np.float32)))  # 64 MiB
        for off in range(0, self.cache.nbytes, block.nbytes):
            n = min(block.nbytes, self.cache.nbytes - off)
            check(cu.cuMemcpyDtoD(self.cache.ptr + off, block.ptr, n), "cuMemcpyDtoD")
        table = rng.permutation(pages).astype(np.int32).reshape(rows, pages_per_seq)
        last = (ctx - 1) // PAGE, (ctx - 1) % PAGE
        slots = np.array([int(table[r, last[0]]) * PAGE + last[1] for r in range(rows)], dtype=np.int32)
        q = gpu.array(ref.bf16_bits(rng.standard_normal((rows, HQ, D)).astype(np.float32)))
        self.po = gpu.alloc(rows * HQ * NUM_SPLITS * D * 4)
        self.ml = gpu.alloc(rows * HQ * NUM_SPLITS * 8)
        self.out = gpu.alloc(rows * HQ * D * 2)
        lens = gpu.array(np.full(rows, ctx, dtype=np.int32))
        self.partial = [("p", q.ptr), ("p", self.cache.ptr), ("p", gpu.array(table).ptr), ("p", lens.ptr),
                        ("p", gpu.array(slots).ptr), ("p", self.po.ptr), ("p", self.ml.ptr), ("i", HQ), ("i", HKV),
                        ("i", D), ("i", PAGE), ("i", pages_per_seq), ("i", pages), ("i", split_tokens),
                        ("i", NUM_SPLITS), ("f", D**-0.5)]
        self.reduce = [("p", self.po.ptr), ("p", self.ml.ptr), ("p", lens.ptr), ("p", self.out.ptr), ("i", HQ),
                       ("i", D), ("i", split_tokens), ("i", NUM_SPLITS)]

    def launches(self, gpu, variant: str, partials: dict[str, Kernel] | None = None):
        """The callable (stream) -> None of one variant's launch (or pair); `partials`: a probe build's entries."""
        red = carveout_100(gpu.kernel("kern_attn_decode_reduce"))
        grid = (HKV, NUM_SPLITS, self.rows)

        def partial(name):
            entry, threads, _ = EARLY_PARTIALS[name]
            kernel = partials[name] if partials else carveout_100(gpu.kernel(entry))
            return lambda st: kernel.launch(grid, (threads,), self.partial, stream=st, sync=False)

        def reduce(st):
            red.launch((HQ, self.rows), (D,), self.reduce, stream=st, sync=False)

        if variant in ("gqa", "stream"):
            p = partial(variant)
            return lambda st: (p(st), reduce(st))
        if variant == "gqa-partial":
            return partial("gqa")
        partial("gqa")(0)  # "reduce": over the gqa partial's output
        check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        return reduce

    def free(self) -> None:
        for buf in (self.cache, self.po, self.ml, self.out):
            buf.free()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="64x576,64x2048,8x576,1x576", help="comma list of ROWSxCTX")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--defines", default="",
                    help="semicolon list of -D sets (space separated) for probe builds of the partial entries")
    ap.add_argument("--split-tokens", default=str(SPLIT_TOKENS),
                    help="comma list of minimum split lengths (tokens, multiples of 16)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    cases = parse_cases(args.cases)
    splits = parse_split_tokens(args.split_tokens)
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    gpu = open_gpu()
    stream = check(cu.cuStreamCreate(1), "cuStreamCreate")
    rng = np.random.default_rng(0)
    probes: list[tuple[str, dict[str, Kernel]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for defines in (d.strip() for d in args.defines.split(";")):
            if defines:
                probes.append((defines, probe_kernels(gpu, defines, Path(tmp))))
    columns = [*variants, *(f"{v} [{d}]" for d, _ in probes for v in variants if v in PARTIALS)]
    results = []
    for (rows, ctx), split_tokens in ((c, t) for c in cases for t in splits):
        case = Case(gpu, rng, rows, ctx, split_tokens)
        rec = {"rows": rows, "ctx": ctx, "split_tokens": split_tokens, "floor_us": floor_us(rows, ctx), "us": {}}
        for v in variants:
            rec["us"][v] = time_graph(stream, [case.launches(gpu, v)])
        for defines, kernels in probes:
            for v in variants:
                if v in PARTIALS:
                    rec["us"][f"{v} [{defines}]"] = time_graph(stream, [case.launches(gpu, v, kernels)])
        results.append(rec)
        print(json.dumps(rec), flush=True)
        case.free()
    print(f"\n===== decode attention per layer (us per launch or pair, median of {REPLAYS} graph replays of {REPS}; "
          "% of 4.3 TB/s for the K/V read once)")
    print(f"{'rows x ctx':>12s} {'split':>5s} {'floor':>7s} | " + " | ".join(f"{c:>14s}" for c in columns))
    for rec in results:
        cells = [f"{rec['us'][c]:7.2f} {100 * rec['floor_us'] / rec['us'][c]:5.1f}%" for c in columns]
        print(f"{rec['rows']:>5d} x {rec['ctx']:<4d} {rec['split_tokens']:>5d} {rec['floor_us']:7.2f} | "
              + " | ".join(f"{c:>14s}" for c in cells))
    write_json(args.json, "bench-decode-attention.json", {"cases": results, "reps": REPS, "replays": REPLAYS})
    return 0


if __name__ == "__main__":
    sys.exit(main())
