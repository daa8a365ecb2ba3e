"""The crossover table of a batched decode's projections (`python bench/gemv.py --mma`): for each Qwen3-4B projection
and m = 1, 2, 4, 8, 16, 32, 64 token rows, the M = 1 GEMV (the `--gemv v2` entry: one launch serves one row), the
small-M MMA entry the builder wires for m (kernels-src/gemv_mma.cu, smallest tile >= m, the builder's grid and
cluster) and cuBLASLt (kern_runtime.cuda.blas, the heuristic's first algorithm, plain C = A W^T without the fused
norm / epilogue), in microseconds per launch and % of the weight floor (W bytes / 4.3 TB/s).

Timing as bench/gemv.py: REPS launches in one CUDA graph rotating over >= 256 MiB of weight copies (every launch
streams W from HBM), median of REPLAYS replays. Then the cluster-size sweep of the MMA entries at m = 8 and 64 (the
builder's choice is marked), with cuOccupancyMaxActiveClusters beside the builder's count of resident clusters.

`python bench/gemv.py --mma-variants "KERN_MMA_UNROLL=8;KERN_MMA_P=2"` instead times, for each shape at m = 1, 8
and 64, the committed cubin and the source compiled with each ;-separated set of -D flags (space-separated
within a set), on the builder's launch, beside cuBLASLt: an A/B of kernel variants in one process.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from kern_run.models.qwen3.mma import (MMA_TILES, SMEM_LIMIT, SMEM_RESERVED, dynamic_smem, mma_cluster, mma_geometry,
                                      resident_clusters, static_smem)

COPY_RATE = 4.3e12
ROTATE_BYTES = 256 << 20
EPS = 1e-6
M_VALUES = (1, 2, 4, 8, 16, 32, 64)
HIDDEN, INTER, QKV, ATTN, VOCAB = 2560, 9728, 6144, 4096, 151936
# (name, MMA kind, outputs per row (SwiGLU: inter), k, the M = 1 entry of --gemv v2)
SHAPES = [
    ("qkv", "rmsnorm", QKV, HIDDEN, "kern_gemv_rows_rmsnorm"),
    ("o", "residual", HIDDEN, ATTN, "kern_gemv_rows_residual"),
    ("gate_up", "rmsnorm_swiglu", INTER, HIDDEN, "kern_gemv_rmsnorm_swiglu"),
    ("down", "residual", HIDDEN, INTER, "kern_gemv_rows_residual"),
    ("lm_head", "rmsnorm", VOCAB, HIDDEN, "kern_gemv_rmsnorm"),
]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Data:
    """Weight copies [n_w, k] and 64 rows of inputs / outputs for one projection."""

    def __init__(self, kind: str, n_out: int, k: int):
        self.kind, self.n_out, self.k = kind, n_out, k
        self.n_w = 2 * n_out if kind == "rmsnorm_swiglu" else n_out
        copies = max(2, cdiv(ROTATE_BYTES, 2 * self.n_w * k))
        self.w = [torch.randn(self.n_w, k, device="cuda", dtype=torch.bfloat16) * 0.05 for _ in range(copies)]
        self.src = torch.randn(64, k, device="cuda", dtype=torch.bfloat16)
        self.norm_w = 1.0 + 0.2 * torch.randn(k, device="cuda", dtype=torch.bfloat16)
        self.out = torch.randn(64, self.n_w, device="cuda", dtype=torch.bfloat16)

    @property
    def weight_bytes(self) -> int:
        return 2 * self.n_w * self.k

    def mma_args(self, w: torch.Tensor, m: int) -> list[tuple[str, Any]]:
        if self.kind == "residual":
            return [("p", w.data_ptr()), ("p", self.src.data_ptr()), ("p", self.out.data_ptr()), ("i", m),
                    ("i", self.n_out), ("i", self.k)]
        return [("p", w.data_ptr()), ("p", self.src.data_ptr()), ("p", self.norm_w.data_ptr()), ("p", self.out.data_ptr()),
                ("i", m), ("i", self.n_out), ("i", self.k), ("f", EPS)]

    def gemv_args(self, w: torch.Tensor) -> list[tuple[str, Any]]:
        args = self.mma_args(w, 1)
        return args[:3] + args[4:] if self.kind == "residual" else args[:4] + args[5:]


def _row(us: float, nbytes: int) -> tuple[float, float]:
    return us, 100.0 * nbytes / (us * 1e-6) / COPY_RATE


def _time_mma(time_graph: Callable[..., float], stream: Callable[[], Any], kernel: Any, data: Data, shape: Any,
              m: int) -> float:
    """Median us of `kernel` (an MMA entry) at `shape` over m rows, one launch per weight copy of `data`."""
    from tests.kernels.gemv_mma_gpu_helpers import launch

    def one(w: torch.Tensor) -> Callable[[], None]:
        args = data.mma_args(w, m)
        return lambda: launch(kernel, shape, args, stream=stream())
    return time_graph([one(w) for w in data.w])


def _time_blas(time_graph: Callable[..., float], stream: Callable[[], Any], blas: Any, data: Data, m: int,
               where: str) -> float:
    """Median us of cuBLASLt's heuristic C = A W^T over m rows, one launch per weight copy of `data`."""
    from kern_runtime.cuda import gemm_call

    def one(w: torch.Tensor) -> Callable[[], None]:
        g = gemm_call("cublaslt_bf16_tn", (data.src.data_ptr(), w.data_ptr(), data.out.data_ptr(), m, data.n_w,
                                           data.k), where)
        return lambda: blas.matmul(g, int(stream()))
    return time_graph([one(w) for w in data.w])


