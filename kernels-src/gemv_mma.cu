// Small-M decode projections on tensor cores (M = 1..64 token rows): "swap-AB" mma.sync, C^T[n, m] = W[n, k] .
// X[m, k]^T, bf16 inputs, fp32 accumulation, with the decode GEMVs' prologues / epilogues (RMSNorm prologue,
// residual-add epilogue, SwiGLU epilogue). Contract and launch geometry: docs/kernels-gemv.md "Small-M MMA entries".
//
// Roles: the W rows are the MMA's M side (16 per tile: MMA rows 0..15), the token rows its N side (8 per n-tile,
// MT / 8 n-tiles per entry, MT = 8, 16, 32, 64). No ldmatrix and no shared-memory staging of W: lane (g, t)
// (g = lane / 4, t = lane % 4) loads, for each 32-wide k chunk, the 16 contiguous bytes [8t, 8t + 8) of W row g
// and of W row g + 8 (one coalesced 16-byte load each), and the same 16 bytes of X row (8 nt + g) from shared
// memory, and feeds them to two m16n8k16 MMAs as the A / B fragments: MMA 0 takes elements {0, 1} as fragment
// k {2t, 2t + 1} and {2, 3} as k {2t + 8, 2t + 9}; MMA 1 takes elements {4, 5} and {6, 7} alike. The permutation
// of k depends on t alone and is the same for A and B, so each output is the full dot product (a dot product is
// order-free over k; the MMA's own summation order is fixed by the hardware).
//
// Work split (the summation order of an output depends only on k, the cluster size C and the warps per tile P,
// never on m or MT):
//   * the launch is clusters of C blocks ((C, 1, 1), 1 <= C <= 8; a plain launch is C = 1) of 8 warps;
//   * k is cut into 32-wide chunks (k32 = ceil(k / 32)); cluster rank r owns chunks [r cpr, (r + 1) cpr) with
//     cpr = ceil(k32 / C);
//   * tiles (16 W rows; SwiGLU: 8 gate rows as MMA rows 0..7 and the same 8 up rows as rows 8..15) are held P warps
//     each: a block holds S = 8 / P tiles at once (warp w: slot w / P, part w % P, the part owning the contiguous
//     rank-local chunks [p cpp, (p + 1) cpp), cpp = ceil(cpr / P)); round j of cluster q holds tiles
//     q + Q (s + S j) in its slots s (Q clusters), so any grid is correct; P = warps_per_tile(tiles, Q, cpr);
//   * per round: each warp's MMA chain over its chunks (in chunk order), written to shared memory; a cluster
//     barrier; then each output summed over the C ranks in rank order and, within a rank, over its P parts in
//     part order (distributed shared memory) by the thread that writes it.
// Each block stages its slice of X (rows 0..m-1, its cpr chunks; rows m..MT-1 zero) in dynamic shared memory
// once, in fragment order (chunk, row, 16-byte piece), so a warp's B-fragment load is 512 contiguous bytes; the
// round's partials follow it (double-buffered, so one cluster barrier a round suffices).
// The RMSNorm entries exchange each row's partial sum of squares over the cluster (one cluster barrier).
// Software pipeline: a warp's W loads go through two register slots of kUnroll chunks (a step each); the next
// round's first loads are in flight while a round is reduced. PDL: the first two steps are loaded (coherent path)
// before griddepcontrol.wait; nothing is read from a predecessor's output or written before it.
#include "common.cuh"
#include "gemv_mma.cuh"  // the hardware primitives: weight loads, cluster ranks and barriers, DSMEM, mma.sync

#ifndef KERN_MMA_UNROLL
#define KERN_MMA_UNROLL 5  // 32-wide k chunks per register slot (a step): 10 16-byte loads a lane
#endif

namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kUnroll = KERN_MMA_UNROLL;
constexpr int kMaxCluster = 8;  // portable cluster size

enum class Kind { kRmsnorm, kResidual, kSwiglu };

KERN_DEV float lo_f(uint32_t u) { return __uint_as_float(u << 16); }
KERN_DEV float hi_f(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

KERN_DEV void unpack8(uint4 v, float (&f)[8]) {
    f[0] = lo_f(v.x); f[1] = hi_f(v.x);
    f[2] = lo_f(v.y); f[3] = hi_f(v.y);
    f[4] = lo_f(v.z); f[5] = hi_f(v.z);
    f[6] = lo_f(v.w); f[7] = hi_f(v.w);
}

KERN_DEV uint32_t pack2(float a, float b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);  // .x = a (low half)
    return *reinterpret_cast<const uint32_t*>(&h);
}
KERN_DEV uint4 pack8(const float (&f)[8]) {
    return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7]));
}


