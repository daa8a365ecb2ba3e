"""Run kernels-src/gemv_mma.cu on the CPU (no GPU) and check it against tools/reference_gemv_mma.py.

The kernel source is compiled with g++ against tools/cpu_emu_mma/ (stand-ins for common.cuh, gemv_mma.cuh and the
CUDA builtins: every thread of a cluster a std::thread, real block / cluster barriers, warp shuffles and mma.sync
m16n8k16 through a per-warp exchange, the fragments laid out as the PTX ISA says), then each case checks: rows < m
against the float64 reference within the GPU tests' bounds (reference_gemv_mma.expected_and_bound); rows >= m of the
output untouched; batch invariance (a row's bits equal at any position, any m, any tile entry, any grid of one
warps per tile); the residual epilogue bit for bit; launches the kernel refuses write nothing. A logic check of the CUDA source (fragment
layout, k split, cluster reduction, pipeline, guards) where no GPU is at hand, not a substitute for
tests/kernels/test_gemv_mma_gpu.py (no memory model, no real warps; rsqrtf is exact here).

    uv run --frozen python -m tools.gemv_mma_cpu_emu [--seed N] [--quick]   # from the repository root; g++ (C++20)

Exit 0 when every check passes, 1 otherwise (the failures are printed), 2 without g++.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from kern_run.models.qwen3.mma import dynamic_smem, mma_cluster, rank_chunks, warps_per_tile
from tools import reference_gemv as ref1
from tools import reference_gemv_mma as ref
from tools.reference_kernels import bf16_bits, bf16_round, from_bf16_bits

REPO = Path(__file__).resolve().parent.parent
ROWS, EPS, THREADS, NAN = 64, 1e-6, 256, 0xFFFF
TILES = (8, 16, 32, 64)


def build(work: Path) -> Path:
    """Copy the source and the stand-ins into `work` and compile the driver; its path."""
    for f in (REPO / "tools" / "cpu_emu_mma").iterdir():
        shutil.copy(f, work / f.name)
    shutil.copy(REPO / "kernels-src" / "gemv_mma.cu", work / "gemv_mma.cu")
    exe = work / "driver"
    subprocess.run(["g++", "-std=c++20", "-O1", "-ffp-contract=off", f"-I{work}", "-x", "c++", str(work / "driver.cpp"),
                    "-o", str(exe), "-lpthread"], check=True)
    return exe


class Emu:
    """One projection's inputs (ROWS candidate rows) and its float64 reference; `run` executes the driver."""

    def __init__(self, exe: Path, work: Path, rng: np.random.Generator, kind: str, n_out: int, k: int):
        self.exe, self.work, self.kind, self.n_out, self.k = exe, work, kind, n_out, k
        n_w = 2 * n_out if kind == "rmsnorm_swiglu" else n_out
        self.w_bits = ref1.random_bf16_bits(rng, (n_w, k), 0.05)
        scale = 1.0 if kind == "residual" else 3.0
        self.src = bf16_round(scale * rng.standard_normal((ROWS, k), dtype=np.float32))
        self.norm_w = bf16_round(1.0 + 0.2 * rng.standard_normal(k, dtype=np.float32))
        self.residual0 = bf16_round(rng.standard_normal((ROWS, n_out), dtype=np.float32))
        self.pad = bf16_round(rng.standard_normal((ROWS, n_out), dtype=np.float32))
        if kind == "residual":
            x, tie = self.src, np.zeros_like(self.src)
        else:
            x = ref.rmsnorm_rows(self.src, self.norm_w, EPS)
            tie = ref.near_tie_x(self.src, x, EPS)
        self.dot, self.dot_abs = ref.gemm_f64(self.w_bits, x)
        self.tie_abs = ref.gemm_f64(self.w_bits, tie)[1]
        (work / "w.bin").write_bytes(self.w_bits.tobytes())
        (work / "norm.bin").write_bytes(bf16_bits(self.norm_w).tobytes())

    def staged(self, order: np.ndarray, zero_residual: bool = False) -> np.ndarray:
        """The output buffer before a launch [ROWS, n_out]: NaN, or (residual) rows `order` then other values."""
        if self.kind != "residual":
            return np.full((ROWS, self.n_out), NAN, dtype=np.uint16)
        out = bf16_bits(self.pad)
        out[: len(order)] = 0 if zero_residual else bf16_bits(self.residual0[order])
        return out

    def run(self, tile: int, order: np.ndarray, cluster: int, clusters: int, threads: int = THREADS,
            smem: int | None = None, zero_residual: bool = False, k_arg: int | None = None) -> np.ndarray:
        """Rows `order` at positions 0..m-1 (NaN inputs after) -> the output bits [ROWS, n_out]."""
        m = len(order)
        src = np.full((ROWS, self.k), NAN, dtype=np.uint16)
        src[:m] = bf16_bits(self.src[order])
        (self.work / "src.bin").write_bytes(src.tobytes())
        (self.work / "out.bin").write_bytes(self.staged(order, zero_residual).tobytes())
        smem = dynamic_smem(self.k, cluster, tile) if smem is None else smem
        k_arg = self.k if k_arg is None else k_arg
        subprocess.run([str(self.exe), self.kind, str(tile), str(m), str(self.n_out), str(k_arg), str(EPS), str(cluster),
                        str(clusters), str(threads), str(smem), str(ROWS), str(self.work)], check=True)
        return np.frombuffer((self.work / "out.bin").read_bytes(), dtype=np.uint16).reshape(ROWS, self.n_out).copy()

    def check(self, out: np.ndarray, order: np.ndarray, what: str) -> list[str]:
        m = len(order)
        fails = []
        untouched = bf16_bits(self.pad)[m:] if self.kind == "residual" else np.full((ROWS - m, self.n_out), NAN, np.uint16)
        if not np.array_equal(out[m:], untouched):
            fails.append(f"{what}: wrote output rows >= m")
        y = from_bf16_bits(out[:m]).astype(np.float64)
        residual = self.residual0[order] if self.kind == "residual" else None
        want, bound = ref.expected_and_bound(self.kind, self.dot[order], self.dot_abs[order], self.tie_abs[order], residual)
        if not np.isfinite(y).all():
            return fails + [f"{what}: non-finite outputs at {np.argwhere(~np.isfinite(y))[:4].tolist()}"]
        bad = np.argwhere(np.abs(y - want) > bound + 1e-30)
        if bad.size:
            fails.append(f"{what}: {len(bad)} outputs outside the bound, first {bad[:4].tolist()}: got "
                         f"{[y[tuple(b)] for b in bad[:3]]} want {[want[tuple(b)] for b in bad[:3]]}")
        return fails


