// Paged attention over kern's KV layout (see docs/kernels.md): page p holds [2][page_tokens][Hkv][D] bf16.
//
// Decode (one query token per sequence): kern_attn_decode_partial splits each sequence's context into
// num_splits splits whose length is derived ON DEVICE from seq_lens (decode_split_len below), so one launch
// shape (fixed grid, as captured in a CUDA graph) serves every context length; a block (kv head, split, seq)
// computes, for every q head of the GQA group, the unnormalised softmax-weighted V sum of its split plus
// (max, sum of exp); kern_attn_decode_reduce merges the splits. fp32 CUDA-core math. Each warp owns an
// interleaved share of the split's tokens and keeps its own online softmax: it issues the 16-byte K and V
// loads of a whole tile (8 token slots per lane on 4 warps; 4 slots on the 8 warps of
// kern_attn_decode_partial_wide, the default) before using any, reduces the q.k partial dot products with a
// butterfly reduce-scatter (30 shuffles for 32 scores instead of 128), and needs no block barrier until the
// final cross-warp merge in shared memory.
//
// Prefill (chunked, causal, reads everything from the paged cache): kern_attn_prefill, one block per
// (16 query tokens x 4 q heads of one kv head; 32 x 2 or 64 x 1 for groups of 2 or 1), 4 warps of
// 16 query rows each; bf16 mma.sync (m16n8k16) with fp32 accumulation, online softmax in exp2 units with
// the scale folded into one FFMA. 64-token K/V tiles stream into shared memory with cp.async, K and V
// overlapped (V of tile t loads during S = Q K^T, K of tile t+1 during O += P V), fragments read with
// ldmatrix (V with .trans), the causal mask applied only to tiles that cross the diagonal, tiles past a
// warp's last query skipped, and the heaviest blocks (last query rows) scheduled first.
//
// Programmatic dependent launch (docs/kernels.md): kern_attn_decode_partial, _fast and kern_attn_prefill start
// with griddepcontrol.wait, then griddepcontrol.launch_dependents (both no-ops without PDL);
// kern_attn_decode_partial_early / _wide and kern_attn_decode_reduce trigger first and read, before their wait, only
// what the kernel before them does not write (docs/kernels.md "Early trigger"). Every path of every entry waits.
//
// Page ids come from the block table and are bounded: the decode and prefill entries take num_pages (the
// pages of the paged state's reserved range, a manifest's {"pages_of": state}), and an entry outside
// [0, num_pages) -- negative, past the end of the range, or garbage -- reads as absent, like an entry past
// bt_stride: masked in decode, K/V of zeros in prefill. Nothing outside the state's range is ever read.
// The check is one unsigned compare where the page id is read (num_pages <= 0: every page is absent).
// Decode indexes K/V rows in 32 bits, so num_pages * 2 * page_tokens > 2^31 - 1 is outside its limits.
#include <math_constants.h>

#include "common.cuh"
#include "prefill.cuh"

#define LN2 0.6931471805599453f

// bf16 pair (low half first) -> two floats, exact.
KERN_DEV float bf_lo(uint32_t u) { return __uint_as_float(u << 16); }
KERN_DEV float bf_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

KERN_DEV void raw8_to_f32(const uint4& r, float (&v)[8]) {
    v[0] = bf_lo(r.x);
    v[1] = bf_hi(r.x);
    v[2] = bf_lo(r.y);
    v[3] = bf_hi(r.y);
    v[4] = bf_lo(r.z);
    v[5] = bf_hi(r.z);
    v[6] = bf_lo(r.w);
    v[7] = bf_hi(r.w);
}

