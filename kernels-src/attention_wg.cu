// Prefill attention on Hopper's warpgroup MMA (wgmma): kern_attn_prefill_wg, two warpgroups per block sharing
// every K / V tile. Built for sm_90a (tools/build_kernels.py MODULE_ARCH): wgmma exists only on the
// architecture-specific target.
//
// The contract of kern_attn_prefill (same parameters, same paged reads, the same 64-token K/V tiles walked from
// position 0, the same per-row online softmax: prefill.cuh), so every output row is bit for bit
// kern_attn_prefill's (tests/kernels/test_kernels_gpu.py); the two products of a tile run on wgmma:
//   S = Q K^T   wgmma.m64n64k16, A = Q from registers (ldmatrix once per pass), B = the K tile in shared
//               memory (K-major, 128-byte swizzle);
//   O += P V    wgmma.m64n{D}k16, A = P from registers (the S accumulator rounded to bf16: the accumulator
//               layout of m64nNk16 is the A-fragment layout, per warp that of mma.m16n8k16), B = the V tile
//               in shared memory (N-major, "transposed", the same swizzle).
// A warpgroup is 4 warps, 64 rows = one wgmma M; warp w owns the 16 query rows of one q head as
// kern_attn_prefill's warps do (G = 4: 16 positions x 4 heads per warpgroup; G = 2: 32 x 2; G = 1: 64 x 1;
// other G: passes of 4 heads). Every warp walks the block's tiles, also those wholly past its own rows (wgmma is
// warpgroup-wide), where kern_attn_prefill's warp skips them: there P = 0 and alpha = 1, so its rows are
// unchanged as long as V is finite (a non-finite V at a later position of the chunk would reach them).
// Software pipeline per warpgroup: S of tile t + 1 and O += P(t) V(t) are in
// flight together and the softmax of tile t + 1 runs under P V (FlashAttention-3's intra-warpgroup overlap,
// Shah et al. 2024, section 3.2). K is copied two tiles ahead and V one (cp.async, double buffers), one
// barrier per tile. A tile is 64 tokens x 128 bytes per 64 head dims, 16-byte chunk c of token r at chunk
// c ^ (r % 8) (the SWIZZLE_128B pattern the descriptors name), so neither the copies nor the tensor cores'
// reads conflict; the tiles start on a 1,024-byte boundary (the pattern's period), hence 1,024 bytes of slack
// in WG_SMEM_BYTES. A launch with less dynamic shared memory, a head_dim other than 64 / 128, or a kv_cache
// not 16-byte aligned returns after the PDL wait without writing (tools/gen_qwen3.py keeps r32 for other
// head_dims). grid.x >= cdiv(max q rows, 16 WGS); blocks past a sequence's rows exit; heaviest blocks first.
//
// PTX ISA 8.x, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate": the shared-memory matrix
// descriptor (start, leading / stride byte offsets >> 4, swizzle mode in bits 62-63), the canonical
// SWIZZLE_128B layouts (K-major: 8-row groups SBO apart, LBO unused; MN-major: 64-element atoms LBO apart
// along N, 8-row groups SBO apart along K), and the fence / commit / wait rules followed below.
#include "common.cuh"
#include "prefill.cuh"

#define WG_ROWS 16                          // query rows per warp: a warpgroup is one m64 tile
#define WG_TILE_BYTES (PF_BN * PF_MAX_D * 2)  // one K or V tile at the largest head_dim: 16,384 bytes
#define WG_CB_BYTES (PF_BN * 128)           // one 64-dim column block of a tile (8,192 bytes)
#define WG_Q_BYTES (4 * WG_ROWS * 256)     // Q staging of one warpgroup: 64 rows of 256 bytes

