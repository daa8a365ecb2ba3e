"""The multi-row rows-family table of bench/gemv.py --rows-m (kernels-src/gemv.cu "Multi-row rows family"): for the
Qwen3-4B projections (qkv, gate_up + SwiGLU, o, down) and m = 1, 2, 4, 8 input rows: the M = 1 entry (one launch:
one row), the `_mN` entry at the launch `batch_proj` "rows" builds (N = the smallest tile >= m; kern_run.models.qwen3
.rows_m), and cuBLASLt (cublaslt_bf16_tn, the GEMM alone: no RMSNorm / SwiGLU launch) at m rows; microseconds per
launch and % of the weight floor (W bytes / 4.3 TB/s). Timing as bench/gemv.py (graphs over >= 256 MiB of weight
copies)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from bench.gemv_mma import Data

COPY_RATE = 4.3e12
EPS = 1e-6
M_VALUES = (1, 2, 4, 8)
HIDDEN, INTER, QKV, ATTN = 2560, 9728, 6144, 4096
# (name, kind, outputs per row (swiglu: inter), k, the M = 1 entry)
PROJECTIONS = (
    ("qkv", "rmsnorm", QKV, HIDDEN, "kern_gemv_rows_rmsnorm"),
    ("gate_up", "rmsnorm_swiglu", INTER, HIDDEN, "kern_gemv_rmsnorm_swiglu"),
    ("o", "residual", HIDDEN, ATTN, "kern_gemv_rows_residual"),
    ("down", "residual", HIDDEN, INTER, "kern_gemv_rows_residual"),
)


def _args(data: Data, w: torch.Tensor, n_out: int, m: int | None) -> list[tuple[str, Any]]:
    """The M = 1 entry's args (m None) or the _mN entry's (the same, then m)."""
    if data.kind == "residual":
        args = [("p", w.data_ptr()), ("p", data.src.data_ptr()), ("p", data.out.data_ptr()), ("i", n_out),
                ("i", data.k)]
    else:
        args = [("p", w.data_ptr()), ("p", data.src.data_ptr()), ("p", data.norm_w.data_ptr()),
                ("p", data.out.data_ptr()), ("i", n_out), ("i", data.k), ("f", EPS)]
    return args if m is None else args + [("i", m)]


def rows_m_table(kernels: dict[str, Any], sms: int, time_graph: Callable[..., float], stream: Callable[[], Any],
                 m1_launch: Callable[[str, int, int], tuple[int, int]]) -> list[dict[str, Any]]:
    """Print the table and return its rows (JSON-ready). `m1_launch(entry, n_w, k)` -> (grid, block) of the M = 1
    entry (bench/gemv.py rows_launch)."""
    from kern_run.models.qwen3 import rows_m
    from kern_runtime.cuda import WORKSPACE_BYTES, Blas, gemm_call
    from tests.kernels.gemv_gpu_helpers import launch

    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    blas = Blas(workspace.data_ptr())
    out = []
    print(f"\n{'shape':8s} {'m':>3s} | {'M=1 entry us':>12s} {'%fl':>6s} | {'_mN entry [grid x block]':40s} {'us':>8s} "
          f"{'%fl':>6s} | {'cuBLASLt us':>11s} {'%fl':>6s}")
    for name, kind, n_out, k, m1 in PROJECTIONS:
        data = Data(kind, n_out, k)
        floor = data.weight_bytes / COPY_RATE * 1e6
        grid1, block = m1_launch(m1, data.n_w, k)
        k8 = -(-k // 8)

        def one_m1(w: torch.Tensor) -> Callable[[], None]:
            args = _args(data, w, n_out, None)
            return lambda: launch(kernels[m1], grid1, block, 16 * k8, args, stream=stream())

        m1_us = time_graph([one_m1(w) for w in data.w])
        for m in M_VALUES:
            tile = next(t for t in rows_m.ROWS_TILES if t >= m)
            entry = f"{m1}_m{tile}"
            per_block = tile * 16 * k8 + rows_m.static_smem(kind, tile) + rows_m.SMEM_RESERVED
            per_sm = max(1, min(rows_m.THREADS_PER_SM_M[tile] // block, rows_m.SMEM_PER_SM // per_block))
            grid = min(-(-n_out // (2 if kind == "rmsnorm_swiglu" else 4)), per_sm * sms)

            def one_m(w: torch.Tensor) -> Callable[[], None]:
                args = _args(data, w, n_out, m)
                return lambda: launch(kernels[entry], grid, block, tile * 16 * k8, args, stream=stream())

            def one_blas(w: torch.Tensor) -> Callable[[], None]:
                g = gemm_call("cublaslt_bf16_tn", (data.src.data_ptr(), w.data_ptr(), data.out.data_ptr(), m,
                                                   data.n_w, k), f"{name} m={m}")
                return lambda: blas.matmul(g, int(stream()))

            m_us = time_graph([one_m(w) for w in data.w])
            blas_us = time_graph([one_blas(w) for w in data.w])
            label = f"{entry.removeprefix('kern_gemv_')} [{grid}x{block}]"
            print(f"{name:8s} {m:3d} | {m1_us:12.2f} {100 * floor / m1_us:6.1f} | {label:40s} {m_us:8.2f} "
                  f"{100 * floor / m_us:6.1f} | {blas_us:11.2f} {100 * floor / blas_us:6.1f}")
            out.append({"shape": name, "m": m, "m1_entry": m1, "m1_us": round(m1_us, 2), "entry": entry, "grid": grid,
                        "block": block, "entry_us": round(m_us, 2), "cublaslt_us": round(blas_us, 2),
                        "floor_us": round(floor, 2)})
        torch.cuda.empty_cache()  # the previous shape's copies go when `data` is rebound
    return out