// Elements [i0, i0 + 8) of a bf16 row of n elements as 8 packed bf16: one 16-byte load when `vec`
// (caller guarantees i0 + 8 <= n and 16-byte alignment), else element loads with zeros at or past n.
KERN_DEV uint4 load_raw8(const __nv_bfloat16* row, int i0, int n, bool vec) {
    if (vec) return *reinterpret_cast<const uint4*>(row + i0);
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t lo = (i0 + 2 * i < n) ? (uint32_t)__bfloat16_as_ushort(row[i0 + 2 * i]) : 0u;
        const uint32_t hi = (i0 + 2 * i + 1 < n) ? (uint32_t)__bfloat16_as_ushort(row[i0 + 2 * i + 1]) : 0u;
        w[i] = lo | (hi << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// ---------------------------------------------------------------------------------------------------
// Decode
// ---------------------------------------------------------------------------------------------------
// The decode partial's block shape: WARPS warps, each lane J token slots per tile (J K and J V 16-byte loads
// in flight). The plain / fast / early entries: 4 warps x 8 slots; the wide entry: 8 warps x 4 slots (the same
// 64-token tile at head_dim 128, half the serial work per lane, two warps per SM sub-partition).
#define DEC_THREADS 128
#define DEC_WARPS (DEC_THREADS / 32)
#define DEC_J 8
#define DEC_WIDE_WARPS 8
#define DEC_WIDE_J 4
#define DEC_GP 4      // q heads per pass (larger groups run in several passes)
#define DEC_GRAN 16   // split lengths are rounded up to a multiple of this
#define DEC_MAX_D 256

// Decode computes a K row index as page * 2 * page_tokens + offset in 32 bits: a page bound past that range
// (2^26 pages of 16 tokens, far beyond any pool) is outside the kernel's limits.
KERN_DEV bool num_pages_overflow(int num_pages, int page_tokens) {
    return (int64_t)num_pages * 2 * page_tokens > (int64_t)INT32_MAX;
}

// Effective split length of a sequence of seq_len tokens: split_tokens is the MINIMUM split length; a
// context longer than num_splits * split_tokens gets splits of cdiv(seq_len, num_splits) rounded up to a
// multiple of DEC_GRAN, so the num_splits splits always cover the whole context. The reduce uses the same.
KERN_DEV int64_t decode_split_len(int seq_len, int split_tokens, int num_splits) {
    const int64_t per = ((int64_t)max(seq_len, 0) + num_splits - 1) / num_splits;
    return max((int64_t)split_tokens, (per + DEC_GRAN - 1) / DEC_GRAN * DEC_GRAN);
}

// Butterfly reduce-scatter of N values over the TPT lanes of a lane group (TPT a power of two <= 32,
// N a multiple of TPT): afterwards v[i] (i < N / TPT) holds the group's sum of original value
// (lane % TPT) * (N / TPT) + i. log2(TPT) steps of halving: N/2 + N/4 + ... shuffles.
template <int O, int N>
KERN_DEV void reduce_scatter_step(float (&v)[N], int lane) {
    if constexpr (O >= 1) {
        constexpr int HN = N / 2;
        const bool up = (lane & O) != 0;
        float w[HN];
#pragma unroll
        for (int i = 0; i < HN; ++i) {
            const float send = up ? v[i] : v[i + HN];
            const float keep = up ? v[i + HN] : v[i];
            w[i] = keep + __shfl_xor_sync(FULL_MASK, send, O);
        }
        reduce_scatter_step<O / 2, HN>(w, lane);
#pragma unroll
        for (int i = 0; i < HN; ++i) v[i] = w[i];
    }
}
template <int TPT, int N>
KERN_DEV void reduce_scatter(float (&v)[N], int lane) {
    static_assert(N % TPT == 0, "values must split evenly over the lane group");
    reduce_scatter_step<TPT / 2, N>(v, lane);
}

template <int WARPS, int J>
struct DecodeSmemT {
    float q[DEC_GP][DEC_MAX_D];               // q * scale * log2(e) of the pass's heads
    float red[WARPS][DEC_GP][DEC_MAX_D];      // per-warp V accumulators for the final merge
    float sc[WARPS][8][J * DEC_GP + 4];       // per-warp score all-gather (TPW <= 8 token groups)
    float ml[WARPS][DEC_GP][2];               // per-warp (m, l), log2 units
};
using DecodeSmem = DecodeSmemT<DEC_WARPS, DEC_J>;
using DecodeSmemWide = DecodeSmemT<DEC_WIDE_WARPS, DEC_WIDE_J>;

// Thread layout: TPT lanes per token (lane c of a token owns head dims [8c, 8c + 8)), TPW = 32 / TPT
// tokens per warp load instruction. Tile of TILE = WARPS * J * TPW tokens; token slot j of lane
// (token group h, chunk c) of warp w is token tile0 + (j * WARPS + w) * TPW + h, so even a short split spreads
// over every warp.
// EARLY (implies FAST): the caller has not waited: the first pass's first tile is loaded before
// griddepcontrol.wait, then the slot written by the previous kernel (early_row, the K row of slot_mapping[s];
// -1: none) is loaded again after it.
template <int TPT, bool FAST = false, bool EARLY = false, int WARPS = DEC_WARPS, int J = DEC_J>
KERN_DEV void decode_body(DecodeSmemT<WARPS, J>& sm, const __nv_bfloat16* q, const __nv_bfloat16* kv_cache,
                          const int32_t* block_table, float* part_out, float* part_ml, int num_q_heads,
                          int num_kv_heads, int D, int page_tokens, int bt_stride, int num_pages, int num_splits,
                          float scale, int s, int kvh, int x, int begin, int end, int32_t early_row = -1) {
    static_assert(!EARLY || FAST, "the early entry is the FAST entry with a later wait");
    constexpr int TPW = 32 / TPT;
    constexpr int THREADS = WARPS * 32;
    constexpr int NV = J * DEC_GP;  // scores per lane per tile
    constexpr int TILE = WARPS * J * TPW;
    constexpr int NR = NV / TPT;  // scores per lane after the reduce-scatter
    const int G = num_q_heads / num_kv_heads;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h = lane / TPT, c = lane % TPT;
    const int C = (D + 7) / 8;
    const bool cok = c < C;
    const bool vec = (D % 8 == 0) && aligned16(kv_cache);
    const int64_t token_elems = (int64_t)num_kv_heads * D;
    const int64_t v_off = (int64_t)page_tokens * token_elems;  // V part of a token: K pointer + v_off
    const float sl2 = scale * LOG2E;
    const int32_t* bt_row = block_table + (int64_t)s * bt_stride;
    // Page ids in [0, num_pages) are present: one unsigned compare also rejects negative ids (and -1, the
    // value given to slots past the split or the row).
    const uint32_t page_limit = (uint32_t)max(num_pages, 0);

    const __nv_bfloat16* kbase = kv_cache + (int64_t)kvh * D + c * 8;  // this lane's chunk of token row 0

    // K row index (page * 2 * page_tokens + offset in page) of each token slot of the tile at t0, or -1
    // (past the split, past bt_stride, or a page id outside [0, num_pages)): the same for every lane of a
    // token group (lanes with c >= C skip their loads). Slot j is token t0 + (j * WARPS + warp) * TPW + h: one
    // division per tile, then steps.
    constexpr int STEP = WARPS * TPW;
    const int step_pi = STEP / page_tokens, step_r = STEP - step_pi * page_tokens;
    auto slot_rows = [&](int t0, int32_t (&rows)[J]) {
        int tok = t0 + warp * TPW + h;
        int pi = tok / page_tokens;
        int r = tok - pi * page_tokens;
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const bool ok = tok < end && pi < bt_stride;
            const int page = ok ? bt_row[pi] : -1;
            rows[j] = (uint32_t)page < page_limit ? page * 2 * page_tokens + r : -1;
            tok += STEP;
            pi += step_pi;
            r += step_r;
            if (r >= page_tokens) {
                r -= page_tokens;
                ++pi;
            }
        }
    };
    auto load_k = [&](int32_t r) -> uint4 {
        return (r >= 0 && cok) ? load_raw8(kbase + (int64_t)r * token_elems, 0, D - c * 8, vec)
                               : make_uint4(0u, 0u, 0u, 0u);
    };
    auto load_v = [&](int32_t r) -> uint4 {
        return (r >= 0 && cok) ? load_raw8(kbase + (int64_t)r * token_elems + v_off, 0, D - c * 8, vec)
                               : make_uint4(0u, 0u, 0u, 0u);
    };

    // A do-while: G >= 1 (decode_launch_ok), and the SASS then has no path that skips every pass, so every
    // path of the EARLY body passes its wait (tools/sass_paths.py).
    int g0 = 0;
    do {
        const int gn = min(DEC_GP, G - g0);
        if (g0 > 0) __syncthreads();  // the previous pass is done with sm.q / sm.red / sm.ml
        int32_t off[J];
        uint4 kr[J], vr[J];
        if constexpr (FAST) {
            // The first tile's block-table rows and K/V loads do not depend on q: issue them first, so the
            // q load below overlaps them instead of adding a round trip.
            slot_rows(begin, off);
#pragma unroll
            for (int j = 0; j < J; ++j) kr[j] = load_k(off[j]);
#pragma unroll
            for (int j = 0; j < J; ++j) vr[j] = load_v(off[j]);
            if constexpr (EARLY) {
                // q and the new token's K / V row are the previous kernel's output. Every pass waits (no branch
                // around it); after the first the wait is already satisfied (passes of 4 heads: Qwen3-4B's G = 4
                // is one pass, G = 5..8 two).
                kern_pdl_wait();
                if (early_row >= 0) {
#pragma unroll
                    for (int j = 0; j < J; ++j) {
                        if (off[j] == early_row) {
                            kr[j] = load_k(off[j]);
                            vr[j] = load_v(off[j]);
                        }
                    }
                }
            }
            // q * scale * log2(e) of the pass's heads, one 8-element chunk per thread of the first DEC_GP *
            // DEC_MAX_D / 8 (all of them at 4 warps): thread t stages head g = t / 32, dims [8 (t % 32), 8 (t % 32)
            // + 8); zero past D / gn.
            constexpr int Q_THREADS = DEC_GP * DEC_MAX_D / 8;
            static_assert(THREADS >= Q_THREADS, "one q chunk per thread");
            const int g = tid >> 5, d0 = (tid & 31) * 8;
            float qv[8];
            if (THREADS > Q_THREADS && tid >= Q_THREADS) {
                // no q chunk: nothing to stage
            } else if (g < gn && d0 < D) {
                const __nv_bfloat16* qp = q + ((int64_t)s * num_q_heads + kvh * G + g0 + g) * D + d0;
                raw8_to_f32(load_raw8(qp, 0, D - d0, (D % 8 == 0) && aligned16(q)), qv);
#pragma unroll
                for (int e = 0; e < 8; ++e) qv[e] *= sl2;
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) qv[e] = 0.0f;
            }
            if (THREADS == Q_THREADS || tid < Q_THREADS) {
                *reinterpret_cast<float4*>(&sm.q[g][d0]) = make_float4(qv[0], qv[1], qv[2], qv[3]);
                *reinterpret_cast<float4*>(&sm.q[g][d0 + 4]) = make_float4(qv[4], qv[5], qv[6], qv[7]);
            }
        } else {
            // q * scale * log2(e) of the pass's heads (scores come out in log2 units), zero past D / gn.
            for (int i = tid; i < DEC_GP * DEC_MAX_D; i += THREADS) {
                const int g = i / DEC_MAX_D, d = i % DEC_MAX_D;
                sm.q[g][d] = (g < gn && d < D) ? bf2f(q[((int64_t)s * num_q_heads + kvh * G + g0 + g) * D + d]) * sl2 : 0.0f;
            }
        }
        __syncthreads();
        float m[DEC_GP], l[DEC_GP], acc[DEC_GP][8];
#pragma unroll
        for (int g = 0; g < DEC_GP; ++g) {
            m[g] = -CUDART_INF_F;  // warp-uniform running max (log2 units)
            l[g] = 0.0f;           // this lane's token group's running sum of exp
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
        }

        if constexpr (!FAST) {
            slot_rows(begin, off);
#pragma unroll
            for (int j = 0; j < J; ++j) kr[j] = load_k(off[j]);
#pragma unroll
            for (int j = 0; j < J; ++j) vr[j] = load_v(off[j]);
        }

        for (int t0 = begin; t0 < end; t0 += TILE) {
            int32_t offn[J];  // next tile's rows: the block-table reads overlap this tile's math
            slot_rows(t0 + TILE, offn);

            // Partial q.k over this lane's 8 dims, then the token group's sum (reduce-scatter + all-gather).
            float sv[NV];
#pragma unroll
            for (int j = 0; j < J; ++j) {
                float kf[8];
                raw8_to_f32(kr[j], kf);
#pragma unroll
                for (int g = 0; g < DEC_GP; ++g) {
                    const float4 qa = *reinterpret_cast<const float4*>(&sm.q[g][c * 8]);
                    const float4 qb = *reinterpret_cast<const float4*>(&sm.q[g][c * 8 + 4]);
                    float d = qa.x * kf[0];
                    d = fmaf(qa.y, kf[1], d);
                    d = fmaf(qa.z, kf[2], d);
                    d = fmaf(qa.w, kf[3], d);
                    d = fmaf(qb.x, kf[4], d);
                    d = fmaf(qb.y, kf[5], d);
                    d = fmaf(qb.z, kf[6], d);
                    d = fmaf(qb.w, kf[7], d);
                    sv[j * DEC_GP + g] = d;
                }
            }
            reduce_scatter<TPT, NV>(sv, lane);
            float* row = &sm.sc[warp][h][0];
            __syncwarp();  // every lane has read the previous tile's scores
#pragma unroll
            for (int i = 0; i < NR; ++i) row[c * NR + i] = sv[i];
            __syncwarp();
            float p[NV];
#pragma unroll
            for (int i = 0; i < NV; i += 4) {
                const float4 v4 = *reinterpret_cast<const float4*>(row + i);
                p[i] = v4.x;
                p[i + 1] = v4.y;
                p[i + 2] = v4.z;
                p[i + 3] = v4.w;
            }
            // K registers are free: the next tile's K loads fly during the softmax and P.V below.
#pragma unroll
            for (int j = 0; j < J; ++j) kr[j] = load_k(offn[j]);
            // Online softmax per head over the warp's tile tokens (masked slots: -inf).
#pragma unroll
            for (int g = 0; g < DEC_GP; ++g) {
                float mx = -CUDART_INF_F;
#pragma unroll
                for (int j = 0; j < J; ++j) {
                    if (off[j] < 0) p[j * DEC_GP + g] = -CUDART_INF_F;
                    mx = fmaxf(mx, p[j * DEC_GP + g]);
                }
#pragma unroll
                for (int o = TPT; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, o));
                const float m_new = fmaxf(m[g], mx);
                const float base = (m_new == -CUDART_INF_F) ? 0.0f : m_new;
                const float alpha = exp2f(m[g] - base);
                m[g] = m_new;
                float sum = 0.0f;
#pragma unroll
                for (int j = 0; j < J; ++j) {
                    const float e = exp2f(p[j * DEC_GP + g] - base);
                    p[j * DEC_GP + g] = e;
                    sum += e;
                }
                l[g] = l[g] * alpha + sum;
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[g][e] *= alpha;
            }
            // acc += p v over the lane's token slots.
#pragma unroll
            for (int j = 0; j < J; ++j) {
                float vf[8];
                raw8_to_f32(vr[j], vf);
#pragma unroll
                for (int g = 0; g < DEC_GP; ++g) {
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(p[j * DEC_GP + g], vf[e], acc[g][e]);
                }
            }
#pragma unroll
            for (int j = 0; j < J; ++j) vr[j] = load_v(offn[j]);
#pragma unroll
            for (int j = 0; j < J; ++j) off[j] = offn[j];
        }

        // Merge the warp's token groups (same c, different h), then the warps through shared memory.
#pragma unroll
        for (int o = TPT; o < 32; o <<= 1) {
#pragma unroll
            for (int g = 0; g < DEC_GP; ++g) {
                l[g] += __shfl_xor_sync(FULL_MASK, l[g], o);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[g][e] += __shfl_xor_sync(FULL_MASK, acc[g][e], o);
            }
        }
        if (h == 0 && cok) {
#pragma unroll
            for (int g = 0; g < DEC_GP; ++g) {
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    if (c * 8 + e < D) sm.red[warp][g][c * 8 + e] = acc[g][e];
            }
        }
        if (lane == 0) {
#pragma unroll
            for (int g = 0; g < DEC_GP; ++g) {
                sm.ml[warp][g][0] = m[g];
                sm.ml[warp][g][1] = l[g];
            }
        }
        __syncthreads();
        for (int i = tid; i < gn * D; i += THREADS) {
            const int g = i / D, d = i - g * D;
            float mm = -CUDART_INF_F;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) mm = fmaxf(mm, sm.ml[w][g][0]);
            float o = 0.0f;
            if (mm != -CUDART_INF_F) {
#pragma unroll
                for (int w = 0; w < WARPS; ++w) o += exp2f(sm.ml[w][g][0] - mm) * sm.red[w][g][d];
            }
            const int hq = kvh * G + g0 + g;
            part_out[(((int64_t)s * num_q_heads + hq) * num_splits + x) * D + d] = o;
        }
        if (tid < gn) {
            const int g = tid;
            float mm = -CUDART_INF_F;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) mm = fmaxf(mm, sm.ml[w][g][0]);
            float ll = 0.0f;
            if (mm != -CUDART_INF_F) {
#pragma unroll
                for (int w = 0; w < WARPS; ++w) ll += exp2f(sm.ml[w][g][0] - mm) * sm.ml[w][g][1];
            }
            const int hq = kvh * G + g0 + g;
            float* ml = part_ml + (((int64_t)s * num_q_heads + hq) * num_splits + x) * 2;
            ml[0] = mm * LN2;  // back to natural-log units (-inf stays -inf)
            ml[1] = ll;
        }
        g0 += DEC_GP;
    } while (g0 < G);
}

