// Peer barrier gate (docs/runtime.md "Multi-GPU"): every member of a topology group waits until all
// members reached the same barrier, through plain loads and stores to peer memory (no NCCL, no
// multicast: the SASS holds STG.E.STRONG.SYS / LDG.E.STRONG.SYS only).
//
// Memory: each rank exports `flags`, u64[size]; slot m of rank r's flags holds the last barrier epoch
// member m announced to r. `peers` (a peer table, u64[size]) holds every member's `flags` address as
// mapped in this process (this rank's own entry is its own address). `epoch` (u64[1], this rank's)
// counts the barriers this rank passed, so graph replays advance it on the device.
//
// One block of 32 threads; thread m < size handles member m:
//   1. e = epoch + 1
//   2. release store (st.release.sys): member m's flags[rank] = e
//   3. acquire spin (ld.acquire.sys) on this rank's flags[m] >= e, reading %globaltimer; past
//      `timeout_ns` the thread gives up and records member m as missing
//   4. thread 0 writes status[0] = 0 (passed) or 1 (timed out), status[1] = the lowest missing member
//      (-1 when passed), and epoch = e.
// After a timeout the epochs of the ranks disagree: the caller treats it as fatal for the group.

#include "peer_mem.cuh"

extern "C" __global__ void __launch_bounds__(32) kern_peer_barrier(
    const unsigned long long* __restrict__ peers,  // u64[size]: each member's flags address
    int rank, int size,
    unsigned long long* __restrict__ epoch,  // u64[1]: barriers this rank passed
    int* __restrict__ status,                // i32[2]: {0 passed | 1 timeout, lowest missing member | -1}
    long long timeout_ns) {
  __shared__ int missing;
  const int m = threadIdx.x;
  if (m == 0) missing = size;
  __syncthreads();
  const unsigned long long e = *((volatile unsigned long long*)epoch) + 1ull;
  if (m < size) {
    unsigned long long* theirs = reinterpret_cast<unsigned long long*>(peers[m]);
    store_release_sys(theirs + rank, e);
    const unsigned long long* mine = reinterpret_cast<const unsigned long long*>(peers[rank]);
    const unsigned long long start = global_ns();
    while (load_acquire_sys(mine + m) < e) {
      if ((long long)(global_ns() - start) > timeout_ns) {
        atomicMin(&missing, m);
        break;
      }
      __nanosleep(64);
    }
  }
  __syncthreads();
  if (m == 0) {
    const bool passed = missing == size;
    status[0] = passed ? 0 : 1;
    status[1] = passed ? -1 : missing;
    *epoch = e;
  }
}
