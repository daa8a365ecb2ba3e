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
    const int64_t slot = slot_mapping[s];
    const int32_t early_row = (slot >= 0 && slot < (int64_t)max(num_pages, 0) * page_tokens)
                                  ? (int32_t)(slot / page_tokens * 2 * page_tokens + slot % page_tokens)
                                  : -1;
    const int seq_len = max(seq_lens[s], 0);
    const int64_t len = st_split_len(seq_len, split_tokens, num_splits);
    const int begin = (int)min((int64_t)x * len, (int64_t)seq_len);
    const int end = (int)min((int64_t)x * len + len, (int64_t)seq_len);
    if (begin >= end) {  // past the context: the reduce never reads this split
        kern_pdl_wait();
        return;
    }
    const int32_t* bt_row = block_table + (int64_t)s * bt_stride;
#define KERN_STREAM_BODY(NK)                                                                                   \
    stream_body<NK>(sm, q, kv_cache, bt_row, part_out, part_ml, num_q_heads, num_kv_heads, page_tokens,       \
                    bt_stride, num_pages, num_splits, scale, s, kvh, x, begin, end, early_row)
    switch (D / 16) {
        case 1: KERN_STREAM_BODY(1); break;
        case 2: KERN_STREAM_BODY(2); break;
        case 3: KERN_STREAM_BODY(3); break;
        case 4: KERN_STREAM_BODY(4); break;
        case 5: KERN_STREAM_BODY(5); break;
        case 6: KERN_STREAM_BODY(6); break;
        case 7: KERN_STREAM_BODY(7); break;
        case 8: KERN_STREAM_BODY(8); break;
        default: kern_pdl_wait(); break;  // not reached (D checked above); keeps every path waiting
    }
#undef KERN_STREAM_BODY
}
