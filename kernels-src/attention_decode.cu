// Paged decode attention built for throughput at batch (issue 26): kern_attn_decode_partial_stream, a decode
// partial with kern_attn_decode_partial_wide's signature, grid, split rule, early contract and part_out / part_ml
// layout (attention.cu, docs/kernels.md "Decode splits", "Early trigger"), so attention.cu's
// kern_attn_decode_reduce merges its splits unchanged.
//
// Why a new body: the wide partial holds a few 16-byte K/V loads per lane in registers per tile and reduces q.k
// across lanes; at batch its SMs keep too few bytes in flight (H200 4B: 26-29% of 4.3 TB/s at ctx 2048). This
// one streams K and V into shared memory with cp.async, two 16-token tiles per warp in flight (8 KiB each at
// head_dim 128), and does the math on the tensor cores from shared memory:
//   - block (64,1,1): 2 warps. Split tile t (16 tokens, [begin + 16 t, begin + 16 t + 16)) belongs to warp t % 2;
//     each warp runs its own two-stage cp.async ring (wait_group 1 + __syncwarp, no block barrier in the loop)
//     and its own online softmax; one shared-memory merge of the two warps at the end.
//   - rows of the mma are the kv head's q heads (16 per pass: any GQA group, passes of 16 heads past that):
//     S = Q K^T (m16n8k16 bf16, f32 accumulate: q and K are bf16, so the products are exact), then P V with P
//     split into two bf16 terms (hi = bf16(p), lo = bf16(p - hi): P to about 16 bits, the f32 p of the online
//     softmax within 2^-16 relative, instead of bf16's 2^-8), V B fragments by ldmatrix.trans.
//   - static shared memory 36,864 bytes (K/V rings 2 warps x 2 stages x 2 x 16 tokens x 256 bytes, XOR-swizzled
//     16-byte chunks so ldmatrix is conflict-free without padding, + the pass's 16 q rows): 6 blocks per SM.
// An empty split (past the row's context) writes nothing: the reduce reads only splits x < cdiv(seq_len, L)
// (docs/kernels.md). A split whose tokens all lack a page still writes (-inf, 0) and a zero part_out row.
//
// Early contract (kern_attn_decode_partial_early's): it triggers its dependents first; before
// griddepcontrol.wait it reads seq_lens, slot_mapping, the block table and the first two tiles of each warp (the
// split's first 64 tokens) except the chunks of the K/V row of slot_mapping[s] (what the rope kernel before it
// writes); after the wait it loads those chunks and q (bypassing L1). Every path waits.
// head_dim must be a multiple of 16 and at most 128 (the mma k-steps) and kv_cache 16-byte aligned (cp.async; q may
// be any bf16 address); any other launch, or a block that is not 64 threads, writes nothing (after its wait).
#include <math_constants.h>

#include "common.cuh"
#include "prefill.cuh"      // mma_bf16_16816, ldsm_x4, ldsm_x4_trans, pack_bf16x2, LOG2E, FULL_MASK
#include "stream_copy.cuh"  // cp_async16_if, cp_async_wait_1

#define LN2 0.6931471805599453f
#define ST_WARPS 2
#define ST_THREADS (ST_WARPS * 32)
#define ST_TT 16      // tokens per warp tile (the k of P V's mma)
#define ST_ROWS 16    // q heads per pass (the m of the mma)
#define ST_MAX_D 128  // head_dim limit (a multiple of 16)
#define ST_CH 16      // 16-byte chunks per shared row (ST_MAX_D bf16)
#define ST_GRAN 16    // attention.cu DEC_GRAN: split lengths are rounded up to a multiple of this
#define ST_MAX_D_ANY 256  // attention.cu DEC_MAX_D (decode_launch_ok's limit, before this entry's own)

// The split rule of attention.cu (decode_split_len, decode_split_range, num_pages_overflow, decode_launch_ok),
// repeated here so this module builds alone; tests/kernels/test_decode_attention_source.py checks the two copies
// say the same, and the GPU tests check both against tools/reference_kernels.py.
KERN_DEV bool st_num_pages_overflow(int num_pages, int page_tokens) {
    return (int64_t)num_pages * 2 * page_tokens > (int64_t)INT32_MAX;
}

KERN_DEV int64_t st_split_len(int seq_len, int split_tokens, int num_splits) {
    const int64_t per = ((int64_t)max(seq_len, 0) + num_splits - 1) / num_splits;
    return max((int64_t)split_tokens, (per + ST_GRAN - 1) / ST_GRAN * ST_GRAN);
}

KERN_DEV bool st_launch_ok(int num_q_heads, int num_kv_heads, int D, int page_tokens, int split_tokens, int num_splits,
                           int num_pages) {
    return num_q_heads > 0 && num_kv_heads > 0 && (int)blockIdx.x < num_kv_heads && (int)blockIdx.y < num_splits &&
           num_q_heads % num_kv_heads == 0 && D > 0 && D <= ST_MAX_D_ANY && page_tokens > 0 && split_tokens > 0 &&
           !st_num_pages_overflow(num_pages, page_tokens);
}

