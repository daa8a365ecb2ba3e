// Paged attention over kern's KV layout (see docs/kernels.md): page p holds [2][page_tokens][Hkv][D] bf16.
//
// Decode (one query token per sequence): kern_attn_decode_partial splits each sequence's context into
// splits of split_tokens; a block (kv head, split, seq) computes, for every q head of the GQA group, the
// unnormalised softmax-weighted V sum of its split plus (max, sum of exp); kern_attn_decode_reduce merges
// the splits. fp32 CUDA-core math, 16-byte K/V loads.
//
// Prefill (chunked, causal, reads everything from the paged cache): kern_attn_prefill, one block per
// (16 query tokens, kv head, seq); the K/V tile in shared memory is shared by the 16 query tokens and all
// q heads of the GQA group; bf16 mma.sync (m16n8k16) with fp32 accumulation, online softmax in fp32.
//
// Block-table entries that are negative, or past bt_stride, read as masked (decode) / zero (prefill);
// page ids are otherwise trusted (these kernels only read the cache; there is no page-count bound).
#include <math_constants.h>

#include "common.cuh"

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// Pointer to K (part 0) or V (part 1) of token `tok` of sequence `s`, kv head `kvh`; nullptr when the
// block table has no valid page for it.
KERN_DEV const __nv_bfloat16* kv_token_ptr(const __nv_bfloat16* kv_cache, const int32_t* block_table, int s,
                                           int bt_stride, int page_tokens, int64_t token_elems, int kvh, int D,
                                           int64_t tok, int part) {
    const int64_t pi = tok / page_tokens;
    if (pi >= bt_stride) return nullptr;
    const int64_t page = block_table[(int64_t)s * bt_stride + pi];
    if (page < 0) return nullptr;
    const int64_t off = tok % page_tokens;
    return kv_cache + ((page * 2 + part) * page_tokens + off) * token_elems + (int64_t)kvh * D;
}

// ---------------------------------------------------------------------------------------------------
// Decode
// ---------------------------------------------------------------------------------------------------
#define DEC_THREADS 128
#define DEC_TILE 64   // context tokens per softmax step
#define DEC_MAX_G 8   // q heads per pass (larger groups run in several passes)
#define DEC_MAX_D 256

