"""GPU tests of the async-family GEMV entries (kernels-src/gemv.cu "Async family", contract
docs/kernels-gemv.md "Async entries"): gemv_body's warp-per-row walk with every W load a cp.async into a
per-thread shared-memory FIFO, filled before griddepcontrol.wait.

- kern_gemv_async_rmsnorm / kern_gemv_async_residual: against the float64 reference and bound of their
  warp-per-row twins (tests/kernels/test_gemv_gpu.py's Case), and BIT FOR BIT against the twins themselves
  (same row deal, same per-lane chunk order, same butterfly), over the Qwen3-4B shapes, small and ragged
  shapes (k8 not a multiple of 32: lanes with fewer chunks), and launch shapes (1 warp .. 512 threads, one
  block, more blocks than rows);
- kern_gemv_async_rmsnorm_swiglu: bit for bit kern_gemv_rmsnorm over the gate_up rows then kern_silu_mul,
  and the float64 bound of test_gemv_rows_gpu.SwigluCase;
- launches that break a precondition (k % 8, unaligned W, short shared memory, a partial warp) write nothing;
- a PDL chain of a decoder layer's four async launches equals the same chain without PDL.
Outputs are poisoned (bf16 NaN) before every launch; guard regions are checked after every test.
Run on the GPU machine:  KERN_REQUIRE_GPU=1 python -m pytest tests/kernels/test_gemv_async_gpu.py -q
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_gemv_gpu import EPS, NAN_BITS, Case, Launch, default_launch, run, sync  # noqa: E402
from test_gemv_rows_gpu import SwigluCase  # noqa: E402
from tools import reference_gemv as ref  # noqa: E402
from tools.reference_kernels import bf16_bits, bf16_round, from_bf16_bits  # noqa: E402

TWINS = {"kern_gemv_async_rmsnorm": "kern_gemv_rmsnorm", "kern_gemv_async_residual": "kern_gemv_residual"}
SWIGLU = "kern_gemv_async_rmsnorm_swiglu"
FIFO_BYTES = 384  # per thread: 16 bytes x kAsyncGroup (4) x kAsyncGroups (6)
SMEM_MAX = 227 * 1024


def async_smem(k: int, threads: int) -> int:
    """docs/kernels-gemv.md: x (16 * k / 8 bytes), then 384 bytes of FIFO per thread."""
    return 2 * k + FIFO_BYTES * threads


@pytest.fixture(scope="module")
def async_kernels(kernels) -> dict[str, Any]:
    """The async entries with their dynamic shared memory limit raised to 227 KiB (the runtime does this
    from the manifest's shared_mem)."""
    from cuda.bindings import driver as cu
    from gpu_helpers import check

    attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    static = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
    for name in (*TWINS, SWIGLU):
        fn = kernels[name].func
        static_bytes = check(cu.cuFuncGetAttribute(static, fn), f"cuFuncGetAttribute({name})")
        check(cu.cuFuncSetAttribute(fn, attr, SMEM_MAX - static_bytes), f"cuFuncSetAttribute({name})")
    return kernels


def async_launch(units: int, k: int, sms: int, grid: int = 0, block: int = 0) -> Launch:
    """tools/gen_qwen3.py async_launch: one block per SM (at most one per unit), 512 threads where x and the
    FIFOs fit 227 KiB with room for the static shared memory, else 256."""
    block = block or (512 if async_smem(k, 512) <= SMEM_MAX - 1024 else 256)
    return Launch(grid=grid or min(units, sms), block=block, smem_bytes=async_smem(k, block))


def check_async(dev, kernels, entry: str, n: int, k: int, launch: Launch, sms: int,
                w_bits: np.ndarray | None = None) -> None:
    """Reference bound, then bit for bit against the twin's default launch on the same inputs."""
    case = Case(dev, np.random.default_rng(), TWINS[entry], n, k, w_bits=w_bits)
    residual0 = case.residual
    if case.writes_residual:
        case.out.upload(bf16_bits(residual0))
    else:
        case.out.poison()
    run(kernels[entry], launch, case.args())
    sync(entry)
    out = case.out.download(np.uint16, n)
    case.check(out)
    twin = case.run(kernels[TWINS[entry]], default_launch(n, k, sms))
    mismatch = np.flatnonzero(out != twin)
    assert mismatch.size == 0, f"{entry} n={n} k={k}: differs from {TWINS[entry]} at rows {mismatch[:8].tolist()}"


MODEL_SHAPES = {"qkv": (6144, 2560), "o": (2560, 4096), "down": (2560, 9728), "gate_up": (19456, 2560)}


@pytest.mark.parametrize("entry", tuple(TWINS))
@pytest.mark.parametrize("shape", sorted(MODEL_SHAPES))
def test_async_model_shapes(dev, async_kernels, sms, entry: str, shape: str) -> None:
    n, k = MODEL_SHAPES[shape]
    check_async(dev, async_kernels, entry, n, k, async_launch(n, k, sms), sms)


# k8 = k / 8 chunks per row; k8 % 32 != 0 leaves lanes with one chunk fewer (no load, no FMA at that step)
SMALL_SHAPES = [(1, 8), (3, 8), (5, 16), (37, 16384), (1000, 24), (5, 2560), (333, 520), (1031, 4096), (2561, 9728),
                (6, 1032)]


@pytest.mark.parametrize("entry", tuple(TWINS))
@pytest.mark.parametrize(("n", "k"), SMALL_SHAPES)
def test_async_small_shapes(dev, async_kernels, sms, entry: str, n: int, k: int) -> None:
    check_async(dev, async_kernels, entry, n, k, async_launch(n, k, sms), sms)


# (grid, block): one warp per block, one block for all rows, more blocks than rows, 2 blocks per SM
LAUNCH_SHAPES = [(0, 32), (1, 512), (600, 64), (7, 96), (264, 256), (0, 160)]


@pytest.mark.parametrize("entry", tuple(TWINS))
@pytest.mark.parametrize(("grid", "block"), LAUNCH_SHAPES)
def test_async_launch_shapes(dev, async_kernels, sms, entry: str, grid: int, block: int) -> None:
    n, k = 523, 1032  # k8 = 129: one lane has 5 chunk steps per row, the others 4
    check_async(dev, async_kernels, entry, n, k, async_launch(n, k, sms, grid=grid, block=block), sms)


@pytest.mark.parametrize(("inter", "k", "grid", "block"), [(9728, 2560, 0, 512), (5, 2560, 0, 512), (777, 520, 3, 96),
                                                          (64, 1000, 0, 32), (1, 8, 0, 512), (1031, 4096, 264, 256)])
def test_async_swiglu(dev, async_kernels, sms, inter: int, k: int, grid: int, block: int) -> None:
    """Bit for bit kern_gemv_rmsnorm over all 2 inter gate_up rows (the same per-row order) then
    kern_silu_mul, and within the float64 bound."""
    if "act" not in dev.meta["modules"]:
        pytest.skip("module act not in kernels/kernels.json")
    sw = SwigluCase(dev, np.random.default_rng(), inter, k)
    launch = async_launch(inter, k, sms, grid=grid, block=block)
    sw.act.poison()
    run(async_kernels[SWIGLU], launch, sw.args(sw.act.ptr, inter))
    sync(SWIGLU)
    fused = sw.act.download(np.uint16, inter)
    sw.check_f64(fused, f"{SWIGLU} inter={inter} k={k}")
    composed = sw.composed(dev, async_kernels, "kern_gemv_rmsnorm", default_launch(2 * inter, k, sms))
    mismatch = np.flatnonzero(fused != composed)
    assert mismatch.size == 0, f"async swiglu != kern_gemv_rmsnorm + kern_silu_mul at {mismatch[:8].tolist()}"


BAD = ["k_not_multiple_of_8", "unaligned_w", "short_smem", "partial_warp"]


@pytest.mark.parametrize("entry", (*TWINS, SWIGLU))
@pytest.mark.parametrize("bad", BAD)
def test_async_bad_launch_writes_nothing(dev, async_kernels, sms, entry: str, bad: str) -> None:
    from cuda.bindings import driver as cu
    from gpu_helpers import check

    n, k = 64, 1004 if bad == "k_not_multiple_of_8" else 1024  # 1004 % 8 == 4
    block = 100 if bad == "partial_warp" else 256
    smem = async_smem(k, block) - (16 if bad == "short_smem" else 0)
    launch = Launch(grid=8, block=block, smem_bytes=smem)
    if entry == SWIGLU:
        sw = SwigluCase(dev, np.random.default_rng(), n, k)
        w_ptr = sw.w.ptr
        if bad == "unaligned_w":
            w_ptr = dev.alloc(sw.w_bits.nbytes + 2).ptr + 2
            check(cu.cuMemcpyHtoD(w_ptr, sw.w_bits, sw.w_bits.nbytes), "cuMemcpyHtoD")
        sw.act.poison()
        args = sw.args(sw.act.ptr, n)
        run(async_kernels[SWIGLU], launch, [("p", w_ptr)] + args[1:])
        sync(SWIGLU)
        assert np.array_equal(sw.act.download(np.uint16, n), np.full(n, NAN_BITS, dtype=np.uint16)), \
            f"{entry}: a {bad} launch wrote act"
        return
    case = Case(dev, np.random.default_rng(), TWINS[entry], n, k)
    w_ptr = None
    if bad == "unaligned_w":
        w_ptr = dev.alloc(case.w_bits.nbytes + 2).ptr + 2
        check(cu.cuMemcpyHtoD(w_ptr, case.w_bits, case.w_bits.nbytes), "cuMemcpyHtoD")
    if case.writes_residual:
        case.out.upload(bf16_bits(case.residual))
    else:
        case.out.poison()
    run(async_kernels[entry], launch, case.args(w_ptr))
    sync(entry)
    out = case.out.download(np.uint16, n)
    want = bf16_bits(case.residual) if case.writes_residual else np.full(n, NAN_BITS, dtype=np.uint16)
    assert np.array_equal(out, want), f"{entry}: a {bad} launch wrote its output"


def test_async_pdl_chain_matches_serial(dev, async_kernels, sms) -> None:
    """o -> gate_up (SwiGLU) -> down -> qkv of the next layer, three layers, launched with PDL (each FIFO
    filled before griddepcontrol.wait, while the previous kernel still runs) == the same without PDL, 5 tries."""
    from cuda.bindings import driver as cu
    from gemv_gpu_helpers import create_stream
    from gpu_helpers import check

    rng = np.random.default_rng()
    hidden, inter, qkv_n, attn_k = 2560, 9728, 6144, 4096
    w_qkv = dev.array(ref.random_bf16_bits(rng, (qkv_n, hidden), 0.05))
    w_o = dev.array(ref.random_bf16_bits(rng, (hidden, attn_k), 0.05))
    w_gu = dev.array(ref.random_bf16_bits(rng, (2 * inter, hidden), 0.05))
    w_down = dev.array(ref.random_bf16_bits(rng, (hidden, inter), 0.02))
    norm_w = dev.array(bf16_bits(bf16_round(1.0 + 0.2 * rng.standard_normal(hidden, dtype=np.float32))))
    residual0 = bf16_bits(bf16_round(3.0 * rng.standard_normal(hidden, dtype=np.float32)))
    attn = dev.array(bf16_bits(bf16_round(rng.standard_normal(attn_k, dtype=np.float32))))
    residual, qkv, act = dev.alloc(2 * hidden), dev.alloc(2 * qkv_n), dev.alloc(2 * inter)
    stream = create_stream()

    def chain(pdl: bool) -> tuple[np.ndarray, np.ndarray]:
        sync("setup")
        residual.upload(residual0)
        qkv.poison()
        act.poison()
        for _ in range(3):
            for name, w, n, k, middle in (
                ("kern_gemv_async_residual", w_o, hidden, attn_k, [attn, residual]),
                (SWIGLU, w_gu, inter, hidden, [residual, norm_w, act]),
                ("kern_gemv_async_residual", w_down, hidden, inter, [act, residual]),
                ("kern_gemv_async_rmsnorm", w_qkv, qkv_n, hidden, [residual, norm_w, qkv]),
            ):
                launch = async_launch(n, k, sms)
                tail = [("i", n), ("i", k)] + ([("f", EPS)] if name != "kern_gemv_async_residual" else [])
                args = [("p", w.ptr)] + [("p", b.ptr) for b in middle] + tail
                run(async_kernels[name], launch, args, stream=stream, pdl=pdl)
        check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
        return residual.download(np.uint16, hidden), qkv.download(np.uint16, qkv_n)

    try:
        serial_residual, serial_qkv = chain(pdl=False)
        assert np.isfinite(from_bf16_bits(serial_qkv)).all() and np.isfinite(from_bf16_bits(serial_residual)).all()
        for attempt in range(5):
            pdl_residual, pdl_qkv = chain(pdl=True)
            assert np.array_equal(pdl_residual, serial_residual), f"PDL chain (try {attempt}): residual != serial"
            assert np.array_equal(pdl_qkv, serial_qkv), f"PDL chain (try {attempt}): qkv != serial"
    finally:
        check(cu.cuStreamDestroy(stream), "cuStreamDestroy")
