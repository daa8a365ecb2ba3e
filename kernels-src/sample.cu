// Per-row sampling over a [rows, vocab] logits buffer (contract: docs/kernels.md "Sampling").
//
// kern_sample_{bf16,f32}: each row is split into slices of SAMPLE_SLICE = 8192 logits, one block of 512 threads
// per slice (grid (cdiv(vocab, 8192), rows, 1)); thread t of slice s holds the 16 consecutive logits
// [8192 s + 16 t, + 16) in registers. Every block, on its slice:
//   0. penalties, IN PLACE in the logits row, for the history tokens inside the slice (the row's list of distinct
//      token ids with counts):
//        x' = (x > 0 ? x / repetition : x * repetition) - frequency * count - presence       (f32 math, stored
//        back in the buffer's dtype)
//   1. l = x * (1 / temperature) (NaN logits read as -inf; temperature <= 0 or NaN: greedy, l = x); the slice's
//      max m_s, its argmax (ties -> smallest index) and z_s = sum exp(l - m_s).
//   2. with a filter (top-k, top-p or min-p), exports candidates: every l of the slice with key >= K_s (key: the
//      order-preserving u32 of the float), at most cap = 8192 / slices of them, K_s as low as that allows and no
//      lower than the slice's own bounds on the threshold (min-p: m_s + log(min_p) <= t_min; top-k: a key at or
//      below the slice's top_k-th largest <= t_k), found by a 256-bin count histogram of key offsets from the
//      slice max (one round, refined while under half the capacity is used).
//   3. writes (m_s, z_s, argmax, K_s, n_s) to its row's work area, fences, and takes the row's ticket; the block
//      that draws the last ticket resets it to 0 and merges:
//        m = max m_s, the argmax (ties -> smallest index), Z = sum_s z_s exp(m_s - m) (slice order).
//        Greedy: token = argmax, logprob = -log Z (the log-softmax of the penalized logits at temperature 1).
//        No filter: kept = all; the draw picks the slice by its mass, then inside it (one slice re-read).
//        Filters: kept = {l >= thr}, thr = max(t_k, t_p, t_min) (definitions in docs/kernels.md). The candidates
//          with key >= K = max_s K_s are every element of the row with key >= K (each slice exported all of its
//          own above K_s <= K): t_k (when at least top_k of them), Z_k and t_p (when their mass reaches the
//          target) are exact on them; when thr >= K the kept set lies among them and the draw is over them
//          (16 per thread in registers). Otherwise (a nucleus wider than the candidates, top_k past them) the
//          same thresholds over the whole row, then the draw over it (the exact path), as phases of one task per
//          slice (a histogram round, the masses, the kept mass per slice) that the merge and the row's waiting
//          blocks (helpers) claim through counters in the work area; the merge merges each phase, picks, opens
//          the next. Helpers are optional (bounded waits; the merge claims whatever no helper took).
//        Thresholds: the largest key v with W(key >= v) >= target (W a count or a mass) by a radix select over
//        key offsets from the row max (256 bins a round: 2^16-key bins saturating at bin 255, then 2^8, then
//        single keys; 3 rounds unless the threshold lies past 255 * 2^16 keys below the max).
//   Masses in the thresholds and the draws are fixed point, round(exp(l - m) * 2^39) summed in u64: exact, so
//   they do not depend on the order of the sums or on which block merges.
//   The draw: bits = word 0 of Philox4x32-10(counter = (position, 0, 0, 0), key = (seed_lo, seed_hi)) >> 8,
//   u = bits * 2^-24; target = floor(u * Z_kept) (exact for the fixed-point Z_kept); token = the first kept
//   element in index order where the running sum of weights passes the target. logprob = (l_token - m) -
//   log(Z_kept) (f32).
// Outputs: out_token[r] (int32), out_logprob[r] (f32); stats[r] = (m, log Z_kept, thr, 1/temperature) when
// stats is not null (kern_sample_top_logprobs reads it). work: SAMPLE_WORK_WORDS u32 per row, word 0 (the
// ticket) zero before the launch (a manifest `fixed` state, zeroed at load) and zero after it.
//
// kern_sample_top_logprobs_{bf16,f32}: the n_top best (l, index) of a row (l desc, index asc) and their
// logprob under the sampled distribution (-inf outside the kept set). n_top passes over the row, one block of
// 1024 threads per row.
// kern_sample_history_append: adds this step's token to each row's history list.
// kern_philox4x32_10: raw Philox4x32-10 blocks for tests.
//
// No allocation, no host sync: every entry may be captured in a graph; all begin with griddepcontrol.wait
// then launch_dependents (PDL-safe after any kernel).
//
// Phase profile (bench/sample_phases.py; never in kernels/): compiled with -DSAMPLE_PROFILE, kern_sample_{bf16,f32}
// take one more, trailing parameter, uint64 prof[rows, slices, SAMPLE_PROF_SLOTS], and every block records its
// phase boundaries there (layout at SAMPLE_PROF_SLOTS below; tools/sample_profile.py parses it). Without the macro
// none of it is compiled: the entries' parameters and the cubin are the committed ones.
#include <math_constants.h>

#include "common.cuh"

#define SAMPLE_THREADS 512
#define SAMPLE_PER_THREAD 16
#define SAMPLE_SLICE 8192        // SAMPLE_THREADS * SAMPLE_PER_THREAD logits per block
#define SAMPLE_MAX_VOCAB 1048576  // 2^20
#define SAMPLE_MAX_SPLITS 128     // SAMPLE_MAX_VOCAB / SAMPLE_SLICE
#define SAMPLE_MERGE_CAP 8192     // candidates the merging block holds, 16 per thread
#define SAMPLE_PARAM_WORDS 12     // 48 bytes per row
#define SAMPLE_HDR_WORDS 8        // per slice: m_s, z_s, argmax, K_s, n_s, 3 unused
#define SAMPLE_CAND_WORD 1032     // 8 + SAMPLE_HDR_WORDS * SAMPLE_MAX_SPLITS: the candidates (key, index)
#define SAMPLE_WORK_WORDS 17416   // SAMPLE_CAND_WORD + 2 * SAMPLE_MERGE_CAP: u32 words of work per row
#define SAMPLE_FP_ONE 549755813888.0f  // 2^39: the fixed-point weight of exp(0)
#define TOP_THREADS 1024
// The row's coordination words (work words 0..3): the ticket (arrivals in bits 0..15, starts in bits 16..31; zero
// before and after every launch), the exact path's epoch (any value; bumped once by a filtering row's merge), its
// decision (SAMPLE_HELP_NONE / SAMPLE_HELP_EXACT) and its phase state (phases opened, SAMPLE_STATE_DONE at the end)
#define SAMPLE_W_TICKET 0
#define SAMPLE_W_EPOCH 1
#define SAMPLE_W_DECISION 2
#define SAMPLE_W_STATE 3
#define SAMPLE_START_ONE 65536u  // a block's start in the ticket word
#define SAMPLE_HELP_NONE 0u
#define SAMPLE_HELP_EXACT 1u
#define SAMPLE_STATE_DONE 0xffffffffu
// The exact path's state, in the candidates' words (unused once a row takes it), offsets from SAMPLE_CAND_WORD
#define SAMPLE_X_ALL 0      // u64: the row's mass
#define SAMPLE_X_GE 2       // u64: its mass at or above t_k
#define SAMPLE_X_COUNTERS 8 // per phase ph: claim at 8 + 2 ph, done at 9 + 2 ph
#define SAMPLE_X_DESC 64    // per phase ph: ExactDesc (8 words) at 64 + 8 ph
#define SAMPLE_X_HIST 256   // 256 u64 bins: the phase's merged histogram
#define SAMPLE_X_KEPT 768   // SAMPLE_MAX_SPLITS u64: the kept mass per slice
#define SAMPLE_MAX_PHASES 16  // top-k <= 5 rounds, top-p <= 5 (the first with the mass), the kept pass
// A helper (a non-merging block of a filtering row whose blocks have all started) waits at most this long for the
// merge's decision and for each next phase, then leaves (nothing depends on it: the merge claims every task no
// helper took)
#ifndef SAMPLE_HELP_WAIT_NS
#define SAMPLE_HELP_WAIT_NS 100000ull
#endif
#ifndef SAMPLE_PATH
#define SAMPLE_PATH(row, path)  // which path merged a row (0 greedy, 1 plain, 2 candidates, 3 exact): an emulator's hook
#endif
#ifndef SAMPLE_HELPED
#define SAMPLE_HELPED(row, tasks)  // slice tasks of the row's exact path a helper block ran: an emulator's hook
#endif
#ifndef SAMPLE_SHARED
#define SAMPLE_SHARED(type, name) __shared__ type name  // the emulator gives each concurrent block its own
#endif
#ifdef SAMPLE_PROFILE
// prof[r, s] of block (s, r), SAMPLE_PROF_SLOTS u64: [0] %globaltimer (ns) at the block's start, [1] at its end,
// [2] smid | merged << 32 | events << 40, [3 + i] event i = id << 56 | (clock64 & (2^56 - 1)), event 0 the start.
// A stamp is a __syncthreads then thread 0's clock64: event i closes the phase that began at event i - 1.
#define SAMPLE_PROF_SLOTS 64
#define SAMPLE_PROF_EVENTS 61  // SAMPLE_PROF_SLOTS - 3
// event ids (tools/sample_profile.py EVENTS names them): every block
#define SP_START 0
#define SP_PENALTY 1        // penalties written
#define SP_REDUCE 2         // the slice loaded, m_s / argmax / z_s reduced
#define SP_EXPORT_KHIST 3   // the export's top-k bound (a count histogram)
#define SP_EXPORT_ROUND 4   // one round of the export edge (a count histogram + pick)
#define SP_EXPORT_WRITE 5   // candidates counted, scanned and written
#define SP_TICKET 6         // header written, fence, ticket taken
// the merging block
#define SP_HEADERS 7        // headers read, candidate offsets, m, argmax, Z
#define SP_GATHER 8         // candidates loaded into shared memory
#define SP_COUNT 9          // candidate count and mass
#define SP_K_ROUND 10       // one radix round of a count select (t_k)
#define SP_P_ROUND 11       // one radix round of a mass select (t_p)
#define SP_SUMS 12          // the top-p target's sums
#define SP_DRAW 13          // the draw (over the candidates, or inside a slice)
#define SP_DONE 14          // the result written
#define SP_EXACT 15         // the hand-off to the exact path
#define SP_EXACT_MASS 16    // the exact path's mass pass over the row
#define SP_EXACT_KEPT 17    // the exact path's kept-mass pass per slice
#define SP_HELP_WAIT 18     // a helper: the wait for the merge's decision or the next phase
#define SP_TASK 19          // the exact path: this block's slice tasks of one phase
#define SP_PHASE_WAIT 20    // the merge: the wait for the phase's other tasks, the merged bins read
#define SAMPLE_PROF_ARG , unsigned long long* prof
#define SAMPLE_PROF_PASS , prof
#define SAMPLE_STAMP(ev) sample_stamp(sh, (ev))
#else
#define SAMPLE_PROF_ARG
#define SAMPLE_PROF_PASS
#define SAMPLE_STAMP(ev)
#endif
static_assert(SAMPLE_SLICE == SAMPLE_THREADS * SAMPLE_PER_THREAD, "a slice is 16 logits per thread");
static_assert(SAMPLE_MAX_SPLITS * SAMPLE_SLICE == SAMPLE_MAX_VOCAB, "slices of the largest vocabulary");
static_assert(SAMPLE_MERGE_CAP == SAMPLE_THREADS * SAMPLE_PER_THREAD, "16 candidates per merging thread");
static_assert(SAMPLE_CAND_WORD == 8 + SAMPLE_HDR_WORDS * SAMPLE_MAX_SPLITS, "work layout");
static_assert(SAMPLE_WORK_WORDS == SAMPLE_CAND_WORD + 2 * SAMPLE_MERGE_CAP, "work layout");
static_assert(SAMPLE_X_COUNTERS + 2 * SAMPLE_MAX_PHASES <= SAMPLE_X_DESC && SAMPLE_X_DESC + 8 * SAMPLE_MAX_PHASES <=
              SAMPLE_X_HIST && SAMPLE_X_HIST + 512 <= SAMPLE_X_KEPT && SAMPLE_X_KEPT + 2 * SAMPLE_MAX_SPLITS <=
              2 * SAMPLE_MERGE_CAP && SAMPLE_CAND_WORD % 2 == 0 && SAMPLE_WORK_WORDS % 2 == 0, "exact state layout");

