// Step-boundary kernels (contract: docs/kernels-step.md).
//
// kern_decode_advance runs last in the decode program: it turns this step's greedy result into the next
// step's inputs ON THE DEVICE, so consecutive decode steps need no host round trip (sync -> readback ->
// input writes -> launch). For every sequence s it reads next_token[s] and the position just processed,
// p = positions[s], and writes the inputs of position p + 1:
//     token_ids[s] = next_token[s]            positions[s] = p + 1          seq_lens[s] = p + 2
//     slot_mapping[s] = block_table[s, (p+1) / page_tokens] * page_tokens + (p+1) % page_tokens
// and stores the token into a ring the host reads without a copy (a host-mapped output buffer):
//     token_ring[s, (p + 1) % ring_len] = next_token[s]
// A position outside [0, max_pos), a page index past bt_stride, or a negative page id gives slot -1 (the
// KV write of kern_qk_norm_rope_kv skips it). ring_len <= 0 skips the ring store. It starts with
// griddepcontrol.wait, then launch_dependents, so it may be launched with PDL after any kernel.
//
// kern_decode_advance_packed is the same step after the sampler (kern_sample_bf16, sample.cu): it reads the
// token from sample_token (int32) and its logprob from sample_logprob (f32), and writes next_token[s] and the
// ring entry as one packed int64: bits 0..31 the token id, bits 32..63 the f32 logprob's bit pattern (8 bytes
// per row per step for the host to read). token_ids / positions / seq_lens / slot_mapping as above.
//
// kern_sample_inputs_init (the manifest's `load` program) gives `rows` rows of the sampler's inputs their
// neutral values: params = the greedy row (temperature 0, top_k 0, top_p 1, min_p 0, repetition 1, presence
// 0, frequency 0, seed 0), history empty (tokens -1, counts 0). A caller that never writes them decodes
// greedily, as with the argmax.
//
// kern_spin_ns busy-waits (one thread) until `nanoseconds` have passed on the global timer (capped at one
// second). Benchmarks launch it to hold the stream while the host enqueues a batch of launches, so
// per-launch event timings do not include host launch latency. Not used by any program.
#include <stdint.h>

#include "common.cuh"

// One sequence's step: token `tok` (already in the int32 range the caller wrote) into the next step's inputs,
// `ring_value` into the ring. Shared by both entries, so their inputs and slots agree bit for bit.
KERN_DEV void advance_row(int s, int64_t tok, int64_t ring_value, int32_t* __restrict__ token_ids,
                          int32_t* __restrict__ positions, int32_t* __restrict__ seq_lens,
                          int32_t* __restrict__ slot_mapping, const int32_t* __restrict__ block_table,
                          int64_t* __restrict__ token_ring, int32_t page_tokens, int32_t bt_stride, int32_t max_pos,
                          int32_t ring_len) {
    const int64_t int32_max = 2147483647;
    const int64_t p = (int64_t)positions[s] + 1;  // the position the next step processes
    if (ring_len > 0 && p >= 0) token_ring[(int64_t)s * ring_len + p % ring_len] = ring_value;
    int32_t slot = -1;
    if (page_tokens > 0 && p >= 0 && p < max_pos) {
        const int64_t idx = p / page_tokens;
        if (idx < bt_stride) {
            const int64_t page = block_table[(int64_t)s * bt_stride + idx];
            const int64_t full = page * page_tokens + p % page_tokens;
            if (page >= 0 && full <= int32_max) slot = (int32_t)full;
        }
    }
    token_ids[s] = (int32_t)tok;
    positions[s] = (int32_t)(p < int32_max ? p : int32_max);
    seq_lens[s] = (int32_t)(p + 1 < int32_max ? p + 1 : int32_max);
    slot_mapping[s] = slot;
}