// 8 bf16 at p as one 16-byte value, through L2 only (ld.global.cg: never a line this SM cached before the PDL
// wait); element loads when p is not 16-byte aligned.
KERN_DEV uint4 st_load_chunk(const __nv_bfloat16* p, bool vec) {
    if (vec) return __ldcg(reinterpret_cast<const uint4*>(p));
    const unsigned short* e = reinterpret_cast<const unsigned short*>(p);
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = (uint32_t)__ldcg(e + 2 * i) | ((uint32_t)__ldcg(e + 2 * i + 1) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

struct StreamSmem {
    // [warp][stage][K, V][token of the tile][16-byte chunk, swizzled: chunk c of token row t at c ^ (t & 7)]
    uint4 kv[ST_WARPS][2][2][ST_TT][ST_CH];
    uint4 q[ST_ROWS][ST_CH];  // the pass's q heads, bf16, the same swizzle (row r: c ^ (r & 7))
};

// P (two 16 x 8 C fragments of f32 probabilities: tokens 0-7 | 8-15) as the A fragment of m16n8k16 in two bf16
// terms, hi = bf16(p) and lo = bf16(p - hi) (p - hi is exact in f32).
KERN_DEV void st_split_p(float a, float b, uint32_t& hi, uint32_t& lo) {
    hi = pack_bf16x2(a, b);
    lo = pack_bf16x2(a - __uint_as_float(hi << 16), b - __uint_as_float(hi & 0xffff0000u));
}

// One (kv head, split, sequence) block at head_dim 16 * NK. Token row indices (page * 2 * page_tokens + offset,
// 32 bits) are per tile: lane l holds the row of token l % 16 of the tile, -1 when absent (past the split, past
// bt_stride, or a page id outside [0, num_pages)); absent tokens' K and V are zero-filled in shared memory and
// their scores masked to -inf.
template <int NK>
KERN_DEV void stream_body(StreamSmem& sm, const __nv_bfloat16* q, const __nv_bfloat16* kv_cache,
                          const int32_t* bt_row, float* part_out, float* part_ml, int num_q_heads, int num_kv_heads,
                          int page_tokens, int bt_stride, int num_pages, int num_splits, float scale, int s, int kvh,
                          int x, int begin, int end, int32_t early_row) {
    constexpr int D = NK * 16;
    constexpr int C = 2 * NK;           // 16-byte chunks of a K (or V) row
    const int G = num_q_heads / num_kv_heads;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3, mi = lane >> 3;
    const int token_elems = num_kv_heads * D;  // elements per token row (all kv heads)
    const int64_t v_off = (int64_t)page_tokens * token_elems;  // V of a token: its K pointer + v_off
    const bool qvec = aligned16(q);
    const __nv_bfloat16* head_base = kv_cache + (int64_t)kvh * D;
    const float sl2 = scale * LOG2E;
    const uint32_t page_limit = (uint32_t)max(num_pages, 0);  // ids in [0, num_pages): one unsigned compare
    const int n_tiles = (end - begin + ST_TT - 1) / ST_TT;  // 16-token tiles of the split (>= 1)
    // Tiles per warp: warp w takes split tiles w, w + 2, ...; both warps run cdiv(n_tiles, 2) steps (a count
    // uniform over the block, so no shuffle sits in divergent code), the last one of warp 1 on a tile of absent
    // tokens when n_tiles is odd (zero-filled and masked: it changes nothing).
    const int steps = (n_tiles + ST_WARPS - 1) / ST_WARPS;
    auto tile_t0 = [&](int i) { return begin + ST_TT * (warp + ST_WARPS * i); };

    // Row index of token lane % 16 of the warp's tile i.
    auto tile_row = [&](int i) -> int32_t {
        const int tok = tile_t0(i) + (lane & (ST_TT - 1));
        if (tok >= end) return -1;
        const int pi = tok / page_tokens;
        if (pi >= bt_stride) return -1;
        const int page = bt_row[pi];
        return (uint32_t)page < page_limit ? page * 2 * page_tokens + (tok - pi * page_tokens) : -1;
    };
    // Copies: lane l of a warp copies chunk ch = l % C of part (l % LPT) / C (0 K, 1 V) of token t = TPI j + l / LPT
    // of the tile, for j < ITERS (LPT = 2 C lanes per token, TPI = 32 / LPT tokens per copy instruction; at
    // head_dim 80, 96, 112 the lanes past TPI * LPT idle). Its source is lane_src + row * token_elems.
    constexpr int LPT = 2 * C, TPI = 32 / LPT, ITERS = ST_TT / TPI;
    static_assert(TPI >= 1 && ST_TT % TPI == 0, "a token's K and V chunks fit one copy instruction");
    const int c_sub = lane / LPT, c_part = (lane % LPT) / C, c_ch = lane % C;
    const bool c_on = lane < TPI * LPT;
    const __nv_bfloat16* lane_src = head_base + c_part * v_off + c_ch * 8;
    auto chunk_dst = [&](int b, int t, int part, int ch) -> uint4* {
        return &sm.kv[warp][b][part][t][ch ^ (t & 7)];
    };
    // Issue the copies of the tile with rows `row` into stage b (absent tokens: zero fill, no read); chunks of
    // row `defer` (>= 0) are left for load_deferred.
    auto issue_tile = [&](int b, int32_t row, int32_t defer) {
#pragma unroll
        for (int j = 0; j < ITERS; ++j) {
            const int t = j * TPI + c_sub;
            const int32_t rr = __shfl_sync(FULL_MASK, row, t);
            cp_async16_if(chunk_dst(b, t, c_part, c_ch), lane_src + (int64_t)max(rr, 0) * token_elems,
                          rr >= 0 ? 16 : 0, c_on && (rr < 0 || rr != defer));
        }
    };
    // After the wait: the chunks issue_tile left out (row == early_row), loaded and stored synchronously.
    auto load_deferred = [&](int b, int32_t row) {
#pragma unroll
        for (int j = 0; j < ITERS; ++j) {
            const int t = j * TPI + c_sub;
            const int32_t rr = __shfl_sync(FULL_MASK, row, t);
            if (c_on && rr >= 0 && rr == early_row)
                *chunk_dst(b, t, c_part, c_ch) = st_load_chunk(lane_src + (int64_t)rr * token_elems, true);
        }
    };

    // A do-while: G >= 1 (st_launch_ok), and the SASS has no path that skips every pass, so every path waits
    // (tools/sass_paths.py). Passes after the first (G > 16) wait again (already satisfied) and re-stream K/V.
    int g0 = 0;
    do {
        const int gn = min(ST_ROWS, G - g0);
        int32_t row0 = tile_row(0), row1 = tile_row(1);
        issue_tile(0, row0, early_row);
        cp_async_commit();
        if (steps > 1) issue_tile(1, row1, early_row);
        cp_async_commit();
        kern_pdl_wait();  // q and the row of slot_mapping[s] are the previous kernel's output
        load_deferred(0, row0);
        if (steps > 1) load_deferred(1, row1);
        // q heads kvh * G + g0 + [0, 16) (zeros past gn and past D) -> sm.q
        for (int i = threadIdx.x; i < ST_ROWS * ST_CH; i += ST_THREADS) {
            const int r = i / ST_CH, ch = i % ST_CH;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (r < gn && ch < C)
                v = st_load_chunk(q + ((int64_t)s * num_q_heads + kvh * G + g0 + r) * D + ch * 8, qvec);
            sm.q[r][ch ^ (r & 7)] = v;
        }
        __syncthreads();

        float o[2 * NK][4];
#pragma unroll
        for (int dt = 0; dt < 2 * NK; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
        // running max (scaled log2 units; rows a = gid, b = gid + 8) and this lane's share of the sum of exp
        float m_a = -CUDART_INF_F, m_b = -CUDART_INF_F, l_a = 0.0f, l_b = 0.0f;

        // One tile in stage b with token rows `row`: S = Q K^T, mask, online softmax, O += P V.
        auto compute = [&](int b, int32_t row) {
            float sc[2][4];
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < NK; ++kk) {
                // matrices: (tokens 0-7, dims kk*16 + 0-7), (0-7, +8), (8-15, +0), (8-15, +8)
                // Q A fragment (matrices: rows +[0,8) | +[8,16) x dims +[0,8) | +[8,16) -> a0..a3), read per tile:
                // 32 registers fewer than holding all of Q
                const int qr = (mi & 1) * 8 + (lane & 7), qc = kk * 2 + (mi >> 1);
                uint32_t a0, a1, a2, a3;
                ldsm_x4(a0, a1, a2, a3, &sm.q[qr][qc ^ (qr & 7)]);
                const int t = (mi >> 1) * 8 + (lane & 7), ch = kk * 2 + (mi & 1);
                uint32_t b0, b1, b2, b3;
                ldsm_x4(b0, b1, b2, b3, chunk_dst(b, t, 0, ch));
                mma_bf16_16816(sc[0], a0, a1, a2, a3, b0, b1);
                mma_bf16_16816(sc[1], a0, a1, a2, a3, b2, b3);
            }
            // columns (tokens) nt * 8 + 2 tig + {0, 1}
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if (__shfl_sync(FULL_MASK, row, nt * 8 + 2 * tig + e) < 0) {
                        sc[nt][e] = -CUDART_INF_F;
                        sc[nt][e + 2] = -CUDART_INF_F;
                    }
                }
            }
            float mx_a = fmaxf(fmaxf(sc[0][0], sc[0][1]), fmaxf(sc[1][0], sc[1][1]));
            float mx_b = fmaxf(fmaxf(sc[0][2], sc[0][3]), fmaxf(sc[1][2], sc[1][3]));
            mx_a = fmaxf(mx_a, __shfl_xor_sync(FULL_MASK, mx_a, 1));
            mx_a = fmaxf(mx_a, __shfl_xor_sync(FULL_MASK, mx_a, 2));
            mx_b = fmaxf(mx_b, __shfl_xor_sync(FULL_MASK, mx_b, 1));
            mx_b = fmaxf(mx_b, __shfl_xor_sync(FULL_MASK, mx_b, 2));
            const float mn_a = fmaxf(m_a, mx_a * sl2), mn_b = fmaxf(m_b, mx_b * sl2);
            const float base_a = (mn_a == -CUDART_INF_F) ? 0.0f : mn_a;
            const float base_b = (mn_b == -CUDART_INF_F) ? 0.0f : mn_b;
            const float alpha_a = exp2f(m_a - base_a), alpha_b = exp2f(m_b - base_b);
            m_a = mn_a;
            m_b = mn_b;
            float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                sc[nt][0] = exp2f(fmaf(sc[nt][0], sl2, -base_a));
                sc[nt][1] = exp2f(fmaf(sc[nt][1], sl2, -base_a));
                sc[nt][2] = exp2f(fmaf(sc[nt][2], sl2, -base_b));
                sc[nt][3] = exp2f(fmaf(sc[nt][3], sl2, -base_b));
                sum_a += sc[nt][0] + sc[nt][1];
                sum_b += sc[nt][2] + sc[nt][3];
            }
            l_a = l_a * alpha_a + sum_a;  // alpha is the same in the 4 lanes of a row: the shares add up
            l_b = l_b * alpha_b + sum_b;
#pragma unroll
            for (int dt = 0; dt < 2 * NK; ++dt) {
                o[dt][0] *= alpha_a;
                o[dt][1] *= alpha_a;
                o[dt][2] *= alpha_b;
                o[dt][3] *= alpha_b;
            }
            // P as A fragments (a0: row gid, tokens 2 tig..; a1: row gid + 8; a2, a3: tokens + 8), two bf16 terms
            uint32_t ph[4], pl[4];
            st_split_p(sc[0][0], sc[0][1], ph[0], pl[0]);
            st_split_p(sc[0][2], sc[0][3], ph[1], pl[1]);
            st_split_p(sc[1][0], sc[1][1], ph[2], pl[2]);
            st_split_p(sc[1][2], sc[1][3], ph[3], pl[3]);
#pragma unroll
            for (int dp = 0; dp < NK; ++dp) {
                // matrices (transposed): (tokens 0-7, dims dp*16 + 0-7), (8-15, +0), (0-7, +8), (8-15, +8)
                const int t = (mi & 1) * 8 + (lane & 7), ch = dp * 2 + (mi >> 1);
                uint32_t b0, b1, b2, b3;
                ldsm_x4_trans(b0, b1, b2, b3, chunk_dst(b, t, 1, ch));
                mma_bf16_16816(o[2 * dp], ph[0], ph[1], ph[2], ph[3], b0, b1);
                mma_bf16_16816(o[2 * dp], pl[0], pl[1], pl[2], pl[3], b0, b1);
                mma_bf16_16816(o[2 * dp + 1], ph[0], ph[1], ph[2], ph[3], b2, b3);
                mma_bf16_16816(o[2 * dp + 1], pl[0], pl[1], pl[2], pl[3], b2, b3);
            }
        };
        // Tile i in stage b: wait for it (tile i + 1 may still fly), compute, refill stage b with tile i + 2.
        auto step = [&](int i, int b, int32_t& row) {
            cp_async_wait_1();
            __syncwarp();  // every lane's copies of tile i (and the deferred stores) are visible to the warp
            const int32_t next = i + 2 < steps ? tile_row(i + 2) : -1;  // its block-table read overlaps the math
            compute(b, row);
            __syncwarp();  // every lane is done reading stage b
            row = next;
            if (i + 2 < steps) issue_tile(b, row, -1);
            cp_async_commit();  // (an empty group past the last tile keeps the count of wait_group 1)
        };
        for (int i = 0; i < steps; i += 2) {
            step(i, 0, row0);
            if (i + 1 < steps) step(i + 1, 1, row1);
        }
        cp_async_wait_all();  // nothing is left in flight

        l_a += __shfl_xor_sync(FULL_MASK, l_a, 1);
        l_a += __shfl_xor_sync(FULL_MASK, l_a, 2);
        l_b += __shfl_xor_sync(FULL_MASK, l_b, 1);
        l_b += __shfl_xor_sync(FULL_MASK, l_b, 2);
        // Merge: warp 1 leaves its fragments in shared memory (over its K/V stages, done with), warp 0 combines
        // them with its own, element by element in fragment order, and writes the split's rows.
        __syncthreads();  // both warps are done with every stage
        float4* red = reinterpret_cast<float4*>(&sm.kv[0][0][0][0][0]);  // [2 NK + 1][32 lanes] float4
        if (warp == 1) {
#pragma unroll
            for (int dt = 0; dt < 2 * NK; ++dt) red[dt * 32 + lane] = make_float4(o[dt][0], o[dt][1], o[dt][2], o[dt][3]);
            red[2 * NK * 32 + lane] = make_float4(m_a, m_b, l_a, l_b);
        }
        __syncthreads();
        if (warp == 0) {
            const float4 ml1 = red[2 * NK * 32 + lane];
            const float mm_a = fmaxf(m_a, ml1.x), mm_b = fmaxf(m_b, ml1.y);
            const bool live_a = mm_a != -CUDART_INF_F, live_b = mm_b != -CUDART_INF_F;
            const float w0a = live_a ? exp2f(m_a - mm_a) : 0.0f, w1a = live_a ? exp2f(ml1.x - mm_a) : 0.0f;
            const float w0b = live_b ? exp2f(m_b - mm_b) : 0.0f, w1b = live_b ? exp2f(ml1.y - mm_b) : 0.0f;
            const int ha = g0 + gid, hb = g0 + gid + 8;  // the rows' q heads within the group
            const int64_t row_a = ((int64_t)s * num_q_heads + kvh * G + ha) * num_splits + x;
            const int64_t row_b = ((int64_t)s * num_q_heads + kvh * G + hb) * num_splits + x;
#pragma unroll
            for (int dt = 0; dt < 2 * NK; ++dt) {
                const float4 o1 = red[dt * 32 + lane];
                const int col = dt * 8 + 2 * tig;
                if (gid < gn)
                    *reinterpret_cast<float2*>(part_out + row_a * D + col) =
                        make_float2(w0a * o[dt][0] + w1a * o1.x, w0a * o[dt][1] + w1a * o1.y);
                if (gid + 8 < gn)
                    *reinterpret_cast<float2*>(part_out + row_b * D + col) =
                        make_float2(w0b * o[dt][2] + w1b * o1.z, w0b * o[dt][3] + w1b * o1.w);
            }
            if (tig == 0) {
                // back to natural-log units (-inf stays -inf)
                if (gid < gn)
                    *reinterpret_cast<float2*>(part_ml + row_a * 2) = make_float2(mm_a * LN2, w0a * l_a + w1a * ml1.z);
                if (gid + 8 < gn)
                    *reinterpret_cast<float2*>(part_ml + row_b * 2) = make_float2(mm_b * LN2, w0b * l_b + w1b * ml1.w);
            }
        }
        __syncthreads();  // the merge area is read before a next pass streams into it
        g0 += ST_ROWS;
    } while (g0 < G);
}

