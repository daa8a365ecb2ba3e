// Host driver of tools/rope_cpu_emu.py: runs the kernels of a copy of kernels-src/rope.cu on the CPU, one block after
// another, each block's threads as std::threads (the launch of attn_driver.cpp, without cp.async).
// Usage: driver table DIR | driver llama3 DIR | driver block DIR | driver warp DIR. DIR holds params.bin (int32 /
// float32 words, below) and the inputs; the outputs are written there.
//   table:  params max_pos head_dim theta -> rope.bin (kern_rope_table, grid max_pos, block head_dim / 2)
//   llama3: params max_pos head_dim theta factor low high orig -> rope.bin (kern_rope_table_llama3)
//   block / warp: params n_tokens hq hkv D page_tokens max_pos num_pages eps grid_y block norms (bit 0: q_norm,
//           bit 1: k_norm passed; else null); qkv.bin qn.bin kn.bin rope.bin pos.bin slots.bin q.bin kv.bin ->
//           q.bin kv.bin (kern_qk_norm_rope_kv / _warp over the given q and cache, updated in place)
#include "rope.cu"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
std::barrier<>* g_block_barrier;
std::barrier<>* g_warp_barrier[32];
uint64_t g_warp_x[32][32];
std::atomic<int> g_count[2];
thread_local int t_count_parity = 0;

template <typename F> void launch(unsigned gx, unsigned gy, unsigned block, F f) {
  blockDim = {block, 1, 1};
  gridDim = {gx, gy, 1};
  const unsigned warps = (block + 31) / 32;
  for (unsigned y = 0; y < gy; ++y)
    for (unsigned x = 0; x < gx; ++x) {
      std::barrier<> bb(block);
      g_block_barrier = &bb;
      std::vector<std::unique_ptr<std::barrier<>>> wb;
      for (unsigned w = 0; w < warps; ++w) {
        wb.emplace_back(new std::barrier<>(std::min(32u, block - 32 * w)));
        g_warp_barrier[w] = wb.back().get();
      }
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < block; ++t)
        ts.emplace_back([&, t, x, y] {
          threadIdx = {t, 0, 0};
          blockIdx = {x, y, 0};
          t_count_parity = 0;
          f();
        });
      for (auto& t : ts) t.join();
    }
}

static std::vector<char> slurp(const std::string& path) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) { fprintf(stderr, "cannot open %s\n", path.c_str()); std::exit(2); }
  std::vector<char> d;
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) d.insert(d.end(), buf, buf + n);
  fclose(f);
  return d;
}

static void spill(const std::string& path, const void* p, size_t bytes) {
  FILE* f = fopen(path.c_str(), "wb");
  fwrite(p, 1, bytes, f);
  fclose(f);
}

int main(int argc, char** argv) {
  if (argc != 3) { fprintf(stderr, "usage: driver table|llama3|block|warp DIR\n"); return 2; }
  const std::string mode = argv[1], dir = argv[2];
  const std::vector<char> params = slurp(dir + "/params.bin");
  auto i32 = [&](int k) { int32_t v; memcpy(&v, params.data() + 4 * k, 4); return v; };
  auto f32 = [&](int k) { float v; memcpy(&v, params.data() + 4 * k, 4); return v; };
  if (mode == "table" || mode == "llama3") {
    const int max_pos = i32(0), D = i32(1);
    std::vector<float> rope((size_t)max_pos * D, NAN);
    launch(max_pos, 1, D / 2, [&] {
      if (mode == "table") kern_rope_table(rope.data(), max_pos, D, f32(2));
      else kern_rope_table_llama3(rope.data(), max_pos, D, f32(2), f32(3), f32(4), f32(5), f32(6));
    });
    spill(dir + "/rope.bin", rope.data(), rope.size() * 4);
    return 0;
  }
  const int n = i32(0), hq = i32(1), hkv = i32(2), D = i32(3), pt = i32(4), max_pos = i32(5), pages = i32(6);
  const float eps = f32(7);
  const int grid_y = i32(8), block = i32(9), norms = i32(10);
  std::vector<char> qkv = slurp(dir + "/qkv.bin"), qn = slurp(dir + "/qn.bin"), kn = slurp(dir + "/kn.bin");
  std::vector<char> rope = slurp(dir + "/rope.bin"), pos = slurp(dir + "/pos.bin"), slots = slurp(dir + "/slots.bin");
  std::vector<char> q = slurp(dir + "/q.bin"), kv = slurp(dir + "/kv.bin");
  auto bf = [](std::vector<char>& v) { return reinterpret_cast<__nv_bfloat16*>(v.data()); };
  const __nv_bfloat16* qw = (norms & 1) ? bf(qn) : nullptr;
  const __nv_bfloat16* kw = (norms & 2) ? bf(kn) : nullptr;
  launch(n, grid_y, block, [&] {
    auto k = mode == "block" ? kern_qk_norm_rope_kv : kern_qk_norm_rope_kv_warp;
    k(bf(qkv), qw, kw, reinterpret_cast<const float*>(rope.data()), reinterpret_cast<const int32_t*>(pos.data()),
      reinterpret_cast<const int32_t*>(slots.data()), bf(q), bf(kv), n, hq, hkv, D, pt, max_pos, pages, eps);
  });
  spill(dir + "/q.bin", q.data(), q.size());
  spill(dir + "/kv.bin", kv.data(), kv.size());
  return 0;
}