def crossover(gemv_kernels: dict[str, Any], sms: int, time_graph: Callable[..., float], stream: Callable[[], Any],
              gemv_launch: Callable[[str, int, int], tuple[int, int]]) -> dict[str, Any]:
    """Print the crossover table and the cluster sweep; return them (JSON-ready). `time_graph(list of callables)`
    -> median us per launch; `stream()` the current CUstream; `gemv_launch(entry, n_w, k)` -> (grid, block) of the
    M = 1 entry (bench/gemv.py's rows_launch / default launch)."""
    from kern_runtime.cuda import WORKSPACE_BYTES, Blas
    from tests.kernels.gemv_gpu_helpers import launch as launch_gemv
    from tests.kernels.gemv_mma_gpu_helpers import MmaLaunch, max_active_clusters, mma_kernels
    from tests.kernels.gpu_helpers import open_gpu

    mma, origin = mma_kernels(open_gpu())
    print(f"\ngemv_mma cubin: {origin}")
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    blas = Blas(workspace.data_ptr())
    out: dict[str, Any] = {"cubin": origin, "crossover": [], "cluster_sweep": []}

    def time_mma(data: Data, entry: str, shape: Any, m: int) -> float:
        return _time_mma(time_graph, stream, mma[entry], data, shape, m)

    def time_gemv(data: Data, entry: str) -> float:
        grid, block = gemv_launch(entry, data.n_w, data.k)

        def one(w: torch.Tensor) -> Callable[[], None]:
            args = data.gemv_args(w)
            return lambda: launch_gemv(gemv_kernels[entry], grid, block, 16 * cdiv(data.k, 8), args, stream=stream())
        return time_graph([one(w) for w in data.w])

    def time_blas(data: Data, m: int, where: str) -> float:
        return _time_blas(time_graph, stream, blas, data, m, where)

    def crossover_rows(name: str, kind: str, n_out: int, k: int, gemv_entry: str) -> None:
        data = Data(kind, n_out, k)
        gemv_us = time_gemv(data, gemv_entry)
        geo = mma_geometry(n_out, k, sms, swiglu=kind == "rmsnorm_swiglu")
        for m in M_VALUES:
            tile = next(t for t in MMA_TILES if t >= m)
            entry = f"kern_mma_{kind}_m{tile}"
            mma_us = time_mma(data, entry, MmaLaunch(geo.grid, geo.cluster, geo.shared_mem(k, tile)), m)
            blas_us = time_blas(data, m, f"{name} m={m}")
            g1, g1p = _row(gemv_us, data.weight_bytes)
            mu, mp = _row(mma_us, data.weight_bytes)
            bu, bp = _row(blas_us, data.weight_bytes)
            label = f"{entry.removeprefix('kern_mma_')} [{geo.grid}/{geo.cluster}]"
            print(f"{name:8s} {m:3d} | {g1:11.2f} {g1p:6.1f} | {label:34s} {mu:8.2f} {mp:6.1f} | {bu:11.2f} {bp:6.1f}")
            out["crossover"].append({"shape": name, "m": m, "gemv_m1_us": round(g1, 2), "mma_entry": entry,
                                     "grid": geo.grid, "cluster": geo.cluster, "mma_us": round(mu, 2),
                                     "cublaslt_us": round(bu, 2),
                                     "floor_us": round(data.weight_bytes / COPY_RATE * 1e6, 2)})

    def sweep_rows(name: str, kind: str, n_out: int, k: int) -> None:
        data = Data(kind, n_out, k)
        tiles = cdiv(n_out, 8 if kind == "rmsnorm_swiglu" else 16)
        for m in (8, 64):
            entry = f"kern_mma_{kind}_m{m}"
            for cluster in (1, 2, 4, 8):
                smem = dynamic_smem(k, cluster, m)
                if smem + static_smem(m) + SMEM_RESERVED > SMEM_LIMIT:
                    continue
                resident = resident_clusters(cluster, sms)
                driver_count = max_active_clusters(mma[entry], MmaLaunch(cluster * resident, cluster, smem))
                shape = MmaLaunch(min(tiles, resident) * cluster, cluster, smem)
                u, p = _row(time_mma(data, entry, shape, m), data.weight_bytes)
                mark = "*" if cluster == mma_cluster(k) else " "
                print(f"{name:8s} {m:3d} {cluster:6d}{mark} {shape.grid:5d} {f'{driver_count} / {resident}':>28s} "
                      f"{u:8.2f} {p:6.1f}")
                out["cluster_sweep"].append({"shape": name, "m": m, "cluster": cluster, "grid": shape.grid,
                                             "driver_resident_clusters": driver_count, "us": round(u, 2)})

    print("\ncrossover: us per launch and % of the weight floor (W bytes / 4.3 TB/s)")
    print(f"{'shape':8s} {'m':>3s} | {'gemv M=1 us':>11s} {'%':>6s} | {'mma entry [grid/cluster]':34s} {'us':>8s} "
          f"{'%':>6s} | {'cuBLASLt us':>11s} {'%':>6s}")
    try:
        for name, kind, n_out, k, gemv_entry in SHAPES:
            crossover_rows(name, kind, n_out, k, gemv_entry)
            torch.cuda.empty_cache()
        print("\ncluster sweep of the MMA entries (clusters = min(tiles, resident)); * = the builder's cluster")
        print(f"{'shape':8s} {'m':>3s} {'cluster':>7s} {'grid':>5s} {'resident (driver / builder)':>28s} {'us':>8s} "
              f"{'%':>6s}")
        for name, kind, n_out, k, _ in SHAPES:
            sweep_rows(name, kind, n_out, k)
            torch.cuda.empty_cache()
    finally:
        blas.close()
    return out


