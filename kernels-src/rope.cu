// RoPE tables (plain and llama3) and the fused q/k head RMSNorm (optional) + neox RoPE + paged K/V write.
#include "common.cuh"

// One row of a rope table: rope[p, :] = [cos(p*f_i), i < D/2] ++ [sin(p*f_i), i < D/2] for this thread's i, the
// angle in fp32 (as transformers computes it), each value rounded to bf16 precision (transformers casts cos/sin to
// the model dtype). `inv_freq(i)` gives f_i.
template <typename InvFreq>
KERN_DEV void rope_row(float* rope, int32_t max_pos, int32_t head_dim, InvFreq inv_freq) {
    const int p = blockIdx.x;
    const int half = head_dim / 2;
    if (p >= max_pos) return;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float angle = (float)p * inv_freq(i);
        float* row = rope + (int64_t)p * head_dim;
        row[i] = round_bf(cosf(angle));
        row[half + i] = round_bf(sinf(angle));
    }
}

// f_i = 1/theta^(2i/D) in fp32; transformers: inv_freq = 1.0 / (base ** (arange(0, dim, 2).float() / dim))
KERN_DEV float default_inv_freq(int i, int32_t head_dim, float theta) {
    const float expo = (float)(2 * i) / (float)head_dim;
    return 1.0f / powf(theta, expo);
}

// kern_rope_table: the plain RoPE table, f_i = default_inv_freq. grid (max_pos,1,1), block (head_dim/2,1,1).
extern "C" __global__ void kern_rope_table(float* rope,  // [max_pos, head_dim]
                                           int32_t max_pos, int32_t head_dim, float theta) {
    rope_row(rope, max_pos, head_dim, [=](int i) { return default_inv_freq(i, head_dim, theta); });
}

// The llama3 frequency remap of one default f (transformers' _compute_llama3_parameters, modeling_rope_utils.py), in
// fp32 with each operation rounded once (no contraction) and in transformers' order: wavelen = 2 pi / f (torch's
// scalar / tensor is reciprocal(f) * 2 pi); wavelen > orig / low_freq_factor: f / factor; else wavelen < orig /
// high_freq_factor: f kept; between: s = (orig / wavelen - low) / (high - low) (again reciprocal * orig), then
// (1 - s) * f / factor + s * f. The band edges orig / low and orig / high are divided in fp32 (exact for the
// published values, 8192 / 1 and 8192 / 4).
KERN_DEV float llama3_inv_freq(float f, float factor, float low_freq_factor, float high_freq_factor, float orig) {
    const float two_pi = 6.283185307179586f;
    const float wavelen = __fmul_rn(__frcp_rn(f), two_pi);
    if (wavelen > __fdiv_rn(orig, low_freq_factor)) return __fdiv_rn(f, factor);
    if (wavelen < __fdiv_rn(orig, high_freq_factor)) return f;
    const float s = __fdiv_rn(__fsub_rn(__fmul_rn(__frcp_rn(wavelen), orig), low_freq_factor),
                              __fsub_rn(high_freq_factor, low_freq_factor));
    return __fadd_rn(__fdiv_rn(__fmul_rn(__fsub_rn(1.0f, s), f), factor), __fmul_rn(s, f));
}

// kern_rope_table_llama3: the RoPE table of rope_type "llama3" (Llama 3.1 / 3.2): f_i = llama3_inv_freq of
// default_inv_freq; `orig` is original_max_position_embeddings (a float: transformers divides it as one). Its
// attention factor is 1 (cos / sin unscaled). grid (max_pos,1,1), block (head_dim/2,1,1).
extern "C" __global__ void kern_rope_table_llama3(float* rope,  // [max_pos, head_dim]
                                                  int32_t max_pos, int32_t head_dim, float theta, float factor,
                                                  float low_freq_factor, float high_freq_factor, float orig) {
    rope_row(rope, max_pos, head_dim, [=](int i) {
        return llama3_inv_freq(default_inv_freq(i, head_dim, theta), factor, low_freq_factor, high_freq_factor, orig);
    });
}