// grid (num_kv_heads, num_splits, seqs), block (128,1,1).
// Thread layout: TPT threads per context token (TPT = pow2 >= cdiv(D, 8), at least 4), thread c of a
// token owns head dims [8c, 8c+8); NG = 128 / TPT token groups. Scores live in shared memory per tile.
// part_out[s, hq, x, :] = sum_j exp(s_j - m) v_j (f32), part_ml[s, hq, x] = (m, sum_j exp(s_j - m)),
// m the max of scale * q.k over the split (natural-log units); an empty split gives (-inf, 0), zeros.
extern "C" __global__ void __launch_bounds__(DEC_THREADS) kern_attn_decode_partial(
    const __nv_bfloat16* q,         // [seqs, Hq, D]
    const __nv_bfloat16* kv_cache,  // paged
    const int32_t* block_table,     // [seqs, bt_stride]
    const int32_t* seq_lens,        // [seqs]
    float* part_out,                // [seqs, Hq, num_splits, D]
    float* part_ml,                 // [seqs, Hq, num_splits, 2]
    int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t page_tokens, int32_t bt_stride,
    int32_t split_tokens, int32_t num_splits, float scale) {
    __shared__ float qs[DEC_MAX_G][DEC_MAX_D];   // q of the pass's heads, zero past D
    __shared__ float sc[DEC_MAX_G][DEC_TILE];    // scores, then probabilities, of the tile
    __shared__ float red[DEC_MAX_G][DEC_MAX_D];  // cross-group sum of the V accumulators
    __shared__ float m_run[DEC_MAX_G], l_run[DEC_MAX_G], alpha_s[DEC_MAX_G];

    const int kvh = blockIdx.x, x = blockIdx.y, s = blockIdx.z;
    const int D = head_dim;
    if (num_kv_heads <= 0 || kvh >= num_kv_heads || x >= num_splits || num_q_heads % num_kv_heads != 0 ||
        D <= 0 || D > DEC_MAX_D || page_tokens <= 0 || split_tokens <= 0)
        return;
    const int G = num_q_heads / num_kv_heads;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int C = (D + 7) / 8;  // 8-wide chunks per head row
    int TPT = 4;
    while (TPT < C) TPT *= 2;  // <= 32 since D <= 256
    const int NG = DEC_THREADS / TPT;  // divides DEC_TILE
    const int grp = tid / TPT, c = tid % TPT;
    const bool vec = (D % 8 == 0) && aligned16(kv_cache);
    const int64_t token_elems = (int64_t)num_kv_heads * D;
    const float sl2 = scale * LOG2E;  // scores kept in log2 units inside the kernel
    const int64_t seq_len = seq_lens[s];
    const int64_t begin = (int64_t)x * split_tokens;
    const int64_t end = min(begin + split_tokens, seq_len);

    for (int g0 = 0; g0 < G; g0 += DEC_MAX_G) {
        const int gn = min(DEC_MAX_G, G - g0);
        __syncthreads();  // the previous pass is done with shared memory
        for (int i = tid; i < DEC_MAX_G * DEC_MAX_D; i += DEC_THREADS) {
            const int g = i / DEC_MAX_D, d = i % DEC_MAX_D;
            const int hq = kvh * G + g0 + g;
            qs[g][d] = (g < gn && d < D) ? bf2f(q[((int64_t)s * num_q_heads + hq) * D + d]) : 0.0f;
        }
        if (tid < DEC_MAX_G) {
            m_run[tid] = -CUDART_INF_F;
            l_run[tid] = 0.0f;
        }
        float acc[DEC_MAX_G][8];
#pragma unroll
        for (int g = 0; g < DEC_MAX_G; ++g)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
        __syncthreads();

        for (int64_t tile0 = begin; tile0 < end; tile0 += DEC_TILE) {
            // A: scores of the tile's tokens. Trip count is the same for every thread (NG | DEC_TILE),
            // so the shuffles below always run with the full warp.
            for (int jl = grp; jl < DEC_TILE; jl += NG) {
                const int64_t tok = tile0 + jl;
                const __nv_bfloat16* krow = nullptr;
                if (tok < end)
                    krow = kv_token_ptr(kv_cache, block_table, s, bt_stride, page_tokens, token_elems, kvh, D, tok, 0);
                float kv[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) kv[e] = 0.0f;
                if (krow != nullptr && c < C) load8(krow, c * 8, D, vec, kv);
                float dot[DEC_MAX_G];
#pragma unroll
                for (int g = 0; g < DEC_MAX_G; ++g) {
                    dot[g] = 0.0f;
                    if (c < C) {
#pragma unroll
                        for (int e = 0; e < 8; ++e) dot[g] += qs[g][c * 8 + e] * kv[e];
                    }
                }
#pragma unroll
                for (int g = 0; g < DEC_MAX_G; ++g)
                    for (int o = TPT / 2; o > 0; o >>= 1) dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], o);
                if (c == 0) {
#pragma unroll
                    for (int g = 0; g < DEC_MAX_G; ++g)
                        if (g < gn) sc[g][jl] = krow != nullptr ? dot[g] * sl2 : -CUDART_INF_F;
                }
            }
            __syncthreads();
            // B: online-softmax update, one warp per head.
            for (int g = warp; g < gn; g += DEC_THREADS / 32) {
                const float v0 = sc[g][lane], v1 = sc[g][lane + 32];
                const float m_old = m_run[g];
                const float m_new = fmaxf(m_old, warp_max(fmaxf(v0, v1)));
                const float base = (m_new == -CUDART_INF_F) ? 0.0f : m_new;
                const float p0 = exp2f(v0 - base), p1 = exp2f(v1 - base);
                const float psum = warp_sum(p0 + p1);
                const float alpha = exp2f(m_old - base);
                sc[g][lane] = p0;
                sc[g][lane + 32] = p1;
                __syncwarp();  // every lane has read m_run[g] / l_run[g] before lane 0 rewrites them
                if (lane == 0) {
                    m_run[g] = m_new;
                    l_run[g] = l_run[g] * alpha + psum;
                    alpha_s[g] = alpha;
                }
            }
            __syncthreads();
            // C: acc = acc * alpha + sum_j p_j v_j over this thread's tokens and dims.
#pragma unroll
            for (int g = 0; g < DEC_MAX_G; ++g) {
                if (g < gn) {
                    const float a = alpha_s[g];
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[g][e] *= a;
                }
            }
            if (c < C) {
                for (int jl = grp; jl < DEC_TILE; jl += NG) {
                    const int64_t tok = tile0 + jl;
                    if (tok >= end) break;
                    const __nv_bfloat16* vrow =
                        kv_token_ptr(kv_cache, block_table, s, bt_stride, page_tokens, token_elems, kvh, D, tok, 1);
                    if (vrow == nullptr) continue;
                    float v[8];
                    load8(vrow, c * 8, D, vec, v);
#pragma unroll
                    for (int g = 0; g < DEC_MAX_G; ++g) {
                        if (g < gn) {
                            const float p = sc[g][jl];
#pragma unroll
                            for (int e = 0; e < 8; ++e) acc[g][e] += p * v[e];
                        }
                    }
                }
            }
            __syncthreads();  // sc and alpha_s are rewritten by the next tile
        }

        // Sum the token groups' accumulators in a fixed order (deterministic).
        for (int gi = 0; gi < NG; ++gi) {
            if (grp == gi && c < C) {
#pragma unroll
                for (int g = 0; g < DEC_MAX_G; ++g) {
                    if (g < gn) {
#pragma unroll
                        for (int e = 0; e < 8; ++e) {
                            const int d = c * 8 + e;
                            if (d < D) red[g][d] = (gi == 0 ? 0.0f : red[g][d]) + acc[g][e];
                        }
                    }
                }
            }
            __syncthreads();
        }
        for (int i = tid; i < gn * D; i += DEC_THREADS) {
            const int g = i / D, d = i % D;
            const int hq = kvh * G + g0 + g;
            part_out[(((int64_t)s * num_q_heads + hq) * num_splits + x) * D + d] = red[g][d];
        }
        if (tid < gn) {
            const int hq = kvh * G + g0 + tid;
            float* ml = part_ml + (((int64_t)s * num_q_heads + hq) * num_splits + x) * 2;
            ml[0] = m_run[tid] * LN2;  // back to natural-log units (-inf stays -inf)
            ml[1] = l_run[tid];
        }
    }
}

