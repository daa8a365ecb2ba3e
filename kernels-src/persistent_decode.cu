// Persistent decode kernel, first version (docs/persistent.md): one cooperative launch per decode step (bs = 1);
// block b interprets queue b of the instruction table (kern_run/models/qwen3/persistent/isa.py is the layout), in
// order: issue a projection's first weight steps into the block's shared-memory ring (ring_prologue), wait
// (bounded, %globaltimer) until counters[wait] >= target, execute, then (block barrier; thread 0's GPU-scope fence
// only with the table's kFlagFences) add 1 to counters[signal]. While a block waits, warp 1 prefetches the tile's next 128 KiB into L2 (prefetch_tile,
// a table flag); while it runs, each warp keeps its ring's other steps in flight (ring_stream).
//
// Rounding follows the existing decode kernels (gemv.cu, rope.cu, attention_decode.cu; transformers' bf16 Qwen3):
//   RMSNorm x = bf16(w * bf16(r * rsqrt(mean(r^2) + eps)));  projections fp32 dot, bf16 result;
//   residual = bf16(residual + bf16(dot));  act = bf16(bf16(silu(bf16(gate))) * bf16(up)), silu g / (1 + e^-g);
//   q/k head RMSNorm + neox RoPE as kern_qk_norm_rope_kv; attention fp32 online softmax, bf16 output;
//   argmax over the bf16 logits, ties to the smallest index.
// Summation orders differ from those kernels (per-warp rows here), so results agree to rounding, not bit for bit.
//
// Faults (error word, u32[8], host-mapped; word 0 the code, first writer wins):
//   1 TIMEOUT     a wait passed timeout_ns: [1] instruction, [2] counter, [3] value seen, [4] target, [5] block
//   2 BAD_TABLE   the header, a queue entry or an instruction is out of range: [1] block, [2] word or instruction
//   3 BAD_LAUNCH  gridDim.x != the table's queue count, blockDim.x != PD_THREADS, or too little dynamic shared
//                 memory: [1] gridDim.x, [2] blockDim.x, [3] dynamic shared bytes
//   4 BAD_SHAPE   the model geometry does not fit this kernel (head_dim, group, layers): [1] which check
//   5 BAD_SLOT    ATTN: slot_mapping[0] is not the block table's slot of token seq_lens[0] - 1 (the caller contract;
//                 the splits would race on that row): [1] slot_mapping[0], [2] the block table's slot, [3] seq_len
// After a fault every block stops at its next wait (it sees the word, or its own wait times out): the launch
// ends in bounded time and the runtime raises DeviceFaultError when the step's outputs are read.
#include "common.cuh"
#include "persistent_sync.cuh"  // global_ns, load_acquire, red_release_add, PD_DYNAMIC_SMEM (tools/cpu_emu_persist
                                // has a CPU stand-in)

namespace {

using bf16 = __nv_bfloat16;

constexpr int PD_THREADS = 256;
constexpr int PD_WARPS = PD_THREADS / 32;
constexpr int kMaxLayers = 64;
constexpr int kMaxHeadDim = 256;  // 8 elements per lane at most
constexpr int kMaxGroup = 8;      // q heads per kv head
constexpr uint32_t kMagic = 0x5453504Bu, kVersion = 2u, kInstrWords = 8u, kHeaderWords = 16u;
constexpr uint32_t kNoCounter = 0xFFFFFFFFu;

enum Code : uint32_t { kTimeout = 1, kBadTable = 2, kBadLaunch = 3, kBadShape = 4, kBadSlot = 5 };
enum Opcode : uint32_t {
    kQkv = 1, kRope = 2, kAttnPartial = 3, kAttnReduce = 4, kOProj = 5, kGateUp = 6, kDown = 7, kLmHead = 8, kArgmax = 9,
    kNop = 10, kAttn = 11
};
// header word 10: flags
constexpr uint32_t kFlagL2Prefetch = 1u;  // prefetch_tile while waiting
// thread 0 fences (fence.sc.gpu) after its acquire and before its release, as cooperative groups' grid sync; without
// it the acquire load and the release add alone order the block's accesses (with the block barriers), as CUTLASS's
// generic barrier does
constexpr uint32_t kFlagFences = 2u;
// the weight ring's copies carry an L2 evict-first policy (l2_policy): weights are read once a step, so the lines read
// again (code, table, counters, activations, K / V) are not pushed out of L2 by them
constexpr uint32_t kFlagEvictFirst = 4u;
// thread 0 asks L1 for the next queue entry's instruction words before it waits on this one's counter
constexpr uint32_t kFlagTableAhead = 8u;
constexpr uint32_t kKnownFlags = kFlagL2Prefetch | kFlagFences | kFlagEvictFirst | kFlagTableAhead;

}  // namespace

// Per layer pointers (16 slots of 8 bytes; unused slots zero). The manifest packs kMaxLayers of them into one
// 8192-byte parameter (a `pack` of pointer fields).
struct PersistLayer {
    const bf16* w_qkv;      // [qkv_dim, H]
    const bf16* w_o;        // [H, q_dim]
    const bf16* w_gate_up;  // [2 I, H]: gate rows then up rows
    const bf16* w_down;     // [H, I]
    const bf16* ln_in;      // [H]
    const bf16* ln_post;    // [H]
    const bf16* q_norm;     // [D]
    const bf16* k_norm;     // [D]
    bf16* kv;               // pages of [2][page_tokens][Hkv][D]
    const void* unused[7];
};
struct PersistLayers {
    PersistLayer layer[kMaxLayers];
};
static_assert(sizeof(PersistLayers) == 8192, "the manifest's pack is 8192 bytes");

// The model geometry (48 bytes; a `pack` of literal fields in the manifest). num_pages is a parameter of its own:
// the page bound of the KV states' reserved range is known only at load ({"pages_of": state}).
struct PersistShape {
    int32_t hidden, q_heads, kv_heads, head_dim, inter, vocab, layers, page_tokens, max_pos, splits;
    float eps, scale;  // RMSNorm epsilon, attention scale (1 / sqrt(head_dim))
};
static_assert(sizeof(PersistShape) == 48, "the manifest's pack is 48 bytes");

namespace {

struct PageBound {
    int32_t num_pages;  // page ids 0 .. num_pages - 1 exist in every KV state's reserved range
};

// First fault wins; the detail words go with it. Host-mapped memory: system-scope fence before returning.
KERN_DEV void raise_fault(uint32_t* err, uint32_t code, uint32_t a, uint32_t b, uint32_t c, uint32_t d, uint32_t e) {
    if (atomicCAS(err, 0u, code) == 0u) {
        err[1] = a;
        err[2] = b;
        err[3] = c;
        err[4] = d;
        err[5] = e;
    }
    __threadfence_system();
}

KERN_DEV float ld_act(const bf16* p) { return bf2f(__ldcg(p)); }  // written by other blocks of this grid: L2

// 8 bf16 (one 16-byte word, element 0 in the low half of .x) -> 8 floats, exactly (a bf16 is a float's top half).
KERN_DEV void unpack_bf16x8(const uint4& raw, float (&v)[8]) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
}

// Dynamic shared memory of the block: x (the input vector, f32[max(H, I, q_dim)]), scratch, then the weight ring.
struct Smem {
    float* x;
    float* red;  // 64 floats: block reductions and broadcasts
    float* head;  // f32[kMaxGroup + 1][kMaxHeadDim]: ROPE's normed heads, the attention's q / accumulators
    uint4* ring;  // PD_WARPS x stages x kStagePieces x 32 16-byte pieces (the projection path's weight ring)
};

// x[c] (8 floats) = the 8 bf16 of src[c] for every 16-byte chunk c < k8 of this thread (c = threadIdx.x + 256 i),
// loaded kStageBatch chunks at a time before any is stored: a few L2 round trips, not one per chunk. Returns this
// thread's sum of squares of what it stored, chunk by chunk in order, 8 fmaf each (when `squares`).
constexpr int kStageBatch = 4;