// The limits every decode partial entry checks (uniform over the grid: a launch outside them writes nothing).
KERN_DEV bool decode_launch_ok(int num_q_heads, int num_kv_heads, int D, int page_tokens, int split_tokens,
                               int num_splits, int num_pages) {
    return num_q_heads > 0 && num_kv_heads > 0 && (int)blockIdx.x < num_kv_heads && (int)blockIdx.y < num_splits &&
           num_q_heads % num_kv_heads == 0 && D > 0 && D <= DEC_MAX_D && page_tokens > 0 && split_tokens > 0 &&
           !num_pages_overflow(num_pages, page_tokens);
}

// Tokens [begin, end) of split x of a sequence of seq_len tokens (empty past the context).
struct SplitRange {
    int begin, end;
};
KERN_DEV SplitRange decode_split_range(int seq_len, int split_tokens, int num_splits, int x) {
    const int64_t len = decode_split_len(seq_len, split_tokens, num_splits);
    return {(int)min((int64_t)x * len, (int64_t)seq_len), (int)min((int64_t)x * len + len, (int64_t)seq_len)};
}

// decode_body at the lane-group width TPT that covers head_dim (ceil(D / 8) 16-byte chunks: 4, 8, 16 or 32).
template <bool FAST, bool EARLY = false, int WARPS = DEC_WARPS, int J = DEC_J>
KERN_DEV void decode_body_for_d(DecodeSmemT<WARPS, J>& sm, const __nv_bfloat16* q, const __nv_bfloat16* kv_cache,
                                const int32_t* block_table, float* part_out, float* part_ml, int num_q_heads,
                                int num_kv_heads, int D, int page_tokens, int bt_stride, int num_pages, int num_splits,
                                float scale, int s, int kvh, int x, SplitRange r, int32_t early_row = -1) {
    const int C = (D + 7) / 8;
#define KERN_DECODE_BODY(TPT)                                                                                  \
    decode_body<TPT, FAST, EARLY, WARPS, J>(sm, q, kv_cache, block_table, part_out, part_ml, num_q_heads, num_kv_heads, D, \
                                  page_tokens, bt_stride, num_pages, num_splits, scale, s, kvh, x, r.begin, r.end, \
                                  early_row)
    if (C <= 4) {
        KERN_DECODE_BODY(4);
    } else if (C <= 8) {
        KERN_DECODE_BODY(8);
    } else if (C <= 16) {
        KERN_DECODE_BODY(16);
    } else {
        if constexpr (J * DEC_GP >= 32) KERN_DECODE_BODY(32);  // the wide shape stops at head_dim 128 (checked)
    }
#undef KERN_DECODE_BODY
}

