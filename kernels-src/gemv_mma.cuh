// Hardware primitives of kernels-src/gemv_mma.cu (the small-M MMA projections): streamed weight loads, thread-block
// cluster ranks and barriers, distributed shared memory reads, mma.sync m16n8k16 bf16, and the shared-memory
// declarations. A header of its own so that tools/gemv_mma_cpu_emu.py can put CPU stand-ins in its place
// (tools/cpu_emu_mma/gemv_mma.cuh) and run the kernel's own logic on a CPU.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef KERN_DEV
#define KERN_DEV __device__ __forceinline__
#endif

// `extern __shared__ T name[]` (the launch's dynamic shared memory) / `__shared__ T name` (static).
#define KERN_MMA_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#define KERN_MMA_STATIC_SHARED(T, name) __shared__ T name

// ---- loads (as kernels-src/gemv.cu) ----
KERN_DEV uint64_t weight_policy() {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

// One 16-byte weight chunk: read-only path, no L1 allocation, L2 evict-first.
KERN_DEV uint4 ldg_weight(const __nv_bfloat16* p, uint64_t policy) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(policy));
    return v;
}

// The same through the coherent path, for the loads issued before griddepcontrol.wait (ptxas moves a .nc load
// across the wait; a coherent one stays before it: docs/kernels-gemv.md "Programmatic dependent launch").
KERN_DEV uint4 ldg_weight_early(const __nv_bfloat16* p, uint64_t policy) {
    uint4 v;
    asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(policy)
                 : "memory");
    return v;
}

// ---- clusters ----
KERN_DEV uint32_t cluster_nranks() { uint32_t v; asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(v)); return v; }
KERN_DEV uint32_t cluster_rank() { uint32_t v; asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(v)); return v; }
KERN_DEV uint32_t cluster_index() { uint32_t v; asm("mov.u32 %0, %%clusterid.x;" : "=r"(v)); return v; }
KERN_DEV uint32_t cluster_count() { uint32_t v; asm("mov.u32 %0, %%nclusterid.x;" : "=r"(v)); return v; }

// Every thread of the cluster: shared-memory writes before it are visible to the whole cluster after it. With
// one block per cluster a block barrier is the same thing.
KERN_DEV void cluster_sync(int nranks) {
    if (nranks == 1) {
        __syncthreads();
        return;
    }
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The f32 at the same shared-memory offset as `local` in block `rank` of this cluster.
KERN_DEV float ld_rank_f32(const float* local, uint32_t rank, int nranks) {
    if (nranks == 1) return *local;
    const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(local));
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(a), "r"(rank));
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
}

// D += A B, m16n8k16, A row-major bf16 (4 regs), B col-major bf16 (2 regs), f32 accumulators.
KERN_DEV void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

