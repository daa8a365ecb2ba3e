// Host driver of tools/sample_cpu_emu.py: runs kern_sample_{bf16,f32} (grid (cdiv(vocab, 8192), rows), block 512)
// then kern_sample_top_logprobs_* (n_top 5) over the inputs in DIR (logits.bin, params.bin, positions.bin,
// ht.bin, hc.bin), and writes DIR/out.bin (tokens, logprobs, stats, the logits after), DIR/top.bin (ids,
// logprobs) and DIR/tickets.bin (each row's ticket word after the launch, then the path that merged it: sample.cu's
// SAMPLE_PATH hook, then the exact-path tasks its helper blocks ran: SAMPLE_HELPED); built with -DSAMPLE_PROFILE,
// also DIR/prof.bin (the phase stamps, uint64 [rows, slices, 64]).
// The sampler's blocks start in the order ORDER picks: 0 row-major (slice 0 first), otherwise a permutation of every
// (slice, row) drawn from std::mt19937(ORDER), so the block that merges a row varies. WORKERS blocks run at once
// (1: one after another; more: a block starts when one of the WORKERS running ones ends, as a GPU's resident blocks
// do, so a row's blocks may or may not be running together). The work area's words other than the tickets start as
// 0xA5A5A5A5 (nothing may rely on them being zero).
// Usage: driver bf16|f32 ROWS VOCAB HIST_CAP DIR ORDER [WORKERS]
#include "sample.cu"  // a copy of kernels-src/sample.cu next to this directory's common.cuh
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
thread_local std::barrier<>* g_block_barrier;
thread_local std::barrier<>** g_warp_barrier;
thread_local uint64_t (*g_warp_x)[32];
thread_local std::atomic<int>* g_count;
thread_local int t_count_parity = 0;
thread_local void* t_block_smem;
int* g_sample_path;
std::atomic<int>* g_sample_helped;
// One resident block's machinery: its barrier, warps' exchange, counts and shared memory.
struct Worker {
  explicit Worker(int block) : bb(block) {
    for (int w = 0; w < 32; ++w) { wb.emplace_back(new std::barrier<>(32)); wbp[w] = wb.back().get(); }
  }
  std::barrier<> bb;
  std::vector<std::unique_ptr<std::barrier<>>> wb;
  std::barrier<>* wbp[32];
  uint64_t wx[32][32] = {};
  std::atomic<int> cnt[2] = {0, 0};
  alignas(64) char smem[64 << 10];
  size_t next = 0;
};
// Runs f for every block of `order` ((x, y) block indices) on `workers` workers of `block` threads: each takes the
// next block of the order when its previous one ends.
template <typename F> void launch(const std::vector<std::pair<int, int>>& order, int gx, int gy, int block, int workers, F f) {
  blockDim.x = block; gridDim.x = gx; gridDim.y = gy;
  std::atomic<size_t> next{0};
  std::vector<std::unique_ptr<Worker>> ws;
  for (int k = 0; k < workers; ++k) ws.emplace_back(new Worker(block));
  std::vector<std::thread> ts;
  for (int k = 0; k < workers; ++k)
    for (int t = 0; t < block; ++t)
      ts.emplace_back([&, k, t] {
        Worker& w = *ws[k];
        threadIdx.x = t; g_block_barrier = &w.bb; g_warp_barrier = w.wbp; g_warp_x = w.wx; g_count = w.cnt;
        t_block_smem = w.smem;
        for (;;) {
          if (t == 0) w.next = next.fetch_add(1);
          w.bb.arrive_and_wait();
          const size_t i = w.next;
          if (i >= order.size()) break;
          blockIdx.x = order[i].first; blockIdx.y = order[i].second; t_count_parity = 0;
          f();
          w.bb.arrive_and_wait();
        }
      });
  for (auto& t : ts) t.join();
}
static std::vector<char> slurp(const char* path) { FILE* f = fopen(path, "rb"); std::vector<char> d; char buf[1 << 16]; size_t n; while ((n = fread(buf, 1, sizeof buf, f)) > 0) d.insert(d.end(), buf, buf + n); fclose(f); return d; }
int main(int argc, char** argv) {
  if (argc != 7 && argc != 8) { fprintf(stderr, "usage: driver bf16|f32 ROWS VOCAB HIST_CAP DIR ORDER [WORKERS]\n"); return 2; }
  const int workers = argc == 8 ? atoi(argv[7]) : 1;
  const bool bf = argv[1][0] == 'b'; const int rows = atoi(argv[2]), vocab = atoi(argv[3]), cap = atoi(argv[4]);
  std::string dir = argv[5]; const unsigned order_seed = (unsigned)atoi(argv[6]);
  auto logits = slurp((dir + "/logits.bin").c_str()); auto params = slurp((dir + "/params.bin").c_str());
  auto pos = slurp((dir + "/positions.bin").c_str());
  std::vector<char> ht, hc; if (cap) { ht = slurp((dir + "/ht.bin").c_str()); hc = slurp((dir + "/hc.bin").c_str()); }
  alignas(16) static char lg[64 << 20]; memcpy(lg, logits.data(), logits.size());
  std::vector<int32_t> tok(rows, -1); std::vector<float> lp(rows, NAN); std::vector<float> st(rows * 4, NAN);
  std::vector<int> paths(rows, -1); g_sample_path = paths.data();
  std::vector<std::atomic<int>> helped(rows); for (auto& h : helped) h = 0; g_sample_helped = helped.data();
  std::vector<uint32_t> work((size_t)rows * SAMPLE_WORK_WORDS, 0xA5A5A5A5u);
  for (int r = 0; r < rows; ++r) work[(size_t)r * SAMPLE_WORK_WORDS] = 0;
  const int splits = (vocab + SAMPLE_SLICE - 1) / SAMPLE_SLICE;
#ifdef SAMPLE_PROFILE
  std::vector<unsigned long long> prof((size_t)rows * splits * SAMPLE_PROF_SLOTS, 0ull);  // written to DIR/prof.bin
#define SAMPLE_PROF_DRIVER_ARG , prof.data()
#else
#define SAMPLE_PROF_DRIVER_ARG
#endif
  std::vector<std::pair<int, int>> order;
  for (int r = 0; r < rows; ++r) for (int s = 0; s < splits; ++s) order.emplace_back(s, r);
  if (order_seed) { std::mt19937 g(order_seed); std::shuffle(order.begin(), order.end(), g); }
  launch(order, splits, rows, SAMPLE_THREADS, workers, [&] {
    if (bf) kern_sample_bf16((__nv_bfloat16*)lg, (const uint32_t*)params.data(), (const int32_t*)pos.data(), cap ? (const int32_t*)ht.data() : nullptr, cap ? (const int32_t*)hc.data() : nullptr, cap, vocab, tok.data(), lp.data(), st.data(), work.data() SAMPLE_PROF_DRIVER_ARG);
    else kern_sample_f32((float*)lg, (const uint32_t*)params.data(), (const int32_t*)pos.data(), cap ? (const int32_t*)ht.data() : nullptr, cap ? (const int32_t*)hc.data() : nullptr, cap, vocab, tok.data(), lp.data(), st.data(), work.data() SAMPLE_PROF_DRIVER_ARG);
  });
  const int n_top = 5; std::vector<int32_t> ids(rows * n_top, -7); std::vector<float> tl(rows * n_top, NAN);
  std::vector<std::pair<int, int>> top_order;
  for (int r = 0; r < rows; ++r) top_order.emplace_back(r, 0);
  launch(top_order, rows, 1, TOP_THREADS, 1, [&] {
    if (bf) kern_sample_top_logprobs_bf16((const __nv_bfloat16*)lg, st.data(), vocab, n_top, ids.data(), tl.data());
    else kern_sample_top_logprobs_f32((const float*)lg, st.data(), vocab, n_top, ids.data(), tl.data());
  });
  std::vector<int32_t> tickets(rows);
  for (int r = 0; r < rows; ++r) tickets[r] = (int32_t)work[(size_t)r * SAMPLE_WORK_WORDS];
#ifdef SAMPLE_PROFILE
  FILE* o4 = fopen((dir + "/prof.bin").c_str(), "wb"); fwrite(prof.data(), 8, prof.size(), o4); fclose(o4);
#endif
  FILE* o3 = fopen((dir + "/tickets.bin").c_str(), "wb"); fwrite(tickets.data(), 4, rows, o3); fwrite(paths.data(), 4, rows, o3);
  for (auto& h : helped) { const int32_t v = h.load(); fwrite(&v, 4, 1, o3); }
  fclose(o3);
  FILE* o2 = fopen((dir + "/top.bin").c_str(), "wb"); fwrite(ids.data(), 4, rows * n_top, o2); fwrite(tl.data(), 4, rows * n_top, o2); fclose(o2);
  FILE* o = fopen((dir + "/out.bin").c_str(), "wb"); fwrite(tok.data(), 4, rows, o); fwrite(lp.data(), 4, rows, o); fwrite(st.data(), 4, rows * 4, o);
  fwrite(lg, 1, logits.size(), o); fclose(o);
  return 0;
}
