"""The engine the scheduler drives: prefill one chunk of one row, decode one step of a set of rows.

The scheduler (scheduler.py) decides; the engine executes on the device. Every call carries what the device
needs explicitly (positions, token ids, the row's block-table page ids, its sampling parameters, and the
request's ids when it is newly placed in a row), so an engine keeps no per-request state beyond what it
chooses to cache (the block-table rows, sampling parameters and histories it last wrote).

Rows and buckets: a decode step carries rows 0..max_seqs-1 (the scheduler's `row`, stable while a request
holds it). The device runs the step at a bucket, the smallest of 1, 2, 4, ..., seqs_max holding the highest
live row (`decode_bucket`); rows of the bucket that no request holds are padding (docs/serve.md "Rows and
buckets"). So the scheduler keeps live rows low (scheduler.py "Rows").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

from .sampling import SamplingParams


def decode_bucket(rows: int, seqs_max: int) -> int:
    """The bucket a decode step with `rows` rows (its highest live row + 1) runs at: the smallest power of two
    >= `rows`, capped at `seqs_max` (the manifest's `seqs` var max; a graph is captured per bucket). Raises
    ValueError for `rows` outside 1..seqs_max."""
    if not 1 <= rows <= seqs_max:
        raise ValueError(f"decode step of {rows} rows: expected 1..{seqs_max} (the manifest's seqs var max)")
    bucket = 1
    while bucket < rows:
        bucket *= 2
    return min(bucket, seqs_max)


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
    token from the logits with `sampling`. `page_ids` cover positions 0..position.

    `history`: the request's ids so far (its prompt, then the tokens generated, ending with `token_id`:
    `position + 1` ids) when the request is newly placed in row `row` (admitted, readmitted after a
    preemption, or moved by the scheduler's row compaction); None while it stays in the row it held at its
    previous decode row. An engine with GPU penalties seeds the row's token history from it."""

    req_id: int
    row: int
    position: int
    token_id: int
    page_ids: tuple[int, ...]
    sampling: SamplingParams
    history: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Sampled:
    """What a decode row produced: `token_id`; `logprob` (the sampler's log-probability of it, natural log)
    when the row asked (`sampling.logprobs`), else None; `top_logprobs`: the row's `sampling.top_logprobs`
    most probable (token id, logprob) pairs, most probable first (empty unless asked)."""

    token_id: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@runtime_checkable
class Engine(Protocol):
    """What the scheduler thread needs from the device side.

    `max_seqs`: rows one decode step carries (1 for a manifest without batched decode). `page_tokens`: the KV
    page size (tokens). `chunk_tokens`: the largest prefill chunk (the manifest's tokens var, or the target's
    chunk). `max_context`: positions one sequence may hold (the manifest's context, capped by the pool).
    `samples`: whether decode honours non-greedy `SamplingParams` and logprobs (False: greedy argmax only; the
    HTTP layer refuses the rest with a 400). `batch_invariant_prefill`: a token's K/V do not depend on the chunk
    that computed it, so a cached prefix is reused at any length (else at multiples of `chunk_tokens`).

    `prefill(chunk)`: enqueue one chunk. `decode(rows, ahead)`: one step over `rows` (distinct rows in
    0..max_seqs-1, at most `max_seqs`), returning one `Sampled` per row in order once its tokens are read. `ahead`:
    the scheduler expects the next step to carry the same rows one position on (`Scheduler.steady`), so the engine
    may enqueue that step before reading this one and answer the next call from it where it matches (a hint: the
    results are the same either way; RuntimeEngine, ahead.py). `ahead_used` / `ahead_dropped`: steps enqueued ahead
    that answered the next call / that it did not match (cumulative; /metrics). Any exception fails the step's
    requests (the server logs it and reports itself unhealthy)."""

    max_seqs: int
    page_tokens: int
    chunk_tokens: int
    max_context: int
    samples: bool
    batch_invariant_prefill: bool
    ahead_used: int
    ahead_dropped: int

    def prefill(self, chunk: PrefillChunk) -> None: ...

    def decode(self, rows: Sequence[DecodeRow], ahead: bool = False) -> list[Sampled]: ...