// One row's parameters (48 bytes, little-endian; kern_run.sampling packs them).
struct SampleParams {
    float temperature;          // 0: greedy
    int32_t top_k;              // <= 0 or >= vocab: off
    float top_p;                // >= 1: off
    float min_p;                // <= 0: off
    float repetition_penalty;   // 1: off
    float presence_penalty;     // 0: off
    float frequency_penalty;    // 0: off
    int32_t reserved0;
    uint32_t seed_lo, seed_hi;  // the u64 seed
    uint32_t reserved1, reserved2;
};
static_assert(sizeof(SampleParams) == 4 * SAMPLE_PARAM_WORDS, "SampleParams is 48 bytes");

// ------------------------------------------------------------------------------------------- Philox

// Philox4x32-10 (Salmon et al., SC11; Random123's philox4x32 with R = 10): counter c, key k.
KERN_DEV uint4 philox4x32_10(uint4 c, uint2 k) {
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {
            k.x += 0x9E3779B9u;
            k.y += 0xBB67AE85u;
        }
        const uint32_t hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        const uint32_t hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    }
    return c;
}

// The draw's 24 random bits of a row: the sampling uniform is u = bits * 2^-24 in [0, 1).
KERN_DEV uint32_t sample_bits24(uint32_t seed_lo, uint32_t seed_hi, int32_t position) {
    const uint4 w = philox4x32_10(make_uint4((uint32_t)position, 0u, 0u, 0u), make_uint2(seed_lo, seed_hi));
    return w.x >> 8;
}

// ------------------------------------------------------------------------------------------ helpers

// Order-preserving map of a float to uint32 (larger float -> larger key; -0 < +0 here, never matters: keys
// come from l values, which are never -0). Key 0 is no l value (a NaN pattern): the sampler's "no element".
KERN_DEV uint32_t float_key(float f) {
    const uint32_t b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
KERN_DEV float key_float(uint32_t k) { return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

// The smallest key whose offset key_ref - key is below `bound` (1: every element, when bound > key_ref).
KERN_DEV uint32_t key_below(uint32_t key_ref, uint64_t bound) {
    return bound > key_ref ? 1u : (uint32_t)(key_ref - bound + 1u);
}

// l = x / temperature as the sampler forms it: NaN -> -inf, -0 -> +0 (so float order and key order agree)
KERN_DEV float scaled_logit(float x, float inv_t) { return isnan(x) ? -CUDART_INF_F : __fadd_rn(__fmul_rn(x, inv_t), 0.0f); }

// Fixed-point weight round(exp(l - m) * 2^39) of an l <= m (0 for -inf): sums of up to 2^20 fit 2^59.
KERN_DEV unsigned long long fp_weight(float l, float m) {
    return l > -CUDART_INF_F ? __float2ull_rn(__fmul_rn(__expf(l - m), SAMPLE_FP_ONE)) : 0ull;
}
KERN_DEV float fp_float(unsigned long long w) { return __fmul_rn((float)w, 1.0f / SAMPLE_FP_ONE); }
// ceil(top_p * z) (at least 1): mass >= top_p * z for an integer mass
KERN_DEV unsigned long long p_target(float top_p, unsigned long long z) {
    const double t = ceil((double)top_p * (double)z);
    return t < 1.0 ? 1ull : (unsigned long long)t;
}
// floor(bits * 2^-24 * z), exactly (bits < 2^24, z < 2^60): below z
KERN_DEV unsigned long long draw_target(uint32_t bits, unsigned long long z) {
    return (unsigned long long)bits * (z >> 24) + (((unsigned long long)bits * (z & 0xffffffull)) >> 24);
}

// The row's coordination across its blocks (the exact path): the global timer, relaxed / acquire loads and a release
// store of the work words. The CPU emulator brings its own (SAMPLE_HOST_SYNC).
#ifndef SAMPLE_HOST_SYNC
KERN_DEV unsigned long long sample_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
KERN_DEV uint32_t sample_load_relaxed(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
KERN_DEV uint32_t sample_load_acquire(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
KERN_DEV void sample_store_release(uint32_t* p, uint32_t v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
#define SAMPLE_SPIN_PAUSE()
#endif

KERN_DEV float load_f(const __nv_bfloat16* p) { return bf2f(*p); }
KERN_DEV float load_f(const float* p) { return *p; }
KERN_DEV void store_f(__nv_bfloat16* p, float v) { *p = f2bf(v); }
KERN_DEV void store_f(float* p, float v) { *p = v; }

// The 16 logits [i0, i0 + 16) of a row of n as floats (16-byte loads when vec: n a multiple of the 16-byte group
// and a 16-byte aligned buffer); returns how many lie inside the row (0..16), the rest read as 0. CG: loads
// through L2 (ld.global.cg), for logits other blocks of this launch wrote (their penalties).
template <bool CG>
KERN_DEV int load16(const __nv_bfloat16* row, int64_t i0, int n, bool vec, float (&x)[16]) {
#pragma unroll
    for (int g = 0; g < 2; ++g) {
        const int64_t gi = i0 + 8 * g;
        if (vec && gi + 8 <= n) {
            const uint4* p = reinterpret_cast<const uint4*>(row + gi);
            const uint4 raw = CG ? __ldcg(p) : *p;
            const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
            for (int q = 0; q < 4; ++q) {  // little-endian: the lower address is the low half
                x[8 * g + 2 * q] = __uint_as_float(w[q] << 16);
                x[8 * g + 2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
            }
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const unsigned short* p = reinterpret_cast<const unsigned short*>(row + gi + e);
                x[8 * g + e] = gi + e < n ? __uint_as_float((uint32_t)(CG ? __ldcg(p) : *p) << 16) : 0.0f;
            }
        }
    }
    return (int)max((int64_t)0, min((int64_t)16, (int64_t)n - i0));
}
template <bool CG>
KERN_DEV int load16(const float* row, int64_t i0, int n, bool vec, float (&x)[16]) {
#pragma unroll
    for (int g = 0; g < 4; ++g) {
        const int64_t gi = i0 + 4 * g;
        if (vec && gi + 4 <= n) {
            const float4* p = reinterpret_cast<const float4*>(row + gi);
            const float4 q = CG ? __ldcg(p) : *p;
            x[4 * g] = q.x;
            x[4 * g + 1] = q.y;
            x[4 * g + 2] = q.z;
            x[4 * g + 3] = q.w;
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) x[4 * g + e] = gi + e < n ? (CG ? __ldcg(row + gi + e) : row[gi + e]) : 0.0f;
        }
    }
    return (int)max((int64_t)0, min((int64_t)16, (int64_t)n - i0));
}

// ------------------------------------------------------------------------------- block reductions
// Any block of whole warps (up to 1024 threads); every thread gets the result; fixed order (deterministic).
// `scratch` holds 32 values; every thread must call.

KERN_DEV int block_warps() { return (int)(blockDim.x >> 5); }

// Block max of (v, i) with ties -> smallest i.
KERN_DEV void block_argmax_all(float& v, int& i, float* sv, int* si) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (ov > v || (ov == v && oi < i)) {
            v = ov;
            i = oi;
        }
    }
    __syncthreads();
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = i;
    }
    __syncthreads();
    v = sv[0];
    i = si[0];
    for (int w = 1; w < block_warps(); ++w)
        if (sv[w] > v || (sv[w] == v && si[w] < i)) {
            v = sv[w];
            i = si[w];
        }
}

template <typename V>
KERN_DEV V block_sum_all(V x, V* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
    __syncthreads();
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    V total = 0;
    for (int w = 0; w < block_warps(); ++w) total += scratch[w];
    return total;
}

// Inclusive scan of x in thread order; returns this thread's inclusive prefix, *total the block's sum.
template <typename V>
KERN_DEV V block_scan_incl(V x, V* total, V* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const V y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) scratch[warp] = x;
    __syncthreads();
    V before = 0, all = 0;
    for (int w = 0; w < block_warps(); ++w) {
        if (w == warp) before = all;
        all += scratch[w];
    }
    *total = all;
    return before + x;
}

// ------------------------------------------------------------------------------- the split sampler

// What the exact path needs of its row (written by the merge's thread 0, published by a barrier).
struct ExactJob {
    const void* row;
    uint32_t* wrow;
    const SampleParams* pp;
    int32_t* out_token;
    float* out_logprob;
    float* stats;
    int n, splits, r, am;
    float inv_t, m;
    uint32_t bits;
    bool vec, use_k, use_p, use_min;
};

