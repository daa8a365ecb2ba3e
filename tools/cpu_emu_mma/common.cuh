// CPU stand-in for kernels-src/common.cuh and the CUDA builtins kernels-src/gemv_mma.cu uses, for
// tools/gemv_mma_cpu_emu.py: every GPU thread of a cluster is a std::thread; __syncthreads is the block's
// std::barrier, warp shuffles go through a per-warp exchange and barrier, shared memory is per-block storage
// (EmuBlock), loads are plain reads. Not a CUDA implementation: enough to run that one source and check its logic.
#pragma once
#include "cuda_bf16.h"
#include <stdint.h>
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>
#define KERN_DEV inline
#define __global__
#define __device__
#define __forceinline__
#define __launch_bounds__(...)
#define __restrict__
struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct uint4 { uint32_t x, y, z, w; };
struct float2 { float x, y; };
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
using std::max;
using std::min;

// One block of a cluster: its barriers, its shared memory, its warps' exchange.
struct EmuBlock {
  explicit EmuBlock(int threads, size_t dyn_bytes, size_t static_bytes)
      : bar(threads), dyn((dyn_bytes + 15) / 16 + 1), stat((static_bytes + 15) / 16), dyn_bytes(dyn_bytes) {
    for (int w = 0; w < threads / 32; ++w) warp_bar.emplace_back(new std::barrier<>(32));
    xch.resize(threads / 32 * 32 * 8);
  }
  std::barrier<> bar;
  std::vector<uint4> dyn, stat;
  size_t dyn_bytes;
  std::vector<std::unique_ptr<std::barrier<>>> warp_bar;
  std::vector<uint32_t> xch;  // [warp][lane][8] words
  int rank = 0;
};
struct EmuCluster {
  std::unique_ptr<std::barrier<>> bar;
  std::vector<EmuBlock*> blocks;
  int id = 0, count = 1;
};
extern thread_local dim3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
extern thread_local EmuBlock* t_block;
extern thread_local EmuCluster* t_cluster;

inline void __syncthreads() { t_block->bar.arrive_and_wait(); }
inline void emu_warp_sync() { t_block->warp_bar[threadIdx.x >> 5]->arrive_and_wait(); }
inline uint32_t* emu_xch(int lane) { return &t_block->xch[((threadIdx.x >> 5) * 32 + lane) * 8]; }
inline float __shfl_xor_sync(unsigned, float v, int o) {
  const int lane = threadIdx.x & 31;
  memcpy(emu_xch(lane), &v, 4);
  emu_warp_sync();
  float got;
  memcpy(&got, emu_xch(lane ^ o), 4);
  emu_warp_sync();
  return got;
}

KERN_DEV float bf2f(__nv_bfloat16 x) { return __bfloat162float(x); }
KERN_DEV __nv_bfloat16 f2bf(float x) { return __float2bfloat16_rn(x); }
KERN_DEV float round_bf(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
KERN_DEV float silu_bf(float g) { return round_bf(g / (1.0f + expf(-g))); }  // kernels-src/common.cuh
KERN_DEV bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
KERN_DEV uint32_t dynamic_smem_bytes() { return (uint32_t)t_block->dyn_bytes; }
KERN_DEV void kern_pdl_wait() {}
KERN_DEV void kern_pdl_launch_dependents() {}
KERN_DEV void cp_async16(void* smem, const void* gmem, int src_bytes) {
  if (src_bytes) memcpy(smem, gmem, 16); else memset(smem, 0, 16);
}
KERN_DEV void cp_async_commit() {}
KERN_DEV void cp_async_wait_all() {}
template <typename T> inline T __ldcg(const T* p) { return *p; }
template <typename T> inline T __ldg(const T* p) { return *p; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
KERN_DEV float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
