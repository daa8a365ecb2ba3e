// One-shot all-reduce of bf16 over peer memory (docs/runtime.md "One-shot all-reduce"): for the small messages
// of a tensor-parallel decode step (2 x hidden x 2 bytes per layer), where NCCL's protocol costs more than the
// bytes. No NCCL, no multicast: plain stores to peers' memory, a flag handshake bounded by %globaltimer (as
// peer_barrier.cu), then a local sum.
//
// Memory. Every rank exports one buffer `ar` (a peer table `peers`, u64[size], holds every member's `ar` address as
// mapped in this process, this rank's own entry its own address); with B = `blocks` (the grid, the same for every
// launch on the buffer) and C = `capacity` elements:
//   flags   u64[size][B]         at byte 0: flags[s * B + b] = the last epoch rank s announced for block b
//   epochs  u64[B]               then: this rank's calls per block (advanced on the device, so graph replays work)
//   failed  u64[1]               then: nonzero once a wait of this rank timed out (later calls then wait no more)
//   data    bf16[2][size][C]     at ar_data_offset(size, B): slot (p, s) holds rank s's partial in calls of
//                                epoch parity p
// Two slots per source rank suffice: a rank writing a slot of parity p at epoch e + 2 has seen every peer's flag of
// epoch e + 1, which the peer raised only after its launch of epoch e (stream order) finished reading parity p.
//
// Block b owns elements [b * chunk, min(count, (b + 1) * chunk)), chunk = cdiv(count, 8 * B) * 8; per block:
//   1. e = epochs[b] + 1, parity p = e & 1
//   2. every thread stores its 16-byte vectors of x into slot (p, rank) of every member's `ar` (its own included),
//      then fence.sc.sys (its writes are visible system-wide before the flags below)
//   3. barrier; thread m < size: st.release.sys member m's flags[rank * B + b] = e
//   4. thread m < size: ld.acquire.sys spin on this rank's flags[m * B + b] >= e, reading %globaltimer; past
//      `timeout_ns` (or at once when `failed` is set) it gives up and records m as missing
//   5. barrier; every thread sums its vectors over s = 0 .. size-1 in that order, in float32, from the local slots
//      (p, s): acc = ((x_0 + x_1) + x_2) + ...; kern_allreduce_bf16 writes out = bf16(acc),
//      kern_allreduce_add_bf16 writes residual = bf16(float(residual) + acc)
//   6. thread 0: epochs[b] = e; on a timeout the first failing block of this rank sets `failed` and writes
//      status = {1, lowest missing rank, block, e} (host-mapped: readable without a copy). status is never cleared
//      here: the caller zeroes it and reads it after steps. A launch whose arguments cannot work (count not a
//      multiple of 8 or above capacity, a grid other than `blocks`, more members than threads) writes
//      status = {2, count, gridDim, size} and returns on every rank alike (nothing waits).
// After a timeout the epochs of the ranks disagree and the sums are garbage: the group is failed by the caller.

#include "common.cuh"
#include "peer_mem.cuh"

namespace {

constexpr int AR_FLAGS_ALIGN = 256;  // the data region starts on a 256-byte boundary

__device__ __forceinline__ unsigned long long ar_data_offset(int size, int blocks) {
  const unsigned long long words = (unsigned long long)(size + 1) * blocks + 1;  // flags, epochs, failed
  return (words * 8 + AR_FLAGS_ALIGN - 1) / AR_FLAGS_ALIGN * AR_FLAGS_ALIGN;
}

// The steps the one-shot collectives share (the all-reduce's 1, 3, 4 and 6; the all-gather's likewise): the
// per-block state in shared memory, the argument refusal, the epoch and slot addressing, the announce-and-wait
// handshake, the bookkeeping.
struct OneShotShared {
  unsigned long long epoch;
  int missing, skip_wait;
};

struct OneShot {
  unsigned long long* mine;    // this rank's buffer: flags, then epochs, then failed
  unsigned long long* epochs;
  unsigned long long* failed;
  unsigned long long e;        // this call's epoch for the block
  unsigned long long data;     // byte offset of the slots
  unsigned long long slot_bytes;
  unsigned long long parity;   // (e & 1) * size: the first slot of this call's parity
  int lo, hi;                  // the block's elements [lo, hi) of every slot
};

// status = {2, count, gridDim, size}, written once (block 0, thread 0) by a launch whose arguments cannot work
__device__ __forceinline__ void oneshot_refuse(int* __restrict__ status, int count, int size) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    status[1] = count;
    status[2] = (int)gridDim.x;
    status[3] = size;
    __threadfence_system();
    status[0] = 2;
  }
}