extern "C" __global__ void kern_decode_advance(const int64_t* __restrict__ next_token,  // [n_seqs]
                                               int32_t* __restrict__ token_ids,         // [n_seqs]
                                               int32_t* __restrict__ positions,         // [n_seqs]
                                               int32_t* __restrict__ seq_lens,          // [n_seqs]
                                               int32_t* __restrict__ slot_mapping,      // [n_seqs]
                                               const int32_t* __restrict__ block_table, // [n_seqs, bt_stride]
                                               int64_t* __restrict__ token_ring,        // [n_seqs, ring_len]
                                               int32_t n_seqs, int32_t page_tokens, int32_t bt_stride,
                                               int32_t max_pos, int32_t ring_len) {
    kern_pdl_wait();  // PDL: nothing is read or written before the previous kernel has completed
    kern_pdl_launch_dependents();
    for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < n_seqs; s += gridDim.x * blockDim.x) {
        const int64_t tok = next_token[s];
        advance_row(s, tok, tok, token_ids, positions, seq_lens, slot_mapping, block_table, token_ring, page_tokens,
                    bt_stride, max_pos, ring_len);
    }
}

extern "C" __global__ void kern_decode_advance_packed(const int32_t* __restrict__ sample_token,  // [n_seqs]
                                                      const float* __restrict__ sample_logprob, // [n_seqs]
                                                      int64_t* __restrict__ next_token,         // [n_seqs]
                                                      int32_t* __restrict__ token_ids,          // [n_seqs]
                                                      int32_t* __restrict__ positions,          // [n_seqs]
                                                      int32_t* __restrict__ seq_lens,           // [n_seqs]
                                                      int32_t* __restrict__ slot_mapping,       // [n_seqs]
                                                      const int32_t* __restrict__ block_table,  // [n_seqs, bt_stride]
                                                      int64_t* __restrict__ token_ring,         // [n_seqs, ring_len]
                                                      int32_t n_seqs, int32_t page_tokens, int32_t bt_stride,
                                                      int32_t max_pos, int32_t ring_len) {
    kern_pdl_wait();  // PDL: nothing is read or written before the previous kernel has completed
    kern_pdl_launch_dependents();
    for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < n_seqs; s += gridDim.x * blockDim.x) {
        const int32_t tok = sample_token[s];
        const uint64_t packed = (uint64_t)(uint32_t)tok | ((uint64_t)__float_as_uint(sample_logprob[s]) << 32);
        next_token[s] = (int64_t)packed;
        advance_row(s, tok, (int64_t)packed, token_ids, positions, seq_lens, slot_mapping, block_table, token_ring,
                    page_tokens, bt_stride, max_pos, ring_len);
    }
}

// grid any, block any (threads stride over rows * max(hist_cap, 12) elements). SAMPLE_PARAM_WORDS = 12 words a
// row: the greedy row of kern_run.sampling.pack_params(SamplingParams()).
extern "C" __global__ void kern_sample_inputs_init(uint32_t* __restrict__ params,      // [rows, 12]
                                                   int32_t* __restrict__ hist_tokens,  // [rows, hist_cap]
                                                   int32_t* __restrict__ hist_counts,  // [rows, hist_cap]
                                                   int32_t rows, int32_t hist_cap) {
    kern_pdl_wait();
    kern_pdl_launch_dependents();
    const uint32_t one = 0x3f800000u;  // 1.0f
    // temperature, top_k, top_p, min_p, repetition, presence, frequency, reserved, seed lo, seed hi, reserved x 2
    const uint32_t greedy[12] = {0u, 0u, one, 0u, one, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (rows <= 0) return;
    for (int64_t i = first; i < (int64_t)rows * 12; i += stride) params[i] = greedy[i % 12];
    if (hist_cap <= 0) return;
    for (int64_t i = first; i < (int64_t)rows * hist_cap; i += stride) {
        hist_tokens[i] = -1;
        hist_counts[i] = 0;
    }
}

extern "C" __global__ void kern_spin_ns(int64_t nanoseconds) {
    if (threadIdx.x != 0 || blockIdx.x != 0 || nanoseconds <= 0) return;
    const uint64_t limit = (uint64_t)(nanoseconds < 1000000000LL ? nanoseconds : 1000000000LL);
    uint64_t start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(500);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < limit);
}
