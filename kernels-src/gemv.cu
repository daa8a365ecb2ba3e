// Decode-speed GEMV (M = 1): y[n] = W[n, k] @ x[k], W row-major bf16, fp32 accumulation, with the
// elementwise work around the projection folded in (RMSNorm prologue, SiLU-and-mul prologue, residual-add
// epilogue). Selected for tokens == 1 only; prefill keeps cuBLASLt. Contract: docs/kernels-gemv.md.
//
// Shape of every entry (one body, four prologue/epilogue pairs):
//   1. each warp issues the 16-byte loads of the first kUnroll chunks of its first W row (weights: no
//      dependency on the previous kernel), then `griddepcontrol.wait` (programmatic dependent launch; a
//      no-op without the launch attribute), then `griddepcontrol.launch_dependents`;
//   2. the block stages the input vector x (bf16, zero padded to a multiple of 8) in shared memory,
//      computing it from its sources (RMSNorm of the residual, SiLU(gate) * up, or a plain copy);
//   3. rows are dealt to warps round-robin over the whole grid, block-interleaved:
//        warp w of block b owns rows  w * gridDim.x + b + i * (gridDim.x * warps_per_block),  i = 0, 1, ...
//      so every block (every SM, with a grid of a whole number of blocks per SM) gets the same number of
//      rows to within one, whatever n is; a warp streams its row in 16-byte chunks (lane l takes chunks
//      l, l + 32, ...), kUnroll chunks in flight per lane, x chunk from shared memory, fp32 FMA, then a
//      butterfly warp reduction; lane 0 writes the epilogue.
// The launch is any grid (>= 1 block) of blockDim.x = 32 * warps threads (1 <= warps <= 32).
//
// Vector path: k % 8 == 0 and every global pointer 16-byte aligned (the host generator checks both).
// Otherwise the same code runs with element-by-element loads, bounds-checked against k, so any k in
// >= 1 is computed correctly (slowly) and nothing outside the arrays is read. Dynamic shared memory:
// 16 * ceil(k / 8) bytes (x); a launch that gives less, a block size that is not whole warps, or n, k < 1
// make every block return at once (after griddepcontrol.wait) without reading or writing anything.
#include "common.cuh"

#ifndef KERN_GEMV_UNROLL
#define KERN_GEMV_UNROLL 8  // 16-byte W chunks in flight per lane (bench/gemv.py --sweep compiles others)
#endif

namespace {

using bf16 = __nv_bfloat16;

constexpr int kUnroll = KERN_GEMV_UNROLL;
constexpr int kMaxThreads = 1024;  // __launch_bounds__: keeps the kernel at <= 64 registers
constexpr int kChunk = 8;          // bf16 per 16-byte chunk

// ---- loads ----
// L2 policy for weights: read once per step, so evict first (keeps activations / KV lines in L2).
KERN_DEV uint64_t weight_policy() {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

// One 16-byte weight chunk, streamed: non-coherent (read-only) path, no L1 allocation, L2 evict-first.
KERN_DEV uint4 ldg_weight(const bf16* p, uint64_t policy) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(policy));
    return v;
}

// The same chunk through the coherent path, for the loads issued before griddepcontrol.wait: ptxas
// schedules a .nc load freely across the wait (seen: the whole prefetch landed after it, SASS ACQBULK),
// while a coherent load stays before it. Same caching hints, so the same traffic.
KERN_DEV uint4 ldg_weight_early(const bf16* p, uint64_t policy) {
    uint4 v;
    asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(policy)
                 : "memory");
    return v;
}

// Element j of a row of `len` bf16 as its 16 bits, 0 (= +0.0) at or past `len`. L2-coherent load (the slow
// path reads weights and activations alike through it).
KERN_DEV uint32_t bf16_bits(const bf16* row, int j, int len) {
    return j < len ? static_cast<uint32_t>(__bfloat16_as_ushort(__ldcg(row + j))) : 0u;
}

enum class Src { kWeight, kWeightEarly, kActivation };

// Chunk c (elements [8c, 8c + 8)) of a bf16 row of `len` elements, as 8 packed bf16 (element 8c in the low
// half of .x). VEC: one 16-byte load (caller guarantees len % 8 == 0, 16-byte alignment, 8c < len).
// Otherwise element by element; elements at or past `len` read as +0.0.
template <bool VEC, Src SRC>
KERN_DEV uint4 load_chunk(const bf16* row, int c, int len, uint64_t policy) {
    if (VEC) {
        if (SRC == Src::kWeight) return ldg_weight(row + c * kChunk, policy);
        if (SRC == Src::kWeightEarly) return ldg_weight_early(row + c * kChunk, policy);
        return __ldcg(reinterpret_cast<const uint4*>(row) + c);  // activations: L2, never a stale L1 line
    }
    const int j = c * kChunk;
    uint4 v;
    v.x = bf16_bits(row, j + 0, len) | (bf16_bits(row, j + 1, len) << 16);
    v.y = bf16_bits(row, j + 2, len) | (bf16_bits(row, j + 3, len) << 16);
    v.z = bf16_bits(row, j + 4, len) | (bf16_bits(row, j + 5, len) << 16);
    v.w = bf16_bits(row, j + 6, len) | (bf16_bits(row, j + 7, len) << 16);
    return v;
}

// bf16 -> f32 is exact: the bf16 bits are the high half of the f32.
KERN_DEV float lo_f(uint32_t u) { return __uint_as_float(u << 16); }
KERN_DEV float hi_f(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

KERN_DEV void unpack8(uint4 v, float (&f)[8]) {
    f[0] = lo_f(v.x); f[1] = hi_f(v.x);
    f[2] = lo_f(v.y); f[3] = hi_f(v.y);
    f[4] = lo_f(v.z); f[5] = hi_f(v.z);
    f[6] = lo_f(v.w); f[7] = hi_f(v.w);
}

// 8 floats -> 8 packed bf16, round to nearest even.
KERN_DEV uint32_t pack2(float a, float b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);  // .x = a (low half)
    return *reinterpret_cast<const uint32_t*>(&h);
}
KERN_DEV uint4 pack8(const float (&f)[8]) {
    return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7]));
}

