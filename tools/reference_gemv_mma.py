"""numpy references for the small-M MMA projections of kernels-src/gemv_mma.cu (docs/kernels-gemv.md "Small-M MMA
entries"): the M = 1 references of tools/reference_gemv.py applied to each of m token rows.

Conventions as there (bf16 values as float32 arrays, ``bf16_bits`` / ``from_bf16_bits`` for the uint16 device form,
round to nearest even). Dot products are accumulated in float64.

- ``rmsnorm_rows``: x[i] = bf16(norm_w * bf16(r_i * rsqrt(mean(r_i^2) + eps))) per row (reference_kernels.add_rmsnorm);
- ``gemm_f64``: (X @ W^T, |X| @ |W|^T), [m, n] float64, for the value and its accumulation-error scale;
- ``near_tie_x``: |x| where a row's RMSNorm element lies within a hair of a bf16 rounding midpoint (the kernel's fp32
  1 / rms may round it the other way), 0 elsewhere;
- ``swiglu_rows``: act = bf16(bf16(silu(bf16(gate))) * bf16(up)) of the float gate / up sums;
- ``expected_and_bound``: each output's float64 value and the bound the kernel's output must lie within.
"""

from __future__ import annotations

import numpy as np

from tools.reference_gemv import residual_add
from tools.reference_kernels import add_rmsnorm, bf16_round, from_bf16_bits, silu_mul

__all__ = ["expected_and_bound", "gemm_f64", "near_tie_x", "residual_add", "rmsnorm_rows", "swiglu_rows"]


def rmsnorm_rows(residual: np.ndarray, norm_w: np.ndarray, eps: float) -> np.ndarray:
    """residual [m, k], norm_w [k] (bf16 values) -> x [m, k] (bf16 values, float32)."""
    return add_rmsnorm(np.asarray(residual, dtype=np.float32), None, norm_w, eps)[1]


def near_tie_x(residual: np.ndarray, x: np.ndarray, eps: float) -> np.ndarray:
    """[m, k]: |x| where r * (1 / rms) rounds differently under a 2^-16 relative perturbation (above the fp32
    1 / rms's error), else 0 (tests/kernels/test_gemv_gpu.py Case.x_tie, per row)."""
    r = np.asarray(residual, dtype=np.float64)
    inner = r / np.sqrt(np.mean(r * r, axis=1, keepdims=True) + eps)
    lo, hi = (bf16_round((inner * (1 + d)).astype(np.float32)) for d in (-(2.0**-16), 2.0**-16))
    return np.where(lo != hi, np.abs(x), 0.0)


def gemm_f64(w: np.ndarray, x: np.ndarray, rows_per_chunk: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """(X @ W^T, |X| @ |W|^T), both [m, n] float64, for W [n, k] (bf16 bits as uint16, or values) and X [m, k]
    (bf16 values); W converted in row chunks (a [151936, 2560] W needs ~0.2 GB at a time)."""
    n = w.shape[0]
    xf = np.asarray(x, dtype=np.float64)
    x_abs = np.abs(xf)
    dot = np.empty((xf.shape[0], n), dtype=np.float64)
    dot_abs = np.empty_like(dot)
    for r0 in range(0, n, rows_per_chunk):
        chunk = w[r0 : r0 + rows_per_chunk]
        wf = (from_bf16_bits(chunk) if chunk.dtype == np.uint16 else chunk).astype(np.float64)
        dot[:, r0 : r0 + rows_per_chunk] = xf @ wf.T
        dot_abs[:, r0 : r0 + rows_per_chunk] = x_abs @ np.abs(wf).T
    return dot, dot_abs


def swiglu_rows(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gate, up [m, inter] (any float: the fp32 sums) -> act [m, inter] (bf16 values, float32): the sums rounded to
    bf16 (as the GEMM outputs they replace), then reference_kernels.silu_mul (reference_gemv.swiglu_act per row)."""
    g = bf16_round(np.asarray(gate, dtype=np.float64).astype(np.float32))
    u = bf16_round(np.asarray(up, dtype=np.float64).astype(np.float32))
    with np.errstate(over="ignore"):  # exp(-g) overflows for g < -709: silu -> -0, as in fp32
        return silu_mul(np.concatenate([g, u], axis=1))


def expected_and_bound(kind: str, dot: np.ndarray, dot_abs: np.ndarray, tie_abs: np.ndarray,
                       residual: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(the float64 value each output should have, the bound on |output - value|), [m, n_out], for `kind`
    ("rmsnorm", "residual", "rmsnorm_swiglu") from the reference dot products [m, n_w] (SwiGLU: gate then up),
    their |W| |x| scales, the near-tie scales (tie_abs, zeros for `residual`) and the input residual [m, n_out].
    The bounds (docs/kernels-gemv.md "Small-M MMA entries", as for the M = 1 entries): the bf16 output rounding
    2^-8 |value|, fp32 accumulation 2^-14 |W| |x|, a near-tie x element 2^-7 of its |W x|; residual: two roundings
    and twice the accumulation; SwiGLU: both projections' errors through silu (1.1-Lipschitz) and the product, plus
    the roundings of silu and of the product."""
    if kind == "rmsnorm_swiglu":
        inter = dot.shape[1] // 2
        g, u = dot[:, :inter], dot[:, inter:]
        dg = 2.0**-8 * 1.01 * np.abs(g) + 2.0**-14 * dot_abs[:, :inter] + 2.0**-7 * tie_abs[:, :inter]
        du = 2.0**-8 * 1.01 * np.abs(u) + 2.0**-14 * dot_abs[:, inter:] + 2.0**-7 * tie_abs[:, inter:]
        with np.errstate(over="ignore"):
            silu = g / (1.0 + np.exp(-g))
        bound = (1.1 * dg * (np.abs(u) + du) + np.abs(silu) * du
                 + 2.0**-7 * 1.01 * (np.abs(silu) + 1.1 * dg) * (np.abs(u) + du))
        return silu * u, bound
    if kind == "residual":
        want = np.asarray(residual, dtype=np.float64) + dot
        return want, 2.0**-8 * 1.01 * (np.abs(want) + np.abs(dot)) + 2.0**-13 * dot_abs
    return dot, 2.0**-8 * np.abs(dot) + 2.0**-14 * dot_abs + 2.0**-7 * tie_abs
