// Copy helpers of kern_attn_decode_partial_stream (attention_decode.cu): a predicated cp.async and a wait that
// leaves the newest group in flight, the entry's own PTX. Header only; tools/cpu_emu/stream_copy.cuh is its CPU
// stand-in (tools/decode_attention_cpu_emu.py).
#pragma once
#include "common.cuh"

// cp_async16 (common.cuh) issued only where `pred` holds (a predicated instruction, no branch).
KERN_DEV void cp_async16_if(void* smem, const void* gmem, int src_bytes, bool pred) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n @p cp.async.cg.shared.global [%0], [%1], 16, %2;\n}\n" ::"r"(a),
        "l"(gmem), "r"(src_bytes), "r"((int)pred)
        : "memory");
}

KERN_DEV void cp_async_wait_1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

// movmatrix.sync.aligned.m8n8.trans.b16: the warp's 8 x 8 matrix of 16-bit elements in the mma fragment layout
// (lane 4 r + c holds row r, cols 2 c and 2 c + 1, the first in the low half), transposed in the same layout.
KERN_DEV uint32_t movmatrix_trans(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}
