// Weight-streaming probe (bench/stream_probe.py): how fast can one resident block per SM stream a weight matrix
// from HBM, by load method and shape? Each warp reads whole tiles of 16 rows x `row_bytes` (tile t = global warp
// index + total warps x j) in steps of 16 rows x U 64-byte chunks, and folds every byte it reads into a checksum
// (so no load is narrowed or dropped). Nothing is multiplied: this measures the memory side of the small-M
// projections (kernels-src/gemv_mma.cu) and of a persistent decode's projection tiles, not their math.
//
// Kinds (one entry each, U and warps per block compile-time):
//   frag_*: registers, two slots of a step each; lane (g, t) reads 16 bytes at rows g and g + 8, chunk u, bytes
//           [16t, 16t + 16): the mma A-fragment pattern of gemv_mma.cu (8 rows x 64 bytes per instruction).
//   row_*:  registers, the same two slots; lane l of instruction i reads the step's 16 rows flattened row-major,
//           piece 32 i + l (U = 8: one row's 512 contiguous bytes per instruction).
//   async_*: cp.async 16 bytes a lane into a per-warp shared ring of S steps (the row_ mapping), wait_group S - 2.
//   bulk_*: cp.async.bulk (the TMA engine, 1-D) of each row's U x 64 bytes into a per-warp ring of S steps, one
//           mbarrier a step (expect_tx by lane 0, one copy per row by lanes 0..15), read back with LDS.128.
#include "../kernels-src/gemv_mma.cuh"  // weight_policy, ldg_weight: the MMA entries' own weight loads

#define DEV __device__ __forceinline__

namespace {

DEV uint4 ldw(const uint8_t* p, uint64_t pol) { return ldg_weight(reinterpret_cast<const __nv_bfloat16*>(p), pol); }
DEV uint32_t fold(uint4 v) { return v.x ^ (v.y * 3u) ^ (v.z * 5u) ^ (v.w * 7u); }
DEV uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// Byte offset, within a step's 16 x (U * 64) bytes of a tile, of lane `lane`'s piece of instruction i (2U of them).
template <bool kFrag, int U>
DEV void piece(int i, int lane, int& row, int& off) {
    if (kFrag) {  // instruction i = 2u + h: rows g + 8h, chunk u, 16 t
        const int u = i >> 1, h = i & 1, g = lane >> 2, t = lane & 3;
        row = g + 8 * h;
        off = 64 * u + 16 * t;
    } else {  // flattened row-major, 4U pieces a row
        const int f = 32 * i + lane;
        row = f / (4 * U);
        off = 16 * (f % (4 * U));
    }
}

template <bool kFrag, int U, int kWarps>
DEV void regs_entry(const uint8_t* __restrict__ w, int rows, int row_bytes, uint32_t* __restrict__ out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gw = blockIdx.x * kWarps + warp, nw = gridDim.x * kWarps;
    const int tiles = rows / 16, steps = row_bytes / (64 * U);
    const uint64_t pol = weight_policy();
    uint32_t sum = 0;
    uint4 s0[2 * U], s1[2 * U];
    const int my_tiles = gw < tiles ? (tiles - 1 - gw) / nw + 1 : 0;
    const int n = my_tiles * steps;
    auto load = [&](int s, uint4 (&r)[2 * U]) {
        const int tile = gw + nw * (s / steps), step = s % steps;
        const uint8_t* base = w + (static_cast<size_t>(tile) * 16) * row_bytes + step * 64 * U;
#pragma unroll
        for (int i = 0; i < 2 * U; ++i) {
            int row, off;
            piece<kFrag, U>(i, lane, row, off);
            r[i] = ldw(base + static_cast<size_t>(row) * row_bytes + off, pol);
        }
    };
    auto use = [&](const uint4 (&r)[2 * U]) {
#pragma unroll
        for (int i = 0; i < 2 * U; ++i) sum += fold(r[i]);
    };
    if (n > 0) load(0, s0);
    if (n > 1) load(1, s1);
    for (int s = 0; s < n; s += 2) {
        use(s0);
        if (s + 2 < n) load(s + 2, s0);
        if (s + 1 < n) {
            use(s1);
            if (s + 3 < n) load(s + 3, s1);
        }
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

template <int U, int S, int kWarps>
DEV void async_entry(const uint8_t* __restrict__ w, int rows, int row_bytes, uint32_t* __restrict__ out) {
    extern __shared__ uint4 ring[];  // [kWarps][S][2U][32] 16-byte pieces
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gw = blockIdx.x * kWarps + warp, nw = gridDim.x * kWarps;
    const int tiles = rows / 16, steps = row_bytes / (64 * U);
    const int my_tiles = gw < tiles ? (tiles - 1 - gw) / nw + 1 : 0;
    const int n = my_tiles * steps;
    uint4* mine = ring + static_cast<size_t>(warp) * S * 2 * U * 32;
    uint32_t sum = 0;
    auto issue = [&](int s) {  // always commits a group (empty past n), so wait_group counts steps
        if (s < n) {
            const int tile = gw + nw * (s / steps), step = s % steps;
            const uint8_t* base = w + (static_cast<size_t>(tile) * 16) * row_bytes + step * 64 * U;
            uint4* dst = mine + (s % S) * 2 * U * 32;
#pragma unroll
            for (int i = 0; i < 2 * U; ++i) {
                int row, off;
                piece<false, U>(i, lane, row, off);
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst + i * 32 + lane)),
                             "l"(base + static_cast<size_t>(row) * row_bytes + off)
                             : "memory");
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
#pragma unroll
    for (int s = 0; s < S - 1; ++s) issue(s);
    for (int s = 0; s < n; ++s) {
        asm volatile("cp.async.wait_group %0;" ::"n"(S - 2) : "memory");
        __syncwarp();
        const uint4* src = mine + (s % S) * 2 * U * 32;
#pragma unroll
        for (int i = 0; i < 2 * U; ++i) sum += fold(src[i * 32 + lane]);
        __syncwarp();
        issue(s + S - 1);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

template <int U, int S, int kWarps>
DEV void bulk_entry(const uint8_t* __restrict__ w, int rows, int row_bytes, uint32_t* __restrict__ out) {
    extern __shared__ uint4 ring[];  // [kWarps][S][16 rows][4U] 16-byte pieces, then [kWarps][S] mbarriers
    __shared__ uint64_t bars[kWarps][S];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gw = blockIdx.x * kWarps + warp, nw = gridDim.x * kWarps;
    const int tiles = rows / 16, steps = row_bytes / (64 * U);
    const int my_tiles = gw < tiles ? (tiles - 1 - gw) / nw + 1 : 0;
    const int n = my_tiles * steps;
    uint4* mine = ring + static_cast<size_t>(warp) * S * 16 * 4 * U;
    if (lane == 0) {
        for (int s = 0; s < S; ++s) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bars[warp][s])));
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    uint32_t sum = 0;
    auto issue = [&](int s) {
        if (s >= n) return;
        const int tile = gw + nw * (s / steps), step = s % steps;
        const uint32_t bar = smem_addr(&bars[warp][s % S]);
        if (lane == 0) {
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(16 * 64 * U)
                         : "memory");
        }
        __syncwarp();
        if (lane < 16) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // this warp's reads of the stage first
            const uint8_t* src = w + (static_cast<size_t>(tile) * 16 + lane) * row_bytes + step * 64 * U;
            uint4* dst = mine + ((s % S) * 16 + lane) * 4 * U;
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(smem_addr(dst)), "l"(src), "r"(64 * U), "r"(bar)
                         : "memory");
        }
    };
#pragma unroll
    for (int s = 0; s < S; ++s) issue(s);
    for (int s = 0; s < n; ++s) {
        const uint32_t bar = smem_addr(&bars[warp][s % S]);
        const uint32_t parity = (s / S) & 1;
        uint32_t done = 0;
        while (!done) {
            asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                         "selp.u32 %0, 1, 0, p;\n\t}"
                         : "=r"(done)
                         : "r"(bar), "r"(parity)
                         : "memory");
        }
        const uint4* src = mine + (s % S) * 16 * 4 * U;
#pragma unroll
        for (int i = 0; i < 2 * U; ++i) sum += fold(src[i * 32 + lane]);
        __syncwarp();
        issue(s + S);
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

}  // namespace