// acc + sum_i w[i] * x[i] over one chunk, in element order.
KERN_DEV float dot8(uint4 w, uint4 x, float acc) {
    acc = fmaf(lo_f(w.x), lo_f(x.x), acc);
    acc = fmaf(hi_f(w.x), hi_f(x.x), acc);
    acc = fmaf(lo_f(w.y), lo_f(x.y), acc);
    acc = fmaf(hi_f(w.y), hi_f(x.y), acc);
    acc = fmaf(lo_f(w.z), lo_f(x.z), acc);
    acc = fmaf(hi_f(w.z), hi_f(x.z), acc);
    acc = fmaf(lo_f(w.w), lo_f(x.w), acc);
    acc = fmaf(hi_f(w.w), hi_f(x.w), acc);
    return acc;
}

// One batch of a W row: wv[u] = chunk c0 + 32u (this lane's chunks, 512 bytes apart across the warp's
// loads), or 0 past the row's k8 = ceil(k / 8) chunks. All kUnroll loads are issued before any is used.
template <bool VEC, Src SRC>
KERN_DEV void load_batch(const bf16* wrow, int c0, int k, uint64_t policy, uint4 (&wv)[kUnroll]) {
    const int k8 = (k + kChunk - 1) / kChunk;
    const bf16* p = wrow + static_cast<size_t>(c0) * kChunk;  // VEC: one base pointer, constant offsets
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
        const int c = c0 + 32 * u;
        if (c >= k8) {
            wv[u] = make_uint4(0u, 0u, 0u, 0u);
        } else if (VEC) {
            wv[u] = load_chunk<true, SRC>(p + 32 * u * kChunk, 0, k, policy);
        } else {
            wv[u] = load_chunk<false, SRC>(wrow, c, k, policy);
        }
    }
}

// ---- the body shared by every entry ----
// `stage_x(xs, k8)`: every thread of the block; fills xs[0 .. k8) (16-byte chunks of x, zero padded) and
// must end with __syncthreads(). It runs after griddepcontrol.wait, so it may read the previous kernel's
// output. `epilogue(row, dot)`: lane 0 of the warp owning `row`, dot = the fp32 sum W[row] . x.
template <bool VEC, class StageX, class Epilogue>
KERN_DEV void gemv_body(const bf16* __restrict__ w, int n, int k, StageX stage_x, Epilogue epilogue) {
    extern __shared__ uint4 xs[];  // [round_up(k, 8) / 8] chunks of 8 bf16
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    const int k8 = (k + kChunk - 1) / kChunk;           // chunks per row
    const int first_row = warp * gridDim.x + blockIdx.x;  // block-interleaved deal (header comment)
    const int row_stride = warps * gridDim.x;
    const uint64_t policy = weight_policy();

    // 1. First W chunks of the first row: weights only, so they may overlap the previous kernel's tail.
    uint4 wv[kUnroll];
    if (first_row < n) {
        load_batch<VEC, Src::kWeightEarly>(w + static_cast<size_t>(first_row) * k, lane, k, policy, wv);
    } else {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) wv[u] = make_uint4(0u, 0u, 0u, 0u);
    }
    kern_pdl_wait();  // everything below may read what the previous kernel in the stream wrote
    kern_pdl_launch_dependents();

    // 2. x into shared memory.
    stage_x(xs, k8);

    // 3. Rows.
    for (int row = first_row; row < n; row += row_stride) {
        const bf16* wrow = w + static_cast<size_t>(row) * k;
        float acc = 0.0f;
        for (int base = 0; base < k8; base += 32 * kUnroll) {
            // The first batch of the first row is already loaded.
            if (row != first_row || base != 0) load_batch<VEC, Src::kWeight>(wrow, base + lane, k, policy, wv);
            const uint4* xp = xs + base + lane;  // this lane's x chunks: xp[32 * u]
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                if (base + lane + 32 * u < k8) acc = dot8(wv[u], xp[32 * u], acc);
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) epilogue(row, acc);
    }
}

// Launch-shape guard shared by the entries: a partial warp would break the full-mask shuffles, and x
// (16 * ceil(k / 8) bytes) must fit the dynamic shared memory the launch gave. Uniform over the grid, so
// every block returns having read and written nothing; it waits first (PDL: a grid must not complete before
// its predecessor, or the kernel after it could overtake that predecessor).
KERN_DEV bool bad_launch(int n, int k) {
    bool bad = (blockDim.x & 31) != 0 || n <= 0 || k <= 0;
    bad = bad || dynamic_smem_bytes() < 16u * static_cast<uint32_t>((k + kChunk - 1) / kChunk);
    if (bad) kern_pdl_wait();
    return bad;
}

// x = the input vector, copied (kern_gemv; gemv_residual).
template <bool VEC>
KERN_DEV void stage_copy(uint4* xs, int k8, const bf16* x, int k) {
    for (int c = threadIdx.x; c < k8; c += blockDim.x) xs[c] = load_chunk<VEC, Src::kActivation>(x, c, k, 0);
    __syncthreads();
}

// x = bf16(norm_w * bf16(r * rsqrt(mean(r^2) + eps))), transformers' Qwen3RMSNorm rounding, fp32 math
// (the same function as kern_add_rmsnorm with delta = null; only the summation order differs).
template <bool VEC>
KERN_DEV void stage_rmsnorm(uint4* xs, int k8, const bf16* residual, const bf16* norm_w, int k, float eps) {
    __shared__ float scratch[32];
    float sum_sq = 0.0f;
    for (int c = threadIdx.x; c < k8; c += blockDim.x) {
        const uint4 raw = load_chunk<VEC, Src::kActivation>(residual, c, k, 0);
        float r[8];
        unpack8(raw, r);
#pragma unroll
        for (int i = 0; i < 8; ++i) sum_sq = fmaf(r[i], r[i], sum_sq);  // padding is 0: adds nothing
        xs[c] = raw;  // r, kept for the second pass (same thread reads it back)
    }
    const float inv_rms = rsqrtf(block_sum(sum_sq, scratch) / static_cast<float>(k) + eps);
    for (int c = threadIdx.x; c < k8; c += blockDim.x) {
        float r[8], g[8];
        unpack8(xs[c], r);
        unpack8(load_chunk<VEC, Src::kActivation>(norm_w, c, k, 0), g);
#pragma unroll
        for (int i = 0; i < 8; ++i) r[i] = g[i] * round_bf(r[i] * inv_rms);  // padding: 0 * 0
        xs[c] = pack8(r);
    }
    __syncthreads();
}

// x[j] = bf16(bf16(silu(gate[j])) * up[j]), gate_up row = [gate: k][up: k], with kern_silu_mul's exact fp32
// formula silu(g) = g / (1 + expf(-g)) (IEEE division). Two elements per step (one 4-byte word of gate and
// of up): the division's slow path needs registers, and the prefetched W batch holds 32 of the 64.

