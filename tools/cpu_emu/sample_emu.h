// CPU stand-ins, beyond tools/cpu_emu/common.cuh, for what kernels-src/sample.cu's split sampler uses, for
// tools/sample_cpu_emu.py: L2 loads (__ldcg) as plain loads, __threadfence as a sequentially consistent fence,
// global and shared atomics (32- and 64-bit adds) through std::atomic_ref, the float -> u64 conversions, the
// exact path's coordination (SAMPLE_HOST_SYNC: steady_clock for %globaltimer, acquire / release through
// std::atomic_ref, a yield in the spins) and a shared-memory block of its own for each concurrently running block
// (SAMPLE_SHARED). The driver runs the blocks one at a time, or WORKERS of them at once (each block's threads as
// std::threads): the ticket merge is exercised by the order, the helpers of the exact path by the concurrency.
#pragma once
#include <atomic>
#include <cmath>
#include <cstdint>

#define __noinline__ __attribute__((noinline))

inline uint4 __ldcg(const uint4* p) { return *p; }
inline float4 __ldcg(const float4* p) { return *p; }
inline float __ldcg(const float* p) { return *p; }
inline unsigned __ldcg(const unsigned* p) {
  return std::atomic_ref<unsigned>(*const_cast<unsigned*>(p)).load(std::memory_order_relaxed);
}
inline unsigned long long __ldcg(const unsigned long long* p) {
  return std::atomic_ref<unsigned long long>(*const_cast<unsigned long long*>(p)).load(std::memory_order_relaxed);
}
inline unsigned short __ldcg(const unsigned short* p) { return *p; }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}
inline unsigned long long __float2ull_rn(float x) { return x <= 0.0f ? 0ull : (unsigned long long)std::nearbyint((double)x); }
inline unsigned long long __float2ull_rd(float x) { return x <= 0.0f ? 0ull : (unsigned long long)std::floor((double)x); }
// sample.cu's row coordination (the exact path's helpers)
#include <chrono>
#include <thread>
#define SAMPLE_HOST_SYNC
#define SAMPLE_HELP_WAIT_NS 30000000000ull  // 30 s: the emulator's blocks are ~10^4 times slower than the GPU's
inline unsigned long long sample_ns() {
  return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch()).count();
}
inline uint32_t sample_load_relaxed(const uint32_t* p) {
  return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(p)).load(std::memory_order_relaxed);
}
inline uint32_t sample_load_acquire(const uint32_t* p) {
  return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(p)).load(std::memory_order_acquire);
}
inline void sample_store_release(uint32_t* p, uint32_t v) { std::atomic_ref<uint32_t>(*p).store(v, std::memory_order_release); }
#define SAMPLE_SPIN_PAUSE() std::this_thread::yield()
// each running block's own shared memory (the driver points t_block_smem at its worker's)
extern thread_local void* t_block_smem;
template <typename S> inline S& emu_block_shared() { return *static_cast<S*>(t_block_smem); }
#define SAMPLE_SHARED(type, name) type& name = emu_block_shared<type>()
// sample.cu's hook: the exact-path tasks each helper block ran, summed per row
extern std::atomic<int>* g_sample_helped;
#define SAMPLE_HELPED(row, tasks) (threadIdx.x == 0 ? (void)g_sample_helped[row].fetch_add(tasks) : (void)0)
// sample.cu's hook: the path that merged each row (0 greedy, 1 plain, 2 candidates, 3 exact), for the checks
extern int* g_sample_path;
#define SAMPLE_PATH(row, path) (threadIdx.x == 0 ? (void)(g_sample_path[row] = (path)) : (void)0)
#ifdef SAMPLE_PROFILE
// sample.cu's phase profile (-DSAMPLE_PROFILE): %globaltimer and clock64 as the host's steady clock in ns, %smid 0
#include <chrono>
#define SAMPLE_PROF_HOST_CLOCKS
inline unsigned long long prof_globaltimer() {
  return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch()).count();
}
inline unsigned long long prof_clock() { return prof_globaltimer(); }
inline unsigned prof_smid() { return 0u; }
#endif