def shape_checks(exe: Path, work: Path, rng: np.random.Generator, kind: str, n_out: int, k: int, cluster: int,
                 ms: tuple[int, ...]) -> list[str]:
    """Reference, untouched rows, invariance over m / tile / position / grid, the residual epilogue exactly."""
    emu = Emu(exe, work, rng, kind, n_out, k)
    tiles_total = -(-n_out // (8 if kind == "rmsnorm_swiglu" else 16))
    fails: list[str] = []
    full_order = np.arange(ROWS)
    cpr = rank_chunks(k, cluster)
    fulls: dict[int, np.ndarray] = {}  # warps per tile -> the 64-row batch on a grid of that P

    def full(clusters: int) -> np.ndarray:
        p = warps_per_tile(tiles_total, clusters, cpr)
        if p not in fulls:
            fulls[p] = emu.run(64, full_order, cluster, clusters)
            fails.extend(emu.check(fulls[p], full_order, f"{kind} {n_out}x{k} c{cluster} m=64 t64 P{p}"))
        return fulls[p]

    full(3)
    for m in ms:
        for tile in (t for t in TILES if t >= m):
            order = rng.permutation(ROWS)[:m]
            what = f"{kind} {n_out}x{k} c{cluster} m={m} t{tile}"
            clusters = int(rng.choice([1, 2, tiles_total + 1]))
            out = emu.run(tile, order, cluster, clusters)
            fails += emu.check(out, order, what)
            if not np.array_equal(out[:m], full(clusters)[order]):
                fails.append(f"{what} ({clusters} clusters): rows differ from the 64-row batch (batch invariance)")
            if kind == "residual":
                p = from_bf16_bits(emu.run(tile, order, cluster, clusters, zero_residual=True)[:m])
                if not np.array_equal(out[:m], bf16_bits(ref.residual_add(emu.residual0[order], p))):
                    fails.append(f"{what}: residual != bf16(r + bf16(W.x))")
    return fails


def refusal_checks(exe: Path, work: Path, rng: np.random.Generator) -> list[str]:
    """A block that is not 256 threads, too little dynamic shared memory, k % 8 != 0, m > tile, m = 0: nothing written."""
    fails = []
    for kind in ("rmsnorm", "residual", "rmsnorm_swiglu"):
        emu = Emu(exe, work, rng, kind, 24, 256)
        for label, m, kwargs in (("block 128", 4, {"threads": 128}),
                                 ("short smem", 4, {"smem": dynamic_smem(256, 1, 8) - 16}),
                                 ("k % 8", 4, {"k_arg": 252}), ("m > tile", 9, {}), ("m = 0", 0, {})):
            order = np.arange(m)
            if not np.array_equal(emu.run(8, order, 1, 2, **kwargs), emu.staged(order)):
                fails.append(f"{kind}: a launch with {label} wrote")
    return fails


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="fewer shapes (the CPU test's subset)")
    opts = parser.parse_args(argv)
    if shutil.which("g++") is None:
        print("g++ not found", file=sys.stderr)
        return 2
    rng = np.random.default_rng(opts.seed)
    fails: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        exe = build(work)
        # (kind, n_out, k, cluster, m values): odd n / inter, k not a multiple of 32, several batches per tile
        # (k = 2592 with one rank: 81 chunks, 11 per warp, 3 register slots), partial last ranks (k = 2600, c4 / c8)
        shapes = [(kind, 45, 104, c, (1, 3, 9, 33)) for kind in ("rmsnorm", "residual", "rmsnorm_swiglu") for c in (1, 2)]
        # one or two tiles over 17 chunks: 8 and 4 warps per tile on one cluster (warps_per_tile), 2 / 1 on more
        shapes += [(kind, n, 520, 1, (2, 17)) for kind in ("rmsnorm", "residual") for n in (13, 24)]
        shapes += [("rmsnorm_swiglu", n, 520, 1, (5,)) for n in (5, 13)]
        if not opts.quick:
            shapes += [(kind, 37, 2592, 1, (2, 17)) for kind in ("rmsnorm", "residual", "rmsnorm_swiglu")]
            shapes += [(kind, 29, 2600, c, (5, 40)) for kind in ("rmsnorm", "residual") for c in (4, 8)]
            shapes += [("rmsnorm_swiglu", 21, 2600, 8, (7,)), ("rmsnorm", 333, 520, mma_cluster(520), (16,))]
        for kind, n_out, k, cluster, ms in shapes:
            got = shape_checks(exe, work, rng, kind, n_out, k, cluster, ms)
            print(f"{kind:15s} {n_out}x{k} cluster {cluster}: {'ok' if not got else f'{len(got)} failures'}")
            fails += got
        got = refusal_checks(exe, work, rng)
        print(f"refused launches: {'ok' if not got else f'{len(got)} failures'}")
        fails += got
    for f in fails:
        print("FAIL", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