template <bool VEC>
KERN_DEV void stage_silu_mul(uint4* xs, int k8, const bf16* gate_up, int k) {
    if (VEC) {  // k % 8 == 0: k / 2 whole words, no padding
        const uint32_t* gate2 = reinterpret_cast<const uint32_t*>(gate_up);
        const uint32_t* up2 = reinterpret_cast<const uint32_t*>(gate_up + k);
        uint32_t* xs2 = reinterpret_cast<uint32_t*>(xs);
        for (int p = threadIdx.x; p < k / 2; p += blockDim.x) {
            const uint32_t g = __ldcg(gate2 + p), u = __ldcg(up2 + p);
            xs2[p] = pack2(silu_bf(lo_f(g)) * lo_f(u), silu_bf(hi_f(g)) * hi_f(u));
        }
    } else {  // element by element, zero padded to k8 * 8
        uint16_t* xs1 = reinterpret_cast<uint16_t*>(xs);
        for (int j = threadIdx.x; j < k8 * kChunk; j += blockDim.x) {
            const float x = j < k ? silu_bf(bf2f(__ldcg(gate_up + j))) * bf2f(__ldcg(gate_up + k + j)) : 0.0f;
            xs1[j] = __bfloat16_as_ushort(f2bf(x));
        }
    }
    __syncthreads();
}

// residual[row] = bf16(residual[row] + bf16(dot)): the projection is rounded to bf16, then added in bf16.
KERN_DEV void add_to_residual(bf16* residual, int row, float dot) {
    const float r = bf2f(__ldcg(residual + row));
    residual[row] = f2bf(r + round_bf(dot));
}

}  // namespace

// y[n] = W[n, k] @ x[k].
extern "C" __global__ void __launch_bounds__(kMaxThreads)
kern_gemv(const bf16* __restrict__ w, const bf16* __restrict__ x, bf16* __restrict__ y, int32_t n, int32_t k) {
    if (bad_launch(n, k)) return;
    auto stage = [=](uint4* xs, int k8) {
        if (k % kChunk == 0 && aligned16(x)) stage_copy<true>(xs, k8, x, k); else stage_copy<false>(xs, k8, x, k);
    };
    auto store = [=](int row, float dot) { y[row] = f2bf(dot); };
    if (k % kChunk == 0 && aligned16(w)) gemv_body<true>(w, n, k, stage, store);
    else gemv_body<false>(w, n, k, stage, store);
}

// y[n] = W[n, k] @ rmsnorm(residual[k]) * norm_w.
extern "C" __global__ void __launch_bounds__(kMaxThreads)
kern_gemv_rmsnorm(const bf16* __restrict__ w, const bf16* __restrict__ residual, const bf16* __restrict__ norm_w,
                  bf16* __restrict__ y, int32_t n, int32_t k, float eps) {
    if (bad_launch(n, k)) return;
    auto stage = [=](uint4* xs, int k8) {
        if (k % kChunk == 0 && aligned16(residual) && aligned16(norm_w))
            stage_rmsnorm<true>(xs, k8, residual, norm_w, k, eps);
        else
            stage_rmsnorm<false>(xs, k8, residual, norm_w, k, eps);
    };
    auto store = [=](int row, float dot) { y[row] = f2bf(dot); };
    if (k % kChunk == 0 && aligned16(w)) gemv_body<true>(w, n, k, stage, store);
    else gemv_body<false>(w, n, k, stage, store);
}

// residual[n] = bf16(residual + bf16(W[n, k] @ x[k])). x must not alias residual.
extern "C" __global__ void __launch_bounds__(kMaxThreads)
kern_gemv_residual(const bf16* __restrict__ w, const bf16* __restrict__ x, bf16* __restrict__ residual, int32_t n,
                   int32_t k) {
    if (bad_launch(n, k)) return;
    auto stage = [=](uint4* xs, int k8) {
        if (k % kChunk == 0 && aligned16(x)) stage_copy<true>(xs, k8, x, k); else stage_copy<false>(xs, k8, x, k);
    };
    auto add = [=](int row, float dot) { add_to_residual(residual, row, dot); };
    if (k % kChunk == 0 && aligned16(w)) gemv_body<true>(w, n, k, stage, add);
    else gemv_body<false>(w, n, k, stage, add);
}

// residual[n] = bf16(residual + bf16(W[n, k] @ (bf16(silu(gate)) * up))), gate_up = [gate: k][up: k].
// gate_up must not alias residual.
extern "C" __global__ void __launch_bounds__(kMaxThreads)
kern_gemv_silu_residual(const bf16* __restrict__ w, const bf16* __restrict__ gate_up, bf16* __restrict__ residual,
                        int32_t n, int32_t k) {
    if (bad_launch(n, k)) return;
    auto stage = [=](uint4* xs, int k8) {
        if (k % kChunk == 0 && aligned16(gate_up)) stage_silu_mul<true>(xs, k8, gate_up, k);
        else stage_silu_mul<false>(xs, k8, gate_up, k);
    };
    auto add = [=](int row, float dot) { add_to_residual(residual, row, dot); };
    if (k % kChunk == 0 && aligned16(w)) gemv_body<true>(w, n, k, stage, add);
    else gemv_body<false>(w, n, k, stage, add);
}