// One phase of the exact path, as the merge publishes it (8 words in the work area; every block runs the same
// per-slice task from it).
#define SAMPLE_TASK_COUNT 0u  // a count histogram of the round (top-k)
#define SAMPLE_TASK_MASS 1u   // the row's mass, its mass at or above tk, and the first round's mass histogram (top-p)
#define SAMPLE_TASK_MBINS 2u  // a mass histogram of the round (top-p)
#define SAMPLE_TASK_KEPT 3u   // the slice's kept mass (key >= tkey)
struct ExactDesc {
    uint32_t kind;
    uint32_t lo;     // the round: offsets d = key_m - key in [lo + b 2^shift, lo + (b + 1) 2^shift)
    uint32_t shift;
    uint32_t sat;    // bin 255 stands for the rest (not counted)
    uint32_t tk;     // MASS: ge sums the keys >= tk
    uint32_t tkey;   // KEPT: the kept keys
    float m, inv_t;  // the row max, 1 / temperature
};
static_assert(sizeof(ExactDesc) == 32, "ExactDesc is 8 words");

struct SplitShared {
    float red_f[32];
    int red_i[32];
    unsigned red_u[32];
    unsigned long long red_w[32];
    unsigned hist_c[256];             // count bins
    unsigned long long hist_w[256];   // fixed-point mass bins
    float slice_m[SAMPLE_MAX_SPLITS];     // the merge: per slice m_s
    float slice_z[SAMPLE_MAX_SPLITS];     //   z_s exp(m_s - m)
    float slice_zinc[SAMPLE_MAX_SPLITS];  //   its inclusive prefix over the slices
    int slice_a[SAMPLE_MAX_SPLITS];       //   argmax
    unsigned slice_k[SAMPLE_MAX_SPLITS];  //   K_s
    int slice_off[SAMPLE_MAX_SPLITS + 1]; //   first candidate of the slice in the merged list
    unsigned long long slice_w[SAMPLE_MAX_SPLITS];  // the exact path: kept mass per slice
    unsigned long long pick_before;
    int pick, last, tok, n_cand;
    float tok_l;
    unsigned region_key;
    ExactJob job;  // the merge -> the exact path
    ExactDesc desc;       // the phase the block runs
    struct {              // the exact path's radix select between its phases (radix_select's loop state)
        unsigned long long total, target, above;
        uint32_t lo, shift, sat, done, result;
    } sel;
    uint32_t* wrow;       // the row's work words (thread 0)
    unsigned e0;          // the row's exact-path epoch before this block's ticket (thread 0)
    int all_started, published, claim, help_ok, help_phase, phase;
    unsigned cand_key[SAMPLE_MERGE_CAP];  // the merge: candidate q = 16 t + e at [e * SAMPLE_THREADS + t]
#ifdef SAMPLE_PROFILE
    unsigned long long* prof;  // this block's SAMPLE_PROF_SLOTS (thread 0 only)
    int prof_n;                // events recorded
#endif
};

#ifdef SAMPLE_PROFILE
#ifndef SAMPLE_PROF_HOST_CLOCKS  // the CPU emulator brings its own
KERN_DEV unsigned long long prof_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
KERN_DEV unsigned prof_smid() {
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
}
KERN_DEV unsigned long long prof_clock() { return (unsigned long long)clock64(); }
#endif
// Event `ev` after a barrier (every thread calls, as at every barrier of the sampler); thread 0 records it.
KERN_DEV void sample_stamp(SplitShared& sh, unsigned ev) {
    __syncthreads();
    if (threadIdx.x == 0 && sh.prof_n < SAMPLE_PROF_EVENTS)
        sh.prof[3 + sh.prof_n++] = ((unsigned long long)ev << 56) | (prof_clock() & 0x00ffffffffffffffull);
}
// The block's start: its slots, the start time, event 0 (then a barrier, so nothing starts before it).
KERN_DEV void sample_prof_begin(SplitShared& sh, unsigned long long* prof, int s, int r) {
    if (threadIdx.x == 0) {
        sh.prof = prof + ((int64_t)r * gridDim.x + s) * SAMPLE_PROF_SLOTS;
        sh.prof[0] = prof_globaltimer();
        sh.prof[3] = ((unsigned long long)SP_START << 56) | (prof_clock() & 0x00ffffffffffffffull);
        sh.prof_n = 1;
    }
    __syncthreads();
}
// The block's end (after its last stamp, by thread 0).
KERN_DEV void sample_prof_end(SplitShared& sh, bool merged) {
    if (threadIdx.x != 0) return;
    sh.prof[1] = prof_globaltimer();
    sh.prof[2] = (unsigned long long)prof_smid() | ((unsigned long long)merged << 32) |
                 ((unsigned long long)sh.prof_n << 40);
}
#endif

// *p += w on a shared u64, exactly, with two native 32-bit atomics: sm_90 has no 64-bit shared atomic add (nvcc
// makes atomicAdd(unsigned long long*) on shared memory a compare-and-swap spin loop, ATOMS.CAST.SPIN.64, which
// retries under contention: the hot bins of a mass histogram, where one bf16 value fills a bin). The low word's
// add returns the old low word; each add that wraps it carries 1 into the high word, so the total is exact.
// Readers read the u64 after a barrier.
KERN_DEV void shared_add_u64(unsigned long long* p, unsigned long long w) {
    unsigned* h = reinterpret_cast<unsigned*>(p);  // little-endian: h[0] the low word
    const unsigned lo = (unsigned)w;
    const unsigned old = atomicAdd(h, lo);
    const unsigned hi = (unsigned)(w >> 32) + (old + lo < old ? 1u : 0u);
    if (hi != 0u) atomicAdd(h + 1, hi);
}
KERN_DEV void shared_add(unsigned* p, unsigned w) { atomicAdd(p, w); }
KERN_DEV void shared_add(unsigned long long* p, unsigned long long w) { shared_add_u64(p, w); }

// hist[b] += w over the elements `each` visits (each(f) calls f(key, w) per element, key <= key_ref) whose offset
// d = key_ref - key lies in bin b of the round, d in [lo + b 2^shift, lo + (b + 1) 2^shift): b < 256, or with
// `sat` b < 255 (bin 255 stands for every d >= lo + 255 2^shift and is not counted here). Weight-0 elements are
// skipped (they never move a threshold).
template <typename W, typename Each>
KERN_DEV void offset_hist(Each&& each, uint32_t key_ref, uint32_t lo, int shift, bool sat, W* hist) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    const uint32_t nb = sat ? 255u : 256u;
    each([&](uint32_t key, W w) {
        const uint32_t d = key_ref - key;
        if (w == 0 || d < lo) return;
        const uint32_t b = (d - lo) >> shift;
        if (b < nb) shared_add(&hist[b], w);
    });
    __syncthreads();
}

// The smallest bin b with above + sum_{b' <= b} hist[b'] >= target (target >= 1); with `sat` bin 255 holds
// rest - sum_{b < 255} hist[b] (rest: the weight of every element with d >= lo). Returns b, or -1 when the
// bins fall short, and *before = above + sum_{b' < b}. Uniform over the block (needs >= 256 threads).
template <typename W>
KERN_DEV int pick_bin(const W* hist, bool sat, W rest, W above, W target, W* before, W* scratch, SplitShared& sh) {
    const int t = threadIdx.x;
    __syncthreads();  // sh.pick may still be read after a previous call
    if (t == 0) sh.pick = -1;
    W h = (t < 255 || (t == 255 && !sat)) ? hist[t] : (W)0;
    W total;
    W incl = block_scan_incl(h, &total, scratch);
    if (sat && t == 255) {
        h = rest - total;
        incl = rest;
    }
    const W cum = above + incl;
    if (t < 256 && cum >= target && cum - h < target) {  // unique: cum grows with t
        sh.pick = t;
        sh.pick_before = (unsigned long long)(cum - h);
    }
    __syncthreads();
    *before = (W)sh.pick_before;
    return sh.pick;
}

// The largest key v with W(key >= v) >= target over the elements `each` visits (each key <= key_ref, key_ref an
// element's; W(all) = total): a radix select over offsets from key_ref, 256 bins a round. Saturating rounds of
// 2^16-key bins (then 2^24 past bin 255), then 2^8, then single keys. target 0: key_ref; total < target: 0.
template <typename W, typename Build>
KERN_DEV uint32_t radix_select(Build&& build, uint32_t key_ref, W total, W target, W* hist, W* scratch,
                               SplitShared& sh);
template <typename W, typename Each>
KERN_DEV uint32_t offset_select(Each&& each, uint32_t key_ref, W total, W target, W* hist, W* scratch,
                                SplitShared& sh) {
    return radix_select<W>([&](uint32_t lo, int shift, bool sat) { offset_hist<W>(each, key_ref, lo, shift, sat, hist); },
                           key_ref, total, target, hist, scratch, sh);
}
// offset_select with the round's histogram from build(lo, shift, sat), which fills `hist` (the exact path: the
// merged bins of every slice's).
template <typename W, typename Build>
KERN_DEV uint32_t radix_select(Build&& build, uint32_t key_ref, W total, W target, W* hist, W* scratch,
                               SplitShared& sh) {
    if (target == 0) return key_ref;
    if (total < target) return 0u;
    uint32_t lo = 0u;
    int shift = 16;
    bool sat = true;
    W above = 0;
    for (;;) {
        build(lo, shift, sat);
        W before;
        const int b = pick_bin<W>(hist, sat, total - above, above, target, &before, scratch, sh);
        SAMPLE_STAMP(sizeof(W) == 4 ? SP_K_ROUND : SP_P_ROUND);
        if (b < 0) return 0u;  // unreachable: the range always holds the target
        above = before;
        if (sat && b == 255 && shift < 24) {  // past 255 bins: the rest of the offsets, coarser
            lo += 255u << shift;
            shift = 24;
            continue;
        }
        lo += (uint32_t)b << shift;
        if (shift == 0) return key_ref - lo;
        shift -= 8;
        sat = false;
    }
}

