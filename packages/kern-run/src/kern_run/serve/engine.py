"""The engine the scheduler drives: prefill one chunk of one row, decode one step of a set of rows.

The scheduler (scheduler.py) decides; the engine executes on the device. Every call carries what the device
needs explicitly (positions, token ids, the row's block-table page ids, its sampling parameters), so an engine
keeps no per-request state beyond what it chooses to cache (e.g. the last block-table row it wrote).

Today's runtime carries one sequence per step (`max_seqs` 1) and samples greedily (runtime_engine.py). The
batched engine of issue 26 implements the same protocol with `max_seqs` up to 64 and `samples` True.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

from .sampling import SamplingParams


@dataclass(frozen=True)
class PrefillChunk:
    """Write the K/V of `token_ids` at positions `start .. start + len(token_ids) - 1` of row `row`.

    `page_ids`: the row's block-table row (page i holds positions [i * page_tokens, (i + 1) * page_tokens)),
    covering at least `start + len(token_ids)` positions. Produces no token."""

    req_id: int
    row: int
    start: int
    token_ids: tuple[int, ...]
    page_ids: tuple[int, ...]

    @property
    def stop(self) -> int:
        return self.start + len(self.token_ids)


@dataclass(frozen=True)
class DecodeRow:
    """One row of a decode step: feed `token_id` at `position` (its K/V is written there) and sample the next
    token from the logits with `sampling`. `page_ids` cover positions 0..position."""

    req_id: int
    row: int
    position: int
    token_id: int
    page_ids: tuple[int, ...]
    sampling: SamplingParams


@runtime_checkable
class Engine(Protocol):
    """What the scheduler thread needs from the device side.

    `max_seqs`: rows one decode step carries (1 today). `page_tokens`: the KV page size (tokens).
    `chunk_tokens`: the largest prefill chunk (the manifest's tokens var, or the target's chunk).
    `max_context`: positions one sequence may hold (the manifest's context, capped by the pool).
    `samples`: whether decode honours non-greedy `SamplingParams` (False: greedy argmax only; the HTTP layer
    refuses the rest with a 400). `batch_invariant_prefill`: a token's K/V do not depend on the chunk that
    computed it, so a cached prefix is reused at any length (else at multiples of `chunk_tokens`).

    `prefill(chunk)`: enqueue one chunk. `decode(rows)`: one step over `rows` (distinct rows, at most
    `max_seqs`), returning one token id per row in order; it synchronises. Any exception fails the step's
    requests (the server logs it and reports itself unhealthy)."""

    max_seqs: int
    page_tokens: int
    chunk_tokens: int
    max_context: int
    samples: bool
    batch_invariant_prefill: bool

    def prefill(self, chunk: PrefillChunk) -> None: ...

    def decode(self, rows: Sequence[DecodeRow]) -> list[int]: ...