// =====================================================================================================
// Rows family (docs/kernels-gemv.md "Rows entries"): a block owns a GROUP of kRows W rows at a time and
// its threads split K. Thread t streams chunks t, t + B, t + 2B, ... (B = blockDim.x) of all kRows rows:
// one STEP is one chunk of each of the kRows rows (kRows independent 16-byte loads), and a group is
// nb = ceil(k8 / B) steps. Each x chunk (shared memory) is reused across the kRows rows. A warp's loads of
// one row are 512 contiguous bytes. After a group's last step: per row a warp butterfly, then the warps'
// partial sums in shared memory summed in warp order by thread r (< kRows), then the epilogue. Groups are
// dealt to blocks round-robin:
//   block b owns groups b, b + gridDim.x, b + 2 gridDim.x, ...
// so any grid >= 1 is correct; the generator launches min(groups, resident blocks per SM * SMs), so x is
// staged once per block.
// Software pipeline: a block's steps (over all its groups, in order) go through two register slots, so a
// thread always has the next step's loads in flight while it multiplies the current one, including across
// a group boundary: the next group's first loads are issued before this group's reduction and epilogue.
// PDL as gemv_body: the first two steps are loaded (coherent path) before griddepcontrol.wait; everything
// reading the previous kernel's output comes after it.
// =====================================================================================================
namespace {

constexpr int kRows = 4;  // W rows per group

// wv[r] = chunk c of row rows[r] (0 for rows[r] < 0 or c past the k8 chunks).
template <bool VEC, Src SRC>
KERN_DEV void load_rows_step(const bf16* w, int k, const int (&rows)[kRows], int c, uint64_t policy,
                             uint4 (&wv)[kRows]) {
    const int k8 = (k + kChunk - 1) / kChunk;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        if (rows[r] >= 0 && c < k8) {
            wv[r] = load_chunk<VEC, SRC>(w + static_cast<size_t>(rows[r]) * k, c, k, policy);
        } else {
            wv[r] = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

// `row_of(g, rows)`: the kRows physical W rows of group g (-1: no row; contributes nothing).
// `stage_x(xs, k8)`: as in gemv_body (every thread; ends with __syncthreads()).
// `pre(g)`: called by every thread when group g starts (the first group: right after the wait, before x is
// staged; later groups: when their first step is multiplied), so an epilogue operand (the residual row) is
// in flight with the group's loads; its value is handed to the epilogue.
// `epilogue(g, tot, pre_value)`: called by EVERY thread of the block after tot[r] (shared, fp32) holds
// W[rows[r]] . x; it writes from the threads it picks (thread index < kRows or fewer).
template <bool VEC, class RowOf, class StageX, class Pre, class Epilogue>
KERN_DEV void rows_body(const bf16* __restrict__ w, int groups, int k, RowOf row_of, StageX stage_x, Pre pre,
                        Epilogue epilogue) {
    extern __shared__ uint4 xs[];  // [round_up(k, 8) / 8] chunks of 8 bf16
    __shared__ float red[32][kRows];
    __shared__ float tot[kRows];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warps = blockDim.x >> 5;
    const int B = static_cast<int>(blockDim.x);
    const int k8 = (k + kChunk - 1) / kChunk;
    const int nb = (k8 + B - 1) / B;  // steps per group
    const int g_first = blockIdx.x;
    const int n_steps = g_first < groups ? ((groups - 1 - g_first) / static_cast<int>(gridDim.x) + 1) * nb : 0;
    const uint64_t policy = weight_policy();

    // Load cursor: the next step to issue is step lj of group lg, whose rows are lrows.
    int lg = g_first, lj = 0;
    int lrows[kRows];
    if (n_steps > 0) {
        row_of(lg, lrows);
    } else {
#pragma unroll
        for (int r = 0; r < kRows; ++r) lrows[r] = -1;
    }
    auto advance_load = [&]() {
        if (++lj == nb) {
            lj = 0;
            lg += gridDim.x;
            if (lg < groups) row_of(lg, lrows);
        }
    };

    // 1. The first two steps: weights only (may overlap the previous kernel's tail).
    uint4 wa[kRows], wb[kRows];
    load_rows_step<VEC, Src::kWeightEarly>(w, k, lrows, tid + lj * B, policy, wa);
    advance_load();
    if (n_steps > 1) {
        load_rows_step<VEC, Src::kWeightEarly>(w, k, lrows, tid + lj * B, policy, wb);
        advance_load();
    }
    kern_pdl_wait();  // everything below may read what the previous kernel in the stream wrote
    kern_pdl_launch_dependents();
    float pre_value = n_steps > 0 ? pre(g_first) : 0.0f;

    // 2. x into shared memory.
    stage_x(xs, k8);

    // 3. Steps. Consume cursor: step cj of group cg.
    int cg = g_first, cj = 0;
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
    auto multiply = [&](const uint4 (&wv)[kRows]) {
        if (cj == 0 && cg != g_first) pre_value = pre(cg);
        const int c = tid + cj * B;
        if (c < k8) {
            const uint4 xv = xs[c];
#pragma unroll
            for (int r = 0; r < kRows; ++r) acc[r] = dot8(wv[r], xv, acc[r]);
        }
    };
    auto finish_step = [&]() {  // uniform over the block: every thread has the same steps
        if (++cj < nb) return;
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r] = warp_sum(acc[r]);
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < kRows; ++r) red[warp][r] = acc[r];
        }
        __syncthreads();
        if (tid < kRows) {
            float t = 0.0f;
            for (int i = 0; i < warps; ++i) t += red[i][tid];  // fixed order: deterministic
            tot[tid] = t;
        }
        __syncthreads();  // tot ready; red free for the next group
        epilogue(cg, tot, pre_value);
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
        cj = 0;
        cg += gridDim.x;
    };
    for (int i = 0; i < n_steps; i += 2) {
        multiply(wa);
        if (i + 2 < n_steps) {  // refill slot a before this step's reduction (if any) runs
            load_rows_step<VEC, Src::kWeight>(w, k, lrows, tid + lj * B, policy, wa);
            advance_load();
        }
        finish_step();
        if (i + 1 < n_steps) {
            multiply(wb);
            if (i + 3 < n_steps) {
                load_rows_step<VEC, Src::kWeight>(w, k, lrows, tid + lj * B, policy, wb);
                advance_load();
            }
            finish_step();
        }
    }
}

// For entries whose epilogue needs no operand loaded ahead.
KERN_DEV float no_pre(int) { return 0.0f; }

// Plain row mapping: group g = rows [kRows g, kRows g + kRows) below n.
KERN_DEV int row_groups(int n) { return (n + kRows - 1) / kRows; }
struct PlainRows {
    int n;
    KERN_DEV void operator()(int g, int (&rows)[kRows]) const {
#pragma unroll
        for (int r = 0; r < kRows; ++r) rows[r] = g * kRows + r < n ? g * kRows + r : -1;
    }
};

}  // namespace

// y[n] = W[n, k] @ x[k] (rows family; same contract as kern_gemv).
extern "C" __global__ void __launch_bounds__(kMaxThreads)
kern_gemv_rows(const bf16* __restrict__ w, const bf16* __restrict__ x, bf16* __restrict__ y, int32_t n, int32_t k) {
    if (bad_launch(n, k)) return;
    const PlainRows row_of{n};
    auto stage = [=](uint4* xs, int k8) {
        if (k % kChunk == 0 && aligned16(x)) stage_copy<true>(xs, k8, x, k); else stage_copy<false>(xs, k8, x, k);
    };
    auto store = [=](int g, const float* tot, float) {
        const int row = g * kRows + static_cast<int>(threadIdx.x);
        if (threadIdx.x < kRows && row < n) y[row] = f2bf(tot[threadIdx.x]);
    };
    if (k % kChunk == 0 && aligned16(w)) rows_body<true>(w, row_groups(n), k, row_of, stage, no_pre, store);
    else rows_body<false>(w, row_groups(n), k, row_of, stage, no_pre, store);
}