// Block (kv head, split x, row s)'s share of its row under the split rule above, and the cache row of
// slot_mapping[s] (-1: none in the cache): tokens [begin, end); `used` splits of the row hold tokens (x < used:
// begin < end). Every entry of this module starts from it.
struct DecodeSplit {
    int seq_len, begin, end, used;
    int32_t early_row;
};

KERN_DEV DecodeSplit decode_split(const int32_t* seq_lens, const int32_t* slot_mapping, int page_tokens, int num_pages,
                            int split_tokens, int num_splits) {
    const int s = blockIdx.z, x = blockIdx.y;
    DecodeSplit g;
    const int64_t slot = slot_mapping[s];
    g.early_row = (slot >= 0 && slot < (int64_t)max(num_pages, 0) * page_tokens)
                      ? (int32_t)(slot / page_tokens * 2 * page_tokens + slot % page_tokens)
                      : -1;
    const int seq_len = max(seq_lens[s], 0);
    const int64_t len = st_split_len(seq_len, split_tokens, num_splits);
    g.seq_len = seq_len;
    g.begin = (int)min((int64_t)x * len, (int64_t)seq_len);
    g.end = (int)min((int64_t)x * len + len, (int64_t)seq_len);
    g.used = (int)min((int64_t)num_splits, (seq_len + len - 1) / len);
    return g;
}

