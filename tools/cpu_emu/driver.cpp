// Host driver of tools/sample_cpu_emu.py: runs kern_sample_{bf16,f32} then kern_sample_top_logprobs_* (n_top 5)
// over the inputs in DIR (logits.bin, params.bin, positions.bin, ht.bin, hc.bin), one block after another,
// and writes DIR/out.bin (tokens, logprobs, stats, the logits after) and DIR/top.bin (ids, logprobs).
// Usage: driver bf16|f32 ROWS VOCAB HIST_CAP DIR
#include "sample.cu"  // a copy of kernels-src/sample.cu next to this directory's common.cuh
#include <thread>
#include <vector>
#include <cstdio>
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
std::barrier<>* g_block_barrier;
std::barrier<>* g_warp_barrier[32];
uint64_t g_warp_x[32][32];
std::atomic<int> g_count[2];
thread_local int t_count_parity = 0;
template <typename F> void launch(int grid, int block, F f) {
  blockDim.x = block; gridDim.x = grid;
  for (int b = 0; b < grid; ++b) {
    std::barrier<> bb(block); g_block_barrier = &bb;
    std::vector<std::unique_ptr<std::barrier<>>> wb;
    for (int w = 0; w < 32; ++w) { wb.emplace_back(new std::barrier<>(32)); g_warp_barrier[w] = wb.back().get(); }
    std::vector<std::thread> ts;
    for (int t = 0; t < block; ++t) ts.emplace_back([&, t, b] { threadIdx.x = t; blockIdx.x = b; t_count_parity = 0; f(); });
    for (auto& t : ts) t.join();
  }
}
static std::vector<char> slurp(const char* path) { FILE* f = fopen(path, "rb"); std::vector<char> d; char buf[1 << 16]; size_t n; while ((n = fread(buf, 1, sizeof buf, f)) > 0) d.insert(d.end(), buf, buf + n); fclose(f); return d; }
int main(int argc, char** argv) {
  // args: dtype(bf16|f32) rows vocab hist_cap dir
  const bool bf = argv[1][0] == 'b'; const int rows = atoi(argv[2]), vocab = atoi(argv[3]), cap = atoi(argv[4]);
  std::string dir = argv[5];
  auto logits = slurp((dir + "/logits.bin").c_str()); auto params = slurp((dir + "/params.bin").c_str());
  auto pos = slurp((dir + "/positions.bin").c_str());
  std::vector<char> ht, hc; if (cap) { ht = slurp((dir + "/ht.bin").c_str()); hc = slurp((dir + "/hc.bin").c_str()); }
  alignas(16) static char lg[64 << 20]; memcpy(lg, logits.data(), logits.size());
  std::vector<int32_t> tok(rows, -1); std::vector<float> lp(rows, NAN); std::vector<float> st(rows * 4, NAN);
  launch(rows, 1024, [&] {
    if (bf) kern_sample_bf16((__nv_bfloat16*)lg, (const uint32_t*)params.data(), (const int32_t*)pos.data(), cap ? (const int32_t*)ht.data() : nullptr, cap ? (const int32_t*)hc.data() : nullptr, cap, vocab, tok.data(), lp.data(), st.data());
    else kern_sample_f32((float*)lg, (const uint32_t*)params.data(), (const int32_t*)pos.data(), cap ? (const int32_t*)ht.data() : nullptr, cap ? (const int32_t*)hc.data() : nullptr, cap, vocab, tok.data(), lp.data(), st.data());
  });
  const int n_top = 5; std::vector<int32_t> ids(rows * n_top, -7); std::vector<float> tl(rows * n_top, NAN);
  launch(rows, 1024, [&] {
    if (bf) kern_sample_top_logprobs_bf16((const __nv_bfloat16*)lg, st.data(), vocab, n_top, ids.data(), tl.data());
    else kern_sample_top_logprobs_f32((const float*)lg, st.data(), vocab, n_top, ids.data(), tl.data());
  });
  FILE* o2 = fopen((dir + "/top.bin").c_str(), "wb"); fwrite(ids.data(), 4, rows * n_top, o2); fwrite(tl.data(), 4, rows * n_top, o2); fclose(o2);
  FILE* o = fopen((dir + "/out.bin").c_str(), "wb"); fwrite(tok.data(), 4, rows, o); fwrite(lp.data(), 4, rows, o); fwrite(st.data(), 4, rows * 4, o);
  fwrite(lg, 1, logits.size(), o); fclose(o);
  return 0;
}