KERN_DEV float stage_chunks(float* x, const uint4* src, int k8, bool squares) {
    float sum_sq = 0.0f;
    for (int c0 = threadIdx.x; c0 < k8; c0 += kStageBatch * PD_THREADS) {
        uint4 raw[kStageBatch];
#pragma unroll
        for (int u = 0; u < kStageBatch; ++u) {
            const int c = c0 + u * PD_THREADS;
            raw[u] = c < k8 ? __ldcg(src + c) : uint4{0u, 0u, 0u, 0u};
        }
#pragma unroll
        for (int u = 0; u < kStageBatch; ++u) {
            const int c = c0 + u * PD_THREADS;
            if (c >= k8) break;
            float v[8];
            unpack_bf16x8(raw[u], v);
            if (squares) {
#pragma unroll
                for (int i = 0; i < 8; ++i) sum_sq = fmaf(v[i], v[i], sum_sq);
            }
            *reinterpret_cast<float4*>(x + 8 * c) = float4{v[0], v[1], v[2], v[3]};
            *reinterpret_cast<float4*>(x + 8 * c + 4) = float4{v[4], v[5], v[6], v[7]};
        }
    }
    return sum_sq;
}

// x[j] = bf16(w[j] * bf16(r[j] * inv_rms)) for j < k (the RMSNorm prologue of kern_gemv_rmsnorm). 16-byte loads of
// 8 elements a thread where k % 8 == 0 and both rows are aligned, else one element a thread per step.
KERN_DEV void stage_rmsnorm(float* x, const bf16* residual, const bf16* w, int k, float eps, float* red) {
    float sum_sq = 0.0f;
    const bool vec = (k & 7) == 0 && aligned16(residual) && aligned16(w);
    if (vec) {
        sum_sq = stage_chunks(x, reinterpret_cast<const uint4*>(residual), k / 8, true);
    } else {
        for (int j = threadIdx.x; j < k; j += blockDim.x) {
            const float r = ld_act(residual + j);
            x[j] = r;
            sum_sq = fmaf(r, r, sum_sq);
        }
    }
    const float inv_rms = rsqrtf(block_sum(sum_sq, red) / static_cast<float>(k) + eps);
    if (vec) {
        for (int c = threadIdx.x; c < k / 8; c += blockDim.x) {
            float g[8];
            unpack_bf16x8(*(reinterpret_cast<const uint4*>(w) + c), g);
            float4* p = reinterpret_cast<float4*>(x + 8 * c);
            const float4 a = p[0], b = p[1];
            p[0] = float4{round_bf(g[0] * round_bf(a.x * inv_rms)), round_bf(g[1] * round_bf(a.y * inv_rms)),
                          round_bf(g[2] * round_bf(a.z * inv_rms)), round_bf(g[3] * round_bf(a.w * inv_rms))};
            p[1] = float4{round_bf(g[4] * round_bf(b.x * inv_rms)), round_bf(g[5] * round_bf(b.y * inv_rms)),
                          round_bf(g[6] * round_bf(b.z * inv_rms)), round_bf(g[7] * round_bf(b.w * inv_rms))};
        }
    } else {
        for (int j = threadIdx.x; j < k; j += blockDim.x) x[j] = round_bf(bf2f(w[j]) * round_bf(x[j] * inv_rms));
    }
    __syncthreads();
}

// x[j] = src[j] for j < k (f32 of bf16), 16-byte loads where k % 8 == 0 and src is aligned.
KERN_DEV void stage_copy(float* x, const bf16* src, int k) {
    if ((k & 7) == 0 && aligned16(src)) {
        stage_chunks(x, reinterpret_cast<const uint4*>(src), k / 8, false);
    } else {
        for (int j = threadIdx.x; j < k; j += blockDim.x) x[j] = ld_act(src + j);
    }
    __syncthreads();
}

// The GEMV-row path (QKV, O_PROJ, GATE_UP, DOWN, LM_HEAD; M = 1). A warp streams its rows in BATCHES of
// kBatchRows = 2 rows (GATE_UP: one output's gate and up rows); a batch is nb = ceil(ceil(k8 / 32) / kStepChunks)
// STEPS (k8 = k / 8 16-byte chunks a row), step j holding, for each row of the batch, lane l's chunks
// l + 32 (kStepChunks j + s), s < kStepChunks: kStagePieces = 4 16-byte pieces a lane, 2 KiB a warp.
//
// Steps stream through a per-warp ring of `stages` (2 .. kRingMaxStages) steps in shared memory, by cp.async: lane
// l copies and later reads only its own pieces, so the ring needs no barrier, not even __syncwarp. Step p goes to
// slot p % stages; before step i is multiplied, step i + stages - 1 is issued into the slot step i - 1 left, so
// stages - 1 steps stay in flight (8 warps x 7 x 2 KiB = 112 KiB a block at 8 stages: what bench/stream_probe.py
// measured at the full HBM rate, docs/perf.md). The first stages - 1 steps of an instruction (its PROLOGUE) are
// issued before the block waits on its counter: weights depend on no other instruction, so they stream while the
// block waits, and the multiply starts on bytes already in shared memory.
//
// Per row every lane accumulates its chunks in increasing order, 8 fmaf each in element order, then warp_sum (the
// order of warp_row_dot), so the results are the register path's bit for bit. A chunk past the row is skipped (not
// multiplied by zero: -0 and inf stay as they were); a missing row of a batch is zero-filled and its dot unused.
// Rows that are not 16-byte aligned, or k % 8 != 0, take warp_row_dot's scalar loop (no ring).
constexpr int kBatchRows = 2;   // rows per batch (GATE_UP: one output, its gate and up rows)
constexpr int kStepChunks = 2;  // 16-byte chunks per lane per row per step
constexpr int kStagePieces = kBatchRows * kStepChunks;                 // 16-byte pieces per lane per step
constexpr uint32_t kRingStepBytes = PD_THREADS * kStagePieces * 16u;  // one step of every warp: 16 KiB
constexpr int kRingMaxStages = 8;  // cp_async_wait_pending covers 0 .. 7 pending groups (manifest.MAX_RING_STAGES)

// One row of W (k bf16) . x (f32 in shared memory), by one warp; every lane gets the sum (the path of rows that are
// not 16-byte aligned or k % 8 != 0, and the order every path follows).
KERN_DEV float warp_row_dot(const bf16* row, const float* x, int k) {
    const int lane = threadIdx.x & 31;
    float acc = 0.0f;
    if ((k & 7) == 0 && aligned16(row)) {
        for (int c = lane; c < k / 8; c += 32) {
            float w[8];
            load8_vec(row + 8 * c, w);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc = fmaf(w[i], x[8 * c + i], acc);
        }
    } else {
        for (int j = lane; j < k; j += 32) acc = fmaf(bf2f(row[j]), x[j], acc);
    }
    return warp_sum(acc);
}

// The rows of one warp for one instruction: batch b's rows are base(b) and base(b) + second, count(b) of them.
struct WarpRows {
    const bf16* row0;     // row 0 of batch 0
    size_t batch_stride;  // elements from batch b's row 0 to batch b + 1's
    size_t second;        // elements from a batch's row 0 to its row 1
    int rows;             // the warp's rows in all (GATE_UP: 2 per output)
    int k;                // elements per row
    bool vec;             // k % 8 == 0 and the rows 16-byte aligned: the ring; else warp_row_dot
    bool evict_first = false;  // the ring's copies evict-first in L2 (the table's kFlagEvictFirst)
    static_assert(kBatchRows == 2, "a batch is a row and its `second`");
    KERN_DEV int batches() const { return (rows + kBatchRows - 1) / kBatchRows; }
    KERN_DEV const bf16* base(int b) const { return row0 + static_cast<size_t>(b) * batch_stride; }
    KERN_DEV size_t offset(int r) const { return r == 0 ? 0 : second; }
    KERN_DEV int count(int b) const { return min(kBatchRows, rows - kBatchRows * b); }
    KERN_DEV int steps_per_batch() const { return ((k >> 3) + 32 * kStepChunks - 1) / (32 * kStepChunks); }
};

// O_PROJ and DOWN (few rows, long k: 4B 2,560 rows of 8 and 19 KiB) split each row across the block's warps when
// the instruction asks for it (bit 0 of `arg`: kArgRowSplit, the builder's choice per phase, schedule.py) and it
// fits: k a multiple of 8 PD_WARPS and the tile's partial sums within the head scratch. Warp w then takes elements
// [w k / 8, (w + 1) k / 8) of every row, so a tile balances to the row, not to 8 rows (schedule.py tiles them by 1
// row then). Uniform across the block.
constexpr int kSplitMaxRows = (kMaxGroup + 1) * kMaxHeadDim / PD_WARPS;
constexpr uint32_t kArgRowSplit = 1u;

