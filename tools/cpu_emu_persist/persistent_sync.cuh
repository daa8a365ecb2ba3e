// CPU stand-in of kernels-src/persistent_sync.cuh: steady_clock for %globaltimer, std::atomic_ref acquire / release
// for the counters, the block's dynamic shared memory from its BlockCtx.
#pragma once
#include <chrono>
#define PD_DYNAMIC_SMEM(name) float* name = t_ctx->smem
inline unsigned long long global_ns() {
  return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch()).count();
}
inline uint32_t load_acquire(const uint32_t* p) {
  return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(p)).load(std::memory_order_acquire);
}
inline void red_release_add(uint32_t* p, uint32_t v) { std::atomic_ref<uint32_t>(*p).fetch_add(v, std::memory_order_release); }
inline uint32_t atomic_add_acq_rel(uint32_t* p, uint32_t v) {
  return std::atomic_ref<uint32_t>(*p).fetch_add(v, std::memory_order_acq_rel);
}
inline void prefetch_l2(const void*, uint32_t) {}  // a hint on the GPU; nothing to do here
inline void prefetch_l1(const void*) {}            // the same
inline uint64_t l2_policy(bool evict_first) { return evict_first ? 1u : 0u; }  // a cache priority: no effect here
inline void cp_async16_policy(void* smem, const void* gmem, int src_bytes, uint64_t) { cp_async16(smem, gmem, src_bytes); }