KERN_DEV int cdiv(int a, int b) { return (a + b - 1) / b; }

// Tile slots per block and warps per tile. A block's 8 warps hold S = 8 / P tiles at once, P warps each (warp w:
// slot w / P, part w % P, the part's contiguous ceil(cpr / P) of the rank's chunks). P is the one of 1, 2, 4, 8
// with the least cost ceil(tiles / (Q S)) * (ceil(cpr / P) + kRoundChunks) (rounds of a cluster times a warp's
// chunks a round plus a round's reduction, counted as kRoundChunks chunks), the smallest P on a tie. A function of
// the shape (tiles, cpr) and the grid (Q clusters) only, never of m: mirrored by kern_run.models.qwen3.mma
// warps_per_tile. KERN_MMA_P (1, 2, 4 or 8) forces it (bench variants).
#ifndef KERN_MMA_P
#define KERN_MMA_P 0
#endif
constexpr int kRoundChunks = 8;

KERN_DEV int warps_per_tile(int tiles, int clusters, int cpr) {
    if (KERN_MMA_P > 0) return KERN_MMA_P;
    int best = 1;
    long best_cost = -1;
    for (int p = 1; p <= kWarps; p *= 2) {
        const long rounds = cdiv(tiles, clusters * (kWarps / p));
        const long cost = rounds * (cdiv(cpr, p) + kRoundChunks);
        if (best_cost < 0 || cost < best_cost) {
            best = p;
            best_cost = cost;
        }
    }
    return best;
}

// Static shared memory of an entry with MT token rows: each row's sum of squares.
template <int MT>
struct Stat {
    float ss[MT];
};

// Dynamic shared memory an entry needs: X's slice (cpr chunks x MT rows x 64 bytes), then the warps' partials of
// a round, double-buffered (a peer may still read the previous round's): [2][8 warps][16 W rows][MT] f32. The
// RMSNorm weight's slice (cpr chunks x 64 bytes) takes the partials' place during the prologue (no partial is
// written before the first round ends, nor read by a peer before the barrier that ends it).
KERN_DEV uint64_t x_slice_bytes(int k, int nranks, int mt) {
    const int cpr = cdiv(cdiv(k, 32), nranks);
    return static_cast<uint64_t>(cpr) * static_cast<uint64_t>(mt) * 64u;
}
KERN_DEV uint64_t norm_slice_bytes(int k, int nranks) { return static_cast<uint64_t>(cdiv(cdiv(k, 32), nranks)) * 64u; }
KERN_DEV uint64_t part_bytes(int mt) { return 2ull * kWarps * 16u * static_cast<uint64_t>(mt) * 4u; }