// The draw inside slice s of the row: the first element (index order) with key >= tkey where the running sum of
// fixed-point weights passes t (t clamped below the slice's kept total; a slice whose kept weights all round to
// 0 takes its first kept finite element). Writes sh.tok (-1: none) and sh.tok_l.
template <typename T>
KERN_DEV void draw_in_slice(const T* row, int n, bool vec, float inv_t, float m, int s, uint32_t tkey,
                            unsigned long long t, SplitShared& sh) {
    const int tid = threadIdx.x;
    float x[16];
    const int64_t j0 = (int64_t)s * SAMPLE_SLICE + (int64_t)tid * SAMPLE_PER_THREAD;
    const int nv = load16<true>(row, j0, n, vec, x);
    unsigned long long sum = 0;
#pragma unroll
    for (int e = 0; e < 16; ++e) {
        x[e] = scaled_logit(x[e], inv_t);
        if (e < nv && float_key(x[e]) >= tkey) sum += fp_weight(x[e], m);
    }
    if (tid == 0) sh.tok = -1;
    unsigned long long total;
    unsigned long long incl = block_scan_incl(sum, &total, sh.red_w);
    const bool unit = total == 0;  // uniform
    if (unit) {
        sum = 0;
#pragma unroll
        for (int e = 0; e < 16; ++e) sum += (e < nv && float_key(x[e]) >= tkey && x[e] > -CUDART_INF_F) ? 1u : 0u;
        incl = block_scan_incl(sum, &total, sh.red_w);
        t = 0;
    }
    if (total > 0 && t >= total) t = total - 1;
    const unsigned long long excl = incl - sum;
    if (sum > 0 && excl <= t && t < incl) {
        unsigned long long run = excl;
#pragma unroll
        for (int e = 0; e < 16; ++e) {
            if (e >= nv) break;
            if (float_key(x[e]) < tkey) continue;
            run += unit ? (x[e] > -CUDART_INF_F ? 1ull : 0ull) : fp_weight(x[e], m);
            if (run > t) {
                sh.tok = (int)(j0 + e);
                sh.tok_l = x[e];
                break;
            }
        }
    }
    __syncthreads();
}

// The merged result of row r: token, logprob (l_token - m) - lz, stats (m, lz, thr, inv_t). Thread 0 writes.
KERN_DEV void write_result(int r, int tok, float l_tok, float m, float lz, float thr, float inv_t, int32_t* out_token,
                           float* out_logprob, float* stats) {
    if (threadIdx.x != 0) return;
    out_token[r] = tok;
    out_logprob[r] = (l_tok - m) - lz;
    if (stats) reinterpret_cast<float4*>(stats)[r] = make_float4(m, lz, thr, inv_t);
}

// The largest s with sh.slice_off[s] <= q (q below the candidate count).
KERN_DEV int cand_slice(int q, int splits, const SplitShared& sh) {
    int lo = 0, hi = splits;
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (sh.slice_off[mid] <= q) lo = mid;
        else hi = mid;
    }
    return lo;
}

// ------------------------------------------------------------------------------ the exact path, slice-parallel
// The merge block runs the exact path as phases (docs/kernels.md "Sampling", the exact path): each phase is one task
// per slice (a histogram, a sum), claimed through the phase's counter by the merge and by any helper (a block of the
// row that finished its own slice and waited for the merge's decision); each task adds its slice's partial result
// into the row's work area (integer adds: exact in any order), then counts itself done. The merge claims tasks
// until none is left, waits for the phase's done count (every claimed task runs on a resident block and waits on
// nothing, so the wait ends), reads the merged result and publishes the next phase. A helper never holds a task
// across a wait and leaves when a wait runs out: the result never depends on which blocks ran which tasks.

// Slice j's task of phase ph, sh.desc (every thread calls). The slice's 16 logits of this thread go through shared
// memory (the candidates' space, unused on the exact path) and are read back one at a time, as the one-block exact
// path did: the loops then hold one logit, not 16, in registers.
template <typename T, uint32_t KIND>
KERN_DEV void exact_task(const T* row, int n, bool vec, int j, int ph, uint32_t* x, SplitShared& sh) {
    const int tid = threadIdx.x;
    const ExactDesc& d = sh.desc;
    float* stage = reinterpret_cast<float*>(sh.cand_key) + tid;
    int nv;
    {
        float l[16];
        nv = load16<true>(row, (int64_t)j * SAMPLE_SLICE + (int64_t)tid * SAMPLE_PER_THREAD, n, vec, l);  // via L2
#pragma unroll
        for (int e = 0; e < 16; ++e) stage[e * SAMPLE_THREADS] = scaled_logit(l[e], d.inv_t);
    }
    const float m = d.m;
    const uint32_t key_m = float_key(m);
    unsigned long long* gh = reinterpret_cast<unsigned long long*>(x + SAMPLE_X_HIST);
    if constexpr (KIND == SAMPLE_TASK_KEPT) {
        const uint32_t tkey = d.tkey;
        unsigned long long w = 0;
#pragma unroll 1
        for (int e = 0; e < nv; ++e) {
            const float l = stage[e * SAMPLE_THREADS];
            if (float_key(l) >= tkey) w += fp_weight(l, m);
        }
        w = block_sum_all(w, sh.red_w);
        if (tid == 0) reinterpret_cast<unsigned long long*>(x + SAMPLE_X_KEPT)[j] = w;
    } else if constexpr (KIND == SAMPLE_TASK_COUNT) {
        auto each = [&](auto&& f) {
#pragma unroll 1
            for (int e = 0; e < nv; ++e) f(float_key(stage[e * SAMPLE_THREADS]), 1u);
        };
        offset_hist<unsigned>(each, key_m, d.lo, (int)d.shift, d.sat != 0u, sh.hist_c);
        if (tid < 256 && sh.hist_c[tid] != 0u) atomicAdd(gh + tid, (unsigned long long)sh.hist_c[tid]);
    } else {
        auto each = [&](auto&& f) {
#pragma unroll 1
            for (int e = 0; e < nv; ++e) {
                const float l = stage[e * SAMPLE_THREADS];
                f(float_key(l), fp_weight(l, m));
            }
        };
        offset_hist<unsigned long long>(each, key_m, d.lo, (int)d.shift, d.sat != 0u, sh.hist_w);
        if (tid < 256 && sh.hist_w[tid] != 0ull) atomicAdd(gh + tid, sh.hist_w[tid]);
        if constexpr (KIND == SAMPLE_TASK_MASS) {
            const uint32_t tk = d.tk;
            unsigned long long all = 0, ge = 0;
#pragma unroll 1
            for (int e = 0; e < nv; ++e) {
                const float l = stage[e * SAMPLE_THREADS];
                const unsigned long long w = fp_weight(l, m);
                all += w;
                if (float_key(l) >= tk) ge += w;
            }
            all = block_sum_all(all, sh.red_w);
            ge = block_sum_all(ge, sh.red_w);
            if (tid == 0) {
                atomicAdd(reinterpret_cast<unsigned long long*>(x + SAMPLE_X_ALL), all);
                atomicAdd(reinterpret_cast<unsigned long long*>(x + SAMPLE_X_GE), ge);
            }
        }
    }
    __threadfence();  // this task's adds before its done count
    __syncthreads();  // (and every thread is past its stage reads before the next task's writes)
    if (tid == 0) atomicAdd(x + SAMPLE_X_COUNTERS + 2 * ph + 1, 1u);
}

// Claims and runs phase ph's tasks until none is left; returns how many this block ran (every thread calls).
template <typename T, uint32_t KIND>
KERN_DEV int exact_claim_tasks(const T* row, int n, bool vec, int splits, uint32_t* x, int ph,
                             SplitShared& sh) {
    int ran = 0;  // sh.desc: the phase's (a barrier published it)
    for (;;) {
        __syncthreads();  // sh.claim may still be read
        if (threadIdx.x == 0) sh.claim = (int)atomicAdd(x + SAMPLE_X_COUNTERS + 2 * ph, 1u);
        __syncthreads();
        const int j = sh.claim;
        if (j >= splits) break;
        exact_task<T, KIND>(row, n, vec, j, ph, x, sh);
        ++ran;
    }
    return ran;
}

// The merge: opens its next phase, sh.desc (the description, zeroed bins, then the state), runs tasks, waits for
// the rest; then the merged results are in the work area.
template <typename T, uint32_t KIND>
KERN_DEV void exact_phase(SplitShared& sh) {
    const int tid = threadIdx.x;
    __syncthreads();  // thread 0's sh.desc (exact_open) and sh.phase
    const T* row = static_cast<const T*>(sh.job.row);
    uint32_t* wrow = sh.job.wrow;
    const int n = sh.job.n, splits = sh.job.splits, ph = sh.phase;
    const bool vec = sh.job.vec;
    const ExactDesc& d = sh.desc;
    uint32_t* x = wrow + SAMPLE_CAND_WORD;
    if (tid < 8) x[SAMPLE_X_DESC + 8 * ph + tid] = reinterpret_cast<const uint32_t*>(&d)[tid];
    for (int i = tid; i < 512; i += SAMPLE_THREADS) x[SAMPLE_X_HIST + i] = 0u;
    if (KIND == SAMPLE_TASK_MASS && tid < 4) x[SAMPLE_X_ALL + tid] = 0u;
    __threadfence();
    __syncthreads();
    if (tid == 0) sample_store_release(wrow + SAMPLE_W_STATE, (uint32_t)ph + 1u);
    exact_claim_tasks<T, KIND>(row, n, vec, splits, x, ph, sh);
    SAMPLE_STAMP(SP_TASK);
    if (tid == 0)
        while (sample_load_acquire(x + SAMPLE_X_COUNTERS + 2 * ph + 1) < (uint32_t)splits) SAMPLE_SPIN_PAUSE();
    if (tid == 0) sh.phase = ph + 1;
    __syncthreads();
    __threadfence();
}

// The merge's next phase description (thread 0; exact_phase's barriers publish it).
KERN_DEV void exact_open(SplitShared& sh, uint32_t kind, uint32_t lo, int shift, bool sat) {
    if (threadIdx.x != 0) return;
    sh.desc.kind = kind;
    sh.desc.lo = lo;
    sh.desc.shift = (uint32_t)shift;
    sh.desc.sat = sat ? 1u : 0u;
}

