"""The all-reduce ops of tensor-parallel manifests: kern's one-shot all-reduce over peer memory for small messages
(kernels-src/allreduce.cu, docs/runtime.md "One-shot all-reduce"), NCCL for large ones.

Buffers (every rank alike):

    ar         u64[words]  workspace, export: flags u64[size][blocks], epochs u64[blocks], failed u64[1], then at
                           `data_offset` the slots bf16[2][size][capacity] (the kernel's layout)
    ar_peers   u64[size]   peer table of `ar` in group `tp` (filled at connect)
    ar_status  i32[4]      output, placement host: {0 ok | 1 timeout | 2 refused arguments, ...}; the caller zeroes
                           it before the first step and reads it after steps (meta.tp.allreduce.status)

    ag         u64[words]  the all-gather's workspace (vocabulary-parallel lm_head), the layout of `ar` with slots
                           of `capacity` = seqs_max x slice elements
    ag_peers   u64[size]   peer table of `ag` in group `tp`

Ops: `allreduce(x, count, peers, status)` in place, one-shot for `tokens` up to `oneshot_tokens` and
`nccl_allreduce_bf16` above (a `when` split on tokens); `allreduce_add(x, residual, count, peers, status)`:
residual += the sum of every rank's x, one-shot (the GEMV decode's row-parallel o / down, one row). Without any
one-shot message (`--allreduce-oneshot-bytes` below one row): `allreduce(x, count)` on NCCL alone, and the GEMV
decode adds the residual with `add_rmsnorm` after it (tp.py). `allgather(x, out, rows, peers, status)`: the
vocabulary-parallel lm_head's gather of every rank's logits slice x [rows, slice] into out [rows, vocab]
(kern_allgather_bf16, one-shot at every row count; its status words are `ar_status`, declared by whichever op
needs them first). No NCCL fallback: nccl_allgather_bf16 lands rank-major ([size][rows][slice]), not the
[rows][vocab] the sampler reads, and a rank's window is not its owned columns when vocab is not size x slice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import ManifestBuildError
from .builder import Builder, int_arg, ptr

BUFFER, PEERS, STATUS = "ar", "ar_peers", "ar_status"
GATHER_BUFFER, GATHER_PEERS = "ag", "ag_peers"
SUM_ENTRY, ADD_ENTRY, GATHER_ENTRY = "kern_allreduce_bf16", "kern_allreduce_add_bf16", "kern_allgather_bf16"
GATHER_BLOCKS = 32  # the all-gather's grid: a decode row's slice is 2 x 38-76K elements at 8B-14B, 2-5 passes
THREADS = 256  # threads per block: 256 x 16 bytes = 4 KiB of a partial per pass
DATA_ALIGN = 256
MAX_BLOCKS = 64
MAX_GROUP = 32  # one flag thread per member (<= THREADS)


@dataclass(frozen=True)
class OneShot:
    """The one-shot all-reduce of a group: `size` ranks, slots of `capacity` bf16 elements (a multiple of 8), a grid
    of `blocks` (every launch on the buffer), a wait bound of `timeout_ns` per call."""

    group: str
    size: int
    capacity: int
    blocks: int
    timeout_ns: int

    @property
    def data_offset(self) -> int:
        """Byte offset of the slots in `ar`: after flags, epochs and `failed`, 256-aligned (ar_data_offset)."""
        words = (self.size + 1) * self.blocks + 1
        return -(-words * 8 // DATA_ALIGN) * DATA_ALIGN

    @property
    def buffer_bytes(self) -> int:
        return self.data_offset + 2 * self.size * self.capacity * 2


def oneshot_plan(group: str, size: int, hidden: int, chunk_max: int, threshold_bytes: int, blocks: int,
                 timeout_ms: int) -> tuple[OneShot | None, int]:
    """(the one-shot plan, or None when no message goes one-shot; the largest `tokens` whose all-reduce of
    tokens x hidden bf16 goes one-shot). One-shot messages are at most `threshold_bytes` (0: NCCL only). Raises
    ManifestBuildError naming the option for a negative threshold, a grid outside 1..MAX_BLOCKS, a timeout below
    1 ms, or (when something goes one-shot) a group above MAX_GROUP or a hidden size not a multiple of 8."""
    if threshold_bytes < 0:
        raise ManifestBuildError(f"allreduce_oneshot_bytes (--allreduce-oneshot-bytes) {threshold_bytes}: bytes >= 0 "
                                 "(0: NCCL for every all-reduce)")
    if not 1 <= blocks <= MAX_BLOCKS:
        raise ManifestBuildError(f"allreduce_blocks {blocks}: the one-shot all-reduce's grid must be 1..{MAX_BLOCKS}")
    if timeout_ms < 1:
        raise ManifestBuildError(f"allreduce_timeout_ms (--allreduce-timeout-ms) {timeout_ms}: at least 1 ms")
    tokens = min(chunk_max, threshold_bytes // (hidden * 2))
    if tokens == 0:
        return None, 0
    if size > MAX_GROUP:
        raise ManifestBuildError(f"--tp {size}: the one-shot all-reduce takes groups of at most {MAX_GROUP}; pass "
                                 "--allreduce-oneshot-bytes 0 (NCCL)")
    if hidden % 8:
        raise ManifestBuildError(f"hidden_size {hidden} is not a multiple of 8 (the one-shot all-reduce's vectors)")
    return OneShot(group, size, tokens * hidden, blocks, timeout_ms * 1_000_000), tokens


def add_buffers(b: Builder, plan: OneShot, buffer: str = BUFFER, peers: str = PEERS) -> None:
    """`buffer` (export), its peer table `peers` and, unless declared, the status words."""
    b.buffer(buffer, "workspace", "u64", [plan.buffer_bytes // 8], export=True)
    b.buffer(peers, "workspace", "u64", [plan.size], peers={"of": buffer, "group": plan.group})
    if STATUS not in b.buffers:
        b.buffer(STATUS, "output", "i32", [4], placement="host")


@dataclass(frozen=True)
class VocabSplit:
    """The vocabulary-parallel lm_head of a group of `size` ranks over `vocab` logits: every rank computes `slice`
    lm_head rows (cdiv(vocab, size) rounded up to 8, so the windows and owned columns of a vocab that is a
    multiple of 8 stay 16-byte aligned); rank r owns the columns [min(r slice, vocab), min((r + 1) slice, vocab))
    and computes the rows of its window [w_r, w_r + slice), w_r = min(r slice, vocab - slice): the last rank's
    window ends at vocab (short in what it owns, overlapping its neighbour's window when vocab < size x slice),
    so no rank computes a row past the vocabulary and no padding logit exists (kern_allgather_bf16)."""

    size: int
    vocab: int
    slice: int

    def window(self, rank: int) -> int:
        return min(rank * self.slice, self.vocab - self.slice)

    def owned(self, rank: int) -> tuple[int, int]:
        return min(rank * self.slice, self.vocab), min((rank + 1) * self.slice, self.vocab)


def vocab_split(vocab: int, size: int) -> VocabSplit:
    """The split of `vocab` over `size` ranks. Raises ManifestBuildError when a rank would own no column (a
    vocabulary below about 8 x size) or the group exceeds MAX_GROUP."""
    if size > MAX_GROUP:
        raise ManifestBuildError(f"--tp {size}: the one-shot all-gather of the vocabulary-parallel lm_head takes "
                                 f"groups of at most {MAX_GROUP}; pass --tp-lm-head replicated")
    slice_ = (vocab + size - 1) // size  # cdiv(vocab, size) ...
    slice_ = (slice_ + 7) // 8 * 8  # ... rounded up to 8
    if slice_ > vocab or (size - 1) * slice_ >= vocab:
        raise ManifestBuildError(f"vocab_size {vocab} over --tp {size} in slices of {slice_} (cdiv rounded to 8) "
                                 "leaves the last rank no logits; pass --tp-lm-head replicated")
    return VocabSplit(size, vocab, slice_)


def add_allgather_op(b: Builder, group: str, split: VocabSplit, seqs_max: int, timeout_ms: int, pdl: bool) -> OneShot:
    """Declare `allgather(x, out, rows, peers, status)` (kern_allgather_bf16, grid GATHER_BLOCKS) with its buffers
    `ag` / `ag_peers` (and `ar_status` unless declared); the plan (capacity seqs_max x slice)."""
    plan = OneShot(group, split.size, seqs_max * split.slice, GATHER_BLOCKS, timeout_ms * 1_000_000)
    add_buffers(b, plan, GATHER_BUFFER, GATHER_PEERS)
    args = [{"arg": "peers"}, {"rank": group, "type": "i32"}, {"i32": plan.size}, {"arg": "x"}, {"arg": "out"},
            {"arg": "rows", "type": "i32"}, {"i32": split.vocab}, {"i32": split.slice}, {"i32": plan.capacity},
            {"i32": plan.blocks}, {"arg": "status"}, {"i64": plan.timeout_ns}]
    b.op("allgather", [ptr("x"), ptr("out"), int_arg("rows"), ptr("peers"), ptr("status")],
         [b.launch(GATHER_ENTRY, [plan.blocks, 1, 1], [THREADS, 1, 1], args, pdl=pdl)])
    return plan


def allgather_call(x: str, out: str, rows: str) -> dict[str, Any]:
    """A call of `allgather`: every rank's `x` [rows, slice] into `out` [rows, vocab]."""
    return {"op": "allgather", "args": {"x": x, "out": out, "rows": rows, "peers": GATHER_PEERS, "status": STATUS}}


def oneshot_launch(b: Builder, plan: OneShot, entry: str, out: str, pdl: bool) -> dict[str, Any]:
    """One launch of `entry` (SUM_ENTRY or ADD_ENTRY) forwarding the op's `peers`, `x`, `out` (the sum's target,
    or ADD_ENTRY's residual), `count` and `status` arguments."""
    args = [{"arg": "peers"}, {"rank": plan.group, "type": "i32"}, {"i32": plan.size}, {"arg": "x"}, {"arg": out},
            {"arg": "count", "type": "i32"}, {"i32": plan.capacity}, {"i32": plan.blocks}, {"arg": "status"},
            {"i64": plan.timeout_ns}]
    return b.launch(entry, [plan.blocks, 1, 1], [THREADS, 1, 1], args, pdl=pdl)


def _nccl_launch(group: str, **extra: Any) -> dict[str, Any]:
    return {"extern": "nccl_allreduce_bf16",
            "args": [{"arg": "x"}, {"arg": "x"}, {"arg": "count", "type": "i64"}, {"rank": group}], **extra}


def add_allreduce_ops(b: Builder, plan: OneShot | None, group: str, oneshot_tokens: int, chunk_max: int,
                      with_add: bool, pdl: bool) -> None:
    """Declare `allreduce` (and, with a plan, `allreduce_add` when `with_add`). Without a plan: `allreduce(x,
    count)` on NCCL alone. With one: its buffers, and `allreduce(x, count, peers, status)` one-shot for tokens
    1..oneshot_tokens, NCCL above."""
    if plan is None:
        b.op("allreduce", [ptr("x"), int_arg("count")], [_nccl_launch(group)])
        return
    add_buffers(b, plan)
    iface = [ptr("x"), int_arg("count"), ptr("peers"), ptr("status")]
    if oneshot_tokens >= chunk_max:
        launches = [oneshot_launch(b, plan, SUM_ENTRY, "x", pdl)]
    elif oneshot_tokens == 0:
        launches = [_nccl_launch(group)]
    else:
        launches = [{**oneshot_launch(b, plan, SUM_ENTRY, "x", pdl), "when": {"tokens": [1, oneshot_tokens]}},
                    _nccl_launch(group, when={"tokens": [oneshot_tokens + 1, chunk_max]})]
    b.op("allreduce", iface, launches)
    if with_add:
        b.op("allreduce_add", [ptr("x"), ptr("residual"), int_arg("count"), ptr("peers"), ptr("status")],
             [oneshot_launch(b, plan, ADD_ENTRY, "residual", pdl)])


def allreduce_call(x: str, count: str, plan: OneShot | None) -> dict[str, Any]:
    """A call of `allreduce` on buffer `x` (`count` elements, a var expression)."""
    args: dict[str, Any] = {"x": x, "count": count}
    if plan is not None:
        args.update(peers=PEERS, status=STATUS)
    return {"op": "allreduce", "args": args}


def allreduce_add_call(x: str, residual: str, count: str) -> dict[str, Any]:
    """residual += the all-reduced x (one-shot)."""
    return {"op": "allreduce_add", "args": {"x": x, "residual": residual, "count": count, "peers": PEERS,
                                            "status": STATUS}}


def meta(plan: OneShot | None, oneshot_tokens: int, threshold_bytes: int) -> dict[str, Any]:
    """meta.tp.allreduce: where the caller finds the status word, and what goes one-shot."""
    if plan is None:
        return {"oneshot_bytes": 0}
    return {"oneshot_bytes": threshold_bytes, "oneshot_tokens": oneshot_tokens, "status": STATUS,
            "blocks": plan.blocks, "capacity": plan.capacity, "timeout_ns": plan.timeout_ns}