// kern_qk_norm_rope_kv: grid (n_tokens, num_q_heads + num_kv_heads, 1), block (head_dim,1,1).
// Thread d owns element d of one head. Rounding follows transformers (Qwen3 attention, bf16 model):
//   n = bf16(w * bf16(x * rsqrt(mean(x^2) + eps)))                         (Qwen3RMSNorm)
//   y = bf16(bf16(n * cos) + bf16(rotate_half(n) * sin))                   (apply_rotary_pos_emb)
// with cos/sin the bf16-valued table entries for positions[t]; sum of squares: x * x (no FMA contraction) per
// 32-element warp by a shuffle tree, then the warps in order. A null q_norm_w (k_norm_w) leaves the q (k) heads
// unnormalized, n = x (Llama: no q/k norm; its apply_rotary_pos_emb rounds as above).
// V is copied unchanged. K / V go to slot_mapping[t] when it lies in [0, num_pages * page_tokens), num_pages
// the page count of the cache's reserved range (a manifest's {"pages_of": state}).
// PDL: launch_dependents first (the early trigger, docs/kernels.md), then positions, slot_mapping, the norm
// weights and the rope table are read before griddepcontrol.wait and qkv after it: may be launched with PDL
// after a kernel that writes none of those four.
extern "C" __global__ void __launch_bounds__(1024) kern_qk_norm_rope_kv(
    const __nv_bfloat16* qkv,       // [n_tokens, (Hq + 2*Hkv) * D]
    const __nv_bfloat16* q_norm_w,  // [D]
    const __nv_bfloat16* k_norm_w,  // [D]
    const float* rope,              // [max_pos, D]
    const int32_t* positions,       // [n_tokens]
    const int32_t* slot_mapping,    // [n_tokens]
    __nv_bfloat16* q_out,           // [n_tokens, Hq, D]
    __nv_bfloat16* kv_cache,        // pages of [2][page_tokens][Hkv][D]
    int32_t n_tokens, int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t page_tokens,
    int32_t max_pos, int32_t num_pages, float eps) {
    __shared__ float scratch[32];
    __shared__ float normed[1024];  // the head after RMSNorm (bf16-valued), for rotate_half
    const int t = blockIdx.x;
    const int h = blockIdx.y;
    const int D = head_dim;
    const int d = threadIdx.x;
    // Before the wait: what the previous kernel (the qkv projection) does not write - the position, the slot, this
    // element's norm weight and rope entries. Every path waits before returning, so this grid never completes
    // before its predecessor (PDL ordering stays transitive for the kernels after it).
    // Uniform checks (the whole block takes the same branch before any barrier).
    // The dependents may launch at once (docs/kernels.md "Early trigger"): what the decode partial after this
    // reads before its own wait is written by no kernel that can still be running.
    kern_pdl_launch_dependents();
    bool ok = t < n_tokens && h < num_q_heads + num_kv_heads && D > 0 && D <= 1024 && !(D & 1) && page_tokens > 0;
    const int32_t pos = ok ? positions[t] : -1;
    ok = ok && pos >= 0 && pos < max_pos;
    const bool is_q = h < num_q_heads;
    const int j = h - num_q_heads;  // kv head when !is_q
    int64_t slot = 0;
    if (ok && !is_q) {
        slot = slot_mapping[t];
        ok = slot >= 0 && slot < (int64_t)max(num_pages, 0) * page_tokens;
    }
    const bool active = ok && d < D;
    const int half = D / 2;
    const int f = d < half ? d : d - half;
    const float* rope_row = rope + (int64_t)(ok ? pos : 0) * D;
    const __nv_bfloat16* norm_w = is_q ? q_norm_w : k_norm_w;  // block-uniform; null: no norm
    const float wv = active && norm_w != nullptr ? bf2f(norm_w[d]) : 0.0f;
    const float c = active ? rope_row[f] : 0.0f;
    const float sn = active ? rope_row[half + f] : 0.0f;
    kern_pdl_wait();  // the qkv row is the previous kernel's output; nothing is written before this
    if (!ok) return;
    const int row_elems = (num_q_heads + 2 * num_kv_heads) * D;
    const __nv_bfloat16* row = qkv + (int64_t)t * row_elems;
    const __nv_bfloat16* x_ptr = is_q ? row + (int64_t)h * D : row + (int64_t)(num_q_heads + j) * D;

    const float x = active ? bf2f(x_ptr[d]) : 0.0f;
    float n = x;
    if (norm_w != nullptr) {  // block-uniform: every thread reaches block_sum's barriers or none does
        const float total = block_sum(__fmul_rn(x, x), scratch);
        const float rs = rsqrtf(total / (float)D + eps);
        n = active ? round_bf(wv * round_bf(x * rs)) : 0.0f;
    }
    if (active) normed[d] = n;
    __syncthreads();
    if (!active) return;  // no barrier follows
    const float rot = d < half ? -normed[d + half] : normed[d - half];
    const __nv_bfloat16 y = f2bf(round_bf(n * c) + round_bf(rot * sn));

    if (is_q) {
        q_out[((int64_t)t * num_q_heads + h) * D + d] = y;
    } else {
        const int64_t page = slot / page_tokens;
        const int64_t off = slot % page_tokens;
        const int64_t token_elems = (int64_t)num_kv_heads * D;
        __nv_bfloat16* k_dst = kv_cache + ((page * 2 + 0) * page_tokens + off) * token_elems + (int64_t)j * D;
        __nv_bfloat16* v_dst = kv_cache + ((page * 2 + 1) * page_tokens + off) * token_elems + (int64_t)j * D;
        k_dst[d] = y;
        v_dst[d] = row[(int64_t)(num_q_heads + num_kv_heads + j) * D + d];
    }
}

