"""Batched decode: many prompts prefilled one at a time, then decoded together, one row per prompt.

`BatchDecoder(gen, ...).run(requests, on_token, on_finish)` (docs/caller.md "Batched decode"):

1. **Waves.** Requests are admitted in order, at most `max_rows` at a time (the largest bucket within the
   manifest's `seqs` max). Each admitted row gets a lease of `n + budget` tokens (`batch_pages.BatchPages`:
   resumed from a cached prefix when there is a cache), is prefilled alone in chunks through `prefill`
   (block-table row 0, as a single sequence), and, with a cache, its prompt KV is filed right away so later
   rows share it. A row whose lease does not fit while other rows hold pages waits for the next wave.
2. **Segments.** The wave's live rows are decoded together: the bucket is the smallest of 1, 2, 4, ..., 64
   holding them (`bucket_for`), rows in admission order, padding rows after them (batch_inputs). The host
   writes every input once (tokens, positions, slots, seq_lens, block table, sampler params and history);
   then, with a `decode_advance` manifest and `DeviceSteps`, up to `lookahead + 1` steps stay queued, each
   row's next inputs written on the device, each step's token of row r read from the host-mapped ring at
   `ring[r, (position + 1) % ring_len]` after the event behind the step (8 bytes per row per step). Without
   them every step is written and read synchronously (`next_token`).
3. **Stops.** A row stops on its own: EOS (unless ignored), its budget (`max_new_tokens`, "steps"), the
   context ("context": the budget cut by the pool or the manifest's max context), or `on_token` answering
   True (a stop string: "stop"). A stopped row stays in the segment as a harmless row (its steps write KV only
   at positions its own lease holds; their tokens are dropped) until the segment ends: when the live rows fit
   a smaller bucket (compaction), or when the next step would take a stopped row past its lease. The segment
   then drains its queued steps (their tokens still count for the live rows) and a new one starts with only
   the live rows, re-packed from row 0 (positions, histories and the block table rewritten by the host).
   The synchronous loop (and the top-logprobs path, which issues the `top_logprobs` program after each step
   and reads it before the next) does this at every step, at no cost.

Rows are ragged: each has its own position, block-table row and seq_len. Sampling per row: params written
outside the graph at each segment start (a change never re-captures), seeds resolved at admission
(`sampling.resolve_seed`), the penalty history seeded with the prompt's ids.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .batch_inputs import History, RowInput, decode_inputs, step_inputs
from .batch_pages import BatchPages
from .errors import InputError
from .generate import Generator
from .sampler_meta import SamplerFacts, check_params
from .sampling import SamplingParams, resolve_seed, unpack_packed

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def max_rows(seqs_max: int) -> int:
    """Rows one wave decodes at most: the largest bucket within the manifest's `seqs` max (1 for seqs max 1)."""
    return max(b for b in BUCKETS if b <= max(seqs_max, 1))


def bucket_for(live: int, seqs_max: int) -> int:
    """The smallest bucket (1, 2, 4, ..., 64) holding `live` rows (1..max_rows(seqs_max)). Raises ValueError for a
    count outside that range."""
    top = max_rows(seqs_max)
    if not 1 <= live <= top:
        raise ValueError(f"{live} rows: a bucket holds 1..{top} (seqs max {seqs_max})")
    return next(b for b in BUCKETS if b >= live)


def buckets_upto(rows: int, seqs_max: int) -> tuple[int, ...]:
    """Every bucket a batch that starts with `rows` rows may use as its rows stop: bucket_for(rows) and the
    smaller ones (what the warm-up captures)."""
    top = bucket_for(min(max(rows, 1), max_rows(seqs_max)), seqs_max)
    return tuple(b for b in BUCKETS if b <= top)


def decode_rows_max(facts: Any) -> int:
    """Rows a decode call of this manifest can take: its `seqs` max, capped by its `tokens` max (a decode call
    runs tokens = seqs)."""
    return min(int(facts.manifest.vars["seqs"].max), int(facts.tokens_max))


@dataclass(frozen=True)
class RowRequest:
    """One prompt: its ids, at most `max_new_tokens` generated tokens, its `sampling` settings (validated;
    the seed is resolved at admission), and whether an EOS id ends it."""

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop_at_eos: bool = True


@dataclass(frozen=True)
class TokenInfo:
    """A generated token as `on_token` sees it: `logprob` (the sampler's, None without a sampler or unless
    asked) and `top` ((token id, logprob) best first, when top logprobs were asked)."""

    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] | None = None