// f(StNk<head_dim / 16>{}) for head_dim / 16 in 1..8 (the bodies' compile-time k-steps); any other value only waits
// (a launch check refused it before: this keeps every path waiting).
template <int N>
struct StNk {
    static constexpr int value = N;
};

template <class F>
KERN_DEV void st_for_nk(int nk, F&& f) {
    // a tree of bit tests, not a switch or an if chain on nk: those compile to an indirect jump (BRX) through a
    // table in some entries, which tools/sass_paths.py cannot follow to prove that every path waits
    if (nk < 1 || nk > 8) kern_pdl_wait();
    else if (nk & 8) f(StNk<8>{});
    else if (nk & 4) {
        if (nk & 2) { if (nk & 1) f(StNk<7>{}); else f(StNk<6>{}); }
        else { if (nk & 1) f(StNk<5>{}); else f(StNk<4>{}); }
    } else if (nk & 2) {
        if (nk & 1) f(StNk<3>{}); else f(StNk<2>{});
    } else {
        f(StNk<1>{});
    }
}

// grid (num_kv_heads, num_splits, seqs), block (64,1,1), static shared memory 36,864 bytes. Parameters, split
// rule and results as kern_attn_decode_partial_wide (up to fp32 rounding: other per-warp token shares, tensor-core
// sums), except that a split past the context writes nothing.
extern "C" __global__ void __launch_bounds__(ST_THREADS, 6) kern_attn_decode_partial_stream(
    const __nv_bfloat16* q,         // [seqs, Hq, D]
    const __nv_bfloat16* kv_cache,  // paged
    const int32_t* block_table,     // [seqs, bt_stride]
    const int32_t* seq_lens,        // [seqs]
    const int32_t* slot_mapping,    // [seqs]: the slot the previous kernel wrote this step's K/V to
    float* part_out,                // [seqs, Hq, num_splits, D]
    float* part_ml,                 // [seqs, Hq, num_splits, 2]
    int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t page_tokens, int32_t bt_stride,
    int32_t num_pages,              // page ids outside [0, num_pages) are masked
    int32_t split_tokens, int32_t num_splits, float scale) {
    __shared__ __align__(16) StreamSmem sm;
    kern_pdl_launch_dependents();  // early trigger: the reduce reads only seq_lens before its wait
    const int kvh = blockIdx.x, x = blockIdx.y, s = blockIdx.z;
    const int D = head_dim;
    if ((int)blockDim.x != ST_THREADS || D % 16 != 0 || D > ST_MAX_D || !aligned16(kv_cache) ||
        !st_launch_ok(num_q_heads, num_kv_heads, D, page_tokens, split_tokens, num_splits, num_pages)) {
        kern_pdl_wait();  // every path waits: the grid never completes before its predecessor
        return;
    }
    const DecodeSplit g = decode_split(seq_lens, slot_mapping, page_tokens, num_pages, split_tokens, num_splits);
    if (g.begin >= g.end) {  // past the context: the reduce never reads this split
        kern_pdl_wait();
        return;
    }
    const int32_t* bt_row = block_table + (int64_t)s * bt_stride;
    st_for_nk(D / 16, [&](auto nk) {
        stream_body<decltype(nk)::value>(sm, q, kv_cache, bt_row, part_out, part_ml, num_q_heads, num_kv_heads,
                                         page_tokens, bt_stride, num_pages, num_splits, scale, s, kvh, x, g.begin,
                                         g.end, g.early_row);
    });
}