// A helper: waits for the merge's decision (bounded), then runs tasks of each phase the merge opens until the
// state says done or a wait runs out. Every thread calls; thread 0 waits.
template <typename T>
__device__ __noinline__ void sample_help(const T* row, int n, bool vec, int splits, int r, uint32_t* wrow,
                                         const SampleParams* pp, SplitShared& sh) {
    const int tid = threadIdx.x;
    uint32_t* x = wrow + SAMPLE_CAND_WORD;
    {
        const SampleParams p = *pp;  // the row's filters, as sample_slice reads them (no filter: no exact path)
        const bool use_k = p.top_k > 0 && p.top_k < n, use_p = p.top_p < 1.0f, use_min = p.min_p > 0.0f;
        if (!(p.temperature > 0.0f) || !(use_k || use_p || use_min)) return;
    }
    if (tid == 0) {
        const unsigned long long t0 = sample_ns();
        uint32_t e;
        while ((e = sample_load_acquire(wrow + SAMPLE_W_EPOCH)) == sh.e0 && sample_ns() - t0 < SAMPLE_HELP_WAIT_NS)
            SAMPLE_SPIN_PAUSE();
        sh.help_ok = e != sh.e0 && sample_load_acquire(wrow + SAMPLE_W_DECISION) == SAMPLE_HELP_EXACT;
    }
    __syncthreads();
    SAMPLE_STAMP(SP_HELP_WAIT);
    if (!sh.help_ok) return;
    int ph = 0, ran = 0;
    __syncthreads();  // every thread has read sh.help_ok
    for (;;) {
        if (tid == 0) {
            const unsigned long long t0 = sample_ns();
            uint32_t st;
            while ((st = sample_load_acquire(wrow + SAMPLE_W_STATE)) <= (uint32_t)ph &&
                   sample_ns() - t0 < SAMPLE_HELP_WAIT_NS)
                SAMPLE_SPIN_PAUSE();
            // st: the phases opened so far (join the latest), SAMPLE_STATE_DONE, or still ph (the wait ran out)
            const int q = st != SAMPLE_STATE_DONE && st > (uint32_t)ph && st <= SAMPLE_MAX_PHASES ? (int)st - 1 : -1;
            sh.help_phase = q;
            if (q >= 0) {
#pragma unroll
                for (int w = 0; w < 8; ++w) reinterpret_cast<uint32_t*>(&sh.desc)[w] = __ldcg(x + SAMPLE_X_DESC + 8 * q + w);
            }
        }
        __syncthreads();
        SAMPLE_STAMP(SP_HELP_WAIT);
        const int q = sh.help_phase;  // thread 0 writes it again only after exact_claim_tasks' barriers
        if (q < 0) break;
        switch (sh.desc.kind) {  // uniform: the block's shared copy
            case SAMPLE_TASK_COUNT: ran += exact_claim_tasks<T, SAMPLE_TASK_COUNT>(row, n, vec, splits, x, q, sh); break;
            case SAMPLE_TASK_MASS: ran += exact_claim_tasks<T, SAMPLE_TASK_MASS>(row, n, vec, splits, x, q, sh); break;
            case SAMPLE_TASK_MBINS: ran += exact_claim_tasks<T, SAMPLE_TASK_MBINS>(row, n, vec, splits, x, q, sh); break;
            default: ran += exact_claim_tasks<T, SAMPLE_TASK_KEPT>(row, n, vec, splits, x, q, sh); break;
        }
        SAMPLE_STAMP(SP_TASK);
        ph = q + 1;
    }
    SAMPLE_HELPED(r, ran);
}

// The merge (thread 0; every thread may call): tells a filtering row's waiting helpers that no exact path follows.
KERN_DEV void release_helpers(SplitShared& sh) {
    if (threadIdx.x != 0 || sh.published) return;
    sh.wrow[SAMPLE_W_DECISION] = SAMPLE_HELP_NONE;
    __threadfence();
    sample_store_release(sh.wrow + SAMPLE_W_EPOCH, sh.e0 + 1u);
    sh.published = 1;
}

// The merged bins of the phase just run, into `hist` (every thread calls).
template <typename W>
KERN_DEV void exact_read_bins(const SplitShared& sh, W* hist) {
    const unsigned long long* gh =
        reinterpret_cast<const unsigned long long*>(sh.job.wrow + SAMPLE_CAND_WORD + SAMPLE_X_HIST);
    for (int b = threadIdx.x; b < 256; b += SAMPLE_THREADS) hist[b] = (W)__ldcg(gh + b);
    __syncthreads();
}

// The exact path's radix select: radix_select's loop, one round per phase, its state in shared memory (sh.sel)
// so that nothing of it is live in registers across a phase. exact_select_begin: radix_select's entry checks.
KERN_DEV void exact_select_begin(SplitShared& sh, uint32_t key_ref, unsigned long long total,
                                 unsigned long long target) {
    __syncthreads();  // sh.sel may still be read
    if (threadIdx.x == 0) {
        sh.sel.total = total;
        sh.sel.target = target;
        sh.sel.above = 0ull;
        sh.sel.lo = 0u;
        sh.sel.shift = 16u;
        sh.sel.sat = 1u;
        sh.sel.done = target == 0ull || total < target ? 1u : 0u;
        sh.sel.result = target == 0ull ? key_ref : 0u;
    }
    __syncthreads();
}
// One round over the merged bins in `hist` (the round sh.sel names): radix_select's loop body.
template <typename W>
KERN_DEV void exact_select_round(SplitShared& sh, uint32_t key_ref, W* hist, W* scratch) {
    const bool sat = sh.sel.sat != 0u;
    const int shift = (int)sh.sel.shift;
    W before;
    const int b = pick_bin<W>(hist, sat, (W)(sh.sel.total - sh.sel.above), (W)sh.sel.above, (W)sh.sel.target,
                              &before, scratch, sh);
    SAMPLE_STAMP(sizeof(W) == 4 ? SP_K_ROUND : SP_P_ROUND);
    if (threadIdx.x == 0) {
        if (b < 0) {  // unreachable: the range always holds the target
            sh.sel.result = 0u;
            sh.sel.done = 1u;
        } else {
            sh.sel.above = (unsigned long long)before;
            if (sat && b == 255 && shift < 24) {  // past 255 bins: the rest of the offsets, coarser
                sh.sel.lo += 255u << shift;
                sh.sel.shift = 24u;
            } else {
                sh.sel.lo += (uint32_t)b << shift;
                if (shift == 0) {
                    sh.sel.result = key_ref - sh.sel.lo;
                    sh.sel.done = 1u;
                } else {
                    sh.sel.shift = (uint32_t)(shift - 8);
                    sh.sel.sat = 0u;
                }
            }
        }
    }
    __syncthreads();
}

// The exact path's thresholds: thr = max(t_min, t_k, t_p) over the whole row, by phases (every thread calls).
template <typename T>
KERN_DEV float exact_thresholds(SplitShared& sh) {
    const int tid = threadIdx.x;
    const uint32_t key_m = float_key(sh.job.m);
    uint32_t tk = 0u;
    if (sh.job.use_k) {
        exact_select_begin(sh, key_m, (unsigned long long)(unsigned)sh.job.n,
                           (unsigned long long)(unsigned)sh.job.pp->top_k);
        while (!sh.sel.done) {
            exact_open(sh, SAMPLE_TASK_COUNT, sh.sel.lo, (int)sh.sel.shift, sh.sel.sat != 0u);
            exact_phase<T, SAMPLE_TASK_COUNT>(sh);
            exact_read_bins<unsigned>(sh, sh.hist_c);
            SAMPLE_STAMP(SP_PHASE_WAIT);
            exact_select_round<unsigned>(sh, key_m, sh.hist_c, sh.red_u);
        }
        tk = sh.sel.result;
    }
    uint32_t tp = 0u;
    if (sh.job.use_p) {
        if (tid == 0) sh.desc.tk = tk;
        exact_open(sh, SAMPLE_TASK_MASS, 0u, 16, true);  // the mass, the mass at or above t_k, the first round's bins
        exact_phase<T, SAMPLE_TASK_MASS>(sh);
        const unsigned long long* x = reinterpret_cast<const unsigned long long*>(sh.job.wrow + SAMPLE_CAND_WORD);
        const unsigned long long all = __ldcg(x + SAMPLE_X_ALL / 2), ge = __ldcg(x + SAMPLE_X_GE / 2);
        exact_read_bins<unsigned long long>(sh, sh.hist_w);
        SAMPLE_STAMP(SP_EXACT_MASS);
        exact_select_begin(sh, key_m, all, p_target(sh.job.pp->top_p, ge));
        // the first round (lo 0, 2^16-key bins, saturating) is the mass phase's
        if (!sh.sel.done) exact_select_round<unsigned long long>(sh, key_m, sh.hist_w, sh.red_w);
        while (!sh.sel.done) {
            exact_open(sh, SAMPLE_TASK_MBINS, sh.sel.lo, (int)sh.sel.shift, sh.sel.sat != 0u);
            exact_phase<T, SAMPLE_TASK_MBINS>(sh);
            exact_read_bins<unsigned long long>(sh, sh.hist_w);
            SAMPLE_STAMP(SP_PHASE_WAIT);
            exact_select_round<unsigned long long>(sh, key_m, sh.hist_w, sh.red_w);
        }
        tp = sh.sel.result;
    }
    const float m = sh.job.m;
    float thr = sh.job.use_min ? m + logf(sh.job.pp->min_p) : -CUDART_INF_F;
    if (sh.job.use_k) thr = fmaxf(thr, key_float(tk));
    if (sh.job.use_p) thr = fmaxf(thr, key_float(tp));
    return thr;
}

// The exact path's draw: the kept mass of each slice (a phase), then inside the slice that holds the target (the
// merge alone), and the result (every thread calls).
template <typename T>
KERN_DEV void exact_draw(SplitShared& sh, float thr) {
    const int tid = threadIdx.x;
    const uint32_t tkey = float_key(thr);
    if (tid == 0) sh.desc.tkey = tkey;
    exact_open(sh, SAMPLE_TASK_KEPT, 0u, 0, false);
    exact_phase<T, SAMPLE_TASK_KEPT>(sh);
    const ExactJob& job = sh.job;
    const int splits = job.splits;
    const unsigned long long* kept =
        reinterpret_cast<const unsigned long long*>(job.wrow + SAMPLE_CAND_WORD + SAMPLE_X_KEPT);
    for (int s = tid; s < splits; s += SAMPLE_THREADS) sh.slice_w[s] = __ldcg(kept + s);
    __syncthreads();
    if (tid == 0) sample_store_release(job.wrow + SAMPLE_W_STATE, SAMPLE_STATE_DONE);  // the helpers leave
    unsigned long long z_kept = 0;
    for (int s = 0; s < splits; ++s) z_kept += sh.slice_w[s];
    const unsigned long long t = draw_target(job.bits, z_kept);
    int ss = splits - 1;
    unsigned long long before = 0;
    for (int s = 0; s < splits; ++s) {
        if (before + sh.slice_w[s] > t) {
            ss = s;
            break;
        }
        before += sh.slice_w[s];
    }
    SAMPLE_STAMP(SP_EXACT_KEPT);
    const float m = job.m, inv_t = job.inv_t;
    draw_in_slice<T>(static_cast<const T*>(job.row), job.n, job.vec, inv_t, m, ss, tkey, t - before, sh);
    SAMPLE_STAMP(SP_DRAW);
    const int tok = sh.tok >= 0 ? sh.tok : job.am;
    write_result(job.r, tok, sh.tok >= 0 ? sh.tok_l : m, m, logf(fp_float(z_kept)), thr, inv_t, job.out_token,
                 job.out_logprob, job.stats);
}

