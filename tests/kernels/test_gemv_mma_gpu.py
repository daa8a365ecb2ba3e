"""GPU tests of the small-M MMA projections (kernels-src/gemv_mma.cu, contract docs/kernels-gemv.md "Small-M MMA
entries"): kern_mma_rmsnorm_m{8,16,32,64}, kern_mma_residual_m*, kern_mma_rmsnorm_swiglu_m*, launched as the builder
launches them (kern_run.models.qwen3.mma: clusters of blocks splitting k) unless a test says otherwise.

References (tools/reference_gemv_mma.py, float64 dot products) and bounds per output element, as for the M = 1 entries
(tests/kernels/test_gemv_gpu.py Case.check): |y - ref| <= 2^-8 |ref| (the bf16 output rounding) + 2^-14 sum_j |W x|
(fp32 / tensor-core accumulation) + 2^-7 of the near-tie x elements' |W x| (RMSNorm kinds: an x element may round the
other way under the kernel's fp32 1 / rms); residual: two roundings and twice the accumulation term; SwiGLU: the bound
of tests/kernels/test_gemv_rows_gpu.py SwigluCase.check_f64. Exact parts bit for bit: the residual epilogue
(bf16(r + p), p the projection the same kernel writes over a zero residual) and the SwiGLU epilogue (kern_mma_rmsnorm
over all 2 inter rows, same tile and cluster, then kern_silu_mul).

Every run fills the token rows >= m of the input with bf16 NaN and of the output with NaN (residual: other values),
and checks those output rows untouched. Batch invariance: a row's output bits are the same at any position of any
batch (m = 1, 2, 9, 33, 64) and from any tile entry that holds the batch; grids of one warps per tile (gemv_mma.cu
warps_per_tile) give the same bits.
Run on the GPU machine:  KERN_REQUIRE_GPU=1 python -m pytest tests/kernels/test_gemv_mma_gpu.py -q
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


from test_gemv_gpu import EPS, NAN_BITS, run, sync  # noqa: E402
from tools import reference_gemv as ref1  # noqa: E402
from tools import reference_gemv_mma as ref  # noqa: E402
from tools.reference_kernels import bf16_bits, bf16_round, from_bf16_bits  # noqa: E402

TILES = (8, 16, 32, 64)
ROWS = 64  # token rows allocated for every input / output buffer
M_VALUES = (1, 2, 3, 7, 8, 9, 16, 31, 33, 64)
KINDS = ("rmsnorm", "residual", "rmsnorm_swiglu")

# Qwen3-4B projections: kind -> (outputs per row: n, or inter for SwiGLU; k)
MODEL_SHAPES = {
    "qkv": ("rmsnorm", 6144, 2560),
    "o": ("residual", 2560, 4096),
    "gate_up": ("rmsnorm_swiglu", 9728, 2560),
    "down": ("residual", 2560, 9728),
    "lm_head": ("rmsnorm", 151936, 2560),
}


def entry(kind: str, tile: int) -> str:
    return f"kern_mma_{kind}_m{tile}"


def tiles_for(m: int) -> list[int]:
    return [t for t in TILES if t >= m]


@pytest.fixture(scope="module")
def mma(gpu) -> dict[str, Any]:
    from tests.kernels.gemv_mma_gpu_helpers import mma_kernels

    found, origin = mma_kernels(gpu)
    print(f"gemv_mma cubin: {origin}")
    return found


def builder_launch(kind: str, n_out: int, k: int, tile: int, sms: int) -> Any:
    from tests.kernels.gemv_mma_gpu_helpers import builder_launch as bl

    return bl(kind, n_out, k, tile, sms)


def launch_mma(kernel: Any, shape: Any, args: list[tuple[str, Any]], stream: Any = 0, pdl: bool = False) -> None:
    from tests.kernels.gemv_mma_gpu_helpers import launch

    launch(kernel, shape, args, stream=stream, pdl=pdl)


class MmaCase:
    """ROWS candidate token rows of one projection: W bits [n_w, k] (n_w = n_out, SwiGLU 2 n_out), src [ROWS, k]
    (the residual for the RMSNorm kinds, x for `residual`), norm_w [k], the residual kind's initial residual
    [ROWS, n_out], and the float64 reference of every candidate row. `run` places the rows `order` at batch positions
    0..m-1 (m = len(order)) and fills positions m.. with NaN inputs."""

    def __init__(self, dev: Any, rng: np.random.Generator, kind: str, n_out: int, k: int,
                 w_bits: np.ndarray | None = None):
        self.dev, self.kind, self.n_out, self.k = dev, kind, n_out, k
        self.swiglu = kind == "rmsnorm_swiglu"
        n_w = 2 * n_out if self.swiglu else n_out
        self.w_bits = ref1.random_bf16_bits(rng, (n_w, k), 0.05) if w_bits is None else w_bits
        self.w = dev.array(self.w_bits)
        if kind == "residual":
            self.src = bf16_round(rng.standard_normal((ROWS, k), dtype=np.float32))
            x, tie = self.src, None
            self.norm_w_dev = None
            self.residual0 = bf16_round(rng.standard_normal((ROWS, n_out), dtype=np.float32))
            self.residual_pad = bf16_round(rng.standard_normal((ROWS, n_out), dtype=np.float32))
        else:
            self.src = bf16_round(3.0 * rng.standard_normal((ROWS, k), dtype=np.float32))
            self.norm_w = bf16_round(1.0 + 0.2 * rng.standard_normal(k, dtype=np.float32))
            self.norm_w_dev = dev.array(bf16_bits(self.norm_w))
            x = ref.rmsnorm_rows(self.src, self.norm_w, EPS)
            tie = ref.near_tie_x(self.src, x, EPS)
        self.src_dev = dev.alloc(2 * ROWS * k)
        self.out = dev.alloc(2 * ROWS * n_out)
        self.dot, self.dot_abs = ref.gemm_f64(self.w_bits, x)  # [ROWS, n_w]
        self.tie_abs = ref.gemm_f64(self.w_bits, tie)[1] if tie is not None else np.zeros_like(self.dot)

    def args(self, m: int, out_ptr: int | None = None, n: int | None = None) -> list[tuple[str, Any]]:
        """The entry's arguments for m rows (`out_ptr` / `n`: another output and its row count)."""
        out = self.out.ptr if out_ptr is None else out_ptr
        n = self.n_out if n is None else n
        if self.kind == "residual":
            return [("p", self.w.ptr), ("p", self.src_dev.ptr), ("p", out), ("i", m), ("i", n), ("i", self.k)]
        return [("p", self.w.ptr), ("p", self.src_dev.ptr), ("p", self.norm_w_dev.ptr), ("p", out), ("i", m),
                ("i", n), ("i", self.k), ("f", EPS)]

    def stage(self, order: np.ndarray, zero_residual: bool = False) -> None:
        """Upload src rows `order` to positions 0..m-1 (NaN after), and the output's initial contents."""
        m = len(order)
        src = np.full((ROWS, self.k), NAN_BITS, dtype=np.uint16)
        src[:m] = bf16_bits(self.src[order])
        self.src_dev.upload(src)
        if self.kind == "residual":
            out = bf16_bits(self.residual_pad)
            out[:m] = 0 if zero_residual else bf16_bits(self.residual0[order])
            self.out.upload(out)
        else:
            self.out.poison()

    def run(self, kernel: Any, shape: Any, order: np.ndarray, zero_residual: bool = False) -> np.ndarray:
        """Stage `order`, launch once, sync -> the output [ROWS, n_out] bf16 bits."""
        self.stage(order, zero_residual)
        launch_mma(kernel, shape, self.args(len(order)))
        sync(kernel.name)
        return self.out.download(np.uint16, (ROWS, self.n_out))

    def check(self, out: np.ndarray, order: np.ndarray, what: str) -> None:
        """Rows 0..m-1 against the reference of rows `order`; rows m.. untouched."""
        m = len(order)
        if self.kind == "residual":
            assert np.array_equal(out[m:], bf16_bits(self.residual_pad)[m:]), f"{what}: wrote a residual row >= m"
        else:
            bad = np.flatnonzero((out[m:] != NAN_BITS).any(axis=1))
            assert bad.size == 0, f"{what}: wrote output rows >= m: {(bad + m)[:8].tolist()}"
        y = from_bf16_bits(out[:m]).astype(np.float64)
        assert np.isfinite(y).all(), f"{what}: non-finite (unwritten?) outputs at {np.argwhere(~np.isfinite(y))[:4].tolist()}"
        residual = self.residual0[order] if self.kind == "residual" else None
        want, bound = ref.expected_and_bound(self.kind, self.dot[order], self.dot_abs[order], self.tie_abs[order],
                                             residual)
        rel = np.linalg.norm(y - want) / max(np.linalg.norm(want), 1e-30)
        assert rel < 1e-2, f"{what}: relative error {rel:.3g}"
        bad = np.argwhere(np.abs(y - want) > bound + 1e-30)
        assert bad.size == 0, (f"{what}: {len(bad)} outputs outside the bound, first (row, col) {bad[:4].tolist()}: "
                               f"got {[y[tuple(b)] for b in bad[:4]]} want {[want[tuple(b)] for b in bad[:4]]}")

    def check_residual_exact(self, kernel: Any, shape: Any, order: np.ndarray, out: np.ndarray, what: str) -> None:
        """Residual kind: out == bf16(r + p) bit for bit, p = the same kernel's output over a zero residual."""
        m = len(order)
        p = from_bf16_bits(self.run(kernel, shape, order, zero_residual=True)[:m])
        want = bf16_bits(ref.residual_add(self.residual0[order], p))
        bad = np.argwhere(out[:m] != want)
        assert bad.size == 0, f"{what}: residual != bf16(r + bf16(W.x)) at {bad[:8].tolist()}"

    def check_swiglu_exact(self, dev: Any, mma: dict[str, Any], tile: int, sms: int, order: np.ndarray,
                           out: np.ndarray, what: str) -> None:
        """SwiGLU: out == kern_silu_mul(kern_mma_rmsnorm over all 2 inter rows) bit for bit (same tile and cluster:
        the same summation order for every gate and up row)."""
        m, inter = len(order), self.n_out
        gate_up = dev.alloc(2 * ROWS * 2 * inter)
        gate_up.poison()
        self.stage(order)
        launch_mma(mma[entry("rmsnorm", tile)], builder_launch("rmsnorm", 2 * inter, self.k, tile, sms),
                   self.args(m, out_ptr=gate_up.ptr, n=2 * inter))
        sync("kern_mma_rmsnorm (gate_up)")
        act = dev.alloc(2 * ROWS * inter)
        act.poison()
        dev.kernel("kern_silu_mul").launch((m, -(-inter // 1024)), (256,),
                                           [("p", gate_up.ptr), ("p", act.ptr), ("i", m), ("i", inter)])
        sync("kern_silu_mul")
        composed = act.download(np.uint16, (m, inter))
        bad = np.argwhere(out[:m] != composed)
        assert bad.size == 0, f"{what}: swiglu != rmsnorm over gate_up + silu_mul at {bad[:8].tolist()}"


# ---- every tile entry at every m it holds, a small odd shape (n, inter not a multiple of 16 / 8; k not of 32) ----
SMALL = (333, 520)


@pytest.mark.parametrize("kind", KINDS)
def test_every_tile_at_every_m_it_holds(dev, mma, sms, kind: str) -> None:
    n_out, k = SMALL
    case = MmaCase(dev, np.random.default_rng(), kind, n_out, k)
    rng = np.random.default_rng()
    for m in M_VALUES:
        for tile in tiles_for(m):
            order = rng.permutation(ROWS)[:m]
            shape = builder_launch(kind, n_out, k, tile, sms)
            what = f"{entry(kind, tile)} m={m} {n_out}x{k}"
            out = case.run(mma[entry(kind, tile)], shape, order)
            case.check(out, order, what)
            if kind == "residual":
                case.check_residual_exact(mma[entry(kind, tile)], shape, order, out, what)
            if kind == "rmsnorm_swiglu" and m in (3, 33):
                case.check_swiglu_exact(dev, mma, tile, sms, order, out, what)


# ---- Qwen3-4B shapes: the reference at m = 64, then sub-batches: invariance and the exact epilogues ----
@pytest.mark.parametrize("shape", sorted(MODEL_SHAPES))
def test_model_shape_reference_and_batch_invariance(dev, mma, sms, shape: str) -> None:
    """64 rows through the m64 tile against the reference; then for m = 1, 2, 9, 33 with every tile that holds m,
    a random choice of those rows in a random order: each row's bits equal its bits in the 64-row batch."""
    kind, n_out, k = MODEL_SHAPES[shape]
    rng = np.random.default_rng()
    case = MmaCase(dev, rng, kind, n_out, k)
    full_order = np.arange(ROWS)
    full = case.run(mma[entry(kind, 64)], builder_launch(kind, n_out, k, 64, sms), full_order)
    case.check(full, full_order, f"{shape} {entry(kind, 64)} m=64")
    for m in (1, 2, 9, 33):
        for tile in tiles_for(m):
            order = rng.permutation(ROWS)[:m]
            what = f"{shape} {entry(kind, tile)} m={m}"
            shp = builder_launch(kind, n_out, k, tile, sms)
            out = case.run(mma[entry(kind, tile)], shp, order)
            case.check(out, order, what)
            # (residual: row i's input residual is residual0[order[i]] in both runs)
            bad = np.flatnonzero((out[:m] != full[order]).any(axis=1))
            assert bad.size == 0, f"{what}: rows {order[bad][:8].tolist()} differ from the 64-row batch"
            if kind == "residual" and m in (2, 33):
                case.check_residual_exact(mma[entry(kind, tile)], shp, order, out, what)
            if kind == "rmsnorm_swiglu" and m in (2, 33):
                case.check_swiglu_exact(dev, mma, tile, sms, order, out, what)


# ---- more shapes: tiny k, k not a multiple of 32, a cluster of 4 with a partial last rank ----
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("n_out", "k"), [(5, 8), (17, 40), (1, 2560), (1000, 4104), (2561, 9728)])
def test_other_shapes(dev, mma, sms, kind: str, n_out: int, k: int) -> None:
    case = MmaCase(dev, np.random.default_rng(), kind, n_out, k)
    for m, tile in ((3, 8), (64, 64)):
        order = np.arange(m)
        shape = builder_launch(kind, n_out, k, tile, sms)
        out = case.run(mma[entry(kind, tile)], shape, order)
        case.check(out, order, f"{entry(kind, tile)} m={m} {n_out}x{k}")
        if kind == "rmsnorm_swiglu":
            case.check_swiglu_exact(dev, mma, tile, sms, order, out, f"{entry(kind, tile)} {n_out}x{k}")


# ---- cluster sizes and grids: every cluster size is correct; grids of one warps-per-tile give the same bits ----
@pytest.mark.parametrize("kind", KINDS)
def test_cluster_sizes_and_grids(dev, mma, sms, kind: str) -> None:
    from tests.kernels.gemv_mma_gpu_helpers import MmaLaunch
    from kern_run.models.qwen3.mma import dynamic_smem, rank_chunks, warps_per_tile

    n_out, k, tile, m = 1031, 2600, 16, 11  # k: 81.25 chunks, so every rank count leaves a partial rank
    case = MmaCase(dev, np.random.default_rng(), kind, n_out, k)
    order = np.arange(m)
    tiles = -(-n_out // (8 if kind == "rmsnorm_swiglu" else 16))
    for cluster in (1, 2, 4, 8):
        smem = dynamic_smem(k, cluster, tile)
        cpr = rank_chunks(k, cluster)
        by_p: dict[int, np.ndarray] = {}
        for clusters in (1, 7, max(1, sms // cluster), tiles + 3, -(-tiles // 2), -(-tiles // 4)):
            shape = MmaLaunch(grid=clusters * cluster, cluster=cluster, smem_bytes=smem)
            out = case.run(mma[entry(kind, tile)], shape, order)
            p = warps_per_tile(tiles, clusters, cpr)
            case.check(out, order, f"{entry(kind, tile)} cluster {cluster} x {clusters} (P {p})")
            if p in by_p:
                assert np.array_equal(out, by_p[p]), f"{kind} cluster {cluster} P {p}: the grid changed the bits"
            by_p[p] = out


# ---- launches the kernel refuses: nothing written ----
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bad", ["block_128", "short_smem", "m_over_tile", "m_zero", "k_not_multiple_of_8"])
def test_bad_launch_writes_nothing(dev, mma, sms, kind: str, bad: str) -> None:
    from tests.kernels.gemv_mma_gpu_helpers import MmaLaunch

    n_out, k, tile = 64, 2560, 8
    case = MmaCase(dev, np.random.default_rng(), kind, n_out, k)
    shape = builder_launch(kind, n_out, k, tile, sms)
    m = {"m_over_tile": 9, "m_zero": 0}.get(bad, 4)
    if bad == "block_128":
        shape = MmaLaunch(shape.grid, shape.cluster, shape.smem_bytes, block=128)
    if bad == "short_smem":
        shape = MmaLaunch(shape.grid, shape.cluster, shape.smem_bytes - 16)
    case.stage(np.arange(m))
    before = case.out.download(np.uint16, (ROWS, n_out))
    args = case.args(m)
    if bad == "k_not_multiple_of_8":
        args[-2 if kind != "residual" else -1] = ("i", k - 4)
    launch_mma(mma[entry(kind, tile)], shape, args)
    sync(f"{entry(kind, tile)} {bad}")
    assert np.array_equal(case.out.download(np.uint16, (ROWS, n_out)), before), f"{entry(kind, tile)}: a {bad} launch wrote"


# ---- against the M = 1 path: the same math, so within the same bound and nearly always the same bits ----
def test_m1_rows_close_to_the_gemv(dev, mma, kernels, sms) -> None:
    from test_gemv_rows_gpu import rows_launch

    for kind, gemv, n_out, k in (("rmsnorm", "kern_gemv_rows_rmsnorm", 6144, 2560),
                                 ("residual", "kern_gemv_rows_residual", 2560, 4096)):
        case = MmaCase(dev, np.random.default_rng(), kind, n_out, k)
        order = np.arange(1)
        out = case.run(mma[entry(kind, 8)], builder_launch(kind, n_out, k, 8, sms), order)
        case.check(out, order, f"{entry(kind, 8)} m=1")
        case.stage(order)
        m_index = 3 if kind == "residual" else 4  # the GEMV has the MMA entry's arguments without m
        run(kernels[gemv], rows_launch(-(-n_out // 4), k, sms), [a for i, a in enumerate(case.args(1)) if i != m_index])
        sync(gemv)
        one = case.out.download(np.uint16, (ROWS, n_out))
        case.check(one, order, gemv)
        same = np.mean(one[0] == out[0])
        assert same > 0.9, f"{kind}: the MMA row equals the M = 1 GEMV's in only {same:.3f} of the outputs"


# ---- a PDL chain of a layer's projections (clusters + PDL) == the same chain without PDL ----
def test_pdl_chain_matches_serial(dev, mma, sms) -> None:
    from cuda.bindings import driver as cu
    from tests.kernels.gemv_gpu_helpers import create_stream
    from tests.kernels.gpu_helpers import check

    hidden, inter, qkv_n, attn_k, m, tile = 2560, 9728, 6144, 4096, 8, 8
    rng = np.random.default_rng()

    def weight(n: int, k: int) -> Any:
        return dev.array(ref1.random_bf16_bits(rng, (n, k), 0.05))

    w_qkv, w_o, w_gu, w_down = weight(qkv_n, hidden), weight(hidden, attn_k), weight(2 * inter, hidden), weight(hidden, inter)
    norm_w = dev.array(bf16_bits(bf16_round(1.0 + 0.2 * rng.standard_normal(hidden, dtype=np.float32))))
    residual0 = bf16_bits(bf16_round(rng.standard_normal((m, hidden), dtype=np.float32)))
    attn = dev.array(bf16_bits(bf16_round(rng.standard_normal((m, attn_k), dtype=np.float32))))
    residual, qkv, act = dev.alloc(2 * m * hidden), dev.alloc(2 * m * qkv_n), dev.alloc(2 * m * inter)
    stream = create_stream()
    steps = (("residual", w_o, hidden, attn_k, [attn, residual]),
             ("rmsnorm_swiglu", w_gu, inter, hidden, [residual, norm_w, act]),
             ("residual", w_down, hidden, inter, [act, residual]),
             ("rmsnorm", w_qkv, qkv_n, hidden, [residual, norm_w, qkv]))

    def chain(pdl: bool) -> tuple[np.ndarray, np.ndarray]:
        sync("setup")
        residual.upload(residual0)
        qkv.poison()
        act.poison()
        for _ in range(3):
            for kind, w, n, k, middle in steps:
                tail = [("i", m), ("i", n), ("i", k)] + ([] if kind == "residual" else [("f", EPS)])
                launch_mma(mma[entry(kind, tile)], builder_launch(kind, n, k, tile, sms),
                           [("p", w.ptr)] + [("p", b.ptr) for b in middle] + tail, stream=stream, pdl=pdl)
        check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
        return residual.download(np.uint16, m * hidden), qkv.download(np.uint16, m * qkv_n)

    try:
        serial_residual, serial_qkv = chain(pdl=False)
        assert np.isfinite(from_bf16_bits(serial_qkv)).all() and np.isfinite(from_bf16_bits(serial_residual)).all()
        for attempt in range(5):
            pdl_residual, pdl_qkv = chain(pdl=True)
            assert np.array_equal(pdl_residual, serial_residual), f"PDL chain (try {attempt}): residual != serial"
            assert np.array_equal(pdl_qkv, serial_qkv), f"PDL chain (try {attempt}): qkv != serial"
    finally:
        check(cu.cuStreamDestroy(stream), "cuStreamDestroy")