// WGS warpgroups share each K / V tile. Dynamic shared memory: sizeof + 1,024 of alignment slack
// (WG_SMEM_BYTES): 102,912 bytes for kern_attn_prefill_wg's two warpgroups.
template <int WGS>
struct PrefillSmemWg {
    unsigned char k[2][WG_TILE_BYTES];  // K of tiles t (buffer t % 2) and t + 1
    unsigned char v[2][WG_TILE_BYTES];  // V of tiles t and t + 1
    unsigned char q[WGS * WG_Q_BYTES];  // Q rows, staged once per pass on their way to registers
    int64_t off[3][PF_BN];  // tile j's token element offsets from kv_cache (-1: absent) in off[j % 3]
    float2 sink[128 * WGS];  // written, never read: orders each thread's softmax before its wgmma wait
};
#define WG_SMEM_BYTES(wgs) (sizeof(PrefillSmemWg<wgs>) + 1024)
static_assert(WG_SMEM_BYTES(2) == 102912, "tools/gen_qwen3.py PREFILL_ATTN['wg'] shared memory bytes");

KERN_DEV uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// A shared-memory matrix descriptor with the 128-byte swizzle (byte offsets, multiples of 16).
KERN_DEV uint64_t sw128_desc(uint32_t start, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((start & 0x3FFFFu) >> 4) | ((uint64_t)((lbo & 0x3FFFFu) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}

KERN_DEV void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
KERN_DEV void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Until at most N committed wgmma groups of this warp are still running (groups retire in commit order).
template <int N>
KERN_DEV void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy writes to shared memory (cp.async, st.shared) made visible to the async proxy that wgmma
// reads through: each writer fences after its copies land, before the barrier.
KERN_DEV void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Pin accumulator registers at a point of the instruction stream (no instruction is emitted): the compiler
// may not move their reads above a wgmma wait nor their writes below a wgmma fence.
template <int N8>
KERN_DEV void reg_fence(float (&d)[N8][4]) {
#pragma unroll
    for (int j = 0; j < N8; ++j)
        asm volatile("" : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])::"memory");
}

template <int N>
KERN_DEV void reg_fence_u32(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j) asm volatile("" : "+r"(r[j][0]), "+r"(r[j][1]), "+r"(r[j][2]), "+r"(r[j][3])::"memory");
}

#define WG_ACC4(x, j) "+f"(x[j][0]), "+f"(x[j][1]), "+f"(x[j][2]), "+f"(x[j][3])

// d[64 x 64] (+)= A[64 x 16] (registers, bf16) * B (descriptor; trans_b 0: K-major, 1: N-major).
template <int TRANS_B>
KERN_DEV void wgmma_m64n64k16_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), WG_ACC4(d, 6),
          WG_ACC4(d, 7)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}

// d[64 x 128] (+)= A[64 x 16] (registers, bf16) * B (descriptor; trans_b as above).
template <int TRANS_B>
KERN_DEV void wgmma_m64n128k16_rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), WG_ACC4(d, 6),
          WG_ACC4(d, 7), WG_ACC4(d, 8), WG_ACC4(d, 9), WG_ACC4(d, 10), WG_ACC4(d, 11), WG_ACC4(d, 12),
          WG_ACC4(d, 13), WG_ACC4(d, 14), WG_ACC4(d, 15)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}
#undef WG_ACC4

// O += P V for one k-step (16 tokens) at head width D.
template <int D>
KERN_DEV void wgmma_pv(float (&o)[D / 8][4], const uint32_t (&pa)[4], uint64_t desc_v) {
    if constexpr (D == 128) {
        wgmma_m64n128k16_rs<1>(o, pa, desc_v, 1);
    } else {
        static_assert(D == 64, "kern_attn_prefill_wg: head_dim 64 or 128");
        wgmma_m64n64k16_rs<1>(o, pa, desc_v, 1);
    }
}

