// Hopper warpgroup-MMA plumbing shared by the wgmma modules (attention_wg.cu, gemm_skinny.cu): the 128-byte-swizzle
// shared-memory matrix descriptor, the wgmma fence / commit / wait, the generic-to-async proxy fence and the
// accumulator register pins. Header only, sm_90a.
//
// PTX ISA 8.x: "Asynchronous Warpgroup Level Matrix Multiply-Accumulate" (the matrix descriptor: start, leading /
// stride byte offsets >> 4, swizzle mode in bits 62-63; the fence / commit / wait rules), "fence.proxy.async".
#pragma once
#include "common.cuh"

KERN_DEV uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// A shared-memory matrix descriptor with the 128-byte swizzle (byte offsets, multiples of 16).
KERN_DEV uint64_t sw128_desc(uint32_t start, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((start & 0x3FFFFu) >> 4) | ((uint64_t)((lbo & 0x3FFFFu) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}

KERN_DEV void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
KERN_DEV void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Until at most N committed wgmma groups of this warp are still running (groups retire in commit order).
template <int N>
KERN_DEV void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy writes to shared memory (cp.async, st.shared) made visible to the async proxy that wgmma
// reads through: each writer fences after its copies land, before the barrier.
KERN_DEV void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Pin accumulator registers at a point of the instruction stream (no instruction is emitted): the compiler
// may not move their reads above a wgmma wait nor their writes below a wgmma fence.
template <int N8>
KERN_DEV void reg_fence(float (&d)[N8][4]) {
#pragma unroll
    for (int j = 0; j < N8; ++j)
        asm volatile("" : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])::"memory");
}

template <int N>
KERN_DEV void reg_fence_u32(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j) asm volatile("" : "+r"(r[j][0]), "+r"(r[j][1]), "+r"(r[j][2]), "+r"(r[j][3])::"memory");
}
