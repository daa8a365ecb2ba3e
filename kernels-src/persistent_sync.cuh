// Timing and synchronisation primitives of kernels that wait, bounded, on each other: the global timer (every
// bounded wait: persistent_decode.cu, gemm_skinny.cu, attention_wg.cu), a counter's acquire load
// (persistent_decode.cu, gemm_skinny.cu) and release add (persistent_decode.cu), the persistent kernel's dynamic
// shared memory, its L2 prefetch of weights, the weight ring's L2 eviction policy and its prefetch of the next
// instruction. tools/cpu_emu_persist/ holds the CPU stand-in of this header
// (std::atomic_ref, steady_clock), which is how the persistent kernel's logic is checked without a GPU.
#pragma once
#include <stdint.h>

#define PD_DYNAMIC_SMEM(name) extern __shared__ float name[]

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void red_release_add(uint32_t* p, uint32_t v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// counters[p] += v at GPU scope, acquire and release; the value before. The persistent kernel's ATTN ticket.
__device__ __forceinline__ uint32_t atomic_add_acq_rel(uint32_t* p, uint32_t v) {
    uint32_t old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

// A hint: bring [p, p + bytes) into L2 (p 16-byte aligned, bytes a multiple of 16; no data reaches the SM).
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

// An L2 eviction policy for every line a copy brings in: evict-first for bytes read once a step (the weights, 8 GB a
// step at 4B against a 50 MB L2), so what is read again stays (the kernel's code, the table, the counters, the
// activations, K / V); evict-normal, the default priority, otherwise. PTX ISA "createpolicy".
__device__ __forceinline__ uint64_t l2_policy(bool evict_first) {
    uint64_t p;
    if (evict_first)
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    else
        asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
    return p;
}

// common.cuh's cp_async16 (16 bytes global -> shared, src_bytes of them read, the rest zero-filled) under `policy`.
__device__ __forceinline__ void cp_async16_policy(void* smem, const void* gmem, int src_bytes, uint64_t policy) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(a), "l"(gmem),
                 "r"(src_bytes), "l"(policy)
                 : "memory");
}

// A hint: bring the line holding p into this SM's L1 (no register waits for it).
__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }
