// Pieces shared by the prefill attention entries (kern_attn_prefill and _r32 in attention.cu, the wgmma entry
// in attention_wg.cu): the tile constants, the mma.sync / ldmatrix wrappers, and the online softmax of one
// 16-row m-tile, so every entry computes P and the running (max, sum) of a row with the same operations in
// the same order. Header only.
#pragma once
#include <math_constants.h>

#include "common.cuh"

#ifndef LOG2E
#define LOG2E 1.4426950408889634f
#endif
#ifndef FULL_MASK
#define FULL_MASK 0xffffffffu
#endif

#define PF_THREADS 128
#define PF_WARPS (PF_THREADS / 32)
#define PF_BN 64              // context tokens per K/V tile
#define PF_MAX_D 128          // head_dim must be a multiple of 16 and at most this
#define PF_LD (PF_MAX_D + 8)  // shared row stride in bf16 (272 bytes: conflict-free ldmatrix rows)

// The query rows and context one block of a prefill entry covers. The block's `warps` warps (4; the wg entry's 8
// consumer warps) take hpb q heads of the GQA group G per pass (G when G divides 4, else 4: several passes) and
// warps / hpb slabs of `slab_rows` query rows each; blocks are taken heaviest first (the last rows of a sequence
// attend to the most keys). tools/gen_qwen3.py prefill_rows_per_block sizes grid.x from the same rule.
struct PfBlock {
    int G, hpb, slabs;
    int q_start, q_len;  // the sequence's query rows in q / out
    int row0;            // the block's first query row within the sequence
    int ctx0;            // absolute position of the sequence's query row 0 (may be negative)
    int kv_end;          // keys [0, kv_end) are attended by some row of the block
    const int32_t* bt_row;
};

// Fills `b` for block (blockIdx.x, kv head, sequence blockIdx.z); false when the block has no rows of its
// sequence (uniform over the block: it returns). num_q_heads a positive multiple of num_kv_heads (checked by
// the caller).
KERN_DEV bool pf_block(const int32_t* cu_seqlens_q, const int32_t* seq_lens, const int32_t* block_table,
                       int bt_stride, int num_q_heads, int num_kv_heads, int warps, int slab_rows, PfBlock& b) {
    const int s = blockIdx.z;
    b.G = num_q_heads / num_kv_heads;
    b.hpb = (b.G <= 4 && 4 % b.G == 0) ? b.G : 4;
    b.slabs = warps / b.hpb;
    const int qt = gridDim.x - 1 - blockIdx.x;
    b.q_start = cu_seqlens_q[s];
    b.q_len = cu_seqlens_q[s + 1] - b.q_start;
    b.row0 = qt * slab_rows * b.slabs;
    if (b.row0 >= b.q_len) return false;
    const int rows_here = min(slab_rows * b.slabs, b.q_len - b.row0);
    const int seq_len = max(seq_lens[s], 0);  // a negative length reads as 0: every row writes zeros
    b.ctx0 = seq_len - b.q_len;
    b.kv_end = max(0, min(seq_len, b.ctx0 + b.row0 + rows_here));
    b.bt_row = block_table + (int64_t)s * bt_stride;
    return true;
}

KERN_DEV void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

KERN_DEV void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const void* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(a)
                 : "memory");
}

KERN_DEV void ldsm_x4_trans(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const void* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(a)
                 : "memory");
}

KERN_DEV uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low 16 bits
    return *reinterpret_cast<const uint32_t*>(&v);
}