// Copy part (K or V: part_base, 16-byte aligned) of the tile whose token element offsets are in offs[] (-1:
// absent) into the swizzled tile at dst, asynchronously (cp.async, zero fill for absent tokens). Thread (r0 =
// tid / 16, c = tid % 16) of THREADS copies 16-byte chunk c of tokens r0 + (THREADS / 16) i.
template <int THREADS>
KERN_DEV void wg_copy(unsigned char* dst, const int64_t* offs, const __nv_bfloat16* part_base, int C, int tid) {
    constexpr int STEP = THREADS / 16;  // tokens per pass, a multiple of 8
    const int c = tid & 15, r0 = tid >> 4;
    if (c >= C) return;
    const __nv_bfloat16* base = part_base + c * 8;
    unsigned char* col = dst + (c >> 3) * WG_CB_BYTES + (((c & 7) ^ (r0 & 7)) << 4);  // (r0 + STEP i) % 8 == r0 % 8
#pragma unroll
    for (int i = 0; i < PF_BN / STEP; ++i) {
        const int r = r0 + STEP * i;
        const int64_t off = offs[r];
        cp_async16(col + r * 128, off >= 0 ? base + off : part_base, off >= 0 ? 16 : 0);
    }
}

// Q staging: 64 rows of 256 bytes per warpgroup, 16-byte chunk c of row r at chunk
// (c & 8) | ((c ^ r) & 7), so ldmatrix's 8 rows of one chunk hit 8 different bank groups.
KERN_DEV int q_chunk_byte(int r, int c) { return r * 256 + (((c & 8) | ((c ^ r) & 7)) << 4); }