@dataclass
class RowResult:
    """One prompt's outcome. `tokens`: generated ids (an EOS stop token included, as Generator.generate keeps
    it; the token completing a stop string included). `stop_reason`: "eos" | "steps" | "context" | "stop".
    `cached_tokens`: prompt positions resumed from the prefix cache; `prefill_tokens`: positions prefilled.
    `ttft_s`: the wave's first prefill issue -> this row's first token on the host. `sampling`: the settings the
    row ran with (its seed resolved)."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    stop_reason: str = ""
    cached_tokens: int = 0
    prefill_tokens: int = 0
    ttft_s: float = 0.0
    wave: int = 0
    token_s: list[float] = field(default_factory=list)  # time.perf_counter() as each token arrived


@dataclass
class BatchTimings:
    """The whole run: waves, decode steps issued per bucket, segments (host input writes), host seconds."""

    waves: int = 0
    segments: int = 0
    steps: dict[int, int] = field(default_factory=dict)  # bucket -> decode steps issued at it
    prefill_s: float = 0.0  # every wave's prefill, issue to the last chunk enqueued
    decode_s: float = 0.0  # every wave's first decode issue -> its last token read
    pipelined: bool = False
    pool_limited: int = 0  # waves that ended short of max_rows because the KV pool was full

    @property
    def decode_steps(self) -> int:
        return sum(self.steps.values())


@dataclass(frozen=True)
class BatchOptions:
    """`chunk`: prefill chunk (tokens); `eager`: decode launch by launch; `lookahead`: decode steps queued
    beyond the one being read (0: the synchronous loop); `compact`: re-pack into a smaller bucket as rows stop."""

    chunk: int
    eager: bool = False
    lookahead: int = 4
    compact: bool = True


OnToken = Callable[[int, TokenInfo], bool]  # (request index, token) -> True: stop that row now
OnFinish = Callable[[int, RowResult], None]


class _Row:
    """A row's state while its wave runs."""

    def __init__(self, index: int, req: RowRequest, result: RowResult, budget: int, lease: Any,
                 page_ids: tuple[int, ...], lease_tokens: int, history: History | None) -> None:
        self.index, self.req, self.result, self.budget = index, req, result, budget
        self.lease, self.page_ids, self.lease_tokens, self.history = lease, page_ids, lease_tokens, history
        self.n = len(req.prompt_ids)
        self.issued = 0  # tokens this row will have once every issued step completes (while live)
        self.reported = 0  # tokens handed to on_token / on_finish

    @property
    def done(self) -> bool:
        return bool(self.result.stop_reason)

    @property
    def position(self) -> int:
        """Position of the token the row's next step processes."""
        return self.n - 1 + len(self.result.tokens)

    def input(self) -> RowInput:
        tokens = self.result.tokens
        token = tokens[-1] if tokens else self.req.prompt_ids[-1]
        return RowInput(token, self.position, self.page_ids, self.result.sampling, self.history)