// The whole kernel. `w`: [rows, k] bf16 row-major; `src`: the residual (RMSNorm kinds) or x (kResidual), [m, k];
// `norm_w`: [k] (RMSNorm kinds); `out`: y [m, n_out] / residual [m, n_out] / act [m, n_out]; n_out = n, or
// inter for kSwiglu (w then has 2 inter rows).
template <int MT, Kind K>
KERN_DEV void mma_entry(const bf16* __restrict__ w, const bf16* __restrict__ src, const bf16* __restrict__ norm_w,
                        bf16* __restrict__ out, int m, int n_out, int k, float eps) {
    static_assert(MT % 8 == 0 && MT >= 8 && MT <= 64, "MT: 8, 16, 32 or 64 token rows");
    constexpr int NT = MT / 8;
    KERN_MMA_DYNAMIC_SHARED(uint4, xs);  // [cpr][MT][4] 16-byte pieces of X (bf16), then the partials
    KERN_MMA_STATIC_SHARED(Stat<MT>, sm);

    const int nranks = static_cast<int>(cluster_nranks());
    {
        bool bad = blockDim.x != kThreads || blockDim.y != 1 || blockDim.z != 1 || m < 1 || m > MT || n_out < 1 ||
                   k < 1 || (k & 7) != 0 || nranks > kMaxCluster;
        bad = bad || !aligned16(w) || !aligned16(src) || (K != Kind::kResidual && !aligned16(norm_w));
        bad = bad || dynamic_smem_bytes() < x_slice_bytes(k, nranks, MT) + max(norm_slice_bytes(k, nranks), part_bytes(MT));
        if (bad) {  // uniform over the grid: every block returns, having read and written nothing
            kern_pdl_wait();
            return;
        }
    }
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int rank = static_cast<int>(cluster_rank());
    const int q = static_cast<int>(cluster_index()), Q = static_cast<int>(cluster_count());
    const int k32 = cdiv(k, 32);
    const int cpr = cdiv(k32, nranks);
    const int c0 = rank * cpr;                          // first chunk of this rank
    const int nc = max(0, min(k32, c0 + cpr) - c0);     // chunks of this rank
    const int tiles = K == Kind::kSwiglu ? cdiv(n_out, 8) : cdiv(n_out, 16);
    const int P = warps_per_tile(tiles, Q, cpr);
    const int S = kWarps / P;                           // tiles a block holds at once (its slots)
    const int slot = warp / P, part = warp % P;
    const int cpp = cdiv(cpr, P);                       // chunks of a part
    const int lo = part * cpp;                          // this warp's first rank-local chunk
    const int my_cnt = max(0, min(nc, lo + cpp) - lo);  // chunks of this warp
    const int nbw = max(1, cdiv(cpp, kUnroll));         // steps (register slots) per round, uniform
    const int per_round = S * Q;                        // tiles the grid holds in one round
    const int rounds = q < tiles ? (tiles - 1 - q) / per_round + 1 : 0;  // uniform over the cluster
    const int n_steps = rounds * nbw;
    uint4* gs = xs + static_cast<size_t>(cpr) * MT * 4;  // prologue: [cpr][4] 16-byte pieces of norm_w
    float* parts = reinterpret_cast<float*>(gs);           // then: [2][kWarps][16][MT] round partials
    const uint64_t policy = weight_policy();
    auto tile_of = [&](int round, int s) { return q + Q * (s + S * round); };

    // Step s = batch (s % nbw) of round s / nbw: this warp's chunks lo + batch * kUnroll + u of its slot's tile.
    auto load_step = [&](int s, uint4 (&a)[kUnroll], uint4 (&b)[kUnroll], bool early) {
        const int tile = tile_of(s / nbw, slot), batch = s % nbw;
        int r0, r1;
        bool v0, v1;
        if (K == Kind::kSwiglu) {
            const int j = 8 * tile + g;
            v0 = v1 = j < n_out;
            r0 = j;
            r1 = n_out + j;
        } else {
            r0 = 16 * tile + g;
            r1 = r0 + 8;
            v0 = r0 < n_out;
            v1 = r1 < n_out;
        }
        const bf16* pa = w + static_cast<size_t>(v0 ? r0 : 0) * k;
        const bf16* pb = w + static_cast<size_t>(v1 ? r1 : 0) * k;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int j = batch * kUnroll + u;
            const int kk = (c0 + lo + j) * 32 + 8 * t;
            const bool ok = j < my_cnt && kk < k;
            const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
            if (early) {
                a[u] = ok && v0 ? ldg_weight_early(pa + kk, policy) : zero;
                b[u] = ok && v1 ? ldg_weight_early(pb + kk, policy) : zero;
            } else {
                a[u] = ok && v0 ? ldg_weight(pa + kk, policy) : zero;
                b[u] = ok && v1 ? ldg_weight(pb + kk, policy) : zero;
            }
        }
    };

    // 1. The first two steps' W: weights only, so they may overlap the previous kernel's tail.
    uint4 wa0[kUnroll], wb0[kUnroll], wa1[kUnroll], wb1[kUnroll];
    if (n_steps > 0) load_step(0, wa0, wb0, true);
    if (n_steps > 1) load_step(1, wa1, wb1, true);
    kern_pdl_wait();  // everything below may read what the previous kernel in the stream wrote
    kern_pdl_launch_dependents();

    // 2. X's slice into shared memory: piece (cl, i, pt) = X[i, (c0 + cl) * 32 + 8 pt .. + 8) at xs[(cl MT + i) 4 + pt]
    // (the raw residual for the RMSNorm kinds), rows m..MT-1 and pieces past k zero: one cp.async per piece, all
    // in flight at once.
    const int pieces = nc * 4;
    for (int idx = tid; idx < MT * pieces; idx += kThreads) {
        const int i = idx / pieces, p = idx - i * pieces;
        const int cl = p >> 2, pt = p & 3;
        const int kk = (c0 + cl) * 32 + 8 * pt;
        const bool ok = i < m && kk < k;
        cp_async16(xs + (cl * MT + i) * 4 + pt, ok ? src + static_cast<size_t>(i) * k + kk : src, ok ? 16 : 0);
    }
    if (K != Kind::kResidual) {  // the norm weight's slice once, not once per row: pieces past k zero
        for (int p = tid; p < pieces; p += kThreads) {
            const int kk = (c0 + (p >> 2)) * 32 + 8 * (p & 3);
            cp_async16(gs + p, kk < k ? norm_w + kk : norm_w, kk < k ? 16 : 0);
        }
    }
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    if (K != Kind::kResidual) {
        // RMSNorm (kernels-src/gemv.cu stage_rmsnorm's rounding): x = bf16(norm_w * bf16(r * rsqrt(mean(r^2) + eps))),
        // the sum of squares over the whole row: this rank's part, then the ranks' parts in rank order.
        // Pass 1: warp w takes rows w, w + 8, ...; lane l the pieces l, l + 32, ... of the rank's slice, in order.
        for (int i = warp; i < m; i += kWarps) {
            float sum_sq = 0.0f;
            for (int p = lane; p < pieces; p += 32) {
                float r[8];
                unpack8(xs[((p >> 2) * MT + i) * 4 + (p & 3)], r);
#pragma unroll
                for (int e = 0; e < 8; ++e) sum_sq = fmaf(r[e], r[e], sum_sq);  // padding is 0: adds nothing
            }
            sum_sq = warp_sum(sum_sq);
            if (lane == 0) sm.ss[i] = sum_sq;
        }
        cluster_sync(nranks);  // every rank's sums of squares are visible
        // Pass 2: same rows and pieces as pass 1 (no barrier needed for xs in between).
        for (int i = warp; i < m; i += kWarps) {
            float total = 0.0f;
            for (int r = 0; r < nranks; ++r) total += ld_rank_f32(&sm.ss[i], r, nranks);  // rank order
            const float inv_rms = rsqrtf(total / static_cast<float>(k) + eps);
            for (int p = lane; p < pieces; p += 32) {
                uint4* piece = xs + ((p >> 2) * MT + i) * 4 + (p & 3);
                float r[8], gw[8];
                unpack8(*piece, r);
                unpack8(gs[p], gw);
#pragma unroll
                for (int e = 0; e < 8; ++e) r[e] = gw[e] * round_bf(r[e] * inv_rms);  // padding: 0 * 0
                *piece = pack8(r);
            }
        }
        __syncthreads();
    }

    // 3. Steps.
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;

    auto multiply = [&](int s, const uint4 (&a)[kUnroll], const uint4 (&b)[kUnroll]) {
        if (tile_of(s / nbw, slot) >= tiles) return;  // warp-uniform: a slot past the last tile
        const int batch = s % nbw;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int j = batch * kUnroll + u;
            if (j < my_cnt) {
                const uint4* xp = xs + ((lo + j) * MT + g) * 4 + t;  // X row g of n-tile 0
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    if (nt * 8 < m) {
                        const uint4 xb = xp[nt * 32];
                        mma_bf16(acc[nt], a[u].x, b[u].x, a[u].y, b[u].y, xb.x, xb.y);
                        mma_bf16(acc[nt], a[u].z, b[u].z, a[u].w, b[u].w, xb.z, xb.w);
                    }
                }
            }
        }
    };

    // A round's reduction and epilogue (every thread of the cluster, uniformly): each warp's partial into shared
    // memory, a cluster barrier, then each output summed over the ranks in rank order and, within a rank, over
    // its slot's P parts in part order.
    auto finish_round = [&](int round, int buf) {
        float* mine = parts + (static_cast<size_t>(buf) * kWarps + warp) * 16 * MT;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            if (nt * 8 < m) {
                *reinterpret_cast<float2*>(&mine[g * MT + nt * 8 + 2 * t]) = make_float2(acc[nt][0], acc[nt][1]);
                *reinterpret_cast<float2*>(&mine[(g + 8) * MT + nt * 8 + 2 * t]) = make_float2(acc[nt][2], acc[nt][3]);
            }
            acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
        }
        cluster_sync(nranks);  // every rank's partials of this round are visible
        const float* round_parts = parts + static_cast<size_t>(buf) * kWarps * 16 * MT;
        auto total = [&](int s, int row16, int i) {  // sum over ranks, then parts, of W row `row16` of slot s
            float v = 0.0f;
            for (int r = 0; r < nranks; ++r) {
                for (int p = 0; p < P; ++p) {
                    v += ld_rank_f32(&round_parts[((s * P + p) * 16 + row16) * MT + i], r, nranks);
                }
            }
            return v;
        };
        const int per_slot = (K == Kind::kSwiglu ? 8 : 16) * m;
        for (int o = rank * kThreads + tid; o < S * per_slot; o += nranks * kThreads) {
            const int s = o / per_slot, rest = o - s * per_slot;
            const int tile = tile_of(round, s);
            if (K == Kind::kSwiglu) {
                const int i = rest >> 3, j = rest & 7;
                const int jo = 8 * tile + j;
                if (jo < n_out) {  // the GEMM outputs rounded to bf16, then kern_silu_mul's formula
                    const float gate = total(s, j, i), up = total(s, j + 8, i);
                    out[static_cast<size_t>(i) * n_out + jo] = f2bf(silu_bf(round_bf(gate)) * round_bf(up));
                }
            } else {
                const int i = rest >> 4, j = rest & 15;
                const int row = 16 * tile + j;
                if (row < n_out) {
                    const float v = total(s, j, i);
                    bf16* dst = out + static_cast<size_t>(i) * n_out + row;
                    if (K == Kind::kResidual) {
                        *dst = f2bf(bf2f(__ldcg(dst)) + round_bf(v));  // bf16(residual + bf16(W x))
                    } else {
                        *dst = f2bf(v);
                    }
                }
            }
        }
    };

    int buf = 0;
    for (int s = 0; s < n_steps; s += 2) {
        multiply(s, wa0, wb0);
        if (s + 2 < n_steps) load_step(s + 2, wa0, wb0, false);  // refill before the reduction
        if (s % nbw == nbw - 1) {
            finish_round(s / nbw, buf);
            buf ^= 1;
        }
        if (s + 1 < n_steps) {
            multiply(s + 1, wa1, wb1);
            if (s + 3 < n_steps) load_step(s + 3, wa1, wb1, false);
            if ((s + 1) % nbw == nbw - 1) {
                finish_round((s + 1) / nbw, buf);
                buf ^= 1;
            }
        }
    }
    if (nranks > 1) cluster_sync(nranks);  // no block leaves while a peer may still read its shared memory
}

}  // namespace