// grid (num_q_heads, seqs, 1), block (head_dim,1,1): out[s, h*D + d] = sum_x w_x o_x[d] / sum_x w_x l_x,
// w_x = exp(m_x - max_x m_x), over the splits that cover the context; a context of 0 tokens gives zeros.
extern "C" __global__ void kern_attn_decode_reduce(const float* part_out,  // [seqs, Hq, num_splits, D]
                                                   const float* part_ml,   // [seqs, Hq, num_splits, 2]
                                                   const int32_t* seq_lens,  // [seqs]
                                                   __nv_bfloat16* out,       // [seqs, Hq * D]
                                                   int32_t num_q_heads, int32_t head_dim, int32_t split_tokens,
                                                   int32_t num_splits) {
    const int h = blockIdx.x, s = blockIdx.y, d = threadIdx.x;
    const int D = head_dim;
    if (h >= num_q_heads || d >= D || split_tokens <= 0 || num_splits <= 0) return;
    const int64_t seq_len = max(seq_lens[s], 0);
    const int n_used = (int)min((int64_t)num_splits, (seq_len + split_tokens - 1) / split_tokens);
    const int64_t base = ((int64_t)s * num_q_heads + h) * num_splits;
    float m_max = -CUDART_INF_F;
    for (int x = 0; x < n_used; ++x) m_max = fmaxf(m_max, part_ml[(base + x) * 2]);
    float l_sum = 0.0f, o_sum = 0.0f;
    if (m_max != -CUDART_INF_F) {
        for (int x = 0; x < n_used; ++x) {
            const float w = expf(part_ml[(base + x) * 2] - m_max);  // -inf -> 0
            l_sum += w * part_ml[(base + x) * 2 + 1];
            o_sum += w * part_out[(base + x) * D + d];
        }
    }
    out[((int64_t)s * num_q_heads + h) * D + d] = f2bf(l_sum > 0.0f ? o_sum / l_sum : 0.0f);
}

