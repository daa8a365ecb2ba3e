"""The skinny wgmma GEMM (kernels-src/gemm_skinny.cu) against cuBLASLt at the Qwen3-4B decode projections, m = 1, 8,
32, 64 token rows: microseconds per launch and % of the weight floor (W bytes / 4.3 TB/s).

    python bench/gemm_skinny.py [--m 1,8,64] [--bn 128,256] [--blocks 132] [--defines "A;B"] [--json out.json]

Columns: the skinny entries (tile width bn, `--blocks` resident blocks, default the device's SM count as the
builder's grid on the H200; "pdl": launched with programmatic dependent launch, each launch's weight prologue
under the previous one's tail), the same source compiled here with each `--defines` set of -D flags (timing probes
such as SK_PROBE, unchecked), cuBLASLt's heuristic (plain C = A W^T) and, where manifests/algos/h200.json has one,
the invariant decode pin (`kern serve`'s decode today). gate_up runs twice: plain (c = [gate | up]) and swiglu
(c = act, the SiLU-mul fused; cuBLASLt's columns are then the plain GEMM, which still needs a kern_silu_mul launch
after it).

Timing as bench/gemv.py: REPS launches in one CUDA graph rotating over >= 256 MiB of weight copies (W streams from
HBM every launch), median of REPLAYS replays. Before timing, every committed entry's output is checked against an fp64
reference (max |err| / max |ref| < 1e-2) and for batch invariance (row r at m = 64 equals row r at m = 1 and 8 bit
for bit); a failure prints and exits 1. Results go to --json, else $OUT/bench-gemm-skinny.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from kern_run.models.qwen3.skinny import SKINNY_ENTRY, SKINNY_SMEM, SKINNY_THREADS, skinny_geometry

from bench.decode import write_json

if TYPE_CHECKING:
    import torch

    from tests.kernels.gpu_helpers import Kernel

# torch, cuda.bindings and the GPU helpers are imported where used, so `--help` and the argument checks work
# without them (torch is the GPU machine's, not a dependency of the workspace)

ROOT = Path(__file__).resolve().parents[1]
COPY_RATE = 4.3e12
ROTATE_BYTES = 256 << 20
HIDDEN, INTER, QKV, ATTN, VOCAB = 2560, 9728, 6144, 4096, 151936
# (name, n weight rows, k, swiglu)
SHAPES = [("qkv", QKV, HIDDEN, False), ("o", HIDDEN, ATTN, False), ("gate_up", 2 * INTER, HIDDEN, False),
          ("gate_up+silu", 2 * INTER, HIDDEN, True), ("down", HIDDEN, INTER, False), ("lm_head", VOCAB, HIDDEN, False)]


def probe_kernels(gpu, defines: str, work: Path) -> dict[str, Kernel]:
    """The skinny entries of gemm_skinny.cu compiled here with the build tool's flags and -D for each word."""
    return gpu.probe_kernels("gemm_skinny", defines.split(), list(SKINNY_ENTRY.values()), work)


