// Skinny GEMM of a batched decode step on Hopper's warpgroup MMA: c[m, n] = a[m, k] @ w[n, k]^T for m <= 64 token
// rows (bf16 in, fp32 accumulate, bf16 out), streamed so that the weights move at the HBM rate, and the same bits
// for a row at every m (batch invariance: nothing in the schedule depends on m).
//
// Entries kern_gemm_skinny_n128 / _n256: BN = 128 / 256 weight rows (output columns) a tile, two warpgroups (256
// threads), warpgroup g owning tile rows [g BN/2, (g + 1) BN/2) as one wgmma.m64n{BN/2}k16 accumulator. The 64
// MMA rows are the token rows: rows >= m are zero-filled copies and never stored, so one launch shape serves every
// m. A stage holds one 64-element k chunk (one 128-byte row of the SWIZZLE_128B pattern: 16-byte chunk c of row r
// at chunk c ^ (r % 8)) of the tile's W rows (BN x 128 bytes) and of a's 64 rows (8 KiB); SK_STAGES stages ring
// in dynamic shared memory (n128: 8 x 24 KiB, n256: 5 x 40 KiB), refilled by cp.async AHEAD = STAGES - 1 -
// SK_MMA_LAG units ahead (6 / 3: one more stage is still read by the wgmma group left running).
//
// Stream-K schedule (Osama et al., "Stream-K: Work-centric Parallel Decomposition for Dense Matrix-Matrix
// Multiplication on the GPU", PPoPP 2023): the work is U = tiles x kc units (kc = cdiv(k, 64) chunks a tile),
// unit u = (tile u / kc, chunk u % kc); block b of G = gridDim.x takes units [b U / G, (b + 1) U / G). A block
// whose range covers a tile's chunks alone stores it. Else every contributor writes its fp32 partial to `ws` (slot
// 0: the tile of the block's first unit, slot 1: of its last; 64 x BN floats each, in accumulator order) and counts
// itself in `tickets[2 tile]`. The contributors whose ranges end in the tile (all but the last one, whose range
// runs on past it, when it does) then wait for all nc partials and each sums its share of the tile's elements over
// the partials in block order (the same adds whichever block arrived last: deterministic), stores it, and counts
// itself in `tickets[2 tile + 1]`; the last of them puts both back to zero. The waits need every block resident
// at once (G <= SMs: one block an SM; a grid wider than the GPU's SMs traps at once, a launch error rather than
// silent zeros) and are bounded (SK_WAIT_LIMIT_NS, then trap: a launch error, never a hang).
// The decomposition depends on (n, k, G) only, never on m, so a row's sum is the same sequence of fp32 adds at
// every m (kern_run.models.qwen3.skinny is its host mirror; tests/run/test_skinny_cpu.py checks it).
//
// swiglu != 0: w is the fused gate_up weight [n = 2 inter, k] (gate rows first) and c is act[m, inter] =
// bf16(silu(bf16 gate)) * bf16 up (kern_silu_mul's rounding points). A tile then holds BN / 2 output columns:
// warpgroup g's BN / 2 rows are BN / 4 gate rows and the matching BN / 4 up rows, so a thread holds the gate and
// up value of the same column (accumulator column blocks j and j + BN / 16).
//
// Launch: grid (G, 1, 1) with G <= the SMs (one block an SM) and G <= U, block (256, 1, 1), dynamic shared memory
// SK_SMEM_BYTES(BN). Requires 1 <= m <= 64, n % 8 == 0 (n % 16 with swiglu), k % 8 == 0, 16-byte aligned a, w; a
// launch that breaks these (or G > U) returns after the PDL wait without writing; G above %nsmid traps. ws: 2 G x 64
// x BN floats; tickets: 2 cdiv(n_out, tile columns) u32, zero at the first launch (and after every launch). PDL:
// the weight copies of the first AHEAD units are issued before griddepcontrol.wait (weights are no kernel's
// output), a's after it.
//
// PTX ISA 8.x: "wgmma.mma_async" (both operands from shared memory descriptors, K-major: imm-trans 0),
// "cp.async", "griddepcontrol".
#include "common.cuh"
#include "persistent_sync.cuh"  // global_ns, load_acquire
#include "wgmma.cuh"