// kern_qk_norm_rope_kv_warp: kern_qk_norm_rope_kv for chunks of many tokens, one block per 8 warps' worth of heads
// of a token, D / 8 lanes per head (head_dim 128: two heads per warp; 64: four; 192, 256: one). grid (n_tokens,
// cdiv(Hq + Hkv, 8 * max(1, 256 / head_dim)), 1) (a larger y is allowed: extra heads exit), block (256,1,1). head_dim
// a multiple of 64 and at most 256 (any other launch writes nothing, after its wait). Results bit for bit
// kern_qk_norm_rope_kv's. The lanes of a head hold, for slot p < hg = head_dim / 64 and j < 8, the elements
// 32 p + j + 8 k and 32 (p + hg) + j + 8 k (k < 4) of groups p and p + hg (the block version's warps p and p + hg:
// rotate_half partners, so the rotation stays in the lane). A group's sum of squares is the block version's
// shfl_down tree exactly: its levels 16 and 8 are the lane's own (s_j + s_j+16) + (s_j+8 + s_j+24), levels 4, 2
// and 1 an xor butterfly over the group's 8 lanes (a + b == b + a, so every lane ends with the tree's value); the
// group sums are then added in order from 0.0f; a null q_norm_w / k_norm_w skips that head kind's norm as in the
// block entry (no shuffles at all when both are null). 3 + 2 hg shuffles per lane where one warp per head needed 6 per
// group (24 at head_dim 128, H200 4B: docs/perf.md "Prefill, eleventh session"). PDL: positions / slot_mapping /
// norm weights / rope read before the wait, qkv after it, no early trigger (no griddepcontrol.launch_dependents: the
// dependents launch as this grid completes, measured no different, docs/perf.md "Prefill, ninth session").
#define ROPE_WARP_MAX_GROUPS 8  // head_dim <= 256
#define ROPE_WARP_MAX_HG (ROPE_WARP_MAX_GROUPS / 2)
#define FULL_MASK_ROPE 0xffffffffu

extern "C" __global__ void __launch_bounds__(256) kern_qk_norm_rope_kv_warp(
    const __nv_bfloat16* qkv, const __nv_bfloat16* q_norm_w, const __nv_bfloat16* k_norm_w, const float* rope,
    const int32_t* positions, const int32_t* slot_mapping, __nv_bfloat16* q_out, __nv_bfloat16* kv_cache,
    int32_t n_tokens, int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t page_tokens,
    int32_t max_pos, int32_t num_pages, float eps) {
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x;
    const int D = head_dim;
    const int groups = D / 32, hg = groups / 2;
    // block-uniform
    bool ok = t < n_tokens && D > 0 && D % 64 == 0 && groups <= ROPE_WARP_MAX_GROUPS && page_tokens > 0;
    const int lanes_per_head = max(D / 8, 8);  // 8 lanes per rotate_half pair of groups
    const int per_warp = ok ? 32 / lanes_per_head : 1;
    const int hs = lane / lanes_per_head;  // this lane's head within the warp (hs >= per_warp: an idle lane)
    const int p = (lane % lanes_per_head) / 8, j = lane & 7;
    const int h = (blockIdx.y * 8 + (threadIdx.x >> 5)) * per_warp + hs;
    const int32_t pos = ok ? positions[t] : -1;
    ok = ok && pos >= 0 && pos < max_pos;
    const bool is_q = h < num_q_heads;
    const int kvh = h - num_q_heads;
    int64_t slot = 0;
    bool mine = ok && hs < per_warp && h < num_q_heads + num_kv_heads;  // this lane has a head to write
    if (mine && !is_q) {
        slot = slot_mapping[t];
        mine = slot >= 0 && slot < (int64_t)max(num_pages, 0) * page_tokens;
    }
    const int half = D / 2;
    // element k of this lane in group p is d = 32 p + j + 8 k (< half), in group p + hg it is d + half
    float wv[2][4], c[4], sn[4];
    const __nv_bfloat16* w = is_q ? q_norm_w : k_norm_w;  // per lane; null: no norm for this head kind
    const bool norm = w != nullptr;
    if (mine) {
        const float* rope_row = rope + (int64_t)pos * D;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int d = 32 * p + j + 8 * k;  // f of rope: d for group p, (d + half) - half for group p + hg
            wv[0][k] = norm ? bf2f(w[d]) : 0.0f;
            wv[1][k] = norm ? bf2f(w[d + half]) : 0.0f;
            c[k] = rope_row[d];
            sn[k] = rope_row[half + d];
        }
    }
    kern_pdl_wait();  // the qkv row is the previous kernel's output; nothing is written before this
    if (!ok) return;  // block-uniform: every lane of every warp leaves together
    const int row_elems = (num_q_heads + 2 * num_kv_heads) * D;
    const __nv_bfloat16* row = qkv + (int64_t)t * row_elems;
    const __nv_bfloat16* x_ptr = is_q ? row + (int64_t)h * D : row + (int64_t)(num_q_heads + kvh) * D;
    float x[2][4];