// step 1: this block's epoch (thread 0 reads it, then a barrier), its parity's slots and its chunk of `count`
__device__ __forceinline__ OneShot oneshot_begin(const unsigned long long* __restrict__ peers, int rank, int size,
                                                 int count, int capacity, int blocks, OneShotShared& sh) {
  OneShot o;
  o.mine = reinterpret_cast<unsigned long long*>(peers[rank]);
  o.epochs = o.mine + (unsigned long long)size * blocks;
  o.failed = o.epochs + blocks;
  if (threadIdx.x == 0) {
    sh.epoch = *reinterpret_cast<volatile unsigned long long*>(o.epochs + blockIdx.x) + 1ull;
    sh.missing = size;
    sh.skip_wait = *reinterpret_cast<volatile unsigned long long*>(o.failed) != 0ull;
  }
  __syncthreads();
  o.e = sh.epoch;
  o.data = ar_data_offset(size, blocks);
  o.slot_bytes = (unsigned long long)capacity * 2;
  o.parity = (o.e & 1ull) * size;
  const int chunk = (count + 8 * blocks - 1) / (8 * blocks) * 8;
  o.lo = (int)blockIdx.x * chunk;
  o.hi = min(count, o.lo + chunk);
  return o;
}

// member m's slot for this rank's data in this call
__device__ __forceinline__ char* oneshot_slot(const unsigned long long* __restrict__ peers, int m, int rank,
                                              const OneShot& o) {
  return reinterpret_cast<char*>(peers[m]) + o.data + (o.parity + rank) * o.slot_bytes;
}

// steps 2's fence and 3-4: the pushes visible system-wide, then thread m < size announces this epoch on member
// m and spins (acquire) on member m's announcement here, bounded by `timeout_ns` (none once `failed` is set);
// barriers before and after
__device__ __forceinline__ void oneshot_handshake(const unsigned long long* __restrict__ peers, int rank, int size,
                                                  int blocks, const OneShot& o, OneShotShared& sh,
                                                  long long timeout_ns) {
  fence_sys();
  __syncthreads();
  const int tid = threadIdx.x, b = blockIdx.x;
  if (tid < size) {
    store_release_sys(reinterpret_cast<unsigned long long*>(peers[tid]) + (unsigned long long)rank * blocks + b, o.e);
    const unsigned long long* flag = o.mine + (unsigned long long)tid * blocks + b;
    const unsigned long long start = global_ns();
    while (load_acquire_sys(flag) < o.e) {
      if (sh.skip_wait || (long long)(global_ns() - start) > timeout_ns) {
        atomicMin(&sh.missing, tid);
        break;
      }
      __nanosleep(32);
    }
  }
  __syncthreads();
}

// step 6: thread 0 stores the epoch; on a timeout the first failing block of this rank sets `failed` and writes
// status = {1, lowest missing rank, block, e}
__device__ __forceinline__ void oneshot_finish(int size, const OneShot& o, const OneShotShared& sh,
                                               int* __restrict__ status) {
  if (threadIdx.x == 0) {
    o.epochs[blockIdx.x] = o.e;
    if (sh.missing < size && atomicCAS(reinterpret_cast<unsigned long long*>(o.failed), 0ull, 1ull) == 0ull) {
      status[1] = sh.missing;
      status[2] = blockIdx.x;
      status[3] = (int)o.e;
      __threadfence_system();
      status[0] = 1;
    }
  }
}

__device__ __forceinline__ void add8(float (&acc)[8], uint4 raw) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    acc[2 * i] += f.x;
    acc[2 * i + 1] += f.y;
  }
}

