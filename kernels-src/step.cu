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
// kern_spin_ns busy-waits (one thread) until `nanoseconds` have passed on the global timer (capped at one
// second). Benchmarks launch it to hold the stream while the host enqueues a batch of launches, so
// per-launch event timings do not include host launch latency. Not used by any program.
#include <stdint.h>

#include "common.cuh"

extern "C" __global__ void kern_decode_advance(const int64_t* __restrict__ next_token,  // [n_seqs]
                                               int32_t* __restrict__ token_ids,         // [n_seqs]
                                               int32_t* __restrict__ positions,         // [n_seqs]
                                               int32_t* __restrict__ seq_lens,          // [n_seqs]
                                               int32_t* __restrict__ slot_mapping,      // [n_seqs]
                                               const int32_t* __restrict__ block_table, // [n_seqs, bt_stride]
                                               int64_t* __restrict__ token_ring,        // [n_seqs, ring_len]
                                               int32_t n_seqs, int32_t page_tokens, int32_t bt_stride,
                                               int32_t max_pos, int32_t ring_len) {
    const int64_t int32_max = 2147483647;
    kern_pdl_wait();  // PDL: nothing is read or written before the previous kernel has completed
    kern_pdl_launch_dependents();
    for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < n_seqs; s += gridDim.x * blockDim.x) {
        const int64_t tok = next_token[s];
        const int64_t p = (int64_t)positions[s] + 1;  // the position the next step processes
        if (ring_len > 0 && p >= 0) token_ring[(int64_t)s * ring_len + p % ring_len] = tok;
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
