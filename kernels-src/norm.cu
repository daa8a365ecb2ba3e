// kern_add_rmsnorm: optional fused residual add, then RMSNorm with transformers' Qwen3RMSNorm rounding.
//   if delta: residual = bf16(residual + delta)       (stored back)
//   out = bf16(weight * bf16(r * rsqrt(mean(r^2) + eps)))   with r = residual, fp32 math
// grid (n_tokens,1,1), block (256,1,1). 16-byte accesses when hidden % 8 == 0 and pointers are aligned.
// PDL: griddepcontrol.wait before anything is read or written (every path), then launch_dependents (both no-ops
// without PDL), so it may be launched with PDL after any kernel.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256) kern_add_rmsnorm(
    __nv_bfloat16* residual,      // [n_tokens, hidden], updated in place when delta != nullptr
    const __nv_bfloat16* delta,   // [n_tokens, hidden] or nullptr
    const __nv_bfloat16* weight,  // [hidden]
    __nv_bfloat16* out,           // [n_tokens, hidden]
    int32_t n_tokens, int32_t hidden, float eps) {
    __shared__ float scratch[32];
    kern_pdl_wait();
    kern_pdl_launch_dependents();
    const int t = blockIdx.x;
    if (t >= n_tokens || hidden <= 0) return;  // uniform over the block
    __nv_bfloat16* res = residual + (int64_t)t * hidden;
    const __nv_bfloat16* del = delta ? delta + (int64_t)t * hidden : nullptr;
    __nv_bfloat16* o = out + (int64_t)t * hidden;
    const bool vec = (hidden % 8 == 0) && aligned16(residual) && aligned16(out) && aligned16(weight) &&
                     (delta == nullptr || aligned16(delta));
    const int n8 = (hidden + 7) / 8;  // 8-wide chunks; the last may be partial on the scalar path

    // Pass 1: r = bf16(res + delta) (written back), sum of r^2. Each thread re-reads only its own chunks.
    float sumsq = 0.0f;
    for (int c = threadIdx.x; c < n8; c += blockDim.x) {
        const int i0 = c * 8;
        float r[8];
        load8(res, i0, hidden, vec, r);
        if (del) {
            float d[8];
            load8(del, i0, hidden, vec, d);
#pragma unroll
            for (int i = 0; i < 8; ++i) r[i] = round_bf(r[i] + d[i]);
            if (vec) {
                store8_vec(res + i0, r);
            } else {
#pragma unroll
                for (int i = 0; i < 8; ++i)
                    if (i0 + i < hidden) res[i0 + i] = f2bf(r[i]);
            }
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) sumsq += r[i] * r[i];  // elements past hidden are 0
    }
    const float total = block_sum(sumsq, scratch);
    const float rs = rsqrtf(total / (float)hidden + eps);

    // Pass 2: out = bf16(w * bf16(r * rs)). Same chunk assignment as pass 1, so each thread reads back
    // the residual values it wrote itself.
    for (int c = threadIdx.x; c < n8; c += blockDim.x) {
        const int i0 = c * 8;
        float r[8], w[8], y[8];
        load8(res, i0, hidden, vec, r);
        load8(weight, i0, hidden, vec, w);
#pragma unroll
        for (int i = 0; i < 8; ++i) y[i] = w[i] * round_bf(r[i] * rs);
        if (vec) {
            store8_vec(o + i0, y);
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i)
                if (i0 + i < hidden) o[i0 + i] = f2bf(y[i]);
        }
    }
}