// The exact path of the merge: t_k, t_p over the whole row (a slice-parallel phase per radix round, the mass with
// top-p's first), then the draw over it (the kept mass of each slice, a phase, then inside the slice that holds the
// target, by the merge alone).
template <typename T>
__device__ __noinline__ void sample_exact(SplitShared& sh) {
    const int tid = threadIdx.x;
    SAMPLE_PATH(sh.job.r, 3);
    SAMPLE_STAMP(SP_EXACT);
    uint32_t* wrow = sh.job.wrow;
    // the counters zeroed, no phase open, then the decision (the epoch's release publishes both to the helpers)
    for (int i = tid; i < 2 * SAMPLE_MAX_PHASES; i += SAMPLE_THREADS) wrow[SAMPLE_CAND_WORD + SAMPLE_X_COUNTERS + i] = 0u;
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        wrow[SAMPLE_W_STATE] = 0u;
        wrow[SAMPLE_W_DECISION] = sh.published ? SAMPLE_HELP_NONE : SAMPLE_HELP_EXACT;
        __threadfence();
        if (!sh.published) sample_store_release(wrow + SAMPLE_W_EPOCH, sh.e0 + 1u);
        sh.published = 1;
        sh.phase = 0;
        sh.desc.m = sh.job.m;
        sh.desc.inv_t = sh.job.inv_t;
        sh.desc.tk = 0u;
        sh.desc.tkey = 0u;
    }
    const float thr = exact_thresholds<T>(sh);
    exact_draw<T>(sh, thr);
}

// The merge (the block that drew row r's last ticket): every block's header and candidates are visible. Returns
// false when the row needs the exact path (sample_exact, with sh.row_m, sh.row_am, sh.row_bits), true when done.
template <typename T>
__device__ __noinline__ bool sample_merge(const T* row, int n, bool vec, int splits, int cap, int r,
                                          const SampleParams* pp, float inv_t, bool greedy, bool use_k, bool use_p,
                                          bool use_min, const int32_t* positions, const uint32_t* wrow,
                                          int32_t* out_token, float* out_logprob, float* stats, SplitShared& sh) {
    const int tid = threadIdx.x;
    const SampleParams p = *pp;  // the row's parameters (read-only for the whole launch)
    for (int s = tid; s < splits; s += SAMPLE_THREADS) {
        const uint4 h = __ldcg(reinterpret_cast<const uint4*>(wrow + 8 + SAMPLE_HDR_WORDS * s));
        sh.slice_m[s] = __uint_as_float(h.x);
        sh.slice_z[s] = __uint_as_float(h.y);
        sh.slice_a[s] = (int)h.z;
        sh.slice_k[s] = h.w;
        sh.slice_off[s + 1] = (int)__ldcg(wrow + 8 + SAMPLE_HDR_WORDS * s + 4);  // n_s, then its prefix
    }
    __syncthreads();
    if (tid == 0) {  // the candidate list: slices in order, each its n_s; K = max K_s
        int off = 0;
        uint32_t k_max = 0u;
        for (int s = 0; s < splits; ++s) {
            const int n_s = sh.slice_off[s + 1];
            sh.slice_off[s] = off;
            off += n_s;
            k_max = max(k_max, sh.slice_k[s]);
        }
        sh.slice_off[splits] = off;
        sh.n_cand = off;
        sh.region_key = k_max;
    }
    __syncthreads();
    float m = -CUDART_INF_F;
    int am = 0x7fffffff;
    for (int s = 0; s < splits; ++s)
        if (sh.slice_m[s] > m || (sh.slice_m[s] == m && sh.slice_a[s] < am)) {
            m = sh.slice_m[s];
            am = sh.slice_a[s];
        }
    float zs = 0.0f;
    if (tid < splits && sh.slice_m[tid] > -CUDART_INF_F) zs = sh.slice_z[tid] * __expf(sh.slice_m[tid] - m);
    float z;
    const float zinc = block_scan_incl(zs, &z, sh.red_f);
    if (tid < splits) {
        sh.slice_z[tid] = zs;
        sh.slice_zinc[tid] = zinc;
    }
    __syncthreads();
    SAMPLE_STAMP(SP_HEADERS);
    if (!(m > -CUDART_INF_F)) {  // every logit NaN or -inf
        SAMPLE_PATH(r, 0);
        if (use_k || use_p || use_min) release_helpers(sh);
        if (tid == 0) {
            out_token[r] = 0;
            out_logprob[r] = -CUDART_INF_F;
            if (stats) reinterpret_cast<float4*>(stats)[r] = make_float4(m, CUDART_INF_F, CUDART_INF_F, inv_t);
        }
        return true;
    }
    if (greedy) {
        SAMPLE_PATH(r, 0);
        write_result(r, am, m, m, logf(z), -CUDART_INF_F, inv_t, out_token, out_logprob, stats);
        return true;
    }
    const uint32_t bits = sample_bits24(p.seed_lo, p.seed_hi, positions[r]);
    const uint32_t key_m = float_key(m);
    if (!(use_k || use_p || use_min)) {
        // plain temperature: the slice whose inclusive prefix first passes u Z (rounding past them all: the
        // argmax's slice), then inside it
        const float target = (float)bits * (1.0f / 16777216.0f) * z;
        int ss = -1;
        for (int s = 0; s < splits && ss < 0; ++s)
            if (sh.slice_z[s] > 0.0f && sh.slice_zinc[s] > target) ss = s;
        if (ss < 0) ss = am / SAMPLE_SLICE;
        const float rem = target - (sh.slice_zinc[ss] - sh.slice_z[ss]);
        const unsigned long long t = rem > 0.0f ? __float2ull_rd(__fmul_rn(rem, SAMPLE_FP_ONE)) : 0ull;
        SAMPLE_PATH(r, 1);
        draw_in_slice<T>(row, n, vec, inv_t, m, ss, 1u, t, sh);
        SAMPLE_STAMP(SP_DRAW);
        const int tok = sh.tok >= 0 ? sh.tok : am;
        write_result(r, tok, sh.tok >= 0 ? sh.tok_l : m, m, logf(z), -CUDART_INF_F, inv_t, out_token, out_logprob,
                     stats);
        return true;
    }

    float thr = use_min ? m + logf(p.min_p) : -CUDART_INF_F;
    const int k = p.top_k;
    const uint32_t K = sh.region_key;
    const int n_cand = sh.n_cand;
    if (K != 0xffffffffu && n_cand <= SAMPLE_MERGE_CAP) {
        // the candidates with key >= K, 16 consecutive ones per thread (0: none), in shared memory
        const uint32_t* cand = wrow + SAMPLE_CAND_WORD;
        unsigned* ck = sh.cand_key + tid;  // element e of this thread: ck[e * SAMPLE_THREADS] (no bank conflicts)
        {
            // the 16 word offsets first, then the 16 loads, independent of each other: one L2 round trip, not 16
            // (the walk over the slices between the loads kept them apart)
            const int q0 = tid * SAMPLE_PER_THREAD;
            int s = q0 < n_cand ? cand_slice(q0, splits, sh) : 0;
            int at[16];  // word offset of candidate q0 + e's key in cand (< 2 * SAMPLE_MERGE_CAP), -1: none
#pragma unroll
            for (int e = 0; e < 16; ++e) {
                const int q = q0 + e;
                at[e] = -1;
                if (q < n_cand) {
                    while (q >= sh.slice_off[s + 1]) ++s;
                    at[e] = 2 * (s * cap + (q - sh.slice_off[s]));
                }
            }
            uint32_t key[16];
#pragma unroll
            for (int e = 0; e < 16; ++e) key[e] = at[e] >= 0 ? __ldcg(cand + at[e]) : 0u;
#pragma unroll
            for (int e = 0; e < 16; ++e) ck[e * SAMPLE_THREADS] = key[e] >= K ? key[e] : 0u;
        }
        SAMPLE_STAMP(SP_GATHER);
        auto each_count = [&](auto&& f) {
#pragma unroll
            for (int e = 0; e < 16; ++e)
                if (ck[e * SAMPLE_THREADS]) f(ck[e * SAMPLE_THREADS], 1u);
        };
        auto each_mass = [&](auto&& f) {
#pragma unroll
            for (int e = 0; e < 16; ++e)
                if (ck[e * SAMPLE_THREADS]) f(ck[e * SAMPLE_THREADS], fp_weight(key_float(ck[e * SAMPLE_THREADS]), m));
        };
        unsigned mine = 0;
        unsigned long long mine_w = 0;
#pragma unroll
        for (int e = 0; e < 16; ++e)
            if (ck[e * SAMPLE_THREADS]) {
                ++mine;
                mine_w += fp_weight(key_float(ck[e * SAMPLE_THREADS]), m);
            }
        const unsigned n_region = block_sum_all(mine, sh.red_u);
        SAMPLE_STAMP(SP_COUNT);
        bool ok = true;
        if (use_k) {
            if (n_region >= (unsigned)k) {  // every element at or above the k-th largest is here
                release_helpers(sh);        // thr >= t_k >= K: the candidate path (the waiting helpers leave now)
                const uint32_t tk = offset_select<unsigned>(each_count, key_m, n_region, (unsigned)k, sh.hist_c,
                                                            sh.red_u, sh);
                thr = fmaxf(thr, key_float(tk));
                if (use_p) {
                    unsigned long long w_ge = 0;
#pragma unroll
                    for (int e = 0; e < 16; ++e)
                        if (ck[e * SAMPLE_THREADS] >= tk) w_ge += fp_weight(key_float(ck[e * SAMPLE_THREADS]), m);
                    const unsigned long long z_k = block_sum_all(w_ge, sh.red_w);
                    const unsigned long long mass = block_sum_all(mine_w, sh.red_w);
                    SAMPLE_STAMP(SP_SUMS);
                    const uint32_t tp = offset_select<unsigned long long>(each_mass, key_m, mass,
                                                                          p_target(p.top_p, z_k), sh.hist_w,
                                                                          sh.red_w, sh);
                    thr = fmaxf(thr, key_float(tp));
                }
            } else {
                ok = !use_p;  // t_k lies below the candidates: Z_k is not known from them
            }
        } else if (use_p) {
            const unsigned long long target = p_target(p.top_p, (unsigned long long)((double)z * (double)SAMPLE_FP_ONE));
            const unsigned long long mass = block_sum_all(mine_w, sh.red_w);
            SAMPLE_STAMP(SP_SUMS);
            if (mass >= target) {  // else t_p lies below the candidates
                release_helpers(sh);  // thr >= t_p >= K: the candidate path
                const uint32_t tp = offset_select<unsigned long long>(each_mass, key_m, mass, target, sh.hist_w,
                                                                      sh.red_w, sh);
                thr = fmaxf(thr, key_float(tp));
            }
        }
        if (ok && float_key(thr) >= K) {
            // the draw over the kept candidates (l >= thr), in index order
            SAMPLE_PATH(r, 2);
            release_helpers(sh);
            const uint32_t tkey = float_key(thr);
            unsigned long long sum = 0;
#pragma unroll
            for (int e = 0; e < 16; ++e)
                if (ck[e * SAMPLE_THREADS] >= tkey) sum += fp_weight(key_float(ck[e * SAMPLE_THREADS]), m);
            if (tid == 0) sh.tok = -1;
            unsigned long long z_kept;
            const unsigned long long incl = block_scan_incl(sum, &z_kept, sh.red_w);
            const unsigned long long t = draw_target(bits, z_kept);
            const unsigned long long excl = incl - sum;
            if (sum > 0 && excl <= t && t < incl) {
                unsigned long long run = excl;
#pragma unroll
                for (int e = 0; e < 16; ++e) {
                    if (ck[e * SAMPLE_THREADS] < tkey) continue;
                    run += fp_weight(key_float(ck[e * SAMPLE_THREADS]), m);
                    if (run > t) {
                        const int q = tid * SAMPLE_PER_THREAD + e;
                        const int s = cand_slice(q, splits, sh);  // the candidate's slice (never an empty one)
                        sh.tok = (int)__ldcg(cand + 2 * ((int64_t)s * cap + (q - sh.slice_off[s])) + 1);
                        sh.tok_l = key_float(ck[e * SAMPLE_THREADS]);
                        break;
                    }
                }
            }
            __syncthreads();
            SAMPLE_STAMP(SP_DRAW);
            const int tok = sh.tok >= 0 ? sh.tok : am;
            write_result(r, tok, sh.tok >= 0 ? sh.tok_l : m, m, logf(fp_float(z_kept)), thr, inv_t, out_token,
                         out_logprob, stats);
            return true;
        }
    }

    if (tid == 0) {
        ExactJob& job = sh.job;
        job.row = row;
        job.wrow = sh.wrow;
        job.pp = pp;
        job.out_token = out_token;
        job.out_logprob = out_logprob;
        job.stats = stats;
        job.n = n;
        job.splits = splits;
        job.r = r;
        job.am = am;
        job.inv_t = inv_t;
        job.m = m;
        job.bits = bits;
        job.vec = vec;
        job.use_k = use_k;
        job.use_p = use_p;
        job.use_min = use_min;
    }
    __syncthreads();
    return false;
}

