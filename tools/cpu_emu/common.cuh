// CPU stand-in for kernels-src/common.cuh and the CUDA builtins kernels-src/sample.cu and rope.cu use, for
// tools/sample_cpu_emu.py and tools/rope_cpu_emu.py (which appends the real block_sum): a block runs as 1024 std::threads, __syncthreads as a std::barrier, warp shuffles
// and ballots through a per-warp exchange and barrier, shared atomics as std::atomic_ref. Not a CUDA
// implementation: enough to run that one source on a CPU and check its logic (barriers, scans, selection).
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>
#include <cmath>
#include <atomic>
#include <barrier>
#include <cstring>
#include <memory>
#define KERN_DEV inline
#define __global__
#define __device__
#define __forceinline__
#define __launch_bounds__(...)
#define __shared__ static
struct dim3 { unsigned x = 0, y = 0, z = 0; };
extern thread_local dim3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
struct uint4 { uint32_t x, y, z, w; };
struct uint2 { uint32_t x, y; };
struct float4 { float x, y, z, w; };
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
inline uint2 make_uint2(uint32_t a, uint32_t b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
using std::isnan;
inline float __expf(float x) { return expf(x); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float rsqrtf(float a) { return 1.0f / std::sqrt(a); }  // the GPU's is approximate (2 ulp)
inline uint32_t __umulhi(uint32_t a, uint32_t b) { return (uint32_t)(((uint64_t)a * b) >> 32); }
inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
#ifdef EMU_CONCURRENT_BLOCKS  // several blocks at once (tools/cpu_emu/driver.cpp): each thread's block's own
extern thread_local std::barrier<>* g_block_barrier;
extern thread_local std::barrier<>** g_warp_barrier;
extern thread_local uint64_t (*g_warp_x)[32];
extern thread_local std::atomic<int>* g_count;
#else
extern std::barrier<>* g_block_barrier;
extern std::barrier<>* g_warp_barrier[32];
extern uint64_t g_warp_x[32][32];
extern std::atomic<int> g_count[2];
#endif
extern thread_local int t_count_parity;
inline void __syncthreads() { g_block_barrier->arrive_and_wait(); }
inline int __syncthreads_count(int pred) {
  const int s = t_count_parity; t_count_parity ^= 1;
  if (pred) g_count[s].fetch_add(1);
  __syncthreads();
  const int v = g_count[s].load();
  __syncthreads();
  if (threadIdx.x == 0) g_count[s].store(0);
  return v;
}
template <typename V> inline V shfl_at(V v, int src) {
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint64_t raw = 0; memcpy(&raw, &v, sizeof(V));
  g_warp_x[w][lane] = raw;
  g_warp_barrier[w]->arrive_and_wait();
  uint64_t got = g_warp_x[w][(src >= 0 && src < 32) ? src : lane];
  g_warp_barrier[w]->arrive_and_wait();
  V out; memcpy(&out, &got, sizeof(V)); return out;
}
template <typename V> inline V __shfl_sync(unsigned, V v, int src) { return shfl_at(v, src & 31); }
template <typename V> inline V __shfl_xor_sync(unsigned, V v, int o) { return shfl_at(v, (int)(threadIdx.x & 31) ^ o); }
template <typename V> inline V __shfl_down_sync(unsigned, V v, int o) { int l = threadIdx.x & 31; return shfl_at(v, l + o < 32 ? l + o : l); }
template <typename V> inline V __shfl_up_sync(unsigned, V v, int o) { int l = threadIdx.x & 31; return shfl_at(v, l - o >= 0 ? l - o : l); }
inline unsigned __ballot_sync(unsigned, int pred) {
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  g_warp_x[w][lane] = pred ? 1 : 0;
  g_warp_barrier[w]->arrive_and_wait();
  unsigned b = 0; for (int i = 0; i < 32; ++i) if (g_warp_x[w][i]) b |= 1u << i;
  g_warp_barrier[w]->arrive_and_wait();
  return b;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __any_sync(unsigned m, int pred) { return __ballot_sync(m, pred) != 0; }
inline unsigned atomicMax(unsigned* p, unsigned v) { std::atomic_ref<unsigned> a(*p); unsigned o = a.load(); while (o < v && !a.compare_exchange_weak(o, v)) {} return o; }
inline int atomicMax(int* p, int v) { std::atomic_ref<int> a(*p); int o = a.load(); while (o < v && !a.compare_exchange_weak(o, v)) {} return o; }
inline int atomicMin(int* p, int v) { std::atomic_ref<int> a(*p); int o = a.load(); while (o > v && !a.compare_exchange_weak(o, v)) {} return o; }
KERN_DEV float bf2f(__nv_bfloat16 x) { return __bfloat162float(x); }
KERN_DEV __nv_bfloat16 f2bf(float x) { return __float2bfloat16_rn(x); }
KERN_DEV float round_bf(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
KERN_DEV float silu_bf(float g) { return round_bf(g / (1.0f + expf(-g))); }  // kernels-src/common.cuh
KERN_DEV bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
KERN_DEV void load8_vec(const __nv_bfloat16* p, float (&v)[8]) { for (int i = 0; i < 8; ++i) v[i] = bf2f(p[i]); }
KERN_DEV void kern_pdl_wait() {}
KERN_DEV void kern_pdl_launch_dependents() {}
#include <algorithm>
using std::max; using std::min;
inline float fmaxf(float a, float b) { return std::fmax(a, b); }