class Data:
    """Weight copies [n, k], 64 rows of a, the output, a workspace and tickets for one projection."""

    def __init__(self, n: int, k: int, swiglu: bool, blocks: int):
        import torch

        self.n, self.k, self.swiglu = n, k, swiglu
        copies = max(2, -(-ROTATE_BYTES // (2 * n * k)))
        self.w = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05 for _ in range(copies)]
        self.a = torch.randn(64, k, device="cuda", dtype=torch.bfloat16)
        self.c = torch.zeros(64, n // 2 if swiglu else n, device="cuda", dtype=torch.bfloat16)
        self.c_full = torch.zeros(64, n, device="cuda", dtype=torch.bfloat16)
        geos = [skinny_geometry(n, k, blocks, swiglu, bn) for bn in SKINNY_SMEM]
        self.ws = torch.zeros(max(g.ws_bytes for g in geos) // 4, device="cuda", dtype=torch.float32)
        self.tickets = torch.zeros(max(g.tickets for g in geos), device="cuda", dtype=torch.int32)

    @property
    def weight_bytes(self) -> int:
        return 2 * self.n * self.k

    def reference(self, m: int) -> torch.Tensor:
        import torch

        ref = self.a[:m].double() @ self.w[0].double().T
        if not self.swiglu:
            return ref
        inter = self.n // 2
        g = ref[:, :inter].to(torch.bfloat16).float()
        u = ref[:, inter:].to(torch.bfloat16).float()
        return ((g / (1.0 + torch.exp(-g))).to(torch.bfloat16).float() * u).double()


def skinny_launch(kernel: Kernel, data: Data, w: torch.Tensor, m: int, blocks: int, bn: int,
                  pdl: bool = False) -> Callable[[], None]:
    """One launch as the builder lays it out; `pdl`: with programmatic dependent launch, so its weight prologue
    overlaps the previous launch's tail as in a decode step."""
    from bench.gemv import current_stream
    from tests.kernels.gemv_gpu_helpers import launch

    geo = skinny_geometry(data.n, data.k, blocks, data.swiglu, bn)
    args = [("p", data.a.data_ptr()), ("p", w.data_ptr()), ("p", data.c.data_ptr()), ("p", data.ws.data_ptr()),
            ("p", data.tickets.data_ptr()), ("i", m), ("i", data.n), ("i", data.k), ("i", int(data.swiglu))]
    return lambda: launch(kernel, geo.blocks, SKINNY_THREADS, geo.shared_mem, args, stream=current_stream(), pdl=pdl)


def blas_launch(blas: Any, data: Data, w: torch.Tensor, m: int, algo: dict | None) -> Callable[[], None]:
    """cuBLASLt's C = A W^T over m rows into the plain output (its heuristic, or the pinned `algo`)."""
    from kern_runtime.cuda import gemm_call

    from bench.gemv import current_stream

    g = gemm_call("cublaslt_bf16_tn", (data.a.data_ptr(), w.data_ptr(), data.c_full.data_ptr(), m, data.n, data.k),
                  f"{data.n}x{data.k} m={m}")
    return lambda: blas.matmul(g, int(current_stream()), algo)


def check_entry(label: str, kernel: Kernel, data: Data, blocks: int, bn: int) -> list[str]:
    """Values against the fp64 reference and row invariance across m = 1, 8, 64; the failures, worded."""
    import torch

    faults, rows = [], {}
    for m in (64, 8, 1):
        data.c.zero_()
        skinny_launch(kernel, data, data.w[0], m, blocks, bn)()
        torch.cuda.synchronize()
        rows[m] = data.c[:m].clone()
        if data.tickets.abs().sum().item():
            faults.append(f"{label} m={m}: tickets not back to zero")
        if data.c[m:].abs().sum().item():
            faults.append(f"{label} m={m}: rows past m written")
        ref = data.reference(m)
        err = (rows[m].double() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)
        if not err < 1e-2:
            faults.append(f"{label} m={m}: max rel err {err:.3e}")
    for m in (8, 1):
        if not torch.equal(rows[64][:m], rows[m]):
            faults.append(f"{label}: rows at m={m} differ from the same rows at m=64 (not batch-invariant)")
    return faults


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", default="1,8,32,64", help="comma list of token rows (1..64)")
    ap.add_argument("--bn", default="128,256", help="comma list of tile widths (128, 256)")
    ap.add_argument("--blocks", type=int, default=0, help="resident blocks (default: the device's SM count)")
    ap.add_argument("--defines", default="", help="semicolon list of -D sets for probe builds of gemm_skinny.cu")
    ap.add_argument("--only", default="", help="comma list of shape names (default all)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    items = [v.strip() for v in args.m.split(",") if v.strip()]
    ms = [int(v) for v in items if v.isdigit()]
    if not ms or len(ms) != len(items) or any(not 1 <= m <= 64 for m in ms):
        raise SystemExit(f"--m: {args.m!r} needs token rows in 1..64")
    unknown = sorted(set(filter(None, args.only.split(","))) - {name for name, *_ in SHAPES})
    if unknown:
        raise SystemExit(f"--only: unknown {unknown}; known: {', '.join(name for name, *_ in SHAPES)}")
    bns = [int(v) for v in args.bn.split(",") if v.strip().isdigit()]
    if not bns or len(bns) != len([v for v in args.bn.split(",") if v]) or set(bns) - set(SKINNY_SMEM):
        raise SystemExit(f"--bn: {args.bn!r} needs tile widths among {', '.join(map(str, sorted(SKINNY_SMEM)))}")
    import torch
    from cuda.bindings import driver as cu

    from bench.gemv import time_graph
    from tests.kernels.gpu_helpers import check, open_gpu

    gpu = open_gpu()
    device_sms = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                               gpu.device), "cuDeviceGetAttribute")
    if not 0 <= args.blocks <= device_sms:
        raise SystemExit(f"--blocks {args.blocks}: the kernel needs every block resident, at most {device_sms} "
                         "(this GPU's SMs)")
    sms = args.blocks or device_sms
    torch.cuda.init()
    from kern_runtime.cuda import WORKSPACE_BYTES, Blas

    pins = {(p["n"], p["k"]): p["algo"] for p in
            json.loads((ROOT / "manifests" / "algos" / "h200.json").read_text())["invariant_decode_pins"]}
    sets: list[tuple[str, dict[str, Kernel]]] = [("", {f"kern_gemm_skinny_n{bn}": gpu.kernel(f"kern_gemm_skinny_n{bn}")
                                                      for bn in (128, 256)})]
    with tempfile.TemporaryDirectory() as tmp:
        for defines in (d.strip() for d in args.defines.split(";")):
            if defines:
                sets.append((defines, probe_kernels(gpu, defines, Path(tmp))))
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    blas = Blas(workspace.data_ptr())
    results: list[dict[str, Any]] = []
    faults: list[str] = []
    only = set(filter(None, args.only.split(",")))
    try:
        for name, n, k, swiglu in SHAPES:
            if only and name not in only:
                continue
            data = Data(n, k, swiglu, sms)
            floor = data.weight_bytes / COPY_RATE * 1e6
            columns = [(f"n{bn}" + (f" [{d}]" if d else ""), kernels[f"kern_gemm_skinny_n{bn}"], bn)
                       for d, kernels in sets for bn in bns]
            for bn in bns:  # the committed entries (probe builds are timing only)
                faults += check_entry(f"{name} n{bn}", sets[0][1][f"kern_gemm_skinny_n{bn}"], data, sms, bn)
            for m in ms:
                rec: dict[str, Any] = {"shape": name, "n": n, "k": k, "m": m, "floor_us": round(floor, 2), "us": {}}
                for label, kernel, bn in columns:
                    rec["us"][label] = time_graph([skinny_launch(kernel, data, w, m, sms, bn) for w in data.w])
                for bn in bns:
                    kernel = sets[0][1][f"kern_gemm_skinny_n{bn}"]
                    rec["us"][f"n{bn} pdl"] = time_graph([skinny_launch(kernel, data, w, m, sms, bn, True)
                                                          for w in data.w])
                rec["us"]["cuBLASLt"] = time_graph([blas_launch(blas, data, w, m, None) for w in data.w])
                if (n, k) in pins:
                    rec["us"]["inv pin"] = time_graph([blas_launch(blas, data, w, m, pins[(n, k)]) for w in data.w])
                results.append(rec)
                print(json.dumps(rec), flush=True)
            data = None  # free this shape's weight copies before the next shape's
            torch.cuda.empty_cache()
    finally:
        blas.close()
    print(f"\n===== skinny GEMM vs cuBLASLt: us per launch (% of the weight floor at 4.3 TB/s), {sms} blocks")
    labels = list(dict.fromkeys(label for rec in results for label in rec["us"]))
    print(f"{'shape':13s} {'m':>3s} {'floor':>6s} | " + " | ".join(f"{lb[:20]:>20s}" for lb in labels))
    for rec in results:
        cells = [f"{rec['us'][lb]:7.2f} ({100 * rec['floor_us'] / rec['us'][lb]:5.1f}%)" if lb in rec["us"] else "-"
                 for lb in labels]
        print(f"{rec['shape']:13s} {rec['m']:3d} {rec['floor_us']:6.2f} | " + " | ".join(f"{c:>20s}" for c in cells))
    for f in faults:
        print(f"FAULT: {f}")
    write_json(args.json, "bench-gemm-skinny.json", {"results": results, "faults": faults, "blocks": sms})
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main())
