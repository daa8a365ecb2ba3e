// Host driver of tools/decode_attention_cpu_emu.py: runs kernels of copies of kernels-src/attention.cu (up to its
// r32 prefill) and attention_decode.cu on the CPU, one block after another, each block's threads as std::threads.
// Usage: driver stream|gqa|fused|prefill DIR. DIR holds params.bin (int32 words, below) and the inputs; the
// outputs are written there, poisoned (0xFF bytes) where the kernels leave them.
//   stream, gqa, fused: params hq hkv D page_tokens bt_stride num_pages split_tokens num_splits seqs block scale_bits q_off
//            cache_off; q.bin cache.bin bt.bin lens.bin slots.bin -> po.bin ml.bin out.bin (the stream or gqa
//            partial, then kern_attn_decode_reduce; fused: kern_attn_decode_gqa_fused alone, its tickets checked
//            back to zero). q_off / cache_off: elements the data start past a 16-byte boundary.
//   prefill: params hq hkv D page_tokens bt_stride num_pages seqs total_q grid_x scale_bits; q.bin cache.bin
//            bt.bin cu.bin lens.bin -> out.bin (kern_attn_prefill, block 128).
#include "attention.cu"
#include "attention_decode.cu"

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
uint32_t g_frag_x[32][32][10];
std::atomic<int> g_count[2];
thread_local int t_count_parity = 0;
thread_local std::vector<EmuCopy> t_copies_open;
thread_local std::deque<std::vector<EmuCopy>> t_copy_groups;
bool g_strict_copies = false;  // a thread exiting with copies pending is an error (kern_attn_prefill may leave some)

template <typename F> void launch(unsigned gx, unsigned gy, unsigned gz, unsigned block, F f) {
  blockDim = {block, 1, 1};
  gridDim = {gx, gy, gz};
  const unsigned warps = (block + 31) / 32;
  for (unsigned z = 0; z < gz; ++z)
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
          ts.emplace_back([&, t, x, y, z] {
            threadIdx = {t, 0, 0};
            blockIdx = {x, y, z};
            t_count_parity = 0;
            t_copies_open.clear();
            t_copy_groups.clear();
            f();
            if (g_strict_copies && (!t_copies_open.empty() || !t_copy_groups.empty())) {
              fprintf(stderr, "block (%u,%u,%u) thread %u exits with cp.async copies still pending\n", x, y, z, t);
              std::abort();
            }
          });
        for (auto& t : ts) t.join();
      }
}

static std::vector<char> slurp(const std::string& path) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) { fprintf(stderr, "cannot read %s\n", path.c_str()); std::exit(2); }
  std::vector<char> d;
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) d.insert(d.end(), buf, buf + n);
  fclose(f);
  return d;
}
static void spill(const std::string& path, const void* p, size_t n) {
  FILE* f = fopen(path.c_str(), "wb");
  fwrite(p, 1, n, f);
  fclose(f);
}
// `bytes` of `data` at `off_elems` bf16 past a 64-byte aligned base (kept alive in `keep`).
static char* placed(const std::vector<char>& data, int off_elems, std::vector<char>& keep) {
  keep.assign(data.size() + 128, 0);
  char* base = keep.data() + (64 - (reinterpret_cast<uintptr_t>(keep.data()) & 63)) + 2 * off_elems;
  memcpy(base, data.data(), data.size());
  return base;
}

