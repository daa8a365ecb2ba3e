// Plain loads and stores to peer memory at system scope, and the globaltimer, for kernels that synchronise
// ranks through memory mapped from other GPUs (peer_barrier.cu, allreduce.cu). No multicast: these assemble to
// STG.E.STRONG.SYS / LDG.E.STRONG.SYS / MEMBAR.SC.SYS (docs/runtime.md "Multicast check").
#pragma once
#include <stdint.h>

// Nanoseconds of the GPU's global timer (%globaltimer): what bounds every wait on a peer.
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void store_release_sys(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ unsigned long long load_acquire_sys(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Every write this thread issued before is performed at system scope (peers see it) before any write after.
__device__ __forceinline__ void fence_sys() { __threadfence_system(); }

// 16 bytes from global memory through L2 only (ld.global.cg): data a peer wrote, read after an acquire.
__device__ __forceinline__ uint4 load16_cg(const void* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }

__device__ __forceinline__ void store16(void* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }
