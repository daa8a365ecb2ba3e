"""GPU tests of the skinny wgmma GEMM (kernels-src/gemm_skinny.cu: kern_gemm_skinny_n128 / _n256), launched as
kern_run.models.qwen3.skinny lays them out (grid = resident blocks splitting the units, 256 threads, its shared
memory), at the Qwen3-4B projection shapes and at ragged small ones (n not a multiple of the tile, k not of 64,
fewer units than SMs).

Reference: float64 products of the same bf16 inputs. Bound per output element: |y - ref| <= 2^-8 |ref| (the bf16
rounding of the output) + 2^-14 sum_j |a_j w_j| (fp32 tensor-core accumulation); swiglu (c = bf16(silu(bf16 g)) *
bf16 u): 2^-6 |ref| + 2^-12 max |ref| (four bf16 roundings, the gate's and the up value's of sums whose split order
differs from the float64 reference's).
Every run fills the output with NaN bits and checks the rows >= m untouched. Batch invariance: row r at m = 1, 2,
17 equals row r at m = 64 bit for bit; two launches give the same bits (the split partials are summed in block order
whoever arrives last); the tickets are all back to zero after every launch. A launch the kernel refuses (m = 0, m
= 65, n % 8 != 0) writes nothing. PDL: the norm -> gate_up + SiLU-mul -> down chain with PDL equals it without.
Run on the GPU machine:  KERN_REQUIRE_GPU=1 python -m pytest tests/kernels/test_gemm_skinny_gpu.py -q
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from kern_run.models.qwen3.skinny import SKINNY_THREADS, skinny_geometry  # noqa: E402
from test_gemv_gpu import NAN_BITS, sync  # noqa: E402
from tools.reference_kernels import bf16_bits, from_bf16_bits  # noqa: E402
ROWS = 64
SHAPES = [  # (n weight rows, k, swiglu, blocks, bn)
    (6144, 2560, False, 132, 128),   # qkv
    (2560, 4096, False, 132, 128),   # o
    (2560, 9728, False, 132, 128),   # down
    (19456, 2560, True, 132, 128),   # gate_up with the SiLU-mul
    (2560, 4096, False, 132, 256),
    (19456, 2560, True, 132, 256),
    (200, 72, False, 132, 128),      # one tile, two k chunks: fewer units than blocks
    (392, 584, False, 5, 128),       # ragged n and k, 5 blocks splitting 4 tiles x 10 chunks
    (784, 1000, True, 7, 256),       # ragged, swiglu, bn 256
]


class Case:
    def __init__(self, dev, rng, n: int, k: int, swiglu: bool, blocks: int, bn: int):
        self.n, self.k, self.swiglu = n, k, swiglu
        self.geo = skinny_geometry(n, k, blocks, swiglu, bn)
        self.n_out = self.geo.n_out
        self.a_f = from_bf16_bits(bf16_bits(rng.standard_normal((ROWS, k)).astype(np.float32)))
        self.w_f = from_bf16_bits(bf16_bits((rng.standard_normal((n, k)) * 0.05).astype(np.float32)))
        self.a = dev.array(bf16_bits(self.a_f))
        self.w = dev.array(bf16_bits(self.w_f))
        self.c = dev.alloc(ROWS * self.n_out * 2)
        self.ws = dev.alloc(self.geo.ws_bytes)
        self.tickets = dev.array(np.zeros(self.geo.tickets, dtype=np.uint32))
        self.kernel = dev.kernel(self.geo.entry)
        prod = self.a_f.astype(np.float64) @ self.w_f.astype(np.float64).T
        self.abs_sum = np.abs(self.a_f.astype(np.float64)) @ np.abs(self.w_f.astype(np.float64)).T
        if swiglu:
            inter = n // 2
            g = from_bf16_bits(bf16_bits(prod[:, :inter].astype(np.float32))).astype(np.float64)
            u = from_bf16_bits(bf16_bits(prod[:, inter:].astype(np.float32))).astype(np.float64)
            self.ref = g / (1.0 + np.exp(-g)) * u
        else:
            self.ref = prod

    def run(self, m: int, n: int | None = None) -> np.ndarray:
        """Poison c, launch at m rows (n: the n argument, default the case's), sync -> c [ROWS, n_out] bits."""
        self.c.poison()
        args = [("p", self.a.ptr), ("p", self.w.ptr), ("p", self.c.ptr), ("p", self.ws.ptr), ("p", self.tickets.ptr),
                ("i", m), ("i", self.n if n is None else n), ("i", self.k), ("i", int(self.swiglu))]
        self.kernel.launch((self.geo.blocks,), (SKINNY_THREADS,), args, sync=False, shared_mem=self.geo.shared_mem)
        sync(self.geo.entry)
        return self.c.download(np.uint16, (ROWS, self.n_out))

    def check(self, bits: np.ndarray, m: int) -> None:
        assert (bits[m:] == NAN_BITS).all(), f"rows >= m={m} written"
        y = from_bf16_bits(bits[:m]).astype(np.float64)
        ref = self.ref[:m]
        if self.swiglu:
            bound = 2.0**-6 * np.abs(ref) + 2.0**-12 * np.abs(self.ref).max()
        else:
            bound = 2.0**-8 * np.abs(ref) + 2.0**-14 * self.abs_sum[:m]
        err = np.abs(y - ref)
        bad = np.argwhere(~(err <= bound))
        assert bad.size == 0, (f"{len(bad)} elements out of bound, first at (row, col) {tuple(bad[0])}: "
                               f"{y[tuple(bad[0])]} vs {ref[tuple(bad[0])]}")
        tickets = self.tickets.download(np.uint32, self.geo.tickets)
        assert not tickets.any(), f"tickets not back to zero: {np.flatnonzero(tickets)[:8]}"


@pytest.mark.parametrize("n,k,swiglu,blocks,bn", SHAPES)
def test_values_invariance_determinism(dev, n, k, swiglu, blocks, bn):
    case = Case(dev, np.random.default_rng(n * 7 + k), n, k, swiglu, blocks, bn)
    full = case.run(64)
    case.check(full, 64)
    assert np.array_equal(case.run(64), full), "a second launch gave other bits"
    for m in (1, 2, 17):
        bits = case.run(m)
        case.check(bits, m)
        assert np.array_equal(bits[:m], full[:m]), f"rows at m={m} differ from the same rows at m=64"


@pytest.mark.parametrize("m,n", [(0, None), (65, None), (8, 2564)])
def test_refused_launch_writes_nothing(dev, m, n):
    case = Case(dev, np.random.default_rng(1), 2560, 4096, False, 132, 128)
    bits = case.run(m, n)
    assert (bits == NAN_BITS).all(), f"a refused launch (m={m}, n={n}) wrote its output"


def test_pdl_chain_matches_serial(dev) -> None:
    """The decode's MLP chain with PDL (every launch waits for its predecessor): kern_add_rmsnorm -> skinny gate_up
    with the SiLU-mul -> skinny down, three times over the same buffers at 8 rows, bit for bit the chain without
    PDL. The skinny kernel copies weights before its wait and reads its inputs after it, and kern_add_rmsnorm
    waits before it reads the down output (this session's PDL launches of the norms)."""
    from cuda.bindings import driver as cu
    from tests.kernels.gemv_gpu_helpers import assert_pdl_chain_matches_serial, create_stream, launch
    from tests.kernels.gpu_helpers import check

    rng = np.random.default_rng(5)
    m, hidden, inter, eps = 8, 2560, 9728, 1e-6

    def bf16_array(shape, scale):
        return bf16_bits((rng.standard_normal(shape) * scale).astype(np.float32))

    gu_geo = skinny_geometry(2 * inter, hidden, 132, True)
    down_geo = skinny_geometry(hidden, inter, 132, False)
    w_gu, w_down = dev.array(bf16_array((2 * inter, hidden), 0.02)), dev.array(bf16_array((hidden, inter), 0.02))
    norm_w = dev.array(bf16_bits((1.0 + 0.2 * rng.standard_normal(hidden)).astype(np.float32)))
    residual0, hidden0 = bf16_array((m, hidden), 3.0), bf16_array((m, hidden), 1.0)
    residual, delta = dev.alloc(m * hidden * 2), dev.alloc(m * hidden * 2)
    normed, act = dev.alloc(m * hidden * 2), dev.alloc(m * inter * 2)
    ws = dev.alloc(max(gu_geo.ws_bytes, down_geo.ws_bytes))
    tickets = dev.array(np.zeros(max(gu_geo.tickets, down_geo.tickets), dtype=np.uint32))
    norm = dev.kernel("kern_add_rmsnorm")
    stream = create_stream()

    def skinny(geo, a, w, c, n, k, swiglu, pdl):
        launch(dev.kernel(geo.entry), geo.blocks, SKINNY_THREADS, geo.shared_mem,
               [("p", a.ptr), ("p", w.ptr), ("p", c.ptr), ("p", ws.ptr), ("p", tickets.ptr), ("i", m), ("i", n),
                ("i", k), ("i", int(swiglu))], stream=stream, pdl=pdl)

    def chain(pdl: bool) -> tuple[np.ndarray, np.ndarray]:
        sync("setup")
        residual.upload(residual0)
        delta.upload(hidden0)
        normed.poison()
        act.poison()
        for _ in range(3):
            launch(norm, m, 256, 0, [("p", residual.ptr), ("p", delta.ptr), ("p", norm_w.ptr), ("p", normed.ptr),
                                     ("i", m), ("i", hidden), ("f", eps)], stream=stream, pdl=pdl)
            skinny(gu_geo, normed, w_gu, act, 2 * inter, hidden, True, pdl)
            skinny(down_geo, act, w_down, delta, hidden, inter, False, pdl)
        check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
        assert not tickets.download(np.uint32, tickets.nbytes // 4).any(), "tickets not back to zero"
        return residual.download(np.uint16, m * hidden), delta.download(np.uint16, m * hidden)

    assert_pdl_chain_matches_serial(chain, stream)