VARIANT_MS = (1, 8, 64)


def variants(defines_sets: list[tuple[str, ...]], sms: int, time_graph: Callable[..., float],
             stream: Callable[[], Any]) -> list[dict[str, Any]]:
    """Print and return the variant table: per shape and m of VARIANT_MS, us (and % of the weight floor) of the
    committed cubin's entry and of each `defines_sets` compile, on the builder's launch, and cuBLASLt's."""
    from kern_runtime.cuda import WORKSPACE_BYTES, Blas
    from tests.kernels.gemv_mma_gpu_helpers import MmaLaunch, mma_kernels
    from tests.kernels.gpu_helpers import open_gpu

    gpu = open_gpu()
    sets = [("committed", mma_kernels(gpu)[0])] + [(" ".join(d), mma_kernels(gpu, d)[0]) for d in defines_sets]
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    blas = Blas(workspace.data_ptr())
    rows: list[dict[str, Any]] = []
    print("\nMMA variants: us per launch (% of the weight floor, W bytes / 4.3 TB/s), the builder's launch")
    print(f"{'shape':8s} {'m':>3s} " + " ".join(f"{label[:22]:>22s}" for label, _ in sets) + f" {'cuBLASLt':>14s}")
    try:
        for name, kind, n_out, k, _ in SHAPES:
            data = Data(kind, n_out, k)
            geo = mma_geometry(n_out, k, sms, swiglu=kind == "rmsnorm_swiglu")
            for m in VARIANT_MS:
                tile = next(t for t in MMA_TILES if t >= m)
                entry = f"kern_mma_{kind}_m{tile}"
                shape = MmaLaunch(geo.grid, geo.cluster, geo.shared_mem(k, tile))
                cells, times = [], {}
                for label, kernels in sets:
                    us = _time_mma(time_graph, stream, kernels[entry], data, shape, m)
                    times[label] = round(us, 2)
                    cells.append(f"{us:9.2f} ({_row(us, data.weight_bytes)[1]:5.1f}%)")
                blas_us = _time_blas(time_graph, stream, blas, data, m, f"{name} m={m}")
                print(f"{name:8s} {m:3d} " + " ".join(f"{c:>22s}" for c in cells) +
                      f" {blas_us:7.2f} ({_row(blas_us, data.weight_bytes)[1]:4.1f}%)")
                rows.append({"shape": name, "m": m, "warps_per_tile": geo.warps_per_tile(k), "us": times,
                             "cublaslt_us": round(blas_us, 2),
                             "floor_us": round(data.weight_bytes / COPY_RATE * 1e6, 2)})
            torch.cuda.empty_cache()
    finally:
        blas.close()
    return rows
