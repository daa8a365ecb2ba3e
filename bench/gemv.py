"""Benchmark of the M = 1 GEMV entries (kernels-src/gemv.cu) at Qwen3-4B shapes, beside cuBLASLt.

For each shape, every entry and ``torch.matmul`` (cuBLAS / cuBLASLt, bf16, M = 1) on the same
weights: REPS back-to-back launches captured in one CUDA graph (Python launch cost is not measured),
rotating over enough weight copies that the set is >= 256 MiB (L2 is 60 MB: every launch streams W
from HBM), timed with CUDA events over REPLAYS replays; the median per launch is reported with GB/s and
% of 4.3 TB/s (the measured H200 copy rate, shared/design/GPU-MACHINE.md; this run's own copy rate is
printed too). Bytes counted: W once, the input vector(s) once, the output once (a residual read + write).

Rows-family entries (decode v2, `gen_qwen3.py --gemv v2`) follow the old ones per shape at their own launch
(grid x block in the label; `(v2)` marks the entry v2 uses at that shape), and the step chain is timed for v2
as well.

Then the decode step's GEMVs: 36 layers x [qkv+RMSNorm, o+residual, gate_up+RMSNorm, down+SiLU+residual]
+ lm_head+RMSNorm, all distinct weights (8.0 GB), one graph, without and with programmatic dependent
launch (PDL), beside the 145 plain GEMMs of the same shapes through torch.matmul (one graph; the
peer measured 2.63 ms) and the floor 8.04 GB / 4.3 TB/s = 1.87 ms.

    python bench/gemv.py                # default launch (docs/kernels-gemv.md), + step chain
    python bench/gemv.py --sweep        # + launch shapes x unroll variants (compiled here with nvcc)
    python bench/gemv.py --mma          # instead: the batched-decode crossover table, m = 1..64 (bench/gemv_mma.py)
    python bench/gemv.py --rows-m       # instead: the multi-row rows entries, m = 1, 2, 4, 8 (bench/gemv_rows_m.py)

Results also go to $OUT/gemv_bench.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from cuda.bindings import driver as cu

from tests.kernels.gemv_gpu_helpers import compile_gemv, gemv_kernels, kernels_from_cubin, launch, sm_count
from tests.kernels.gpu_helpers import open_gpu


COPY_RATE = 4.3e12  # bytes/s, H200 device-to-device copy (read + write), GPU-MACHINE.md
ROTATE_BYTES = 256 << 20
REPS, REPLAYS = 40, 15
EPS = 1e-6
HIDDEN, INTER, QKV, ATTN, VOCAB, LAYERS = 2560, 9728, 6144, 4096, 151936, 36

# (name, n, k, the entry the decode step uses at this shape)
SHAPES = [
    ("qkv", QKV, HIDDEN, "kern_gemv_rmsnorm"),
    ("o", HIDDEN, ATTN, "kern_gemv_residual"),
    ("gate_up", 2 * INTER, HIDDEN, "kern_gemv_rmsnorm"),
    ("down", HIDDEN, INTER, "kern_gemv_silu_residual"),
    ("lm_head", VOCAB, HIDDEN, "kern_gemv_rmsnorm"),
]
ENTRIES = ("kern_gemv", "kern_gemv_rmsnorm", "kern_gemv_residual", "kern_gemv_silu_residual")
# decode v2 (gen_qwen3.py --gemv v2): the rows family at its own launch (rows_launch), and the SwiGLU
# epilogue at the gate_up shape (n = 2 * inter rows -> inter outputs)
ROWS_ENTRIES = ("kern_gemv_rows", "kern_gemv_rows_rmsnorm", "kern_gemv_rows_residual")
SWIGLU = "kern_gemv_rmsnorm_swiglu"
V2_ENTRY = {"qkv": "kern_gemv_rows_rmsnorm", "o": "kern_gemv_rows_residual", "gate_up": SWIGLU,
            "down": "kern_gemv_rows_residual", "lm_head": "kern_gemv_rmsnorm"}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# Launch shapes: block threads, grid(n, SMs). The first is the documented default.
CONFIGS: dict[str, tuple[int, Callable[[int, int], int]]] = {
    "512t x 2/SM": (512, lambda n, sms: min(n, 2 * sms)),
    "256t x 4/SM": (256, lambda n, sms: min(n, 4 * sms)),
    "1024t x 1/SM": (1024, lambda n, sms: min(n, sms)),
    "256t row/warp": (256, lambda n, sms: cdiv(n, 8)),
}
DEFAULT_CONFIG = "512t x 2/SM"


def rows_launch(entry: str, n: int, k: int) -> tuple[int, int]:
    """(grid, block) of a rows-family launch, as tools/gen_qwen3.py _rows_launch: 4 rows per group (SwiGLU:
    2 outputs = 4 rows), block = whole warps covering ceil(k/8) chunks in 2-chunk steps, grid = min(groups,
    (1024 // block) * SMs)."""
    k8 = cdiv(k, 8)
    batches = cdiv(k8, 1024)
    block = min(1024, max(32, cdiv(cdiv(k8, 2 * batches), 32) * 32))
    groups = cdiv(n // 2, 2) if entry == SWIGLU else cdiv(n, 4)
    return min(groups, max(1, 1024 // block) * SMS), block


def m1_launch(entry: str, n: int, k: int) -> tuple[int, int]:
    """(grid, block) of an M = 1 entry as the v2 decode launches it: rows_launch for the rows family and SwiGLU,
    the default launch (block 512, grid min(n, 2 SMs)) for kern_gemv_rmsnorm (lm_head)."""
    if entry in ROWS_ENTRIES or entry == SWIGLU:
        return rows_launch(entry, n, k)
    block, grid_rule = CONFIGS[DEFAULT_CONFIG]
    return grid_rule(n, SMS), block


def smem_bytes(k: int) -> int:
    return 16 * cdiv(k, 8)


def entry_bytes(entry: str, n: int, k: int) -> int:
    """Fewest bytes an entry moves: W once, its inputs once, its output once (residual: read + write)."""
    vectors = {"kern_gemv": 2 * k + 2 * n, "kern_gemv_rmsnorm": 4 * k + 2 * n,
               "kern_gemv_residual": 2 * k + 4 * n, "kern_gemv_silu_residual": 4 * k + 4 * n,
               "kern_gemv_rows": 2 * k + 2 * n, "kern_gemv_rows_rmsnorm": 4 * k + 2 * n,
               "kern_gemv_rows_residual": 2 * k + 4 * n, SWIGLU: 4 * k + n}[entry]
    return 2 * n * k + vectors


def current_stream() -> Any:
    return cu.CUstream(torch.cuda.current_stream().cuda_stream)


def time_graph(launches: list[Callable[[], None]], reps: int = REPS) -> float:
    """Median microseconds per launch: `reps` launches cycling through `launches`, one graph, replayed."""
    reps = max(reps, len(launches))
    for fn in launches:  # warm-up outside capture (cuBLAS workspaces, module state)
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(reps):
            launches[i % len(launches)]()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(REPLAYS):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / reps)
    del graph
    return statistics.median(times)


def copy_rate() -> float:
    """This device's device-to-device copy rate in bytes/s, counting read + write (1 GiB buffers)."""
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    us = time_graph([lambda: dst.copy_(src)], reps=10)
    return 2 * src.numel() * 2 / (us * 1e-6)


class ShapeData:
    """Weight copies and vectors for one (n, k)."""

    def __init__(self, n: int, k: int):
        self.n, self.k = n, k
        copies = max(2, cdiv(ROTATE_BYTES, 2 * n * k))
        self.w = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05 for _ in range(copies)]
        self.vec_in = torch.randn(2 * k, device="cuda", dtype=torch.bfloat16)  # x / residual in / gate_up
        self.norm_w = 1.0 + 0.2 * torch.randn(k, device="cuda", dtype=torch.bfloat16)
        self.out = torch.empty(n, device="cuda", dtype=torch.bfloat16)  # y, or the residual written
        self.out.normal_()

    def args(self, entry: str, w: torch.Tensor) -> list[tuple[str, Any]]:
        n, k = self.n, self.k
        if entry in ("kern_gemv_rmsnorm", "kern_gemv_rows_rmsnorm", SWIGLU):
            outputs = n // 2 if entry == SWIGLU else n  # SwiGLU: W is [gate; up], inter = n / 2 outputs
            return [("p", w.data_ptr()), ("p", self.vec_in.data_ptr()), ("p", self.norm_w.data_ptr()),
                    ("p", self.out.data_ptr()), ("i", outputs), ("i", k), ("f", EPS)]
        return [("p", w.data_ptr()), ("p", self.vec_in.data_ptr()), ("p", self.out.data_ptr()), ("i", n), ("i", k)]


def time_entry(kernels: dict[str, Any], entry: str, data: ShapeData, config: str, pdl: bool = False) -> float:
    if config == "rows":
        grid, block = rows_launch(entry, data.n, data.k)
    else:
        block, grid_rule = CONFIGS[config]
        grid = grid_rule(data.n, SMS)

    def one(w: torch.Tensor) -> Callable[[], None]:
        args = data.args(entry, w)
        return lambda: launch(kernels[entry], grid, block, smem_bytes(data.k), args, stream=current_stream(), pdl=pdl)

    return time_graph([one(w) for w in data.w])


def time_cublas(data: ShapeData) -> float:
    x = data.vec_in[: data.k].view(1, data.k)
    out = data.out.view(1, data.n)
    return time_graph([lambda w=w: torch.matmul(x, w.t(), out=out) for w in data.w])


def row(label: str, us: float, nbytes: int) -> dict[str, Any]:
    rate = nbytes / (us * 1e-6)
    return {"case": label, "us": round(us, 2), "GB/s": round(rate / 1e9, 1), "pct_4.3": round(100 * rate / COPY_RATE, 1)}


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{title}")
    print(f"{'case':58s} {'us':>9s} {'GB/s':>8s} {'% 4.3TB/s':>10s}")
    for r in rows:
        print(f"{r['case']:58s} {r['us']:9.2f} {r['GB/s']:8.1f} {r['pct_4.3']:10.1f}")


def step_chain(kernels: dict[str, Any]) -> list[dict[str, Any]]:
    """The decode step's 145 GEMVs, distinct weights, one graph: ours without / with PDL, and cuBLASLt."""
    def randw(n: int, k: int, scale: float) -> torch.Tensor:
        return torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * scale

    layers = [(randw(QKV, HIDDEN, 0.05), randw(HIDDEN, ATTN, 0.02), randw(2 * INTER, HIDDEN, 0.05), randw(HIDDEN, INTER, 0.01))
              for _ in range(LAYERS)]
    lm_head = randw(VOCAB, HIDDEN, 0.05)
    norm_w = 1.0 + 0.1 * torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    attn = torch.randn(ATTN, device="cuda", dtype=torch.bfloat16)
    qkv = torch.empty(QKV, device="cuda", dtype=torch.bfloat16)
    gate_up = torch.empty(2 * INTER, device="cuda", dtype=torch.bfloat16)
    logits = torch.empty(VOCAB, device="cuda", dtype=torch.bfloat16)
    total_bytes = sum(w.numel() * 2 for layer in layers for w in layer) + lm_head.numel() * 2
    block, grid_rule = CONFIGS[DEFAULT_CONFIG]

    def ours(pdl: bool) -> Callable[[], None]:
        def p(t: torch.Tensor) -> tuple[str, int]:
            return ("p", t.data_ptr())

        calls = []
        for w_qkv, w_o, w_gu, w_down in layers:
            calls += [
                ("kern_gemv_rmsnorm", QKV, HIDDEN, [p(w_qkv), p(residual), p(norm_w), p(qkv)]),
                ("kern_gemv_residual", HIDDEN, ATTN, [p(w_o), p(attn), p(residual)]),
                ("kern_gemv_rmsnorm", 2 * INTER, HIDDEN, [p(w_gu), p(residual), p(norm_w), p(gate_up)]),
                ("kern_gemv_silu_residual", HIDDEN, INTER, [p(w_down), p(gate_up), p(residual)]),
            ]
        calls.append(("kern_gemv_rmsnorm", VOCAB, HIDDEN, [p(lm_head), p(residual), p(norm_w), p(logits)]))

        def run() -> None:
            stream = current_stream()
            for entry, n, k, ptrs in calls:
                tail = [("i", n), ("i", k)] + ([("f", EPS)] if entry == "kern_gemv_rmsnorm" else [])
                launch(kernels[entry], grid_rule(n, SMS), block, smem_bytes(k), ptrs + tail, stream=stream, pdl=pdl)

        return run

    def cublas() -> None:
        for w_qkv, w_o, w_gu, w_down in layers:
            torch.matmul(residual.view(1, -1), w_qkv.t(), out=qkv.view(1, -1))
            torch.matmul(attn.view(1, -1), w_o.t(), out=residual.view(1, -1))
            torch.matmul(residual.view(1, -1), w_gu.t(), out=gate_up.view(1, -1))
            torch.matmul(gate_up[:INTER].view(1, -1), w_down.t(), out=residual.view(1, -1))
        torch.matmul(residual.view(1, -1), lm_head.t(), out=logits.view(1, -1))

    act = torch.empty(INTER, device="cuda", dtype=torch.bfloat16)

    def ours_v2(pdl: bool) -> Callable[[], None]:
        """gen_qwen3.py --gemv v2: rows_rmsnorm qkv, rows_residual o, rmsnorm_swiglu gate_up -> act,
        rows_residual down over act, lm_head kern_gemv_rmsnorm at the default launch."""
        def p(t: torch.Tensor) -> tuple[str, int]:
            return ("p", t.data_ptr())

        calls = []
        for w_qkv, w_o, w_gu, w_down in layers:
            calls += [
                ("kern_gemv_rows_rmsnorm", QKV, HIDDEN, QKV, [p(w_qkv), p(residual), p(norm_w), p(qkv)]),
                ("kern_gemv_rows_residual", HIDDEN, ATTN, HIDDEN, [p(w_o), p(attn), p(residual)]),
                (SWIGLU, 2 * INTER, HIDDEN, INTER, [p(w_gu), p(residual), p(norm_w), p(act)]),
                ("kern_gemv_rows_residual", HIDDEN, INTER, HIDDEN, [p(w_down), p(act), p(residual)]),
            ]

        def run() -> None:
            stream = current_stream()
            for entry, n_rows, k, n_arg, ptrs in calls:
                grid, blk = rows_launch(entry, n_rows, k)
                tail = [("i", n_arg), ("i", k)] + ([("f", EPS)] if entry != "kern_gemv_rows_residual" else [])
                launch(kernels[entry], grid, blk, smem_bytes(k), ptrs + tail, stream=stream, pdl=pdl)
            launch(kernels["kern_gemv_rmsnorm"], grid_rule(VOCAB, SMS), block, smem_bytes(HIDDEN),
                   [p(lm_head), p(residual), p(norm_w), p(logits), ("i", VOCAB), ("i", HIDDEN), ("f", EPS)],
                   stream=stream, pdl=pdl)

        return run

    rows = []
    chains = (("kern GEMVs, no PDL", ours(False)), ("kern GEMVs, PDL", ours(True)),
              ("kern GEMVs v2 (rows + swiglu), no PDL", ours_v2(False)), ("kern GEMVs v2 (rows + swiglu), PDL", ours_v2(True)),
              ("cuBLAS (torch.matmul), plain GEMMs", cublas))
    for label, fn in chains:
        try:
            us = time_graph([fn], reps=1)
        except Exception as exc:  # noqa: BLE001 - report and keep the other rows
            print(f"step chain {label}: failed: {exc}")
            continue
        rows.append(row(f"step {label} ({total_bytes / 1e9:.2f} GB)", us, total_bytes))
    rows.append(row("floor: bytes / 4.3 TB/s", total_bytes / COPY_RATE * 1e6, total_bytes))
    return rows


def main() -> int:
    global SMS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time launch shapes x KERN_GEMV_UNROLL variants")
    parser.add_argument("--no-step", action="store_true", help="skip the 8 GB step chain")
    parser.add_argument("--mma", action="store_true", help="only the crossover table of the small-M MMA entries, "
                        "the M = 1 GEMV and cuBLASLt at m = 1..64 (bench/gemv_mma.py)")
    parser.add_argument("--mma-variants", default=None, help="only the MMA variant table: the committed cubin and "
                        "the source compiled with each ;-separated set of -D flags, m = 1, 8, 64 (bench/gemv_mma.py)")
    parser.add_argument("--rows-m", action="store_true", help="only the table of the multi-row rows entries (_m2, "
                        "_m4, _m8), the M = 1 entry and cuBLASLt at m = 1, 2, 4, 8 (bench/gemv_rows_m.py)")
    opts = parser.parse_args()

    gpu = open_gpu()
    torch.cuda.init()
    SMS = sm_count(gpu)
    kernels, origin = gemv_kernels(gpu)
    props = torch.cuda.get_device_properties(0)
    measured_copy = copy_rate()
    print(f"device {props.name}, {SMS} SMs, L2 {props.L2_cache_size >> 20} MiB; gemv cubin: {origin}")
    print(f"device-to-device copy (read + write): {measured_copy / 1e9:.0f} GB/s (table % is of 4.3 TB/s)")
    results: dict[str, Any] = {"device": props.name, "sms": SMS, "copy_GBps": measured_copy / 1e9, "cubin": origin}
    if opts.mma:
        from bench.gemv_mma import crossover

        results["mma"] = crossover(kernels, SMS, time_graph, current_stream, m1_launch)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "gemv_mma_bench.json").write_text(json.dumps(results, indent=1))
        return 0

    if opts.mma_variants is not None:
        from bench.gemv_mma import variants

        sets = [tuple(d.split()) for d in opts.mma_variants.split(";") if d.strip()]
        results["mma_variants"] = variants(sets, SMS, time_graph, current_stream)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "gemv_mma_variants.json").write_text(json.dumps(results, indent=1))
        return 0

    if opts.rows_m:
        from bench.gemv_rows_m import rows_m_table

        results["rows_m"] = rows_m_table(kernels, SMS, time_graph, current_stream, m1_launch)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "gemv_rows_m_bench.json").write_text(json.dumps(results, indent=1))
        return 0

    rows = []
    for name, n, k, _ in SHAPES:
        data = ShapeData(n, k)
        rows.append(row(f"{name} {n}x{k} cuBLAS (torch.matmul)", time_cublas(data), entry_bytes("kern_gemv", n, k)))
        for entry in ENTRIES:
            us = time_entry(kernels, entry, data, DEFAULT_CONFIG)
            rows.append(row(f"{name} {n}x{k} {entry}", us, entry_bytes(entry, n, k)))
        for entry in ROWS_ENTRIES + ((SWIGLU,) if name == "gate_up" else ()):
            grid, block = rows_launch(entry, n, k)
            us = time_entry(kernels, entry, data, "rows")
            mark = " (v2)" if V2_ENTRY[name] == entry else ""
            rows.append(row(f"{name} {n}x{k} {entry} [{grid}x{block}]{mark}", us, entry_bytes(entry, n, k)))
        del data
        torch.cuda.empty_cache()
    results["entries"] = rows
    print_table(f"per launch, default launch ({DEFAULT_CONFIG}), graph of {REPS}, median of {REPLAYS}", rows)

    if opts.sweep:
        sweep = []
        variants = [("U=8 (default cubin)", kernels)]
        with tempfile.TemporaryDirectory() as tmp:
            for unroll in (4, 6):
                try:
                    image = compile_gemv(Path(tmp), (f"KERN_GEMV_UNROLL={unroll}",)).read_bytes()
                    variants.append((f"U={unroll}", kernels_from_cubin(image)))
                except Exception as exc:  # noqa: BLE001 - no nvcc: sweep launch shapes only
                    print(f"variant U={unroll} not built: {exc}")
        for name, n, k, entry in SHAPES:
            data = ShapeData(n, k)
            for label, variant in variants:
                for config in CONFIGS:
                    us = time_entry(variant, entry, data, config)
                    sweep.append(row(f"{name} {entry.removeprefix('kern_')} {label} {config}", us, entry_bytes(entry, n, k)))
            del data
            torch.cuda.empty_cache()
        results["sweep"] = sweep
        print_table("sweep: the step's entry per shape, unroll x launch shape", sweep)

    if not opts.no_step:
        step = step_chain(kernels)
        results["step"] = step
        print_table(f"decode step GEMVs: {LAYERS} layers x 4 + lm_head, one graph (median of {REPLAYS} replays)", step)
        print_table(f"per launch again, default launch ({DEFAULT_CONFIG})", rows)

    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gemv_bench.json").write_text(json.dumps(results, indent=1))
    return 0


SMS = 0

if __name__ == "__main__":
    raise SystemExit(main())
