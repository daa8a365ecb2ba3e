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
// Work split (the summation order of an output depends only on k and the cluster size C, never on m or MT):
//   * the launch is clusters of C blocks ((C, 1, 1), 1 <= C <= 8; a plain launch is C = 1) of 8 warps;
//   * k is cut into 32-wide chunks (k32 = ceil(k / 32)); cluster rank r owns chunks [r cpr, (r + 1) cpr) with
//     cpr = ceil(k32 / C), and warp w of the block the rank-local chunks w, w + 8, w + 16, ...;
//   * tiles (16 W rows; SwiGLU: 8 gate rows as MMA rows 0..7 and the same 8 up rows as rows 8..15) are dealt to
//     clusters round-robin: cluster q owns tiles q, q + Q, q + 2Q, ... (Q clusters), so any grid is correct;
//   * per tile: each warp's MMA chain over its chunks (in chunk order), the 8 warps' partials summed in warp
//     order into the block's partial (shared memory), then the C blocks' partials summed in rank order
//     (distributed shared memory, after a cluster barrier) by the thread that writes the output.
// Each block stages its slice of X (rows 0..m-1, its cpr chunks; rows m..MT-1 zero) in dynamic shared memory
// once, in fragment order (chunk, row, 16-byte piece), so a warp's B-fragment load is 512 contiguous bytes.
// The RMSNorm entries exchange each row's partial sum of squares over the cluster (one cluster barrier).
// Software pipeline: a warp's W loads go through two register slots of kUnroll chunks; the next tile's loads
// are in flight while a tile is reduced. PDL: the first two slots are loaded (coherent path) before
// griddepcontrol.wait; nothing is read from a predecessor's output or written before it.
#include "common.cuh"
#include "gemv_mma.cuh"  // the hardware primitives: weight loads, cluster ranks and barriers, DSMEM, mma.sync

#ifndef KERN_MMA_UNROLL
#define KERN_MMA_UNROLL 5  // 32-wide k chunks per register slot (per warp and tile: cpr / 8 = 4..5 at Qwen3-4B)
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

// kern_silu_mul's exact fp32 formula (IEEE division), rounded to bf16 (kernels-src/gemv.cu silu_bf).
KERN_DEV float silu_bf(float g) { return round_bf(g / (1.0f + expf(-g))); }

KERN_DEV int cdiv(int a, int b) { return (a + b - 1) / b; }

// Static shared memory of an entry with MT token rows: the warps' partials of a tile, the block's partial of
// the last two tiles (double-buffered: a peer may still read the previous one), each row's sum of squares.
template <int MT>
struct Reduce {
    float red[kWarps][16][MT + 4];  // +4: the float2 stores of one warp spread over more banks
    float part[2][16][MT];
    float ss[MT];
};

// Dynamic shared memory an entry needs: X's slice, cpr chunks x MT rows x 64 bytes.
KERN_DEV uint64_t x_slice_bytes(int k, int nranks, int mt) {
    const int cpr = cdiv(cdiv(k, 32), nranks);
    return static_cast<uint64_t>(cpr) * static_cast<uint64_t>(mt) * 64u;
}