// grid (num_kv_heads, num_splits, seqs), block (128,1,1).
// Split x of sequence s covers tokens [x * L, min((x + 1) * L, seq_len)), L = decode_split_len(...).
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
    int32_t num_pages,              // page ids outside [0, num_pages) are masked
    int32_t split_tokens, int32_t num_splits, float scale) {
    __shared__ __align__(16) DecodeSmem sm;
    kern_pdl_wait();
    kern_pdl_launch_dependents();
    const int kvh = blockIdx.x, x = blockIdx.y, s = blockIdx.z;
    if (!decode_launch_ok(num_q_heads, num_kv_heads, head_dim, page_tokens, split_tokens, num_splits, num_pages)) return;
    const SplitRange r = decode_split_range(max(seq_lens[s], 0), split_tokens, num_splits, x);
    decode_body_for_d<false>(sm, q, kv_cache, block_table, part_out, part_ml, num_q_heads, num_kv_heads, head_dim,
                             page_tokens, bt_stride, num_pages, num_splits, scale, s, kvh, x, r);
}

// Writes what decode_body writes for an empty split: (-inf, 0) and zero part_out rows of the group's heads.
template <int THREADS = DEC_THREADS>
KERN_DEV void write_empty_split(float* part_out, float* part_ml, int num_q_heads, int G, int D, int num_splits,
                                int s, int kvh, int x) {
    for (int i = threadIdx.x; i < G * D; i += THREADS) {
        const int g = i / D, d = i - g * D;
        part_out[(((int64_t)s * num_q_heads + kvh * G + g) * num_splits + x) * D + d] = 0.0f;
    }
    for (int g = threadIdx.x; g < G; g += THREADS) {
        float* ml = part_ml + (((int64_t)s * num_q_heads + kvh * G + g) * num_splits + x) * 2;
        ml[0] = -CUDART_INF_F;
        ml[1] = 0.0f;
    }
}

// kern_attn_decode_partial with the same signature, launch and results (docs/kernels.md), cheaper at short
// contexts: a split past the context writes its (-inf, 0) and zero part_out rows at once and returns (no q
// load, no barrier), and a working split issues its first tile's block-table and K/V loads before staging q
// (one 16-byte q load per thread instead of a loop of element loads), so q's latency overlaps K/V's.
extern "C" __global__ void __launch_bounds__(DEC_THREADS) kern_attn_decode_partial_fast(
    const __nv_bfloat16* q, const __nv_bfloat16* kv_cache, const int32_t* block_table, const int32_t* seq_lens,
    float* part_out, float* part_ml, int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
    int32_t page_tokens, int32_t bt_stride, int32_t num_pages, int32_t split_tokens, int32_t num_splits,
    float scale) {
    __shared__ __align__(16) DecodeSmem sm;
    kern_pdl_wait();
    kern_pdl_launch_dependents();
    const int kvh = blockIdx.x, x = blockIdx.y, s = blockIdx.z;
    if (!decode_launch_ok(num_q_heads, num_kv_heads, head_dim, page_tokens, split_tokens, num_splits, num_pages)) return;
    const SplitRange r = decode_split_range(max(seq_lens[s], 0), split_tokens, num_splits, x);
    if (r.begin >= r.end) {  // empty split: what decode_body writes for it, without its loads and barriers
        write_empty_split(part_out, part_ml, num_q_heads, num_q_heads / num_kv_heads, head_dim, num_splits, s, kvh, x);
        return;
    }
    decode_body_for_d<true>(sm, q, kv_cache, block_table, part_out, part_ml, num_q_heads, num_kv_heads, head_dim,
                            page_tokens, bt_stride, num_pages, num_splits, scale, s, kvh, x, r);
}

// kern_attn_decode_partial_fast with the wait moved later (docs/kernels.md): seq_lens, slot_mapping, the block
// table and the first tile's K / V are read BEFORE griddepcontrol.wait, so under PDL they overlap the previous
// kernel; it must be kern_qk_norm_rope_kv (or any kernel that writes q and, of the cache, at most the rows of
// slot_mapping): after the wait q is staged and the row of slot_mapping[s] (when inside [0, num_pages *
// page_tokens)) is loaded again wherever the first tile holds it. Same launch and results as the fast entry.
// The body of kern_attn_decode_partial_early (4 warps x 8 slots) and kern_attn_decode_partial_wide (8 warps x 4
// slots): the block must be WARPS whole warps (checked; any other block writes nothing).
template <int WARPS, int J>
KERN_DEV void decode_partial_early(DecodeSmemT<WARPS, J>& sm, const __nv_bfloat16* q, const __nv_bfloat16* kv_cache,
                                   const int32_t* block_table, const int32_t* seq_lens, const int32_t* slot_mapping,
                                   float* part_out, float* part_ml, int32_t num_q_heads, int32_t num_kv_heads,
                                   int32_t head_dim, int32_t page_tokens, int32_t bt_stride, int32_t num_pages,
                                   int32_t split_tokens, int32_t num_splits, float scale) {
    kern_pdl_launch_dependents();  // early trigger (docs/kernels.md): the reduce reads only seq_lens before its wait
    const int kvh = blockIdx.x, x = blockIdx.y, s = blockIdx.z;
    // the block is WARPS warps; the wide shape's 16 scores per lane cover at most 16 lanes per token (head_dim 128)
    const bool block_ok = WARPS == DEC_WARPS || ((int)blockDim.x == WARPS * 32 && head_dim <= 8 * J * DEC_GP);
    if (!block_ok ||
        !decode_launch_ok(num_q_heads, num_kv_heads, head_dim, page_tokens, split_tokens, num_splits, num_pages)) {
        kern_pdl_wait();  // every path waits: the grid never completes before its predecessor
        return;
    }
    const int64_t slot = slot_mapping[s];
    const int32_t early_row = (slot >= 0 && slot < (int64_t)max(num_pages, 0) * page_tokens)
                                  ? (int32_t)(slot / page_tokens * 2 * page_tokens + slot % page_tokens)
                                  : -1;
    const SplitRange r = decode_split_range(max(seq_lens[s], 0), split_tokens, num_splits, x);
    if (r.begin >= r.end) {
        kern_pdl_wait();
        write_empty_split<WARPS * 32>(part_out, part_ml, num_q_heads, num_q_heads / num_kv_heads, head_dim, num_splits,
                                      s, kvh, x);
        return;
    }
    decode_body_for_d<true, true, WARPS, J>(sm, q, kv_cache, block_table, part_out, part_ml, num_q_heads,
                                            num_kv_heads, head_dim, page_tokens, bt_stride, num_pages, num_splits,
                                            scale, s, kvh, x, r, early_row);
}

extern "C" __global__ void __launch_bounds__(DEC_THREADS) kern_attn_decode_partial_early(
    const __nv_bfloat16* q, const __nv_bfloat16* kv_cache, const int32_t* block_table, const int32_t* seq_lens,
    const int32_t* slot_mapping, float* part_out, float* part_ml, int32_t num_q_heads, int32_t num_kv_heads,
    int32_t head_dim, int32_t page_tokens, int32_t bt_stride, int32_t num_pages, int32_t split_tokens,
    int32_t num_splits, float scale) {
    __shared__ __align__(16) DecodeSmem sm;
    decode_partial_early(sm, q, kv_cache, block_table, seq_lens, slot_mapping, part_out, part_ml, num_q_heads,
                         num_kv_heads, head_dim, page_tokens, bt_stride, num_pages, split_tokens, num_splits, scale);
}