template <typename T>
KERN_DEV void sample_slice(T* logits, const uint32_t* params_words, const int32_t* positions,
                           const int32_t* hist_tokens, const int32_t* hist_counts, int32_t hist_cap, int32_t vocab,
                           int32_t* out_token, float* out_logprob, float* stats, uint32_t* work SAMPLE_PROF_ARG) {
    SAMPLE_SHARED(SplitShared, sh);
    const int n = vocab, tid = threadIdx.x;
    // uniform per launch: no barrier is split
    if (n <= 0 || n > SAMPLE_MAX_VOCAB || blockDim.x != SAMPLE_THREADS || work == nullptr) return;
    const int splits = (n + SAMPLE_SLICE - 1) / SAMPLE_SLICE;
    if (gridDim.x != (unsigned)splits) return;
    const int s = blockIdx.x, r = blockIdx.y;
    const int cap = splits == 1 ? SAMPLE_MERGE_CAP : SAMPLE_MERGE_CAP / splits;
#ifdef SAMPLE_PROFILE
    sample_prof_begin(sh, prof, s, r);
#endif
    const SampleParams p = *reinterpret_cast<const SampleParams*>(params_words + (int64_t)r * SAMPLE_PARAM_WORDS);
    T* row = logits + (int64_t)r * n;
    uint32_t* wrow = work + (int64_t)r * SAMPLE_WORK_WORDS;
    if (tid == 0) atomicAdd(wrow + SAMPLE_W_TICKET, SAMPLE_START_ONE);  // this block has started (resident)
    const bool vec = (n % (16 / (int)sizeof(T)) == 0) && aligned16(logits);
    const int64_t base = (int64_t)s * SAMPLE_SLICE;
    const int64_t end = min(base + SAMPLE_SLICE, (int64_t)n);

    // 0. penalties, in place, for the history tokens in this slice (distinct per row: no two threads write one
    // element)
    const bool penalize = p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
    if (penalize && hist_tokens != nullptr && hist_counts != nullptr) {
        for (int j = tid; j < hist_cap; j += SAMPLE_THREADS) {
            const int tok = hist_tokens[(int64_t)r * hist_cap + j];
            if (tok < base || tok >= end) continue;
            const int cnt = hist_counts[(int64_t)r * hist_cap + j];
            if (cnt <= 0) continue;
            const float x = load_f(row + tok);
            // no FMA contraction: the reference rounds each operation (tools/reference_sample.py)
            const float y = x > 0.0f ? __fdiv_rn(x, p.repetition_penalty) : __fmul_rn(x, p.repetition_penalty);
            const float y2 = __fsub_rn(y, __fmul_rn(p.frequency_penalty, (float)cnt));
            store_f(row + tok, __fsub_rn(y2, p.presence_penalty));
        }
        __syncthreads();  // the writes are visible to the whole block after the barrier
    }
    SAMPLE_STAMP(SP_PENALTY);

    // 1. the slice's max, argmax and sum of exp (online per thread)
    const bool greedy = !(p.temperature > 0.0f);
    const float inv_t = greedy ? 1.0f : 1.0f / p.temperature;
    const bool use_k = !greedy && p.top_k > 0 && p.top_k < n;
    const bool use_p = !greedy && p.top_p < 1.0f;
    const bool use_min = !greedy && p.min_p > 0.0f;
    float l[16];
    const int64_t i0 = base + (int64_t)tid * SAMPLE_PER_THREAD;
    const int nv = load16<false>(row, i0, n, vec, l);
    float tmax = -CUDART_INF_F, tsum = 0.0f;
    int targ = 0x7fffffff;
#pragma unroll
    for (int e = 0; e < 16; ++e) {
        l[e] = scaled_logit(l[e], inv_t);
        if (e >= nv) continue;
        if (l[e] > tmax) {
            tsum = tsum * __expf(tmax - l[e]) + 1.0f;
            tmax = l[e];
            targ = (int)(i0 + e);
        } else if (l[e] > -CUDART_INF_F) {
            tsum += __expf(l[e] - tmax);
        }
    }
    float m_s = tmax;
    int a_s = targ;
    block_argmax_all(m_s, a_s, sh.red_f, sh.red_i);
    const float z_s = block_sum_all(tmax > -CUDART_INF_F ? tsum * __expf(tmax - m_s) : 0.0f, sh.red_f);
    SAMPLE_STAMP(SP_REDUCE);

    // 2. candidates (filters only): every l with key >= K_s, at most cap of them
    uint32_t k_s = 0xffffffffu;
    int n_s = 0;
    if (use_k || use_p || use_min) {
        const uint32_t key_ref = float_key(m_s);
        const unsigned total = (unsigned)(end - base);
        auto each_count = [&](auto&& f) {
#pragma unroll
            for (int e = 0; e < 16; ++e)
                if (e < nv) f(float_key(l[e]), 1u);
        };
        uint32_t floor_key = 1u;  // this slice's bound on the kept set
        if (use_min) floor_key = max(floor_key, float_key(m_s + logf(p.min_p)));  // m_s <= m: below t_min
        bool built = false;
        if (use_k && p.top_k <= cap && (unsigned)p.top_k <= total) {
            // a key at or below the slice's top_k-th largest (itself <= t_k): the bin holding it, and below
            offset_hist<unsigned>(each_count, key_ref, 0u, 16, true, sh.hist_c);
            built = true;
            unsigned before;
            const int b = pick_bin<unsigned>(sh.hist_c, true, total, 0u, (unsigned)p.top_k, &before, sh.red_u, sh);
            SAMPLE_STAMP(SP_EXPORT_KHIST);
            if (b >= 0 && b < 255) floor_key = max(floor_key, key_below(key_ref, ((uint64_t)b + 1) << 16));
        }
        int c = 0;
#pragma unroll
        for (int e = 0; e < 16; ++e) c += (e < nv && float_key(l[e]) >= floor_key) ? 1 : 0;
        c = block_sum_all(c, sh.red_i);
        k_s = floor_key;
        if (c > cap) {
            // more than cap above the bound: the lowest bin edge with at most cap above it, the rounds of
            // offset_select (2^16-key bins, past them 2^24, then finer inside the bin that overflowed) while the
            // edge leaves more than half the capacity unused
            uint32_t lo = 0u;
            int shift = 16;
            bool sat = true;
            unsigned before = 0u;
            uint64_t bound = 0u;  // exported: offsets below bound (`before` <= cap of them)
            for (bool first = true;; first = false) {
                if (!(first && built)) offset_hist<unsigned>(each_count, key_ref, lo, shift, sat, sh.hist_c);
                const int b = pick_bin<unsigned>(sh.hist_c, sat, total - before, before, (unsigned)cap + 1u, &before,
                                                 sh.red_u, sh);
                SAMPLE_STAMP(SP_EXPORT_ROUND);
                bound = lo + ((uint64_t)b << shift);
                if (before >= (unsigned)cap / 2 || (shift == 0 && !sat)) break;
                lo = (uint32_t)bound;
                if (sat && b == 255 && shift < 24) {
                    shift = 24;  // still open-ended: the rest of the offsets, coarser
                } else {
                    if (shift == 0) break;
                    shift -= 8;
                    sat = false;
                }
            }
            k_s = key_below(key_ref, bound);
        }
        int mine = 0;
#pragma unroll
        for (int e = 0; e < 16; ++e) mine += (e < nv && float_key(l[e]) >= k_s) ? 1 : 0;
        int total_out;
        int off = block_scan_incl(mine, &total_out, sh.red_i) - mine;
        if (total_out > cap) {  // cannot happen (the counts above are exact); the merge then takes the exact path
            k_s = 0xffffffffu;
        } else {
            n_s = total_out;
            uint32_t* cand = wrow + SAMPLE_CAND_WORD + 2 * (int64_t)s * cap;
#pragma unroll
            for (int e = 0; e < 16; ++e) {
                const uint32_t key = float_key(l[e]);
                if (e < nv && key >= k_s) {
                    reinterpret_cast<uint2*>(cand)[off] = make_uint2(key, (uint32_t)(i0 + e));
                    ++off;
                }
            }
        }
        SAMPLE_STAMP(SP_EXPORT_WRITE);
    }

    // 3. the header, then the row's ticket: the last block merges
    if (tid == 0) {
        uint32_t* h = wrow + 8 + SAMPLE_HDR_WORDS * s;
        *reinterpret_cast<uint4*>(h) = make_uint4(__float_as_uint(m_s), __float_as_uint(z_s), (uint32_t)a_s, k_s);
        h[4] = (uint32_t)n_s;
    }
    if (tid == 0) sh.e0 = sample_load_relaxed(wrow + SAMPLE_W_EPOCH);  // before the ticket (the fence orders it)
    __threadfence();  // this block's writes (penalties, candidates, header) before its ticket
    __syncthreads();
    if (tid == 0) {
        const unsigned old = atomicAdd(wrow + SAMPLE_W_TICKET, 1u);
        sh.last = (int)(old & (SAMPLE_START_ONE - 1u)) == splits - 1;
        sh.all_started = (old >> 16) == (unsigned)splits;  // every block of the row resident or done
        sh.published = 0;
        sh.wrow = wrow;
    }
    __syncthreads();
    SAMPLE_STAMP(SP_TICKET);
    if (!sh.last) {
        // a filtering row whose blocks have all started: wait (bounded) for the merge's decision, help if exact
        if (sh.all_started)
            sample_help<T>(row, n, vec, splits, r, wrow, reinterpret_cast<const SampleParams*>(params_words) + r, sh);
#ifdef SAMPLE_PROFILE
        sample_prof_end(sh, false);
#endif
        return;
    }
    __threadfence();
    if (tid == 0) wrow[SAMPLE_W_TICKET] = 0u;  // zero again for the next launch
    const SampleParams* pp = reinterpret_cast<const SampleParams*>(params_words) + r;
    const bool m_use_min = !greedy && pp->min_p > 0.0f;  // read again: not held in a register across the slice pass
    if (!sample_merge<T>(row, n, vec, splits, cap, r, pp, inv_t, greedy, use_k, use_p, m_use_min, positions, wrow,
                         out_token, out_logprob, stats, sh))
        sample_exact<T>(sh);
#ifdef SAMPLE_PROFILE
    SAMPLE_STAMP(SP_DONE);
    sample_prof_end(sh, true);
#endif
}

