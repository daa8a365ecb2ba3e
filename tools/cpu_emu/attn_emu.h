// CPU stand-ins, beyond tools/cpu_emu/common.cuh, for what the attention sources use (kernels-src/attention.cu,
// attention_decode.cu, prefill.cuh), for tools/decode_attention_cpu_emu.py: the warp-collective ldmatrix (x4,
// plain and .trans) and mma.sync.m16n8k16 (bf16 in, f32 accumulate), each lane posting its operands to a per-warp
// exchange and computing its own result registers from everyone's, as the PTX fragment layouts say; cp.async
// landing only when a group wait requires it (below); __syncwarp as the warp's
// barrier. The fragment layouts are checked by running kern_attn_prefill (whose GPU results are tested) through
// the same stand-ins. Not a CUDA implementation: no memory model, no timing.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#define __align__(n) __attribute__((aligned(n)))
#define __restrict__

struct float2 { float x, y; };
inline float2 make_float2(float a, float b) { return {a, b}; }
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 x) { return x.b; }
inline uint4 __ldcg(const uint4* p) { return *p; }
inline unsigned short __ldcg(const unsigned short* p) { return *p; }
inline unsigned int __ldcg(const unsigned int* p) { return *p; }
inline float __ldcg(const float* p) { return *p; }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }

inline void __syncwarp(unsigned = 0xffffffffu) { g_warp_barrier[threadIdx.x >> 5]->arrive_and_wait(); }

// cp.async at the latest moment the PTX allows: a copy is queued at issue (its global bytes read then: nothing
// writes them during a launch here), its group at commit, and groups land only in cp.async.wait_group N (all but
// the newest N committed groups) or wait_all, so code that reads a stage before waiting for it reads stale data.
struct EmuCopy { void* dst; uint4 v; };
extern thread_local std::vector<EmuCopy> t_copies_open;
extern thread_local std::deque<std::vector<EmuCopy>> t_copy_groups;
inline void cp_async16(void* smem, const void* gmem, int src_bytes) {
  EmuCopy c{smem, {0u, 0u, 0u, 0u}};
  if (src_bytes) memcpy(&c.v, gmem, 16);
  t_copies_open.push_back(c);
}
inline void cp_async_commit() { t_copy_groups.push_back(std::move(t_copies_open)); t_copies_open.clear(); }
inline void emu_wait_group(size_t newest_pending) {
  while (t_copy_groups.size() > newest_pending) {
    for (const EmuCopy& c : t_copy_groups.front()) memcpy(c.dst, &c.v, 16);
    t_copy_groups.pop_front();
  }
}
inline void cp_async_wait_all() { emu_wait_group(0); }

KERN_DEV void store8_vec(__nv_bfloat16* p, const float (&v)[8]) { for (int i = 0; i < 8; ++i) p[i] = f2bf(v[i]); }

// Per-warp exchange for the collective stand-ins: 10 words per lane (mma: a0..a3, b0, b1, c0..c3).
extern uint32_t g_frag_x[32][32][10];

inline float emu_bf(uint32_t word, int half) { return __uint_as_float(half ? (word & 0xffff0000u) : (word << 16)); }

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8m..8m+7 give the row addresses of matrix m; lane t
// receives, of matrix m, elements (row t/4, cols 2(t%4), 2(t%4)+1) (.trans: rows 2(t%4), 2(t%4)+1 of col t/4), the
// first in the low half.
inline void emu_ldsm(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const void* p, bool trans) {
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  g_warp_x[w][lane] = (uint64_t)(uintptr_t)p;
  g_warp_barrier[w]->arrive_and_wait();
  uint32_t r[4];
  for (int m = 0; m < 4; ++m) {
    uint32_t e[2];
    for (int h = 0; h < 2; ++h) {
      const int row = trans ? 2 * (lane % 4) + h : lane / 4, col = trans ? lane / 4 : 2 * (lane % 4) + h;
      e[h] = reinterpret_cast<const uint16_t*>((uintptr_t)g_warp_x[w][8 * m + row])[col];
    }
    r[m] = e[0] | (e[1] << 16);
  }
  g_warp_barrier[w]->arrive_and_wait();
  r0 = r[0]; r1 = r[1]; r2 = r[2]; r3 = r[3];
}
KERN_DEV void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const void* p) { emu_ldsm(r0, r1, r2, r3, p, false); }
KERN_DEV void ldsm_x4_trans(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const void* p) { emu_ldsm(r0, r1, r2, r3, p, true); }

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, D = A B + C: lane L = 4 gid + tig holds A (a0: row gid, cols
// 2tig, 2tig+1; a1: row gid + 8; a2: cols + 8; a3: both), B (b0: rows 2tig, 2tig+1 of col gid; b1: rows + 8), C / D
// (c0, c1: row gid, cols 2tig, 2tig+1; c2, c3: row gid + 8). Sums in f32, k ascending.
KERN_DEV void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint32_t* mine = g_frag_x[w][lane];
  mine[0] = a0; mine[1] = a1; mine[2] = a2; mine[3] = a3; mine[4] = b0; mine[5] = b1;
  for (int i = 0; i < 4; ++i) mine[6 + i] = __float_as_uint(c[i]);
  g_warp_barrier[w]->arrive_and_wait();
  const int gid = lane / 4, tig = lane % 4;
  float d[4];
  for (int i = 0; i < 4; ++i) {
    const int row = gid + (i >= 2 ? 8 : 0), col = 2 * tig + (i & 1);
    float acc = __uint_as_float(g_frag_x[w][(row % 8) * 4 + col / 2][6 + (row >= 8 ? 2 : 0) + col % 2]);
    for (int k = 0; k < 16; ++k) {
      const float a = emu_bf(g_frag_x[w][(row % 8) * 4 + (k % 8) / 2][(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k % 2);
      const float b = emu_bf(g_frag_x[w][col * 4 + (k % 8) / 2][4 + (k >= 8 ? 1 : 0)], k % 2);
      acc = fmaf(a, b, acc);
    }
    d[i] = acc;
  }
  g_warp_barrier[w]->arrive_and_wait();
  for (int i = 0; i < 4; ++i) c[i] = d[i];
}

// ex2.approx.ftz.f32: 2^x, results below 2^-126 flushed to zero
KERN_DEV float pf_ex2(float x) {
  const float y = exp2f(x);
  return y < 1.17549435e-38f ? 0.0f : y;
}
