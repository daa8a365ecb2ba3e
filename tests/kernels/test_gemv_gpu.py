"""GPU tests of the M = 1 GEMV entries (kernels-src/gemv.cu, contract docs/kernels-gemv.md) against
tools/reference_gemv.py, launched from the built cubin through cuda.bindings.driver.

Every case draws fresh random inputs and poisons outputs (0xFF bytes: bf16 NaN) before the launch; every
device buffer has guard regions checked after the test (an out-of-bounds write fails). Checks:
(a) ||y - ref|| / ||ref|| < 1e-2 against a float64 reference; (b) per element, |y - ref| within the bf16
rounding of the output (2^-8 |ref|) plus a float32-accumulation allowance of 2^-14 sum_j |W_ij x_j|;
(c) the residual epilogue exactly: out == bf16(r + p) bit for bit, p the projection the same kernel writes
when the residual is zero (bf16(0 + p) = p).
Run on the GPU machine:  KERN_REQUIRE_GPU=1 python -m pytest tests/kernels/test_gemv_gpu.py -q
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


from tools import reference_gemv as ref  # noqa: E402
from tools.reference_kernels import bf16_bits, bf16_round, from_bf16_bits  # noqa: E402

EPS = 1e-6
NAN_BITS = 0xFFFF  # what DeviceBuffer.poison() leaves in a bf16
ENTRIES = ("kern_gemv", "kern_gemv_rmsnorm", "kern_gemv_residual", "kern_gemv_silu_residual")
RESIDUAL_ENTRIES = ("kern_gemv_residual", "kern_gemv_silu_residual")

# Qwen3-4B projections at bs = 1 (and the 14B / 32B ones), (n, k): W is [n, k] row-major as in the checkpoint.
MODEL_SHAPES = {
    "qkv": (6144, 2560),
    "o": (2560, 4096),
    "gate_up": (19456, 2560),
    "down": (2560, 9728),
    "lm_head": (151936, 2560),
    # the widest published sizes (kern run --weights): Qwen3-14B qkv and gate_up, Qwen3-32B o and down
    "qkv_14b": (7168, 5120),
    "gate_up_14b": (34816, 5120),
    "o_32b": (5120, 8192),
    "down_32b": (5120, 25600),
}


@dataclass(frozen=True)
class Launch:
    grid: int
    block: int
    smem_bytes: int


def default_launch(n: int, k: int, sms: int) -> Launch:
    """docs/kernels-gemv.md: block 512, grid min(n, 2 * SMs), dynamic shared memory 16 * ceil(k / 8)."""
    return Launch(grid=min(n, 2 * sms), block=512, smem_bytes=16 * (-(-k // 8)))


def run(kernel: Any, launch: Launch, args: list[tuple[str, Any]], stream: Any = 0, pdl: bool = False) -> None:
    from tests.kernels.gemv_gpu_helpers import launch as launch_kernel

    launch_kernel(kernel, launch.grid, launch.block, launch.smem_bytes, args, stream=stream, pdl=pdl)


def sync(what: str) -> None:
    """cuCtxSynchronize, raising with `what` if a launch faulted."""
    from cuda.bindings import driver as cu
    from tests.kernels.gpu_helpers import check

    check(cu.cuCtxSynchronize(), f"cuCtxSynchronize after {what}")


class Case:
    """One entry's inputs (host: bf16 values / W bits; device buffers), its float64 reference, and runs."""

    def __init__(self, dev: Any, rng: np.random.Generator, entry: str, n: int, k: int, w_bits: np.ndarray | None = None):
        self.dev, self.entry, self.n, self.k = dev, entry, n, k
        self.w_bits = ref.random_bf16_bits(rng, (n, k), 0.05) if w_bits is None else w_bits  # [n, k]
        self.w = dev.alloc(self.w_bits.nbytes)
        self.w.upload(self.w_bits)
        self.x_tie: np.ndarray | None = None  # |x_i| where x_i may round either way (RMSNorm prologue)
        if entry in ("kern_gemv", "kern_gemv_residual"):
            self.src = bf16_round(rng.standard_normal(k, dtype=np.float32))  # x [k]
            self.x = self.src
        elif entry == "kern_gemv_rmsnorm":
            self.src = bf16_round(3.0 * rng.standard_normal(k, dtype=np.float32))  # residual [k]
            self.norm_w = bf16_round(1.0 + 0.2 * rng.standard_normal(k, dtype=np.float32))
            self.norm_w_dev = dev.array(bf16_bits(self.norm_w))
            self.x = ref.rmsnorm_x(self.src, self.norm_w, EPS)
            # x = bf16(w * bf16(r * s)), s = 1 / rms. The kernel's fp32 s differs from the float64 reference's in
            # the last bits, so an r * s lying within a hair of a bf16 rounding midpoint may round the other way
            # there: one ulp of that x element, times its weight column. Mark those elements (perturbing r * s
            # by 2^-16 relative, above the fp32 s's error, changes its rounding); check() widens their rows' bound.
            r = self.src.astype(np.float64)
            inner = r / np.sqrt(np.mean(r * r) + EPS)
            lo, hi = (bf16_round((inner * (1 + d)).astype(np.float32)) for d in (-(2.0**-16), 2.0**-16))
            self.x_tie = np.where(lo != hi, np.abs(self.x), 0.0)
        else:
            self.src = bf16_round(2.0 * rng.standard_normal(2 * k, dtype=np.float32))  # gate_up [2k]
            self.x = ref.silu_mul_x(self.src)
        self.src_dev = dev.array(bf16_bits(self.src))
        self.writes_residual = entry in RESIDUAL_ENTRIES
        self.residual = bf16_round(rng.standard_normal(n, dtype=np.float32)) if self.writes_residual else None
        self.out = dev.alloc(2 * n)  # y [n], or the residual [n] (read and written)
        self.dot, self.dot_abs = ref.gemv_f64(self.w_bits, self.x)
        # sum over near-tie x elements of |W_ji| |x_i| (0 for the other prologues): a flip moves y_j by <= 2^-7 of it
        self.tie_abs = ref.gemv_f64(self.w_bits, self.x_tie)[1] if self.x_tie is not None else np.zeros(n)

    def args(self, w_ptr: int | None = None) -> list[tuple[str, Any]]:
        w_ptr = self.w.ptr if w_ptr is None else w_ptr
        if self.entry == "kern_gemv_rmsnorm":
            return [("p", w_ptr), ("p", self.src_dev.ptr), ("p", self.norm_w_dev.ptr), ("p", self.out.ptr),
                    ("i", self.n), ("i", self.k), ("f", EPS)]
        return [("p", w_ptr), ("p", self.src_dev.ptr), ("p", self.out.ptr), ("i", self.n), ("i", self.k)]

    def run(self, kernel: Any, launch: Launch, residual: np.ndarray | None = None, w_ptr: int | None = None) -> np.ndarray:
        """Poison / set the output, launch once, sync -> out [n] bf16 bits."""
        if self.writes_residual:
            self.out.upload(bf16_bits(self.residual if residual is None else residual))
        else:
            self.out.poison()
        run(kernel, launch, self.args(w_ptr))
        sync(self.entry)
        return self.out.download(np.uint16, self.n)

    def check(self, out: np.ndarray) -> None:
        """out [n] bits vs the float64 reference (module docstring (a), (b))."""
        y = from_bf16_bits(out).astype(np.float64)
        bad_nan = np.flatnonzero(~np.isfinite(y))
        assert bad_nan.size == 0, f"{self.entry} n={self.n} k={self.k}: non-finite (unwritten?) rows {bad_nan[:8].tolist()}"
        if self.writes_residual:
            r = self.residual.astype(np.float64)
            want = r + self.dot
            # bf16(dot) then bf16(r + p): two roundings of 2^-8 relative, plus the accumulation error twice
            bound = 2.0**-8 * 1.01 * (np.abs(want) + np.abs(self.dot)) + 2.0**-13 * self.dot_abs + 2.0**-7 * self.tie_abs
        else:
            want = self.dot
            bound = 2.0**-8 * np.abs(want) + 2.0**-14 * self.dot_abs + 2.0**-7 * self.tie_abs
        rel = np.linalg.norm(y - want) / max(np.linalg.norm(want), 1e-30)
        assert rel < 1e-2, f"{self.entry} n={self.n} k={self.k}: relative error {rel:.3g}"
        bad = np.flatnonzero(np.abs(y - want) > bound + 1e-30)
        assert bad.size == 0, (
            f"{self.entry} n={self.n} k={self.k}: {bad.size} rows outside the bf16 bound, first {bad[:8].tolist()}: "
            f"got {y[bad[:4]].tolist()} want {want[bad[:4]].tolist()}"
        )

    def check_epilogue_exact(self, kernel: Any, launch: Launch, out: np.ndarray) -> None:
        """Residual entries: out == bf16(r + p) bit for bit, p = the kernel's projection (zero residual)."""
        p = from_bf16_bits(self.run(kernel, launch, residual=np.zeros(self.n, dtype=np.float32)))
        want = bf16_bits(ref.residual_add(self.residual, p))
        mismatch = np.flatnonzero(out != want)
        assert mismatch.size == 0, f"{self.entry}: residual != bf16(r + bf16(W.x)) at rows {mismatch[:8].tolist()}"