// y[n] = W[n, k] @ rmsnorm(residual[k]) * norm_w (rows family; same contract as kern_gemv_rmsnorm).
extern "C" __global__ void __launch_bounds__(kMaxThreads)
kern_gemv_rows_rmsnorm(const bf16* __restrict__ w, const bf16* __restrict__ residual, const bf16* __restrict__ norm_w,
                       bf16* __restrict__ y, int32_t n, int32_t k, float eps) {
    if (bad_launch(n, k)) return;
    const PlainRows row_of{n};
    auto stage = [=](uint4* xs, int k8) {
        if (k % kChunk == 0 && aligned16(residual) && aligned16(norm_w))
            stage_rmsnorm<true>(xs, k8, residual, norm_w, k, eps);
        else
            stage_rmsnorm<false>(xs, k8, residual, norm_w, k, eps);
    };
    auto store = [=](int g, const float* tot, float) {
        const int row = g * kRows + static_cast<int>(threadIdx.x);
        if (threadIdx.x < kRows && row < n) y[row] = f2bf(tot[threadIdx.x]);
    };
    if (k % kChunk == 0 && aligned16(w)) rows_body<true>(w, row_groups(n), k, row_of, stage, no_pre, store);
    else rows_body<false>(w, row_groups(n), k, row_of, stage, no_pre, store);
}

// residual[n] = bf16(residual + bf16(W[n, k] @ x[k])) (rows family; same contract as kern_gemv_residual).
extern "C" __global__ void __launch_bounds__(kMaxThreads)
kern_gemv_rows_residual(const bf16* __restrict__ w, const bf16* __restrict__ x, bf16* __restrict__ residual,
                        int32_t n, int32_t k) {
    if (bad_launch(n, k)) return;
    const PlainRows row_of{n};
    auto stage = [=](uint4* xs, int k8) {
        if (k % kChunk == 0 && aligned16(x)) stage_copy<true>(xs, k8, x, k); else stage_copy<false>(xs, k8, x, k);
    };
    // the residual row of thread r < kRows, loaded when the group starts (nothing else writes it meanwhile: a
    // row belongs to one group), added in the epilogue as add_to_residual does
    auto pre = [=](int g) {
        const int row = g * kRows + static_cast<int>(threadIdx.x);
        return (threadIdx.x < kRows && row < n) ? bf2f(__ldcg(residual + row)) : 0.0f;
    };
    auto add = [=](int g, const float* tot, float r) {
        const int row = g * kRows + static_cast<int>(threadIdx.x);
        if (threadIdx.x < kRows && row < n) residual[row] = f2bf(r + round_bf(tot[threadIdx.x]));
    };
    if (k % kChunk == 0 && aligned16(w)) rows_body<true>(w, row_groups(n), k, row_of, stage, pre, add);
    else rows_body<false>(w, row_groups(n), k, row_of, stage, pre, add);
}

// act[j] = bf16(bf16(silu(bf16(gate_j))) * bf16(up_j)), j < inter, where gate_j = W[j] . x and
// up_j = W[inter + j] . x, x = the RMSNorm prologue of kern_gemv_rmsnorm; w_gate_up = [gate: inter rows]
// [up: inter rows] x k (the checkpoint's concatenated gate_up). Rows family: group g computes outputs
// j = 2g, 2g + 1 from the physical rows (2g, 2g + 1, inter + 2g, inter + 2g + 1); silu as kern_silu_mul
// (g / (1 + expf(-g)), IEEE division). act must not alias the inputs.
extern "C" __global__ void __launch_bounds__(kMaxThreads)
kern_gemv_rmsnorm_swiglu(const bf16* __restrict__ w_gate_up, const bf16* __restrict__ residual,
                         const bf16* __restrict__ norm_w, bf16* __restrict__ act, int32_t inter, int32_t k, float eps) {
    static_assert(kRows == 4, "swiglu groups are 2 outputs = 2 gate rows + 2 up rows");
    if (bad_launch(inter, k)) return;
    auto row_of = [=](int g, int (&rows)[kRows]) {
        const int j0 = 2 * g, j1 = 2 * g + 1;
        rows[0] = j0 < inter ? j0 : -1;
        rows[1] = j1 < inter ? j1 : -1;
        rows[2] = j0 < inter ? inter + j0 : -1;
        rows[3] = j1 < inter ? inter + j1 : -1;
    };
    auto stage = [=](uint4* xs, int k8) {
        if (k % kChunk == 0 && aligned16(residual) && aligned16(norm_w))
            stage_rmsnorm<true>(xs, k8, residual, norm_w, k, eps);
        else
            stage_rmsnorm<false>(xs, k8, residual, norm_w, k, eps);
    };
    auto store = [=](int g, const float* tot, float) {
        const int t = static_cast<int>(threadIdx.x);
        const int j = 2 * g + t;
        if (t < 2 && j < inter) {
            const float gate = round_bf(tot[t]), up = round_bf(tot[2 + t]);  // the GEMM outputs, bf16
            act[j] = f2bf(silu_bf(gate) * up);
        }
    };
    const int groups = (inter + 1) / 2;
    if (k % kChunk == 0 && aligned16(w_gate_up)) rows_body<true>(w_gate_up, groups, k, row_of, stage, no_pre, store);
    else rows_body<false>(w_gate_up, groups, k, row_of, stage, no_pre, store);
}

