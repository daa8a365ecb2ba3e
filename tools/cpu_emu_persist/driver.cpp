// Host driver of tools/persistent_cpu_emu.py: loads every buffer DIR/<name>.bin, runs kern_persistent_decode with
// all GRID blocks at once (GRID x 256 std::threads), writes every buffer back. Usage: driver DIR GRID TIMEOUT_NS
// SMEM_BYTES LAYERS. DIR/shape.bin holds PersistShape (48 bytes), DIR/num_pages.bin one i32.
#include "persistent_decode.cu"  // a copy of kernels-src/persistent_decode.cu next to this directory's headers
#include <cstdio>
#include <map>
#include <string>
#include <vector>
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
thread_local BlockCtx* t_ctx;

struct Buf { std::vector<uint4> words; size_t bytes = 0; char* data() { return reinterpret_cast<char*>(words.data()); } };
static std::map<std::string, Buf> g_bufs;
static std::string g_dir;

static char* load(const std::string& name) {
  Buf& b = g_bufs[name];
  FILE* f = fopen((g_dir + "/" + name + ".bin").c_str(), "rb");
  if (!f) { fprintf(stderr, "missing %s\n", name.c_str()); exit(2); }
  fseek(f, 0, SEEK_END); b.bytes = ftell(f); fseek(f, 0, SEEK_SET);
  b.words.assign(b.bytes / 16 + 1, uint4{0, 0, 0, 0});
  if (fread(b.data(), 1, b.bytes, f) != b.bytes) exit(2);
  fclose(f);
  return b.data();
}

int main(int argc, char** argv) {
  if (argc != 6) { fprintf(stderr, "usage: driver DIR GRID TIMEOUT_NS SMEM_BYTES LAYERS\n"); return 2; }
  g_dir = argv[1];
  const int grid = atoi(argv[2]), layers = atoi(argv[5]);
  const unsigned long long timeout_ns = strtoull(argv[3], nullptr, 10);
  const uint32_t smem_bytes = (uint32_t)atoi(argv[4]);
  PersistShape s; memcpy(&s, load("shape"), sizeof s);
  int32_t num_pages; memcpy(&num_pages, load("num_pages"), 4);
  static PersistLayers L;
  memset(&L, 0, sizeof L);
  for (int l = 0; l < layers; ++l) {
    const std::string t = "." + std::to_string(l);
    L.layer[l].w_qkv = (const bf16*)load("w_qkv" + t);
    L.layer[l].w_o = (const bf16*)load("w_o" + t);
    L.layer[l].w_gate_up = (const bf16*)load("w_gate_up" + t);
    L.layer[l].w_down = (const bf16*)load("w_down" + t);
    L.layer[l].ln_in = (const bf16*)load("ln_in" + t);
    L.layer[l].ln_post = (const bf16*)load("ln_post" + t);
    L.layer[l].q_norm = (const bf16*)load("q_norm" + t);
    L.layer[l].k_norm = (const bf16*)load("k_norm" + t);
    L.layer[l].kv = (bf16*)load("kv" + t);
  }
  const char* names[] = {"table", "counters", "error", "residual", "qkv", "q", "attn_partials", "attn_out", "act",
                         "logits", "argmax_partials", "next_token", "final_norm", "lm_head", "rope", "positions",
                         "slot_mapping", "seq_lens", "block_table"};
  std::vector<char*> p;
  for (const char* n : names) p.push_back(load(n));
  blockDim.x = 256; gridDim.x = grid;
  std::vector<std::unique_ptr<BlockCtx>> ctx;
  std::vector<std::vector<float>> smem(grid, std::vector<float>(smem_bytes / 4 + 1));
  for (int b = 0; b < grid; ++b) {
    ctx.emplace_back(new BlockCtx());
    ctx[b]->block.reset(new std::barrier<>(256));
    for (int w = 0; w < 32; ++w) ctx[b]->warp[w].reset(new std::barrier<>(32));
    ctx[b]->smem = smem[b].data();
    ctx[b]->smem_bytes = smem_bytes;
  }
  std::vector<std::thread> threads;
  for (int b = 0; b < grid; ++b)
    for (int t = 0; t < 256; ++t)
      threads.emplace_back([&, b, t] {
        t_ctx = ctx[b].get(); threadIdx.x = t; blockIdx.x = b;
        kern_persistent_decode((const uint32_t*)p[0], (uint32_t*)p[1], (uint32_t*)p[2], (bf16*)p[3], (bf16*)p[4],
                               (bf16*)p[5], (float*)p[6], (bf16*)p[7], (bf16*)p[8], (bf16*)p[9], (uint32_t*)p[10],
                               (int64_t*)p[11], (const bf16*)p[12], (const bf16*)p[13], (const float*)p[14],
                               (const int32_t*)p[15], (const int32_t*)p[16], (const int32_t*)p[17],
                               (const int32_t*)p[18], s, num_pages, timeout_ns, L);
      });
  for (auto& t : threads) t.join();
  for (auto& [name, b] : g_bufs) {
    FILE* f = fopen((g_dir + "/" + name + ".bin").c_str(), "wb");
    fwrite(b.data(), 1, b.bytes, f);
    fclose(f);
  }
  return 0;
}
