"""The Qwen3 decode step (bs = 1) as a persistent-kernel instruction table (docs/persistent.md).

`build_schedule(cfg, num_queues)` computes, in the order of today's decode program (programs.decode_gemv_calls,
gemv v2): per layer QKV tiles, the attention, O_PROJ, GATE_UP and DOWN tiles; then LM_HEAD tiles and the ARGMAX.
The attention is ROPE per kv head, ATTN_PARTIAL per (kv head, split) and ATTN_REDUCE per kv head (`attn="split"`,
the default) or ATTN per (kv head, context split) (`attn="fused"`: rope, partial and reduce in one instruction,
isa.Op.ATTN; measured on the H200 slower than the split chain at 4B and 8B, docs/perf.md). Each phase
signals its own counter (ROPE and ATTN_PARTIAL one per kv head) and waits on the one before it with the target
"every instruction that signals it". Projection tiles are `row_quantum`-row multiples (single rows in an O_PROJ /
DOWN phase that takes the row split) sized so one phase makes at most `num_queues` tiles.
Instructions go, in table order, to the queue with the least accumulated cost so far (weight bytes, the attention
instructions at their KV bytes for `ctx_tokens`, plus FIXED_COST_BYTES each) among the queues that hold no
instruction of its phase (layer, class) yet, ties to the lowest queue: each queue is a subsequence of the table,
which makes the schedule deadlock-free whenever all queues run at once (simulate.py proves it per table).

Each instruction also carries its data-flow (`Access`es: buffer, element range, read or write, in the existing
manifest's buffer names), which simulate.check_dataflow compares with the sequential program order.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from ..config import Qwen3Config
from .isa import NO_COUNTER, Instr, Op, Table

BF16 = 2
WARPS = 8  # PD_WARPS of the kernel
KSPLIT_MAX_ROWS = 9 * 256 // WARPS  # kSplitMaxRows: a k-split tile's partial sums fill at most the head scratch
ARG_ROW_SPLIT = 1  # kArgRowSplit: bit 0 of an O_PROJ / DOWN instruction's arg asks the kernel for the row split
STEP_CHUNKS = 2  # kStepChunks: 16-byte chunks per lane per row per ring step
BATCH_ROWS = 2  # kBatchRows: rows per ring batch
ROW_SPLITS = ("auto", "always", "never")
ATTN_MODES = ("fused", "split")
# What one instruction's fixed latency (its wait, staging its input vector, its reduction) is counted as when queues
# are balanced: about 1 us of one SM's share of 4.3 TB/s over 132 SMs (32.6 GB/s). Without it the instructions that
# stream no weights (ROPE, ATTN_REDUCE) would all land on the least loaded queue, one after the other.
FIXED_COST_BYTES = 32 * 1024


@dataclass(frozen=True)
class Access:
    """Elements [lo, hi) of `buffer` read (`write` False) or written by an instruction."""

    buffer: str
    lo: int
    hi: int
    write: bool = False


@dataclass(frozen=True)
class Step:
    """An instruction with what the builder knows about it beyond its record: `accesses` (data-flow),
    `weight_bytes` (bytes of weights it streams), `cost` (what queue balancing counted: weight or KV bytes)."""

    instr: Instr
    accesses: tuple[Access, ...]
    weight_bytes: int
    cost: int


@dataclass(frozen=True)
class Schedule:
    """The table (instructions and queues) and the builder's per-instruction facts, index for index. `splits`:
    attention context splits; `lm_tiles`: argmax partial slots."""

    table: Table
    steps: tuple[Step, ...]
    splits: int
    lm_tiles: int

    def queue_costs(self) -> list[int]:
        """Accumulated cost (bytes) per queue."""
        return [sum(self.steps[i].cost for i in q) for q in self.table.queues]


def tile_rows(rows: int, num_queues: int, quantum: int) -> int:
    """Rows per tile: the smallest multiple of `quantum` that splits `rows` into at most `num_queues` tiles."""
    per_queue = -(-rows // num_queues)
    return -(-per_queue // quantum) * quantum


def tiles(rows: int, num_queues: int, quantum: int) -> list[tuple[int, int]]:
    """(first row, row count) of each tile of `rows` rows."""
    step = tile_rows(rows, num_queues, quantum)
    return [(a, min(step, rows - a)) for a in range(0, rows, step)]


def default_splits(cfg: Qwen3Config, num_queues: int) -> int:
    """Context splits per kv head: enough partial instructions to give most queues one (at most 16)."""
    return max(1, min(16, num_queues // cfg.kv_heads))


class _Counters:
    def __init__(self) -> None:
        self.count = 0

    def new(self) -> int:
        self.count += 1
        return self.count - 1


def ring_steps(rows: int, k: int) -> int:
    """Ring steps one warp streams for `rows` rows of `k` bf16 (the kernel's WarpRows: batches of BATCH_ROWS rows,
    each ceil(k / 8 / (32 STEP_CHUNKS)) steps)."""
    return -(-rows // BATCH_ROWS) * -(-(k // 8) // (32 * STEP_CHUNKS))


def row_split_steps(rows: int, k: int, num_queues: int, row_quantum: int) -> tuple[int, int | None]:
    """(ring steps a warp streams for its share of the largest tile of a `rows` x `k` residual projection without the
    row split, with it (None where the kernel cannot split: k % (8 WARPS) or tiles past KSPLIT_MAX_ROWS)). Whole
    rows: tiles of row_quantum multiples, ceil(tile / WARPS) rows a warp of k each; split: tiles of single rows,
    every row of the tile a warp, k / WARPS each. The 4B DOWN (2560 x 9728, 132 queues): 38 against 30; 1.7B
    (2048 x 6144): 12 against 16; 8B (4096 x 12288): 48 against 48."""
    whole = ring_steps(-(-tile_rows(rows, num_queues, row_quantum) // WARPS), k)
    split_rows = tile_rows(rows, num_queues, 1)
    if k % (8 * WARPS) or split_rows > KSPLIT_MAX_ROWS:
        return whole, None
    return whole, ring_steps(split_rows, k // WARPS)


def build_schedule(cfg: Qwen3Config, num_queues: int, *, row_quantum: int = 8, splits: int | None = None,
                   ctx_tokens: int = 128, attn: str = "split", row_split: str = "auto") -> Schedule:
    """The decode step's table for `cfg` over `num_queues` kernel blocks (one per SM on the target GPU).
    `splits`: attention context splits per kv head (None: default_splits); `ctx_tokens`: the context the attention
    instructions are costed at; `attn`: "fused" (ATTN) or "split" (ROPE, ATTN_PARTIAL, ATTN_REDUCE);
    `row_split`: O_PROJ and DOWN split each row across the warps (their `arg` ARG_ROW_SPLIT, 1-row tiles) "auto"
    where row_split_steps counts strictly fewer ring steps a warp (4B: both; 1.7B, 8B: neither, as measured:
    docs/perf.md), "always" wherever the kernel can, or "never". Raises ValueError for num_queues, row_quantum,
    splits or ctx_tokens < 1, or another `attn` or `row_split`."""
    if attn not in ATTN_MODES:
        raise ValueError(f"attn {attn!r}: one of {', '.join(ATTN_MODES)}")
    if row_split not in ROW_SPLITS:
        raise ValueError(f"row_split {row_split!r}: one of {', '.join(ROW_SPLITS)}")
    for name, value in (("num_queues", num_queues), ("row_quantum", row_quantum), ("ctx_tokens", ctx_tokens)):
        if value < 1:
            raise ValueError(f"{name} is {value}; it must be >= 1")
    S = default_splits(cfg, num_queues) if splits is None else splits
    if S < 1:
        raise ValueError(f"splits is {S}; it must be >= 1")
    H, L, D = cfg.hidden, cfg.layers, cfg.head_dim
    Hq, Hkv, I, V = cfg.q_heads, cfg.kv_heads, cfg.intermediate, cfg.vocab
    group = Hq // Hkv
    q_dim, kv_dim = Hq * D, Hkv * D
    qkv_dim = q_dim + 2 * kv_dim
    counters = _Counters()
    steps: list[Step] = []

    def emit(op: Op, layer: int, first: int, count: int, wait: tuple[int, int] | None, signal: int,
             accesses: list[Access], weight_bytes: int, arg: int = 0, cost: int | None = None) -> None:
        wc, wt = wait if wait is not None else (NO_COUNTER, 0)
        instr = Instr(op, layer, first, count, wc, wt, signal, arg)
        base = weight_bytes if cost is None else cost
        steps.append(Step(instr, tuple(accesses), weight_bytes, base + FIXED_COST_BYTES))

    def read(buffer: str, lo: int = 0, hi: int = 1) -> Access:
        return Access(buffer, lo, hi)

    def write(buffer: str, lo: int, hi: int) -> Access:
        return Access(buffer, lo, hi, write=True)

    kv_cost = ctx_tokens * 2 * D * BF16 // S  # K and V of one head over one split

    def splits_rows(k: int) -> bool:
        """Whether the O_PROJ / DOWN phase of reduction length k takes the row split (`row_split`)."""
        whole, split = row_split_steps(H, k, num_queues, row_quantum)
        return split is not None and (row_split == "always" or (row_split == "auto" and split < whole))
    o_split, down_split = splits_rows(q_dim), splits_rows(I)
    o_arg, down_arg = (ARG_ROW_SPLIT if o_split else 0), (ARG_ROW_SPLIT if down_split else 0)
    prev: tuple[int, int] | None = None  # (counter, target) the next layer's QKV waits on
    for layer in range(L):
        kv = f"kv.{layer}"
        c_qkv = counters.new()
        qkv_tiles = tiles(qkv_dim, num_queues, row_quantum)
        for a, n in qkv_tiles:
            emit(Op.QKV, layer, a, n, prev, c_qkv,
                 [read("residual", 0, H), read(f"ln_in.{layer}", 0, H), read(f"w_qkv.{layer}", a * H, (a + n) * H),
                  write("qkv", a, a + n)], n * H * BF16)
        if attn == "fused":
            attn_done = (_fused_attention(emit, counters, layer, (c_qkv, len(qkv_tiles)), cfg, S, kv_cost), Hkv * S)
        else:
            c_rope = [counters.new() for _ in range(Hkv)]
            for g in range(Hkv):
                q_lo, q_hi = g * group * D, (g + 1) * group * D
                k_lo, v_lo = q_dim + g * D, q_dim + kv_dim + g * D
                emit(Op.ROPE, layer, g, group, (c_qkv, len(qkv_tiles)), c_rope[g],
                     [read("qkv", q_lo, q_hi), read("qkv", k_lo, k_lo + D), read("qkv", v_lo, v_lo + D),
                      read(f"q_norm.{layer}", 0, D), read(f"k_norm.{layer}", 0, D), read("rope"), read("positions"),
                      read("slot_mapping"), write("q", q_lo, q_hi), write(kv, g * D, (g + 1) * D)], 0, cost=0)
            c_attn = [counters.new() for _ in range(Hkv)]
            for g in range(Hkv):
                q_lo, q_hi = g * group * D, (g + 1) * group * D
                for s in range(S):
                    part = (g * S + s) * group
                    emit(Op.ATTN_PARTIAL, layer, g, S, (c_rope[g], 1), c_attn[g],
                         [read("q", q_lo, q_hi), read(kv, g * D, (g + 1) * D), read("block_table"), read("seq_lens"),
                          write("attn_partials", part, part + group)], 0, arg=s, cost=kv_cost)
            c_red = counters.new()
            for g in range(Hkv):
                q_lo, q_hi = g * group * D, (g + 1) * group * D
                emit(Op.ATTN_REDUCE, layer, g, S, (c_attn[g], S), c_red,
                     [read("attn_partials", g * S * group, (g + 1) * S * group), read("seq_lens"),
                      write("attn_out", q_lo, q_hi)], 0, cost=0)
            attn_done = (c_red, Hkv)
        c_o = counters.new()
        o_tiles = tiles(H, num_queues, 1 if o_split else row_quantum)
        for a, n in o_tiles:
            emit(Op.O_PROJ, layer, a, n, attn_done, c_o,
                 [read("attn_out", 0, q_dim), read(f"w_o.{layer}", a * q_dim, (a + n) * q_dim),
                  read("residual", a, a + n), write("residual", a, a + n)], n * q_dim * BF16, arg=o_arg)
        c_gu = counters.new()
        gu_tiles = tiles(I, num_queues, row_quantum)
        for a, n in gu_tiles:
            emit(Op.GATE_UP, layer, a, n, (c_o, len(o_tiles)), c_gu,
                 [read("residual", 0, H), read(f"ln_post.{layer}", 0, H),
                  read(f"w_gate_up.{layer}", a * H, (a + n) * H),
                  read(f"w_gate_up.{layer}", (I + a) * H, (I + a + n) * H), write("act", a, a + n)],
                 2 * n * H * BF16)
        c_down = counters.new()
        down_tiles = tiles(H, num_queues, 1 if down_split else row_quantum)
        for a, n in down_tiles:
            emit(Op.DOWN, layer, a, n, (c_gu, len(gu_tiles)), c_down,
                 [read("act", 0, I), read(f"w_down.{layer}", a * I, (a + n) * I), read("residual", a, a + n),
                  write("residual", a, a + n)], n * I * BF16, arg=down_arg)
        prev = (c_down, len(down_tiles))
    lm = "embed" if cfg.tied else "lm_head"
    c_lm = counters.new()
    lm_tiles = tiles(V, num_queues, row_quantum)
    for t, (a, n) in enumerate(lm_tiles):
        emit(Op.LM_HEAD, L, a, n, prev, c_lm,
             [read("residual", 0, H), read("final_norm", 0, H), read(lm, a * H, (a + n) * H),
              write("logits", a, a + n), write("argmax_partials", t, t + 1)], n * H * BF16, arg=t)
    c_done = counters.new()
    emit(Op.ARGMAX, L, 0, len(lm_tiles), (c_lm, len(lm_tiles)), c_done,
         [read("argmax_partials", 0, len(lm_tiles)), write("next_token", 0, 1)], 0, cost=0)
    queues = assign_queues([s.cost for s in steps], num_queues, [(s.instr.layer, int(s.instr.op)) for s in steps])
    table = Table(tuple(s.instr for s in steps), queues, counters.count)
    return Schedule(table, tuple(steps), S, len(lm_tiles))


def _fused_attention(emit: Callable[..., None], counters: _Counters, layer: int, qkv_done: tuple[int, int],
                     cfg: Qwen3Config, S: int, kv_cost: int) -> int:
    """ATTN per (kv head g, split s) of `layer`, all waiting on `qkv_done` and signalling one new counter, which is
    returned; the kv_heads ticket counters follow it (isa.Op.ATTN: ticket = signal + 1 + g). The accesses are every
    split's union (the rope's inputs, the K / V write, its partial, all partials read, attn_out written): the kernel
    orders those of one ticket itself (the writer split alone reads the new token; the last arrival alone reduces),
    so simulate.check_dataflow takes the pairs of one Instr.ticket as ordered."""
    D, Hq, Hkv = cfg.head_dim, cfg.q_heads, cfg.kv_heads
    group, q_dim, kv_dim = Hq // Hkv, Hq * D, Hkv * D
    kv = f"kv.{layer}"
    signal = counters.new()
    tickets = [counters.new() for _ in range(Hkv)]
    assert tickets == [Instr(Op.ATTN, layer, g, S, NO_COUNTER, 0, signal).ticket for g in range(Hkv)]  # as derived
    for g in range(Hkv):
        q_lo, q_hi = g * group * D, (g + 1) * group * D
        k_lo, v_lo = q_dim + g * D, q_dim + kv_dim + g * D
        for s in range(S):
            part = (g * S + s) * group
            emit(Op.ATTN, layer, g, S, qkv_done, signal,
                 [Access("qkv", q_lo, q_hi), Access("qkv", k_lo, k_lo + D), Access("qkv", v_lo, v_lo + D),
                  Access(f"q_norm.{layer}", 0, D), Access(f"k_norm.{layer}", 0, D), Access("rope", 0, 1),
                  Access("positions", 0, 1), Access("slot_mapping", 0, 1), Access("block_table", 0, 1),
                  Access("seq_lens", 0, 1), Access(kv, g * D, (g + 1) * D),
                  Access("attn_partials", g * S * group, (g + 1) * S * group),
                  Access(kv, g * D, (g + 1) * D, write=True), Access("attn_partials", part, part + group, write=True),
                  Access("attn_out", q_lo, q_hi, write=True)], 0, arg=s, cost=kv_cost)
    return signal


def assign_queues(costs: list[int], num_queues: int,
                  phases: list[tuple[int, int]] | None = None) -> tuple[tuple[int, ...], ...]:
    """Instructions 0..n-1 (in table order) to `num_queues` queues: each to the queue with the least cost so far,
    ties to the lowest index (a heap of (cost, queue)). Every queue lists its instructions in table order.
    `phases` (one key per instruction, e.g. (layer, opcode)): within a run of equal keys no queue takes a second
    instruction until every queue has one, so a phase of at most `num_queues` instructions runs on distinct blocks
    (its instructions wait on the same counters: two on one block would run one after the other)."""
    heap = [(0, q) for q in range(num_queues)]
    queues: list[list[int]] = [[] for _ in range(num_queues)]
    held: list[tuple[int, int]] = []  # queues taken in the current phase, out of the heap until it ends
    for i, cost in enumerate(costs):
        if phases is not None and i and (phases[i] != phases[i - 1] or not heap):
            for item in held:
                heapq.heappush(heap, item)
            held = []
        load, q = heapq.heappop(heap)
        queues[q].append(i)
        if phases is None:
            heapq.heappush(heap, (load + cost, q))
        else:
            held.append((load + cost, q))
    return tuple(tuple(q) for q in queues)
