// CPU stand-in for kernels-src/peer_mem.cuh: system-scope stores and loads are std::atomic_ref release / acquire on
// memory shared by the rank processes (mmap MAP_SHARED before fork), the globaltimer is steady_clock.
#pragma once
#include <atomic>
#include <chrono>
inline unsigned long long global_ns() {
  return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}
inline void store_release_sys(unsigned long long* p, unsigned long long v) {
  std::atomic_ref<unsigned long long>(*p).store(v, std::memory_order_release);
}
inline unsigned long long load_acquire_sys(const unsigned long long* p) {
  return std::atomic_ref<unsigned long long>(*const_cast<unsigned long long*>(p)).load(std::memory_order_acquire);
}
inline void fence_sys() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline uint4 load16_cg(const void* p) { uint4 v; memcpy(&v, p, 16); return v; }
inline void store16(void* p, uint4 v) { memcpy(p, &v, 16); }
