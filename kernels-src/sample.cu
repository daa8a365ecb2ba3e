// Per-row sampling over a [rows, vocab] logits buffer (contract: docs/kernels.md "Sampling").
//
// kern_sample_{bf16,f32}: one block of 1024 threads per row. In order:
//   0. penalties, IN PLACE in the logits row, over the row's history list (distinct token ids with counts):
//        x' = (x > 0 ? x / repetition : x * repetition) - frequency * count - presence       (f32 math, stored
//        back in the buffer's dtype)
//   1. l = x * (1 / temperature) (NaN logits read as -inf); pass A: m = max l, argmax (ties -> smallest
//      index), Z = sum exp(l - m). temperature <= 0 (or NaN): greedy, token = argmax, logprob = -log Z
//      (the log-softmax of the penalized logits at temperature 1), done.
//   2. kept set = {l >= thr}, thr = max(t_k, t_p, t_min):
//        t_min = m + log(min_p)                                           (min_p > 0)
//        t_k   = the k-th largest l, counted with multiplicity (ties at it all kept)      (0 < top_k < vocab)
//        t_p   = the largest v >= t_k with mass(l >= v) >= top_p * mass(l >= t_k)         (top_p < 1)
//      Fast path: a pivot P <= thr (min-p alone: P = t_min; with top-k / top-p: from the 1024 per-thread
//      maxima of pass A), the row's elements >= P gathered in a fixed order (thread-major over the block's
//      strided layout) into shared memory, at most 1024 of them; t_k and t_p computed on them, and the draw
//      made over them. Slow path (more than 1024 candidates, top_k > 1024, or no filter): t_k / t_p by a
//      bitwise search over the float keys with full passes over the row (up to 32 per filter), then a draw
//      pass over the whole row. Both exact, by the same definitions.
//   3. one uniform u of Philox4x32-10(counter = (position, 0, 0, 0), key = (seed_lo, seed_hi)), word 0,
//      u = (w0 >> 8) * 2^-24; inverse CDF over the kept mass in the fixed element order: token = the element
//      where the running sum first exceeds u * Z_kept. logprob = (l_token - m) - log(Z_kept).
// Outputs: out_token[r] (int32), out_logprob[r] (f32); stats[r] = (m, log Z_kept, thr, 1/temperature) when
// stats is not null (kern_sample_top_logprobs reads it).
//
// kern_sample_top_logprobs_{bf16,f32}: the n_top best (l, index) of a row (l desc, index asc) and their
// logprob under the sampled distribution (-inf outside the kept set). n_top passes over the row.
// kern_sample_history_append: adds this step's token to each row's history list.
// kern_philox4x32_10: raw Philox4x32-10 blocks for tests.
//
// No allocation, no host sync: every entry may be captured in a graph; all begin with griddepcontrol.wait
// then launch_dependents (PDL-safe after any kernel).
#include <math_constants.h>

#include "common.cuh"

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#define SAMPLE_CANDIDATES 1024
#define SAMPLE_BRUTE 256  // up to this many candidates: thresholds by per-candidate counts
#define SAMPLE_MAX_VOCAB (1 << 20)
#define SAMPLE_PARAM_WORDS 12  // 48 bytes per row

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

// The sampling uniform of a row: [0, 1) in steps of 2^-24.
KERN_DEV float sample_uniform(uint32_t seed_lo, uint32_t seed_hi, int32_t position) {
    const uint4 w = philox4x32_10(make_uint4((uint32_t)position, 0u, 0u, 0u), make_uint2(seed_lo, seed_hi));
    return (float)(w.x >> 8) * (1.0f / 16777216.0f);
}

// ------------------------------------------------------------------------------------------ helpers