// ---------------------------------------------------------------------------------------------------------------
// kern_attn_decode_partial_gqa: kern_attn_decode_partial_stream's signature, grid, split rule, early contract and
// results (up to fp32 rounding), in one warp per block with about 2.5 times fewer instructions per K/V byte
// (docs/perf.md "Twenty-second session": the stream partial at 64 rows is instruction-bound, 518 instructions per
// 16-token tile per warp and about 700 per warp outside the loop).
//   - the mma's 16 rows are the tile's 16 tokens and its 8 columns the kv head's q heads (passes of 8 past
//     that): S^T = K Q^T (A = K from shared memory by ldmatrix, B = q from registers, loaded once), then
//     O^T += V^T P^T (A = V by ldmatrix.trans, B = P^T: the S^T accumulators transposed in registers by
//     movmatrix, in two bf16 terms as the stream partial splits P). A 16-token tile is 8 + 2 * head_dim / 16
//     mma at head_dim 128 against the stream partial's 48, and the accumulators O^T are 32 floats per lane, not 64.
//   - lane l copies token l % 16's whole K (l < 16) or V row of the tile with head_dim / 8 cp.async of 16 bytes
//     (no shuffle or address arithmetic per copy); shared rows are padded to 272 bytes, so the copies' and the
//     ldmatrix's 8 rows fall in 8 bank groups. Two stages: a tile computes while the next one flies.
//   - the running max and sum are per q head (a column): reductions over the 8 lanes of a column.
//   - the output goes through shared memory so part_out is written in float4 rows.
// static shared memory 17,408 bytes per 32-thread block: 12 blocks (warps) per SM.
#define GQ_TT 16      // tokens per tile (the m of S^T, the k of O^T's mma)
#define GQ_HEADS 8    // q heads per pass (the n of both mma)
#define GQ_MAX_D 128  // head_dim limit (a multiple of 16)
#define GQ_ROW 136    // shared K/V row stride in bf16 (272 bytes)
#define GQ_OUT_ROW (GQ_MAX_D + 4)  // shared output row stride in floats (lanes of a column in 8 bank groups)
#define GQ_RED 8      // kern_attn_decode_gqa_fused's merge: part_out loads in flight per lane

// GQ_PROBE: timing probes of the gqa partial's tile (bench/decode_attention.py --defines "GQ_PROBE=N"; the results
// are wrong): bit 1 P as one bf16 term, bit 2 no P V, bit 4 no S = K Q^T, bit 8 no math at all (the copies and
// their waits only), bit 16 the copies at the addresses of a head-major page layout ([page][K, V][kv head][token]
// [dim]: a tile's 16 K rows one contiguous 4 KiB). The built module has 0.
#ifndef GQ_PROBE
#define GQ_PROBE 0
#endif
struct GqaSmem {
    __nv_bfloat16 kv[2][2][GQ_TT][GQ_ROW];  // [stage][K, V][token of the tile][dim]
};
static_assert(sizeof(float) * GQ_HEADS * GQ_OUT_ROW <= sizeof(GqaSmem), "the output stage fits the K/V stages");

// 2 bf16 of a q row at p (element loads where p is not 4-byte aligned), through L2 only.
KERN_DEV uint32_t gq_load_pair(const __nv_bfloat16* p, bool vec) {
    if (vec) return __ldcg(reinterpret_cast<const unsigned int*>(p));
    const unsigned short* e = reinterpret_cast<const unsigned short*>(p);
    return (uint32_t)__ldcg(e) | ((uint32_t)__ldcg(e + 1) << 16);
}