template <int D, int WGS>
KERN_DEV void prefill_body_wg(PrefillSmemWg<WGS>& sm, const __nv_bfloat16* q, const __nv_bfloat16* kv_cache,
                              const int32_t* bt_row, __nv_bfloat16* out, int num_q_heads, int num_kv_heads,
                              int page_tokens, int bt_stride, int num_pages, float scale, int kvh, int q_start,
                              int q_len, int ctx0, int row0, int kv_end, int hpb, int slabs, int G) {
    constexpr int NK = D / 16;  // k-steps of S = Q K^T; O has 2 NK n8 tiles
    constexpr int C = D / 8;    // 16-byte chunks per token row
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3, mi = lane >> 3;
    const bool qvec = aligned16(q);
    const int64_t token_elems = (int64_t)num_kv_heads * D;
    const int64_t head_off = (int64_t)kvh * D;
    const float sl2 = scale * LOG2E;
    const uint32_t page_limit = (uint32_t)max(num_pages, 0);
    const int tiles = (kv_end + PF_BN - 1) / PF_BN;  // block-uniform

    const int slab = warp / hpb;
    const int wr0 = row0 + slab * WG_ROWS;
    const bool rows_ok = slab < slabs && wr0 < q_len;  // warp-uniform
    const int w_first = ctx0 + wr0;

    auto token_page = [&](int kv0, int& pi) -> int {
        const int tok = kv0 + tid;
        pi = tok / page_tokens;
        return (tid < PF_BN && tok < kv_end && pi < bt_stride) ? bt_row[pi] : -1;
    };
    auto token_off = [&](int kv0, int pi, int page) -> int64_t {
        return (uint32_t)page < page_limit
                   ? ((int64_t)page * 2 * page_tokens + (kv0 + tid - pi * page_tokens)) * token_elems + head_off
                   : -1;
    };
    // Tile j's row offsets live in off[j % 3]: its K is copied two iterations ahead, its V one.
    auto fill_off = [&](int j) {
        int pi;
        const int page = token_page(j * PF_BN, pi);
        if (tid < PF_BN) sm.off[j % 3][tid] = token_off(j * PF_BN, pi, page);
    };
    const __nv_bfloat16* k_base = kv_cache;
    const __nv_bfloat16* v_base = kv_cache + (int64_t)page_tokens * token_elems;
    auto copy_k = [&](int j) { wg_copy<128 * WGS>(sm.k[j & 1], sm.off[j % 3], k_base, C, tid); };
    auto copy_v = [&](int j) { wg_copy<128 * WGS>(sm.v[j & 1], sm.off[j % 3], v_base, C, tid); };
    const uint32_t k_sh = smem_addr(sm.k[0]), v_sh = smem_addr(sm.v[0]);
    unsigned char* qs = sm.q;
    const uint32_t sink = smem_addr(&sm.sink[tid]);

    for (int g0 = 0; g0 < G; g0 += hpb) {
        const int g = g0 + warp % hpb;
        const bool active = rows_ok && g < G;  // warp-uniform
        const int hq = kvh * G + g;

        float o[2 * NK][4];
#pragma unroll
        for (int dt = 0; dt < 2 * NK; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
        float m_a = -CUDART_INF_F, m_b = -CUDART_INF_F, l_a = 0.0f, l_b = 0.0f;
        uint32_t qf[NK][4];         // Q A fragments
        float s[PF_BN / 8][4];      // S of the tile in flight
        uint32_t pa[PF_BN / 16][4]; // P of the tile whose O += P V is next

        // S = Q K(j)^T issued (not waited): NK k-steps, column block kk / 4, 32 bytes per k-step within it.
        auto issue_qk = [&](int j) {
            const uint32_t kt = k_sh + (j & 1) * WG_TILE_BYTES;
#pragma unroll
            for (int kk = 0; kk < NK; ++kk)
                wgmma_m64n64k16_rs<0>(s, qf[kk], sw128_desc(kt + (kk >> 2) * WG_CB_BYTES + (kk & 3) * 32, 16, 1024),
                                      kk > 0);
            wgmma_commit();
        };
        // O += P V(j) issued: 4 k-steps of 16 tokens (2,048 bytes apart); N = D in 64-dim atoms 8,192 apart.
        auto issue_pv = [&](int j) {
            const uint32_t vt = v_sh + (j & 1) * WG_TILE_BYTES;
#pragma unroll
            for (int kk = 0; kk < PF_BN / 16; ++kk) wgmma_pv<D>(o, pa[kk], sw128_desc(vt + kk * 16 * 128, WG_CB_BYTES, 1024));
            wgmma_commit();
        };
        // Causal mask of tile j's scores, when the tile crosses this warp's diagonal (warp-uniform).
        auto mask = [&](int j) {
            const int kv0 = j * PF_BN;
            if (kv0 + PF_BN - 1 > w_first) {
                const int pos_a = w_first + gid, pos_b = pos_a + 8;
#pragma unroll
                for (int nt = 0; nt < PF_BN / 8; ++nt) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = kv0 + nt * 8 + tig * 2 + (e & 1);
                        if (key > ((e < 2) ? pos_a : pos_b)) s[nt][e] = -CUDART_INF_F;
                    }
                }
            }
        };

        __syncthreads();  // a previous pass is done with the tiles and the row tables
        // This warp's 16 Q rows into rows 16 warp + [0, 16) of the staging: lane copies chunk lane % 16 of rows
        // lane / 16 + 2 i; rows past q_len and idle warps get zeros.
        {
            const int c = lane & 15;
#pragma unroll
            for (int i = 0; i < WG_ROWS / 2; ++i) {
                const int r = (lane >> 4) + 2 * i;
                const bool ok = active && wr0 + r < q_len && c < C;
                const __nv_bfloat16* src = q + ((int64_t)(q_start + wr0 + r) * num_q_heads + hq) * D + c * 8;
                unsigned char* dst = qs + q_chunk_byte(warp * WG_ROWS + r, c);
                if (c >= C) continue;
                if (qvec) {
                    cp_async16(dst, ok ? src : q, ok ? 16 : 0);
                } else {
                    float f[8];
#pragma unroll
                    for (int e = 0; e < 8; ++e) f[e] = ok ? bf2f(src[e]) : 0.0f;
                    store8_vec(reinterpret_cast<__nv_bfloat16*>(dst), f);
                }
            }
        }
        fill_off(0);
        fill_off(1);
        fill_off(2);
        __syncthreads();
        if (tiles > 0) {
            copy_k(0);
            copy_v(0);
        }
        if (tiles > 1) copy_k(1);
        cp_async_commit();  // Q, K(0), V(0), K(1)
        cp_async_wait_all();
        fence_proxy_async_smem();
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < NK; ++kk)
            ldsm_x4(qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3],
                    qs + q_chunk_byte(warp * WG_ROWS + (mi & 1) * 8 + (lane & 7), kk * 2 + (mi >> 1)));
        if (tiles > 0) {  // P(0)
            wgmma_fence();
            issue_qk(0);
            wgmma_wait<0>();
            reg_fence(s);
            mask(0);
            float alpha_a, alpha_b;
            pf_softmax_stats(s, m_a, m_b, l_a, l_b, sl2, alpha_a, alpha_b);
            pf_rescale(o, alpha_a, alpha_b);
            pf_pack_p(s, pa);
        }

        // Iteration t: S(t + 1) and O += P(t) V(t) in flight together; the softmax of tile t + 1 runs under P V.
        // The loop body is branch-free around the wgmma (ptxas serializes them when a pipeline stage is opened
        // under a condition); the last tile's P V follows the loop.
        for (int t = 0; t + 1 < tiles; ++t) {
            // K(t + 1) and V(t) landed; every warp is past S(t) (K buffer t % 2 is free) and past O += P(t - 1)
            // V(t - 1) (V buffer (t + 1) % 2 is free)
            cp_async_wait_all();
            fence_proxy_async_smem();
            __syncthreads();
            if (t + 2 < tiles) copy_k(t + 2);
            copy_v(t + 1);
            cp_async_commit();
            int next_pi;
            const int next_page = token_page((t + 3) * PF_BN, next_pi);  // block-table read overlaps the math

            // Each batch opens its own wgmma pipeline stage (a fence); o was rescaled and pa written above.
            reg_fence(o);
            reg_fence_u32(pa);
            wgmma_fence();
            issue_qk(t + 1);
            wgmma_fence();
            issue_pv(t);
            wgmma_wait<1>();  // S(t + 1) done (groups retire in commit order); P V still running
            reg_fence(s);
            mask(t + 1);
            float alpha_a, alpha_b;
            pf_softmax_stats(s, m_a, m_b, l_a, l_b, sl2, alpha_a, alpha_b);
            // A shared-memory store of the row sums (which need every exp of the tile) before the wait: ptxas keeps
            // it before the wgmma wait and so cannot hoist the wait above the softmax (it does without it).
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(sink), "f"(l_a), "f"(l_b) : "memory");
            wgmma_wait<0>();
            reg_fence(o);
            reg_fence_u32(pa);  // P(t) stays in its registers until its wgmma is done
            pf_rescale(o, alpha_a, alpha_b);
            pf_pack_p(s, pa);
            // off[t % 3] (tile t's) was last read by V(t)'s copy, issued before this iteration's barrier
            if (tid < PF_BN) sm.off[t % 3][tid] = token_off((t + 3) * PF_BN, next_pi, next_page);
        }
        if (tiles > 0) {  // O += P V of the last tile
            cp_async_wait_all();
            fence_proxy_async_smem();
            __syncthreads();
            reg_fence(o);
            reg_fence_u32(pa);
            wgmma_fence();
            issue_pv(tiles - 1);
            wgmma_wait<0>();
            reg_fence(o);
        }
        cp_async_wait_all();  // no copy outlives the pass

        if (active) {
            const int row_a = wr0 + gid, row_b = row_a + 8;
            const float inv_a = l_a > 0.0f ? 1.0f / l_a : 0.0f;
            const float inv_b = l_b > 0.0f ? 1.0f / l_b : 0.0f;
            __nv_bfloat16* oa = out + ((int64_t)(q_start + row_a) * num_q_heads + hq) * D;
            __nv_bfloat16* ob = out + ((int64_t)(q_start + row_b) * num_q_heads + hq) * D;
#pragma unroll
            for (int dt = 0; dt < 2 * NK; ++dt) {
                const int col = dt * 8 + tig * 2;
                if (row_a < q_len)
                    *reinterpret_cast<uint32_t*>(oa + col) = pack_bf16x2(o[dt][0] * inv_a, o[dt][1] * inv_a);
                if (row_b < q_len)
                    *reinterpret_cast<uint32_t*>(ob + col) = pack_bf16x2(o[dt][2] * inv_b, o[dt][3] * inv_b);
            }
        }
    }
}

