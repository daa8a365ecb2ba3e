"""GPU tests of the decode-v2 GEMV entries (kernels-src/gemv.cu "Rows family", contract docs/kernels-gemv.md
"Rows entries"): kern_gemv_rows, kern_gemv_rows_rmsnorm, kern_gemv_rows_residual against the same float64
references and bounds as their warp-per-row twins (tests/kernels/test_gemv_gpu.py's Case), and
kern_gemv_rmsnorm_swiglu against (a) a float64 bound derived from the reference (tools/reference_gemv.py
rmsnorm_swiglu), (b) bit for bit the composition kern_gemv_rows_rmsnorm (same block size: the same fp32
summation order) then kern_silu_mul, (c) the composition kern_gemv_rmsnorm then kern_silu_mul within the
same float64 bound. Outputs are poisoned (bf16 NaN) before every launch; guard regions are checked.
Run on the GPU machine:  KERN_REQUIRE_GPU=1 python -m pytest tests/kernels/test_gemv_rows_gpu.py -q
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


from test_gemv_gpu import EPS, NAN_BITS, Case, Launch, layer_inputs, run, sync  # noqa: E402
from tools import reference_gemv as ref  # noqa: E402
from tools.reference_kernels import bf16_bits, bf16_round, from_bf16_bits  # noqa: E402

ROWS = 4  # W rows per group (kRows)
# rows entry -> the warp-per-row entry with the same contract (Case builds inputs / references by that name)
TWINS = {"kern_gemv_rows": "kern_gemv", "kern_gemv_rows_rmsnorm": "kern_gemv_rmsnorm",
         "kern_gemv_rows_residual": "kern_gemv_residual"}
ROWS_ENTRIES = tuple(TWINS)
SWIGLU = "kern_gemv_rmsnorm_swiglu"


def rows_launch(groups: int, k: int, sms: int) -> Launch:
    """tools/gen_qwen3.py _rows_launch: block = whole warps covering ceil(k/8) chunks in 2-chunk steps with as
    few batches as 512 threads allow, grid = min(groups, (1024 // block) * SMs), smem 16 * ceil(k/8)."""
    k8 = -(-k // 8)
    batches = -(-k8 // 1024)
    block = min(1024, max(32, -(-(-(-k8 // (2 * batches))) // 32) * 32))
    return Launch(grid=min(groups, max(1, 1024 // block) * sms), block=block, smem_bytes=16 * k8)


def check_rows(dev, kernels, entry: str, n: int, k: int, launch: Launch, w_bits: np.ndarray | None = None,
               w_shift: bool = False) -> None:
    case = Case(dev, np.random.default_rng(), TWINS[entry], n, k, w_bits=w_bits)
    w_ptr = None
    if w_shift:  # W 2 bytes into an allocation: not 16-byte aligned (element path)
        from cuda.bindings import driver as cu
        from tests.kernels.gpu_helpers import check

        shifted = dev.alloc(case.w_bits.nbytes + 2)
        check(cu.cuMemcpyHtoD(shifted.ptr + 2, case.w_bits, case.w_bits.nbytes), "cuMemcpyHtoD")
        w_ptr = shifted.ptr + 2
    out = case.run(kernels[entry], launch, w_ptr=w_ptr)
    case.check(out)
    if case.writes_residual and w_ptr is None:
        case.check_epilogue_exact(kernels[entry], launch, out)


# ---- rows entries: model shapes (Qwen3-4B), small / odd shapes, element path, launch shapes, guards ----
MODEL_SHAPES = {"qkv": (6144, 2560), "o": (2560, 4096), "down": (2560, 9728), "gate_up": (19456, 2560)}


@pytest.mark.parametrize("entry", ROWS_ENTRIES)
@pytest.mark.parametrize("shape", sorted(MODEL_SHAPES))
def test_rows_model_shapes(dev, kernels, sms, entry: str, shape: str) -> None:
    n, k = MODEL_SHAPES[shape]
    check_rows(dev, kernels, entry, n, k, rows_launch(-(-n // ROWS), k, sms))


SMALL_SHAPES = [(1, 8), (3, 8), (5, 16), (37, 16384), (1000, 24), (5, 2560), (333, 520), (1031, 4096), (2561, 9728),
                (6, 1032)]


@pytest.mark.parametrize("entry", ROWS_ENTRIES)
@pytest.mark.parametrize(("n", "k"), SMALL_SHAPES)
def test_rows_small_shapes(dev, kernels, sms, entry: str, n: int, k: int) -> None:
    check_rows(dev, kernels, entry, n, k, rows_launch(-(-n // ROWS), k, sms))


@pytest.mark.parametrize("entry", ROWS_ENTRIES)
@pytest.mark.parametrize(("n", "k"), [(1, 1), (7, 7), (129, 100), (64, 1001), (5, 2561)])
def test_rows_k_not_multiple_of_8(dev, kernels, sms, entry: str, n: int, k: int) -> None:
    check_rows(dev, kernels, entry, n, k, rows_launch(-(-n // ROWS), k, sms))


@pytest.mark.parametrize("entry", ROWS_ENTRIES)
def test_rows_unaligned_weight_pointer(dev, kernels, sms, entry: str) -> None:
    n, k = 301, 2560
    check_rows(dev, kernels, entry, n, k, rows_launch(-(-n // ROWS), k, sms), w_shift=True)


LAUNCH_SHAPES = [(32, 1), (64, 7), (160, 0), (256, 0), (320, 3), (608, 0), (1024, 1), (96, 10000)]


@pytest.mark.parametrize("entry", ROWS_ENTRIES)
@pytest.mark.parametrize(("block", "grid"), LAUNCH_SHAPES)
def test_rows_launch_shapes(dev, kernels, entry: str, block: int, grid: int) -> None:
    """Any grid (0 here: one block per group; more blocks than groups: the extra ones only stage x) and any
    whole number of warps."""
    n, k = 2602, 4104  # n not a multiple of 4, k8 = 513 (a partial step for every block size here)
    groups = -(-n // ROWS)
    check_rows(dev, kernels, entry, n, k, Launch(grid=grid or groups, block=block, smem_bytes=16 * (-(-k // 8))))


@pytest.mark.parametrize("entry", (*ROWS_ENTRIES, SWIGLU))
@pytest.mark.parametrize("bad", ["short_smem", "partial_warp"])
def test_rows_bad_launch_writes_nothing(dev, kernels, entry: str, bad: str) -> None:
    n, k = 64, 2560
    launch = (Launch(grid=8, block=96, smem_bytes=16 * k // 8 - 16) if bad == "short_smem"
              else Launch(grid=8, block=100, smem_bytes=16 * k // 8))
    if entry == SWIGLU:
        sw = SwigluCase(dev, np.random.default_rng(), n, k)
        out = sw.run(kernels[SWIGLU], launch)
        assert np.array_equal(out, np.full(n, NAN_BITS, dtype=np.uint16)), f"{entry}: a {bad} launch wrote act"
        return
    case = Case(dev, np.random.default_rng(), TWINS[entry], n, k)
    out = case.run(kernels[entry], launch)
    want = bf16_bits(case.residual) if case.writes_residual else np.full(n, NAN_BITS, dtype=np.uint16)
    assert np.array_equal(out, want), f"{entry}: a {bad} launch wrote its output"


# ---- kern_gemv_rmsnorm_swiglu ----
class SwigluCase:
    """W_gate_up [2 inter, k] (bits), residual and norm_w [k]; act [inter] output (poisoned before a run)."""

    def __init__(self, dev: Any, rng: np.random.Generator, inter: int, k: int, w_bits: np.ndarray | None = None):
        self.dev, self.inter, self.k = dev, inter, k
        self.w_bits = ref.random_bf16_bits(rng, (2 * inter, k), 0.05) if w_bits is None else w_bits
        self.w = dev.array(self.w_bits)
        self.residual = bf16_round(3.0 * rng.standard_normal(k, dtype=np.float32))
        self.norm_w = bf16_round(1.0 + 0.2 * rng.standard_normal(k, dtype=np.float32))
        self.residual_dev = dev.array(bf16_bits(self.residual))
        self.norm_w_dev = dev.array(bf16_bits(self.norm_w))
        self.act = dev.alloc(2 * inter)
        self.act_ref, self.dot, self.dot_abs = ref.rmsnorm_swiglu(self.w_bits, self.residual, self.norm_w, EPS)

    def args(self, out_ptr: int, n: int) -> list[tuple[str, Any]]:
        return [("p", self.w.ptr), ("p", self.residual_dev.ptr), ("p", self.norm_w_dev.ptr), ("p", out_ptr),
                ("i", n), ("i", self.k), ("f", EPS)]

    def run(self, kernel: Any, launch: Launch) -> np.ndarray:
        self.act.poison()
        run(kernel, launch, self.args(self.act.ptr, self.inter))
        sync(SWIGLU)
        return self.act.download(np.uint16, self.inter)

    def check_f64(self, out: np.ndarray, what: str) -> None:
        """act vs silu(g) * u in float64 (g, u the exact projections): both projections may be off by their
        fp32 accumulation error (2^-14 sum |W x|) and their bf16 rounding (2^-8), silu is 1.1-Lipschitz, and
        silu's and the product's bf16 roundings add 2^-8 each."""
        y = from_bf16_bits(out).astype(np.float64)
        assert np.isfinite(y).all(), f"{what}: non-finite (unwritten?) outputs at {np.flatnonzero(~np.isfinite(y))[:8]}"
        inter = self.inter
        g, u = self.dot[:inter], self.dot[inter:]
        dg = 2.0**-8 * 1.01 * np.abs(g) + 2.0**-14 * self.dot_abs[:inter]
        du = 2.0**-8 * 1.01 * np.abs(u) + 2.0**-14 * self.dot_abs[inter:]
        silu = g / (1.0 + np.exp(-g))
        want = silu * u
        bound = 1.1 * dg * (np.abs(u) + du) + np.abs(silu) * du + 2.0**-7 * 1.01 * (np.abs(silu) + 1.1 * dg) * (np.abs(u) + du)
        rel = np.linalg.norm(y - want) / max(np.linalg.norm(want), 1e-30)
        assert rel < 1e-2, f"{what}: relative error {rel:.3g}"
        bad = np.flatnonzero(np.abs(y - want) > bound + 1e-30)
        assert bad.size == 0, f"{what}: {bad.size} outputs outside the bound, first {bad[:8].tolist()}: got {y[bad[:4]]} want {want[bad[:4]]}"
        # and the reference's own rounding (float64 projections rounded to bf16, then silu_mul) agrees
        # with the kernel in almost every element (a neighbouring bf16 projection is rare)
        same = np.mean(bf16_bits(self.act_ref) == out)
        assert inter < 256 or same > 0.9, f"{what}: only {same:.3f} of the outputs equal the reference's rounding"

    def composed(self, dev: Any, kernels: dict[str, Any], gemv_entry: str, launch: Launch) -> np.ndarray:
        """gemv_entry (RMSNorm prologue) over all 2 inter rows -> gate_up, then kern_silu_mul -> act bits."""
        gate_up = dev.alloc(4 * self.inter)
        gate_up.poison()
        run(kernels[gemv_entry], launch, self.args(gate_up.ptr, 2 * self.inter))
        sync(gemv_entry)
        act2 = dev.alloc(2 * self.inter)
        act2.poison()
        dev.kernel("kern_silu_mul").launch((1, -(-self.inter // 1024)), (256,),
                                           [("p", gate_up.ptr), ("p", act2.ptr), ("i", 1), ("i", self.inter)])
        sync("kern_silu_mul")
        return act2.download(np.uint16, self.inter)


SWIGLU_SHAPES = [(9728, 2560), (1, 8), (3, 16), (5, 2560), (777, 520), (1031, 4096), (64, 1001), (7, 7)]


@pytest.mark.parametrize(("inter", "k"), SWIGLU_SHAPES)
def test_swiglu_reference(dev, kernels, sms, inter: int, k: int) -> None:
    sw = SwigluCase(dev, np.random.default_rng(), inter, k)
    sw.check_f64(sw.run(kernels[SWIGLU], rows_launch(-(-inter // 2), k, sms)), f"{SWIGLU} inter={inter} k={k}")


@pytest.mark.parametrize(("inter", "k"), [(9728, 2560), (5, 2560), (777, 520), (64, 1001)])
@pytest.mark.parametrize("block", [0, 32, 256])
def test_swiglu_equals_rows_rmsnorm_then_silu_mul(dev, kernels, sms, inter: int, k: int, block: int) -> None:
    """Bit for bit: the gate / up sums of kern_gemv_rmsnorm_swiglu are kern_gemv_rows_rmsnorm's (same block
    size, so the same fp32 order whatever the row's place in its group), rounded to bf16, then
    kern_silu_mul's formula."""
    if "act" not in dev.meta["modules"]:
        pytest.skip("module act not in kernels/kernels.json")
    sw = SwigluCase(dev, np.random.default_rng(), inter, k)
    launch = rows_launch(-(-inter // 2), k, sms)
    if block:
        launch = Launch(grid=13, block=block, smem_bytes=launch.smem_bytes)
    fused = sw.run(kernels[SWIGLU], launch)
    composed = sw.composed(dev, kernels, "kern_gemv_rows_rmsnorm", Launch(grid=launch.grid, block=launch.block,
                                                                          smem_bytes=launch.smem_bytes))
    mismatch = np.flatnonzero(fused != composed)
    assert mismatch.size == 0, f"swiglu != rows_rmsnorm + silu_mul at {mismatch[:8].tolist()}"


def test_swiglu_matches_gemv_rmsnorm_then_silu_mul(dev, kernels, sms) -> None:
    """Against the v1 decode path (kern_gemv_rmsnorm over gate_up, then kern_silu_mul): different fp32
    summation order, so both are held to the same float64 bound, and nearly all outputs agree exactly."""
    if "act" not in dev.meta["modules"]:
        pytest.skip("module act not in kernels/kernels.json")
    inter, k = 9728, 2560
    sw = SwigluCase(dev, np.random.default_rng(), inter, k)
    fused = sw.run(kernels[SWIGLU], rows_launch(-(-inter // 2), k, sms))
    v1 = sw.composed(dev, kernels, "kern_gemv_rmsnorm", Launch(grid=min(2 * inter, 2 * sms), block=512,
                                                               smem_bytes=16 * (-(-k // 8))))
    sw.check_f64(fused, "swiglu")
    sw.check_f64(v1, "kern_gemv_rmsnorm + kern_silu_mul")
    assert np.mean(fused == v1) > 0.95, "swiglu and the v1 composition disagree in more than 5% of the outputs"


# ---- PDL chain of a v2 layer == the same chain without PDL ----
def test_rows_pdl_chain_matches_serial(dev, kernels, sms) -> None:
    from cuda.bindings import driver as cu
    from tests.kernels.gemv_gpu_helpers import assert_pdl_chain_matches_serial, create_stream
    from tests.kernels.gpu_helpers import check

    hidden, inter, qkv_n, attn_k = 2560, 9728, 6144, 4096
    w_qkv, w_o, w_gu, w_down, norm_w, residual0, attn = layer_inputs(dev, hidden, inter, qkv_n, attn_k)
    residual, qkv, act = dev.alloc(2 * hidden), dev.alloc(2 * qkv_n), dev.alloc(2 * inter)
    stream = create_stream()

    def chain(pdl: bool) -> tuple[np.ndarray, np.ndarray]:
        sync("setup")
        residual.upload(residual0)
        qkv.poison()
        act.poison()
        for _ in range(3):
            for name, w, n, k, middle, groups in (
                ("kern_gemv_rows_residual", w_o, hidden, attn_k, [attn, residual], -(-hidden // 4)),
                (SWIGLU, w_gu, inter, hidden, [residual, norm_w, act], -(-inter // 2)),
                ("kern_gemv_rows_residual", w_down, hidden, inter, [act, residual], -(-hidden // 4)),
                ("kern_gemv_rows_rmsnorm", w_qkv, qkv_n, hidden, [residual, norm_w, qkv], -(-qkv_n // 4)),
            ):
                tail = [("i", n), ("i", k)] + ([("f", EPS)] if name in (SWIGLU, "kern_gemv_rows_rmsnorm") else [])
                args = [("p", w.ptr)] + [("p", b.ptr) for b in middle] + tail
                run(kernels[name], rows_launch(groups, k, sms), args, stream=stream, pdl=pdl)
        check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
        return residual.download(np.uint16, hidden), qkv.download(np.uint16, qkv_n)

    assert_pdl_chain_matches_serial(chain, stream)
