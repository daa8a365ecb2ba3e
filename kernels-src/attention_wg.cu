// Prefill attention on Hopper's warpgroup MMA (wgmma): kern_attn_prefill_wg, warp-specialized (a producer warpgroup
// copies K / V tiles, two consumer warpgroups compute). Built for sm_90a (tools/build_kernels.py MODULE_ARCH):
// wgmma and setmaxnreg exist only on the architecture-specific target.
//
// The contract of kern_attn_prefill (same parameters, same paged reads, the same 64-token K/V tiles walked from
// position 0, the same per-row online softmax: prefill.cuh), so every output row is bit for bit
// kern_attn_prefill's (tests/kernels/test_kernels_gpu.py); the two products of a tile run on wgmma:
//   S = Q K^T   wgmma.m64n64k16, A = Q from registers (ldmatrix once per pass), B = the K tile in shared
//               memory (K-major, 128-byte swizzle);
//   O += P V    wgmma.m64n{D}k16, A = P from registers (the S accumulator rounded to bf16: the accumulator
//               layout of m64nNk16 is the A-fragment layout, per warp that of mma.m16n8k16), B = the V tile
//               in shared memory (N-major, "transposed", the same swizzle).
// Block: 384 threads, three warpgroups (FlashAttention-3's warp specialization, Shah et al. 2024, section 3.1):
//   warpgroup 0, the producer (setmaxnreg 40): per tile it reads the block table, writes the 64 tokens' byte
//     addresses to shared memory, waits until the ring stage is free (mbarrier `empty`), copies the tile's K and
//     V into it with cp.async (zero fill for absent tokens), and once the copies of the tile before have landed
//     fences them for the async proxy and arrives on that stage's `full` mbarrier;
//   warpgroups 1 and 2, the consumers (setmaxnreg 232): 64 query rows each, one wgmma M. Consumer warp w owns
//     the 16 query rows of one q head as kern_attn_prefill's warps do (G = 4: 16 positions x 4 heads per
//     warpgroup; G = 2: 32 x 2; G = 1: 64 x 1; other G: passes of 4 heads). Per tile t: wait `full` of tile
//     t + 1, issue S(t + 1) and O += P(t) V(t) together, softmax of tile t + 1 under P V (the intra-warpgroup
//     overlap, section 3.2), then each warp arrives on `empty` of tile t. The two consumer warpgroups take turns
//     to issue (named barriers 2 and 3: ping-pong, section 3.1), so one's softmax runs under the other's wgmma.
// Nothing but the mbarriers couples the three: no block-wide barrier after the start. Every consumer warp walks
// the block's tiles, also those wholly past its own rows (wgmma is warpgroup-wide), where kern_attn_prefill's
// warp skips them: there P = 0 and alpha = 1, so its rows are unchanged as long as V is finite (a non-finite V
// at a later position of the chunk would reach them). O is rescaled only when a row of the warp changed its max
// (x * 1 is x). A tile is 64 tokens x 128 bytes per 64 head dims, 16-byte chunk c of token r at chunk c ^ (r %
// 8) (the SWIZZLE_128B pattern the descriptors name), so neither the copies nor the tensor cores' reads
// conflict; the tiles start on a 1,024-byte boundary (the pattern's period), hence 1,024 bytes of slack in
// WG_SMEM_BYTES. A launch with less dynamic shared memory, a block other than 384 threads, no q head, a head_dim
// other than 64 / 128, or a kv_cache not 16-byte aligned returns after the PDL wait without writing
// (tools/gen_qwen3.py keeps r32 for other head_dims). grid.x >= cdiv(max q rows, 32); blocks past a sequence's
// rows exit; heaviest blocks first.
//
// PTX ISA 8.x: "Asynchronous Warpgroup Level Matrix Multiply-Accumulate" (the shared-memory matrix descriptor:
// start, leading / stride byte offsets >> 4, swizzle mode in bits 62-63; the canonical SWIZZLE_128B layouts,
// K-major: 8-row groups SBO apart, LBO unused; MN-major: 64-element atoms LBO apart along N, 8-row groups SBO
// apart along K; the fence / commit / wait rules followed below), "mbarrier" (init, arrive, try_wait.parity:
// phase parities), "setmaxnreg", "bar.sync / bar.arrive" (named barriers).
#include "common.cuh"
#include "prefill.cuh"
#include "persistent_sync.cuh"  // global_ns
#include "wgmma.cuh"