// kern_attn_decode_partial_early with 8 warps of 4 token slots per lane (block (256,1,1), head_dim <= 128; any
// other launch writes nothing): the same tile (64 tokens at head_dim 128) and split geometry, half the serial work per lane, two
// warps per SM sub-partition. Same signature and contract; results equal the early entry's up to the fp32 order
// of the per-warp online softmax (the tokens are dealt to 8 warps, not 4).
extern "C" __global__ void __launch_bounds__(DEC_WIDE_WARPS * 32) kern_attn_decode_partial_wide(
    const __nv_bfloat16* q, const __nv_bfloat16* kv_cache, const int32_t* block_table, const int32_t* seq_lens,
    const int32_t* slot_mapping, float* part_out, float* part_ml, int32_t num_q_heads, int32_t num_kv_heads,
    int32_t head_dim, int32_t page_tokens, int32_t bt_stride, int32_t num_pages, int32_t split_tokens,
    int32_t num_splits, float scale) {
    __shared__ __align__(16) DecodeSmemWide sm;
    decode_partial_early(sm, q, kv_cache, block_table, seq_lens, slot_mapping, part_out, part_ml, num_q_heads,
                         num_kv_heads, head_dim, page_tokens, bt_stride, num_pages, split_tokens, num_splits, scale);
}

// grid (num_q_heads, seqs, 1), block (head_dim,1,1): out[s, h*D + d] = sum_x w_x o_x[d] / sum_x w_x l_x,
// w_x = exp(m_x - max_x m_x), over the splits x < cdiv(seq_len, L) (L the same effective split length as
// the partial kernel's); a context of 0 tokens gives zeros.
// One round trip after the wait: every thread loads every used split's (m, l) itself (the same 8-byte rows
// in every thread: L1 broadcasts) together with its own part_out values, RED_BATCH splits at a time, and
// takes the max over them in registers; no barrier. The sums run over x in ascending order, as before.
#define RED_BATCH 16
extern "C" __global__ void kern_attn_decode_reduce(const float* part_out,  // [seqs, Hq, num_splits, D]
                                                   const float* part_ml,   // [seqs, Hq, num_splits, 2]
                                                   const int32_t* seq_lens,  // [seqs]
                                                   __nv_bfloat16* out,       // [seqs, Hq * D]
                                                   int32_t num_q_heads, int32_t head_dim, int32_t split_tokens,
                                                   int32_t num_splits) {
    const int h = blockIdx.x, s = blockIdx.y, d = threadIdx.x;
    const int D = head_dim;
    const bool ok = h < num_q_heads && split_tokens > 0 && num_splits > 0;  // uniform over the block
    // Early trigger (docs/kernels.md): the o projection after this reads only its weights before its wait.
    kern_pdl_launch_dependents();
    const int seq_len = ok ? max(seq_lens[s], 0) : 0;  // before the wait: the partial kernel does not write it
    kern_pdl_wait();
    if (!ok || d >= D) return;
    const int64_t len = decode_split_len(seq_len, split_tokens, num_splits);
    const int n_used = (int)min((int64_t)num_splits, (seq_len + len - 1) / len);
    const int64_t base = ((int64_t)s * num_q_heads + h) * num_splits;
    const float2* ml = reinterpret_cast<const float2*>(part_ml) + base;  // part_ml is [.., 2] f32: 8-byte rows
    const float* po = part_out + base * D + d;
    // The first batch (every split at num_splits <= RED_BATCH): (m, l) and part_out issued together.
    float2 mlv[RED_BATCH];
    float pov[RED_BATCH];
#pragma unroll
    for (int i = 0; i < RED_BATCH; ++i) {
        mlv[i] = i < n_used ? ml[i] : make_float2(-CUDART_INF_F, 0.0f);
        pov[i] = i < n_used ? po[(int64_t)i * D] : 0.0f;
    }
    float m_max = -CUDART_INF_F;
#pragma unroll
    for (int i = 0; i < RED_BATCH; ++i) m_max = fmaxf(m_max, mlv[i].x);
    for (int x = RED_BATCH; x < n_used; ++x) m_max = fmaxf(m_max, ml[x].x);  // more splits than one batch
    float l_sum = 0.0f, o_sum = 0.0f;
    if (m_max != -CUDART_INF_F) {
#pragma unroll
        for (int i = 0; i < RED_BATCH; ++i) {
            if (i < n_used) {
                const float w = exp2f((mlv[i].x - m_max) * LOG2E);  // -inf -> 0
                l_sum = fmaf(w, mlv[i].y, l_sum);
                o_sum = fmaf(w, pov[i], o_sum);
            }
        }
#pragma unroll 8
        for (int x = RED_BATCH; x < n_used; ++x) {
            const float2 v = ml[x];
            const float w = exp2f((v.x - m_max) * LOG2E);
            l_sum = fmaf(w, v.y, l_sum);
            o_sum = fmaf(w, po[(int64_t)x * D], o_sum);
        }
    }
    out[((int64_t)s * num_q_heads + h) * D + d] = f2bf(l_sum > 0.0f ? o_sum / l_sum : 0.0f);
}
#undef RED_BATCH

// ---------------------------------------------------------------------------------------------------
// Prefill (constants, mma / ldmatrix wrappers and the m-tile softmax: prefill.cuh)
// ---------------------------------------------------------------------------------------------------
struct PrefillSmem {
    __nv_bfloat16 k[PF_BN][PF_LD];
    __nv_bfloat16 v[PF_BN][PF_LD];
    int64_t off[2][PF_BN];  // per tile token: element offset of its K row (kv head 0), or -1 if absent
};

// Copy part (0 = K, 1 = V) of the tile whose token element offsets are in offs[] (-1: absent) into dst.
// Thread (r0 = tid / 16, c = tid % 16) copies the 16-byte chunk c of tokens r0 + 8 i; with vec,
// asynchronously (cp.async, zero fill for absent tokens), else by element loads and plain stores. Chunks
// in [C, CP) (head dims past D, up to the compiled width) are zero filled.
KERN_DEV void prefill_copy(__nv_bfloat16 (*dst)[PF_LD], const int64_t* offs, const __nv_bfloat16* part_base,
                           int C, int CP, bool vec, int tid) {
    const int c = tid & 15, r0 = tid >> 4;
    if (c >= CP) return;
    const __nv_bfloat16* base = part_base + c * 8;
    if (c >= C) {
#pragma unroll
        for (int i = 0; i < PF_BN / 8; ++i) *reinterpret_cast<uint4*>(&dst[r0 + 8 * i][c * 8]) = make_uint4(0u, 0u, 0u, 0u);
    } else if (vec) {
#pragma unroll
        for (int i = 0; i < PF_BN / 8; ++i) {
            const int r = r0 + 8 * i;
            const int64_t off = offs[r];
            cp_async16(&dst[r][c * 8], off >= 0 ? base + off : part_base, off >= 0 ? 16 : 0);
        }
    } else {
        for (int i = 0; i < PF_BN / 8; ++i) {
            const int r = r0 + 8 * i;
            const int64_t off = offs[r];
            float f[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) f[e] = off >= 0 ? bf2f(base[off + e]) : 0.0f;
            store8_vec(&dst[r][c * 8], f);
        }
    }
}