KERN_DEV bool ksplit(uint32_t op, int k, uint32_t count, uint32_t arg) {
    return (op == kOProj || op == kDown) && (arg & kArgRowSplit) && k % (8 * PD_WARPS) == 0 &&
           count <= static_cast<uint32_t>(kSplitMaxRows);
}

// A projection class's weight matrix (row-major, k bf16 a row; GATE_UP: the I gate rows, then the I up rows) and k;
// w nullptr for any other opcode. The one place warp_rows and prefetch_tile learn where an instruction's rows are.
struct ProjWeights {
    const bf16* w;
    int k;
};

KERN_DEV ProjWeights projection_weights(uint32_t op, const PersistLayer& L, const bf16* lm_head, const PersistShape& s) {
    switch (op) {
        case kQkv: return {L.w_qkv, s.hidden};
        case kOProj: return {L.w_o, s.q_heads * s.head_dim};
        case kGateUp: return {L.w_gate_up, s.hidden};
        case kDown: return {L.w_down, s.inter};
        case kLmHead: return {lm_head, s.hidden};
        default: return {nullptr, s.hidden};
    }
}

// The warp's rows of a projection instruction (op, layer L, rows first .. first + count, arg: ksplit's bit): plain rows
// first + warp + PD_WARPS i (batch b: i = 2 b, 2 b + 1); GATE_UP output j = first + warp + PD_WARPS i is batch i,
// gate row j then up row I + j. rows 0 for any other opcode.
KERN_DEV WarpRows warp_rows(uint32_t op, const PersistLayer& L, const bf16* lm_head, uint32_t first, uint32_t count,
                            uint32_t arg, const PersistShape& s) {
    const int warp = threadIdx.x >> 5, I = s.inter;
    const ProjWeights pw = projection_weights(op, L, lm_head, s);
    const bf16* const w = pw.w;
    const int k = pw.k;
    if (w == nullptr) return WarpRows{nullptr, 0, 0, 0, k, false};
    const int n = static_cast<int>(count);
    if (ksplit(op, k, count, arg)) {  // every row of the tile, this warp's k / 8 slice of each
        const int kw = k / PD_WARPS;
        const bf16* row0 = w + static_cast<size_t>(first) * k + static_cast<size_t>(warp) * kw;
        return WarpRows{row0, 2 * static_cast<size_t>(k), static_cast<size_t>(k), n, kw, aligned16(w)};
    }
    const int mine = n > warp ? (n - warp + PD_WARPS - 1) / PD_WARPS : 0;  // rows (GATE_UP: outputs) of this warp
    const size_t stride = static_cast<size_t>(PD_WARPS) * k;
    const bf16* row0 = w + (static_cast<size_t>(first) + warp) * k;
    const bool vec = (k & 7) == 0 && aligned16(w);
    if (op == kGateUp) return WarpRows{row0, stride, static_cast<size_t>(I) * k, 2 * mine, k, vec};
    return WarpRows{row0, 2 * stride, stride, mine, k, vec};
}

// Issue step p of `rows` into its ring slot (p % stages); the caller commits it as one cp.async group.
KERN_DEV void ring_issue(const WarpRows& rows, uint4* ring, int stages, int p) {
    const int lane = threadIdx.x & 31, k8 = rows.k >> 3, nb = rows.steps_per_batch();
    const int b = p / nb, j = p - b * nb;
    const bf16* base = rows.base(b);
    const int nr = rows.count(b);
    uint4* slot = ring + static_cast<size_t>(p % stages) * kStagePieces * 32 + lane;
    const uint64_t policy = l2_policy(rows.evict_first);
#pragma unroll
    for (int r = 0; r < kBatchRows; ++r) {
#pragma unroll
        for (int s = 0; s < kStepChunks; ++s) {
            const int c = lane + 32 * (kStepChunks * j + s);
            const bool ok = r < nr && c < k8;
            cp_async16_policy(slot + (r * kStepChunks + s) * 32, ok ? base + rows.offset(r) + 8 * c : base,
                              ok ? 16 : 0, policy);
        }
    }
}

// The prologue: steps 0 .. stages - 2 issued, one group each (empty past the last step): the groups
// ring_stream's accounting expects.
KERN_DEV void ring_prologue(const WarpRows& rows, uint4* ring, int stages) {
    const int n_steps = rows.vec ? rows.batches() * rows.steps_per_batch() : 0;
    for (int p = 0; p < stages - 1; ++p) {
        if (p < n_steps) ring_issue(rows, ring, stages, p);
        cp_async_commit();
    }
}

// The warp's rows against x (f32[k], shared memory), the prologue already issued: `done(b, dot)` is called by every
// lane of the warp with dot[r] = row r of batch b . x (every lane the same value; a missing row's value is
// unspecified), batches in order. Leaves no copy in flight that writes the ring.
template <class Done>
KERN_DEV void ring_stream(const WarpRows& rows, const float* x, uint4* ring, int stages, Done done) {
    constexpr int R = kBatchRows, S = kStepChunks;
    const int batches = rows.batches();
    if (!rows.vec) {
#pragma unroll 1
        for (int b = 0; b < batches; ++b) {
            const int nr = rows.count(b);
            float dot[R];
#pragma unroll
            for (int r = 0; r < R; ++r) dot[r] = r < nr ? warp_row_dot(rows.base(b) + rows.offset(r), x, rows.k) : 0.0f;
            done(b, dot);
        }
        return;  // no copy in flight: the caller issues a prologue for vec rows only
    }
    const int lane = threadIdx.x & 31, k8 = rows.k >> 3, nb = rows.steps_per_batch();
    const int n_steps = batches * nb;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    int slot = 0, j = 0, b = 0;  // slot of step i, its step in the batch, its batch
#pragma unroll 1
    for (int i = 0; i < n_steps; ++i) {
        if (i + stages - 1 < n_steps) ring_issue(rows, ring, stages, i + stages - 1);  // into the slot i - 1 left
        cp_async_commit();
        cp_async_wait_pending(stages - 1);  // step i is in shared memory (this lane's pieces: all it reads)
        const uint4* piece = ring + static_cast<size_t>(slot) * kStagePieces * 32 + lane;
#pragma unroll
        for (int s = 0; s < S; ++s) {
            const int c = lane + 32 * (S * j + s);
            if (c < k8) {
                const float4 x0 = *reinterpret_cast<const float4*>(x + 8 * c);
                const float4 x1 = *reinterpret_cast<const float4*>(x + 8 * c + 4);
                const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float w[8];
                    unpack_bf16x8(piece[(r * S + s) * 32], w);
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[r] = fmaf(w[e], xv[e], acc[r]);
                }
            }
        }
        if (++slot == stages) slot = 0;
        if (++j == nb) {
            float dot[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                dot[r] = warp_sum(acc[r]);
                acc[r] = 0.0f;
            }
            done(b, dot);
            j = 0;
            ++b;
        }
    }
    cp_async_wait_pending(0);  // the trailing (empty) groups: nothing in flight into the ring past this instruction
}

// ring_stream over a residual-adding projection's rows (O_PROJ, DOWN): residual[row] = bf16(residual[row] +
// bf16(dot)). Lane i < 32 loads row i's residual before the stream starts (its latency under the weights' instead
// of a round trip in each batch's epilogue); a warp's rows past 32 are read in their epilogue.
KERN_DEV void stream_residual(const WarpRows& rows, uint32_t first, const float* x, uint4* ring, int stages,
                              bf16* residual) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row_l = static_cast<int>(first) + warp + PD_WARPS * lane;
    const float old_l = lane < rows.rows ? ld_act(residual + row_l) : 0.0f;
    ring_stream(rows, x, ring, stages, [&](int b, const float (&dot)[kBatchRows]) {
#pragma unroll
        for (int r = 0; r < kBatchRows; ++r) {
            const int i = b * kBatchRows + r;  // uniform across the warp
            const int row = static_cast<int>(first) + warp + PD_WARPS * i;
            const float old = i < 32 ? __shfl_sync(0xffffffffu, old_l, i & 31) : (i < rows.rows ? ld_act(residual + row) : 0.0f);
            if (lane == 0 && i < rows.rows) residual[row] = f2bf(old + round_bf(dot[r]));
        }
    });
}

