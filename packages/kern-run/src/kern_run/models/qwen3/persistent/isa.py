"""The persistent decode kernel's instruction table: record layout, packing, and the checked unpacking that refuses a
hostile table (docs/persistent.md "The table").

A table is `u32` little-endian words (the device buffer `persist_table`, materialised at load from the manifest's
`init`):

    header      HEADER_WORDS words: MAGIC, VERSION, num_instructions, num_queues, num_counters, INSTR_WORDS,
                queue_offsets_at, queue_entries_at, instructions_at, words (total), flags (FLAG_*), then zeros
    offsets     u32[num_queues + 1]: queue q holds entries[offsets[q] : offsets[q + 1]]
    entries     u32[num_instructions]: instruction indices, queue by queue (each instruction exactly once)
    instrs      u32[num_instructions][INSTR_WORDS]: opcode, layer, first, count, wait_counter, wait_target,
                signal_counter, arg

Block b of the kernel runs queue b in order: for each instruction, spin (bounded) until
`counters[wait_counter] >= wait_target` (no wait when wait_counter == NO_COUNTER), execute it, then (after a
`__threadfence`) add 1 to `counters[signal_counter]`. The counters are a `zero_each_run` buffer. Everything here is
pure Python; the kernel (kernels-src/persistent_decode.cu) reads the same layout and checks the same bounds.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

MAGIC = 0x5453504B  # "KPST" little-endian
VERSION = 2  # 2: header word 10 holds flags (version 1: reserved, zero)
HEADER_WORDS = 16
INSTR_WORDS = 8
NO_COUNTER = 0xFFFFFFFF
FLAG_L2_PREFETCH = 1  # while a projection waits, warp 1 prefetches its tile's next bytes into L2
FLAG_FENCES = 2  # thread 0 adds a GPU-scope fence after its acquire and before its release
FLAG_EVICT_FIRST = 4  # the weight ring's copies carry an L2 evict-first policy (weights are read once a step)
FLAG_TABLE_AHEAD = 8  # thread 0 asks L1 for the next queue entry's instruction words before it waits
KNOWN_FLAGS = FLAG_L2_PREFETCH | FLAG_FENCES | FLAG_EVICT_FIRST | FLAG_TABLE_AHEAD
U32_MAX = 0xFFFFFFFF
MAX_INSTRUCTIONS = 1 << 20  # far above any decode step (Qwen3-32B: ~40k); a hostile header is refused before use
MAX_QUEUES = 1024  # blocks of one cooperative grid: SMs x blocks per SM on any GPU kern targets
MAX_COUNTERS = 1 << 20


class Op(enum.IntEnum):
    """Instruction classes. `first` / `count` / `arg` per class:

    QKV          rows [first, first + count) of w_qkv.L, RMSNorm(residual) * ln_in.L fused in      -> qkv
    ROPE         kv head `first`: q/k RMSNorm + RoPE of its q heads and k head, K/V write to the page -> q, kv.L
    ATTN_PARTIAL kv head `first`, context split `arg` of `count` splits: partial softmax over the split  -> partials
    ATTN_REDUCE  kv head `first`: combine its `count` splits for its q heads                        -> attn_out
    O_PROJ       rows [first, first + count) of w_o.L, residual added; `arg` 1: each row split across
                 the block's warps (schedule.ARG_ROW_SPLIT, where the kernel can), 0: whole rows  -> residual
    GATE_UP      act rows [first, first + count): gate and up rows of w_gate_up.L, RMSNorm(residual) *
                 ln_post.L fused in, SwiGLU epilogue                                               -> act
    DOWN         rows [first, first + count) of w_down.L, residual added; `arg` as O_PROJ's        -> residual
    LM_HEAD      vocab rows [first, first + count) of the lm_head, final RMSNorm fused in, the tile's
                 argmax (value, index) into slot `arg`                                             -> logits, argmax partials
    ARGMAX       reduce the `count` argmax partials (ties: the smallest index)                      -> next_token
    NOP          nothing: its wait and its signal only (a timing ablation's stand-in for a removed
                 instruction; the step's outputs are then meaningless)
    ATTN         kv head `first`, context split `arg` of `count` splits: ROPE, ATTN_PARTIAL and ATTN_REDUCE in
                 one instruction. Every split ropes the group's q heads into its shared memory; the split holding
                 token seq_len - 1 also writes that token's K / V; then its partial; then a TICKET,
                 counters[signal_counter + 1 + first] += 1, and the split that draws count - 1 combines all
                 `count` partials                                                       -> kv.L, partials, attn_out
                 The ticket counters are scratch: no instruction signals or waits on them, and the `count` ATTN
                 instructions of one ticket are splits 0 .. count - 1 of one (layer, kv head), each once.
    """

    QKV = 1
    ROPE = 2
    ATTN_PARTIAL = 3
    ATTN_REDUCE = 4
    O_PROJ = 5
    GATE_UP = 6
    DOWN = 7
    LM_HEAD = 8
    ARGMAX = 9
    NOP = 10
    ATTN = 11


class TableError(ValueError):
    """A table (packed words, or instructions and queues) that the kernel must not run: the message names the
    word or the instruction and what is wrong."""


@dataclass(frozen=True)
class Instr:
    """One instruction (see `Op` for the fields per class). `wait_counter` NO_COUNTER: no wait."""

    op: Op
    layer: int
    first: int
    count: int
    wait_counter: int
    wait_target: int
    signal_counter: int
    arg: int = 0

    @property
    def ticket(self) -> int | None:
        """An ATTN instruction's ticket counter, signal_counter + 1 + first (its kv head); None for other classes.
        The kernel derives it the same way (kernels-src/persistent_decode.cu, case kAttn)."""
        return self.signal_counter + 1 + self.first if self.op == Op.ATTN else None

    def words(self) -> tuple[int, ...]:
        return (int(self.op), self.layer, self.first, self.count, self.wait_counter, self.wait_target,
                self.signal_counter, self.arg)


@dataclass(frozen=True)
class Table:
    """Instructions (global order: every wait is on counters signalled by earlier instructions only) and, per
    queue (kernel block), the indices of the instructions it runs, in order. `num_counters`: counters the
    instructions name; `flags`: FLAG_* bits for the kernel (header word 10)."""

    instrs: tuple[Instr, ...]
    queues: tuple[tuple[int, ...], ...]
    num_counters: int
    flags: int = 0

    def pack(self) -> bytes:
        """The device table (little-endian u32 words, module docstring). Raises TableError when `check()` does."""
        self.check()
        n, q = len(self.instrs), len(self.queues)
        offsets_at = HEADER_WORDS
        entries_at = offsets_at + q + 1
        instrs_at = entries_at + n
        total = instrs_at + n * INSTR_WORDS
        header = [MAGIC, VERSION, n, q, self.num_counters, INSTR_WORDS, offsets_at, entries_at, instrs_at, total,
                  self.flags]
        header += [0] * (HEADER_WORDS - len(header))
        offsets = [0]
        for queue in self.queues:
            offsets.append(offsets[-1] + len(queue))
        entries = [i for queue in self.queues for i in queue]
        body = [w for instr in self.instrs for w in instr.words()]
        return struct.pack(f"<{total}I", *header, *offsets, *entries, *body)

    def check(self) -> None:
        """Refuse what the kernel could not run to completion: bad opcodes, counters out of range, a wait target
        other than the number of instructions that signal its counter (counters are monotone: a partial target
        would order nothing), a wait on a counter no earlier instruction fully signals, queues that do not hold
        every instruction exactly once, or that run an instruction before one it waits on in the same queue.
        Raises TableError naming the instruction. Whether the queues can deadlock across blocks is `simulate`'s
        question (simulate.py)."""
        n = len(self.instrs)
        if not 1 <= n <= MAX_INSTRUCTIONS:
            raise TableError(f"{n} instructions; a table holds 1..{MAX_INSTRUCTIONS}")
        if not 1 <= len(self.queues) <= MAX_QUEUES:
            raise TableError(f"{len(self.queues)} queues; a table holds 1..{MAX_QUEUES}")
        if not 1 <= self.num_counters <= MAX_COUNTERS:
            raise TableError(f"{self.num_counters} counters; a table names 1..{MAX_COUNTERS}")
        if self.flags & ~KNOWN_FLAGS or self.flags < 0:
            raise TableError(f"flags 0x{self.flags:x}: this version knows 0x{KNOWN_FLAGS:x} (FLAG_L2_PREFETCH, "
                             "FLAG_FENCES, FLAG_EVICT_FIRST, FLAG_TABLE_AHEAD)")
        signallers = [0] * self.num_counters
        last_signal = [-1] * self.num_counters
        for i, ins in enumerate(self.instrs):
            where = f"instruction {i} ({_name(ins.op)})"
            if ins.op not in Op.__members__.values():
                raise TableError(f"{where}: unknown opcode {int(ins.op)}")
            for field, value in (("layer", ins.layer), ("first", ins.first), ("count", ins.count), ("arg", ins.arg),
                                 ("wait_target", ins.wait_target)):
                if not 0 <= value <= U32_MAX:
                    raise TableError(f"{where}: {field} {value} does not fit a u32")
            if ins.op in (Op.O_PROJ, Op.DOWN) and ins.arg not in (0, 1):
                raise TableError(f"{where}: arg {ins.arg}; O_PROJ / DOWN take 0 (whole rows) or 1 (the row split)")
            if not 0 <= ins.signal_counter < self.num_counters:
                raise TableError(f"{where}: signals counter {ins.signal_counter}, past the {self.num_counters} counters")
            if ins.wait_counter != NO_COUNTER and not 0 <= ins.wait_counter < self.num_counters:
                raise TableError(f"{where}: waits on counter {ins.wait_counter}, past the {self.num_counters} counters")
            signallers[ins.signal_counter] += 1
            last_signal[ins.signal_counter] = i
        for i, ins in enumerate(self.instrs):
            if ins.wait_counter == NO_COUNTER:
                continue
            c = ins.wait_counter
            where = f"instruction {i} ({_name(ins.op)}) waits on counter {c}"
            if ins.wait_target != signallers[c]:
                raise TableError(f"{where} reaching {ins.wait_target}, but {signallers[c]} instruction(s) signal it; "
                                 "the target must be all of them")
            if last_signal[c] >= i:
                raise TableError(f"{where}, which instruction {last_signal[c]} (not earlier in the table) signals")
        seen = [False] * n
        for qi, queue in enumerate(self.queues):
            for pos, index in enumerate(queue):
                if not 0 <= index < n:
                    raise TableError(f"queue {qi} entry {pos}: instruction {index} does not exist ({n} instructions)")
                if seen[index]:
                    raise TableError(f"queue {qi} entry {pos}: instruction {index} is queued twice")
                seen[index] = True
                if pos and queue[pos - 1] > index:
                    raise TableError(f"queue {qi} runs instruction {queue[pos - 1]} before {index}; a queue runs "
                                     "instructions in table order")
        missing = [i for i, s in enumerate(seen) if not s]
        if missing:
            raise TableError(f"instruction {missing[0]} is in no queue ({len(missing)} unqueued)")
        self._check_tickets(signallers)

    def _check_tickets(self, signallers: list[int]) -> None:
        """ATTN's tickets (Op.ATTN): in range, never a signal or wait counter, and each ticket's instructions
        exactly the splits 0 .. count - 1 of one (layer, kv head): else no block is last and attn_out stays stale."""
        waited = {ins.wait_counter for ins in self.instrs if ins.wait_counter != NO_COUNTER}
        cohorts: dict[int, list[tuple[int, Instr]]] = {}
        for i, ins in enumerate(self.instrs):
            ticket = ins.ticket
            if ticket is None:
                continue
            where = f"instruction {i} (ATTN)"
            if ticket >= self.num_counters:
                raise TableError(f"{where}: its ticket counter {ticket} (signal {ins.signal_counter} + 1 + kv head "
                                 f"{ins.first}) is past the {self.num_counters} counters")
            if signallers[ticket] or ticket in waited:
                raise TableError(f"{where}: its ticket counter {ticket} is also a signal or wait counter")
            cohorts.setdefault(ticket, []).append((i, ins))
        for ticket, members in cohorts.items():
            i0, head = members[0]
            splits = sorted(ins.arg for _, ins in members)  # as many as the table holds: linear in its size
            for i, ins in members:
                if (ins.layer, ins.first, ins.count) != (head.layer, head.first, head.count):
                    raise TableError(f"instruction {i} (ATTN) shares ticket {ticket} with instruction {i0} but is "
                                     f"(layer {ins.layer}, kv head {ins.first}, {ins.count} splits), not (layer "
                                     f"{head.layer}, kv head {head.first}, {head.count} splits)")
            if len(splits) != head.count or splits != list(range(len(splits))):  # never a list of `count` (a u32)
                raise TableError(f"ticket {ticket} (instruction {i0}, ATTN): its splits are {splits[:8]}"
                                 f"{' ...' if len(splits) > 8 else ''}; it needs each of 0 .. {head.count - 1} once")


def _name(op: object) -> str:
    try:
        return Op(op).name
    except ValueError:
        return f"opcode {op}"


def unpack(data: bytes | bytearray | memoryview) -> Table:
    """The Table a packed device table holds, refusing a hostile one in time and memory linear in its size:
    a short or misaligned buffer, a bad magic, version or instruction size, counts past the MAX_* bounds, section
    offsets that are not the packed layout, and everything `Table.check` refuses. Raises TableError."""
    raw = bytes(data)
    if len(raw) % 4:
        raise TableError(f"{len(raw)} bytes: a table is whole u32 words")
    words = len(raw) // 4
    if words < HEADER_WORDS:
        raise TableError(f"{words} words: shorter than the {HEADER_WORDS}-word header")
    head = struct.unpack_from(f"<{HEADER_WORDS}I", raw)
    magic, version, n, q, counters, iw, offsets_at, entries_at, instrs_at, total = head[:10]
    if magic != MAGIC:
        raise TableError(f"word 0 is 0x{magic:08x}, not the table magic 0x{MAGIC:08x}")
    if version != VERSION:
        raise TableError(f"version {version}; this reader knows {VERSION}")
    if iw != INSTR_WORDS:
        raise TableError(f"instructions of {iw} words; version {VERSION} has {INSTR_WORDS}")
    if not 1 <= n <= MAX_INSTRUCTIONS or not 1 <= q <= MAX_QUEUES or not 1 <= counters <= MAX_COUNTERS:
        raise TableError(f"header counts {n} instructions, {q} queues, {counters} counters: outside 1..{MAX_INSTRUCTIONS}"
                         f", 1..{MAX_QUEUES}, 1..{MAX_COUNTERS}")
    want = (HEADER_WORDS, HEADER_WORDS + q + 1, HEADER_WORDS + q + 1 + n, HEADER_WORDS + q + 1 + n + n * INSTR_WORDS)
    if (offsets_at, entries_at, instrs_at, total) != want or total != words or any(head[11:]):
        raise TableError(f"section offsets {[offsets_at, entries_at, instrs_at, total]} (of {words} words) are not "
                         f"the packed layout {list(want)}, or reserved header words are set")
    body = struct.unpack_from(f"<{words - HEADER_WORDS}I", raw, HEADER_WORDS * 4)
    offsets = body[: q + 1]
    if offsets[0] != 0 or offsets[-1] != n or any(a > b for a, b in zip(offsets, offsets[1:])):
        raise TableError(f"queue offsets must rise from 0 to {n}; got {offsets[0]} .. {offsets[-1]}")
    entries = body[q + 1: q + 1 + n]
    queues = tuple(tuple(entries[offsets[i]: offsets[i + 1]]) for i in range(q))
    flat = body[q + 1 + n:]
    instrs = []
    for i in range(n):
        w = flat[i * INSTR_WORDS: (i + 1) * INSTR_WORDS]
        if w[0] not in Op.__members__.values():
            raise TableError(f"instruction {i}: unknown opcode {w[0]}")
        instrs.append(Instr(Op(w[0]), *w[1:]))
    table = Table(tuple(instrs), queues, counters, head[10])
    table.check()
    return table