class BatchDecoder:
    """Decodes a list of `RowRequest`s in batches over `gen`'s runtime (module docstring). Not thread-safe.

    `gen`: the Generator (runtime, manifest facts, EOS ids, DeviceSteps when it has them). `sampler`: the
    manifest's `sampler_meta.SamplerFacts`, None for an argmax manifest (greedy rows only; `check` refuses the
    rest). `pages`: where rows get their leases (default: fresh leases, no prefix cache)."""

    def __init__(self, gen: Generator, opts: BatchOptions, sampler: SamplerFacts | None = None,
                 pages: BatchPages | None = None) -> None:
        self.gen = gen
        self.rt = gen.rt
        self.facts = gen.facts
        self.opts = opts
        self.sampler = sampler
        self.pages = pages if pages is not None else BatchPages(gen.rt, gen.page_tokens)
        self.seqs_max = decode_rows_max(gen.facts)
        self.max_rows = max_rows(self.seqs_max)
        self.max_positions = min(self.pages.max_tokens, gen.facts.max_context)
        self.pipelined = opts.lookahead > 0 and gen.can_pipeline
        self.timings = BatchTimings(pipelined=self.pipelined)

    # ---------------------------------------------------------------- checks

    def check(self, params: SamplingParams, where: str) -> None:
        """Raises SamplingError (naming `where`) for settings this manifest cannot run."""
        check_params(self.sampler, params, where)

    # ---------------------------------------------------------------- the run

    def run(self, requests: Sequence[RowRequest], on_token: OnToken | None = None,
            on_finish: OnFinish | None = None) -> list[RowResult]:
        """Every request's result, in request order. `on_token(i, info)` is called for each generated token of
        request i (not for an EOS stop token) after the next step was issued; True stops that row ("stop").
        `on_finish(i, result)` once per request, after its last on_token. Raises InputError (a prompt that does
        not fit, settings the manifest cannot run), SamplingError."""
        for i, req in enumerate(requests):
            self.check(req.sampling, f"prompt {i + 1}")
            if not req.prompt_ids:
                raise InputError(f"prompt {i + 1}: empty prompt")
            if len(req.prompt_ids) > self.max_positions:
                raise InputError(f"prompt {i + 1} is {len(req.prompt_ids)} tokens, the KV pool and context hold "
                                 f"{self.max_positions}: shorten it or raise --capacity")
        results: list[RowResult | None] = [None] * len(requests)
        queue = deque(range(len(requests)))
        while queue:
            wave = self._admit(requests, queue, results, on_finish)
            if not wave:
                continue
            self.timings.waves += 1
            try:
                self._decode(wave, on_token, on_finish)
            finally:
                for row in wave:
                    self.pages.release(row.lease)
        return [r for r in results if r is not None]

    def _admit(self, requests: Sequence[RowRequest], queue: deque[int], results: list[RowResult | None],
               on_finish: OnFinish | None) -> list[_Row]:
        """Prefill the next wave's rows (at most max_rows, as many as the pool holds)."""
        wave: list[_Row] = []
        t0 = time.perf_counter()
        while queue and len(wave) < self.max_rows:
            i = queue[0]
            req = requests[i]
            n = len(req.prompt_ids)
            params = resolve_seed(req.sampling) if not req.sampling.greedy else req.sampling
            result = RowResult(tuple(req.prompt_ids), params, wave=self.timings.waves)
            budget = min(req.max_new_tokens, self.max_positions - n + 1)
            if budget <= 0:  # nothing to generate: no lease
                queue.popleft()
                result.stop_reason = "steps" if req.max_new_tokens <= 0 else "context"
                results[i] = result
                if on_finish is not None:
                    on_finish(i, result)
                continue
            lease_tokens = min(n + budget, self.max_positions)
            got = self.pages.reserve(lease_tokens, req.prompt_ids)
            if got is None:
                self.timings.pool_limited += 1
                break  # the pool is full: the next wave
            queue.popleft()
            lease, cached = got
            page_ids = tuple(int(p) for p in lease.page_ids())
            skip = min(cached, n - 1)
            result.cached_tokens = cached
            result.prefill_tokens = n - 1 - skip
            if n - 1 > skip:
                self.gen.use_pages(page_ids)
                self.gen.prefill(list(req.prompt_ids[skip:-1]), self.opts.chunk, start=skip)
            self.pages.keep(lease, req.prompt_ids, n - 1)
            history = None
            if self.sampler is not None and params.penalizes:
                history = History(self.sampler.hist_cap, req.prompt_ids)
            results[i] = result
            wave.append(_Row(i, req, result, budget, lease, page_ids, lease_tokens, history))
        self.timings.prefill_s += time.perf_counter() - t0
        self._wave_t0 = t0
        return wave

    def _decode(self, wave: list[_Row], on_token: OnToken | None, on_finish: OnFinish | None) -> None:
        t0 = time.perf_counter()
        while True:
            live = [r for r in wave if not r.done]
            if not live:
                break
            self._segment(live, on_token, on_finish)
        self.timings.decode_s += time.perf_counter() - t0

    # ---------------------------------------------------------------- one segment

    def _segment(self, rows: list[_Row], on_token: OnToken | None, on_finish: OnFinish | None) -> None:
        """Decode `rows` (all live) in one bucket until they stop, or until the segment must re-pack."""
        rt, opts, facts = self.rt, self.opts, self.facts
        bucket = bucket_for(len(rows), self.seqs_max)
        self.timings.segments += 1
        top = self.sampler.top_logprobs if self.sampler is not None else None
        want_top = top is not None and any(r.result.sampling.top_logprobs for r in rows)
        for name, array in decode_inputs([r.input() for r in rows], bucket, facts.pages_per_seq,
                                         self.gen.page_tokens, self.sampler).items():
            rt.write_input(name, array)
        for r in rows:
            r.issued = len(r.result.tokens)
        p0 = np.asarray([r.position for r in rows], dtype=np.int64)  # i64[rows]: step 0's positions
        last = np.asarray([r.lease_tokens - 1 for r in rows], dtype=np.int64)  # last position each lease holds
        pipelined = self.pipelined and not want_top
        ring = self.gen.ring_view() if pipelined else None
        ring_len = int(ring.shape[-1]) if ring is not None else 0
        in_flight = max(1, min(opts.lookahead + 1, ring_len - 1)) if pipelined else 1
        steps = self.gen.steps
        vars_ = {"tokens": bucket, "seqs": bucket}
        pending: deque[tuple[int, Any]] = deque()
        issued = 0
        draining = False

        def needs_step() -> bool:
            return any(not r.done and r.issued < r.budget for r in rows)

        def fits(j: int) -> bool:
            return bool((p0 + j <= last).all())

        def issue() -> None:
            nonlocal issued
            if not pipelined and issued > 0:  # the synchronous loop: the host writes every step's inputs
                for name, array in step_inputs([r.input() for r in rows], bucket, self.gen.page_tokens).items():
                    rt.write_input(name, array)
            rt.issue("decode", vars_, eager=opts.eager)
            if want_top:
                assert top is not None
                rt.issue(top.program, vars_, eager=True)
            pending.append((issued, steps.record_event() if pipelined and steps is not None else None))
            issued += 1
            self.timings.steps[bucket] = self.timings.steps.get(bucket, 0) + 1
            for r in rows:
                if not r.done:
                    r.issued += 1

        while needs_step() and fits(issued) and len(pending) < in_flight:
            issue()
        while pending:
            j, event = pending.popleft()
            if event is not None:
                event.wait()
                assert ring is not None
                values = ring[np.arange(len(rows)), (p0 + j + 1) % ring_len]  # i64[rows]
            else:
                values = np.asarray(rt.read_output("next_token", rows=bucket))[:len(rows)]  # synchronises
            tokens, unpacked = unpack_packed(values)  # token id bits 0..31, f32 logprob bits 32..63
            logprobs = unpacked if self.sampler is not None else None  # an argmax manifest's entry: the id alone
            top_rows = None
            if want_top:
                assert top is not None
                ids = np.asarray(rt.read_output(top.ids, rows=bucket))
                lps = np.asarray(rt.read_output(top.logprobs, rows=bucket))
                top_rows = (ids, lps)
            now = time.perf_counter()
            arrived: list[tuple[_Row, TokenInfo]] = []
            for s, r in enumerate(rows):
                if r.done:
                    continue
                info = self._arrive(r, int(tokens[s]), logprobs, top_rows, s, now)
                arrived.append((r, info))
            live = sum(1 for r in rows if not r.done)
            if not draining and live and opts.compact and bucket_for(live, self.seqs_max) < bucket:
                draining = True  # re-pack into the smaller bucket once the queued steps are in
            if not draining and needs_step():
                if fits(issued):
                    if len(pending) < in_flight:
                        issue()  # keep the GPU fed while the host hands the tokens on
                else:
                    draining = True  # a stopped row would leave its lease: re-pack
            for r, info in arrived:
                if r.result.stop_reason != "eos" and on_token is not None:
                    if on_token(r.index, info) and not r.done:
                        r.result.stop_reason = "stop"
                if r.done and on_finish is not None:
                    on_finish(r.index, r.result)

    def _arrive(self, r: _Row, token: int, logprobs: np.ndarray | None, top_rows: Any, s: int,
                now: float) -> TokenInfo:
        """Record row r's new `token` (slot s of the step), apply its stop rules, return what on_token sees."""
        res = r.result
        if not res.tokens:
            res.ttft_s = now - self._wave_t0
        res.tokens.append(token)
        res.token_s.append(now)
        if r.history is not None:
            r.history.add(token)  # as kern_sample_history_append did on the device
        params = res.sampling
        lp = float(logprobs[s]) if logprobs is not None else None
        if params.logprobs and lp is not None:
            res.logprobs.append(lp)
        top = None
        if top_rows is not None and params.top_logprobs:
            ids, lps = top_rows
            top = tuple((int(ids[s, k]), float(lps[s, k])) for k in range(params.top_logprobs))
            res.top_logprobs.append(top)
        if r.req.stop_at_eos and token in self.gen.eos_ids:
            res.stop_reason = "eos"
        elif len(res.tokens) >= r.budget:
            res.stop_reason = "steps" if r.budget == r.req.max_new_tokens else "context"
        return TokenInfo(token, lp if params.logprobs else None, top)
