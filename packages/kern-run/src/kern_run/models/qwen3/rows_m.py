"""The multi-row projections of a batched decode step (`batch_proj` "rows"; kernels-src/gemv.cu,
docs/kernels-gemv.md "Multi-row rows entries"): the rows-family entries and the v1 `kern_gemv_rmsnorm` (lm_head)
have `_m2` / `_m4` / `_m8` versions; seqs 2 -> `_m2`, 3..4 -> `_m4`, 5..8 -> `_m8`, one launch each with the op's
M = 1 block size (so a row is computed in the M = 1 entry's order, bit for bit), and the grid of the blocks that
fit an SM at once with M rows of x in shared memory."""

from __future__ import annotations

from typing import Any

from ...errors import ManifestBuildError
from .builder import Builder
from .options import BuildOptions

ROWS_TILES = (2, 4, 8)  # x rows of the entries *_m2, *_m4, *_m8
ROWS_TILE_MAX = ROWS_TILES[-1]
# The M = 1 kind (batch_proj/mma KINDS) -> entry stem of the multi-row entry
ROWS_ENTRY = {"rmsnorm": "kern_gemv_rows_rmsnorm", "rmsnorm_swiglu": "kern_gemv_rmsnorm_swiglu",
              "residual": "kern_gemv_rows_residual"}
SMEM_PER_SM = 228 * 1024  # shared memory of an sm_90 SM (the per-block maximum is 227 KiB)
SMEM_LIMIT = 227 * 1024
SMEM_RESERVED = 1024  # reserved by the toolchain per block (cuobjdump -res-usage counts it)
# threads an SM holds at the entries' registers (gemv.cu KERN_GEMV_ROWS_M): _m2 72 -> 896, _m4 / _m8 <= 128 -> 512
THREADS_PER_SM_M = {2: 896, 4: 512, 8: 512}
# The v1 (warp per W row) entry with multi-row versions, the lm_head's: kern_gemv_rmsnorm_m2/_m4/_m8 (gemv.cu
# KERN_GEMV_RMSNORM_M) take 86 registers under __launch_bounds__(512) -> one block of 512 threads per SM.
V1_ENTRY = "kern_gemv_rmsnorm"
THREADS_PER_SM_V1_M = {2: 512, 4: 512, 8: 512}


def static_smem(kind: str, tile: int, v1: bool = False) -> int:
    """Static shared memory of a `tile` entry without SMEM_RESERVED, bytes: red [32][4 tile] and tot [4 tile] f32
    (twice: the vector and the element path each have theirs; none in the v1 entry), and for the RMSNorm kinds
    stage_rmsnorm's block_sum scratch [32] f32 (twice). cuobjdump -res-usage: m8 rmsnorm 9728 = 8704 + 1024,
    kern_gemv_rmsnorm_m8 1280 = 256 + 1024."""
    red = 0 if v1 else 2 * (32 * 4 * tile * 4 + 4 * tile * 4)
    return red + (0 if kind == "residual" else 2 * 32 * 4)


def rows_buckets(lo: int, hi: int) -> list[tuple[int, int, int]]:
    """(lo', hi', tile) covering seqs lo..hi (2 <= lo, hi <= 8): [2, 2] -> 2, [3, 4] -> 4, [5, 8] -> 8, cut to
    [lo, hi]."""
    out, start = [], 2
    for tile in ROWS_TILES:
        a, b = max(lo, start), min(hi, tile)
        if a <= b:
            out.append((a, b, tile))
        start = tile + 1
    return out


def rows_m_launches(b: Builder, bs1: dict[str, Any], kind: str, n_groups: int, k: int, opts: BuildOptions,
                    lo: int, hi: int) -> list[dict[str, Any]]:
    """The `_mM` launches of one projection op for seqs lo..hi (2 <= lo <= hi <= 8), each `when: {"seqs":
    [lo', hi']}`: entry `<bs1's entry>_m<tile>`, the args of `bs1` (the op's M = 1 launch: a rows-family entry of
    `kind`, or V1_ENTRY) followed by m = the `seqs` var, bs1's block, grid = min(n_groups, blocks per SM * SMs) with
    blocks per SM = min(threads per SM // block, SMEM_PER_SM // (tile * 16 * ceil(k / 8) + static + reserved))
    (threads per SM: THREADS_PER_SM_M, V1_ENTRY's THREADS_PER_SM_V1_M), dynamic shared memory tile * 16 * ceil(k /
    8). `n_groups`: the rows entries' groups, V1_ENTRY's W rows (a warp per row). Raises ManifestBuildError when a
    tile's shared memory passes the 227 KiB a block may have."""
    block = bs1["block"][0]
    v1 = bs1["entry"] == V1_ENTRY
    threads = THREADS_PER_SM_V1_M if v1 else THREADS_PER_SM_M
    k8 = -(-k // 8)
    launches = []
    for a, z, tile in rows_buckets(lo, hi):
        entry = f"{bs1['entry']}_m{tile}"
        smem = tile * 16 * k8
        per_block = smem + static_smem(kind, tile, v1) + SMEM_RESERVED
        if per_block > SMEM_LIMIT:
            raise ManifestBuildError(f"batch_proj (--batch-proj) rows: {entry} at k = {k} needs {per_block} bytes of "
                                     f"shared memory, more than the {SMEM_LIMIT} a block may have; use "
                                     "--batch-proj cublaslt")
        per_sm = max(1, min(threads[tile] // block, SMEM_PER_SM // per_block))
        grid = min(n_groups, per_sm * opts.sms)
        launch = b.launch(entry, [grid, 1, 1], [block, 1, 1], [*bs1["args"], {"expr": "seqs", "type": "i32"}],
                          shared_mem=smem, pdl=opts.pdl)
        launch["when"] = {"seqs": [a, z]}
        launches.append(launch)
    return launches