// =====================================================================================================
// Multi-row rows family (docs/kernels-gemv.md "Multi-row rows entries"): the rows entries for m <= M input
// rows at once (M = 2, 4, 8: the `_mM` suffix; m the trailing i32 argument). x / residual / y are [m, k] /
// [m, n] row-major. Same work split as rows_body at the same block size: thread t streams chunks
// t, t + B, ... of the group's kRows W rows, each W chunk loaded once and multiplied with the same chunk of
// every x row (x staged as M rows of k8 chunks; rows m..M-1 zero). Each (x row, W row) pair has its own fp32
// accumulator fed in the same chunk order, reduced by the same warp butterfly and the same warp-order sum as
// rows_body, and every x row is staged by the same code as the M = 1 entry (stage_rmsnorm / stage_copy on
// that row), so row s of the output is bit for bit the M = 1 entry's output for x row s alone at the same
// blockDim.x (the grid does not enter a row's arithmetic). Rows m..M-1 of the outputs are never written.
// Dynamic shared memory: M * 16 * ceil(k / 8) bytes. PDL exactly as rows_body.
// =====================================================================================================
namespace {

// As rows_body, for M x rows. `stage_x(xs, k8)` fills xs[s * k8 + c] for s < M (rows >= m zero) and ends with
// __syncthreads(). `pre(g)` / `epilogue(g, tot, pre_value)`: thread t < M * kRows owns (x row t / kRows,
// group row t % kRows); tot[t] = W[rows[t % kRows]] . x[t / kRows].
template <int M, bool VEC, class RowOf, class StageX, class Pre, class Epilogue>
KERN_DEV void rows_body_m(const bf16* __restrict__ w, int groups, int k, int m, RowOf row_of, StageX stage_x, Pre pre,
                          Epilogue epilogue) {
    constexpr int kOut = M * kRows;  // accumulators per thread
    extern __shared__ uint4 xs[];    // [M][round_up(k, 8) / 8] chunks of 8 bf16
    __shared__ float red[32][kOut];
    __shared__ float tot[kOut];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warps = blockDim.x >> 5;
    const int B = static_cast<int>(blockDim.x);
    const int k8 = (k + kChunk - 1) / kChunk;
    const int nb = (k8 + B - 1) / B;  // steps per group
    const int g_first = blockIdx.x;
    const int n_steps = g_first < groups ? ((groups - 1 - g_first) / static_cast<int>(gridDim.x) + 1) * nb : 0;
    const uint64_t policy = weight_policy();

    int lg = g_first, lj = 0;
    int lrows[kRows];
    if (n_steps > 0) {
        row_of(lg, lrows);
    } else {
#pragma unroll
        for (int r = 0; r < kRows; ++r) lrows[r] = -1;
    }
    auto advance_load = [&]() {
        if (++lj == nb) {
            lj = 0;
            lg += gridDim.x;
            if (lg < groups) row_of(lg, lrows);
        }
    };

    // 1. The first two steps: weights only (may overlap the previous kernel's tail).
    uint4 wa[kRows], wb[kRows];
    load_rows_step<VEC, Src::kWeightEarly>(w, k, lrows, tid + lj * B, policy, wa);
    advance_load();
    if (n_steps > 1) {
        load_rows_step<VEC, Src::kWeightEarly>(w, k, lrows, tid + lj * B, policy, wb);
        advance_load();
    }
    kern_pdl_wait();  // everything below may read what the previous kernel in the stream wrote
    kern_pdl_launch_dependents();
    float pre_value = n_steps > 0 ? pre(g_first) : 0.0f;

    // 2. The M x rows into shared memory.
    stage_x(xs, k8);

    // 3. Steps.
    int cg = g_first, cj = 0;
    float acc[M][kRows];
#pragma unroll
    for (int s = 0; s < M; ++s)
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[s][r] = 0.0f;
    auto multiply = [&](const uint4 (&wv)[kRows]) {
        if (cj == 0 && cg != g_first) pre_value = pre(cg);
        const int c = tid + cj * B;
        if (c < k8) {
#pragma unroll
            for (int s = 0; s < M; ++s) {
                const uint4 xv = xs[s * k8 + c];
#pragma unroll
                for (int r = 0; r < kRows; ++r) acc[s][r] = dot8(wv[r], xv, acc[s][r]);
            }
        }
    };
    auto finish_step = [&]() {  // uniform over the block
        if (++cj < nb) return;
#pragma unroll
        for (int s = 0; s < M; ++s) {
            if (s < m) {  // uniform; rows >= m are never written
#pragma unroll
                for (int r = 0; r < kRows; ++r) acc[s][r] = warp_sum(acc[s][r]);
                if (lane == 0) {
#pragma unroll
                    for (int r = 0; r < kRows; ++r) red[warp][s * kRows + r] = acc[s][r];
                }
            }
        }
        __syncthreads();
        if (tid < m * kRows) {
            float t = 0.0f;
            for (int i = 0; i < warps; ++i) t += red[i][tid];  // fixed order: rows_body's
            tot[tid] = t;
        }
        __syncthreads();  // tot ready; red free for the next group
        epilogue(cg, tot, pre_value);
#pragma unroll
        for (int s = 0; s < M; ++s)
#pragma unroll
            for (int r = 0; r < kRows; ++r) acc[s][r] = 0.0f;
        cj = 0;
        cg += gridDim.x;
    };
    for (int i = 0; i < n_steps; i += 2) {
        multiply(wa);
        if (i + 2 < n_steps) {
            load_rows_step<VEC, Src::kWeight>(w, k, lrows, tid + lj * B, policy, wa);
            advance_load();
        }
        finish_step();
        if (i + 1 < n_steps) {
            multiply(wb);
            if (i + 3 < n_steps) {
                load_rows_step<VEC, Src::kWeight>(w, k, lrows, tid + lj * B, policy, wb);
                advance_load();
            }
            finish_step();
        }
    }
}

// bad_launch for M rows: also 1 <= m <= M and M * 16 * ceil(k / 8) bytes of dynamic shared memory.
template <int M>
KERN_DEV bool bad_launch_m(int n, int k, int m) {
    bool bad = (blockDim.x & 31) != 0 || n <= 0 || k <= 0 || m < 1 || m > M;
    bad = bad || dynamic_smem_bytes() < static_cast<uint32_t>(M) * 16u * static_cast<uint32_t>((k + kChunk - 1) / kChunk);
    if (bad) kern_pdl_wait();
    return bad;
}

// Zero x rows m..M-1 (their accumulators are computed and dropped), then the barrier the body expects.
template <int M>
KERN_DEV void zero_rows(uint4* xs, int k8, int m) {
    for (int c = m * k8 + static_cast<int>(threadIdx.x); c < M * k8; c += blockDim.x) xs[c] = make_uint4(0u, 0u, 0u, 0u);
    __syncthreads();
}

// x rows = rmsnorm(residual[s]) * norm_w, s < m, each staged exactly as the M = 1 entry stages its one row.
template <int M>
KERN_DEV void stage_rmsnorm_m(uint4* xs, int k8, int m, const bf16* residual, const bf16* norm_w, int k, float eps) {
    const bool vec = k % kChunk == 0 && aligned16(residual) && aligned16(norm_w);
    for (int s = 0; s < m; ++s) {
        if (vec) stage_rmsnorm<true>(xs + s * k8, k8, residual + static_cast<size_t>(s) * k, norm_w, k, eps);
        else stage_rmsnorm<false>(xs + s * k8, k8, residual + static_cast<size_t>(s) * k, norm_w, k, eps);
    }
    zero_rows<M>(xs, k8, m);
}

template <int M>
KERN_DEV void stage_copy_m(uint4* xs, int k8, int m, const bf16* x, int k) {
    const bool vec = k % kChunk == 0 && aligned16(x);
    for (int s = 0; s < m; ++s) {
        if (vec) stage_copy<true>(xs + s * k8, k8, x + static_cast<size_t>(s) * k, k);
        else stage_copy<false>(xs + s * k8, k8, x + static_cast<size_t>(s) * k, k);
    }
    zero_rows<M>(xs, k8, m);
}

template <int M>
KERN_DEV void gemv_rows_rmsnorm_m(const bf16* __restrict__ w, const bf16* __restrict__ residual,
                                  const bf16* __restrict__ norm_w, bf16* __restrict__ y, int n, int k, float eps, int m) {
    if (bad_launch_m<M>(n, k, m)) return;
    const PlainRows row_of{n};
    auto stage = [=](uint4* xs, int k8) { stage_rmsnorm_m<M>(xs, k8, m, residual, norm_w, k, eps); };
    auto store = [=](int g, const float* tot, float) {
        const int t = static_cast<int>(threadIdx.x), s = t / kRows, row = g * kRows + t % kRows;
        if (t < m * kRows && row < n) y[static_cast<size_t>(s) * n + row] = f2bf(tot[t]);
    };
    if (k % kChunk == 0 && aligned16(w)) rows_body_m<M, true>(w, row_groups(n), k, m, row_of, stage, no_pre, store);
    else rows_body_m<M, false>(w, row_groups(n), k, m, row_of, stage, no_pre, store);
}

template <int M>
KERN_DEV void gemv_rows_residual_m(const bf16* __restrict__ w, const bf16* __restrict__ x, bf16* __restrict__ residual,
                                   int n, int k, int m) {
    if (bad_launch_m<M>(n, k, m)) return;
    const PlainRows row_of{n};
    auto stage = [=](uint4* xs, int k8) { stage_copy_m<M>(xs, k8, m, x, k); };
    // thread t < m * kRows: residual[t / kRows, row], loaded when the group starts (as kern_gemv_rows_residual)
    auto pre = [=](int g) {
        const int t = static_cast<int>(threadIdx.x), s = t / kRows, row = g * kRows + t % kRows;
        return (t < m * kRows && row < n) ? bf2f(__ldcg(residual + static_cast<size_t>(s) * n + row)) : 0.0f;
    };
    auto add = [=](int g, const float* tot, float r) {
        const int t = static_cast<int>(threadIdx.x), s = t / kRows, row = g * kRows + t % kRows;
        if (t < m * kRows && row < n) residual[static_cast<size_t>(s) * n + row] = f2bf(r + round_bf(tot[t]));
    };
    if (k % kChunk == 0 && aligned16(w)) rows_body_m<M, true>(w, row_groups(n), k, m, row_of, stage, pre, add);
    else rows_body_m<M, false>(w, row_groups(n), k, m, row_of, stage, pre, add);
}

template <int M>
KERN_DEV void gemv_rmsnorm_swiglu_m(const bf16* __restrict__ w_gate_up, const bf16* __restrict__ residual,
                                    const bf16* __restrict__ norm_w, bf16* __restrict__ act, int inter, int k, float eps,
                                    int m) {
    static_assert(kRows == 4, "swiglu groups are 2 outputs = 2 gate rows + 2 up rows");
    if (bad_launch_m<M>(inter, k, m)) return;
    auto row_of = [=](int g, int (&rows)[kRows]) {
        const int j0 = 2 * g, j1 = 2 * g + 1;
        rows[0] = j0 < inter ? j0 : -1;
        rows[1] = j1 < inter ? j1 : -1;
        rows[2] = j0 < inter ? inter + j0 : -1;
        rows[3] = j1 < inter ? inter + j1 : -1;
    };
    auto stage = [=](uint4* xs, int k8) { stage_rmsnorm_m<M>(xs, k8, m, residual, norm_w, k, eps); };
    // thread t < 2 m: x row s = t / 2, output j = 2 g + t % 2 (gate tot[4 s + t % 2], up tot[4 s + 2 + t % 2])
    auto store = [=](int g, const float* tot, float) {
        const int t = static_cast<int>(threadIdx.x), s = t / 2, o = t % 2, j = 2 * g + o;
        if (t < 2 * m && j < inter) {
            const float gate = round_bf(tot[s * kRows + o]), up = round_bf(tot[s * kRows + 2 + o]);
            act[static_cast<size_t>(s) * inter + j] = f2bf(silu_bf(gate) * up);
        }
    };
    const int groups = (inter + 1) / 2;
    if (k % kChunk == 0 && aligned16(w_gate_up))
        rows_body_m<M, true>(w_gate_up, groups, k, m, row_of, stage, no_pre, store);
    else
        rows_body_m<M, false>(w_gate_up, groups, k, m, row_of, stage, no_pre, store);
}

// Registers (nvcc 13.0, cuobjdump -res-usage; rows_m.py THREADS_PER_SM_M holds the same numbers for the grid):
// _m2 capped at 72 (no stack; 896 threads per SM; at 64 the RMSNorm kinds keep 8 / 32 bytes on the stack),
// _m4 / _m8 under __launch_bounds__(512) (the rows launch's largest block, docs/kernels-gemv.md "Launch"): 120..128,
// no stack, 512 threads per SM (at 64..96 they spill 8..280 bytes).
constexpr int kMaxThreadsM = 512;

}  // namespace

