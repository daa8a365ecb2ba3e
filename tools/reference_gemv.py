"""numpy references for the M = 1 GEMV entries of kernels-src/gemv.cu (contract: docs/kernels-gemv.md).

Conventions and bf16 helpers are tools/reference_kernels.py's: bf16 values travel as float32 arrays
holding bf16-representable numbers, ``bf16_bits`` / ``from_bf16_bits`` convert to and from the uint16
device representation, rounding is round-to-nearest-even. The prologues reuse that file's references
(so a fused prologue is checked against the same function as the unfused kernel):

- RMSNorm prologue: ``reference_kernels.add_rmsnorm`` with delta = None:
  ``x = bf16(norm_w * bf16(r * rsqrt(mean(r^2) + eps)))``
- SiLU-and-mul prologue: ``reference_kernels.silu_mul``: ``x = bf16(bf16(silu(gate)) * up)``
- residual epilogue: ``residual = bf16(residual + bf16(W @ x))`` (float32 add, as the kernel and torch do)

Dot products are accumulated in float64.
"""

from __future__ import annotations

import numpy as np

from tools.reference_kernels import add_rmsnorm, bf16_bits, bf16_round, from_bf16_bits, silu_mul


def random_bf16_bits(rng: np.random.Generator, shape: tuple[int, int] | int, scale: float = 1.0) -> np.ndarray:
    """Normal(0, scale) rounded to bf16, as bits (uint16) of ``shape``; generated in row chunks so a
    [151936, 2560] weight needs ~0.3 GB of scratch rather than several GB."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    out = np.empty(shape, dtype=np.uint16)
    flat = out.reshape(shape[0], -1)
    for r0 in range(0, shape[0], 8192):
        block = rng.standard_normal(flat[r0 : r0 + 8192].shape, dtype=np.float32) * np.float32(scale)
        flat[r0 : r0 + 8192] = bf16_bits(block)
    return out


def rmsnorm_x(residual: np.ndarray, norm_w: np.ndarray, eps: float) -> np.ndarray:
    """The RMSNorm prologue: residual [k], norm_w [k] (bf16 values) -> x [k] (bf16 values, float32)."""
    return add_rmsnorm(residual[None, :], None, norm_w, eps)[1][0]


def silu_mul_x(gate_up: np.ndarray) -> np.ndarray:
    """The SiLU-and-mul prologue: gate_up [2k] = [gate: k][up: k] (bf16 values) -> x [k] (bf16 values)."""
    with np.errstate(over="ignore"):  # exp(-g) overflows to inf for g < -709: silu -> -0, as in fp32
        return silu_mul(gate_up[None, :])[0]


def gemv_f64(w: np.ndarray, x: np.ndarray, rows_per_chunk: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """(W @ x, |W| @ |x|), both [n] float64, for W [n, k] (bf16 bits as uint16, or bf16 values) and x [k]
    (bf16 values). The second is the scale of the float32 accumulation error, for error bounds."""
    n = w.shape[0]
    xf = np.asarray(x, dtype=np.float64)
    x_abs = np.abs(xf)
    dot = np.empty(n, dtype=np.float64)
    dot_abs = np.empty(n, dtype=np.float64)
    for r0 in range(0, n, rows_per_chunk):
        chunk = w[r0 : r0 + rows_per_chunk]
        wf = (from_bf16_bits(chunk) if chunk.dtype == np.uint16 else chunk).astype(np.float64)  # [rows, k]
        dot[r0 : r0 + rows_per_chunk] = wf @ xf
        dot_abs[r0 : r0 + rows_per_chunk] = np.abs(wf) @ x_abs
    return dot, dot_abs


def residual_add(residual: np.ndarray, projection: np.ndarray) -> np.ndarray:
    """bf16(residual + bf16(projection)): residual [n] (bf16 values), projection [n] (any float, rounded to
    bf16 first) -> [n] bf16 values (float32). The add is a float32 add, as in the kernel."""
    p = bf16_round(np.asarray(projection, dtype=np.float64).astype(np.float32))
    return bf16_round(np.asarray(residual, dtype=np.float32) + p)


def swiglu_act(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """kern_gemv_rmsnorm_swiglu's epilogue: gate, up [inter] (any float: the fp32 GEMV sums) ->
    act = bf16(bf16(silu(bf16(gate))) * bf16(up)) [inter] (bf16 values, float32), i.e. the gate and up
    projections rounded to bf16 as the GEMM outputs they replace, then reference_kernels.silu_mul."""
    g = bf16_round(np.asarray(gate, dtype=np.float64).astype(np.float32))
    u = bf16_round(np.asarray(up, dtype=np.float64).astype(np.float32))
    return silu_mul_x(np.concatenate([g, u]))


def rmsnorm_swiglu(w_gate_up: np.ndarray, residual: np.ndarray, norm_w: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reference of kern_gemv_rmsnorm_swiglu: w_gate_up [2 inter, k] (bits or values), residual / norm_w [k]
    -> (act [inter] bf16 values, dot [2 inter] float64 (gate then up), dot_abs [2 inter])."""
    x = rmsnorm_x(residual, norm_w, eps)
    dot, dot_abs = gemv_f64(w_gate_up, x)
    inter = w_gate_up.shape[0] // 2
    return swiglu_act(dot[:inter], dot[inter:]), dot, dot_abs
