// CPU stand-in for kernels-src/stream_copy.cuh (tools/decode_attention_cpu_emu.py): the predicated cp.async and
// cp.async.wait_group 1 on attn_emu.h's queued copies.
#pragma once
#include "common.cuh"

KERN_DEV void cp_async16_if(void* smem, const void* gmem, int src_bytes, bool pred) {
  if (pred) cp_async16(smem, gmem, src_bytes);
}
KERN_DEV void cp_async_wait_1() { emu_wait_group(1); }