#define KERN_GEMV_ROWS_M(M, BOUNDS)                                                                                  \
    extern "C" __global__ void BOUNDS kern_gemv_rows_rmsnorm_m##M(                          \
        const bf16* __restrict__ w, const bf16* __restrict__ residual, const bf16* __restrict__ norm_w,             \
        bf16* __restrict__ y, int32_t n, int32_t k, float eps, int32_t m) {                                          \
        gemv_rows_rmsnorm_m<M>(w, residual, norm_w, y, n, k, eps, m);                                                \
    }                                                                                                                \
    extern "C" __global__ void BOUNDS kern_gemv_rows_residual_m##M(                         \
        const bf16* __restrict__ w, const bf16* __restrict__ x, bf16* __restrict__ residual, int32_t n, int32_t k,   \
        int32_t m) {                                                                                                 \
        gemv_rows_residual_m<M>(w, x, residual, n, k, m);                                                            \
    }                                                                                                                \
    extern "C" __global__ void BOUNDS kern_gemv_rmsnorm_swiglu_m##M(                        \
        const bf16* __restrict__ w_gate_up, const bf16* __restrict__ residual, const bf16* __restrict__ norm_w,     \
        bf16* __restrict__ act, int32_t inter, int32_t k, float eps, int32_t m) {                                    \
        gemv_rmsnorm_swiglu_m<M>(w_gate_up, residual, norm_w, act, inter, k, eps, m);                                \
    }

