"""The small-M tensor-core projections of a batched decode step (kernels-src/gemv_mma.cu, docs/kernels-gemv.md
"Small-M MMA entries"): their launch geometry, and the launches the `--gemv v2` projection ops add for seqs >= 2
(one per token-row tile, selected by `when` on `seqs`; seqs = 1 keeps the M = 1 GEMV launch).

Geometry of one projection (a function of its W shape and the SM count only, the same for every tile, so a row is
computed in the same order whatever the batch: the kernel's summation order depends on k and the cluster size):
blocks of MMA_THREADS threads in clusters of `cluster` blocks that split k; grid = `clusters * cluster` blocks;
dynamic shared memory = the block's slice of X (ceil(ceil(k / 32) / cluster) chunks x tile rows x 64 bytes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import ManifestBuildError
from .builder import Builder

if TYPE_CHECKING:
    from .options import BuildOptions

MMA_TILES = (8, 16, 32, 64)  # token rows of the entries kern_mma_*_m8 .. _m64
MMA_THREADS = 256  # 8 warps (kWarps in gemv_mma.cu)
MMA_MAX_CLUSTER = 8  # the portable cluster size
# chunks of 32 k per cluster rank the builder aims at: at most 40 keeps the m64 tile's X slice at 160 KiB
MMA_RANK_CHUNKS = 40
SMEM_LIMIT = 227 * 1024  # dynamic + static shared memory a block may have on sm_90 (opt-in maximum)
SMEM_RESERVED = 1024  # the shared memory the toolchain reserves per block (cuobjdump -res-usage counts it)

KINDS = ("rmsnorm", "residual", "rmsnorm_swiglu")


def mma_entry(kind: str, tile: int) -> str:
    """The entry name of `kind` ("rmsnorm", "residual", "rmsnorm_swiglu") at `tile` token rows."""
    assert kind in KINDS and tile in MMA_TILES, (kind, tile)  # a bug in this builder
    return f"kern_mma_{kind}_m{tile}"


def static_smem(tile: int) -> int:
    """Static shared memory of a `tile` entry (gemv_mma.cu struct Stat: the tile's sums of squares, f32), bytes,
    without SMEM_RESERVED."""
    return tile * 4


def part_bytes(tile: int) -> int:
    """The round partials a `tile` entry keeps after its X slice (gemv_mma.cu part_bytes): two buffers of 8 warps x
    16 W rows x tile f32, bytes."""
    return 2 * 8 * 16 * tile * 4


# gemv_mma.cu kRoundChunks: a round's reduction, counted in chunks of a warp's stream
ROUND_CHUNKS = 8


def warps_per_tile(tiles: int, clusters: int, cpr: int) -> int:
    """Warps per tile P of the kernel (gemv_mma.cu warps_per_tile, mirrored): the P of 1, 2, 4, 8 with the least
    ceil(tiles / (clusters * 8 / P)) * (ceil(cpr / P) + ROUND_CHUNKS), the smallest on a tie. `cpr`: a rank's
    chunks of 32 k. A function of the shape and the grid, never of m: what makes every tile entry sum a row in the
    same order."""
    best, best_cost = 1, None
    for p in (1, 2, 4, 8):
        cost = -(-tiles // (clusters * (8 // p))) * (-(-cpr // p) + ROUND_CHUNKS)
        if best_cost is None or cost < best_cost:
            best, best_cost = p, cost
    return best


def mma_cluster(k: int) -> int:
    """Blocks per cluster (split of k) for a projection of depth `k`: the smallest power of two <= 8 giving each
    rank at most MMA_RANK_CHUNKS chunks of 32 (Qwen3-4B: k 2560 -> 2, 4096 -> 4, 9728 -> 8); 8 past that."""
    cluster = 1
    while cluster < MMA_MAX_CLUSTER and rank_chunks(k, cluster) > MMA_RANK_CHUNKS:
        cluster *= 2
    return cluster


def rank_chunks(k: int, cluster: int) -> int:
    """Chunks of 32 k a cluster rank owns (gemv_mma.cu cpr): ceil(ceil(k / 32) / cluster)."""
    return -(-(-(-k // 32)) // cluster)


def x_slice_bytes(k: int, cluster: int, tile: int) -> int:
    """Dynamic shared memory of one block: its X slice, rank_chunks x tile rows x 64 B."""
    return rank_chunks(k, cluster) * tile * 64


def dynamic_smem(k: int, cluster: int, tile: int) -> int:
    """Dynamic shared memory of one block of the `tile` entry: x_slice_bytes, then part_bytes or, where larger, the
    norm weight's slice (rank_chunks x 64 B, which the prologue keeps where the partials go later)."""
    return x_slice_bytes(k, cluster, tile) + max(rank_chunks(k, cluster) * 64, part_bytes(tile))


def resident_clusters(cluster: int, sms: int) -> int:
    """Clusters of `cluster` one-block-per-SM blocks the builder assumes the GPU runs at once: sms // cluster for
    clusters of 1 or 2 (a TPC holds 2 SMs), else floor(15 sms / (16 cluster)): a GPC holds whole clusters, and not
    every GPC's SM count is a multiple of 4 or 8. The H200's driver (cuOccupancyMaxActiveClusters, bench/gemv.py
    --mma, docs/perf.md "Twenty-third session") runs 30 clusters of 4 and 15 of 8 of its 132 SMs, which this
    gives; the earlier whole-16-SM rule (32 and 16) put 2 clusters of 4 and 1 of 8 into a second wave, twice the
    time for their tiles. Elsewhere it errs low (a few idle SMs) rather than high (a second wave)."""
    if cluster <= 2:
        return max(1, sms // cluster)
    return max(1, (15 * sms) // (16 * cluster))


@dataclass(frozen=True)
class MmaGeometry:
    """One projection's MMA launch shape: `tiles` W-row tiles (16 rows; SwiGLU 8 outputs), `cluster` blocks per
    cluster, `grid` blocks (a multiple of `cluster`)."""

    tiles: int
    cluster: int
    grid: int

    def shared_mem(self, k: int, tile: int) -> int:
        """Dynamic shared memory (bytes) of the `tile` entry at depth `k`: its X slice, then the round partials."""
        return dynamic_smem(k, self.cluster, tile)

    def warps_per_tile(self, k: int) -> int:
        """The kernel's warps per tile at depth `k` on this grid (warps_per_tile)."""
        return warps_per_tile(self.tiles, self.grid // self.cluster, rank_chunks(k, self.cluster))


def mma_geometry(rows: int, k: int, sms: int, swiglu: bool = False) -> MmaGeometry:
    """The geometry of a projection with `rows` outputs per token row (n; SwiGLU: inter) over depth `k` on `sms`
    SMs: tiles = ceil(rows / 16) (SwiGLU: ceil(inter / 8)), cluster = mma_cluster(k), clusters =
    min(tiles, resident_clusters(cluster, sms)); tiles are dealt to clusters round-robin in the kernel."""
    tiles = -(-rows // (8 if swiglu else 16))
    cluster = mma_cluster(k)
    return MmaGeometry(tiles, cluster, min(tiles, resident_clusters(cluster, sms)) * cluster)


def seqs_buckets(seqs_max: int, first: int = 2) -> list[tuple[int, int, int]]:
    """(lo, hi, tile) of the MMA launches for seqs first..seqs_max (first 1 or 2): [first, 8] -> 8, [9, 16] -> 16,
    [17, 32] -> 32, [33, 64] -> 64, the last one cut at seqs_max; empty when seqs_max < first."""
    out, lo = [], first
    for tile in MMA_TILES:
        hi = min(tile, seqs_max)
        if lo <= hi:
            out.append((lo, hi, tile))
        lo = tile + 1
    return out


def mma_launches(b: Builder, kind: str, rows: int, k: int, args: list[dict[str, Any]], opts: BuildOptions,
                 tail: tuple[dict[str, Any], ...] = (), lo: int = 2) -> list[dict[str, Any]]:
    """The MMA launches of one projection op for seqs lo..opts.seqs_max (`lo` 2, or 1 for the batch-invariant
    MMA decode), each with `when: {"seqs": [lo, hi]}`:
    wiring `args` (pointers), then m = the `seqs` var, then rows and k, then `tail` (eps); grid, cluster and
    shared memory from mma_geometry (opts.sms), `pdl` as opts.pdl. Raises ManifestBuildError when k is not a multiple of 8 or a
    tile's shared memory passes the per-block limit."""
    if k % 8:
        raise ManifestBuildError(f"kern_mma_{kind}: k = {k} is not a multiple of 8 (the 16-byte loads need it); "
                                 f"seqs_max (--seqs-max) {opts.seqs_max} needs --seqs-max 1 or --decode gemm")
    geo = mma_geometry(rows, k, opts.sms, swiglu=kind == "rmsnorm_swiglu")
    launches = []
    for first, hi, tile in seqs_buckets(opts.seqs_max, lo):
        smem = geo.shared_mem(k, tile)
        if smem + static_smem(tile) + SMEM_RESERVED > SMEM_LIMIT:
            raise ManifestBuildError(
                f"seqs_max (--seqs-max) {opts.seqs_max}: kern_mma_{kind}_m{tile} at k = {k} needs {smem} bytes of X "
                f"slice and partials (cluster {geo.cluster}) + {static_smem(tile) + SMEM_RESERVED} static, more "
                f"than the {SMEM_LIMIT} a block may have; use a smaller --seqs-max or --decode gemm")
        launch = b.launch(mma_entry(kind, tile), [geo.grid, 1, 1], [MMA_THREADS, 1, 1],
                          [*args, {"expr": "seqs", "type": "i32"}, {"i32": rows}, {"i32": k}, *tail],
                          shared_mem=smem, pdl=opts.pdl)
        if geo.cluster > 1:
            launch["cluster"] = [geo.cluster, 1, 1]
        launch["when"] = {"seqs": [first, hi]}
        launches.append(launch)
    return launches


def with_mma(b: Builder, bs1: dict[str, Any], kind: str, rows: int, k: int, args: list[dict[str, Any]],
             opts: BuildOptions, tail: tuple[dict[str, Any], ...] = ()) -> list[dict[str, Any]]:
    """An op's launches: `bs1` (the M = 1 GEMV launch) alone when seqs_max is 1 (unchanged, no `when`), else `bs1`
    under `when: {"seqs": [1, 1]}` followed by mma_launches."""
    if opts.seqs_max == 1:
        return [bs1]
    return [{**bs1, "when": {"seqs": [1, 1]}}, *mma_launches(b, kind, rows, k, args, opts, tail)]
