// CPU stand-in for kernels-src/common.cuh and the CUDA builtins kernels-src/persistent_decode.cu uses, for
// tools/persistent_cpu_emu.py: every block of the grid runs at once, each as blockDim.x std::threads with its own
// block barrier, warp exchanges and dynamic shared memory (a BlockCtx per block, reached through a thread_local
// pointer), so blocks really wait on each other's counters. Loads of what other blocks write are plain loads
// (x86 keeps stores in order); counters and the error word go through std::atomic_ref. Not a CUDA implementation:
// enough to check the interpreter's logic (queues, waits, faults) and its arithmetic on a CPU.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <algorithm>
#include <deque>
#include <vector>
#define KERN_DEV inline
#define __global__
#define __device__
#define __forceinline__
#define __restrict__
#define __launch_bounds__(...)
struct dim3 { unsigned x = 0, y = 0, z = 0; };
extern thread_local dim3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
struct uint4 { uint32_t x, y, z, w; };
struct float4 { float x, y, z, w; };
using std::max; using std::min;
inline float fmaxf(float a, float b) { return std::fmax(a, b); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

struct BlockCtx {
  std::unique_ptr<std::barrier<>> block;
  std::unique_ptr<std::barrier<>> warp[32];
  uint64_t warp_x[32][32];
  float* smem;
  uint32_t smem_bytes;
};
extern thread_local BlockCtx* t_ctx;

inline void __syncthreads() { t_ctx->block->arrive_and_wait(); }
inline void __syncwarp() { t_ctx->warp[threadIdx.x >> 5]->arrive_and_wait(); }
template <typename V> inline V shfl_at(V v, int src) {
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint64_t raw = 0; memcpy(&raw, &v, sizeof(V));
  t_ctx->warp_x[w][lane] = raw;
  t_ctx->warp[w]->arrive_and_wait();
  uint64_t got = t_ctx->warp_x[w][(src >= 0 && src < 32) ? src : lane];
  t_ctx->warp[w]->arrive_and_wait();
  V out; memcpy(&out, &got, sizeof(V)); return out;
}
template <typename V> inline V __shfl_sync(unsigned, V v, int src) { return shfl_at(v, src); }
template <typename V> inline V __shfl_xor_sync(unsigned, V v, int o) { return shfl_at(v, (int)(threadIdx.x & 31) ^ o); }
template <typename V> inline V __shfl_down_sync(unsigned, V v, int o) { int l = threadIdx.x & 31; return shfl_at(v, l + o < 32 ? l + o : l); }
template <typename T> inline T __ldcg(const T* p) { return *reinterpret_cast<const volatile T*>(p); }
inline uint4 __ldcg(const uint4* p) {
  const volatile uint32_t* w = reinterpret_cast<const volatile uint32_t*>(p); return uint4{w[0], w[1], w[2], w[3]};
}
inline __nv_bfloat16 __ldcg(const __nv_bfloat16* p) { __nv_bfloat16 v; v.b = *reinterpret_cast<const volatile uint16_t*>(&p->b); return v; }
inline uint32_t atomicCAS(uint32_t* p, uint32_t expect, uint32_t desired) {
  std::atomic_ref<uint32_t> a(*p); a.compare_exchange_strong(expect, desired); return expect;
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __nanosleep(unsigned) { std::this_thread::yield(); }
inline uint32_t dynamic_smem_bytes() { return t_ctx->smem_bytes; }
// cp.async (common.cuh's cp_async16 / cp_async_commit / cp_async_wait_pending, the persistent kernel's weight
// ring): each thread's copies are queued and done when a wait_group lets their group
// complete (not when issued), so a read of a ring slot before its wait sees stale bytes here as it could on the GPU.
struct RingCopy { void* dst; const void* src; int bytes; };
inline thread_local std::vector<RingCopy> t_ring_open;                 // issued, not yet committed
inline thread_local std::deque<std::vector<RingCopy>> t_ring_groups;   // committed, oldest first
inline void cp_async16(void* smem, const void* gmem, int src_bytes) { t_ring_open.push_back({smem, gmem, src_bytes}); }
inline void cp_async_commit() { t_ring_groups.push_back(std::move(t_ring_open)); t_ring_open.clear(); }
inline void cp_async_wait_pending(int pending) {
  while (t_ring_groups.size() > static_cast<size_t>(pending)) {
    for (const RingCopy& c : t_ring_groups.front()) {
      if (c.bytes == 16) memcpy(c.dst, c.src, 16); else memset(c.dst, 0, 16);
    }
    t_ring_groups.pop_front();
  }
}

KERN_DEV float bf2f(__nv_bfloat16 x) { return __bfloat162float(x); }
KERN_DEV __nv_bfloat16 f2bf(float x) { return __float2bfloat16_rn(x); }
KERN_DEV float round_bf(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
KERN_DEV float silu_bf(float g) { return round_bf(g / (1.0f + expf(-g))); }  // kernels-src/common.cuh
KERN_DEV bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
KERN_DEV void load8_vec(const __nv_bfloat16* p, float (&v)[8]) { for (int i = 0; i < 8; ++i) v[i] = bf2f(p[i]); }
KERN_DEV float warp_sum(float x) { for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o); return x; }
// kernels-src/common.cuh's block_sum, the same tree and order
KERN_DEV float block_sum(float x, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = (blockDim.x + 31) >> 5;
  const int lanes_here = min(32, (int)blockDim.x - warp * 32);
  for (int o = 16; o > 0; o >>= 1) { const float y = __shfl_down_sync(0xffffffffu, x, o); if (lane + o < lanes_here) x += y; }
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < num_warps; ++w) total += scratch[w];
  return total;
}