// grid (>= cdiv(max_q_tokens, 16 WGS), num_kv_heads, seqs), block (128 WGS,1,1), dynamic shared memory
// WG_SMEM_BYTES(WGS). Parameters as kern_attn_prefill.
template <int WGS>
KERN_DEV void attn_prefill_wg(const __nv_bfloat16* q, const __nv_bfloat16* kv_cache, const int32_t* block_table,
                              const int32_t* cu_seqlens_q, const int32_t* seq_lens, __nv_bfloat16* out,
                              int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t page_tokens,
                              int32_t bt_stride, int32_t num_pages, float scale, unsigned char* smem) {
    kern_pdl_wait();
    kern_pdl_launch_dependents();
    const uint32_t pad = (0u - smem_addr(smem)) & 1023u;  // tiles on a 1,024-byte boundary
    if (dynamic_smem_bytes() < sizeof(PrefillSmemWg<WGS>) + pad) return;
    PrefillSmemWg<WGS>& sm = *reinterpret_cast<PrefillSmemWg<WGS>*>(smem + pad);
    const int kvh = blockIdx.y, s = blockIdx.z;
    const int D = head_dim;
    if (num_kv_heads <= 0 || kvh >= num_kv_heads || num_q_heads % num_kv_heads != 0 || (D != 64 && D != 128) ||
        page_tokens <= 0 || !(scale > 0.0f) || !aligned16(kv_cache))
        return;
    constexpr int warps = 4 * WGS;
    const int G = num_q_heads / num_kv_heads;
    const int hpb = (G <= 4 && 4 % G == 0) ? G : 4;  // heads per pass; a warpgroup is whole slabs
    const int slabs = warps / hpb;
    const int qt = gridDim.x - 1 - blockIdx.x;
    const int q_start = cu_seqlens_q[s];
    const int q_len = cu_seqlens_q[s + 1] - q_start;
    const int row0 = qt * WG_ROWS * slabs;
    if (row0 >= q_len) return;
    const int rows_here = min(WG_ROWS * slabs, q_len - row0);
    const int seq_len = max(seq_lens[s], 0);
    const int ctx0 = seq_len - q_len;
    const int kv_end = max(0, min(seq_len, ctx0 + row0 + rows_here));
    const int32_t* bt_row = block_table + (int64_t)s * bt_stride;
    if (D == 128)
        prefill_body_wg<128, WGS>(sm, q, kv_cache, bt_row, out, num_q_heads, num_kv_heads, page_tokens, bt_stride,
                                  num_pages, scale, kvh, q_start, q_len, ctx0, row0, kv_end, hpb, slabs, G);
    else
        prefill_body_wg<64, WGS>(sm, q, kv_cache, bt_row, out, num_q_heads, num_kv_heads, page_tokens, bt_stride,
                                 num_pages, scale, kvh, q_start, q_len, ctx0, row0, kv_end, hpb, slabs, G);
}

#define WG_ENTRY(name, wgs, min_blocks)                                                                            \
    extern "C" __global__ void __launch_bounds__(128 * wgs, min_blocks)                                           \
        name(const __nv_bfloat16* q, const __nv_bfloat16* kv_cache, const int32_t* block_table,                  \
             const int32_t* cu_seqlens_q, const int32_t* seq_lens, __nv_bfloat16* out, int32_t num_q_heads,       \
             int32_t num_kv_heads, int32_t head_dim, int32_t page_tokens, int32_t bt_stride, int32_t num_pages,    \
             float scale) {                                                                                      \
        extern __shared__ __align__(16) unsigned char smem[];                                                    \
        attn_prefill_wg<wgs>(q, kv_cache, block_table, cu_seqlens_q, seq_lens, out, num_q_heads, num_kv_heads,    \
                             head_dim, page_tokens, bt_stride, num_pages, scale, smem);                          \
    }
// Two warpgroups per block, one block per SM (203 registers). One warpgroup per block (two blocks per SM, twice
// the K / V tile traffic per row) measured slower at every chunk (docs/perf.md "Prefill, tenth session").
WG_ENTRY(kern_attn_prefill_wg, 2, 1)
#undef WG_ENTRY