// ring_stream over a k-split tile (ksplit: rows first .. first + count, this warp's slice of each, x its slice):
// each warp's partial dot of row i goes to part[i][warp] (shared memory), then thread i sums row i's 8 partials in
// warp order and adds it to the residual: residual[row] = bf16(residual[row] + bf16(sum)).
KERN_DEV void stream_residual_ksplit(const WarpRows& rows, uint32_t first, const float* x, uint4* ring, int stages,
                                     bf16* residual, float* part) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    ring_stream(rows, x, ring, stages, [&](int b, const float (&dot)[kBatchRows]) {
#pragma unroll
        for (int r = 0; r < kBatchRows; ++r) {
            const int i = b * kBatchRows + r;
            if (lane == 0 && i < rows.rows) part[i * PD_WARPS + warp] = dot[r];
        }
    });
    __syncthreads();
    for (int i = threadIdx.x; i < rows.rows; i += PD_THREADS) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < PD_WARPS; ++w) sum += part[i * PD_WARPS + w];
        const int row = static_cast<int>(first) + i;
        residual[row] = f2bf(ld_act(residual + row) + round_bf(sum));
    }
}

// ring_stream over a plain projection's rows (batch b: rows first + warp + PD_WARPS (2 b + r), r < 2):
// `out(row, dot)` by lane 0 of the warp, the warp's rows in increasing order.
template <typename Out>
KERN_DEV void stream_plain(const WarpRows& rows, uint32_t first, const float* x, uint4* ring, int stages, Out out) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    ring_stream(rows, x, ring, stages, [&](int b, const float (&dot)[kBatchRows]) {
#pragma unroll
        for (int r = 0; r < kBatchRows; ++r) {
            const int i = b * kBatchRows + r;
            if (lane == 0 && i < rows.rows) out(static_cast<int>(first) + warp + PD_WARPS * i, dot[r]);
        }
    });
}


// q/k RMSNorm + RoPE of kv head g's q heads and its k head, K/V written to the slot (kern_qk_norm_rope_kv's
// formulas). One warp per head; lane l owns elements l + 32 i (i < kHeadSlots) of the head. Every global value a
// lane needs (its head elements, norm weights, cos / sin, the V elements) is loaded before any is used: one L2 round
// trip for all of them instead of one per element (the position first: the rope row depends on it).
// q_smem == nullptr (ROPE): the q heads to q_out (global, bf16). Else (ATTN): to q_smem[h D + d] (shared memory,
// f32 of the same bf16 values), q_out unused. with_k false: the k head is skipped (no K/V write).
constexpr int kHeadSlots = kMaxHeadDim / 32;

KERN_DEV void rope_group(int g, const PersistShape& s, PageBound pages, const PersistLayer& L,
                         const bf16* qkv, const float* rope, const int32_t* positions, const int32_t* slot_mapping,
                         bf16* q_out, float* head, float* q_smem = nullptr, bool with_k = true) {
    const int D = s.head_dim, group = s.q_heads / s.kv_heads, half = D / 2;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int pos = __ldcg(positions);
    const int64_t slot = __ldcg(slot_mapping);
    const bool pos_ok = pos >= 0 && pos < s.max_pos;
    const bool slot_ok = slot >= 0 && slot < static_cast<int64_t>(pages.num_pages) * s.page_tokens;
    const float* rope_row = rope + static_cast<int64_t>(pos_ok ? pos : 0) * D;
    const int heads = with_k ? group + 1 : group;
    for (int h = warp; h < heads; h += PD_WARPS) {  // h < group: q heads of the group; h == group: the k head
        const bool is_q = h < group;
        const int qh = g * group + h;
        const bf16* src = qkv + (is_q ? static_cast<int64_t>(qh) * D : static_cast<int64_t>(s.q_heads + g) * D);
        const bf16* v_src = qkv + static_cast<int64_t>(s.q_heads + s.kv_heads + g) * D;
        const bf16* w = is_q ? L.q_norm : L.k_norm;
        float* nh = head + h * kMaxHeadDim;
        float xv[kHeadSlots], wv[kHeadSlots], cs[kHeadSlots], sn[kHeadSlots], vv[kHeadSlots];
#pragma unroll
        for (int i = 0; i < kHeadSlots; ++i) {
            const int d = lane + 32 * i;
            const bool ok = d < D;
            const int f = d < half ? d : d - half;
            xv[i] = ok ? ld_act(src + d) : 0.0f;
            wv[i] = ok ? bf2f(w[d]) : 0.0f;
            cs[i] = ok ? rope_row[f] : 0.0f;
            sn[i] = ok ? rope_row[half + f] : 0.0f;
            vv[i] = ok && !is_q ? ld_act(v_src + d) : 0.0f;
        }
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < kHeadSlots; ++i) sum += __fmul_rn(xv[i], xv[i]);  // element order, as before (0 past D)
        const float rs = rsqrtf(warp_sum(sum) / static_cast<float>(D) + s.eps);
#pragma unroll
        for (int i = 0; i < kHeadSlots; ++i) {
            const int d = lane + 32 * i;
            if (d < D) nh[d] = round_bf(wv[i] * round_bf(xv[i] * rs));
        }
        __syncwarp();
        if (!pos_ok && is_q && q_smem != nullptr) {  // ATTN: zeros, not whatever the scratch held (every split alike)
            for (int d = lane; d < D; d += 32) q_smem[h * D + d] = 0.0f;
            continue;
        }
        if (!pos_ok || (!is_q && !slot_ok)) continue;  // as kern_qk_norm_rope_kv: nothing written
        const int64_t page = slot / s.page_tokens, off = slot % s.page_tokens;
        const int64_t token_elems = static_cast<int64_t>(s.kv_heads) * D;
        bf16* k_dst = L.kv + ((page * 2 + 0) * s.page_tokens + off) * token_elems + static_cast<int64_t>(g) * D;
        bf16* v_dst = L.kv + ((page * 2 + 1) * s.page_tokens + off) * token_elems + static_cast<int64_t>(g) * D;
#pragma unroll
        for (int i = 0; i < kHeadSlots; ++i) {
            const int d = lane + 32 * i;
            if (d >= D) continue;
            const float rot = d < half ? -nh[d + half] : nh[d - half];
            const bf16 y = f2bf(round_bf(nh[d] * cs[i]) + round_bf(rot * sn[i]));
            if (is_q) {
                if (q_smem != nullptr)
                    q_smem[h * D + d] = bf2f(y);
                else
                    q_out[static_cast<int64_t>(qh) * D + d] = y;
            } else {
                k_dst[d] = y;
                v_dst[d] = f2bf(vv[i]);
            }
        }
        __syncwarp();  // nh is rewritten by this warp's next head
    }
}

