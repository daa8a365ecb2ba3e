// CPU stand-in for kernels-src/common.cuh and the CUDA builtins kernels-src/allreduce.cu uses, for
// tools/allreduce_cpu_emu.py: one rank is one process; its blocks run one after another, each block's threads are
// std::threads meeting at a std::barrier (__syncthreads); `__shared__` variables are process statics (one block at a
// time per process). Not a CUDA implementation: enough to run that one source and check its logic.
#pragma once
#include "cuda_bf16.h"  // tools/cpu_emu_mma's stand-in, copied beside this file by tools/allreduce_cpu_emu.py
#include <stdint.h>
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstring>
#define KERN_DEV inline
#define __global__
#define __device__
#define __forceinline__
#define __launch_bounds__(...)
#define __restrict__
#define __shared__ static
struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct uint4 { uint32_t x, y, z, w; };
struct float2 { float x, y; };
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) { return {b}; }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return {__bfloat162float(h.x), __bfloat162float(h.y)}; }
extern thread_local dim3 threadIdx;
extern dim3 blockIdx, blockDim, gridDim;
extern std::barrier<>* g_block_barrier;
using std::max;
using std::min;
inline void __syncthreads() { g_block_barrier->arrive_and_wait(); }
KERN_DEV void kern_pdl_wait() {}
KERN_DEV float bf2f(__nv_bfloat16 x) { return __bfloat162float(x); }
KERN_DEV void load8_vec(const __nv_bfloat16* p, float (&v)[8]) {
  for (int i = 0; i < 8; ++i) v[i] = __bfloat162float(p[i]);
}
KERN_DEV void store8_vec(__nv_bfloat16* p, const float (&v)[8]) {
  for (int i = 0; i < 8; ++i) p[i] = __float2bfloat16_rn(v[i]);
}
inline int atomicMin(int* p, int v) {
  std::atomic_ref<int> a(*p);
  int old = a.load();
  while (v < old && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long expect, unsigned long long v) {
  std::atomic_ref<unsigned long long>(*p).compare_exchange_strong(expect, v);
  return expect;
}
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
void __nanosleep(unsigned ns);