# ---- the five model shapes, every entry at every shape (W drawn once per shape) ----
_W_CACHE: dict[tuple[int, int], np.ndarray] = {}


def _model_weight(n: int, k: int) -> np.ndarray:
    if (n, k) not in _W_CACHE:
        _W_CACHE.clear()  # one shape's W at a time (lm_head's is 778 MB)
        _W_CACHE[(n, k)] = ref.random_bf16_bits(np.random.default_rng(), (n, k), 0.05)
    return _W_CACHE[(n, k)]


MODEL_CASES = [(shape, entry) for shape in MODEL_SHAPES for entry in ENTRIES]


@pytest.mark.parametrize(("shape", "entry"), MODEL_CASES, ids=[f"{s}-{e}" for s, e in MODEL_CASES])
def test_model_shapes(dev, kernels, sms, shape: str, entry: str) -> None:
    n, k = MODEL_SHAPES[shape]
    case = Case(dev, np.random.default_rng(), entry, n, k, w_bits=_model_weight(n, k))
    launch = default_launch(n, k, sms)
    out = case.run(kernels[entry], launch)
    case.check(out)
    if case.writes_residual:
        case.check_epilogue_exact(kernels[entry], launch, out)


# ---- small and odd shapes on the vector path (k % 8 == 0) ----
SMALL_SHAPES = [(1, 8), (37, 8), (1, 16384), (37, 16384), (1000, 24), (5, 2560), (333, 520), (1031, 4096)]


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(("n", "k"), SMALL_SHAPES)
def test_small_shapes(dev, kernels, sms, entry: str, n: int, k: int) -> None:
    case = Case(dev, np.random.default_rng(), entry, n, k)
    launch = default_launch(n, k, sms)
    out = case.run(kernels[entry], launch)
    case.check(out)
    if case.writes_residual:
        case.check_epilogue_exact(kernels[entry], launch, out)