// Partial softmax of kv head g's q heads over context split `split` of `splits`: tokens [split L, min(n, ...)),
// L = cdiv(n, splits). parts[((g * splits + split) * group + h) * (D + 2)]: acc[D], m, l (natural log units); an
// empty split (or one whose pages are all absent) writes acc 0, m -inf, l 0.
//
// Every K and V row is loaded once for all `group` q heads of the kv head (G >= group accumulators per lane, G a
// compile-time bound so the register arrays stay compile-time indexed). A token is handled by T lanes: kVec (head_dim
// a multiple of 8 with D / 8 dividing 32, 16-byte aligned rows): T = D / 8 lanes, 8 consecutive elements each, one
// 16-byte load per lane for K and one for V, P = 32 / T tokens per warp at once (D 128: 2, D 64: 4); otherwise
// T = 32 lanes, elements lane + 32 i, scalar loads, P = 1. A warp takes U token steps per iteration: the U block
// table entries are loaded together, then the U tokens' K and V rows together (2 U loads per lane in flight), then
// the dot products (reduced over the token's T lanes), then one online-softmax update per head for the U tokens.
// Token of (iteration it, step u, warp w, slot p): begin + ((it U + u) PD_WARPS + w) P + p. Each lane group keeps
// its own (m, l, acc) per head; they are merged across the warp's P slots by shuffles, then across the 8 warps in
// shared memory (sm.x when it holds R >= 1 heads of PD_WARPS x D floats, else sm.head), R heads per round.
//
// q_smem != nullptr (ATTN): the q heads come from shared memory (q_smem[h D + d], rope_group's), not from q; they
// are read into registers and the block barriers before x_buf (which may be the same memory) is reused.
template <int G, bool kVec>
KERN_DEV void attn_partial_impl(int g, int split, const PersistShape& s, PageBound pages, const PersistLayer& L,
                                const bf16* q, const int32_t* block_table, const int32_t* seq_lens, float* parts,
                                float* x_buf, int x_elems, float* head, const float* q_smem) {
    constexpr int U = G <= 4 ? 4 : 2;  // token steps in flight per warp
    const int D = s.head_dim, group = s.q_heads / s.kv_heads, splits = s.splits;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int T = kVec ? D / 8 : 32, P = 32 / T;
    const int sub = lane % T, slot = lane / T;
    const int n = max(__ldcg(seq_lens), 0);
    const int len = (n + splits - 1) / splits;
    const int begin = split * len, end = min(n, begin + len);
    const int64_t token_elems = static_cast<int64_t>(s.kv_heads) * D;
    // element i of this lane's slice of a row (valid: inside the row)
    auto elem = [&](int i) { return kVec ? 8 * sub + i : lane + 32 * i; };
    auto valid = [&](int i) { return kVec || lane + 32 * i < D; };
    float qv[G][8], acc[G][8], m[G], l[G];
#pragma unroll
    for (int h = 0; h < G; ++h) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
        const bf16* qh = q + static_cast<int64_t>(g * group + (h < group ? h : 0)) * D;
        if (q_smem != nullptr) {
            const float* qs = q_smem + (h < group ? h : 0) * D;
#pragma unroll
            for (int i = 0; i < 8; ++i) qv[h][i] = valid(i) ? qs[elem(i)] : 0.0f;
        } else if (kVec) {
            const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(qh + 8 * sub));
            unpack_bf16x8(raw, qv[h]);
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) qv[h][i] = valid(i) ? ld_act(qh + elem(i)) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[h][i] = 0.0f;
    }
    if (q_smem != nullptr) __syncthreads();  // every warp holds its q before x_buf is written (uniform)
    const int span = max(end - begin, 0);
    const int steps = (span + PD_WARPS * P - 1) / (PD_WARPS * P);  // token steps of the block
    const int iters = (steps + U - 1) / U;                          // block-uniform: every warp runs them all
    for (int it = 0; it < iters; ++it) {
        int page[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int t = begin + ((it * U + u) * PD_WARPS + warp) * P + slot;
            page[u] = t < end ? __ldcg(block_table + t / s.page_tokens) : -1;
        }
        float kf[U][8], vf[U][8];
        bool present[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int t = begin + ((it * U + u) * PD_WARPS + warp) * P + slot;
            present[u] = page[u] >= 0 && page[u] < pages.num_pages;  // else absent (reference: kv_present)
            const int off = t % s.page_tokens;
            const int64_t row = (static_cast<int64_t>(present[u] ? page[u] : 0) * 2 * s.page_tokens + off) * token_elems
                              + static_cast<int64_t>(g) * D;
            const bf16* k = L.kv + row;
            const bf16* v = k + static_cast<int64_t>(s.page_tokens) * token_elems;  // the page's V half
            if (kVec) {
                uint4 kr{0u, 0u, 0u, 0u}, vr{0u, 0u, 0u, 0u};
                if (present[u]) {
                    kr = __ldcg(reinterpret_cast<const uint4*>(k + 8 * sub));
                    vr = __ldcg(reinterpret_cast<const uint4*>(v + 8 * sub));
                }
                unpack_bf16x8(kr, kf[u]);
                unpack_bf16x8(vr, vf[u]);
            } else {
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const bool ok = present[u] && valid(i);
                    kf[u][i] = ok ? ld_act(k + elem(i)) : 0.0f;
                    vf[u][i] = ok ? ld_act(v + elem(i)) : 0.0f;
                }
            }
        }
#pragma unroll
        for (int h = 0; h < G; ++h) {
            if (h >= group) break;  // uniform
            float sc[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                float dot = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; ++i) dot = fmaf(qv[h][i], kf[u][i], dot);
                for (int o = T / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);  // the token's lanes
                sc[u] = present[u] ? dot * s.scale : -INFINITY;
            }
            float m_new = m[h];
#pragma unroll
            for (int u = 0; u < U; ++u) m_new = fmaxf(m_new, sc[u]);
            if (m_new == -INFINITY) continue;  // nothing present yet in this lane group
            const float alpha = expf(m[h] - m_new);  // 0 while m is -inf
            l[h] *= alpha;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[h][i] *= alpha;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const float p = expf(sc[u] - m_new);  // 0 for an absent token
                l[h] += p;
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[h][i] = fmaf(p, vf[u][i], acc[h][i]);
            }
            m[h] = m_new;
        }
    }
    // merge the warp's P lane groups (same `sub`, different `slot`): afterwards every lane holds the warp's state
#pragma unroll
    for (int h = 0; h < G; ++h) {
        float mw = m[h];
        for (int o = T; o < 32; o <<= 1) mw = fmaxf(mw, __shfl_xor_sync(0xffffffffu, mw, o));
        const float w = m[h] == -INFINITY ? 0.0f : expf(m[h] - mw);
        l[h] *= w;
        for (int o = T; o < 32; o <<= 1) l[h] += __shfl_xor_sync(0xffffffffu, l[h], o);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            acc[h][i] *= w;
            for (int o = T; o < 32; o <<= 1) acc[h][i] += __shfl_xor_sync(0xffffffffu, acc[h][i], o);
        }
        m[h] = mw;
    }
    // across the warps: (m, l) of every (warp, head) in head[0 .. 2 PD_WARPS G), acc rows in rounds of R heads
    float* wml = head;  // [PD_WARPS][G][2]
    const int cap = x_elems / (PD_WARPS * D);
    float* buf = cap >= 1 ? x_buf : head + 2 * PD_WARPS * kMaxGroup;  // [R][PD_WARPS][D]
    const int R = cap >= 1 ? min(group, cap) : 1;
    if (lane == 0) {
#pragma unroll
        for (int h = 0; h < G; ++h) {
            wml[(warp * G + h) * 2] = m[h];
            wml[(warp * G + h) * 2 + 1] = l[h];
        }
    }
    __syncthreads();
    float scale_w[G];
#pragma unroll
    for (int h = 0; h < G; ++h) {
        float mm = -INFINITY;
        for (int w = 0; w < PD_WARPS; ++w) mm = fmaxf(mm, wml[(w * G + h) * 2]);
        scale_w[h] = m[h] == -INFINITY ? 0.0f : expf(m[h] - mm);
    }
    for (int h0 = 0; h0 < group; h0 += R) {
        const int r_here = min(R, group - h0);
        if (slot == 0) {
#pragma unroll
            for (int h = 0; h < G; ++h) {
                if (h < h0 || h >= h0 + r_here) continue;
#pragma unroll
                for (int i = 0; i < 8; ++i)
                    if (valid(i)) buf[((h - h0) * PD_WARPS + warp) * D + elem(i)] = acc[h][i] * scale_w[h];
            }
        }
        __syncthreads();
        for (int j = threadIdx.x; j < r_here * D; j += blockDim.x) {
            const int hr = j / D, d = j % D;
            float sum = 0.0f;
            for (int w = 0; w < PD_WARPS; ++w) sum += buf[(hr * PD_WARPS + w) * D + d];
            parts[(static_cast<int64_t>(g * splits + split) * group + h0 + hr) * (D + 2) + d] = sum;
        }
        if (threadIdx.x < r_here) {
            const int h = h0 + threadIdx.x;
            float mm = -INFINITY, ll = 0.0f;
            for (int w = 0; w < PD_WARPS; ++w) mm = fmaxf(mm, wml[(w * G + h) * 2]);
            for (int w = 0; w < PD_WARPS; ++w) {
                const float wm = wml[(w * G + h) * 2];
                ll += wm == -INFINITY ? 0.0f : wml[(w * G + h) * 2 + 1] * expf(wm - mm);
            }
            float* out = parts + (static_cast<int64_t>(g * splits + split) * group + h) * (D + 2);
            out[D] = mm;
            out[D + 1] = ll;
        }
        __syncthreads();  // buf is rewritten by the next round (wml by the next instruction)
    }
}