#define REGS(NAME, FRAG, U, WARPS)                                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * WARPS, 1)                                                     \
        NAME(const uint8_t* w, int rows, int row_bytes, uint32_t* out) {                                            \
        regs_entry<FRAG, U, WARPS>(w, rows, row_bytes, out);                                                        \
    }
#define ASYNC(NAME, U, S, WARPS)                                                                                    \
    extern "C" __global__ void __launch_bounds__(32 * WARPS, 1)                                                     \
        NAME(const uint8_t* w, int rows, int row_bytes, uint32_t* out) {                                            \
        async_entry<U, S, WARPS>(w, rows, row_bytes, out);                                                          \
    }
#define BULK(NAME, U, S, WARPS)                                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * WARPS, 1)                                                     \
        NAME(const uint8_t* w, int rows, int row_bytes, uint32_t* out) {                                            \
        bulk_entry<U, S, WARPS>(w, rows, row_bytes, out);                                                           \
    }

REGS(frag_u5_w8, true, 5, 8)
REGS(frag_u8_w8, true, 8, 8)
REGS(frag_u5_w16, true, 5, 16)
REGS(row_u8_w8, false, 8, 8)
REGS(row_u8_w16, false, 8, 16)
REGS(row_u4_w32, false, 4, 32)
ASYNC(async_u8_s3_w8, 8, 3, 8)
ASYNC(async_u4_s6_w8, 4, 6, 8)
BULK(bulk_u8_s3_w8, 8, 3, 8)
BULK(bulk_u4_s6_w8, 4, 6, 8)
BULK(bulk_u8_s6_w4, 8, 6, 4)
BULK(bulk_u16_s3_w4, 16, 3, 4)