// grid (cdiv(vocab, 8192), rows, 1), block (512,1,1). logits [rows, vocab] (penalized in place), params [rows, 12]
// words (SampleParams), positions [rows], hist_tokens / hist_counts [rows, hist_cap] (may be null when no row
// penalizes), out_token [rows] int32, out_logprob [rows] f32, stats [rows, 4] f32 or null, work [rows,
// SAMPLE_WORK_WORDS] u32 (word 0 of each row zero before the launch; zero after it).
#define SAMPLE_ENTRY(NAME, T)                                                                                      \
    extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, 2)                                                \
        NAME(T* logits, const uint32_t* params, const int32_t* positions, const int32_t* hist_tokens,           \
             const int32_t* hist_counts, int32_t hist_cap, int32_t vocab, int32_t* out_token, float* out_logprob, \
             float* stats, uint32_t* work SAMPLE_PROF_ARG) {                                                      \
        kern_pdl_wait();                                                                                          \
        kern_pdl_launch_dependents();                                                                             \
        sample_slice<T>(logits, params, positions, hist_tokens, hist_counts, hist_cap, vocab, out_token,         \
                        out_logprob, stats, work SAMPLE_PROF_PASS);                                               \
    }
SAMPLE_ENTRY(kern_sample_bf16, __nv_bfloat16)
SAMPLE_ENTRY(kern_sample_f32, float)

// ------------------------------------------------------------------------------------ top logprobs

template <int V>
KERN_DEV void load_vec16(const __nv_bfloat16* p, float (&v)[V]) {
    static_assert(V == 8, "8 bf16 per 16 bytes");
    load8_vec(p, v);
}
template <int V>
KERN_DEV void load_vec16(const float* p, float (&v)[V]) {
    static_assert(V == 4, "4 f32 per 16 bytes");
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
}

// Calls f(i, x) for this thread's elements of a row of n logits (a block of TOP_THREADS), in a fixed order: groups of V = 16 bytes
// at g = (threadIdx.x + j * 1024) * V, element by element inside a group. `vec`: 16-byte loads (n % V == 0
// and a 16-byte aligned row), else element loads. Plain loads (no __ldg): the row may have been written by
// this block (penalties).
template <typename T, typename F>
KERN_DEV void for_each_logit(const T* row, int n, bool vec, F&& f) {
    constexpr int V = 16 / (int)sizeof(T);
    for (int g = threadIdx.x * V; g < n; g += TOP_THREADS * V) {
        float v[V];
        if (vec) {
            load_vec16<V>(row + g, v);
        } else {
#pragma unroll
            for (int e = 0; e < V; ++e) v[e] = (g + e < n) ? load_f(row + g + e) : 0.0f;
        }
#pragma unroll
        for (int e = 0; e < V; ++e)
            if (g + e < n) f(g + e, v[e]);
    }
}


template <typename T>
KERN_DEV void top_logprobs_row(const T* logits, const float* stats, int32_t vocab, int32_t n_top, int32_t* out_ids,
                               float* out_logprobs) {
    __shared__ float red[32];
    __shared__ int red_i[32];
    const int r = blockIdx.x, n = vocab;
    if (n <= 0 || n_top <= 0 || blockDim.x != TOP_THREADS) return;
    const T* row = logits + (int64_t)r * n;
    const bool vec = (n % (16 / (int)sizeof(T)) == 0) && aligned16(logits);
    const float4 st = reinterpret_cast<const float4*>(stats)[r];  // (m, log Z_kept, thr, inv_t)
    float pv = CUDART_INF_F;
    int pi = -1;
    for (int j = 0; j < n_top; ++j) {
        float bv = -CUDART_INF_F;
        int bi = 0x7fffffff;
        for_each_logit(row, n, vec, [&](int i, float x) {
            const float l = scaled_logit(x, st.w);
            const bool after = l < pv || (l == pv && i > pi);  // ranks after the previous pick
            if (after && (l > bv || (l == bv && i < bi))) {
                bv = l;
                bi = i;
            }
        });
        block_argmax_all(bv, bi, red, red_i);
        if (threadIdx.x == 0) {
            const int64_t o = (int64_t)r * n_top + j;
            out_ids[o] = bi == 0x7fffffff ? -1 : bi;
            out_logprobs[o] = (bi != 0x7fffffff && bv >= st.z) ? (bv - st.x) - st.y : -CUDART_INF_F;
        }
        pv = bv;
        pi = bi;
    }
}

// grid (rows,1,1), block (1024,1,1); after kern_sample on the same logits and stats. out_ids [rows, n_top]
// (-1 past the vocabulary), out_logprobs [rows, n_top].
#define TOP_ENTRY(NAME, T)                                                                                      \
    extern "C" __global__ void __launch_bounds__(TOP_THREADS, 1)                                              \
        NAME(const T* logits, const float* stats, int32_t vocab, int32_t n_top, int32_t* out_ids,             \
             float* out_logprobs) {                                                                             \
        kern_pdl_wait();                                                                                        \
        kern_pdl_launch_dependents();                                                                           \
        top_logprobs_row<T>(logits, stats, vocab, n_top, out_ids, out_logprobs);                               \
    }
TOP_ENTRY(kern_sample_top_logprobs_bf16, __nv_bfloat16)
TOP_ENTRY(kern_sample_top_logprobs_f32, float)

// ---------------------------------------------------------------------------------------- history

// grid (rows,1,1), block (32,1,1): adds tokens[r] to row r's history list: its count + 1 where the list holds
// it, else the first slot of count <= 0 gets (token, 1); a full list, or a token outside [0, vocab), is
// left as it is.
extern "C" __global__ void kern_sample_history_append(int32_t* hist_tokens, int32_t* hist_counts,
                                                      const int32_t* tokens, int32_t hist_cap, int32_t vocab) {
    kern_pdl_wait();
    kern_pdl_launch_dependents();
    const int r = blockIdx.x, lane = threadIdx.x;
    if (blockDim.x != 32 || hist_cap <= 0) return;
    const int tok = tokens[r];
    if (tok < 0 || tok >= vocab) return;
    int32_t* ht = hist_tokens + (int64_t)r * hist_cap;
    int32_t* hc = hist_counts + (int64_t)r * hist_cap;
    int found = 0x7fffffff, empty = 0x7fffffff;
    for (int j0 = 0; j0 < hist_cap; j0 += 32) {
        const int j = j0 + lane;
        const bool in = j < hist_cap;
        const int c = in ? hc[j] : 0;
        const unsigned hit = __ballot_sync(0xffffffffu, in && c > 0 && ht[j] == tok);
        const unsigned free_ = __ballot_sync(0xffffffffu, in && c <= 0);
        if (hit && found == 0x7fffffff) found = j0 + __ffs(hit) - 1;
        if (free_ && empty == 0x7fffffff) empty = j0 + __ffs(free_) - 1;
        if (found != 0x7fffffff) break;
    }
    if (lane != 0) return;
    if (found != 0x7fffffff) {
        hc[found] += 1;
    } else if (empty != 0x7fffffff) {
        ht[empty] = tok;
        hc[empty] = 1;
    }
}

// ----------------------------------------------------------------------------------------- Philox test

// grid (cdiv(n, 256),1,1), block (256,1,1): out[i] = Philox4x32-10(counter = in[i, 0:4], key = in[i, 4:6]).
extern "C" __global__ void kern_philox4x32_10(const uint32_t* in, uint32_t* out, int32_t n) {
    kern_pdl_wait();
    kern_pdl_launch_dependents();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint32_t* a = in + (int64_t)i * 6;
    const uint4 w = philox4x32_10(make_uint4(a[0], a[1], a[2], a[3]), make_uint2(a[4], a[5]));
    reinterpret_cast<uint4*>(out)[i] = w;
}