// The instantiation for this geometry: the 16-byte path for head_dim 8 .. 256 with D / 8 dividing 32 and aligned
// rows (Qwen3 / Llama: 64, 128), with G the group rounded up to 1, 2, 4 or 8; the scalar path (any even head_dim
// <= 256) with G = kMaxGroup.
KERN_DEV void attn_partial(int g, int split, const PersistShape& s, PageBound pages, const PersistLayer& L,
                           const bf16* q, const int32_t* block_table, const int32_t* seq_lens, float* parts,
                           float* x_buf, int x_elems, float* head, const float* q_smem = nullptr) {
    const int D = s.head_dim, group = s.q_heads / s.kv_heads;
    const bool vec = D % 8 == 0 && 32 % (D / 8) == 0 && aligned16(L.kv) && aligned16(q);
    if (!vec) {
        attn_partial_impl<kMaxGroup, false>(g, split, s, pages, L, q, block_table, seq_lens, parts, x_buf, x_elems, head, q_smem);
    } else if (group <= 1) {
        attn_partial_impl<1, true>(g, split, s, pages, L, q, block_table, seq_lens, parts, x_buf, x_elems, head, q_smem);
    } else if (group <= 2) {
        attn_partial_impl<2, true>(g, split, s, pages, L, q, block_table, seq_lens, parts, x_buf, x_elems, head, q_smem);
    } else if (group <= 4) {
        attn_partial_impl<4, true>(g, split, s, pages, L, q, block_table, seq_lens, parts, x_buf, x_elems, head, q_smem);
    } else {
        attn_partial_impl<8, true>(g, split, s, pages, L, q, block_table, seq_lens, parts, x_buf, x_elems, head, q_smem);
    }
}

// attn_out of kv head g's q heads: sum_s e^(m_s - m) acc_s / sum_s e^(m_s - m) l_s (zeros when no token). Up to
// kReduceBatch splits: every split's (m, l, acc[d]) loaded at once (one L2 round trip an output), then combined in
// split order; more splits: the maxima first, kReduceBatch at a time, then the values.
constexpr int kReduceBatch = 16;

KERN_DEV void attn_reduce(int g, const PersistShape& s, const float* parts, bf16* attn_out) {
    const int D = s.head_dim, group = s.q_heads / s.kv_heads, splits = s.splits;
    const int64_t stride = static_cast<int64_t>(group) * (D + 2);  // floats from split x to x + 1
    for (int i = threadIdx.x; i < group * D; i += blockDim.x) {
        const int h = i / D, d = i % D;
        const float* base = parts + (static_cast<int64_t>(g * splits) * group + h) * (D + 2);
        float mm = -INFINITY, num = 0.0f, den = 0.0f;
        if (splits <= kReduceBatch) {
            float mx[kReduceBatch], av[kReduceBatch], lv[kReduceBatch];
#pragma unroll
            for (int u = 0; u < kReduceBatch; ++u) {
                const bool ok = u < splits;
                const float* p = base + u * stride;
                mx[u] = ok ? __ldcg(p + D) : -INFINITY;
                av[u] = ok ? __ldcg(p + d) : 0.0f;
                lv[u] = ok ? __ldcg(p + D + 1) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < kReduceBatch; ++u) mm = fmaxf(mm, mx[u]);
#pragma unroll
            for (int u = 0; u < kReduceBatch; ++u) {
                if (mx[u] == -INFINITY) continue;  // an empty split (and every u past splits)
                const float w = expf(mx[u] - mm);
                num = fmaf(w, av[u], num);
                den = fmaf(w, lv[u], den);
            }
        } else {
            for (int x0 = 0; x0 < splits; x0 += kReduceBatch) {
                float mv[kReduceBatch];
#pragma unroll
                for (int u = 0; u < kReduceBatch; ++u)
                    mv[u] = x0 + u < splits ? __ldcg(base + (x0 + u) * stride + D) : -INFINITY;
#pragma unroll
                for (int u = 0; u < kReduceBatch; ++u) mm = fmaxf(mm, mv[u]);
            }
            for (int x = 0; mm != -INFINITY && x < splits; ++x) {
                const float* p = base + x * stride;
                const float mx = __ldcg(p + D);
                if (mx == -INFINITY) continue;
                const float w = expf(mx - mm);
                num = fmaf(w, __ldcg(p + d), num);
                den = fmaf(w, __ldcg(p + D + 1), den);
            }
        }
        attn_out[static_cast<int64_t>(g * group + h) * D + d] = f2bf(den > 0.0f ? num / den : 0.0f);
    }
}

// ATTN: ROPE, ATTN_PARTIAL and ATTN_REDUCE of kv head g as one instruction per context split (`split` of
// `splits`), the attention chain in one dependent instruction instead of three. Every split's block normalises and
// rotates the group's q heads itself (into shared memory, the x scratch); only the split that holds the new token
// (token n - 1, n = seq_lens[0]: the caller contract's slot of the decode row) also does the k head and writes the
// token's K / V to its slot, before it reads that row back (the block barrier orders its own write and read; no
// other split reads token n - 1). Then the split's partial, as ATTN_PARTIAL. Then thread 0 takes a ticket,
// counters[ticket] += 1 (acquire-release, after the block barrier that ends the partial's stores): the block that
// draws splits - 1 is the last of kv head g and combines every split's partial in split order into attn_out
// (attn_reduce: the same order and bits whichever block is last). Every ATTN signals one counter that O_PROJ waits
// on for all kv_heads x splits of them, so the last block's attn_out stores precede that counter's completion.
// Returns false (nothing done, fault 5 raised by thread 0) when the writer split finds slot_mapping[0] in range but
// not the block table's slot of token n - 1 (where that token's page is present): another split would read the row
// it writes. Uniform across the block (every thread loads the same words).
KERN_DEV bool attn_fused(int g, int split, const PersistShape& s, PageBound pages, const PersistLayer& L,
                         const bf16* qkv, const float* rope, const int32_t* positions, const int32_t* slot_mapping,
                         const int32_t* block_table, const int32_t* seq_lens, float* parts, bf16* attn_out,
                         uint32_t* ticket, const Smem& sm, int x_elems, uint32_t* err) {
    const int n = max(__ldcg(seq_lens), 0);
    const int len = (n + s.splits - 1) / s.splits;
    const int writer = n >= 1 ? (n - 1) / len : 0;  // the split holding token n - 1 (split 0 of an empty context)
    if (split == writer && n >= 1) {
        const int64_t slot = __ldcg(slot_mapping);
        const int32_t page = __ldcg(block_table + (n - 1) / s.page_tokens);
        const int64_t own = static_cast<int64_t>(page) * s.page_tokens + (n - 1) % s.page_tokens;
        const bool slot_in = slot >= 0 && slot < static_cast<int64_t>(pages.num_pages) * s.page_tokens;
        if (slot_in && page >= 0 && page < pages.num_pages && slot != own) {
            if (threadIdx.x == 0)
                raise_fault(err, kBadSlot, static_cast<uint32_t>(slot), static_cast<uint32_t>(own),
                            static_cast<uint32_t>(n), 0, 0);
            return false;
        }
    }
    rope_group(g, s, pages, L, qkv, rope, positions, slot_mapping, nullptr, sm.head, sm.x, split == writer);
    __syncthreads();  // q in sm.x, the new K / V row stored, sm.head free again
    attn_partial(g, split, s, pages, L, nullptr, block_table, seq_lens, parts, sm.x, x_elems, sm.head, sm.x);
    // attn_partial ends on a block barrier after its last stores of parts
    uint32_t* last = reinterpret_cast<uint32_t*>(sm.red) + 62;  // red[63] is the abort flag
    if (threadIdx.x == 0) *last = atomic_add_acq_rel(ticket, 1u) == static_cast<uint32_t>(s.splits - 1) ? 1u : 0u;
    __syncthreads();
    if (*last) attn_reduce(g, s, parts, attn_out);
    return true;
}