template <bool ADD>
__device__ __forceinline__ void allreduce_block(const unsigned long long* __restrict__ peers, int rank, int size,
                                                const __nv_bfloat16* x, __nv_bfloat16* out, int count, int capacity,
                                                int blocks, int* __restrict__ status, long long timeout_ns) {
  __shared__ OneShotShared sh;
  kern_pdl_wait();  // a no-op unless launched with PDL: x is the previous kernel's output
  const int tid = threadIdx.x;
  if (count % 8 != 0 || count < 0 || count > capacity || (int)gridDim.x != blocks || size > (int)blockDim.x ||
      rank < 0 || rank >= size) {
    oneshot_refuse(status, count, size);
    return;
  }
  const OneShot o = oneshot_begin(peers, rank, size, count, capacity, blocks, sh);
  // 2. push this rank's partial into slot (p, rank) of every member
  for (int i = o.lo + 8 * tid; i < o.hi; i += 8 * (int)blockDim.x) {
    const uint4 v = *reinterpret_cast<const uint4*>(x + i);
    for (int m = 0; m < size; ++m) store16(oneshot_slot(peers, m, rank, o) + 2ull * i, v);
  }
  // 3. announce, 4. wait for every member's announcement of this epoch
  oneshot_handshake(peers, rank, size, blocks, o, sh, timeout_ns);
  // 5. the sum, rank order, float32
  const char* base = reinterpret_cast<const char*>(o.mine) + o.data + o.parity * o.slot_bytes;
  for (int i = o.lo + 8 * tid; i < o.hi; i += 8 * (int)blockDim.x) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int s = 0; s < size; ++s) add8(acc, load16_cg(base + s * o.slot_bytes + 2ull * i));
    if (ADD) {
      float r[8];
      load8_vec(out + i, r);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] = r[j] + acc[j];
    }
    store8_vec(out + i, acc);
  }
  // 6. bookkeeping
  oneshot_finish(size, o, sh, status);
}

}  // namespace

// out[0:count] = bf16(sum over ranks s = 0..size-1 of x_s[0:count]), float32 in rank order (out may be x).
extern "C" __global__ void __launch_bounds__(1024) kern_allreduce_bf16(
    const unsigned long long* __restrict__ peers, int rank, int size, const __nv_bfloat16* x, __nv_bfloat16* out,
    int count, int capacity, int blocks, int* __restrict__ status, long long timeout_ns) {
  allreduce_block<false>(peers, rank, size, x, out, count, capacity, blocks, status, timeout_ns);
}

// residual[0:count] = bf16(float(residual) + sum over ranks of x_s), the sum as kern_allreduce_bf16's: the
// all-reduce of a row-parallel projection's partials with the residual add after it, in one launch.
extern "C" __global__ void __launch_bounds__(1024) kern_allreduce_add_bf16(
    const unsigned long long* __restrict__ peers, int rank, int size, const __nv_bfloat16* x,
    __nv_bfloat16* residual, int count, int capacity, int blocks, int* __restrict__ status, long long timeout_ns) {
  allreduce_block<true>(peers, rank, size, x, residual, count, capacity, blocks, status, timeout_ns);
}

// ---------------------------------------------------------------------------------------------------------------
// One-shot all-gather of bf16 over peer memory: the vocabulary-parallel lm_head's logits (docs/runtime.md
// "One-shot all-gather"). Each rank holds x = its logits slice, bf16 [rows][slice] (the lm_head rows of its window
// of the vocabulary), and every rank ends with out = the full logits, bf16 [rows][vocab].
//
// The split: slice = the rank's row count (every rank alike; the builder picks cdiv(vocab, size) rounded up to 8);
// rank s owns the columns [min(s * slice, vocab), min((s + 1) * slice, vocab)) of out, and its window (the
// lm_head rows it computes) starts at w_s = min(s * slice, vocab - slice): the last rank's window ends at vocab,
// overlapping its neighbour's when vocab is not size * slice, so no rank ever computes a row past the vocabulary
// (no padding logits exist to be sampled). Only owned columns are written: each column of out by exactly one rank.
//
// Memory: a buffer `ag` per rank with the all-reduce's layout (flags u64[size][B], epochs u64[B], failed u64[1],
// at ar_data_offset(size, B) the slots bf16[2][size][C]); slot (p, s) holds rank s's x of calls of parity p,
// [rows][slice] packed (count = rows * slice <= C = capacity, a multiple of 8).
//
// Per block b (elements [b * chunk, min(count, (b + 1) * chunk)) of every slot, chunk = cdiv(count, 8 * B) * 8):
//   1.-4. as the all-reduce: push x's chunk into slot (p, rank) of every member (16-byte vectors, the tail of a
//      count not a multiple of 8 element by element), fence.sc.sys, barrier, release flags[rank * B + b] = e on
//      every member, acquire-spin on every member's flag with the %globaltimer bound (`failed`: no wait)
//   5. barrier; every thread copies its elements of chunk b of every local slot (p, s) to the columns rank s owns
//      (element i of slot s: row i / slice, column w_s + i % slice); vectors when vocab and slice are multiples
//      of 8, else element by element
//   6. as the all-reduce: epochs[b] = e; a timeout writes status = {1, lowest missing rank, block, e} once.
// Refused arguments (rows < 0, slice < 1 or above vocab, a last rank that would own nothing ((size - 1) * slice
// >= vocab), count above capacity, capacity not a multiple of 8, a grid other than `blocks`, more members than
// threads, a rank outside the group) write status = {2, count, gridDim, size} and return on every rank alike.
// The parity argument of the all-reduce holds unchanged (a slot of parity p is rewritten at epoch e + 2 only after
// every member's flag of e + 1, raised after its launch of epoch e finished reading it).

