// CPU stand-in of kernels-src/persistent_sync.cuh: steady_clock for %globaltimer, std::atomic_ref acquire / release
// for the counters, the block's dynamic shared memory from its BlockCtx, the weight ring's copies queued per thread.
#pragma once
#include <chrono>
#include <deque>
#include <vector>
#define PD_DYNAMIC_SMEM(name) float* name = t_ctx->smem
inline unsigned long long global_ns() {
  return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch()).count();
}
inline uint32_t load_acquire(const uint32_t* p) {
  return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(p)).load(std::memory_order_acquire);
}
inline void red_release_add(uint32_t* p, uint32_t v) { std::atomic_ref<uint32_t>(*p).fetch_add(v, std::memory_order_release); }
inline void prefetch_l2(const void*, uint32_t) {}  // a hint on the GPU; nothing to do here
// The weight ring's cp.async: each thread's copies are queued and done when a wait_group lets their group
// complete (not when issued), so a read of a ring slot before its wait sees stale bytes here as it could on the GPU.
struct RingCopy { void* dst; const void* src; int bytes; };
inline thread_local std::vector<RingCopy> t_ring_open;                 // issued, not yet committed
inline thread_local std::deque<std::vector<RingCopy>> t_ring_groups;   // committed, oldest first
inline void ring_copy16(void* smem, const void* gmem, int src_bytes) { t_ring_open.push_back({smem, gmem, src_bytes}); }
inline void ring_commit() { t_ring_groups.push_back(std::move(t_ring_open)); t_ring_open.clear(); }
inline void ring_wait_pending(int pending) {
  while (t_ring_groups.size() > static_cast<size_t>(pending)) {
    for (const RingCopy& c : t_ring_groups.front()) {
      if (c.bytes == 16) memcpy(c.dst, c.src, 16); else memset(c.dst, 0, 16);
    }
    t_ring_groups.pop_front();
  }
}
