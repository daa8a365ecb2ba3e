// Shared helpers for kern's kernels: bf16 <-> f32, 8-wide loads/stores with a scalar fallback, and
// block-wide reductions. Header only; every kernel source includes it. Kept deliberately plain.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#define KERN_DEV __device__ __forceinline__

KERN_DEV float bf2f(__nv_bfloat16 x) { return __bfloat162float(x); }
KERN_DEV __nv_bfloat16 f2bf(float x) { return __float2bfloat16_rn(x); }
// Round an fp32 value to bf16 precision and back (the rounding point of a bf16 tensor op).
KERN_DEV float round_bf(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
// silu(g) = g / (1 + e^-g) in fp32 (IEEE division), rounded to bf16: kern_silu_mul's formula, which every fused
// SwiGLU epilogue repeats so that its rows match the unfused path's.
KERN_DEV float silu_bf(float g) { return round_bf(g / (1.0f + expf(-g))); }

KERN_DEV bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// 8 consecutive bf16 at p (16-byte aligned) -> 8 floats, one 16-byte load.
KERN_DEV void load8_vec(const __nv_bfloat16* p, float (&v)[8]) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(h[i]);
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
    }
}

// 8 floats -> 8 bf16 at p (16-byte aligned), one 16-byte store. Rounds to nearest even.
KERN_DEV void store8_vec(__nv_bfloat16* p, const float (&v)[8]) {
    uint4 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = raw;
}

// Elements [i0, i0 + 8) of a row of n bf16: vector load when `vec` (caller guarantees i0 + 8 <= n and
// 16-byte alignment), else element by element with elements at or past n read as 0.
KERN_DEV void load8(const __nv_bfloat16* row, int i0, int n, bool vec, float (&v)[8]) {
    if (vec) {
        load8_vec(row + i0, v);
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = (i0 + i < n) ? bf2f(row[i0 + i]) : 0.0f;
    }
}

// Programmatic dependent launch (sm_90, docs/kernels.md): wait until the previous kernel in the stream has
// completed and its writes are visible / let the next kernel's blocks be scheduled. Both are no-ops in a
// kernel launched without CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION.
// Bytes of dynamic shared memory this launch was given (PTX %dynamic_smem_size): entries check it against
// what they need before touching shared memory.
KERN_DEV uint32_t dynamic_smem_bytes() {
    uint32_t bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    return bytes;
}

KERN_DEV void kern_pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
KERN_DEV void kern_pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// 16 bytes global -> shared, asynchronously (cp.async, through L2); src_bytes = 0 fills zeros (gmem is then not
// read). The writes are visible to the issuing thread after cp_async_wait_all(), to the block after a barrier
// that follows it.
KERN_DEV void cp_async16(void* smem, const void* gmem, int src_bytes) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(gmem), "r"(src_bytes) : "memory");
}
KERN_DEV void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
KERN_DEV void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// Wait until at most `pending` (0 .. 7, uniform across the warp) of this thread's newest groups are in flight (the
// persistent decode's weight ring, whose depth is known at run time only).
KERN_DEV void cp_async_wait_pending(int pending) {
    switch (pending) {
        case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
        case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
        case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
        case 3: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
        case 4: asm volatile("cp.async.wait_group 4;\n" ::: "memory"); break;
        case 5: asm volatile("cp.async.wait_group 5;\n" ::: "memory"); break;
        case 6: asm volatile("cp.async.wait_group 6;\n" ::: "memory"); break;
        default: asm volatile("cp.async.wait_group 7;\n" ::: "memory"); break;
    }
}

KERN_DEV float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

KERN_DEV float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// Sum of x over the whole block (any blockDim.x up to 1024, partial last warp allowed); every thread
// gets the same result, summed in a fixed order (deterministic). Must be reached by every thread of
// the block. `scratch` holds 32 floats.
KERN_DEV float block_sum(float x, float* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int num_warps = (blockDim.x + 31) >> 5;
    const int lanes_here = min(32, (int)blockDim.x - warp * 32);  // threads in this warp
    const unsigned mask = lanes_here == 32 ? 0xffffffffu : ((1u << lanes_here) - 1u);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float y = __shfl_down_sync(mask, x, o);
        if (lane + o < lanes_here) x += y;  // a source lane outside the warp's threads is ignored
    }
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < num_warps; ++w) total += scratch[w];  // same order in every thread
    return total;
}