// y[i, :] = W[n, k] @ x_i, x_i = bf16(norm_w * bf16(r_i * rsqrt(mean(r_i^2) + eps))), r_i = residual[i, :], i < m.
#define KERN_MMA_RMSNORM(MT)                                                                                        \
    extern "C" __global__ void __launch_bounds__(kThreads, 1) kern_mma_rmsnorm_m##MT(                              \
        const bf16* __restrict__ w, const bf16* __restrict__ residual, const bf16* __restrict__ norm_w,             \
        bf16* __restrict__ y, int32_t m, int32_t n, int32_t k, float eps) {                                         \
        mma_entry<MT, Kind::kRmsnorm>(w, residual, norm_w, y, m, n, k, eps);                                        \
    }

// residual[i, j] = bf16(residual[i, j] + bf16(W[j, :] . x[i, :])), i < m, j < n. x must not alias residual.
#define KERN_MMA_RESIDUAL(MT)                                                                                       \
    extern "C" __global__ void __launch_bounds__(kThreads, 1) kern_mma_residual_m##MT(                             \
        const bf16* __restrict__ w, const bf16* __restrict__ x, bf16* __restrict__ residual, int32_t m, int32_t n,  \
        int32_t k) {                                                                                                \
        mma_entry<MT, Kind::kResidual>(w, x, nullptr, residual, m, n, k, 0.0f);                                     \
    }