// y[s, n] = W[n, k] @ rmsnorm(residual[s, k]) * norm_w; residual[s, n] += bf16(W @ x[s]); act[s, inter] = swiglu
// (as kern_gemv_rows_rmsnorm / kern_gemv_rows_residual / kern_gemv_rmsnorm_swiglu), rows s < m <= M.
KERN_GEMV_ROWS_M(2, __maxnreg__(72))
KERN_GEMV_ROWS_M(4, __launch_bounds__(kMaxThreadsM))
KERN_GEMV_ROWS_M(8, __launch_bounds__(kMaxThreadsM))

// =====================================================================================================
// Multi-row v1 RMSNorm entry (docs/kernels-gemv.md "Multi-row rows entries"; the lm_head of a batched decode):
// kern_gemv_rmsnorm for m <= M residual rows at once (M = 2, 4, 8: the `_mM` suffix; m the trailing i32).
// residual / y are [m, k] / [m, n] row-major. Same work split as gemv_body: rows dealt to warps
// block-interleaved, lane l streams chunks l, l + 32, ... of its W row kUnroll at a time (the first batch of
// the first row before griddepcontrol.wait), and each W chunk is multiplied with the same chunk of every x row
// (x staged as M rows of k8 chunks by stage_rmsnorm_m: each row staged by the M = 1 entry's stage_rmsnorm,
// rows m..M-1 zero). Each x row has its own fp32 accumulator fed in gemv_body's chunk order and reduced by
// the same butterfly, so row s of y is bit for bit kern_gemv_rmsnorm's output for residual row s alone at
// the same blockDim.x (the block size enters only the RMSNorm's block_sum; the grid enters nothing).
// Rows m..M-1 of y are never written. Dynamic shared memory: M * 16 * ceil(k / 8) bytes. PDL as gemv_body.
// =====================================================================================================
namespace {

// As gemv_body, for M x rows: `stage_x(xs, k8)` fills xs[s * k8 + c], s < M, and ends with __syncthreads();
// `epilogue(s, row, dot)`: lane 0 of the warp owning `row`, s < m, dot = W[row] . x[s].
template <int M, bool VEC, class StageX, class Epilogue>
KERN_DEV void gemv_body_m(const bf16* __restrict__ w, int n, int k, int m, StageX stage_x, Epilogue epilogue) {
    extern __shared__ uint4 xs[];  // [M][round_up(k, 8) / 8] chunks of 8 bf16
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    const int k8 = (k + kChunk - 1) / kChunk;
    const int first_row = warp * gridDim.x + blockIdx.x;  // gemv_body's deal
    const int row_stride = warps * gridDim.x;
    const uint64_t policy = weight_policy();

    // 1. First W chunks of the first row: weights only, so they may overlap the previous kernel's tail.
    uint4 wv[kUnroll];
    if (first_row < n) {
        load_batch<VEC, Src::kWeightEarly>(w + static_cast<size_t>(first_row) * k, lane, k, policy, wv);
    } else {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) wv[u] = make_uint4(0u, 0u, 0u, 0u);
    }
    kern_pdl_wait();  // everything below may read what the previous kernel in the stream wrote
    kern_pdl_launch_dependents();

    // 2. The M x rows into shared memory.
    stage_x(xs, k8);

    // 3. Rows.
    for (int row = first_row; row < n; row += row_stride) {
        const bf16* wrow = w + static_cast<size_t>(row) * k;
        float acc[M];
#pragma unroll
        for (int s = 0; s < M; ++s) acc[s] = 0.0f;
        for (int base = 0; base < k8; base += 32 * kUnroll) {
            if (row != first_row || base != 0) load_batch<VEC, Src::kWeight>(wrow, base + lane, k, policy, wv);
            const uint4* xp = xs + base + lane;  // x row s, this lane's chunks: xp[s * k8 + 32 * u]
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                if (base + lane + 32 * u < k8) {
#pragma unroll
                    for (int s = 0; s < M; ++s) acc[s] = dot8(wv[u], xp[s * k8 + 32 * u], acc[s]);
                }
            }
        }
#pragma unroll
        for (int s = 0; s < M; ++s) {
            if (s < m) {  // uniform; rows >= m are never written
                acc[s] = warp_sum(acc[s]);
                if (lane == 0) epilogue(s, row, acc[s]);
            }
        }
    }
}

template <int M>
KERN_DEV void gemv_rmsnorm_m(const bf16* __restrict__ w, const bf16* __restrict__ residual,
                             const bf16* __restrict__ norm_w, bf16* __restrict__ y, int n, int k, float eps, int m) {
    if (bad_launch_m<M>(n, k, m)) return;
    auto stage = [=](uint4* xs, int k8) { stage_rmsnorm_m<M>(xs, k8, m, residual, norm_w, k, eps); };
    auto store = [=](int s, int row, float dot) { y[static_cast<size_t>(s) * n + row] = f2bf(dot); };
    if (k % kChunk == 0 && aligned16(w)) gemv_body_m<M, true>(w, n, k, m, stage, store);
    else gemv_body_m<M, false>(w, n, k, m, stage, store);
}

}  // namespace

// y[s, n] = W[n, k] @ rmsnorm(residual[s, k]) * norm_w, rows s < m <= M (as kern_gemv_rmsnorm on each row).
#define KERN_GEMV_RMSNORM_M(M, BOUNDS)                                                                                \
    extern "C" __global__ void BOUNDS kern_gemv_rmsnorm_m##M(                                                        \
        const bf16* __restrict__ w, const bf16* __restrict__ residual, const bf16* __restrict__ norm_w,             \
        bf16* __restrict__ y, int32_t n, int32_t k, float eps, int32_t m) {                                          \
        gemv_rmsnorm_m<M>(w, residual, norm_w, y, n, k, eps, m);                                                     \
    }

KERN_GEMV_RMSNORM_M(2, __launch_bounds__(kMaxThreadsM))
KERN_GEMV_RMSNORM_M(4, __launch_bounds__(kMaxThreadsM))
KERN_GEMV_RMSNORM_M(8, __launch_bounds__(kMaxThreadsM))
