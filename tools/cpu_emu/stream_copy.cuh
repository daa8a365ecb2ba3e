// CPU stand-in for kernels-src/stream_copy.cuh (tools/decode_attention_cpu_emu.py): the predicated cp.async and
// cp.async.wait_group 1 on attn_emu.h's queued copies.
#pragma once
#include "common.cuh"

KERN_DEV void cp_async16_if(void* smem, const void* gmem, int src_bytes, bool pred) {
  if (pred) cp_async16(smem, gmem, src_bytes);
}
KERN_DEV void cp_async_wait_1() { emu_wait_group(1); }
// movmatrix.sync.aligned.m8n8.trans.b16: lane 4 r + c receives (row 2 c, col r) and (row 2 c + 1, col r) of the
// warp's matrix, whose (row i, cols 2 j, 2 j + 1) lane 4 i + j holds.
KERN_DEV uint32_t movmatrix_trans(uint32_t x) {
  const int lane = threadIdx.x & 31, r = lane / 4, c = lane % 4;
  const uint32_t w0 = shfl_at(x, 4 * (2 * c) + r / 2), w1 = shfl_at(x, 4 * (2 * c + 1) + r / 2);
  const uint32_t e0 = (r & 1) ? w0 >> 16 : w0 & 0xffffu, e1 = (r & 1) ? w1 >> 16 : w1 & 0xffffu;
  return e0 | (e1 << 16);
}