// ---------------------------------------------------------------------------------------------------
// Prefill
// ---------------------------------------------------------------------------------------------------
#define PF_THREADS 128
#define PF_BQ 16              // query tokens per block (one mma M tile per q head)
#define PF_BN 64              // context tokens per K/V tile
#define PF_MAX_D 128          // head_dim must be a multiple of 16 and at most this
#define PF_LD (PF_MAX_D + 8)  // shared row stride in bf16 (272 bytes: conflict-free fragment reads)

KERN_DEV void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

KERN_DEV uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low 16 bits
    return *reinterpret_cast<const uint32_t*>(&v);
}

KERN_DEV uint32_t pack_raw(__nv_bfloat16 lo, __nv_bfloat16 hi) {
    return (uint32_t)__bfloat16_as_ushort(lo) | ((uint32_t)__bfloat16_as_ushort(hi) << 16);
}

// grid (cdiv(max_q_tokens, 16), num_kv_heads, seqs), block (128,1,1). Warp w handles q head
// g0 + w of the group (passes of 4 heads), 16 query rows: one mma M tile. Fragment layouts are those
// of PTX mma.m16n8k16 (.bf16): lane = 4*gid + tig; A regs (row gid | gid+8, cols 2tig.. | 2tig+8..);
// B regs (k rows 2tig.. | 2tig+8.., col gid); C regs (row gid: c0,c1 | row gid+8: c2,c3; cols 2tig, 2tig+1).
extern "C" __global__ void __launch_bounds__(PF_THREADS) kern_attn_prefill(
    const __nv_bfloat16* q,         // [total_q_tokens, Hq, D]
    const __nv_bfloat16* kv_cache,  // paged
    const int32_t* block_table,     // [seqs, bt_stride]
    const int32_t* cu_seqlens_q,    // [seqs + 1]
    const int32_t* seq_lens,        // [seqs]
    __nv_bfloat16* out,             // [total_q_tokens, Hq * D]
    int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t page_tokens, int32_t bt_stride,
    float scale) {
    __shared__ __align__(16) __nv_bfloat16 Ks[PF_BN][PF_LD];
    __shared__ __align__(16) __nv_bfloat16 Vs[PF_BN][PF_LD];

    const int qt = blockIdx.x, kvh = blockIdx.y, s = blockIdx.z;
    const int D = head_dim;
    if (num_kv_heads <= 0 || kvh >= num_kv_heads || num_q_heads % num_kv_heads != 0 || D <= 0 ||
        D > PF_MAX_D || D % 16 != 0 || page_tokens <= 0)
        return;
    const int G = num_q_heads / num_kv_heads;
    const int q_start = cu_seqlens_q[s];
    const int q_len = cu_seqlens_q[s + 1] - q_start;
    const int row0 = qt * PF_BQ;
    if (row0 >= q_len) return;  // uniform over the block
    const int rows_here = min(PF_BQ, q_len - row0);
    const int64_t seq_len = seq_lens[s];
    const int64_t ctx0 = seq_len - q_len;  // absolute position of query row 0 of this sequence
    const int64_t kv_end = max((int64_t)0, min(seq_len, ctx0 + row0 + rows_here));

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int row_a = row0 + gid, row_b = row0 + gid + 8;  // query rows (within the sequence) held
    const bool valid_a = row_a < q_len, valid_b = row_b < q_len;
    const int64_t pos_a = ctx0 + row_a, pos_b = ctx0 + row_b;
    const int nk16 = D / 16;  // k-steps of Q.K^T
    const int nd8 = D / 8;    // n-tiles of P.V
    const int C = D / 8;      // 16-byte chunks per head row
    const bool vec = aligned16(kv_cache);
    const int64_t token_elems = (int64_t)num_kv_heads * D;
    const float sl2 = scale * LOG2E;

    for (int g0 = 0; g0 < G; g0 += PF_THREADS / 32) {
        const int g = g0 + warp;
        const bool active = g < G;  // warp-uniform
        const int hq = kvh * G + g;

        uint32_t qa[PF_MAX_D / 16][4];
#pragma unroll
        for (int kk = 0; kk < PF_MAX_D / 16; ++kk) {
            qa[kk][0] = qa[kk][1] = qa[kk][2] = qa[kk][3] = 0u;
            if (active && kk < nk16) {
                const int col = kk * 16 + tig * 2;
                const __nv_bfloat16* qa_row = q + ((int64_t)(q_start + row_a) * num_q_heads + hq) * D;
                const __nv_bfloat16* qb_row = q + ((int64_t)(q_start + row_b) * num_q_heads + hq) * D;
                if (valid_a) {
                    qa[kk][0] = *reinterpret_cast<const uint32_t*>(qa_row + col);
                    qa[kk][2] = *reinterpret_cast<const uint32_t*>(qa_row + col + 8);
                }
                if (valid_b) {
                    qa[kk][1] = *reinterpret_cast<const uint32_t*>(qb_row + col);
                    qa[kk][3] = *reinterpret_cast<const uint32_t*>(qb_row + col + 8);
                }
            }
        }
        float o[PF_MAX_D / 8][4];
#pragma unroll
        for (int dt = 0; dt < PF_MAX_D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
        float m_a = -CUDART_INF_F, m_b = -CUDART_INF_F, l_a = 0.0f, l_b = 0.0f;

        for (int64_t kv0 = 0; kv0 < kv_end; kv0 += PF_BN) {
            __syncthreads();  // every warp is done with the previous tile
            for (int i = tid; i < PF_BN * C; i += PF_THREADS) {
                const int r = i / C, cc = i % C;
                const int64_t tok = kv0 + r;
                float kf[8], vf[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) kf[e] = vf[e] = 0.0f;
                if (tok < kv_end) {
                    const __nv_bfloat16* kp =
                        kv_token_ptr(kv_cache, block_table, s, bt_stride, page_tokens, token_elems, kvh, D, tok, 0);
                    if (kp != nullptr) {
                        const __nv_bfloat16* vp = kp + (int64_t)page_tokens * token_elems;  // V part, same token
                        load8(kp, cc * 8, D, vec, kf);
                        load8(vp, cc * 8, D, vec, vf);
                    }
                }
                store8_vec(&Ks[r][cc * 8], kf);
                store8_vec(&Vs[r][cc * 8], vf);
            }
            __syncthreads();
            if (!active) continue;  // no barrier until the loop head, which every warp reaches

            // S = Q K^T for this warp's 16 rows x 64 tokens.
            float sacc[PF_BN / 8][4];
#pragma unroll
            for (int nt = 0; nt < PF_BN / 8; ++nt) {
                sacc[nt][0] = sacc[nt][1] = sacc[nt][2] = sacc[nt][3] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < PF_MAX_D / 16; ++kk) {
                    if (kk < nk16) {
                        const __nv_bfloat16* kr = &Ks[nt * 8 + gid][kk * 16 + tig * 2];
                        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr);
                        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + 8);
                        mma_bf16_16816(sacc[nt], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b0, b1);
                    }
                }
            }
            // Scale into log2 units and mask: causal, chunk bounds, rows past the sequence's queries.
            float mx_a = -CUDART_INF_F, mx_b = -CUDART_INF_F;
#pragma unroll
            for (int nt = 0; nt < PF_BN / 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int64_t key = kv0 + nt * 8 + tig * 2 + (e & 1);
                    const bool ok = (e < 2) ? (valid_a && key <= pos_a) : (valid_b && key <= pos_b);
                    sacc[nt][e] = (ok && key < kv_end) ? sacc[nt][e] * sl2 : -CUDART_INF_F;
                }
                mx_a = fmaxf(mx_a, fmaxf(sacc[nt][0], sacc[nt][1]));
                mx_b = fmaxf(mx_b, fmaxf(sacc[nt][2], sacc[nt][3]));
            }
            // A row's 64 scores sit in the 4 lanes of a quad.
            mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
            mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
            mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
            mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
            const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
            const float base_a = (mn_a == -CUDART_INF_F) ? 0.0f : mn_a;
            const float base_b = (mn_b == -CUDART_INF_F) ? 0.0f : mn_b;
            const float alpha_a = exp2f(m_a - base_a), alpha_b = exp2f(m_b - base_b);
            float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
            for (int nt = 0; nt < PF_BN / 8; ++nt) {
                sacc[nt][0] = exp2f(sacc[nt][0] - base_a);
                sacc[nt][1] = exp2f(sacc[nt][1] - base_a);
                sacc[nt][2] = exp2f(sacc[nt][2] - base_b);
                sacc[nt][3] = exp2f(sacc[nt][3] - base_b);
                sum_a += sacc[nt][0] + sacc[nt][1];
                sum_b += sacc[nt][2] + sacc[nt][3];
            }
            sum_a += __shfl_xor_sync(0xffffffffu, sum_a, 1);
            sum_a += __shfl_xor_sync(0xffffffffu, sum_a, 2);
            sum_b += __shfl_xor_sync(0xffffffffu, sum_b, 1);
            sum_b += __shfl_xor_sync(0xffffffffu, sum_b, 2);
            l_a = l_a * alpha_a + sum_a;
            l_b = l_b * alpha_b + sum_b;
            m_a = mn_a;
            m_b = mn_b;