#pragma unroll
    for (int g = 0; g < 2; ++g)
#pragma unroll
        for (int k = 0; k < 4; ++k) x[g][k] = mine ? bf2f(x_ptr[32 * p + j + 8 * k + g * half]) : 0.0f;
    float total = 0.0f;
    if (q_norm_w != nullptr || k_norm_w != nullptr) {  // grid-uniform: every lane shuffles, or none
        float part[2];
#pragma unroll
        for (int g = 0; g < 2; ++g)  // the tree's levels 16 and 8 in this lane: (s_j + s_j+16) + (s_j+8 + s_j+24)
            part[g] = (__fmul_rn(x[g][0], x[g][0]) + __fmul_rn(x[g][2], x[g][2])) +
                      (__fmul_rn(x[g][1], x[g][1]) + __fmul_rn(x[g][3], x[g][3]));
#pragma unroll
        for (int o = 4; o > 0; o >>= 1) {  // levels 4, 2, 1 over the group's 8 lanes
#pragma unroll
            for (int g = 0; g < 2; ++g) part[g] += __shfl_xor_sync(FULL_MASK_ROPE, part[g], o);
        }
        // group sums in the block version's order: groups 0 .. hg - 1 (slot q's first value), then hg .. 2 hg - 1
        const int base = lane - lane % lanes_per_head;
#pragma unroll
        for (int g = 0; g < 2; ++g) {
#pragma unroll
            for (int q = 0; q < ROPE_WARP_MAX_HG; ++q) {
                const float v = __shfl_sync(FULL_MASK_ROPE, part[g], (base + 8 * q) & 31);
                if (q < hg) total += v;
            }
        }
    }
    if (!mine) return;  // no shuffle follows
    const float rs = rsqrtf(total / (float)D + eps);
    float n[2][4];
#pragma unroll
    for (int g = 0; g < 2; ++g)
#pragma unroll
        for (int k = 0; k < 4; ++k) n[g][k] = norm ? round_bf(wv[g][k] * round_bf(x[g][k] * rs)) : x[g][k];
    __nv_bfloat16* dst;
    const __nv_bfloat16* v_src = nullptr;
    __nv_bfloat16* v_dst = nullptr;
    if (is_q) {
        dst = q_out + ((int64_t)t * num_q_heads + h) * D;
    } else {
        const int64_t page = slot / page_tokens;
        const int64_t off = slot % page_tokens;
        const int64_t token_elems = (int64_t)num_kv_heads * D;
        dst = kv_cache + ((page * 2 + 0) * page_tokens + off) * token_elems + (int64_t)kvh * D;
        v_dst = kv_cache + ((page * 2 + 1) * page_tokens + off) * token_elems + (int64_t)kvh * D;
        v_src = row + (int64_t)(num_q_heads + num_kv_heads + kvh) * D;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int d = 32 * p + j + 8 * k;
        // rotate_half: y[d] = n[d] c - n[d + half] s for d < half, y[d + half] = n[d + half] c + n[d] s
        dst[d] = f2bf(round_bf(n[0][k] * c[k]) + round_bf(-n[1][k] * sn[k]));
        dst[d + half] = f2bf(round_bf(n[1][k] * c[k]) + round_bf(n[0][k] * sn[k]));
        if (v_dst) {
            v_dst[d] = v_src[d];
            v_dst[d + half] = v_src[d + half];
        }
    }
}