// While thread 0 waits on an instruction's counter (and the ring prologue is in flight), warp 1 asks L2 for the
// kPrefetchBytes of the instruction's weight tile that follow what the prologue covers (rows first .. first + count
// of W, contiguous; GATE_UP: half from the gate rows, half from the up rows; `skip` bytes of each range left to the
// ring), in 16 KiB bulk prefetches (cp.async.bulk.prefetch.L2): HBM traffic during the wait instead of after it,
// nothing in registers or shared memory, no effect on any result. 132 blocks x 128 KiB = 16.5 MiB of the H200's L2.
// Only when the table's header sets kFlagL2Prefetch.
constexpr uint32_t kPrefetchBytes = 128u * 1024u, kPrefetchPiece = 16u * 1024u;

KERN_DEV void prefetch_tile(uint32_t op, const PersistLayer& L, const bf16* lm_head, uint32_t first, uint32_t count,
                            const PersistShape& s, size_t skip) {
    const ProjWeights pw = projection_weights(op, L, lm_head, s);
    if (pw.w == nullptr) return;
    const size_t k = static_cast<size_t>(pw.k), I = s.inter;
    const bf16* gate = pw.w + first * k;  // the range; GATE_UP: its gate rows, `up` its up rows
    const bf16* up = op == kGateUp ? pw.w + (I + first) * k : nullptr;
    if (op == kGateUp) skip /= 2;
    const size_t tile = static_cast<size_t>(count) * k * sizeof(bf16);
    if (tile <= skip) return;
    const uint32_t share = up != nullptr ? kPrefetchBytes / 2 : kPrefetchBytes;
    const uint32_t budget = static_cast<uint32_t>(min(tile - skip, static_cast<size_t>(share))) & ~15u;
    skip &= ~static_cast<size_t>(15);
    const uint32_t lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const bf16* p = r == 0 ? gate : up;
        if (p == nullptr || !aligned16(p)) continue;
        const char* base = reinterpret_cast<const char*>(p) + skip;
        for (uint32_t off = lane * kPrefetchPiece; off < budget; off += 32 * kPrefetchPiece)
            prefetch_l2(base + off, min(kPrefetchPiece, budget - off));
    }
}

// Larger value wins; equal values: the smaller index (kern_argmax's rule).
KERN_DEV bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

}  // namespace

#if defined(PD_TRACE) && defined(PD_TWICE)
// A probe of the probe (bench/persistent_trace.py --twice): ROPE, ATTN_PARTIAL and ATTN_REDUCE run twice, the
// first run's end stamped in trace[0] (over the before-prologue stamp): the second run finds its code in the
// instruction caches and nothing else changed (idempotent writes), so the difference is the cost of a cold start.
#define PD_TWICE_BEGIN for (int twice = 0; twice < 2; ++twice) {
#define PD_TWICE_END                                                                 \
    __syncthreads();                                                                 \
    if (twice == 0 && threadIdx.x == 0) trace[0] = static_cast<uint32_t>(global_ns()); \
    __syncthreads();                                                                 \
    }
#else
#define PD_TWICE_BEGIN
#define PD_TWICE_END
#endif

// grid (the table's queue count, 1, 1), block (PD_THREADS, 1, 1), cooperative. Dynamic shared memory: the scratch,
// 4 * (max(hidden, inter, q_heads * head_dim) + 64 + (kMaxGroup + 1) * kMaxHeadDim) bytes rounded up to 16, then
// the weight ring: as many kRingStepBytes steps as fit, up to kRingMaxStages, at least 2 (else fault 3).

