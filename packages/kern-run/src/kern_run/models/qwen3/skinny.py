"""The skinny wgmma GEMM of a batched decode (kernels-src/gemm_skinny.cu): its launch geometry and the host mirror of
its Stream-K schedule.

c[m, n] = a[m, k] @ w[n, k]^T for 1 <= m <= 64 on one launch shape for every m (the MMA's 64 rows are the token
rows), so a row gets the same bits at every batch size. Work unit u = (tile u // kc, k chunk u % kc) of
`kc = cdiv(k, 64)` chunks a tile; block b of `blocks` takes units [b U // blocks, (b + 1) U // blocks). A tile
covered by one block is stored by it; else its contributors' fp32 partials (slot 0: the tile of a block's first
unit, slot 1: of its last) are summed in block order, each contributor whose range ends in the tile summing a share
of its elements once all partials are in (`reducers`). `schedule` is what the kernel computes on the device, so the
CPU tests check its invariants (every unit once, at most two partial slots a block, the same decomposition at every
m) without a GPU.

Source of the decomposition: Osama et al., "Stream-K: Work-centric Parallel Decomposition for Dense Matrix-Matrix
Multiplication on the GPU" (PPoPP 2023), the "data-parallel + one-tile fixup" form without its hybrid tail.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ManifestBuildError

SKINNY_M_MAX = 64   # token rows a launch serves (the wgmma M)
SKINNY_BK = 64      # k elements a work unit
SKINNY_THREADS = 256
# dynamic shared memory bytes per tile width (kernels-src/gemm_skinny.cu SkGeo::SMEM: stages x (BN x 128 + 8 KiB)
# + 1 KiB alignment slack)
SKINNY_SMEM = {128: 197632, 256: 205824}
SKINNY_ENTRY = {128: "kern_gemm_skinny_n128", 256: "kern_gemm_skinny_n256"}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class SkinnyGeometry:
    """One skinny GEMM launch: `bn` weight rows a tile, `blocks` resident blocks (grid.x), and the work it splits.

    n: weight rows (output columns; with swiglu the fused gate_up rows, 2 x inter); k: the reduction length
    (elements); tiles, kc, units: output tiles, k chunks a tile, tiles x kc."""

    n: int
    k: int
    bn: int
    blocks: int
    swiglu: bool

    @property
    def n_out(self) -> int:
        """Output columns: n, or inter = n / 2 with swiglu."""
        return self.n // 2 if self.swiglu else self.n

    @property
    def tile_cols(self) -> int:
        return self.bn // 2 if self.swiglu else self.bn

    @property
    def tiles(self) -> int:
        return cdiv(self.n_out, self.tile_cols)

    @property
    def kc(self) -> int:
        return cdiv(self.k, SKINNY_BK)

    @property
    def units(self) -> int:
        return self.tiles * self.kc

    @property
    def entry(self) -> str:
        return SKINNY_ENTRY[self.bn]

    @property
    def shared_mem(self) -> int:
        return SKINNY_SMEM[self.bn]

    @property
    def ws_bytes(self) -> int:
        """The split partials: 2 slots a block of 64 x bn fp32 (bytes)."""
        return 2 * self.blocks * SKINNY_M_MAX * self.bn * 4

    @property
    def tickets(self) -> int:
        """u32 tickets: two a tile (partials in, reducers done)."""
        return 2 * self.tiles

    def block_range(self, b: int) -> tuple[int, int]:
        """Units [begin, end) of block b."""
        return b * self.units // self.blocks, (b + 1) * self.units // self.blocks

    def owner(self, u: int) -> int:
        """The block whose range holds unit u: the largest b with b U // blocks <= u (the kernel's sk_owner)."""
        return ((u + 1) * self.blocks - 1) // self.units


def skinny_geometry(n: int, k: int, sms: int, swiglu: bool = False, bn: int = 128) -> SkinnyGeometry:
    """The launch of an (n, k) projection on `sms` SMs: tile width `bn`, blocks = min(sms, units) (one block an SM:
    the kernel's shared memory leaves room for no second). Raises ManifestBuildError for sizes the kernel refuses
    (n % 8, with swiglu n % 16, k % 8) or a bn it lacks."""
    if bn not in SKINNY_SMEM:
        raise ManifestBuildError(f"skinny GEMM: tile width {bn} is not one of {sorted(SKINNY_SMEM)}")
    if n <= 0 or k <= 0 or n % (16 if swiglu else 8) or k % 8:
        raise ManifestBuildError(f"skinny GEMM {n}x{k}: needs n % {16 if swiglu else 8} == 0 and k % 8 == 0 "
                                 "(16-byte copies of whole rows)")
    if sms < 1:
        raise ManifestBuildError(f"skinny GEMM: {sms} SMs")
    probe = SkinnyGeometry(n, k, bn, 1, swiglu)
    return SkinnyGeometry(n, k, bn, min(sms, probe.units), swiglu)


@dataclass(frozen=True)
class Segment:
    """A block's run of units inside one tile: units [begin, end) of tile `tile`; `slot` 0 or 1 when it is a
    partial (written to the workspace), None when it covers the whole tile."""

    block: int
    tile: int
    begin: int
    end: int
    slot: int | None


def schedule(geo: SkinnyGeometry) -> list[list[Segment]]:
    """Each block's segments, in the order the kernel runs them (pure; the kernel's loop over its units)."""
    out: list[list[Segment]] = []
    for b in range(geo.blocks):
        u0, u1 = geo.block_range(b)
        first_tile = u0 // geo.kc if u1 > u0 else -1
        segs: list[Segment] = []
        u = u0
        while u < u1:
            t = u // geo.kc
            end = min(u1, (t + 1) * geo.kc)
            whole = u == t * geo.kc and end == (t + 1) * geo.kc
            segs.append(Segment(b, t, u, end, None if whole else (0 if t == first_tile else 1)))
            u = end
        out.append(segs)
    return out


def reducers(geo: SkinnyGeometry, tile: int) -> range:
    """The contributors that sum `tile`'s partials: those whose range ends inside it (all but the last contributor
    when its range runs on past the tile). Never empty for a tile with partials (the first contributor's range
    ends in it, or the tile would be its whole)."""
    blocks = contributors(geo, tile)
    last = blocks[-1]
    if geo.block_range(last)[1] > (tile + 1) * geo.kc:
        last -= 1
    return range(blocks[0], last + 1)


def contributors(geo: SkinnyGeometry, tile: int) -> range:
    """The blocks whose ranges meet `tile`, in the order the reducers sum their partials."""
    return range(geo.owner(tile * geo.kc), geo.owner((tile + 1) * geo.kc - 1) + 1)