namespace {

__device__ __forceinline__ void gather_store(__nv_bfloat16* __restrict__ out, uint4 v, int i, int slice, int vocab,
                                             int window, int own_lo, int own_hi, int count, bool vec) {
  // elements i .. i+7 of one slot (i a multiple of 8, i < count) to their owned columns of out
  if (vec) {  // one row, all owned or none: slice, vocab and the owned bounds are multiples of 8
    const int row = i / slice, j = i - row * slice;
    if (j >= own_lo && j < own_hi) store16(out + (long long)row * vocab + window + j, v);
    return;
  }
  const unsigned int words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int k = 0; k < 8; ++k) {  // unrolled: the words stay in registers
    if (i + k >= count) break;
    const int row = (i + k) / slice, j = (i + k) - row * slice;
    if (j >= own_lo && j < own_hi)
      out[(long long)row * vocab + window + j] = __ushort_as_bfloat16((unsigned short)(words[k / 2] >> (16 * (k % 2))));
  }
}

__device__ __forceinline__ void allgather_block(const unsigned long long* __restrict__ peers, int rank, int size,
                                                const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ out,
                                                int rows, int vocab, int slice, int capacity, int blocks,
                                                int* __restrict__ status, long long timeout_ns) {
  __shared__ OneShotShared sh;
  kern_pdl_wait();  // a no-op unless launched with PDL: x is the previous kernel's output
  const int tid = threadIdx.x;
  const long long count64 = (long long)rows * (long long)slice;
  if (rows < 0 || slice < 1 || slice > vocab || (long long)(size - 1) * slice >= (long long)vocab ||
      count64 > (long long)capacity || capacity % 8 != 0 || (int)gridDim.x != blocks || size > (int)blockDim.x ||
      rank < 0 || rank >= size) {
    oneshot_refuse(status, (int)count64, size);
    return;
  }
  const int count = (int)count64;
  const OneShot o = oneshot_begin(peers, rank, size, count, capacity, blocks, sh);
  // 2. push this rank's slice into slot (p, rank) of every member
  for (int i = o.lo + 8 * tid; i < o.hi; i += 8 * (int)blockDim.x) {
    if (i + 8 <= count) {
      const uint4 v = *reinterpret_cast<const uint4*>(x + i);
      for (int m = 0; m < size; ++m) store16(oneshot_slot(peers, m, rank, o) + 2ull * i, v);
    } else {
      for (int m = 0; m < size; ++m) {
        __nv_bfloat16* slot = reinterpret_cast<__nv_bfloat16*>(oneshot_slot(peers, m, rank, o));
        for (int k = i; k < count; ++k) slot[k] = x[k];
      }
    }
  }
  // 3. announce, 4. wait for every member's announcement of this epoch
  oneshot_handshake(peers, rank, size, blocks, o, sh, timeout_ns);
  // 5. every member's chunk to the columns it owns
  const bool vec = slice % 8 == 0 && vocab % 8 == 0;
  const char* base = reinterpret_cast<const char*>(o.mine) + o.data + o.parity * o.slot_bytes;
  for (int s = 0; s < size; ++s) {
    const int window = min(s * slice, vocab - slice);
    const int own_lo = min(s * slice, vocab) - window, own_hi = min((s + 1) * slice, vocab) - window;
    for (int i = o.lo + 8 * tid; i < o.hi; i += 8 * (int)blockDim.x)
      gather_store(out, load16_cg(base + s * o.slot_bytes + 2ull * i), i, slice, vocab, window, own_lo, own_hi,
                   count, vec);
  }
  // 6. bookkeeping
  oneshot_finish(size, o, sh, status);
}

}  // namespace

// out[r][w_s + j] = x_s[r][j] for the columns rank s owns (see above): the full [rows][vocab] logits on every rank
// from every rank's [rows][slice] slice. out must not alias x.
extern "C" __global__ void __launch_bounds__(1024) kern_allgather_bf16(
    const unsigned long long* __restrict__ peers, int rank, int size, const __nv_bfloat16* x, __nv_bfloat16* out,
    int rows, int vocab, int slice, int capacity, int blocks, int* __restrict__ status, long long timeout_ns) {
  allgather_block(peers, rank, size, x, out, rows, vocab, slice, capacity, blocks, status, timeout_ns);
}
