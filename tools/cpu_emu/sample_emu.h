// CPU stand-ins, beyond tools/cpu_emu/common.cuh, for what kernels-src/sample.cu's split sampler uses, for
// tools/sample_cpu_emu.py: L2 loads (__ldcg) as plain loads, __threadfence as a sequentially consistent fence,
// global and shared atomics (32- and 64-bit adds) through std::atomic_ref, the float -> u64 conversions. The
// driver runs one block at a time (each block's threads as std::threads), so a global atomic is only ever
// contended inside one block; the ticket merge is exercised by the order the driver runs the blocks in.
#pragma once
#include <atomic>
#include <cmath>
#include <cstdint>

#define __noinline__ __attribute__((noinline))

inline uint4 __ldcg(const uint4* p) { return *p; }
inline float4 __ldcg(const float4* p) { return *p; }
inline float __ldcg(const float* p) { return *p; }
inline unsigned __ldcg(const unsigned* p) { return *p; }
inline unsigned short __ldcg(const unsigned short* p) { return *p; }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}
inline unsigned long long __float2ull_rn(float x) { return x <= 0.0f ? 0ull : (unsigned long long)std::nearbyint((double)x); }
inline unsigned long long __float2ull_rd(float x) { return x <= 0.0f ? 0ull : (unsigned long long)std::floor((double)x); }
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