#define SK_BM 64         // MMA rows: token rows, zero-filled past m
#define SK_BK 64         // k elements a stage: one 128-byte swizzle row
#define SK_THREADS 256   // two warpgroups
#define SK_X_BYTES (SK_BM * 128)

template <int BN>
struct SkGeo {
    static constexpr int WN = BN / 2;                    // accumulator columns per warpgroup
    static constexpr int N8 = WN / 8;                    // accumulator column blocks per thread
    static constexpr int W_BYTES = BN * 128;             // a stage's weight rows
    static constexpr int STAGE = W_BYTES + SK_X_BYTES;   // a stage: W then a (each 1,024-byte aligned)
    static constexpr int STAGES = BN == 128 ? 8 : 5;     // 192 / 200 KiB
    static constexpr int SMEM = STAGES * STAGE + 1024;   // + alignment slack
    static constexpr int W_COPIES = BN * 8 / SK_THREADS; // 16-byte copies per thread a stage
};
static_assert(SkGeo<128>::SMEM == 197632 && SkGeo<256>::SMEM == 205824,
              "kern_run.models.qwen3.skinny SKINNY_SMEM shared memory bytes");

// d[64 x 64] (+)= A (descriptor) * B (descriptor), both K-major.
KERN_DEV void wgmma_m64n64k16_ss(float (&d)[8][4], uint64_t da, uint64_t db, int accumulate) {
#define SK_ACC4(x, j) "+f"(x[j][0]), "+f"(x[j][1]), "+f"(x[j][2]), "+f"(x[j][3])
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : SK_ACC4(d, 0), SK_ACC4(d, 1), SK_ACC4(d, 2), SK_ACC4(d, 3), SK_ACC4(d, 4), SK_ACC4(d, 5), SK_ACC4(d, 6),
          SK_ACC4(d, 7)
        : "l"(da), "l"(db), "r"(accumulate));
}

// d[64 x 128] (+)= A (descriptor) * B (descriptor), both K-major.
KERN_DEV void wgmma_m64n128k16_ss(float (&d)[16][4], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : SK_ACC4(d, 0), SK_ACC4(d, 1), SK_ACC4(d, 2), SK_ACC4(d, 3), SK_ACC4(d, 4), SK_ACC4(d, 5), SK_ACC4(d, 6),
          SK_ACC4(d, 7), SK_ACC4(d, 8), SK_ACC4(d, 9), SK_ACC4(d, 10), SK_ACC4(d, 11), SK_ACC4(d, 12),
          SK_ACC4(d, 13), SK_ACC4(d, 14), SK_ACC4(d, 15)
        : "l"(da), "l"(db), "r"(accumulate));
#undef SK_ACC4
}

template <int N8>
KERN_DEV void wgmma_ss(float (&d)[N8][4], uint64_t da, uint64_t db, int accumulate) {
    if constexpr (N8 == 16) {
        wgmma_m64n128k16_ss(d, da, db, accumulate);
    } else {
        static_assert(N8 == 8, "kern_gemm_skinny: 64 or 128 accumulator columns a warpgroup");
        wgmma_m64n64k16_ss(d, da, db, accumulate);
    }
}

// The block that owns unit u: the largest b with floor(b U / G) <= u.
KERN_DEV int sk_owner(int u, int units, int blocks) {
    return static_cast<int>((static_cast<long long>(u + 1) * blocks - 1) / units);
}

#ifndef SK_PROBE
#define SK_PROBE 0  // timing probes (wrong results): 1 no fixup (a partial segment is stored as if whole), 2 no wgmma,
                    // 4 reducers do not wait for the tile's partials, 8 nor count themselves in (no atomics)
