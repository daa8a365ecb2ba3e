// CPU stand-in for kernels-src/gemv_mma.cuh (tools/gemv_mma_cpu_emu.py): weight loads are plain reads, the cluster
// is an EmuCluster of EmuBlocks (one std::barrier for the cluster barrier; a peer's shared memory at the same
// offset), and mma.sync m16n8k16 is computed from the 32 lanes' fragments as the PTX ISA lays them out.
#pragma once
#include "common.cuh"

#define KERN_MMA_DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(t_block->dyn.data())
#define KERN_MMA_STATIC_SHARED(T, name) \
  static_assert(sizeof(T) <= 65536, "static shared storage"); \
  T& name = *reinterpret_cast<T*>(t_block->stat.data())

KERN_DEV uint64_t weight_policy() { return 0; }
KERN_DEV uint4 ldg_weight(const __nv_bfloat16* p, uint64_t) { uint4 v; memcpy(&v, p, 16); return v; }
KERN_DEV uint4 ldg_weight_early(const __nv_bfloat16* p, uint64_t) { uint4 v; memcpy(&v, p, 16); return v; }

KERN_DEV uint32_t cluster_nranks() { return (uint32_t)t_cluster->blocks.size(); }
KERN_DEV uint32_t cluster_rank() { return (uint32_t)t_block->rank; }
KERN_DEV uint32_t cluster_index() { return (uint32_t)t_cluster->id; }
KERN_DEV uint32_t cluster_count() { return (uint32_t)t_cluster->count; }
KERN_DEV void cluster_sync(int nranks) {
  if (nranks == 1) { __syncthreads(); return; }
  t_cluster->bar->arrive_and_wait();
}
// A peer's float at the same offset of the same region (static or dynamic shared memory) as `local`.
KERN_DEV float ld_rank_f32(const float* local, uint32_t rank, int) {
  const char* p = reinterpret_cast<const char*>(local);
  const char* stat = reinterpret_cast<const char*>(t_block->stat.data());
  const char* dyn = reinterpret_cast<const char*>(t_block->dyn.data());
  const bool in_dyn = p >= dyn && p < dyn + t_block->dyn.size() * sizeof(uint4);
  const char* peer = in_dyn ? reinterpret_cast<const char*>(t_cluster->blocks[rank]->dyn.data()) + (p - dyn)
                            : reinterpret_cast<const char*>(t_cluster->blocks[rank]->stat.data()) + (p - stat);
  float v;
  memcpy(&v, peer, 4);
  return v;
}

inline float emu_bf(uint32_t reg, int half) { return __uint_as_float(half ? (reg & 0xffff0000u) : (reg << 16)); }
// D += A B for the warp: lane (g, t) holds A {a0: (g, 2t..2t+1), a1: (g+8, 2t..), a2: (g, 2t+8..), a3: (g+8, 2t+8..)},
// B {b0: k 2t..2t+1 of column g, b1: k 2t+8..}, D {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}; low half = lower index.
KERN_DEV void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  uint32_t* mine = emu_xch(lane);
  mine[0] = a0; mine[1] = a1; mine[2] = a2; mine[3] = a3; mine[4] = b0; mine[5] = b1;
  emu_warp_sync();
  auto A = [&](int r, int k) {  // element (row r, k) of the 16 x 16 A
    const uint32_t* src = emu_xch((r & 7) * 4 + ((k & 7) >> 1));
    return emu_bf(src[(r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k & 1);
  };
  auto B = [&](int k, int c) {  // element (k, column c) of the 16 x 8 B
    const uint32_t* src = emu_xch(c * 4 + ((k & 7) >> 1));
    return emu_bf(src[4 + (k >= 8 ? 1 : 0)], k & 1);
  };
  float out[4];
  for (int i = 0; i < 4; ++i) {
    const int r = g + (i >= 2 ? 8 : 0), c = 2 * t + (i & 1);
    float s = 0.0f;
    for (int k = 0; k < 16; ++k) s += A(r, k) * B(k, c);
    out[i] = d[i] + s;
  }
  emu_warp_sync();
  for (int i = 0; i < 4; ++i) d[i] = out[i];
}