#define WG_ROWS 16                            // query rows per consumer warp: a warpgroup is one m64 tile
#define WG_TILE_BYTES (PF_BN * PF_MAX_D * 2)  // one K or V tile at the largest head_dim: 16,384 bytes
#define WG_CB_BYTES (PF_BN * 128)             // one 64-dim column block of a tile (8,192 bytes)
#define WG_Q_BYTES (4 * WG_ROWS * 256)        // Q staging of one warpgroup: 64 rows of 256 bytes
#define WG_STAGES 4                           // K / V ring stages (>= 3: the producer publishes a tile one late)
#define WG_THREADS 384                        // producer + two consumer warpgroups

// Dynamic shared memory: sizeof + 1,024 of alignment slack (WG_SMEM_BYTES), 169,024 bytes.
struct PrefillSmemWg {
    unsigned char k[WG_STAGES][WG_TILE_BYTES];  // K of tile j in stage j % WG_STAGES
    unsigned char v[WG_STAGES][WG_TILE_BYTES];  // V of tile j, the same stage
    unsigned char q[2 * WG_Q_BYTES];            // Q rows of both consumer warpgroups, staged once per pass
    int64_t addr[WG_STAGES][PF_BN];             // producer only: the stage's tokens' K row byte addresses (0: absent)
    uint64_t full[WG_STAGES];   // mbarrier, 128 producer arrivals: the stage's K and V landed
    uint64_t empty[WG_STAGES];  // mbarrier, 8 consumer-warp arrivals: the stage's K and V were read
    float2 sink[2 * 128];       // written, never read: orders each consumer thread's softmax before its wgmma wait
};
#define WG_SMEM_BYTES (sizeof(PrefillSmemWg) + 1024)
static_assert(WG_SMEM_BYTES == 169024, "tools/gen_qwen3.py PREFILL_ATTN['wg'] shared memory bytes");

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

// Q staging: 64 rows of 256 bytes per warpgroup, 16-byte chunk c of row r at chunk
// (c & 8) | ((c ^ r) & 7), so ldmatrix's 8 rows of one chunk hit 8 different bank groups.
KERN_DEV int q_chunk_byte(int r, int c) { return r * 256 + (((c & 8) | ((c ^ r) & 7)) << 4); }

KERN_DEV void mbar_init(uint64_t* b, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(b)), "r"(count) : "memory");
}
KERN_DEV void mbar_arrive(uint64_t* b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(b)) : "memory");
}
// Until the phase of parity `parity` of barrier b completed. A wait longer than WG_WAIT_LIMIT_NS (the clock read
// every 1,024 polls) traps, so a broken mbarrier protocol is a launch error rather than a hang; the legitimate
// waits here last microseconds (one tile's copies or math). Only these waits: the named barriers and setmaxnreg
// have no timeout, which is why the entry refuses every launch shape that could leave them waiting.
#define WG_WAIT_LIMIT_NS 10000000000ull  // 10 s
KERN_DEV void mbar_wait(uint64_t* b, uint32_t parity) {
    const uint32_t a = smem_addr(b);
    uint64_t since = 0;
    for (uint32_t spins = 1;; ++spins) {
        uint32_t ok;
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(ok)
            : "r"(a), "r"(parity)
            : "memory");
        if (ok) return;
        if ((spins & 1023u) == 0) {
            const uint64_t now = global_ns();
            if (since == 0) {
                since = now;
            } else if (now - since > WG_WAIT_LIMIT_NS) {
                __trap();
            }
        }
    }
}
KERN_DEV void named_bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
KERN_DEV void named_bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

