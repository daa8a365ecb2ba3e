// kern_embed_gather: out[t, :] = table[token_ids[t], :]; ids outside [0, vocab) write zeros.
// grid (n_tokens,1,1), block (256,1,1). 16-byte copies when hidden % 8 == 0 and pointers are aligned.
// Starts with griddepcontrol.wait, then launch_dependents: may be launched with PDL after any kernel.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256) kern_embed_gather(
    const __nv_bfloat16* table,  // [vocab, hidden]
    const int32_t* token_ids,    // [n_tokens]
    __nv_bfloat16* out,          // [n_tokens, hidden]
    int32_t n_tokens, int32_t hidden, int32_t vocab) {
    kern_pdl_wait();  // PDL: nothing is read or written before the previous kernel has completed
    kern_pdl_launch_dependents();
    const int t = blockIdx.x;
    if (t >= n_tokens || hidden <= 0) return;
    const int32_t id = token_ids[t];
    const bool valid = id >= 0 && id < vocab;
    const __nv_bfloat16* src = table + (int64_t)(valid ? id : 0) * hidden;
    __nv_bfloat16* dst = out + (int64_t)t * hidden;
    const bool vec = (hidden % 8 == 0) && aligned16(table) && aligned16(out);
    if (vec) {
        const int n8 = hidden / 8;
        for (int i = threadIdx.x; i < n8; i += blockDim.x) {
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (valid) v = reinterpret_cast<const uint4*>(src)[i];
            reinterpret_cast<uint4*>(dst)[i] = v;
        }
    } else {
        const __nv_bfloat16 zero = __float2bfloat16_rn(0.0f);
        for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = valid ? src[i] : zero;
    }
}