// Warp w: q head g0 + (w % hpb), query rows row0 + (w / hpb) * 16 + [0, 16): one mma M tile. Fragment
// layouts are those of PTX mma.m16n8k16 (.bf16): lane = 4*gid + tig; A regs (row gid | gid+8, cols
// 2tig.. | 2tig+8..); B regs (k rows 2tig.. | 2tig+8.., col gid); C regs (row gid: c0,c1 | row gid+8:
// c2,c3; cols 2tig, 2tig+1). NK * 16 >= D is the compiled head width: dims past D are zero in Q and in
// the K/V tiles, so the math is exact for any D up to it; only the output columns < D are written.
template <int NK>
KERN_DEV void prefill_body(PrefillSmem& sm, const __nv_bfloat16* q, const __nv_bfloat16* kv_cache,
                           const int32_t* bt_row, __nv_bfloat16* out, int num_q_heads, int num_kv_heads, int D,
                           int page_tokens, int bt_stride, int num_pages, float scale, int kvh, int q_start,
                           int q_len, int ctx0, int row0, int kv_end, int hpb, int slabs, int G) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int nk = D / 16;  // k-steps of Q.K^T holding data (Q is zero past them)
    const int C = D / 8;
    const bool vec = aligned16(kv_cache);
    const int64_t token_elems = (int64_t)num_kv_heads * D;
    const int64_t head_off = (int64_t)kvh * D;
    const float sl2 = scale * LOG2E;
    const uint32_t page_limit = (uint32_t)max(num_pages, 0);  // page ids in [0, num_pages) are present

    const int slab = warp / hpb;
    const int wr0 = row0 + slab * 16;                 // this warp's first query row (within the sequence)
    const bool rows_ok = slab < slabs && wr0 < q_len;  // warp-uniform
    const int row_a = wr0 + gid, row_b = wr0 + gid + 8;
    const bool valid_a = row_a < q_len, valid_b = row_b < q_len;
    const int pos_a = ctx0 + row_a, pos_b = ctx0 + row_b;  // absolute positions (may be negative)
    // Tokens this warp needs: [0, w_end); tiles wholly at or below w_first need no causal mask.
    const int w_first = ctx0 + wr0;
    const int w_end = rows_ok ? max(0, min(kv_end, ctx0 + min(wr0 + 16, q_len))) : 0;

    // Offset table of the tile at kv0 (thread t < 64 handles token kv0 + t); the block-table read is issued
    // by token_page and consumed by token_off, so its latency can hide behind other work. A token past
    // kv_end or bt_stride, or whose page id lies outside [0, num_pages), gets -1: K/V of zeros.
    auto token_page = [&](int kv0, int& pi) -> int {
        const int tok = kv0 + tid;
        pi = tok / page_tokens;
        return (tid < PF_BN && tok < kv_end && pi < bt_stride) ? bt_row[pi] : -1;
    };
    auto token_off = [&](int kv0, int pi, int page) -> int64_t {
        return (uint32_t)page < page_limit
                   ? ((int64_t)page * 2 * page_tokens + (kv0 + tid - pi * page_tokens)) * token_elems
                   : -1;
    };
    const __nv_bfloat16* k_base = kv_cache + head_off;                                   // K of token row 0
    const __nv_bfloat16* v_base = k_base + (int64_t)page_tokens * token_elems;           // V of token row 0

    for (int g0 = 0; g0 < G; g0 += hpb) {
        const int g = g0 + warp % hpb;
        const bool active = rows_ok && g < G;  // warp-uniform
        const int hq = kvh * G + g;

        uint32_t qa[NK][4];
#pragma unroll
        for (int kk = 0; kk < NK; ++kk) {
            qa[kk][0] = qa[kk][1] = qa[kk][2] = qa[kk][3] = 0u;
            if (active && kk < nk) {
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
        float o[2 * NK][4];
#pragma unroll
        for (int dt = 0; dt < 2 * NK; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
        float m_a = -CUDART_INF_F, m_b = -CUDART_INF_F, l_a = 0.0f, l_b = 0.0f;  // m in scaled log2 units

        __syncthreads();  // a previous pass is done with the tiles and row tables
        {
            int pi;
            const int page = token_page(0, pi);
            if (tid < PF_BN) sm.off[0][tid] = token_off(0, pi, page);
        }
        __syncthreads();
        if (kv_end > 0) prefill_copy(sm.k, sm.off[0], k_base, C, 2 * NK, vec, tid);
        cp_async_commit();

        int buf = 0;
        for (int kv0 = 0; kv0 < kv_end; kv0 += PF_BN, buf ^= 1) {
            cp_async_wait_all();
            __syncthreads();  // K tile visible to all; every warp is done with the previous V tile
            prefill_copy(sm.v, sm.off[buf], v_base, C, 2 * NK, vec, tid);
            cp_async_commit();
            int next_pi;
            const int next_page = token_page(kv0 + PF_BN, next_pi);  // block-table read overlaps the math below
            const bool compute = active && kv0 < w_end;    // warp-uniform

            uint32_t pa[PF_BN / 16][4];  // P as bf16 A fragments
            if (compute) {
                // S = Q K^T for this warp's 16 rows x 64 tokens.
                float sacc[PF_BN / 8][4];
#pragma unroll
                for (int nt = 0; nt < PF_BN / 8; ++nt) sacc[nt][0] = sacc[nt][1] = sacc[nt][2] = sacc[nt][3] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < NK; ++kk) {
                    {
#pragma unroll
                        for (int np = 0; np < PF_BN / 16; ++np) {
                            // matrices: (tokens np*16+[0,8), dims kk*16+[0,8)), (same tokens, +8 dims),
                            // (tokens np*16+8+[0,8), dims kk*16+[0,8)), (same, +8 dims)
                            const int mi = lane >> 3;
                            const __nv_bfloat16* p = &sm.k[np * 16 + (mi >> 1) * 8 + (lane & 7)][kk * 16 + (mi & 1) * 8];
                            uint32_t b0, b1, b2, b3;
                            ldsm_x4(b0, b1, b2, b3, p);
                            mma_bf16_16816(sacc[2 * np], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b0, b1);
                            mma_bf16_16816(sacc[2 * np + 1], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b2, b3);
                        }
                    }
                }
                // Causal mask, only on tiles that reach past the warp's first query position.
                if (kv0 + PF_BN - 1 > w_first) {
                    pf_causal_mask(sacc, kv0, tig, pos_a, pos_b);
                }
                pf_softmax_tile<NK>(sacc, m_a, m_b, l_a, l_b, sl2, o, pa);
            }
            if (tid < PF_BN) sm.off[buf ^ 1][tid] = token_off(kv0 + PF_BN, next_pi, next_page);
            cp_async_wait_all();
            __syncthreads();  // V tile and the next row table visible; every warp is done with the K tile
            if (kv0 + PF_BN < kv_end)
                prefill_copy(sm.k, sm.off[buf ^ 1], k_base, C, 2 * NK, vec, tid);
            cp_async_commit();
            if (compute) {
                // O += P V: V fragments with ldmatrix.trans (matrices: tokens kk*16+[0,8) | +8, dims
                // dp*16+[0,8) | +8).
#pragma unroll
                for (int kk = 0; kk < PF_BN / 16; ++kk) {
#pragma unroll
                    for (int dp = 0; dp < NK; ++dp) {
                        {
                            const int mi = lane >> 3;
                            const __nv_bfloat16* p = &sm.v[kk * 16 + (mi & 1) * 8 + (lane & 7)][dp * 16 + (mi >> 1) * 8];
                            uint32_t b0, b1, b2, b3;
                            ldsm_x4_trans(b0, b1, b2, b3, p);
                            mma_bf16_16816(o[2 * dp], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], b0, b1);
                            mma_bf16_16816(o[2 * dp + 1], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], b2, b3);
                        }
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
            for (int dt = 0; dt < 2 * NK; ++dt) {
                if (dt < 2 * nk) {
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

// grid (>= cdiv(max_q_tokens, 16), num_kv_heads, seqs), block (128,1,1). A block covers 16 * slabs query
// rows of one sequence for hpb q heads at a time (hpb * slabs = 4 warps): groups of 1, 2, 4 take one pass
// (64, 32, 16 rows), other groups passes of 4 heads over 16 rows. Blocks are taken in reverse order of
// blockIdx.x so the longest (last rows, most context) start first; blocks past the sequence's rows exit.
extern "C" __global__ void __launch_bounds__(PF_THREADS, 3) kern_attn_prefill(
    const __nv_bfloat16* q,         // [total_q_tokens, Hq, D]
    const __nv_bfloat16* kv_cache,  // paged
    const int32_t* block_table,     // [seqs, bt_stride]
    const int32_t* cu_seqlens_q,    // [seqs + 1]
    const int32_t* seq_lens,        // [seqs]
    __nv_bfloat16* out,             // [total_q_tokens, Hq * D]
    int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t page_tokens, int32_t bt_stride,
    int32_t num_pages,              // page ids outside [0, num_pages) read K/V as zeros
    float scale) {
    __shared__ __align__(16) PrefillSmem sm;
    kern_pdl_wait();
    kern_pdl_launch_dependents();
    const int kvh = blockIdx.y;
    const int D = head_dim;
    if (num_kv_heads <= 0 || kvh >= num_kv_heads || num_q_heads % num_kv_heads != 0 || D <= 0 || D > PF_MAX_D ||
        D % 16 != 0 || page_tokens <= 0 || !(scale > 0.0f))
        return;
    PfBlock b;
    if (!pf_block(cu_seqlens_q, seq_lens, block_table, bt_stride, num_q_heads, num_kv_heads, PF_WARPS, 16, b))
        return;
    // One compiled width (128) for every D: narrower heads run on zero-padded dims (Qwen3 uses D = 128;
    // a second instantiation for D <= 64 pushed the shared register allocation into spills).
    prefill_body<PF_MAX_D / 16>(sm, q, kv_cache, b.bt_row, out, num_q_heads, num_kv_heads, D, page_tokens,
                                bt_stride, num_pages, scale, kvh, b.q_start, b.q_len, b.ctx0, b.row0, b.kv_end, b.hpb,
                                b.slabs, b.G);
}

// ---------------------------------------------------------------------------------------------------
// Prefill with two m-tiles per warp: kern_attn_prefill_r32 (the default since the ninth session)
// ---------------------------------------------------------------------------------------------------
// The contract of kern_attn_prefill (same parameters, same 64-token K/V tiles walked from position 0 in the
// same order, the same per-row arithmetic: every output row is bit for bit kern_attn_prefill's), but each warp
// owns 32 query rows (two mma M tiles) of one q head, so every K/V fragment read from shared memory feeds two
// independent mma chains and each warp has twice the independent work in flight (kern_attn_prefill is
// latency-bound at 12 warps per SM; docs/perf.md "Prefill"). The O accumulators (2 x 64 floats per thread)
// leave no room for Q in registers: Q rows are staged in shared memory once per pass and read with ldmatrix
// per k-step. K and V are double-buffered: tile t + 1 (K and V) loads during all of tile t's math, one
// barrier per tile. Block: 4 warps; rows per block 32 * slabs (G = 4: 32 rows x 4 heads; G = 2: 64 x 2;
// G = 1: 128 x 1; other G: passes of 4 heads over 32 rows). Dynamic shared memory: sizeof(PrefillSmemR32) =
// 105,472 bytes, two blocks per SM (a launch with less returns after the PDL wait without writing). 255
// registers and 48 bytes of stack: loop-invariant pass state that ptxas spills and reloads once per tile.
// grid.x >= cdiv(max q rows, 32 * slabs); blocks past a sequence's rows exit.
#define PF_R32_ROWS 32  // query rows per warp

struct PrefillSmemR32 {
    __nv_bfloat16 q[PF_WARPS * PF_R32_ROWS][PF_LD];  // each warp's 32 Q rows of its current head
    __nv_bfloat16 k[2][PF_BN][PF_LD];                 // K and V of tiles t (buffer t % 2) and t + 1
    __nv_bfloat16 v[2][PF_BN][PF_LD];
    int64_t off[2][PF_BN];  // per tile token: element offset of its K row from kv_cache, or -1 if absent
};

// Warp w: q head g0 + (w % hpb), query rows row0 + (w / hpb) * 32 + [0, 32) as m-tiles mt = 0, 1 (rows
// + 16 mt + [0, 16)). Fragment layouts as in prefill_body; Q A fragments come from sm.q by ldmatrix
// (matrices: rows +[0,8) | +[8,16) x dims +[0,8) | +[8,16), giving regs a0..a3 of mma.m16n8k16).
template <int NK>
KERN_DEV void prefill_body_r32(PrefillSmemR32& sm, const __nv_bfloat16* q, const __nv_bfloat16* kv_cache,
                               const int32_t* bt_row, __nv_bfloat16* out, int num_q_heads, int num_kv_heads, int D,
                               int page_tokens, int bt_stride, int num_pages, float scale, int kvh, int q_start,
                               int q_len, int ctx0, int row0, int kv_end, int hpb, int slabs, int G) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3, mi = lane >> 3;
    const int nk = D / 16;
    const int C = D / 8;
    const bool vec = aligned16(kv_cache);
    const bool qvec = aligned16(q);
    const int64_t token_elems = (int64_t)num_kv_heads * D;
    const int64_t head_off = (int64_t)kvh * D;
    const float sl2 = scale * LOG2E;
    const uint32_t page_limit = (uint32_t)max(num_pages, 0);

    const int slab = warp / hpb;
    const int wr0 = row0 + slab * PF_R32_ROWS;
    const bool rows_ok = slab < slabs && wr0 < q_len;  // warp-uniform
    const int w_first = ctx0 + wr0;
    const int w_end = rows_ok ? max(0, min(kv_end, ctx0 + min(wr0 + PF_R32_ROWS, q_len))) : 0;

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
    // off[] holds offsets from kv_cache itself (the kv head included): two fewer 64-bit values live in the loop
    const __nv_bfloat16* k_base = kv_cache;
    const __nv_bfloat16* v_base = kv_cache + (int64_t)page_tokens * token_elems;
    __nv_bfloat16(*qs)[PF_LD] = &sm.q[warp * PF_R32_ROWS];

    for (int g0 = 0; g0 < G; g0 += hpb) {
        const int g = g0 + warp % hpb;
        const bool active = rows_ok && g < G;  // warp-uniform
        const int hq = kvh * G + g;

        float o[2][2 * NK][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int dt = 0; dt < 2 * NK; ++dt) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.0f;
        float m[2][2], l[2][2];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) m[mt][0] = m[mt][1] = -CUDART_INF_F, l[mt][0] = l[mt][1] = 0.0f;

        // S = Q K^T of the tile in `ks` (64 tokens at kv0), causal mask, online softmax into P.
        auto qk_softmax = [&](const __nv_bfloat16 (*ks)[PF_LD], int kv0, uint32_t (&pa)[2][PF_BN / 16][4]) {
            float sacc[2][PF_BN / 8][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int nt = 0; nt < PF_BN / 8; ++nt)
                    sacc[mt][nt][0] = sacc[mt][nt][1] = sacc[mt][nt][2] = sacc[mt][nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < NK; ++kk) {
                uint32_t a[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
                    ldsm_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3],
                            &qs[mt * 16 + (mi & 1) * 8 + (lane & 7)][kk * 16 + (mi >> 1) * 8]);
#pragma unroll
                for (int np = 0; np < PF_BN / 16; ++np) {
                    const __nv_bfloat16* p = &ks[np * 16 + (mi >> 1) * 8 + (lane & 7)][kk * 16 + (mi & 1) * 8];
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4(b0, b1, b2, b3, p);
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt) {
                        mma_bf16_16816(sacc[mt][2 * np], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b0, b1);
                        mma_bf16_16816(sacc[mt][2 * np + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b2, b3);
                    }
                }
            }
            if (kv0 + PF_BN - 1 > w_first) {
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    const int pos_a = w_first + mt * 16 + gid;
                    pf_causal_mask(sacc[mt], kv0, tig, pos_a, pos_a + 8);
                }
            }
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
                pf_softmax_tile<NK>(sacc[mt], m[mt][0], m[mt][1], l[mt][0], l[mt][1], sl2, o[mt], pa[mt]);
        };
        // O += P V of the tile in `vs` (V fragments by ldmatrix.trans: tokens kk*16+[0,8) | +8, dims
        // dp*16+[0,8) | +8).
        auto pv = [&](const __nv_bfloat16 (*vs)[PF_LD], const uint32_t (&pa)[2][PF_BN / 16][4]) {
#pragma unroll
            for (int kk = 0; kk < PF_BN / 16; ++kk) {
#pragma unroll
                for (int dp = 0; dp < NK; ++dp) {
                    const __nv_bfloat16* p = &vs[kk * 16 + (mi & 1) * 8 + (lane & 7)][dp * 16 + (mi >> 1) * 8];
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4_trans(b0, b1, b2, b3, p);
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt) {
                        mma_bf16_16816(o[mt][2 * dp], pa[mt][kk][0], pa[mt][kk][1], pa[mt][kk][2], pa[mt][kk][3], b0,
                                       b1);
                        mma_bf16_16816(o[mt][2 * dp + 1], pa[mt][kk][0], pa[mt][kk][1], pa[mt][kk][2], pa[mt][kk][3],
                                       b2, b3);
                    }
                }
            }
        };

        __syncthreads();  // a previous pass is done with the tiles, the row tables and its Q rows
        // This warp's 32 Q rows into sm.q: lane copies 16-byte chunk (lane % 16) of rows (lane / 16) + 2 i;
        // rows past q_len, dims past D and idle warps get zeros.
        {
            const int c = lane & 15;
#pragma unroll
            for (int i = 0; i < PF_R32_ROWS / 2; ++i) {
                const int r = (lane >> 4) + 2 * i;
                const bool ok = active && wr0 + r < q_len && c < C;
                const __nv_bfloat16* src = q + ((int64_t)(q_start + wr0 + r) * num_q_heads + hq) * D + c * 8;
                if (qvec) {
                    cp_async16(&qs[r][c * 8], ok ? src : q, ok ? 16 : 0);
                } else {
                    float f[8];
#pragma unroll
                    for (int e = 0; e < 8; ++e) f[e] = ok ? bf2f(src[e]) : 0.0f;
                    store8_vec(&qs[r][c * 8], f);
                }
            }
        }
        {
            int pi;
            const int page = token_page(0, pi);
            if (tid < PF_BN) sm.off[0][tid] = token_off(0, pi, page);
        }
        __syncthreads();
        if (kv_end > 0) {
            prefill_copy(sm.k[0], sm.off[0], k_base, C, 2 * NK, vec, tid);
            prefill_copy(sm.v[0], sm.off[0], v_base, C, 2 * NK, vec, tid);
        }
        cp_async_commit();  // the Q rows and tile 0
        {
            int pi;
            const int page = token_page(PF_BN, pi);
            if (tid < PF_BN) sm.off[1][tid] = token_off(PF_BN, pi, page);
        }
        int buf = 0;
        for (int kv0 = 0; kv0 < kv_end; kv0 += PF_BN, buf ^= 1) {
            cp_async_wait_all();
            // tile kv0 and the row table of kv0 + 64 visible; every warp is done with tile kv0 - 64's buffers
            __syncthreads();
            if (kv0 + PF_BN < kv_end) {
                prefill_copy(sm.k[buf ^ 1], sm.off[buf ^ 1], k_base, C, 2 * NK, vec, tid);
                prefill_copy(sm.v[buf ^ 1], sm.off[buf ^ 1], v_base, C, 2 * NK, vec, tid);
            }
            cp_async_commit();
            int next_pi;
            const int next_page = token_page(kv0 + 2 * PF_BN, next_pi);  // block-table read overlaps the math
            if (active && kv0 < w_end) {  // warp-uniform
                uint32_t pa[2][PF_BN / 16][4];
                qk_softmax(sm.k[buf], kv0, pa);
                pv(sm.v[buf], pa);
            }
            // the copies that read off[buf] (tile kv0's) were all issued before this iteration's barrier
            if (tid < PF_BN) sm.off[buf][tid] = token_off(kv0 + 2 * PF_BN, next_pi, next_page);
        }
        // no copy outlives the pass (kv_end == 0 skips the loop with the Q rows still in flight; a next pass
        // stages Q into the same rows)
        cp_async_wait_all();

        if (active) {
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                const int row_a = wr0 + mt * 16 + gid, row_b = row_a + 8;
                const float inv_a = l[mt][0] > 0.0f ? 1.0f / l[mt][0] : 0.0f;
                const float inv_b = l[mt][1] > 0.0f ? 1.0f / l[mt][1] : 0.0f;
                __nv_bfloat16* oa = out + ((int64_t)(q_start + row_a) * num_q_heads + hq) * D;
                __nv_bfloat16* ob = out + ((int64_t)(q_start + row_b) * num_q_heads + hq) * D;
#pragma unroll
                for (int dt = 0; dt < 2 * NK; ++dt) {
                    if (dt < 2 * nk) {
                        const int col = dt * 8 + tig * 2;
                        if (row_a < q_len)
                            *reinterpret_cast<uint32_t*>(oa + col) =
                                pack_bf16x2(o[mt][dt][0] * inv_a, o[mt][dt][1] * inv_a);
                        if (row_b < q_len)
                            *reinterpret_cast<uint32_t*>(ob + col) =
                                pack_bf16x2(o[mt][dt][2] * inv_b, o[mt][dt][3] * inv_b);
                    }
                }
            }
        }
    }
}

// grid (>= cdiv(max_q_tokens, 32), num_kv_heads, seqs), block (128,1,1), dynamic shared memory
// sizeof(PrefillSmemR32) = 105,472 bytes. Parameters as kern_attn_prefill.
extern "C" __global__ void __launch_bounds__(PF_THREADS, 2) kern_attn_prefill_r32(
    const __nv_bfloat16* q,         // [total_q_tokens, Hq, D]
    const __nv_bfloat16* kv_cache,  // paged
    const int32_t* block_table,     // [seqs, bt_stride]
    const int32_t* cu_seqlens_q,    // [seqs + 1]
    const int32_t* seq_lens,        // [seqs]
    __nv_bfloat16* out,             // [total_q_tokens, Hq * D]
    int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t page_tokens, int32_t bt_stride,
    int32_t num_pages,              // page ids outside [0, num_pages) read K/V as zeros
    float scale) {
    extern __shared__ __align__(16) unsigned char pf_r32_smem[];
    kern_pdl_wait();
    kern_pdl_launch_dependents();
    if (dynamic_smem_bytes() < sizeof(PrefillSmemR32)) return;
    PrefillSmemR32& sm = *reinterpret_cast<PrefillSmemR32*>(pf_r32_smem);
    const int kvh = blockIdx.y;
    const int D = head_dim;
    if (num_kv_heads <= 0 || kvh >= num_kv_heads || num_q_heads % num_kv_heads != 0 || D <= 0 || D > PF_MAX_D ||
        D % 16 != 0 || page_tokens <= 0 || !(scale > 0.0f))
        return;
    PfBlock b;
    if (!pf_block(cu_seqlens_q, seq_lens, block_table, bt_stride, num_q_heads, num_kv_heads, PF_WARPS, PF_R32_ROWS,
                  b))
        return;
    prefill_body_r32<PF_MAX_D / 16>(sm, q, kv_cache, b.bt_row, out, num_q_heads, num_kv_heads, D, page_tokens,
                                    bt_stride, num_pages, scale, kvh, b.q_start, b.q_len, b.ctx0, b.row0, b.kv_end,
                                    b.hpb, b.slabs, b.G);
}