# ---- the element-by-element path: k % 8 != 0, or W not 16-byte aligned ----
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(("n", "k"), [(1, 1), (7, 7), (129, 100), (64, 1001)])
def test_k_not_multiple_of_8(dev, kernels, sms, entry: str, n: int, k: int) -> None:
    case = Case(dev, np.random.default_rng(), entry, n, k)
    case.check(case.run(kernels[entry], default_launch(n, k, sms)))


@pytest.mark.parametrize("entry", ENTRIES)
def test_unaligned_weight_pointer(dev, kernels, sms, entry: str) -> None:
    from cuda.bindings import driver as cu
    from tests.kernels.gpu_helpers import check

    n, k = 300, 2560
    case = Case(dev, np.random.default_rng(), entry, n, k)
    shifted = dev.alloc(case.w_bits.nbytes + 2)  # W starts 2 bytes in: not 16-byte aligned
    check(cu.cuMemcpyHtoD(shifted.ptr + 2, case.w_bits, case.w_bits.nbytes), "cuMemcpyHtoD")
    case.check(case.run(kernels[entry], default_launch(n, k, sms), w_ptr=shifted.ptr + 2))


# ---- launch shapes: any grid, any whole number of warps per block ----
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(
    ("block", "grid_rule"),
    [(32, "one"), (64, "seven"), (256, "row_per_warp"), (256, "sm4"), (1024, "sm1"), (512, "sm2")],
)
def test_launch_shapes(dev, kernels, sms, entry: str, block: int, grid_rule: str) -> None:
    n, k = 2600, 4096  # n a multiple of neither a block's warp count nor the SM count
    grid = {"one": 1, "seven": 7, "row_per_warp": -(-n // (block // 32)), "sm4": 4 * sms, "sm1": sms, "sm2": 2 * sms}
    case = Case(dev, np.random.default_rng(), entry, n, k)
    out = case.run(kernels[entry], Launch(grid=grid[grid_rule], block=block, smem_bytes=16 * k // 8))
    case.check(out)


# ---- guards: too little dynamic shared memory, or a partial warp: nothing read or written ----
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("bad", ["short_smem", "partial_warp"])
def test_bad_launch_writes_nothing(dev, kernels, entry: str, bad: str) -> None:
    n, k = 64, 2560
    case = Case(dev, np.random.default_rng(), entry, n, k)
    if bad == "short_smem":
        launch = Launch(grid=8, block=96, smem_bytes=16 * k // 8 - 16)
    else:
        launch = Launch(grid=8, block=100, smem_bytes=16 * k // 8)
    out = case.run(kernels[entry], launch)
    want = bf16_bits(case.residual) if case.writes_residual else np.full(n, NAN_BITS, dtype=np.uint16)
    assert np.array_equal(out, want), f"{entry}: a {bad} launch wrote its output"


# ---- fused RMSNorm == kern_add_rmsnorm (delta = null) then kern_gemv ----
def test_rmsnorm_prologue_matches_norm_kernel(dev, kernels, sms) -> None:
    if "norm" not in dev.meta["modules"]:
        pytest.skip("module norm not in kernels/kernels.json")
    n, k = MODEL_SHAPES["qkv"]
    case = Case(dev, np.random.default_rng(), "kern_gemv_rmsnorm", n, k)
    launch = default_launch(n, k, sms)
    fused = from_bf16_bits(case.run(kernels["kern_gemv_rmsnorm"], launch)).astype(np.float64)
    residual_copy = dev.array(bf16_bits(case.src))
    x = dev.alloc(2 * k)
    x.poison()
    norm_args = [("p", residual_copy.ptr), ("p", 0), ("p", case.norm_w_dev.ptr), ("p", x.ptr), ("i", 1), ("i", k), ("f", EPS)]
    dev.kernel("kern_add_rmsnorm").launch((1,), (256,), norm_args)
    y = dev.alloc(2 * n)
    y.poison()
    run(kernels["kern_gemv"], launch, [("p", case.w.ptr), ("p", x.ptr), ("p", y.ptr), ("i", n), ("i", k)])
    sync("kern_gemv")
    composed = from_bf16_bits(y.download(np.uint16, n)).astype(np.float64)
    # x can differ in a rare element by one bf16 ulp (sum-of-squares order), and then y by one bf16 ulp
    # (<= 2^-7 relative): allow two
    bound = 2.0**-6 * np.abs(composed) + 2.0**-14 * case.dot_abs
    bad = np.flatnonzero(np.abs(fused - composed) > bound)
    assert bad.size == 0, f"fused RMSNorm GEMV != kern_add_rmsnorm + kern_gemv at rows {bad[:8].tolist()}"


def layer_inputs(dev: Any, hidden: int, inter: int, qkv_n: int, attn_k: int) -> tuple[Any, ...]:
    """One decoder layer's GEMV inputs, random (unseeded), as bf16 bits: on `dev` the weights w_qkv [qkv_n, hidden],
    w_o [hidden, attn_k], w_gu [2 * inter, hidden], w_down [hidden, inter] and the norm weight [hidden]; on the
    host the residual [hidden] (uint16); on `dev` the attention output [attn_k]. In that order."""
    rng = np.random.default_rng()

    def weight(n: int, k: int, scale: float):
        return dev.array(ref.random_bf16_bits(rng, (n, k), scale))

    w_qkv, w_o = weight(qkv_n, hidden, 0.05), weight(hidden, attn_k, 0.05)
    w_gu, w_down = weight(2 * inter, hidden, 0.05), weight(hidden, inter, 0.02)
    norm_w = dev.array(bf16_bits(bf16_round(1.0 + 0.2 * rng.standard_normal(hidden, dtype=np.float32))))
    residual0 = bf16_bits(bf16_round(3.0 * rng.standard_normal(hidden, dtype=np.float32)))
    attn = dev.array(bf16_bits(bf16_round(rng.standard_normal(attn_k, dtype=np.float32))))
    return w_qkv, w_o, w_gu, w_down, norm_w, residual0, attn


# ---- programmatic dependent launch: a decoder layer's GEMVs chained with PDL == the same without ----
def test_pdl_chain_matches_serial(dev, kernels, sms) -> None:
    from cuda.bindings import driver as cu
    from tests.kernels.gemv_gpu_helpers import assert_pdl_chain_matches_serial, create_stream
    from tests.kernels.gpu_helpers import check

    hidden, inter, qkv_n, attn_k = 2560, 9728, 6144, 4096
    w_qkv, w_o, w_gu, w_down, norm_w, residual0, attn = layer_inputs(dev, hidden, inter, qkv_n, attn_k)
    residual, qkv, gate_up = dev.alloc(2 * hidden), dev.alloc(2 * qkv_n), dev.alloc(4 * inter)
    stream = create_stream()

    def layer_chain(pdl: bool) -> tuple[np.ndarray, np.ndarray]:
        sync("setup")
        residual.upload(residual0)
        qkv.poison()
        gate_up.poison()
        for _ in range(3):  # o -> gate_up -> down -> next layer's qkv, three times over the same buffers
            for name, w, n, k, middle in (
                ("kern_gemv_residual", w_o, hidden, attn_k, [attn, residual]),
                ("kern_gemv_rmsnorm", w_gu, 2 * inter, hidden, [residual, norm_w, gate_up]),
                ("kern_gemv_silu_residual", w_down, hidden, inter, [gate_up, residual]),
                ("kern_gemv_rmsnorm", w_qkv, qkv_n, hidden, [residual, norm_w, qkv]),
            ):
                tail = [("i", n), ("i", k)] + ([("f", EPS)] if name == "kern_gemv_rmsnorm" else [])
                args = [("p", w.ptr)] + [("p", b.ptr) for b in middle] + tail
                run(kernels[name], default_launch(n, k, sms), args, stream=stream, pdl=pdl)
        check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
        return residual.download(np.uint16, hidden), qkv.download(np.uint16, qkv_n)

    assert_pdl_chain_matches_serial(layer_chain, stream)
