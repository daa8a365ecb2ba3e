"""GPU tests of the multi-row rows-family entries (kernels-src/gemv.cu "Multi-row rows family", contract
docs/kernels-gemv.md "Multi-row rows entries"): kern_gemv_rows_rmsnorm_mN, kern_gemv_rmsnorm_swiglu_mN,
kern_gemv_rows_residual_mN for N = 2, 4, 8 and every m = 1..N: row s of the output is bit for bit the M = 1 entry's
output for input row s alone at the same block size (the M = 1 launch of tests/kernels/test_gemv_rows_gpu.py), each
M = 1 output within that file's float64 bound, and rows m..N-1 of the output untouched (poison). The Qwen3-4B
shapes (qkv 6144 x 2560, gate_up 9728 x 2560, o 2560 x 4096, down 2560 x 9728) and small odd ones (the element
path: k not a multiple of 8). The _mN launch uses the builder's grid (kern_run.models.qwen3.rows_m).
Also the lm_head's multi-row v1 entry kern_gemv_rmsnorm_mN (kernels-src/gemv.cu "Multi-row v1 RMSNorm entry"):
row s bit for bit kern_gemv_rmsnorm on residual row s alone (its own buffer) at the M = 1 launch (block 512, grid
min(n, 2 SMs)), at the Qwen3-4B lm_head 151936 x 2560 and small odd shapes; row 0's M = 1 output within
test_gemv_gpu's float64 bound.
Run on the GPU machine:  KERN_REQUIRE_GPU=1 python -m pytest tests/kernels/test_gemv_rows_m_gpu.py -q
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


from test_gemv_gpu import EPS, NAN_BITS, Case, Launch, default_launch, run, sync  # noqa: E402
from test_gemv_rows_gpu import SWIGLU, SwigluCase, rows_launch  # noqa: E402
from tools import reference_gemv as ref  # noqa: E402
from tools.reference_kernels import bf16_bits, bf16_round  # noqa: E402

TILES = (2, 4, 8)
# entry stem -> (M = 1 entry, twin of test_gemv_gpu.Case or None for swiglu, outputs per group, kind)
STEMS = {
    "kern_gemv_rows_rmsnorm": ("kern_gemv_rows_rmsnorm", "kern_gemv_rmsnorm", 4, "rmsnorm"),
    "kern_gemv_rows_residual": ("kern_gemv_rows_residual", "kern_gemv_residual", 4, "residual"),
    "kern_gemv_rmsnorm_swiglu": (SWIGLU, None, 2, "rmsnorm_swiglu"),
}
SHAPES = {  # stem -> [(n (swiglu: inter), k)]: the 4B shapes, then small odd ones
    "kern_gemv_rows_rmsnorm": [(6144, 2560), (37, 1001), (333, 520)],
    "kern_gemv_rows_residual": [(2560, 4096), (2560, 9728), (37, 1001), (333, 520)],
    "kern_gemv_rmsnorm_swiglu": [(9728, 2560), (37, 1001), (333, 520)],
}
CASES = [(stem, n, k) for stem, shapes in SHAPES.items() for n, k in shapes]
V1 = "kern_gemv_rmsnorm"  # the lm_head's M = 1 entry (v1: a warp per W row)
V1_SHAPES = [(151936, 2560), (37, 1001), (333, 520)]


def _renorm(case: Case, norm_w: np.ndarray, norm_w_dev: Any) -> None:
    """Give an RMSNorm Case another norm_w (the multi-row entries share one): x, its near-tie mask and the float64
    projection recomputed as Case.__init__ does."""
    case.norm_w, case.norm_w_dev = norm_w, norm_w_dev
    case.x = ref.rmsnorm_x(case.src, norm_w, EPS)
    r = case.src.astype(np.float64)
    inner = r / np.sqrt(np.mean(r * r) + EPS)
    lo, hi = (bf16_round((inner * (1 + d)).astype(np.float32)) for d in (-(2.0**-16), 2.0**-16))
    case.x_tie = np.where(lo != hi, np.abs(case.x), 0.0)
    case.dot, case.dot_abs = ref.gemv_f64(case.w_bits, case.x)
    case.tie_abs = ref.gemv_f64(case.w_bits, case.x_tie)[1]


class Rows:
    """TILES[-1] independent single-row cases over one W (shared norm_w), their M = 1 outputs (checked against
    float64), and the stacked inputs [rows, k] on the device."""

    def __init__(self, dev: Any, kernels: dict[str, Any], sms: int, stem: str, n: int, k: int) -> None:
        m1, twin, per_group, _ = STEMS[stem]
        self.dev, self.stem, self.n, self.k = dev, stem, n, k
        self.launch1 = rows_launch(-(-n // per_group), k, sms)
        rng = np.random.default_rng(n * 7919 + k)
        rows = TILES[-1]
        if twin is None:
            self.cases = [SwigluCase(dev, rng, n, k)]
            w_bits = self.cases[0].w_bits
            for _ in range(rows - 1):
                c = SwigluCase(dev, rng, n, k, w_bits=w_bits)
                c.norm_w, c.norm_w_dev = self.cases[0].norm_w, self.cases[0].norm_w_dev
                c.act_ref, c.dot, c.dot_abs = ref.rmsnorm_swiglu(w_bits, c.residual, c.norm_w, EPS)
                self.cases.append(c)
            self.src = np.stack([c.residual for c in self.cases])
            self.out1 = []
            for s, c in enumerate(self.cases):
                out = c.run(kernels[m1], self.launch1)
                c.check_f64(out, f"{m1} inter={n} k={k} row {s}")
                self.out1.append(out)
        else:
            first = Case(dev, rng, twin, n, k)
            self.cases = [first] + [Case(dev, rng, twin, n, k, w_bits=first.w_bits) for _ in range(rows - 1)]
            if twin == "kern_gemv_rmsnorm":
                for c in self.cases[1:]:
                    _renorm(c, first.norm_w, first.norm_w_dev)
            self.src = np.stack([c.src for c in self.cases])
            self.out1 = []
            for c in self.cases:
                out = c.run(kernels[m1], self.launch1)
                c.check(out)
                self.out1.append(out)
        self.src_dev = dev.array(bf16_bits(self.src))  # [rows, k]
        self.out = dev.alloc(2 * rows * n)  # [rows, n]

    def run_m(self, kernels: dict[str, Any], sms: int, tile: int, m: int) -> np.ndarray:
        """The _m{tile} entry over rows 0..m-1 (outputs: poison; the residual entry: rows < m the cases'
        residuals, rows >= m poison) -> [tile, n] bits."""
        from kern_run.models.qwen3 import rows_m

        kind = STEMS[self.stem][3]
        n, k, c0 = self.n, self.k, self.cases[0]
        self.out.poison()
        if kind == "residual":
            init = np.full((tile, n), NAN_BITS, dtype=np.uint16)
            for s in range(m):
                init[s] = bf16_bits(self.cases[s].residual)
            self.out.upload(init)
        per_block = tile * 16 * (-(-k // 8)) + rows_m.static_smem(kind, tile) + rows_m.SMEM_RESERVED
        per_sm = max(1, min(rows_m.THREADS_PER_SM_M[tile] // self.launch1.block, rows_m.SMEM_PER_SM // per_block))
        launch = Launch(grid=min(-(-n // STEMS[self.stem][2]), per_sm * sms), block=self.launch1.block,
                        smem_bytes=tile * 16 * (-(-k // 8)))
        if kind == "residual":
            args = [("p", c0.w.ptr), ("p", self.src_dev.ptr), ("p", self.out.ptr), ("i", n), ("i", k), ("i", m)]
        else:
            args = [("p", c0.w.ptr), ("p", self.src_dev.ptr), ("p", c0.norm_w_dev.ptr), ("p", self.out.ptr),
                    ("i", n), ("i", k), ("f", EPS), ("i", m)]
        entry = f"{self.stem}_m{tile}"
        run(kernels[entry], launch, args)
        sync(entry)
        return self.out.download(np.uint16, tile * n).reshape(tile, n)


@pytest.mark.parametrize(("stem", "n", "k"), CASES)
def test_every_row_is_the_m1_entrys_bits_and_rows_past_m_are_untouched(dev, kernels, sms, stem: str, n: int,
                                                                       k: int) -> None:
    rows = Rows(dev, kernels, sms, stem, n, k)  # device buffers live for one test (the dev fixture frees them)
    for tile in TILES:
        for m in range(1, tile + 1):
            out = rows.run_m(kernels, sms, tile, m)
            for s in range(m):
                bad = np.flatnonzero(out[s] != rows.out1[s])
                assert bad.size == 0, (f"{stem}_m{tile} m={m} n={n} k={k}: row {s} != the M = 1 entry at "
                                       f"{bad[:8].tolist()}")
            assert (out[m:] == NAN_BITS).all(), f"{stem}_m{tile} m={m} n={n} k={k}: rows >= m written"


@pytest.mark.parametrize("stem", (*STEMS, V1))
@pytest.mark.parametrize("bad", ["m0", "m_over", "short_smem", "partial_warp"])
def test_a_bad_launch_writes_nothing(dev, kernels, stem: str, bad: str) -> None:
    n, k, tile = 64, 2560, 4
    m = {"m0": 0, "m_over": tile + 1}.get(bad, tile)
    smem = tile * 16 * (k // 8) - (16 if bad == "short_smem" else 0)
    block = 100 if bad == "partial_warp" else 96
    src, norm_w, w = dev.array(np.zeros((tile + 1) * k, np.uint16)), dev.array(np.zeros(k, np.uint16)), \
        dev.array(np.zeros(2 * n * k, np.uint16))
    out = dev.alloc(2 * (tile + 1) * n)
    out.poison()
    if stem != V1 and STEMS[stem][3] == "residual":
        args = [("p", w.ptr), ("p", src.ptr), ("p", out.ptr), ("i", n), ("i", k), ("i", m)]
    else:
        args = [("p", w.ptr), ("p", src.ptr), ("p", norm_w.ptr), ("p", out.ptr), ("i", n), ("i", k), ("f", EPS),
                ("i", m)]
    run(kernels[f"{stem}_m{tile}"], Launch(grid=8, block=block, smem_bytes=smem), args)
    sync(stem)
    assert (out.download(np.uint16, (tile + 1) * n) == NAN_BITS).all(), f"{stem}_m{tile}: a {bad} launch wrote"


class V1Rows:
    """TILES[-1] residual rows over one W and norm_w, each also in a buffer of its own, and kern_gemv_rmsnorm's
    output for each row alone at the M = 1 launch (row 0's checked against float64)."""

    def __init__(self, dev: Any, kernels: dict[str, Any], sms: int, n: int, k: int) -> None:
        self.n, self.k = n, k
        rng = np.random.default_rng(n * 7919 + k + 1)
        self.first = Case(dev, rng, V1, n, k)  # W, norm_w and residual row 0
        rows = TILES[-1]
        self.src = np.stack([self.first.src] + [bf16_round(3.0 * rng.standard_normal(k, dtype=np.float32))
                                                for _ in range(rows - 1)])  # [rows, k]
        self.launch1 = default_launch(n, k, sms)
        self.out1 = []
        for s in range(rows):
            alone = dev.array(bf16_bits(self.src[s]))
            self.first.out.poison()
            run(kernels[V1], self.launch1, [("p", self.first.w.ptr), ("p", alone.ptr), ("p", self.first.norm_w_dev.ptr),
                                           ("p", self.first.out.ptr), ("i", n), ("i", k), ("f", EPS)])
            sync(V1)
            self.out1.append(self.first.out.download(np.uint16, n))
        self.first.check(self.out1[0])
        self.src_dev = dev.array(bf16_bits(self.src))  # [rows, k]
        self.out = dev.alloc(2 * rows * n)  # [rows, n]

    def run_m(self, kernels: dict[str, Any], sms: int, tile: int, m: int) -> np.ndarray:
        """kern_gemv_rmsnorm_m{tile} over rows 0..m-1 at the builder's grid (rows_m.rows_m_launches), output
        poisoned first -> [tile, n] bits."""
        from kern_run.models.qwen3 import rows_m

        n, k, c0 = self.n, self.k, self.first
        self.out.poison()
        per_block = tile * 16 * (-(-k // 8)) + rows_m.static_smem("rmsnorm", tile, v1=True) + rows_m.SMEM_RESERVED
        per_sm = max(1, min(rows_m.THREADS_PER_SM_V1_M[tile] // self.launch1.block, rows_m.SMEM_PER_SM // per_block))
        launch = Launch(grid=min(n, per_sm * sms), block=self.launch1.block, smem_bytes=tile * 16 * (-(-k // 8)))
        entry = f"{V1}_m{tile}"
        run(kernels[entry], launch, [("p", c0.w.ptr), ("p", self.src_dev.ptr), ("p", c0.norm_w_dev.ptr),
                                     ("p", self.out.ptr), ("i", n), ("i", k), ("f", EPS), ("i", m)])
        sync(entry)
        return self.out.download(np.uint16, tile * n).reshape(tile, n)


@pytest.mark.parametrize(("n", "k"), V1_SHAPES)
def test_every_lm_head_row_is_the_v1_entrys_bits_and_rows_past_m_are_untouched(dev, kernels, sms, n: int,
                                                                               k: int) -> None:
    rows = V1Rows(dev, kernels, sms, n, k)
    assert len({r.tobytes() for r in rows.out1}) == len(rows.out1)  # the rows differ: a mix-up would show
    for tile in TILES:
        for m in range(1, tile + 1):
            out = rows.run_m(kernels, sms, tile, m)
            for s in range(m):
                bad = np.flatnonzero(out[s] != rows.out1[s])
                assert bad.size == 0, (f"{V1}_m{tile} m={m} n={n} k={k}: row {s} != {V1} on the row alone at "
                                       f"{bad[:8].tolist()}")
            assert (out[m:] == NAN_BITS).all(), f"{V1}_m{tile} m={m} n={n} k={k}: rows >= m written"