template <int NK>
KERN_DEV void gqa_body(GqaSmem& sm, const __nv_bfloat16* q, const __nv_bfloat16* kv_cache, const int32_t* bt_row,
                       float* part_out, float* part_ml, int num_q_heads, int num_kv_heads, int page_tokens,
                       int bt_stride, int num_pages, int num_splits, float scale, int s, int kvh, int x, int begin,
                       int end, int32_t early_row) {
    constexpr int D = NK * 16;
    constexpr int C = 2 * NK;  // 16-byte chunks of a K (or V) row
    const int G = num_q_heads / num_kv_heads;
    const int lane = threadIdx.x & 31;
    const int gid = lane >> 2, tig = lane & 3, mi = lane >> 3;
    const int token_elems = num_kv_heads * D;
    const int64_t v_off = (int64_t)page_tokens * token_elems;
    const bool qvec = (reinterpret_cast<uintptr_t>(q) & 3u) == 0;
    const float sl2 = scale * LOG2E;
    const uint32_t page_limit = (uint32_t)max(num_pages, 0);
    const int n_tiles = (end - begin + GQ_TT - 1) / GQ_TT;  // >= 1
    // lane l holds the row of token c_tok = l % 16 of a tile (tile_row); its copies are chunk c_ch = l % 16 of part
    // c_part = l / 16 (0 K, 1 V) of every token of the tile, one token per copy instruction, so an instruction reads
    // the token's whole 256-byte K row and V row (coalesced; lanes with c_ch >= C idle below head_dim 128)
    const int c_tok = lane & (GQ_TT - 1), c_part = lane >> 4, c_ch = lane & 15;
    const bool c_on = c_ch < C;
    const __nv_bfloat16* lane_src = kv_cache + (int64_t)kvh * D + c_part * v_off + 8 * c_ch;
    // Row index (page * 2 * page_tokens + offset) of token c_tok of the next tile (tiles are asked for in order
    // 0, 1, 2, ... from each pass's start), -1 when absent. The token's page index and offset advance by GQ_TT per
    // tile (one division per pass, not one per tile).
    int next_tok = 0, next_pi = 0, next_off = 0;
    auto tile_row = [&]() -> int32_t {
        const int tok = next_tok, pi = next_pi, off = next_off;
        next_tok += GQ_TT;
        next_off += GQ_TT;
        while (next_off >= page_tokens) {  // once a tile at page_tokens >= 16
            next_off -= page_tokens;
            ++next_pi;
        }
        if (tok >= end || pi >= bt_stride) return -1;
        const int page = bt_row[pi];
        return (uint32_t)page < page_limit ? page * 2 * page_tokens + off : -1;
    };
    // Where pages hold a multiple of 16 tokens and the split starts at one (the generator's splits), every tile
    // lies in one page: token t's row is token 0's + t, and the present tokens are a prefix of the tile.
    const bool one_page = page_tokens % GQ_TT == 0 && begin % GQ_TT == 0;
    const int64_t row_step = token_elems;
    // The tile's copies into stage b (absent token: zero fill, no read), none of a token whose row is `defer`.
    auto issue_tile = [&](int b, int32_t row, int32_t defer) {
        if (one_page) {
            const int32_t row0 = __shfl_sync(FULL_MASK, row, 0);
            const int n = __popc(__ballot_sync(FULL_MASK, row >= 0) & 0xffffu);
#if GQ_PROBE & 16  // the addresses of a head-major page ([page][K, V][kv head][token][dim]), the same bytes
            const int64_t pg = max(row0, 0) / (2 * page_tokens), off = max(row0, 0) % (2 * page_tokens);
            const __nv_bfloat16* src = kv_cache + ((pg * 2 + c_part) * num_kv_heads + kvh) * page_tokens * D +
                                       off * D + 8 * c_ch;
            const int64_t tok_step = D;
#else
            const __nv_bfloat16* src = lane_src + (int64_t)max(row0, 0) * token_elems;
            const int64_t tok_step = row_step;
#endif
            const int td = (defer >= 0 && row0 >= 0) ? defer - row0 : -1;  // the deferred token, if in this tile
            if (c_on) {
#pragma unroll
                for (int t = 0; t < GQ_TT; ++t)
                    if (t != td) cp_async16(&sm.kv[b][c_part][t][8 * c_ch], src + (t < n ? t * tok_step : 0),
                                            t < n ? 16 : 0);
            }
            return;
        }
#pragma unroll
        for (int t = 0; t < GQ_TT; ++t) {
            const int32_t rr = __shfl_sync(FULL_MASK, row, t);
            if (c_on && (rr < 0 || rr != defer))
                cp_async16(&sm.kv[b][c_part][t][8 * c_ch], lane_src + (int64_t)max(rr, 0) * token_elems,
                           rr >= 0 ? 16 : 0);
        }
    };
    // After the wait: the chunks issue_tile left out (the token whose row is early_row), loaded and stored.
    auto load_deferred = [&](int b, int32_t row) {
#pragma unroll
        for (int t = 0; t < GQ_TT; ++t) {
            const int32_t rr = __shfl_sync(FULL_MASK, row, t);
            if (c_on && rr >= 0 && rr == early_row)
                *reinterpret_cast<uint4*>(&sm.kv[b][c_part][t][8 * c_ch]) =
                    st_load_chunk(lane_src + (int64_t)rr * token_elems, true);
        }
    };

    int g0 = 0;
    int32_t defer = early_row;  // only the first pass reads before the wait
    do {  // every path waits (G >= 1: gqa's launch check)
        const int gn = min(GQ_HEADS, G - g0);
        next_tok = begin + c_tok;
        next_pi = next_tok / page_tokens;
        next_off = next_tok - next_pi * page_tokens;
        int32_t row0 = tile_row(), row1 = n_tiles > 1 ? tile_row() : -1;
        issue_tile(0, row0, defer);
        cp_async_commit();
        if (n_tiles > 1) issue_tile(1, row1, defer);
        cp_async_commit();
        kern_pdl_wait();  // q and the row of slot_mapping[s] are the previous kernel's output
        if (defer >= 0) {
            load_deferred(0, row0);
            if (n_tiles > 1) load_deferred(1, row1);
        }
        // q as the B fragments of S^T = K Q^T: column gid = head g0 + gid, k-step kk: dims kk * 16 + 2 tig (+ 8)
        uint32_t qb[NK][2];
        {
            const bool on = gid < gn;
            const __nv_bfloat16* qrow = q + ((int64_t)s * num_q_heads + kvh * G + g0 + (on ? gid : 0)) * D + 2 * tig;
#pragma unroll
            for (int kk = 0; kk < NK; ++kk) {
                qb[kk][0] = on ? gq_load_pair(qrow + kk * 16, qvec) : 0u;
                qb[kk][1] = on ? gq_load_pair(qrow + kk * 16 + 8, qvec) : 0u;
            }
        }
        // O^T accumulators: m-tile mt = dims mt * 16 + gid (+ 8: [2], [3]), columns heads 2 tig, 2 tig + 1
        float o[NK][4];
#pragma unroll
        for (int mt = 0; mt < NK; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
        // running max (scaled log2 units) of heads 2 tig, 2 tig + 1, and this lane's share of their sums of exp
        float m0 = -CUDART_INF_F, m1 = -CUDART_INF_F, l0 = 0.0f, l1 = 0.0f;

        auto compute = [&](int b, int32_t row) {
#if GQ_PROBE & 8
            return;
#endif
            float sa[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sb[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // two chains of k-steps
            // A matrices: (tokens 0-7, dims +0-7), (8-15, +0-7), (0-7, +8-15), (8-15, +8-15)
            const __nv_bfloat16* ka = &sm.kv[b][0][(mi & 1) * 8 + (lane & 7)][(mi >> 1) * 8];
#if !(GQ_PROBE & 4)
#pragma unroll
            for (int kk = 0; kk < NK; ++kk) {
                uint32_t a0, a1, a2, a3;
                ldsm_x4(a0, a1, a2, a3, ka + kk * 16);
                mma_bf16_16816((kk & 1) ? sb : sa, a0, a1, a2, a3, qb[kk][0], qb[kk][1]);
            }
#else
            (void)ka;
#endif
            float sc[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) sc[e] = sa[e] + sb[e];
            // rows (tokens) gid and gid + 8: absent ones masked
            const unsigned present = __ballot_sync(FULL_MASK, row >= 0);  // lane t < 16: token t
            if (!((present >> gid) & 1u)) sc[0] = sc[1] = -CUDART_INF_F;
            if (!((present >> (gid + 8)) & 1u)) sc[2] = sc[3] = -CUDART_INF_F;
            // column max over the tile's 16 tokens (the 8 lanes of a tig)
            float mx0 = fmaxf(sc[0], sc[2]), mx1 = fmaxf(sc[1], sc[3]);
#pragma unroll
            for (int off = 4; off < 32; off <<= 1) {
                mx0 = fmaxf(mx0, __shfl_xor_sync(FULL_MASK, mx0, off));
                mx1 = fmaxf(mx1, __shfl_xor_sync(FULL_MASK, mx1, off));
            }
            const float mn0 = fmaxf(m0, mx0 * sl2), mn1 = fmaxf(m1, mx1 * sl2);
            const float base0 = (mn0 == -CUDART_INF_F) ? 0.0f : mn0;
            const float base1 = (mn1 == -CUDART_INF_F) ? 0.0f : mn1;
            const float alpha0 = pf_ex2(m0 - base0), alpha1 = pf_ex2(m1 - base1);
            m0 = mn0;
            m1 = mn1;
            const float p00 = pf_ex2(fmaf(sc[0], sl2, -base0)), p01 = pf_ex2(fmaf(sc[1], sl2, -base1));
            const float p10 = pf_ex2(fmaf(sc[2], sl2, -base0)), p11 = pf_ex2(fmaf(sc[3], sl2, -base1));
            l0 = l0 * alpha0 + (p00 + p10);
            l1 = l1 * alpha1 + (p01 + p11);
            if (__any_sync(FULL_MASK, alpha0 != 1.0f || alpha1 != 1.0f)) {  // x * 1 is x: skipping is exact
#pragma unroll
                for (int mt = 0; mt < NK; ++mt) {
                    o[mt][0] *= alpha0;
                    o[mt][1] *= alpha1;
                    o[mt][2] *= alpha0;
                    o[mt][3] *= alpha1;
                }
            }
            // P^T as B fragments (b0: tokens 2 tig, 2 tig + 1 of head gid; b1: tokens + 8), two bf16 terms
            uint32_t h0, h1, w0, w1;
            st_split_p(p00, p01, h0, w0);  // tokens gid: (head 2 tig, 2 tig + 1)
            st_split_p(p10, p11, h1, w1);  // tokens gid + 8
            const uint32_t bh0 = movmatrix_trans(h0), bh1 = movmatrix_trans(h1);
            const uint32_t bl0 = movmatrix_trans(w0), bl1 = movmatrix_trans(w1);
            // A matrices (V^T, by .trans): (tokens 0-7, dims +0-7), (0-7, +8-15), (8-15, +0-7), (8-15, +8-15)
            const __nv_bfloat16* va = &sm.kv[b][1][(mi >> 1) * 8 + (lane & 7)][(mi & 1) * 8];
#if !(GQ_PROBE & 2)
#pragma unroll
            for (int mt = 0; mt < NK; ++mt) {
                uint32_t a0, a1, a2, a3;
                ldsm_x4_trans(a0, a1, a2, a3, va + mt * 16);
                mma_bf16_16816(o[mt], a0, a1, a2, a3, bh0, bh1);
#if !(GQ_PROBE & 1)
                mma_bf16_16816(o[mt], a0, a1, a2, a3, bl0, bl1);
#endif
            }
#else
            (void)va;
            (void)bh0;
            (void)bh1;
#endif
            (void)bl0;
            (void)bl1;
        };
        auto step = [&](int i, int b, int32_t& row) {
            cp_async_wait_1();
            __syncwarp();  // every lane's copies of tile i (and the deferred stores) are visible to the warp
            const int32_t next = i + 2 < n_tiles ? tile_row() : -1;
            compute(b, row);
            __syncwarp();  // every lane is done reading stage b
            row = next;
            if (i + 2 < n_tiles) issue_tile(b, row, -1);
            cp_async_commit();
        };
        for (int i = 0; i < n_tiles; i += 2) {
            step(i, 0, row0);
            if (i + 1 < n_tiles) step(i + 1, 1, row1);
        }
        cp_async_wait_all();
#pragma unroll
        for (int off = 4; off < 32; off <<= 1) {
            l0 += __shfl_xor_sync(FULL_MASK, l0, off);
            l1 += __shfl_xor_sync(FULL_MASK, l1, off);
        }
        // O^T -> shared [head][dim] -> part_out rows as float4
        __syncwarp();  // every lane is done with the stages
        float* red = reinterpret_cast<float*>(&sm.kv[0][0][0][0]);
#pragma unroll
        for (int mt = 0; mt < NK; ++mt) {
            const int d = mt * 16 + gid;
            red[(2 * tig) * GQ_OUT_ROW + d] = o[mt][0];
            red[(2 * tig + 1) * GQ_OUT_ROW + d] = o[mt][1];
            red[(2 * tig) * GQ_OUT_ROW + d + 8] = o[mt][2];
            red[(2 * tig + 1) * GQ_OUT_ROW + d + 8] = o[mt][3];
        }
        __syncwarp();
        const int64_t head0 = (int64_t)s * num_q_heads + kvh * G + g0;  // the pass's first q head
        for (int i = lane; i < gn * (D / 4); i += 32) {
            const int h = i / (D / 4), c = i % (D / 4);
            *reinterpret_cast<float4*>(part_out + ((head0 + h) * num_splits + x) * D + 4 * c) =
                *reinterpret_cast<const float4*>(red + h * GQ_OUT_ROW + 4 * c);
        }
        if (gid == 0) {  // back to natural-log units (-inf stays -inf)
            if (2 * tig < gn)
                *reinterpret_cast<float2*>(part_ml + ((head0 + 2 * tig) * num_splits + x) * 2) = make_float2(m0 * LN2, l0);
            if (2 * tig + 1 < gn)
                *reinterpret_cast<float2*>(part_ml + ((head0 + 2 * tig + 1) * num_splits + x) * 2) =
                    make_float2(m1 * LN2, l1);
        }
        __syncwarp();  // the output stage is read before a next pass streams into it
        defer = -1;
        g0 += GQ_HEADS;
    } while (g0 < G);
}

KERN_DEV bool gqa_launch_ok(int num_q_heads, int num_kv_heads, int D, int page_tokens, int split_tokens,
                            int num_splits, int num_pages, const void* kv_cache) {
    return (int)blockDim.x == 32 && D % 16 == 0 && D <= GQ_MAX_D && aligned16(kv_cache) &&
           st_launch_ok(num_q_heads, num_kv_heads, D, page_tokens, split_tokens, num_splits, num_pages);
}

KERN_DEV void gqa_dispatch(GqaSmem& sm, const __nv_bfloat16* q, const __nv_bfloat16* kv_cache, const int32_t* bt_row,
                           float* part_out, float* part_ml, int num_q_heads, int num_kv_heads, int D, int page_tokens,
                           int bt_stride, int num_pages, int num_splits, float scale, const DecodeSplit& g) {
    st_for_nk(D / 16, [&](auto nk) {
        gqa_body<decltype(nk)::value>(sm, q, kv_cache, bt_row, part_out, part_ml, num_q_heads, num_kv_heads,
                                      page_tokens, bt_stride, num_pages, num_splits, scale, blockIdx.z, blockIdx.x,
                                      blockIdx.y, g.begin, g.end, g.early_row);
    });
}

// grid (num_kv_heads, num_splits, seqs), block (32,1,1), static shared memory 17,408 bytes. Parameters, split rule
// and results as kern_attn_decode_partial_stream (a split past the context writes nothing).
extern "C" __global__ void __launch_bounds__(32, 12) kern_attn_decode_partial_gqa(
    const __nv_bfloat16* q,         // [seqs, Hq, D]
    const __nv_bfloat16* kv_cache,  // paged
    const int32_t* block_table,     // [seqs, bt_stride]
    const int32_t* seq_lens,        // [seqs]
    const int32_t* slot_mapping,    // [seqs]: the slot the previous kernel wrote this step's K/V to
    float* part_out,                // [seqs, Hq, num_splits, D]
    float* part_ml,                 // [seqs, Hq, num_splits, 2]
    int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t page_tokens, int32_t bt_stride,
    int32_t num_pages, int32_t split_tokens, int32_t num_splits, float scale) {
    __shared__ __align__(16) GqaSmem sm;
    kern_pdl_launch_dependents();  // early trigger: the reduce reads only seq_lens before its wait
    if (!gqa_launch_ok(num_q_heads, num_kv_heads, head_dim, page_tokens, split_tokens, num_splits, num_pages,
                       kv_cache)) {
        kern_pdl_wait();
        return;
    }
    const DecodeSplit g = decode_split(seq_lens, slot_mapping, page_tokens, num_pages, split_tokens, num_splits);
    if (g.begin >= g.end) {  // past the context: the reduce never reads this split
        kern_pdl_wait();
        return;
    }
    gqa_dispatch(sm, q, kv_cache, block_table + (int64_t)blockIdx.z * bt_stride, part_out, part_ml, num_q_heads,
                 num_kv_heads, head_dim, page_tokens, bt_stride, num_pages, num_splits, scale, g);
}

// kern_attn_decode_partial_gqa and kern_attn_decode_reduce in one launch: each block writes its split's partials
// as the gqa entry does, then takes a ticket of its (row, kv head) in `tickets` (int32 [seqs, num_kv_heads], zero
// before the launch: a fixed state, zero-filled at load); the block that takes the last of the row's `used` tickets
// sets it back to 0 and merges the used splits of the group's q heads into `out` with kern_attn_decode_reduce's
// arithmetic, operation for operation, so `out` has the bits of the two launches. A row with no tokens (seq_len
// <= 0) has its zeros written by split 0. A launch outside the limits writes nothing, `out` included.
extern "C" __global__ void __launch_bounds__(32, 12) kern_attn_decode_gqa_fused(
    const __nv_bfloat16* q, const __nv_bfloat16* kv_cache, const int32_t* block_table, const int32_t* seq_lens,
    const int32_t* slot_mapping, float* part_out, float* part_ml,
    int32_t* tickets,         // [seqs, num_kv_heads], zero before the launch and after it
    __nv_bfloat16* out,       // [seqs, Hq * D]
    int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t page_tokens, int32_t bt_stride,
    int32_t num_pages, int32_t split_tokens, int32_t num_splits, float scale) {
    __shared__ __align__(16) GqaSmem sm;
    kern_pdl_launch_dependents();  // the next kernel (the o projection) reads only its weights before its wait
    const int D = head_dim;
    if (!gqa_launch_ok(num_q_heads, num_kv_heads, D, page_tokens, split_tokens, num_splits, num_pages, kv_cache)) {
        kern_pdl_wait();
        return;
    }
    const int kvh = blockIdx.x, x = blockIdx.y, s = blockIdx.z, lane = threadIdx.x;
    const int G = num_q_heads / num_kv_heads;
    __nv_bfloat16* out_group = out + ((int64_t)s * num_q_heads + (int64_t)kvh * G) * D;  // the group's G x D
    const DecodeSplit g = decode_split(seq_lens, slot_mapping, page_tokens, num_pages, split_tokens, num_splits);
    if (g.begin >= g.end) {
        kern_pdl_wait();
        if (g.seq_len == 0 && x == 0)  // no split holds a token: the reduce's zeros
            for (int i = lane; i < G * D; i += 32) out_group[i] = f2bf(0.0f);
        return;
    }
    gqa_dispatch(sm, q, kv_cache, block_table + (int64_t)s * bt_stride, part_out, part_ml, num_q_heads, num_kv_heads,
                 D, page_tokens, bt_stride, num_pages, num_splits, scale, g);
    __threadfence();  // this split's partials are visible device-wide before its ticket
    __syncwarp();
    int ticket = 0;
    int32_t* t = tickets + (int64_t)s * num_kv_heads + kvh;
    if (lane == 0) ticket = atomicAdd(t, 1);
    ticket = __shfl_sync(FULL_MASK, ticket, 0);
    if (ticket != g.used - 1) return;
    if (lane == 0) *t = 0;  // every used split has taken its ticket: none touches it again in this launch
    __threadfence();        // the other splits' partials (fenced before their tickets) are read after this one
    // Per q head: the reduce's (m_max, weights, l_sum) once, its weights in shared memory (the K/V stages are free),
    // then each lane's D / 32 columns over the used splits, up to GQ_RED splits' loads in flight at a time.
    float* w_sm = reinterpret_cast<float*>(&sm.kv[0][0][0][0]);  // [num_splits] weights, then [num_splits] l
    const bool fits = 2 * num_splits * (int)sizeof(float) <= (int)sizeof(GqaSmem);
    for (int h = 0; h < G; ++h) {
        const int64_t base = ((int64_t)s * num_q_heads + (int64_t)kvh * G + h) * num_splits;
        const float* ml = part_ml + base * 2;
        const float* po = part_out + base * D;
        float m_max = -CUDART_INF_F;
        for (int xs = lane; xs < g.used; xs += 32) m_max = fmaxf(m_max, __ldcg(ml + 2 * xs));
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) m_max = fmaxf(m_max, __shfl_xor_sync(FULL_MASK, m_max, off));
        float l_sum = 0.0f;
        if (m_max != -CUDART_INF_F && fits) {
            __syncwarp();  // the previous head's weights are read
            for (int xs = lane; xs < g.used; xs += 32) {
                w_sm[xs] = exp2f((__ldcg(ml + 2 * xs) - m_max) * LOG2E);  // -inf -> 0
                w_sm[num_splits + xs] = __ldcg(ml + 2 * xs + 1);
            }
            __syncwarp();
            for (int xs = 0; xs < g.used; ++xs) l_sum = fmaf(w_sm[xs], w_sm[num_splits + xs], l_sum);
        }
        for (int d = lane; d < D; d += 32) {
            float o_sum = 0.0f;
            if (m_max != -CUDART_INF_F) {
                if (fits) {
                    for (int x0 = 0; x0 < g.used; x0 += GQ_RED) {
                        float pv[GQ_RED];
#pragma unroll
                        for (int j = 0; j < GQ_RED; ++j) pv[j] = x0 + j < g.used ? __ldcg(po + (int64_t)(x0 + j) * D + d) : 0.0f;
#pragma unroll
                        for (int j = 0; j < GQ_RED; ++j)
                            if (x0 + j < g.used) o_sum = fmaf(w_sm[x0 + j], pv[j], o_sum);
                    }
                } else {  // more splits than shared memory holds: the reduce's loop as it is
                    l_sum = 0.0f;
                    for (int xs = 0; xs < g.used; ++xs) {
                        const float w = exp2f((__ldcg(ml + 2 * xs) - m_max) * LOG2E);
                        l_sum = fmaf(w, __ldcg(ml + 2 * xs + 1), l_sum);
                        o_sum = fmaf(w, __ldcg(po + (int64_t)xs * D + d), o_sum);
                    }
                }
            }
            out_group[(int64_t)h * D + d] = f2bf(l_sum > 0.0f ? o_sum / l_sum : 0.0f);
        }
    }
}