// act[i, j] = bf16(bf16(silu(bf16(gate))) * bf16(up)), gate = W[j] . x_i, up = W[inter + j] . x_i, x_i the RMSNorm
// prologue above; w_gate_up = [gate: inter rows][up: inter rows] x k.
#define KERN_MMA_SWIGLU(MT)                                                                                         \
    extern "C" __global__ void __launch_bounds__(kThreads, 1) kern_mma_rmsnorm_swiglu_m##MT(                       \
        const bf16* __restrict__ w_gate_up, const bf16* __restrict__ residual, const bf16* __restrict__ norm_w,     \
        bf16* __restrict__ act, int32_t m, int32_t inter, int32_t k, float eps) {                                   \
        mma_entry<MT, Kind::kSwiglu>(w_gate_up, residual, norm_w, act, m, inter, k, eps);                           \
    }

KERN_MMA_RMSNORM(8)
KERN_MMA_RMSNORM(16)
KERN_MMA_RMSNORM(32)
KERN_MMA_RMSNORM(64)
KERN_MMA_RESIDUAL(8)
KERN_MMA_RESIDUAL(16)
KERN_MMA_RESIDUAL(32)
KERN_MMA_RESIDUAL(64)
KERN_MMA_SWIGLU(8)
KERN_MMA_SWIGLU(16)
KERN_MMA_SWIGLU(32)
KERN_MMA_SWIGLU(64)
