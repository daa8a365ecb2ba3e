// Kernels for kern-runtime's pool GPU tests. Build: nvcc -cubin -arch=sm_90 -O2 pool.cu -o pool.cubin
// Byte pattern of state `tag` at position `pos`, byte j, written with `salt` (tests compute it in numpy):
//   (pos * 131 + j * 7 + (j >> 8) * 13 + tag * 29 + salt * 17) & 0xff
#include <stdint.h>

__device__ __forceinline__ uint8_t pat(int tag, int pos, int j, int salt) {
    return (uint8_t)((pos * 131 + j * 7 + (j >> 8) * 13 + tag * 29 + salt * 17) & 0xff);
}

// One block per token i < n: paged states a and b get the pattern of positions[i] at slot_mapping[i];
// the token at its row's last position (seq_lens[row] - 1) writes per-seq state s at seq_slots[row].
extern "C" __global__ void kern_pool_write(uint8_t* a, uint8_t* b, uint8_t* s, const int32_t* slot_mapping,
                                           const int32_t* positions, const int32_t* token_rows,
                                           const int32_t* seq_lens, const int32_t* seq_slots, const int32_t* salt,
                                           int32_t n, int32_t bpt, int32_t bps) {
    int i = blockIdx.x;
    if (i >= n) return;
    long slot = slot_mapping[i];
    int pos = positions[i], row = token_rows[i], sl = salt[0];
    for (int j = threadIdx.x; j < bpt; j += blockDim.x) {
        a[slot * bpt + j] = pat(0, pos, j, sl);
        b[slot * bpt + j] = pat(1, pos, j, sl);
    }
    if (pos == seq_lens[row] - 1) {
        long q = seq_slots[row];
        for (int j = threadIdx.x; j < bps; j += blockDim.x) s[q * bps + j] = pat(2, pos, j, sl);
    }
}

// mismatches[r] = number of bytes of row r (positions < seq_lens[r] through block_table row r, and the
// per-seq slot seq_slots[r] as written at position seq_lens[r] - 1) that differ from the pattern.
// grid (rows, 32): blockIdx.y strides over positions.
extern "C" __global__ void kern_pool_check(const uint8_t* a, const uint8_t* b, const uint8_t* s,
                                           const int32_t* block_table, const int32_t* seq_lens,
                                           const int32_t* seq_slots, const int32_t* salt, int32_t* mismatches,
                                           int32_t width, int32_t page_tokens, int32_t bpt, int32_t bps) {
    int r = blockIdx.x, len = seq_lens[r], sl = salt[0];
    int bad = 0;
    for (int pos = blockIdx.y; pos < len; pos += gridDim.y) {
        long slot = (long)block_table[r * width + pos / page_tokens] * page_tokens + pos % page_tokens;
        for (int j = threadIdx.x; j < bpt; j += blockDim.x) {
            bad += a[slot * bpt + j] != pat(0, pos, j, sl);
            bad += b[slot * bpt + j] != pat(1, pos, j, sl);
        }
    }
    if (blockIdx.y == 0 && len > 0) {
        long q = seq_slots[r];
        for (int j = threadIdx.x; j < bps; j += blockDim.x) bad += s[q * bps + j] != pat(2, len - 1, j, sl);
    }
    if (bad) atomicAdd(&mismatches[r], bad);
}

// out[i] = 0 for i < n
extern "C" __global__ void kern_pool_zero_i32(int32_t* out, int32_t n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 0;
}