// Order-preserving map of a float to uint32 (larger float -> larger key; -0 < +0 here, never matters: keys
// come from l values that compare equal only when their keys are equal, except -0/+0).
KERN_DEV uint32_t float_key(float f) {
    const uint32_t b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
KERN_DEV float key_float(uint32_t k) { return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

// l = x / temperature as the sampler forms it: NaN -> -inf, -0 -> +0 (so float order and key order agree)
KERN_DEV float scaled_logit(float x, float inv_t) { return isnan(x) ? -CUDART_INF_F : __fadd_rn(__fmul_rn(x, inv_t), 0.0f); }

KERN_DEV float load_f(const __nv_bfloat16* p) { return bf2f(*p); }
KERN_DEV float load_f(const float* p) { return *p; }
KERN_DEV void store_f(__nv_bfloat16* p, float v) { *p = f2bf(v); }
KERN_DEV void store_f(float* p, float v) { *p = v; }

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

// Calls f(i, x) for this thread's elements of a row of n logits, in a fixed order: groups of V = 16 bytes
// at g = (threadIdx.x + j * 1024) * V, element by element inside a group. `vec`: 16-byte loads (n % V == 0
// and a 16-byte aligned row), else element loads. Plain loads (no __ldg): the row may have been written by
// this block (penalties).
template <typename T, typename F>
KERN_DEV void for_each_logit(const T* row, int n, bool vec, F&& f) {
    constexpr int V = 16 / (int)sizeof(T);
    for (int g = threadIdx.x * V; g < n; g += SAMPLE_THREADS * V) {
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

struct SampleShared {
    float red[SAMPLE_WARPS];
    int red_i[SAMPLE_WARPS];
    float scan[SAMPLE_WARPS];
    unsigned key_a, key_b;
    int sel;
    float z_k;
    float base;
    float cand_val[SAMPLE_CANDIDATES];
    float cand_p[SAMPLE_CANDIDATES];
    int cand_idx[SAMPLE_CANDIDATES];
};

// Block max of (v, i) with ties -> smallest i; every thread gets the result.
KERN_DEV void block_argmax_all(float& v, int& i, SampleShared& sh) {
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
        sh.red[warp] = v;
        sh.red_i[warp] = i;
    }
    __syncthreads();
    v = sh.red[0];
    i = sh.red_i[0];
    for (int w = 1; w < SAMPLE_WARPS; ++w)
        if (sh.red[w] > v || (sh.red[w] == v && sh.red_i[w] < i)) {
            v = sh.red[w];
            i = sh.red_i[w];
        }
}

// Block sum in a fixed order (deterministic); every thread gets it. `scratch` holds one V per warp.
template <typename V>
KERN_DEV V block_sum_all(V x, V* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
    __syncthreads();
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    V total = 0;
    for (int w = 0; w < SAMPLE_WARPS; ++w) total += scratch[w];
    return total;
}

// Inclusive block scan of x in thread order (fixed order: deterministic); returns this thread's inclusive
// prefix, *total the block's sum. `scratch` holds one V per warp.
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
    for (int w = 0; w < SAMPLE_WARPS; ++w) {
        if (w == warp) before = all;
        all += scratch[w];
    }
    *total = all;
    return before + x;
}

// Count of the row's l >= key_float(key) (cnt) and their mass sum exp(l - m) (mass), full pass.
template <typename T>
KERN_DEV void row_count_mass(const T* row, int n, bool vec, float inv_t, float m, uint32_t key, bool want_mass,
                             int* cnt, float* mass, SampleShared& sh) {
    int c = 0;
    float s = 0.0f;
    for_each_logit(row, n, vec, [&](int, float x) {
        const float l = scaled_logit(x, inv_t);
        if (float_key(l) >= key) {
            ++c;
            if (want_mass) s += __expf(l - m);
        }
    });
    *cnt = block_sum_all(c, sh.red_i);
    *mass = want_mass ? block_sum_all(s, sh.red) : 0.0f;
}

// The thread whose inclusive prefix first passes `target` among those with mass w > 0 (the smallest such
// thread); when rounding put the target past every prefix, the last thread with mass. Uniform result.
KERN_DEV int select_thread(float w, float incl, float target, SampleShared& sh) {
    __syncthreads();  // sh.sel may still be read by a previous call
    if (threadIdx.x == 0) sh.sel = 0x7fffffff;
    __syncthreads();
    if (w > 0.0f && incl > target) atomicMin(&sh.sel, (int)threadIdx.x);
    __syncthreads();
    int sel = sh.sel;
    if (sel == 0x7fffffff) {
        __syncthreads();
        if (threadIdx.x == 0) sh.sel = -1;
        __syncthreads();
        if (w > 0.0f) atomicMax(&sh.sel, (int)threadIdx.x);
        __syncthreads();
        sel = sh.sel;
    }
    return sel;
}

// t_k and t_p (docs/kernels.md "Sampling") by a bitwise search over the float keys, the largest key meeting
// each condition, from count_mass(key, want_mass, &cnt, &mass): the count and mass of the elements whose key
// is >= key (called uniformly: it may hold barriers). Returns thr raised by them; a top-p search that meets
// nothing (its mass fell short by rounding) raises thr to fallback_key instead (0: no raise).
template <typename CountMass>
KERN_DEV float search_thresholds(CountMass&& count_mass, bool use_k, bool use_p, int k, float top_p, float z,
                                 uint32_t fallback_key, float thr) {
    int cnt;
    float mass;
    uint32_t tk_key = 0u;
    float z_k = z;
    if (use_k) {
        for (int b = 31; b >= 0; --b) {
            const uint32_t cand = tk_key | (1u << b);
            count_mass(cand, false, &cnt, &mass);
            if (cnt >= k) tk_key = cand;
        }
        if (tk_key != 0u) {  // 0: fewer than k elements (min-p raised the pivot past t_k): no top-k bound
            count_mass(tk_key, true, &cnt, &z_k);
            thr = fmaxf(thr, key_float(tk_key));
        }
    }
    if (use_p) {
        const float target_k = top_p * z_k;
        uint32_t tp_key = 0u;
        for (int b = 31; b >= 0; --b) {
            const uint32_t cand = tp_key | (1u << b);
            bool ok = cand <= tk_key;  // at or below t_k the top-k set's mass is all there
            if (!ok) {
                count_mass(cand, true, &cnt, &mass);
                ok = mass >= target_k;
            }
            if (ok) tp_key = cand;
        }
        const uint32_t key = tp_key != 0u ? tp_key : fallback_key;
        if (key != 0u) thr = fmaxf(thr, key_float(key));
    }
    return thr;
}

// ------------------------------------------------------------------------------------------ sampler

template <typename T>
KERN_DEV void sample_row(T* logits, const uint32_t* params_words, const int32_t* positions,
                         const int32_t* hist_tokens, const int32_t* hist_counts, int32_t hist_cap, int32_t vocab,
                         int32_t* out_token, float* out_logprob, float* stats) {
    __shared__ SampleShared sh;
    const int r = blockIdx.x, tid = threadIdx.x;
    const int n = vocab;
    // uniform per launch: no barrier is split. vocab <= 2^20: a thread's walk (ceil(vocab / (1024 V)) groups of V)
    // fits the block's 1024 threads
    if (n <= 0 || n > SAMPLE_MAX_VOCAB || blockDim.x != SAMPLE_THREADS) return;
    const SampleParams p = *reinterpret_cast<const SampleParams*>(params_words + (int64_t)r * SAMPLE_PARAM_WORDS);
    T* row = logits + (int64_t)r * n;
    const bool vec = (n % (16 / (int)sizeof(T)) == 0) && aligned16(logits);

    // 0. penalties, in place (history tokens are distinct per row: no two threads write one element)
    const bool penalize = p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
    if (penalize && hist_tokens != nullptr && hist_counts != nullptr) {
        for (int j = tid; j < hist_cap; j += SAMPLE_THREADS) {
            const int tok = hist_tokens[(int64_t)r * hist_cap + j];
            const int cnt = hist_counts[(int64_t)r * hist_cap + j];
            if (cnt <= 0 || tok < 0 || tok >= n) continue;
            const float x = load_f(row + tok);
            // no FMA contraction: the reference rounds each operation (tools/reference_sample.py)
            const float y = x > 0.0f ? __fdiv_rn(x, p.repetition_penalty) : __fmul_rn(x, p.repetition_penalty);
            const float y2 = __fsub_rn(y, __fmul_rn(p.frequency_penalty, (float)cnt));
            store_f(row + tok, __fsub_rn(y2, p.presence_penalty));
        }
        __syncthreads();  // the writes are visible to the whole block after the barrier
    }

    // 1. pass A: max, argmax, sum of exp (online per thread)
    const bool greedy = !(p.temperature > 0.0f);
    const float inv_t = greedy ? 1.0f : 1.0f / p.temperature;
    float tmax = -CUDART_INF_F, tsum = 0.0f;
    int targ = 0x7fffffff;
    for_each_logit(row, n, vec, [&](int i, float x) {
        const float l = scaled_logit(x, inv_t);
        if (l > tmax) {
            tsum = tsum * __expf(tmax - l) + 1.0f;
            tmax = l;
            targ = i;
        } else if (l > -CUDART_INF_F) {
            tsum += __expf(l - tmax);
        }
    });
    float m = tmax;
    int amax = targ;
    block_argmax_all(m, amax, sh);
    const float z = block_sum_all(tmax > -CUDART_INF_F ? tsum * __expf(tmax - m) : 0.0f, sh.red);
    if (!(m > -CUDART_INF_F)) {  // every logit NaN or -inf
        if (tid == 0) {
            out_token[r] = 0;
            out_logprob[r] = -CUDART_INF_F;
            if (stats) reinterpret_cast<float4*>(stats)[r] = make_float4(m, CUDART_INF_F, CUDART_INF_F, inv_t);
        }
        return;
    }
    if (greedy) {
        if (tid == 0) {
            out_token[r] = amax == 0x7fffffff ? 0 : amax;
            out_logprob[r] = -logf(z);
            if (stats) reinterpret_cast<float4*>(stats)[r] = make_float4(m, logf(z), -CUDART_INF_F, inv_t);
        }
        return;
    }

    // 2. thresholds (kept = l >= thr) and 3. the draw
    const bool use_k = p.top_k > 0 && p.top_k < n;
    const bool use_p = p.top_p < 1.0f;
    const bool use_min = p.min_p > 0.0f;
    const int k = p.top_k;
    float thr = use_min ? m + logf(p.min_p) : -CUDART_INF_F;
    const float u = sample_uniform(p.seed_lo, p.seed_hi, positions[r]);
    bool fast = !use_k || k <= SAMPLE_CANDIDATES;
    if (use_k || use_p || use_min) {
        uint32_t pivot = float_key(thr);  // min-p alone: the exact threshold
        if (fast && (use_k || use_p)) {
            // a pivot <= thr from the per-thread maxima: for top-k the k-th largest of them (<= t_k); for
            // top-p alone the largest key whose maxima carry top_p * Z (<= t_p); built bit by bit from the top
            pivot = 0u;
            const uint32_t mine = float_key(tmax);
            const float mine_p = tmax > -CUDART_INF_F ? __expf(tmax - m) : 0.0f;
            const float target = p.top_p * z;
            for (int b = 31; b >= (use_k ? 0 : 12); --b) {
                const uint32_t cand = pivot | (1u << b);
                bool ok;
                if (use_k) ok = __syncthreads_count(mine >= cand) >= k;
                else ok = block_sum_all(mine >= cand ? mine_p : 0.0f, sh.red) >= target;
                if (ok) pivot = cand;
            }
            // with one of top-k / top-p, min-p may raise the pivot: elements below t_min are never kept, and
            // neither t_k alone (when fewer than k are >= the pivot, t_k < t_min) nor t_p over the whole row
            // needs them. With both, Z_k needs every element >= t_k.
            if (!(use_k && use_p)) pivot = max(pivot, float_key(thr));
        }
        if (fast) {
            // gather the row's l >= pivot into shared memory, in thread order then element order
            int c = 0;
            for_each_logit(row, n, vec, [&](int, float x) { c += float_key(scaled_logit(x, inv_t)) >= pivot; });
            int total;
            int off = block_scan_incl(c, &total, sh.red_i) - c;  // exclusive prefix
            fast = total <= SAMPLE_CANDIDATES && (!use_k || !use_p || total >= k);
            if (fast) {
                for_each_logit(row, n, vec, [&](int i, float x) {
                    const float l = scaled_logit(x, inv_t);
                    if (float_key(l) >= pivot) {
                        sh.cand_val[off] = l;
                        sh.cand_p[off] = __expf(l - m);
                        sh.cand_idx[off] = i;
                        ++off;
                    }
                });
                if (tid == 0) {
                    sh.key_a = 0u;
                    sh.key_b = 0u;
                }
                __syncthreads();
                const bool own = tid < total;
                const float cv = own ? sh.cand_val[tid] : -CUDART_INF_F;
                if ((use_k || use_p) && total <= SAMPLE_BRUTE) {
                    // per candidate: count and mass of the candidates >= it (summed in candidate order)
                    int ge = 0;
                    float mass_ge = 0.0f;
                    for (int j = 0; own && j < total; ++j) {
                        if (sh.cand_val[j] >= cv) {
                            ++ge;
                            mass_ge += sh.cand_p[j];
                        }
                    }
                    uint32_t tk_key = 0u;
                    float z_k = z;
                    if (use_k) {
                        if (own && ge >= k) atomicMax(&sh.key_a, float_key(cv));
                        __syncthreads();
                        tk_key = sh.key_a;
                        if (own && float_key(cv) == tk_key) sh.z_k = mass_ge;  // equal values: equal sums
                        __syncthreads();
                        z_k = sh.z_k;
                        thr = fmaxf(thr, key_float(tk_key));
                    }
                    if (use_p) {
                        const float target_k = p.top_p * z_k;
                        if (own && float_key(cv) >= tk_key && mass_ge >= target_k) atomicMax(&sh.key_b, float_key(cv));
                        __syncthreads();
                        const uint32_t tp_key = sh.key_b != 0u ? sh.key_b : pivot;
                        thr = fmaxf(thr, key_float(tp_key));
                    }
                } else if (use_k || use_p) {
                    // more candidates: the bitwise search, over the candidates (one per thread)
                    const uint32_t ck = float_key(cv);
                    const float cp = own ? sh.cand_p[tid] : 0.0f;
                    thr = search_thresholds(
                        [&](uint32_t key, bool want_mass, int* cnt, float* mass) {
                            const bool in = own && ck >= key;
                            *cnt = __syncthreads_count(in);
                            *mass = want_mass ? block_sum_all(in ? cp : 0.0f, sh.red) : 0.0f;
                        },
                        use_k, use_p, k, p.top_p, z, pivot, thr);
                }
                // the draw over the kept candidates, in candidate order
                const float w = (own && cv >= thr) ? sh.cand_p[tid] : 0.0f;
                float z_kept;
                const float incl = block_scan_incl(w, &z_kept, sh.scan);
                const float target = u * z_kept;
                const int sel = select_thread(w, incl, target, sh);
                if (tid == sel) {
                    out_token[r] = sh.cand_idx[tid];
                    out_logprob[r] = (cv - m) - logf(z_kept);
                    if (stats) reinterpret_cast<float4*>(stats)[r] = make_float4(m, logf(z_kept), thr, inv_t);
                }
                return;
            }
        }
        if (!fast && (use_k || use_p)) {
            // the bitwise search with a full pass over the row per step
            thr = search_thresholds(
                [&](uint32_t key, bool want_mass, int* cnt, float* mass) {
                    row_count_mass(row, n, vec, inv_t, m, key, want_mass, cnt, mass, sh);
                },
                use_k, use_p, k, p.top_p, z, 0u, thr);
        }
    }

    // the draw over the whole row: inverse CDF over the kept mass, thread-major order
    float s = 0.0f;
    for_each_logit(row, n, vec, [&](int, float x) {
        const float l = scaled_logit(x, inv_t);
        if (l >= thr) s += __expf(l - m);
    });
    float z_kept;
    const float incl = block_scan_incl(s, &z_kept, sh.scan);
    const float target = u * z_kept;
    const int sel = select_thread(s, incl, target, sh);
    // then inside thread `sel`'s elements, spread over the block: element q of its walk (group q / V, lane
    // q % V of the group) goes to thread q, an inclusive scan from its prefix, the same selection rule
    if (tid == sel) sh.base = incl - s;
    __syncthreads();
    constexpr int V = 16 / (int)sizeof(T);
    const int64_t idx = ((int64_t)sel + (int64_t)(tid / V) * SAMPLE_THREADS) * V + tid % V;
    float l = -CUDART_INF_F, w = 0.0f;
    if (idx < n) {
        l = scaled_logit(load_f(row + idx), inv_t);
        if (l >= thr) w = __expf(l - m);
    }
    float chunk;
    const float incl_q = sh.base + block_scan_incl(w, &chunk, sh.scan);
    const int q = select_thread(w, incl_q, target, sh);
    if (tid == q) {
        out_token[r] = (int32_t)idx;
        out_logprob[r] = (l - m) - logf(z_kept);
        if (stats) reinterpret_cast<float4*>(stats)[r] = make_float4(m, logf(z_kept), thr, inv_t);
    }
}

// grid (rows,1,1), block (1024,1,1). logits [rows, vocab] (penalized in place), params [rows, 12] words
// (SampleParams), positions [rows], hist_tokens / hist_counts [rows, hist_cap] (may be null when no row
// penalizes), out_token [rows] int32, out_logprob [rows] f32, stats [rows, 4] f32 or null.
#define SAMPLE_ENTRY(NAME, T)                                                                                      \
    extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, 1)                                                \
        NAME(T* logits, const uint32_t* params, const int32_t* positions, const int32_t* hist_tokens,           \
             const int32_t* hist_counts, int32_t hist_cap, int32_t vocab, int32_t* out_token, float* out_logprob, \
             float* stats) {                                                                                      \
        kern_pdl_wait();                                                                                          \
        kern_pdl_launch_dependents();                                                                             \
        sample_row<T>(logits, params, positions, hist_tokens, hist_counts, hist_cap, vocab, out_token,           \
                      out_logprob, stats);                                                                        \
    }
SAMPLE_ENTRY(kern_sample_bf16, __nv_bfloat16)
SAMPLE_ENTRY(kern_sample_f32, float)

// ------------------------------------------------------------------------------------ top logprobs

template <typename T>
KERN_DEV void top_logprobs_row(const T* logits, const float* stats, int32_t vocab, int32_t n_top, int32_t* out_ids,
                               float* out_logprobs) {
    __shared__ SampleShared sh;
    const int r = blockIdx.x, n = vocab;
    if (n <= 0 || n_top <= 0 || blockDim.x != SAMPLE_THREADS) return;
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
        block_argmax_all(bv, bi, sh);
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
    extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, 1)                                              \
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
