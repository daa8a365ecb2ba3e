"""A deterministic CPU engine for tests: a simulated KV store, tokens that depend on every cached token.

`FakeEngine` stores one int per position (the token id fed there) in a dict of device pages, executes
kern_pool's plans on it (it is `memory.PoolMemory`'s executor: page copies, host copies to a dict of host
pages), and makes each decode row's token a hash of the token ids it reads back through the row's block
table at positions 0..position. So a row whose pages hold the wrong K/V (a bad prefix reuse, a page shared
by mistake, a wake that did not restore a page) produces other tokens, and "same output alone and under load"
tests the scheduler's memory handling, not only its bookkeeping.

With `samples` (the default) a sampled row (temperature > 0) mixes its seed and position into the hash, so a
seeded request gives the same tokens whatever its neighbours, and its logprobs and top logprobs are made-up
but deterministic functions of the same hash (`Sampled`). It also checks the rows protocol: a row whose
request changed must carry the request's history, and that history must equal the ids its pages hold.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import kern_pool

from .engine import DecodeRow, PrefillChunk, Sampled, decode_bucket
from .sampling import SamplingParams


class EngineFailure(RuntimeError):
    """What `FakeEngine` raises when told to fail a step (`fail_steps`)."""


@dataclass
class FakeEngine:
    """`engine.Engine` on the CPU. `vocab`: tokens are 0..vocab-1; `eos_id`: the token the hash maps to when it
    lands on 0 mod `eos_every` (0: never), so some requests stop early; `step_s`: seconds each decode sleeps;
    `fail_steps`: decode calls (1-based) that raise EngineFailure."""

    max_seqs: int = 4
    page_tokens: int = 4
    chunk_tokens: int = 8
    max_context: int = 256
    samples: bool = True
    batch_invariant_prefill: bool = False
    vocab: int = 1000
    eos_id: int = 999
    eos_every: int = 0
    step_s: float = 0.0
    fail_steps: frozenset[int] = frozenset()
    pages: dict[int, list[int]] = field(default_factory=dict)
    host_pages: dict[int, list[int]] = field(default_factory=dict)
    decode_calls: int = 0
    prefill_calls: int = 0
    rows_seen: list[int] = field(default_factory=list)  # rows per decode call
    buckets: list[int] = field(default_factory=list)  # the bucket of each decode call (its highest row + 1)
    histories: int = 0  # decode rows that carried a history
    row_reqs: dict[int, int] = field(default_factory=dict)  # row -> the request it last decoded
    aheads: list[bool] = field(default_factory=list)  # the `ahead` hint of each decode call (it computes alike)
    ahead_used: int = 0  # it never enqueues ahead (engine.Engine)
    ahead_dropped: int = 0

    # ---------------------------------------------------------------- plan executor

    def _page(self, page_id: int) -> list[int]:
        return self.pages.setdefault(page_id, [-1] * self.page_tokens)

    def run(self, copies: kern_pool.Copies) -> None:
        for page_id in copies.zero_pages:
            self.pages[page_id] = [-1] * self.page_tokens
        for c in copies.page_copies:
            self.pages[c.dst_page_id] = list(self._page(c.src_page_id))

    def host_copies(self, copies: kern_pool.HostCopies) -> None:
        for c in copies.page_copies:
            if copies.direction == "park":
                self.host_pages[c.dst_page_id] = list(self._page(c.src_page_id))
            else:
                self.pages[c.dst_page_id] = list(self.host_pages[c.src_page_id])

    # ---------------------------------------------------------------- the engine

    def _write(self, page_ids: Sequence[int], position: int, token_id: int) -> None:
        self._page(page_ids[position // self.page_tokens])[position % self.page_tokens] = token_id

    def _read(self, page_ids: Sequence[int], position: int) -> int:
        return self._page(page_ids[position // self.page_tokens])[position % self.page_tokens]

    def prefill(self, chunk: PrefillChunk) -> None:
        assert chunk.token_ids and len(chunk.token_ids) <= self.chunk_tokens, chunk
        self.prefill_calls += 1
        for i, token_id in enumerate(chunk.token_ids):
            self._write(chunk.page_ids, chunk.start + i, token_id)

    def decode(self, rows: Sequence[DecodeRow], ahead: bool = False) -> list[Sampled]:
        assert 1 <= len(rows) <= self.max_seqs and len({r.row for r in rows}) == len(rows), rows
        assert all(0 <= r.row < self.max_seqs for r in rows), [r.row for r in rows]
        self.decode_calls += 1
        self.aheads.append(ahead)
        self.rows_seen.append(len(rows))
        self.buckets.append(decode_bucket(max(r.row for r in rows) + 1, self.max_seqs))
        if self.step_s:
            time.sleep(self.step_s)
        if self.decode_calls in self.fail_steps:
            raise EngineFailure(f"fake engine: step {self.decode_calls} failed (as told)")
        out = []
        for r in rows:
            self._write(r.page_ids, r.position, r.token_id)
            ids = [self._read(r.page_ids, p) for p in range(r.position + 1)]
            if r.history is not None:
                assert list(r.history) == ids, (r.req_id, "the history is not what the pages hold")
                self.histories += 1
            else:
                assert self.row_reqs.get(r.row) == r.req_id, (r.row, r.req_id, "a new request without history")
            self.row_reqs[r.row] = r.req_id
            out.append(self.sample(ids, r.sampling))
        return out

    def _hash(self, ids: Sequence[int]) -> int:
        h = 0
        for token_id in ids:
            h = (h * 1_000_003 + token_id + 1) % (1 << 61)
        return h

    def _token(self, h: int) -> int:
        if self.eos_every and h % self.eos_every == 0:
            return self.eos_id
        return h % (self.vocab - 1)

    def sample(self, ids: Sequence[int], sampling: SamplingParams | None = None) -> Sampled:
        """What this engine produces after the sequence `ids` with `sampling` (None: greedy)."""
        h = self._hash(ids)
        if sampling is not None and not sampling.greedy and self.samples:
            assert sampling.seed is not None, "a sampled row without a seed (the scheduler resolves it)"
            h = (h * 6_364_136_223_846_793_005 + sampling.seed * 1_442_695_040_888_963_407 + len(ids)) % (1 << 61)
        token = self._token(h)
        if sampling is None or not sampling.logprobs:
            return Sampled(token)
        logprob = -((h >> 11) % 4000) / 1000.0
        top = tuple(((token + k) % (self.vocab - 1), logprob - 0.25 * k) for k in range(sampling.top_logprobs))
        return Sampled(token, logprob, top)

    def next_token(self, ids: Sequence[int], sampling: SamplingParams | None = None) -> int:
        """The token this engine produces after the sequence `ids` (the reference for tests)."""
        return self.sample(ids, sampling).token_id

    def reference(self, prompt: Sequence[int], max_tokens: int, stop_ids: frozenset[int] = frozenset(),
                  sampling: SamplingParams | None = None) -> list[int]:
        """The tokens a request generates run alone (what the scheduler must reproduce under any load); a sampled
        `sampling` must carry its seed."""
        return [s.token_id for s in self.reference_sampled(prompt, max_tokens, stop_ids, sampling)]

    def reference_sampled(self, prompt: Sequence[int], max_tokens: int, stop_ids: frozenset[int] = frozenset(),
                          sampling: SamplingParams | None = None) -> list[Sampled]:
        """`reference` with each token's `Sampled` (logprobs as the request asked)."""
        ids = list(prompt)
        out: list[Sampled] = []
        budget = min(max_tokens, self.max_context - len(prompt) + 1)
        while len(out) < budget:
            s = self.sample(ids, sampling)
            out.append(s)
            ids.append(s.token_id)
            if s.token_id in stop_ids:
                break
        return out