// 2^x with results below 2^-126 flushed to +0 (ex2.approx.ftz.f32: one MUFU.EX2; exp2f without fast math adds a
// range check and two multiplies per call to produce denormal results). Such a probability is below 2^-126 where
// the row's largest is 1: dropping it leaves the row sum as it was and changes an output element only when every
// other term of that element is as small. Every prefill entry uses this one function, so they stay bit for bit
// alike.
KERN_DEV float pf_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Online softmax of one m-tile's 16 x 64 scores (s, in raw q.k units): s becomes the unnormalised
// probabilities, the running max / sum of its two rows (a = gid, b = gid + 8) advance, and alpha_a / alpha_b
// are the factors the rows' O accumulators must be multiplied by before P V of this tile is added
// (pf_rescale). The operations of prefill_body in the same order, so the rows come out identical.
KERN_DEV void pf_softmax_stats(float (&s)[PF_BN / 8][4], float& m_a, float& m_b, float& l_a, float& l_b, float sl2,
                               float& alpha_a, float& alpha_b) {
    float mx_a = -CUDART_INF_F, mx_b = -CUDART_INF_F;
#pragma unroll
    for (int nt = 0; nt < PF_BN / 8; ++nt) {
        mx_a = fmaxf(mx_a, fmaxf(s[nt][0], s[nt][1]));
        mx_b = fmaxf(mx_b, fmaxf(s[nt][2], s[nt][3]));
    }
    mx_a = fmaxf(mx_a, __shfl_xor_sync(FULL_MASK, mx_a, 1));
    mx_a = fmaxf(mx_a, __shfl_xor_sync(FULL_MASK, mx_a, 2));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(FULL_MASK, mx_b, 1));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(FULL_MASK, mx_b, 2));
    const float mn_a = fmaxf(m_a, mx_a * sl2), mn_b = fmaxf(m_b, mx_b * sl2);
    const float base_a = (mn_a == -CUDART_INF_F) ? 0.0f : mn_a;
    const float base_b = (mn_b == -CUDART_INF_F) ? 0.0f : mn_b;
    alpha_a = pf_ex2(m_a - base_a);
    alpha_b = pf_ex2(m_b - base_b);
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int nt = 0; nt < PF_BN / 8; ++nt) {
        s[nt][0] = pf_ex2(fmaf(s[nt][0], sl2, -base_a));
        s[nt][1] = pf_ex2(fmaf(s[nt][1], sl2, -base_a));
        s[nt][2] = pf_ex2(fmaf(s[nt][2], sl2, -base_b));
        s[nt][3] = pf_ex2(fmaf(s[nt][3], sl2, -base_b));
        sum_a += s[nt][0] + s[nt][1];
        sum_b += s[nt][2] + s[nt][3];
    }
    sum_a += __shfl_xor_sync(FULL_MASK, sum_a, 1);
    sum_a += __shfl_xor_sync(FULL_MASK, sum_a, 2);
    sum_b += __shfl_xor_sync(FULL_MASK, sum_b, 1);
    sum_b += __shfl_xor_sync(FULL_MASK, sum_b, 2);
    l_a = l_a * alpha_a + sum_a;
    l_b = l_b * alpha_b + sum_b;
    m_a = mn_a;
    m_b = mn_b;
}

// Causal mask of one m-tile's 16 x 64 scores of the tile starting at key kv0: a key past its row's absolute
// position (pos_a for row gid, pos_b for row gid + 8) scores -inf. Callers skip tiles wholly at or before the
// warp's first position.
KERN_DEV void pf_causal_mask(float (&s)[PF_BN / 8][4], int kv0, int tig, int pos_a, int pos_b) {
#pragma unroll
    for (int nt = 0; nt < PF_BN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int key = kv0 + nt * 8 + tig * 2 + (e & 1);
            if (key > ((e < 2) ? pos_a : pos_b)) s[nt][e] = -CUDART_INF_F;
        }
    }
}

// The probabilities of pf_softmax_stats as bf16 A fragments of O += P V (P's 16 x 64 tile: 4 k-steps of 16).
KERN_DEV void pf_pack_p(const float (&s)[PF_BN / 8][4], uint32_t (&pa)[PF_BN / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < PF_BN / 16; ++kk) {
        pa[kk][0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
        pa[kk][1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
        pa[kk][2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[kk][3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
}

// O accumulators of one m-tile (rows gid: [0], [1]; gid + 8: [2], [3]) times the rows' alpha.
template <int N8>
KERN_DEV void pf_rescale(float (&o)[N8][4], float alpha_a, float alpha_b) {
#pragma unroll
    for (int dt = 0; dt < N8; ++dt) {
        o[dt][0] *= alpha_a;
        o[dt][1] *= alpha_a;
        o[dt][2] *= alpha_b;
        o[dt][3] *= alpha_b;
    }
}

// The whole online-softmax step of one m-tile: stats, the rescale of its O accumulators, P.
template <int NK>
KERN_DEV void pf_softmax_tile(float (&s)[PF_BN / 8][4], float& m_a, float& m_b, float& l_a, float& l_b, float sl2,
                              float (&o)[2 * NK][4], uint32_t (&pa)[PF_BN / 16][4]) {
    float alpha_a, alpha_b;
    pf_softmax_stats(s, m_a, m_b, l_a, l_b, sl2, alpha_a, alpha_b);
    pf_rescale(o, alpha_a, alpha_b);
    pf_pack_p(s, pa);
}