template <int D>
KERN_DEV void prefill_body_wg(PrefillSmemWg& sm, const __nv_bfloat16* q, const __nv_bfloat16* kv_cache,
                              const int32_t* bt_row, __nv_bfloat16* out, int num_q_heads, int num_kv_heads,
                              int page_tokens, int bt_stride, int num_pages, float scale, int kvh, int q_start,
                              int q_len, int ctx0, int row0, int kv_end, int hpb, int slabs, int G) {
    constexpr int NK = D / 16;
    constexpr int C = D / 8;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t token_elems = (int64_t)num_kv_heads * D;
    const int64_t head_off = (int64_t)kvh * D;
    const uint32_t page_limit = (uint32_t)max(num_pages, 0);
    const int tiles = (kv_end + PF_BN - 1) / PF_BN;  // block-uniform
    const int passes = (G + hpb - 1) / hpb;

    if (warp < 4) {  // ---- producer warpgroup: block table -> addresses -> cp.async K / V -> full[stage]
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        const int64_t v_delta = 2 * (int64_t)page_tokens * token_elems;
        const int c = tid & 15, r0 = tid >> 4;  // chunk c of tokens r0 + 8 i
        auto page_of = [&](int tok, int& pi) -> int {
            pi = tok / page_tokens;
            return (tok < kv_end && pi < bt_stride) ? bt_row[pi] : -1;
        };
        int it = 0;
        for (int pass = 0; pass < passes; ++pass) {
            int pi = 0, page = -1;
            if (tid < PF_BN) page = page_of(tid, pi);
            for (int j = 0; j < tiles; ++j, ++it) {
                const int st = it % WG_STAGES;
                if (tid < PF_BN) {
                    const int tok = j * PF_BN + tid;
                    sm.addr[st][tid] =
                        (uint32_t)page < page_limit
                            ? reinterpret_cast<int64_t>(kv_cache) +
                                  2 * (((int64_t)page * 2 * page_tokens + (tok - pi * page_tokens)) * token_elems +
                                       head_off)
                            : 0;
                    page = page_of(tok + PF_BN, pi);  // the next tile's page, read under this tile's copies
                }
                named_bar_sync(1, 128);
                mbar_wait(&sm.empty[st], ((it / WG_STAGES) & 1) ^ 1);
                const int64_t add = c * 16;
#pragma unroll
                for (int i = 0; i < PF_BN / 8; ++i) {
                    const int r = r0 + 8 * i;
                    const int64_t a = sm.addr[st][r];
                    const int sw = (r * 128) + (((c & 7) ^ (r & 7)) << 4) + (c >> 3) * WG_CB_BYTES;
                    if (c < C) {
                        cp_async16(sm.k[st] + sw, a != 0 ? reinterpret_cast<const void*>(a + add) : kv_cache,
                                   a != 0 ? 16 : 0);
                        cp_async16(sm.v[st] + sw, a != 0 ? reinterpret_cast<const void*>(a + v_delta + add) : kv_cache,
                                   a != 0 ? 16 : 0);
                    }
                }
                cp_async_commit();
                if (j > 0) {  // the previous tile's copies landed: publish them
                    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
                    fence_proxy_async_smem();
                    mbar_arrive(&sm.full[(it - 1) % WG_STAGES]);
                }
            }
            if (tiles > 0) {
                cp_async_wait_all();
                fence_proxy_async_smem();
                mbar_arrive(&sm.full[(it - 1) % WG_STAGES]);
            }
        }
        return;
    }

    // ---- two consumer warpgroups: cw 0 / 1, warps cwarp 0..7 as kern_attn_prefill_wg's
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int cwarp = warp - 4, cw = cwarp >> 2;
    const int gid = lane >> 2, tig = lane & 3, mi = lane >> 3;
    const bool qvec = aligned16(q);
    const float sl2 = scale * LOG2E;
    const int slab = cwarp / hpb;
    const int wr0 = row0 + slab * WG_ROWS;
    const bool rows_ok = slab < slabs && wr0 < q_len;
    const int w_first = ctx0 + wr0;
    unsigned char* qs = sm.q;
    const uint32_t k_sh = smem_addr(sm.k[0]), v_sh = smem_addr(sm.v[0]);
    const uint32_t sink = smem_addr(&sm.sink[tid - 128]);
    int it = 0;

    for (int g0 = 0; g0 < G; g0 += hpb) {
        const int g = g0 + cwarp % hpb;
        const bool active = rows_ok && g < G;
        const int hq = kvh * G + g;
        float o[2 * NK][4];
#pragma unroll
        for (int dt = 0; dt < 2 * NK; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
        float m_a = -CUDART_INF_F, m_b = -CUDART_INF_F, l_a = 0.0f, l_b = 0.0f;
        uint32_t qf[NK][4];
        float s[PF_BN / 8][4];
        uint32_t pa[PF_BN / 16][4];

        auto issue_qk = [&](int j) {
            const uint32_t kt = k_sh + ((it + j) % WG_STAGES) * WG_TILE_BYTES;
#pragma unroll
            for (int kk = 0; kk < NK; ++kk)
                wgmma_m64n64k16_rs<0>(s, qf[kk], sw128_desc(kt + (kk >> 2) * WG_CB_BYTES + (kk & 3) * 32, 16, 1024),
                                      kk > 0);
            wgmma_commit();
        };
        auto issue_pv = [&](int j) {
            const uint32_t vt = v_sh + ((it + j) % WG_STAGES) * WG_TILE_BYTES;
#pragma unroll
            for (int kk = 0; kk < PF_BN / 16; ++kk) wgmma_pv<D>(o, pa[kk], sw128_desc(vt + kk * 16 * 128, WG_CB_BYTES, 1024));
            wgmma_commit();
        };
        auto wait_full = [&](int j) { mbar_wait(&sm.full[(it + j) % WG_STAGES], ((it + j) / WG_STAGES) & 1); };
        auto release = [&](int j) {
            if (lane == 0) mbar_arrive(&sm.empty[(it + j) % WG_STAGES]);
        };
        auto mask = [&](int j) {
            const int kv0 = j * PF_BN;
            if (kv0 + PF_BN - 1 > w_first) {
                pf_causal_mask(s, kv0, tig, w_first + gid, w_first + gid + 8);
            }
        };

        {  // this warp's 16 Q rows (its own staging rows: a warp-level wait is enough)
            const int c = lane & 15;
#pragma unroll
            for (int i = 0; i < WG_ROWS / 2; ++i) {
                const int r = (lane >> 4) + 2 * i;
                const bool ok = active && wr0 + r < q_len && c < C;
                const __nv_bfloat16* src = q + ((int64_t)(q_start + wr0 + r) * num_q_heads + hq) * D + c * 8;
                unsigned char* dst = qs + q_chunk_byte(cwarp * WG_ROWS + r, c);
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
            cp_async_commit();
            cp_async_wait_all();
            __syncwarp();
        }
#pragma unroll
        for (int kk = 0; kk < NK; ++kk)
            ldsm_x4(qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3],
                    qs + q_chunk_byte(cwarp * WG_ROWS + (mi & 1) * 8 + (lane & 7), kk * 2 + (mi >> 1)));
        // ping-pong: warpgroup cw issues its batch after the other's (bar 2 + cw); cw 1 lets cw 0 go first
        if (cw == 1 && tiles > 1) named_bar_arrive(2, 256);
        if (tiles > 0) {
            wait_full(0);
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
        for (int t = 0; t + 1 < tiles; ++t) {
            wait_full(t + 1);
            named_bar_sync(2 + cw, 256);  // my turn to issue
            reg_fence(o);
            reg_fence_u32(pa);
            wgmma_fence();
            issue_qk(t + 1);
            wgmma_fence();
            issue_pv(t);
            // the other's turn (cw 1 owes none after its last issue)
            if (cw == 0 || t + 2 < tiles) named_bar_arrive(3 - cw, 256);
            wgmma_wait<1>();
            reg_fence(s);
            mask(t + 1);
            float alpha_a, alpha_b;
            pf_softmax_stats(s, m_a, m_b, l_a, l_b, sl2, alpha_a, alpha_b);
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(sink), "f"(l_a), "f"(l_b) : "memory");
            wgmma_wait<0>();
            reg_fence(o);
            reg_fence_u32(pa);
            release(t);  // K(t) (read by S(t), done last iteration) and V(t) (P V just done)
            if (__any_sync(FULL_MASK, alpha_a != 1.0f || alpha_b != 1.0f)) pf_rescale(o, alpha_a, alpha_b);
            pf_pack_p(s, pa);
        }
        if (tiles > 0) {
            reg_fence(o);
            reg_fence_u32(pa);
            wgmma_fence();
            issue_pv(tiles - 1);
            wgmma_wait<0>();
            reg_fence(o);
            release(tiles - 1);
        }
        it += tiles;

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

KERN_DEV void attn_prefill_wg(const __nv_bfloat16* q, const __nv_bfloat16* kv_cache, const int32_t* block_table,
                              const int32_t* cu_seqlens_q, const int32_t* seq_lens, __nv_bfloat16* out,
                              int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t page_tokens,
                              int32_t bt_stride, int32_t num_pages, float scale, unsigned char* smem) {
    kern_pdl_wait();
    kern_pdl_launch_dependents();
    const uint32_t pad = (0u - smem_addr(smem)) & 1023u;
    if (dynamic_smem_bytes() < sizeof(PrefillSmemWg) + pad) return;
    PrefillSmemWg& sm = *reinterpret_cast<PrefillSmemWg*>(smem + pad);
    const int kvh = blockIdx.y;
    const int D = head_dim;
    // The roles are fixed warpgroups and the setmaxnreg budget is 384 threads x 168 registers (kernels.json must
    // say 168: tests/kernels/test_build.py), so any other block size writes nothing.
    if (blockDim.x != WG_THREADS || num_q_heads <= 0 || num_kv_heads <= 0 || kvh >= num_kv_heads ||
        num_q_heads % num_kv_heads != 0 || (D != 64 && D != 128) || page_tokens <= 0 || !(scale > 0.0f) ||
        !aligned16(kv_cache))
        return;
    PfBlock b;  // the 8 consumer warps: 16-row slabs
    if (!pf_block(cu_seqlens_q, seq_lens, block_table, bt_stride, num_q_heads, num_kv_heads, 8, WG_ROWS, b)) return;
    if (threadIdx.x == 0) {
        for (int i = 0; i < WG_STAGES; ++i) {
            mbar_init(&sm.full[i], 128);
            mbar_init(&sm.empty[i], 8);
        }
    }
    __syncthreads();
    if (D == 128)
        prefill_body_wg<128>(sm, q, kv_cache, b.bt_row, out, num_q_heads, num_kv_heads, page_tokens, bt_stride,
                             num_pages, scale, kvh, b.q_start, b.q_len, b.ctx0, b.row0, b.kv_end, b.hpb, b.slabs, b.G);
    else
        prefill_body_wg<64>(sm, q, kv_cache, b.bt_row, out, num_q_heads, num_kv_heads, page_tokens, bt_stride,
                            num_pages, scale, kvh, b.q_start, b.q_len, b.ctx0, b.row0, b.kv_end, b.hpb, b.slabs, b.G);
}

// grid (>= cdiv(max_q_tokens, 32), num_kv_heads, seqs), block (384,1,1), dynamic shared memory WG_SMEM_BYTES.
// Parameters as kern_attn_prefill. One block per SM (169 KB of shared memory).
extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
    kern_attn_prefill_wg(const __nv_bfloat16* q, const __nv_bfloat16* kv_cache, const int32_t* block_table,
                         const int32_t* cu_seqlens_q, const int32_t* seq_lens, __nv_bfloat16* out, int32_t num_q_heads,
                         int32_t num_kv_heads, int32_t head_dim, int32_t page_tokens, int32_t bt_stride,
                         int32_t num_pages, float scale) {
    extern __shared__ __align__(16) unsigned char smem[];
    attn_prefill_wg(q, kv_cache, block_table, cu_seqlens_q, seq_lens, out, num_q_heads, num_kv_heads, head_dim,
                    page_tokens, bt_stride, num_pages, scale, smem);
}
