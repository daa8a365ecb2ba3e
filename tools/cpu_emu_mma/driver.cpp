// Host driver of tools/gemv_mma_cpu_emu.py: runs one kern_mma_* entry of kernels-src/gemv_mma.cu (copied next to
// this directory's stand-ins) over the inputs in DIR (w.bin, src.bin, norm.bin, out.bin: bf16 bits), cluster by
// cluster, every block of a cluster at once, and writes the output back to DIR/out.bin.
// Usage: driver KIND TILE M N_OUT K EPS CLUSTER CLUSTERS THREADS SMEM_BYTES ROWS DIR
#include "gemv_mma.cu"
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
thread_local EmuBlock* t_block;
thread_local EmuCluster* t_cluster;

static std::vector<uint16_t> slurp(const std::string& path) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) { perror(path.c_str()); exit(2); }
  std::vector<uint16_t> d;
  uint16_t buf[1 << 15];
  size_t n;
  while ((n = fread(buf, 2, sizeof buf / 2, f)) > 0) d.insert(d.end(), buf, buf + n);
  fclose(f);
  return d;
}

int main(int argc, char** argv) {
  if (argc != 13) { fprintf(stderr, "usage: driver KIND TILE M N_OUT K EPS CLUSTER CLUSTERS THREADS SMEM ROWS DIR\n"); return 2; }
  const std::string kind = argv[1];
  const int tile = atoi(argv[2]), m = atoi(argv[3]), n_out = atoi(argv[4]), k = atoi(argv[5]);
  const float eps = (float)atof(argv[6]);
  const int cluster = atoi(argv[7]), clusters = atoi(argv[8]), threads = atoi(argv[9]);
  const size_t smem = (size_t)atoll(argv[10]);
  const std::string dir = argv[12];
  std::vector<uint16_t> w = slurp(dir + "/w.bin"), src = slurp(dir + "/src.bin"), norm = slurp(dir + "/norm.bin"),
                        out = slurp(dir + "/out.bin");
  auto W = reinterpret_cast<const __nv_bfloat16*>(w.data());
  auto S = reinterpret_cast<const __nv_bfloat16*>(src.data());
  auto N = reinterpret_cast<const __nv_bfloat16*>(norm.data());
  auto O = reinterpret_cast<__nv_bfloat16*>(out.data());
  void (*fn)() = nullptr;
  (void)fn;
  auto call = [&]() {
#define KERN_EMU_TILE(T)                                                                   \
    if (tile == T) {                                                                       \
      if (kind == "rmsnorm") kern_mma_rmsnorm_m##T(W, S, N, O, m, n_out, k, eps);          \
      else if (kind == "residual") kern_mma_residual_m##T(W, S, O, m, n_out, k);           \
      else kern_mma_rmsnorm_swiglu_m##T(W, S, N, O, m, n_out, k, eps);                     \
      return;                                                                              \
    }
    KERN_EMU_TILE(8) KERN_EMU_TILE(16) KERN_EMU_TILE(32) KERN_EMU_TILE(64)
    fprintf(stderr, "no tile %d\n", tile);
    exit(2);
  };
  blockDim.x = threads;
  gridDim.x = cluster * clusters;
  for (int q = 0; q < clusters; ++q) {
    EmuCluster cl;
    cl.bar.reset(new std::barrier<>(cluster * threads));
    cl.id = q;
    cl.count = clusters;
    std::vector<std::unique_ptr<EmuBlock>> blocks;
    for (int r = 0; r < cluster; ++r) {
      blocks.emplace_back(new EmuBlock(threads, smem, 65536));
      blocks.back()->rank = r;
      cl.blocks.push_back(blocks.back().get());
    }
    std::vector<std::thread> ts;
    for (int r = 0; r < cluster; ++r)
      for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, r, t] {
          threadIdx.x = t;
          blockIdx.x = q * cluster + r;
          t_block = cl.blocks[r];
          t_cluster = &cl;
          call();
        });
    for (auto& t : ts) t.join();
  }
  FILE* f = fopen((dir + "/out.bin").c_str(), "wb");
  fwrite(out.data(), 2, out.size(), f);
  fclose(f);
  return 0;
}
