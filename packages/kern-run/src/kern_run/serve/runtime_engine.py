"""The real engine over today's runtime: one sequence per step (`max_seqs` 1), greedy argmax on the GPU.

It drives a loaded `Generator`'s runtime through the caller contract (docs/caller.md), exactly as
`Generator.prefill` / its synchronous decode loop do, but with the pages the scheduler leased (engine.py):

    prefill chunk [start, stop) (L tokens):  token_ids[:L], positions[:L] = start..stop-1,
        slot_mapping[:L] = slot(start..stop-1), seq_lens = [stop], cu_seqlens_q = [0, L]; issue prefill
    decode at position p with token t:       token_ids = [t], positions = [p], slot_mapping = [slot(p)],
        seq_lens = [p + 1]; issue decode (its CUDA graph unless eager); read next_token (8 bytes, synchronises)

The block-table row is written when the row's page ids change (padded with its last page id, as the Generator
does). Each decode step synchronises (no pipelining of steps ahead as `kern run` does), so its TPOT is a few
microseconds of host work above `kern run`'s. Sampling: greedy only (`samples` False: the HTTP layer refuses
other parameters with a 400 until issue 26 lands batched decode and GPU sampling).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..generate import slot_mapping
from ..sampling import packed_token
from .engine import DecodeRow, PrefillChunk
from .errors import ConfigError
from .sampling import greedy_only_fault


class RuntimeEngine:
    """`engine.Engine` over `gen` (a `kern_run.generate.Generator`: its runtime, manifest facts, eager flag).

    `chunk_tokens`: the prefill chunk (the target's, at most the manifest's tokens var). Raises ConfigError
    for a chunk outside [1, tokens_max]."""

    max_seqs = 1
    samples = False

    def __init__(self, gen: Any, chunk_tokens: int, eager: bool = False) -> None:
        facts = gen.facts
        if not 1 <= chunk_tokens <= facts.tokens_max:
            raise ConfigError(f"chunk {chunk_tokens} outside the manifest's tokens var [1, {facts.tokens_max}]")
        self.gen = gen
        self.rt = gen.rt
        self.facts = facts
        self.page_tokens = int(gen.page_tokens)
        self.chunk_tokens = chunk_tokens
        self.max_context = int(gen.max_positions)
        self.batch_invariant_prefill = bool(facts.prefill_batch_invariant)
        self.eager = eager
        self._table: tuple[int, ...] | None = None

    def _block_table(self, page_ids: tuple[int, ...]) -> None:
        if page_ids == self._table:
            return
        row = np.full(self.facts.pages_per_seq, page_ids[-1], dtype=np.int32)  # i32[pages_per_seq]
        row[:len(page_ids)] = page_ids  # padding past the sequence: never read
        self.rt.write_input("block_table", row.reshape(1, -1))
        self._table = page_ids

    def _slots(self, page_ids: tuple[int, ...], start: int, stop: int) -> np.ndarray:
        return slot_mapping(page_ids, self.page_tokens, start, stop)  # i32[L]

    def prefill(self, chunk: PrefillChunk) -> None:
        length = len(chunk.token_ids)
        assert 1 <= length <= self.chunk_tokens, (length, self.chunk_tokens)  # the scheduler cuts chunks
        self._block_table(chunk.page_ids)
        self.rt.write_input("token_ids", np.asarray(chunk.token_ids, dtype=np.int32))  # i32[L]
        self.rt.write_input("positions", np.arange(chunk.start, chunk.stop, dtype=np.int32))  # i32[L]
        self.rt.write_input("slot_mapping", self._slots(chunk.page_ids, chunk.start, chunk.stop))
        self.rt.write_input("seq_lens", np.asarray([chunk.stop], dtype=np.int32))
        self.rt.write_input("cu_seqlens_q", np.asarray([0, length], dtype=np.int32))
        self.rt.issue("prefill", {"tokens": length, "seqs": 1})

    def decode(self, rows: Sequence[DecodeRow]) -> list[int]:
        assert len(rows) == 1, len(rows)  # max_seqs 1
        r = rows[0]
        assert greedy_only_fault(r.sampling) is None, r.sampling  # the HTTP layer refuses the rest
        self._block_table(r.page_ids)
        self.rt.write_input("token_ids", np.asarray([r.token_id], dtype=np.int32))
        self.rt.write_input("positions", np.asarray([r.position], dtype=np.int32))
        self.rt.write_input("slot_mapping", self._slots(r.page_ids, r.position, r.position + 1))
        self.rt.write_input("seq_lens", np.asarray([r.position + 1], dtype=np.int32))
        self.rt.issue("decode", {"tokens": 1, "seqs": 1}, eager=self.eager)
        return [packed_token(self.rt.read_output("next_token")[0])]  # i64[1] (token | logprob bits << 32)
