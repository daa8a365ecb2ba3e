// kern_silu_mul: out = bf16(bf16(silu(gate)) * up), gate_up row = [gate: inter][up: inter].
// grid (n_tokens, cdiv(inter, 1024), 1), block (256,1,1): block (t, y) covers columns
// [y*1024, min((y+1)*1024, inter)), 4 per thread (8-byte accesses when inter % 4 == 0 and aligned).
// PDL: griddepcontrol.wait before anything is read or written (every path), then launch_dependents (both no-ops
// without PDL), so it may be launched with PDL after any kernel.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256) kern_silu_mul(
    const __nv_bfloat16* gate_up,  // [n_tokens, 2 * inter]
    __nv_bfloat16* out,            // [n_tokens, inter]
    int32_t n_tokens, int32_t inter) {
    kern_pdl_wait();
    kern_pdl_launch_dependents();
    const int t = blockIdx.x;
    if (t >= n_tokens || inter <= 0) return;
    const __nv_bfloat16* g = gate_up + (int64_t)t * 2 * inter;
    const __nv_bfloat16* u = g + inter;
    __nv_bfloat16* o = out + (int64_t)t * inter;
    const int i0 = blockIdx.y * 1024 + threadIdx.x * 4;
    const bool vec = (inter % 4 == 0) && ((reinterpret_cast<uintptr_t>(gate_up) & 7u) == 0) &&
                     ((reinterpret_cast<uintptr_t>(out) & 7u) == 0);
    if (vec) {
        if (i0 + 4 > inter) return;  // inter % 4 == 0: a chunk is all in or all out
        const uint2 gr = *reinterpret_cast<const uint2*>(g + i0);
        const uint2 ur = *reinterpret_cast<const uint2*>(u + i0);
        const __nv_bfloat162* gh = reinterpret_cast<const __nv_bfloat162*>(&gr);
        const __nv_bfloat162* uh = reinterpret_cast<const __nv_bfloat162*>(&ur);
        uint2 orw;
        __nv_bfloat162* oh = reinterpret_cast<__nv_bfloat162*>(&orw);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const float2 gf = __bfloat1622float2(gh[i]);
            const float2 uf = __bfloat1622float2(uh[i]);
            oh[i] = __floats2bfloat162_rn(silu_bf(gf.x) * uf.x, silu_bf(gf.y) * uf.y);
        }
        *reinterpret_cast<uint2*>(o + i0) = orw;
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int c = i0 + i;
            if (c < inter) o[c] = f2bf(silu_bf(bf2f(g[c])) * bf2f(u[c]));
        }
    }
}
