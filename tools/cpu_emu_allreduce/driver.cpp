// Host driver of tools/allreduce_cpu_emu.py: SIZE simulated ranks of kernels-src/allreduce.cu (copied next to this
// directory's stand-ins), each a forked process, over one shared mapping that holds every rank's exported `ar`
// buffer (at the same address in every process, as a peer table needs), the ranks' status words and outputs.
// Each rank runs CALLS launches in a row (its blocks one after another, THREADS std::threads each), sleeping a
// seeded random 0..DELAY_US microseconds before each, and copies each launch's output out.
// Usage: driver MODE SIZE BLOCKS THREADS COUNT CAPACITY CALLS TIMEOUT_NS ABSENT DELAY_US SEED DIR [ROWS VOCAB SLICE]
//   MODE 0: kern_allreduce_bf16, 1: kern_allreduce_add_bf16, 2: kern_allgather_bf16 (with ROWS VOCAB SLICE; COUNT
//   is then ROWS * SLICE, the elements of a rank's slice, and OUT = ROWS * VOCAB; else OUT = COUNT)
//   DIR/x.bin    bf16 [CALLS][SIZE][COUNT]  every rank's partial (slice) of every call
//   DIR/res.bin  bf16 [SIZE][COUNT]         MODE 1: every rank's residual before the first call
// writes DIR/out.bin (bf16 [CALLS][SIZE][OUT]: out, or the residual after each call; a gather's out starts as
// 0xffff everywhere, so a column nobody wrote shows), DIR/status.bin (i32 [SIZE][4]) and DIR/ns.bin
// (u64 [CALLS][SIZE]: each launch's wall time). ABSENT: a rank that never runs (-1).
#include "allreduce.cu"
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

thread_local dim3 threadIdx;
dim3 blockIdx, blockDim, gridDim;
std::barrier<>* g_block_barrier;
void __nanosleep(unsigned ns) { std::this_thread::sleep_for(std::chrono::nanoseconds(ns * 64)); }

static std::vector<uint16_t> slurp(const std::string& path, size_t n) {
  std::vector<uint16_t> d(n);
  FILE* f = fopen(path.c_str(), "rb");
  if (!f || fread(d.data(), 2, n, f) != n) { fprintf(stderr, "cannot read %zu bf16 from %s\n", n, path.c_str()); exit(2); }
  fclose(f);
  return d;
}

static void spit(const std::string& path, const void* p, size_t bytes) {
  FILE* f = fopen(path.c_str(), "wb");
  if (!f || fwrite(p, 1, bytes, f) != bytes) { perror(path.c_str()); exit(2); }
  fclose(f);
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? atoi(argv[1]) : -1;
  if (!((argc == 13 && (mode == 0 || mode == 1)) || (argc == 16 && mode == 2))) {
    fprintf(stderr, "usage: driver MODE SIZE BLOCKS THREADS COUNT CAPACITY CALLS TIMEOUT_NS ABSENT DELAY_US SEED DIR "
                    "[ROWS VOCAB SLICE]\n");
    return 2;
  }
  const bool add = mode == 1, gather = mode == 2;
  const int rows = gather ? atoi(argv[13]) : 0, vocab = gather ? atoi(argv[14]) : 0;
  const int slice = gather ? atoi(argv[15]) : 0;
  const int size = atoi(argv[2]), blocks = atoi(argv[3]), threads = atoi(argv[4]), count = atoi(argv[5]);
  const int capacity = atoi(argv[6]), calls = atoi(argv[7]);
  const long long timeout_ns = atoll(argv[8]);
  const int absent = atoi(argv[9]), delay_us = atoi(argv[10]);
  const unsigned seed = (unsigned)atoi(argv[11]);
  const std::string dir = argv[12];
  const size_t n = (size_t)count > 0 ? (size_t)count : 0;
  const size_t on = gather ? (size_t)std::max(rows, 0) * (size_t)std::max(vocab, 0) : n;  // out elements
  std::vector<uint16_t> x = slurp(dir + "/x.bin", (size_t)calls * size * n);
  std::vector<uint16_t> res = add ? slurp(dir + "/res.bin", (size_t)size * n) : std::vector<uint16_t>();
  // the host side of the layout: what ar_data_offset computes on the device
  const size_t words = (size_t)(size + 1) * blocks + 1;
  const size_t data = (words * 8 + 255) / 256 * 256;
  const size_t ar_bytes = (data + (size_t)2 * size * capacity * 2 + 4095) / 4096 * 4096;
  const size_t out_bytes = (size_t)calls * size * on * 2 + 16;
  const size_t total = ar_bytes * size + (size_t)size * 16 + out_bytes + (size_t)calls * size * 8;
  char* shm = (char*)mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shm == MAP_FAILED) { perror("mmap"); return 2; }
  memset(shm, 0, total);
  int* status = (int*)(shm + ar_bytes * size);
  uint16_t* out = (uint16_t*)(shm + ar_bytes * size + size * 16);
  unsigned long long* ns = (unsigned long long*)((char*)out + out_bytes);
  std::vector<unsigned long long> peers(size);
  for (int r = 0; r < size; ++r) peers[r] = (unsigned long long)(shm + ar_bytes * r);
  std::vector<pid_t> kids;
  for (int rank = 0; rank < size; ++rank) {
    if (rank == absent) continue;
    const pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 2; }
    if (pid > 0) { kids.push_back(pid); continue; }
    std::mt19937 rng(seed * 977u + rank);
    std::vector<uint16_t> buf(on + 8, gather ? 0xffff : 0);  // out (sum, gather) or this rank's residual (add)
    if (add) std::copy(res.begin() + (size_t)rank * n, res.begin() + (size_t)(rank + 1) * n, buf.begin());
    for (int c = 0; c < calls; ++c) {
      if (delay_us) std::this_thread::sleep_for(std::chrono::microseconds(rng() % (delay_us + 1)));
      const __nv_bfloat16* xin = reinterpret_cast<const __nv_bfloat16*>(x.data() + ((size_t)c * size + rank) * n);
      __nv_bfloat16* dst = reinterpret_cast<__nv_bfloat16*>(buf.data());
      const unsigned long long t0 = global_ns();
      gridDim.x = blocks;
      blockDim.x = threads;
      for (int b = 0; b < blocks; ++b) {
        blockIdx.x = b;
        std::barrier<> bar(threads);
        g_block_barrier = &bar;
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t)
          ts.emplace_back([&, t] {
            threadIdx.x = t;
            if (gather) kern_allgather_bf16(peers.data(), rank, size, xin, dst, rows, vocab, slice, capacity, blocks,
                                            status + 4 * rank, timeout_ns);
            else if (add) kern_allreduce_add_bf16(peers.data(), rank, size, xin, dst, count, capacity, blocks,
                                             status + 4 * rank, timeout_ns);
            else kern_allreduce_bf16(peers.data(), rank, size, xin, dst, count, capacity, blocks, status + 4 * rank,
                                     timeout_ns);
          });
        for (auto& t : ts) t.join();
      }
      ns[(size_t)c * size + rank] = global_ns() - t0;
      memcpy(out + ((size_t)c * size + rank) * on, buf.data(), on * 2);
    }
    _exit(0);
  }
  int failed = 0;
  for (pid_t pid : kids) {
    int st = 0;
    waitpid(pid, &st, 0);
    failed |= !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  spit(dir + "/out.bin", out, (size_t)calls * size * on * 2);
  spit(dir + "/status.bin", status, (size_t)size * 16);
  spit(dir + "/ns.bin", ns, (size_t)calls * size * 8);
  return failed ? 3 : 0;
}