#pragma unroll
            for (int dt = 0; dt < PF_MAX_D / 8; ++dt) {
                o[dt][0] *= alpha_a;
                o[dt][1] *= alpha_a;
                o[dt][2] *= alpha_b;
                o[dt][3] *= alpha_b;
            }
            // O += P V: P (bf16) from the S accumulators as A fragments, V fragments from shared memory.
#pragma unroll
            for (int kk = 0; kk < PF_BN / 16; ++kk) {
                const uint32_t a0 = pack_bf16x2(sacc[2 * kk][0], sacc[2 * kk][1]);
                const uint32_t a1 = pack_bf16x2(sacc[2 * kk][2], sacc[2 * kk][3]);
                const uint32_t a2 = pack_bf16x2(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1]);
                const uint32_t a3 = pack_bf16x2(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3]);
                const int k0 = kk * 16 + tig * 2;
#pragma unroll
                for (int dt = 0; dt < PF_MAX_D / 8; ++dt) {
                    if (dt < nd8) {
                        const int n = dt * 8 + gid;
                        const uint32_t b0 = pack_raw(Vs[k0][n], Vs[k0 + 1][n]);
                        const uint32_t b1 = pack_raw(Vs[k0 + 8][n], Vs[k0 + 9][n]);
                        mma_bf16_16816(o[dt], a0, a1, a2, a3, b0, b1);
                    }
                }
            }
        }

        if (active) {
            const float inv_a = l_a > 0.0f ? 1.0f / l_a : 0.0f;
            const float inv_b = l_b > 0.0f ? 1.0f / l_b : 0.0f;
            __nv_bfloat16* oa = out + ((int64_t)(q_start + row_a) * num_q_heads + hq) * D;
            __nv_bfloat16* ob = out + ((int64_t)(q_start + row_b) * num_q_heads + hq) * D;
#pragma unroll
            for (int dt = 0; dt < PF_MAX_D / 8; ++dt) {
                if (dt < nd8) {
                    const int col = dt * 8 + tig * 2;
                    if (valid_a)
                        *reinterpret_cast<uint32_t*>(oa + col) = pack_bf16x2(o[dt][0] * inv_a, o[dt][1] * inv_a);
                    if (valid_b)
                        *reinterpret_cast<uint32_t*>(ob + col) = pack_bf16x2(o[dt][2] * inv_b, o[dt][3] * inv_b);
                }
            }
        }
    }
}
