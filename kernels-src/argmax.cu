// Two-stage argmax over rows of bf16 logits. Order: NaN is below every number (never wins unless the
// whole row is NaN, which yields index 0); equal values (including -0 == +0) -> smallest index. This is
// a total order on (value, index), so the result does not depend on the reduction order and matches a
// CPU scan `if v > best: best = v` started from the first non-NaN element. Both entries start with
// griddepcontrol.wait, then launch_dependents: they may be launched with PDL after any kernel.
#include <math_constants.h>

#include "common.cuh"

#define ARGMAX_NONE 0x7fffffff  // index of "no candidate yet" (loses every tie)

// Does (v, i) beat (bv, bi)?
KERN_DEV bool beats(float v, int i, float bv, int bi) {
    const bool vn = isnan(v), bn = isnan(bv);
    if (vn != bn) return bn;                // a number beats NaN
    if (!vn && v != bv) return v > bv;      // both numbers, different
    return i < bi;                          // equal, or both NaN
}

// Block-wide argmax of (v, i); thread 0 gets the result. blockDim.x a multiple of 32, at most 1024.
KERN_DEV void block_argmax(float& v, int& i, float* sv, int* si) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (beats(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
            if (beats(sv[w], si[w], v, i)) {
                v = sv[w];
                i = si[w];
            }
    }
}

// grid (num_chunks, rows, 1), block (256,1,1). Chunk c of row r scans [c*chunk, min((c+1)*chunk, n)) and
// writes part_val[r, c], part_idx[r, c]; an empty chunk writes (NaN, 0x7fffffff).
extern "C" __global__ void __launch_bounds__(256) kern_argmax_partial(const __nv_bfloat16* logits,  // [rows, n]
                                                                      int32_t n, int32_t chunk,
                                                                      float* part_val,   // [rows, num_chunks]
                                                                      int32_t* part_idx,  // [rows, num_chunks]
                                                                      int32_t num_chunks) {
    __shared__ float sv[32];
    __shared__ int si[32];
    kern_pdl_wait();  // PDL: nothing is read or written before the previous kernel has completed
    kern_pdl_launch_dependents();
    const int c = blockIdx.x, r = blockIdx.y;
    if (c >= num_chunks || n <= 0 || chunk <= 0) return;
    const __nv_bfloat16* row = logits + (int64_t)r * n;
    const int64_t lo = (int64_t)c * chunk;
    const int64_t hi = min(lo + chunk, (int64_t)n);
    float bv = CUDART_NAN_F;
    int bi = ARGMAX_NONE;
    const bool vec = (n % 8 == 0) && (chunk % 8 == 0) && aligned16(logits);
    if (vec) {
        // lo and hi are multiples of 8 here.
        for (int64_t i0 = lo + (int64_t)threadIdx.x * 8; i0 < hi; i0 += (int64_t)blockDim.x * 8) {
            float v[8];
            load8_vec(row + i0, v);
#pragma unroll
            for (int e = 0; e < 8; ++e)
                if (beats(v[e], (int)(i0 + e), bv, bi)) {
                    bv = v[e];
                    bi = (int)(i0 + e);
                }
        }
    } else {
        for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            const float v = bf2f(row[i]);
            if (beats(v, (int)i, bv, bi)) {
                bv = v;
                bi = (int)i;
            }
        }
    }
    block_argmax(bv, bi, sv, si);
    if (threadIdx.x == 0) {
        part_val[(int64_t)r * num_chunks + c] = bv;
        part_idx[(int64_t)r * num_chunks + c] = bi;
    }
}

// grid (rows,1,1), block (256,1,1): out[r] = argmax over the row's num_chunks partials. A row that is
// all NaN gives 0.
extern "C" __global__ void __launch_bounds__(256) kern_argmax_final(const float* part_val,   // [rows, num_chunks]
                                                                    const int32_t* part_idx,  // [rows, num_chunks]
                                                                    int32_t num_chunks,
                                                                    int64_t* out) {  // [rows]
    __shared__ float sv[32];
    __shared__ int si[32];
    kern_pdl_wait();
    kern_pdl_launch_dependents();
    const int r = blockIdx.x;
    if (num_chunks <= 0) return;
    float bv = CUDART_NAN_F;
    int bi = ARGMAX_NONE;
    for (int c = threadIdx.x; c < num_chunks; c += blockDim.x) {
        const float v = part_val[(int64_t)r * num_chunks + c];
        const int i = part_idx[(int64_t)r * num_chunks + c];
        if (beats(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    block_argmax(bv, bi, sv, si);
    if (threadIdx.x == 0) out[r] = (bi == ARGMAX_NONE) ? 0 : (int64_t)bi;
}