#endif
#ifndef SK_MMA_LAG
#define SK_MMA_LAG 1  // wgmma groups left running across an iteration (0 or 1): the stage they read is refilled later
#endif
// a reducer's wait for its tile's partials: 10 s (kern_attn_prefill_wg's bound: room for a debugger or a time-slice
// preemption), then trap (a launch error)
#define SK_WAIT_LIMIT_NS 10000000000ull

// Count this block in at *p after every thread's partial stores (the barrier orders them before thread 0's
// release fence: the arrive of CUTLASS's generic barrier).
KERN_DEV void sk_arrive(unsigned* p) {
    asm volatile("fence.acq_rel.gpu;\nred.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(p) : "memory");
}

template <int BN>
KERN_DEV void gemm_skinny(const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ w,
                          __nv_bfloat16* __restrict__ c, float* __restrict__ ws, unsigned* __restrict__ tickets,
                          int m, int n, int k, int swiglu) {
    using Geo = SkGeo<BN>;
    constexpr int N8 = Geo::N8;
    extern __shared__ unsigned char sk_raw[];
    const int n_out = swiglu ? n / 2 : n;
    const int tile_cols = swiglu ? BN / 2 : BN;
    const int tiles = (n_out + tile_cols - 1) / tile_cols;
    const int kc = (k + SK_BK - 1) / SK_BK;
    const long long units64 = static_cast<long long>(tiles) * kc;
    const bool ok_launch = blockDim.x == SK_THREADS && dynamic_smem_bytes() >= static_cast<uint32_t>(Geo::SMEM) &&
                           m >= 1 && m <= SK_BM && n > 0 && k > 0 && n % (swiglu ? 16 : 8) == 0 && k % 8 == 0 &&
                           aligned16(a) && aligned16(w) && units64 * gridDim.x < (1ll << 31) &&
                           gridDim.x <= units64;
    uint32_t nsm;
    asm("mov.u32 %0, %%nsmid;" : "=r"(nsm));
    if (gridDim.x > nsm) __trap();  // more blocks than SMs cannot all be resident: their waits could never end
    if (!ok_launch) {
        kern_pdl_wait();
        return;
    }
    unsigned char* sm =
        reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(sk_raw) + 1023) & ~uintptr_t(1023));
    const int tid = threadIdx.x, wg = tid >> 7, t128 = tid & 127, lane = tid & 31, wq = (tid >> 5) & 3;
    const int units = static_cast<int>(units64), blocks = gridDim.x, me = blockIdx.x;
    const int u0 = me * units / blocks, u1 = (me + 1) * units / blocks, nu = u1 - u0;

    // This thread's copies: rows (tid / 8) + 32 i of the W tile, rows tid / 8 and + 32 of a, 16-byte chunk tid % 8,
    // at the swizzled offset dst0 + 32 i x 128 bytes of a stage. The W row pointers change with the loader's tile only.
    const int ch = tid & 7;
    const __nv_bfloat16* w_src[Geo::W_COPIES];
    bool w_ok[Geo::W_COPIES];
    auto w_rows = [&](int t) {
#pragma unroll
        for (int i = 0; i < Geo::W_COPIES; ++i) {
            const int r = (tid >> 3) + 32 * i;
            int row;
            if (!swiglu) {
                row = t * BN + r;
                w_ok[i] = row < n;
            } else {
                const int g = r / Geo::WN, rr = r % Geo::WN, q4 = BN / 4;
                const int col = t * (BN / 2) + g * q4 + (rr < q4 ? rr : rr - q4);  // the output column it feeds
                w_ok[i] = col < n_out;
                row = rr < q4 ? col : n_out + col;
            }
            w_src[i] = w_ok[i] ? w + static_cast<size_t>(row) * k + ch * 8 : w;
        }
    };
    const int xr = tid >> 3;
    const __nv_bfloat16* x_src0 = a + static_cast<size_t>(xr) * k + ch * 8;
    const __nv_bfloat16* x_src1 = a + static_cast<size_t>(xr + 32) * k + ch * 8;
    const uint32_t dst0 = xr * 128 + ((ch ^ (xr & 7)) << 4);  // (xr + 32 i) & 7 == xr & 7
    int ld_t = u0 / kc, ld_j = u0 % kc;  // the loader's next unit
    w_rows(ld_t);
    auto load_w = [&](int stage) {
        unsigned char* dst = sm + stage * Geo::STAGE + dst0;
        const int col = ld_j * SK_BK + ch * 8;
#pragma unroll
        for (int i = 0; i < Geo::W_COPIES; ++i) {
            const bool ok = w_ok[i] && col < k;
            cp_async16(dst + i * 32 * 128, ok ? w_src[i] + ld_j * SK_BK : w, ok ? 16 : 0);
        }
    };
    auto load_a = [&](int stage) {
        unsigned char* dst = sm + stage * Geo::STAGE + Geo::W_BYTES + dst0;
        const int col = ld_j * SK_BK + ch * 8;
        const bool ok0 = xr < m && col < k, ok1 = xr + 32 < m && col < k;
        cp_async16(dst, ok0 ? x_src0 + ld_j * SK_BK : a, ok0 ? 16 : 0);
        cp_async16(dst + 32 * 128, ok1 ? x_src1 + ld_j * SK_BK : a, ok1 ? 16 : 0);
    };
    auto advance_loader = [&]() {
        if (++ld_j == kc) {
            ld_j = 0;
            w_rows(++ld_t);
        }
    };
    // Store rows (row, row + 8) x columns (col, col + 1) of tile t from one float4 of the accumulator order
    // (row 16 wq + lane / 4, column wg BN / 2 + 8 jj + 2 (lane % 4)); swiglu: `up` is the float4 of jj + N8 / 2.
    auto store4 = [&](int t, int row, int col_in_tile, float4 v, float4 up) {
        if (!swiglu) {
            const int col = t * BN + col_in_tile;
            if (col >= n) return;
            if (row < m)
                *reinterpret_cast<__nv_bfloat162*>(c + static_cast<size_t>(row) * n + col) =
                    __floats2bfloat162_rn(v.x, v.y);
            if (row + 8 < m)
                *reinterpret_cast<__nv_bfloat162*>(c + static_cast<size_t>(row + 8) * n + col) =
                    __floats2bfloat162_rn(v.z, v.w);
            return;
        }
        const int col = t * (BN / 2) + col_in_tile;
        if (col >= n_out) return;
        if (row < m)
            *reinterpret_cast<__nv_bfloat162*>(c + static_cast<size_t>(row) * n_out + col) =
                __floats2bfloat162_rn(silu_bf(round_bf(v.x)) * round_bf(up.x), silu_bf(round_bf(v.y)) * round_bf(up.y));
        if (row + 8 < m)
            *reinterpret_cast<__nv_bfloat162*>(c + static_cast<size_t>(row + 8) * n_out + col) =
                __floats2bfloat162_rn(silu_bf(round_bf(v.z)) * round_bf(up.z), silu_bf(round_bf(v.w)) * round_bf(up.w));
    };
    auto store_acc = [&](int t, const float (&v)[N8][4]) {
        const int row = wq * 16 + (lane >> 2), colq = (lane & 3) * 2;
#pragma unroll
        for (int jj = 0; jj < (swiglu ? N8 / 2 : N8); ++jj) {
            const float4 x = make_float4(v[jj][0], v[jj][1], v[jj][2], v[jj][3]);
            const int jup = jj + N8 / 2 < N8 ? jj + N8 / 2 : jj;
            const float4 up = make_float4(v[jup][0], v[jup][1], v[jup][2], v[jup][3]);
            store4(t, row, swiglu ? wg * (BN / 4) + jj * 8 + colq : wg * Geo::WN + jj * 8 + colq, x, up);
        }
    };

    // Weights first (no kernel writes them), then the PDL wait, then a's chunks of the same units: one commit group
    // a unit (the first also holds every prologue weight copy). AHEAD units are in flight ahead of the one the MMAs
    // read; with SK_MMA_LAG one more stage is still being read by the wgmma group left running.
    constexpr int AHEAD = Geo::STAGES - 1 - SK_MMA_LAG;
    {
        const int ld_t0 = ld_t, ld_j0 = ld_j;
        for (int s = 0; s < AHEAD && s < nu; ++s) {
            load_w(s);
            advance_loader();
        }
        kern_pdl_wait();
        kern_pdl_launch_dependents();
        ld_t = ld_t0, ld_j = ld_j0;
        w_rows(ld_t);
        for (int s = 0; s < AHEAD; ++s) {
            if (s < nu) {
                load_a(s);
                advance_loader();
            }
            cp_async_commit();
        }
    }

    float acc[N8][4];