extern "C" __global__ void __launch_bounds__(PD_THREADS, 1) kern_persistent_decode(
    const uint32_t* __restrict__ table,  // the instruction table (isa.py)
    uint32_t* counters,                  // u32[num_counters], zeroed before every step (zero_each_run)
    uint32_t* err,                       // u32[8] error word (host-mapped)
    bf16* residual,                      // [H], from the embedding
    bf16* qkv,                           // [qkv_dim]
    bf16* q,                             // [q_dim]
    float* parts,                        // [kv_heads * splits * group][D + 2]
    bf16* attn_out,                      // [q_dim]
    bf16* act,                           // [I]
    bf16* logits,                        // [V]
    uint32_t* argmax_parts,              // [lm tiles][2]: f32 bits of the value, index
    int64_t* next_token,                 // [1]
    const bf16* __restrict__ final_norm, const bf16* __restrict__ lm_head, const float* __restrict__ rope,
    const int32_t* positions, const int32_t* slot_mapping, const int32_t* seq_lens, const int32_t* block_table,
    PersistShape s, int32_t num_pages, unsigned long long timeout_ns, PersistLayers layers) {
    PD_DYNAMIC_SMEM(smem_f);
    const PageBound pages{num_pages};
    const int H = s.hidden, D = s.head_dim, I = s.inter;
    const int q_dim = s.q_heads * D;
    const int x_elems = max(max(H, I), q_dim);
    const uint32_t ring_at = (4u * static_cast<uint32_t>(x_elems + 64 + (kMaxGroup + 1) * kMaxHeadDim) + 15u) & ~15u;
    const uint32_t ring_fit = dynamic_smem_bytes() > ring_at ? (dynamic_smem_bytes() - ring_at) / kRingStepBytes : 0u;
    const int stages = static_cast<int>(min(ring_fit, static_cast<uint32_t>(kRingMaxStages)));
    Smem sm{smem_f, smem_f + x_elems, smem_f + x_elems + 64,
            reinterpret_cast<uint4*>(reinterpret_cast<char*>(smem_f) + ring_at)};
    // this warp's ring: stages x kStagePieces x 32 pieces
    uint4* const ring = sm.ring + static_cast<size_t>(threadIdx.x >> 5) * stages * kStagePieces * 32;
    // the table's header and the launch (uniform: every thread reads the same words)
    const uint32_t n = table[2], nq = table[3], nc = table[4];
    const uint32_t offsets_at = table[6], entries_at = table[7], instrs_at = table[8];
    const uint32_t flags = table[10];
    if (table[0] != kMagic || table[1] != kVersion || table[5] != kInstrWords || offsets_at != kHeaderWords ||
        entries_at != offsets_at + nq + 1 || instrs_at != entries_at + n || (flags & ~kKnownFlags) != 0u) {
        if (threadIdx.x == 0) raise_fault(err, kBadTable, blockIdx.x, 0, 0, 0, 0);
        return;
    }
    if (nq != gridDim.x || blockDim.x != PD_THREADS || stages < 2) {  // stages: the ring of >= 2 steps fits
        if (threadIdx.x == 0) raise_fault(err, kBadLaunch, gridDim.x, blockDim.x, dynamic_smem_bytes(), 0, 0);
        return;
    }
    const int group = s.kv_heads > 0 ? s.q_heads / s.kv_heads : 0;
    const int shape_bad = (D < 2 || D > kMaxHeadDim || (D & 1)) ? 1
                        : (group < 1 || group > kMaxGroup || group * s.kv_heads != s.q_heads) ? 2
                        : (s.layers < 1 || s.layers > kMaxLayers) ? 3
                        : (s.splits < 1 || s.page_tokens < 1) ? 4 : 0;
    if (shape_bad) {
        if (threadIdx.x == 0) raise_fault(err, kBadShape, shape_bad, 0, 0, 0, 0);
        return;
    }
    const uint32_t first = table[offsets_at + blockIdx.x], last = table[offsets_at + blockIdx.x + 1];
    if (first > last || last > n) {
        if (threadIdx.x == 0) raise_fault(err, kBadTable, blockIdx.x, offsets_at + blockIdx.x, 0, 0, 0);
        return;
    }
    // shared memory is known to be large enough from here on
    uint32_t& abort_flag = reinterpret_cast<uint32_t*>(sm.red)[63];  // red[0..31] block_sum, [0..15] the merges
    if (threadIdx.x == 0) abort_flag = 0;
    __syncthreads();
    for (uint32_t e = first; e < last; ++e) {
        const uint32_t index = table[entries_at + e];
        const uint32_t* ins = table + instrs_at + static_cast<size_t>(index) * kInstrWords;
        const uint32_t op = index < n ? ins[0] : 0u, layer = index < n ? ins[1] : 0u;
        const uint32_t wait = index < n ? ins[4] : 0u, target = index < n ? ins[5] : 0u, sig = index < n ? ins[6] : nc;
        // the per-layer classes index layers[layer] (LM_HEAD / ARGMAX carry layer == s.layers and read no layer)
        const bool layered = (op >= kQkv && op <= kDown) || op == kAttn;
        const bool bad_fields = (layered && layer >= static_cast<uint32_t>(s.layers)) ||
                                (op == kAttn && (ins[2] >= static_cast<uint32_t>(s.kv_heads) ||
                                                 ins[3] != static_cast<uint32_t>(s.splits) || ins[7] >= ins[3] ||
                                                 static_cast<uint64_t>(sig) + 1u + ins[2] >= nc));
        if (index >= n || sig >= nc || (wait != kNoCounter && wait >= nc) || layer > static_cast<uint32_t>(s.layers) ||
            bad_fields) {
            if (threadIdx.x == 0) raise_fault(err, kBadTable, blockIdx.x, index, 0, 0, 0);
            break;
        }
        const uint32_t a = ins[2], cnt = ins[3], arg = ins[7];
        const PersistLayer& Lp = layers.layer[layer < kMaxLayers ? layer : 0];
#ifdef PD_TRACE  // a timing probe (bench/persistent_trace.py), never a committed build: per queue entry e, the
                 // low 32 bits of %globaltimer before the prologue, after the wait and after the work, in `logits`
        uint32_t* const trace = reinterpret_cast<uint32_t*>(logits) + 3 * static_cast<size_t>(e);
        if (threadIdx.x == 0) trace[0] = static_cast<uint32_t>(global_ns());
#endif
        // ---- the ring prologue: a projection's first weight steps, issued before the wait (they depend on nothing)
        WarpRows rows = warp_rows(op, Lp, lm_head, a, cnt, arg, s);
        rows.evict_first = (flags & kFlagEvictFirst) != 0u;
        if (rows.vec && rows.rows > 0) ring_prologue(rows, ring, stages);
        if ((flags & kFlagTableAhead) && threadIdx.x == 0 && e + 1 < last) {  // a hint: no fault if out of range
            const uint32_t next = table[entries_at + e + 1];
            if (next < n) prefetch_l1(table + instrs_at + static_cast<size_t>(next) * kInstrWords);
        }
        // ---- the wait: thread 0 spins, the block follows (warp 1 prefetches the tile's next bytes into L2)
        if (wait != kNoCounter) {
            if ((flags & kFlagL2Prefetch) && (threadIdx.x >> 5) == 1 && load_acquire(counters + wait) < target)
                prefetch_tile(op, Lp, lm_head, a, cnt, s, static_cast<size_t>(stages - 1) * kRingStepBytes);
            if (threadIdx.x == 0) {
                const unsigned long long start = global_ns();
                unsigned spins = 0;
                uint32_t value;
                while ((value = load_acquire(counters + wait)) < target) {
                    if ((++spins & 255u) == 0u) {
                        if (*reinterpret_cast<volatile uint32_t*>(err) != 0u) {  // another block faulted
                            abort_flag = 1;
                            break;
                        }
                        if (global_ns() - start > timeout_ns) {
                            raise_fault(err, kTimeout, index, wait, value, target, blockIdx.x);
                            abort_flag = 1;
                            break;
                        }
                    }
                    __nanosleep(32);
                }
                if (flags & kFlagFences) __threadfence();
            }
            __syncthreads();
            if (abort_flag) break;
        }
#ifdef PD_TRACE
        if (threadIdx.x == 0) trace[1] = static_cast<uint32_t>(global_ns());
#endif
        switch (op) {
            case kQkv:
                stage_rmsnorm(sm.x, residual, Lp.ln_in, H, s.eps, sm.red);
                stream_plain(rows, a, sm.x, ring, stages, [&](int row, float dot) { qkv[row] = f2bf(dot); });
                break;
            case kRope:
                PD_TWICE_BEGIN
                rope_group(a, s, pages, Lp, qkv, rope, positions, slot_mapping, q, sm.head);
                PD_TWICE_END
                break;
            case kAttnPartial:
                PD_TWICE_BEGIN
                attn_partial(a, arg, s, pages, Lp, q, block_table, seq_lens, parts, sm.x, x_elems, sm.head);
                PD_TWICE_END
                break;
            case kAttnReduce:
                PD_TWICE_BEGIN
                attn_reduce(a, s, parts, attn_out);
                PD_TWICE_END
                break;
            case kAttn:  // the ticket: counters[sig + 1 + kv head] (isa.py; checked in range above)
                if (!attn_fused(a, arg, s, pages, Lp, qkv, rope, positions, slot_mapping, block_table, seq_lens,
                                parts, attn_out, counters + sig + 1 + a, sm, x_elems, err) &&
                    threadIdx.x == 0)
                    abort_flag = 1;
                break;
            case kOProj:
                stage_copy(sm.x, attn_out, q_dim);
                if (ksplit(op, q_dim, cnt, arg))
                    stream_residual_ksplit(rows, a, sm.x + (threadIdx.x >> 5) * (q_dim / PD_WARPS), ring, stages,
                                           residual, sm.head);
                else
                    stream_residual(rows, a, sm.x, ring, stages, residual);
                break;
            case kGateUp: {  // batch i of the warp: output j = first + warp + PD_WARPS i, rows gate j and up j
                stage_rmsnorm(sm.x, residual, Lp.ln_post, H, s.eps, sm.red);
                const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
                ring_stream(rows, sm.x, ring, stages, [&](int b, const float (&dot)[kBatchRows]) {
                    const int j = static_cast<int>(a) + warp + PD_WARPS * b;
                    if (lane == 0) act[j] = f2bf(silu_bf(round_bf(dot[0])) * round_bf(dot[1]));
                });
                break;
            }
            case kDown:
                stage_copy(sm.x, act, I);
                if (ksplit(op, I, cnt, arg))
                    stream_residual_ksplit(rows, a, sm.x + (threadIdx.x >> 5) * (I / PD_WARPS), ring, stages,
                                           residual, sm.head);
                else
                    stream_residual(rows, a, sm.x, ring, stages, residual);
                break;
            case kLmHead: {
                stage_rmsnorm(sm.x, residual, final_norm, H, s.eps, sm.red);
                const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
                float best = -INFINITY;
                int best_i = 0x7fffffff;
                stream_plain(rows, a, sm.x, ring, stages, [&](int row, float dot) {  // lane 0, the warp's rows in order
                    const float v = round_bf(dot);
#ifndef PD_TRACE
                    logits[row] = f2bf(v);
#endif
                    if (better(v, row, best, best_i)) best = v, best_i = row;
                });
                __syncthreads();
                if (lane == 0) {
                    sm.red[warp] = best;
                    reinterpret_cast<int*>(sm.red)[PD_WARPS + warp] = best_i;
                }
                __syncthreads();
                if (threadIdx.x == 0) {
                    for (int w = 1; w < PD_WARPS; ++w) {
                        const int wi = reinterpret_cast<int*>(sm.red)[PD_WARPS + w];
                        if (better(sm.red[w], wi, best, best_i)) best = sm.red[w], best_i = wi;
                    }
                    argmax_parts[2 * arg] = __float_as_uint(best);
                    argmax_parts[2 * arg + 1] = static_cast<uint32_t>(best_i);
                }
                break;
            }
            case kNop:  // a timing ablation's stand-in for a removed instruction: its wait and signal only
                break;
            case kArgmax:
                if (threadIdx.x == 0) {
                    float best = -INFINITY;
                    int best_i = 0x7fffffff;
                    for (uint32_t t = 0; t < cnt; ++t) {
                        const float v = __uint_as_float(__ldcg(argmax_parts + 2 * t));
                        const int i = static_cast<int>(__ldcg(argmax_parts + 2 * t + 1));
                        if (better(v, i, best, best_i)) best = v, best_i = i;
                    }
                    *next_token = best_i;
                }
                break;
            default:
                if (threadIdx.x == 0) raise_fault(err, kBadTable, blockIdx.x, index, op, 0, 0);
                abort_flag = 1;
        }
        __syncthreads();  // every thread's writes of this instruction done (abort_flag is seen by all) ...
#ifdef PD_TRACE
        if (threadIdx.x == 0) trace[2] = static_cast<uint32_t>(global_ns());
#endif
        if (abort_flag) break;
        if (threadIdx.x == 0) {  // ... then thread 0's release (after a GPU-scope fence with kFlagFences)
            if (flags & kFlagFences) __threadfence();
            red_release_add(counters + sig, 1u);
        }
    }
    cp_async_wait_pending(0);  // a block that stopped early (a fault) leaves no copy in flight into its shared memory
}