// The whole kernel. `w`: [rows, k] bf16 row-major; `src`: the residual (RMSNorm kinds) or x (kResidual), [m, k];
// `norm_w`: [k] (RMSNorm kinds); `out`: y [m, n_out] / residual [m, n_out] / act [m, n_out]; n_out = n, or
// inter for kSwiglu (w then has 2 inter rows).
template <int MT, Kind K>
KERN_DEV void mma_entry(const bf16* __restrict__ w, const bf16* __restrict__ src, const bf16* __restrict__ norm_w,
                        bf16* __restrict__ out, int m, int n_out, int k, float eps) {
    static_assert(MT % 8 == 0 && MT >= 8 && MT <= 64, "MT: 8, 16, 32 or 64 token rows");
    constexpr int NT = MT / 8;
    KERN_MMA_DYNAMIC_SHARED(uint4, xs);  // [cpr][MT][4] 16-byte pieces of X (bf16)
    KERN_MMA_STATIC_SHARED(Reduce<MT>, sm);

    const int nranks = static_cast<int>(cluster_nranks());
    {
        bool bad = blockDim.x != kThreads || blockDim.y != 1 || blockDim.z != 1 || m < 1 || m > MT || n_out < 1 ||
                   k < 1 || (k & 7) != 0 || nranks > kMaxCluster;
        bad = bad || !aligned16(w) || !aligned16(src) || (K != Kind::kResidual && !aligned16(norm_w));
        bad = bad || dynamic_smem_bytes() < x_slice_bytes(k, nranks, MT);
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
    const int my_cnt = nc > warp ? cdiv(nc - warp, kWarps) : 0;  // chunks of this warp
    const int nbw = max(1, cdiv(cdiv(cpr, kWarps), kUnroll));  // steps (register slots) per tile, uniform
    const int tiles = K == Kind::kSwiglu ? cdiv(n_out, 8) : cdiv(n_out, 16);
    const int my_tiles = q < tiles ? (tiles - 1 - q) / Q + 1 : 0;
    const int n_steps = my_tiles * nbw;
    const uint64_t policy = weight_policy();

    // Step s = batch (s % nbw) of this cluster's tile number s / nbw: chunks batch * kUnroll + u of this warp.
    auto load_step = [&](int s, uint4 (&a)[kUnroll], uint4 (&b)[kUnroll], bool early) {
        const int tile = q + (s / nbw) * Q, batch = s % nbw;
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
            const int kk = (c0 + warp + kWarps * j) * 32 + 8 * t;
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
                const int cl = p >> 2, pt = p & 3;
                const int kk = (c0 + cl) * 32 + 8 * pt;
                uint4* slot = xs + (cl * MT + i) * 4 + pt;
                float r[8], gw[8];
                unpack8(*slot, r);
                unpack8(kk < k ? __ldg(reinterpret_cast<const uint4*>(norm_w + kk)) : make_uint4(0u, 0u, 0u, 0u), gw);
#pragma unroll
                for (int e = 0; e < 8; ++e) r[e] = gw[e] * round_bf(r[e] * inv_rms);  // padding: 0 * 0
                *slot = pack8(r);
            }
        }
        __syncthreads();
    }

    // 3. Steps.
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;

    auto multiply = [&](int s, const uint4 (&a)[kUnroll], const uint4 (&b)[kUnroll]) {
        const int batch = s % nbw;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int j = batch * kUnroll + u;
            if (j < my_cnt) {
                const uint4* xp = xs + ((warp + kWarps * j) * MT + g) * 4 + t;  // X row g of n-tile 0
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

    // A tile's reduction and epilogue (every thread of the cluster, uniformly).
    auto finish_tile = [&](int tile, int buf) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            if (nt * 8 < m) {
                *reinterpret_cast<float2*>(&sm.red[warp][g][nt * 8 + 2 * t]) = make_float2(acc[nt][0], acc[nt][1]);
                *reinterpret_cast<float2*>(&sm.red[warp][g + 8][nt * 8 + 2 * t]) = make_float2(acc[nt][2], acc[nt][3]);
            }
            acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
        }
        __syncthreads();
        for (int o = tid; o < 16 * m; o += kThreads) {  // the block's partial, warps in order
            const int i = o >> 4, j = o & 15;
            float s = sm.red[0][j][i];
#pragma unroll
            for (int wi = 1; wi < kWarps; ++wi) s += sm.red[wi][j][i];
            sm.part[buf][j][i] = s;
        }
        cluster_sync(nranks);  // every rank's partial of this tile is visible
        if (K == Kind::kSwiglu) {
            for (int o = rank * kThreads + tid; o < 8 * m; o += nranks * kThreads) {
                const int i = o >> 3, j = o & 7;
                const int jo = 8 * tile + j;
                float gate = ld_rank_f32(&sm.part[buf][j][i], 0, nranks);
                float up = ld_rank_f32(&sm.part[buf][j + 8][i], 0, nranks);
                for (int r = 1; r < nranks; ++r) {
                    gate += ld_rank_f32(&sm.part[buf][j][i], r, nranks);
                    up += ld_rank_f32(&sm.part[buf][j + 8][i], r, nranks);
                }
                if (jo < n_out) {  // the GEMM outputs rounded to bf16, then kern_silu_mul's formula
                    out[static_cast<size_t>(i) * n_out + jo] = f2bf(silu_bf(round_bf(gate)) * round_bf(up));
                }
            }
        } else {
            for (int o = rank * kThreads + tid; o < 16 * m; o += nranks * kThreads) {
                const int i = o >> 4, j = o & 15;
                const int row = 16 * tile + j;
                float v = ld_rank_f32(&sm.part[buf][j][i], 0, nranks);
                for (int r = 1; r < nranks; ++r) v += ld_rank_f32(&sm.part[buf][j][i], r, nranks);
                if (row < n_out) {
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
            finish_tile(q + (s / nbw) * Q, buf);
            buf ^= 1;
        }
        if (s + 1 < n_steps) {
            multiply(s + 1, wa1, wb1);
            if (s + 3 < n_steps) load_step(s + 3, wa1, wb1, false);
            if ((s + 1) % nbw == nbw - 1) {
                finish_tile(q + ((s + 1) / nbw) * Q, buf);
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