#pragma unroll
    for (int j = 0; j < N8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const int first_tile = u0 / kc;
    int t = first_tile, j = u0 % kc;
    for (int i = 0; i < nu; ++i) {
        const int u = u0 + i, stage = i % Geo::STAGES;
        asm volatile("cp.async.wait_group %0;\n" ::"n"(AHEAD - 1) : "memory");
        fence_proxy_async_smem();
        // Unit u landed for every thread; the stage of unit u - 1 - SK_MMA_LAG was read by both warpgroups.
        __syncthreads();
        if (u + AHEAD < u1) {
            const int ns = (i + AHEAD) % Geo::STAGES;
            load_w(ns);
            load_a(ns);
            advance_loader();
        }
        cp_async_commit();

        const bool fresh = j == 0 || i == 0;
        const uint32_t xa = smem_addr(sm + stage * Geo::STAGE + Geo::W_BYTES);
        const uint32_t wa = smem_addr(sm + stage * Geo::STAGE) + wg * Geo::WN * 128;
        const bool seg_end = j == kc - 1 || u == u1 - 1;
        if (!(SK_PROBE & 2)) {
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < SK_BK / 16; ++kk)
                wgmma_ss<N8>(acc, sw128_desc(xa + kk * 32, 16, 1024), sw128_desc(wa + kk * 32, 16, 1024),
                             fresh && kk == 0 ? 0 : 1);
            wgmma_commit();
            if (SK_MMA_LAG && !seg_end) {
                wgmma_wait<SK_MMA_LAG>();
            } else {
                wgmma_wait<0>();
                reg_fence(acc);
            }
        }
        const int tile = t;
        if (++j == kc) j = 0, ++t;
        if (!seg_end) continue;

        // Tile `tile`'s segment in this block ends here.
        const int t_begin = tile * kc, t_end = t_begin + kc;
        if ((u0 <= t_begin && u1 >= t_end) || (SK_PROBE & 1)) {
            store_acc(tile, acc);
            continue;
        }
        const int b_first = sk_owner(t_begin, units, blocks), b_last = sk_owner(t_end - 1, units, blocks);
        const size_t tile_f4 = static_cast<size_t>(SK_BM) * BN / 4;  // float4s a partial
        auto slot_of = [&](int b) {  // slot 0: the tile of block b's first unit; 1: of its last
            return (2 * static_cast<size_t>(b) + ((b * units / blocks) / kc == tile ? 0 : 1)) * tile_f4;
        };
        float4* out4 = reinterpret_cast<float4*>(ws) + slot_of(me) + wg * (N8 * 128);
        if (wq * 16 + (lane >> 2) < m) {  // this thread's rows (r, r + 8): nothing is read back of rows >= m
#pragma unroll
            for (int jj = 0; jj < N8; ++jj)
                __stcg(out4 + jj * 128 + t128, make_float4(acc[jj][0], acc[jj][1], acc[jj][2], acc[jj][3]));
        }
        __syncthreads();
        const unsigned nc = static_cast<unsigned>(b_last - b_first + 1);
        if (tid == 0 && !(SK_PROBE & 8)) sk_arrive(tickets + 2 * tile);
        if (u != u1 - 1) continue;  // the tile's head, early in this block's range: the blocks ending in it reduce

        // Reducers: the contributors whose range ends in this tile (all but b_last when b_last's range runs past it),
        // each summing its share of the partials' float4s once all nc are in, in block order.
        const int b_red_last = (b_last + 1) * units / blocks > t_end ? b_last - 1 : b_last;
        const int reducers = b_red_last - b_first + 1, ri = me - b_first;
        if (tid == 0 && !(SK_PROBE & 12)) {
            const uint64_t t0 = global_ns();
            unsigned polls = 0;
            while (load_acquire(tickets + 2 * tile) < nc)
                if ((++polls & 1023u) == 0 && global_ns() - t0 > SK_WAIT_LIMIT_NS) __trap();
        }
        __syncthreads();
        const int items = swiglu ? N8 * 128 : 2 * N8 * 128;  // float4 positions (swiglu: gate ones, each with its up)
        const int lo = ri * items / reducers, hi = (ri + 1) * items / reducers;
        for (int it = lo + tid; it < hi; it += SK_THREADS) {
            // item -> (warpgroup, column block jj, thread of the warpgroup) in the accumulator order
            const int per_wg = swiglu ? (N8 / 2) * 128 : N8 * 128;
            const int g = it / per_wg, rest = it % per_wg, jj = rest / 128, th = rest % 128;
            const int row = (th >> 5) * 16 + ((th & 31) >> 2), col = (th & 3) * 2;
            if (row >= m) continue;
            const size_t off = static_cast<size_t>(g) * (N8 * 128) + jj * 128 + th;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f), up = v;
            for (int b0 = b_first; b0 <= b_last; b0 += 8) {  // 8 partials' loads in flight, then their adds in order
                float4 p[8], q[8];
#pragma unroll
                for (int x = 0; x < 8; ++x) {
                    if (b0 + x > b_last) break;
                    const float4* in4 = reinterpret_cast<const float4*>(ws) + slot_of(b0 + x) + off;
                    p[x] = __ldcg(in4);
                    if (swiglu) q[x] = __ldcg(in4 + (N8 / 2) * 128);
                }
#pragma unroll
                for (int x = 0; x < 8; ++x) {
                    if (b0 + x > b_last) break;
                    if (b0 + x == b_first) {
                        v = p[x], up = q[x];
                    } else {
                        v.x += p[x].x, v.y += p[x].y, v.z += p[x].z, v.w += p[x].w;
                        if (swiglu) up.x += q[x].x, up.y += q[x].y, up.z += q[x].z, up.w += q[x].w;
                    }
                }
            }
            store4(tile, row, swiglu ? g * (BN / 4) + jj * 8 + col : g * Geo::WN + jj * 8 + col, v, up);
        }
        __syncthreads();
        if (tid == 0 && !(SK_PROBE & 8) &&
            atomicAdd(tickets + 2 * tile + 1, 1u) == static_cast<unsigned>(reducers - 1)) {
            tickets[2 * tile] = 0u;  // every reducer has passed its wait: no one reads these again this launch
            tickets[2 * tile + 1] = 0u;
        }
    }
    cp_async_wait_all();
}

extern "C" __global__ void __launch_bounds__(SK_THREADS, 1) kern_gemm_skinny_n128(
    const __nv_bfloat16* a,  // [m, k]
    const __nv_bfloat16* w,  // [n, k]
    __nv_bfloat16* c,        // [m, n] (swiglu: [m, n / 2])
    float* ws,               // [2 gridDim.x, 64, 128] split partials
    unsigned* tickets,       // [2 tiles], zero between launches
    int m, int n, int k, int swiglu) {
    gemm_skinny<128>(a, w, c, ws, tickets, m, n, k, swiglu);
}

extern "C" __global__ void __launch_bounds__(SK_THREADS, 1) kern_gemm_skinny_n256(
    const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, float* ws, unsigned* tickets, int m, int n,
    int k, int swiglu) {
    gemm_skinny<256>(a, w, c, ws, tickets, m, n, k, swiglu);
}