int main(int argc, char** argv) {
  if (argc != 3) { fprintf(stderr, "usage: driver stream|gqa|fused|prefill DIR\n"); return 2; }
  const std::string mode = argv[1], dir = std::string(argv[2]) + "/";
  const std::vector<char> pr = slurp(dir + "params.bin");
  const int32_t* p = reinterpret_cast<const int32_t*>(pr.data());
  std::vector<char> kq, kc;
  if (mode == "stream" || mode == "gqa" || mode == "fused") {
    const int hq = p[0], hkv = p[1], D = p[2], pt = p[3], bt_stride = p[4], num_pages = p[5], split_tokens = p[6],
              num_splits = p[7], seqs = p[8], block = p[9];
    float scale;
    memcpy(&scale, &p[10], 4);
    const auto* q = reinterpret_cast<const __nv_bfloat16*>(placed(slurp(dir + "q.bin"), p[11], kq));
    const auto* cache = reinterpret_cast<const __nv_bfloat16*>(placed(slurp(dir + "cache.bin"), p[12], kc));
    const std::vector<char> bt = slurp(dir + "bt.bin"), lens = slurp(dir + "lens.bin"), slots = slurp(dir + "slots.bin");
    std::vector<float> po((size_t)seqs * hq * num_splits * D), ml((size_t)seqs * hq * num_splits * 2);
    std::vector<uint16_t> out((size_t)seqs * hq * D);
    memset(po.data(), 0xFF, po.size() * 4);
    memset(ml.data(), 0xFF, ml.size() * 4);
    memset(out.data(), 0xFF, out.size() * 2);
    const auto* bt_p = reinterpret_cast<const int32_t*>(bt.data());
    const auto* lens_p = reinterpret_cast<const int32_t*>(lens.data());
    const auto* slots_p = reinterpret_cast<const int32_t*>(slots.data());
    g_strict_copies = true;  // the stream partial waits for all its copies before its merge
    if (mode == "fused") {  // kern_attn_decode_gqa_fused: the partials and the merge in one launch
      std::vector<int32_t> tickets((size_t)seqs * hkv, 0);
      launch(hkv, num_splits, seqs, block, [&] {
        kern_attn_decode_gqa_fused(q, cache, bt_p, lens_p, slots_p, po.data(), ml.data(), tickets.data(),
                                   reinterpret_cast<__nv_bfloat16*>(out.data()), hq, hkv, D, pt, bt_stride, num_pages,
                                   split_tokens, num_splits, scale);
      });
      for (size_t i = 0; i < tickets.size(); ++i)
        if (tickets[i] != 0) { fprintf(stderr, "ticket %zu left at %d\n", i, tickets[i]); std::abort(); }
    } else {
      launch(hkv, num_splits, seqs, block, [&] {
        (mode == "gqa" ? kern_attn_decode_partial_gqa : kern_attn_decode_partial_stream)(
            q, cache, bt_p, lens_p, slots_p, po.data(), ml.data(), hq, hkv, D, pt, bt_stride, num_pages, split_tokens,
            num_splits, scale);
      });
    }
    g_strict_copies = false;
    if (mode != "fused")
      launch(hq, seqs, 1, D, [&] {
        kern_attn_decode_reduce(po.data(), ml.data(), lens_p, reinterpret_cast<__nv_bfloat16*>(out.data()), hq, D,
                                split_tokens, num_splits);
      });
    spill(dir + "po.bin", po.data(), po.size() * 4);
    spill(dir + "ml.bin", ml.data(), ml.size() * 4);
    spill(dir + "out.bin", out.data(), out.size() * 2);
  } else if (mode == "prefill") {
    const int hq = p[0], hkv = p[1], D = p[2], pt = p[3], bt_stride = p[4], num_pages = p[5], seqs = p[6],
              total_q = p[7], grid_x = p[8];
    float scale;
    memcpy(&scale, &p[9], 4);
    const auto* q = reinterpret_cast<const __nv_bfloat16*>(placed(slurp(dir + "q.bin"), 0, kq));
    const auto* cache = reinterpret_cast<const __nv_bfloat16*>(placed(slurp(dir + "cache.bin"), 0, kc));
    const std::vector<char> bt = slurp(dir + "bt.bin"), cu = slurp(dir + "cu.bin"), lens = slurp(dir + "lens.bin");
    std::vector<uint16_t> out((size_t)total_q * hq * D);
    memset(out.data(), 0xFF, out.size() * 2);
    launch(grid_x, hkv, seqs, PF_THREADS, [&] {
      kern_attn_prefill(q, cache, reinterpret_cast<const int32_t*>(bt.data()), reinterpret_cast<const int32_t*>(cu.data()),
                        reinterpret_cast<const int32_t*>(lens.data()), reinterpret_cast<__nv_bfloat16*>(out.data()),
                        hq, hkv, D, pt, bt_stride, num_pages, scale);
    });
    spill(dir + "out.bin", out.data(), out.size() * 2);
  } else {
    fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  }
  return 0;
}
