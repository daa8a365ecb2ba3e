"""The continuous-batching scheduler: pure host logic over kern_pool (no HTTP, no CUDA).

One call per engine step: `schedule()` returns a `Step` (frozen: the prefill chunks and decode rows to run,
and what was decided on the way), the engine runs it, and `complete(step, tokens)` folds the sampled tokens
back, returning one `Emitted` per decode row. `add` and `cancel` happen between steps.

Policy (docs/serve.md "Scheduler"):

- **Rows.** At most `max_seqs` requests hold a row (waking, prefilling or decoding). New requests join at
  step boundaries, first come first served: a later request is never admitted ahead of an earlier waiting one.
  A request takes the lowest free row and keeps it while it runs, so the engine rewrites a row's block table,
  sampling parameters and history only when its request changes. The device runs a decode step at the bucket
  holding the highest decoding row (engine.decode_bucket), so when the decoding rows no longer need their
  bucket (n rows fit a smaller one, some sit above it), the rows above it move down into rows below it that
  no decoding request holds (row compaction: the fewest moves that reach the smallest bucket).
- **Token budget.** Each step carries one token per decoding row, then prefill chunks of the prefilling rows
  (oldest first) while they fit in `token_budget`. A chunk is the span from the row's next position to the next
  multiple of `chunk_tokens` (so a prompt is cut exactly as `kern run` cuts it alone and outputs do not depend
  on the load); with batch-invariant prefill a chunk may also be cut short by the budget. So a long prompt
  stalls the decoding rows by at most one chunk per step.
- **Prefill and decode split as in the caller contract.** Prefill writes positions 0..n-2 of a sequence of n
  ids; the last id goes through decode, which yields the first generated token.
- **Prefix reuse.** On admission the longest cached prefix (kern_pool `Prefix.lookup`) is resumed: a resident
  hit by `lease_from`, a parked hit by `wake` (the request waits in its row until the wake lands). The reused
  length is aligned to `chunk_tokens` unless prefill is batch-invariant (prefix_cache.aligned_prefix). When a
  row finishes its prefill, its prefill K/V is checkpointed and filed under its ids, so later requests (also
  ones arriving while it still decodes) share it.
- **Memory pressure.** When a lease or a grow is refused (`Busy`), the coldest unlocked prefix is evicted:
  parked to the host tier when there is one (making room there by dropping the coldest parked entry), dropped
  otherwise. A park holds its device pages until it lands, so while parks are in flight the request waits for
  the next step instead of evicting more. With nothing left to evict, the newest running request younger than
  the one that needs memory is preempted (its pages returned; it is recomputed later from its prompt plus the
  tokens it already produced, which it keeps). Otherwise the request waits. No request fails because another
  arrived: only a request that cannot fit an empty pool fails (`ExceedsPool`; the HTTP layer refuses such
  prompts before they get here).
- **Cancellation** (`cancel`) returns the request's pages, its wake and its prefix lock at once.

Decode pages are grown a page at a time, as positions reach them (not reserved for `max_tokens` up front); with
`grow_ahead` N, also up to N positions past the next one when a free page allows it without evicting or
preempting anything (so an engine that enqueues a step before reading the last one finds the pages of its next
positions already in the block table: RuntimeEngine, docs/serve.md "Pipelined decode"). `steady(step)` says when
the step after `step` is expected to decode the same rows, one position on.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any, Sequence

import kern_pool
from kern_pool import Busy, ExceedsPool, NotLanded, ParkedTier, Prefix, Remapping

from ..sampling import resolve_seed
from .engine import DecodeRow, PrefillChunk, Sampled, decode_bucket
from .errors import ConfigError
from .memory import KvMemory
from .sampling import SamplingParams

WAITING, WAKING, PREFILL, DECODE = "waiting", "waking", "prefill", "decode"


@dataclass(frozen=True)
class SchedulerConfig:
    """`max_seqs`: rows (>= 1). `token_budget`: tokens one step carries, decode rows plus prefill (>=
    `chunk_tokens + max_seqs`, so the oldest prefilling row always gets a chunk). `chunk_tokens`: the prefill
    chunk (>= 1). `max_context`: positions one sequence may hold (>= 2). `batch_invariant_prefill`: reuse a
    cached prefix at any length and cut chunks by the budget (engine.Engine). `grow_ahead`: positions past the next
    one a decoding row's lease is grown to when free pages allow it without evicting or preempting (>= 0; 0: none).
    Raises ConfigError."""

    max_seqs: int
    chunk_tokens: int
    max_context: int
    token_budget: int | None = None  # None: chunk_tokens + max_seqs
    batch_invariant_prefill: bool = False
    grow_ahead: int = 0

    def __post_init__(self) -> None:
        for name, value, low in (("max_seqs", self.max_seqs, 1), ("chunk_tokens", self.chunk_tokens, 1),
                                 ("max_context", self.max_context, 2), ("grow_ahead", self.grow_ahead, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"scheduler {name} {value!r}: expected an int >= {low}")
        if self.token_budget is None:
            object.__setattr__(self, "token_budget", self.chunk_tokens + self.max_seqs)
        low = self.chunk_tokens + self.max_seqs
        budget = self.token_budget
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < low:
            raise ConfigError(f"scheduler token_budget {budget!r}: expected an int >= chunk_tokens + max_seqs "
                              f"= {low}, so the oldest prefilling row always gets a chunk")


@dataclass(frozen=True)
class Emitted:
    """A token produced for `req_id` by a decode row; `finish` is "stop" (an EOS id; the token is the EOS
    and is not part of the text), "length" (max_tokens or the context reached) or None (more follow).
    `logprob` / `top_logprobs`: the engine's `Sampled` fields (None / empty unless the request asked)."""

    req_id: int
    token_id: int
    finish: str | None
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Step:
    """One engine step, as decided by `Scheduler.schedule`.

    `prefills` run first (their K/V writes precede the decode rows'), then `decodes` in one step. Decisions
    taken on the way, for metrics and logs: `admitted` (req ids that got a row this step, with the tokens their
    prefix hit reused in `reused_tokens`), `preempted` (req ids sent back to wait), `failed` ((req_id,
    message): requests that cannot fit an empty pool), `parks` / `wakes` (host copies started), `evicted`
    (prefix entries dropped)."""

    prefills: tuple[PrefillChunk, ...] = ()
    decodes: tuple[DecodeRow, ...] = ()
    admitted: tuple[int, ...] = ()
    reused_tokens: tuple[int, ...] = ()
    preempted: tuple[int, ...] = ()
    failed: tuple[tuple[int, str], ...] = ()
    parks: int = 0
    wakes: int = 0
    evicted: int = 0

    @property
    def empty(self) -> bool:
        return not self.prefills and not self.decodes

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(len(c.token_ids) for c in self.prefills)


@dataclass
class Job:
    """A request inside the scheduler (mutable; only the scheduler changes it)."""

    req_id: int
    prompt: tuple[int, ...]
    max_tokens: int  # generated tokens at most (already capped by the context)
    sampling: SamplingParams
    stop_ids: frozenset[int]
    arrival: int
    tokens: list[int] = field(default_factory=list)
    state: str = WAITING
    row: int | None = None
    lease: Any = None
    waking: Any = None
    computed: int = 0  # positions whose K/V are written (or resumed)
    cached: int = 0  # positions resumed from the prefix cache at the last admission
    placed: bool = False  # the engine has been given this job's history in its current row

    def ids(self) -> tuple[int, ...]:
        """The ids whose K/V the sequence holds or will hold: the prompt, then the generated tokens."""
        return self.prompt + tuple(self.tokens)

    @property
    def num_ids(self) -> int:
        return len(self.prompt) + len(self.tokens)

    @property
    def last_id(self) -> int:
        return self.tokens[-1] if self.tokens else self.prompt[-1]


@dataclass
class Stats:
    """Cumulative counters (the metrics read them). Tokens are prompt tokens of admissions."""

    admitted: int = 0
    lookup_tokens: int = 0
    reused_tokens: int = 0
    parks: int = 0
    wakes: int = 0
    evictions: int = 0
    preemptions: int = 0


class Scheduler:
    """Continuous batching over `memory` (a `KvMemory`) with a prefix tree `prefix` (module docstring).

    Not thread-safe: one thread (the loop owning the engine) calls everything."""

    def __init__(self, memory: KvMemory, config: SchedulerConfig, prefix: Prefix[Any, Any] | None = None) -> None:
        self.memory = memory
        self.config = config
        self.prefix: Prefix[Any, Any] = prefix if prefix is not None else Prefix()
        self.stats = Stats()
        self._jobs: dict[int, Job] = {}
        self._waiting: list[tuple[int, int]] = []  # (arrival, req_id), sorted
        self._running: dict[int, Job] = {}  # req_id -> job holding a row, in admission order
        self._free_rows = list(range(config.max_seqs))  # a min-heap: the lowest free row first
        self._arrivals = itertools.count()
        self._step_parks = 0
        self._step_evicted = 0

    # ------------------------------------------------------------ queries

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def rows(self) -> dict[int, int]:
        """req_id -> row of every request holding a row."""
        return {j.req_id: j.row for j in self._running.values()}  # type: ignore[misc]

    def __contains__(self, req_id: int) -> bool:
        return req_id in self._jobs

    def job(self, req_id: int) -> Job:
        return self._jobs[req_id]

    @property
    def idle(self) -> bool:
        return not self._jobs

    # ------------------------------------------------------------ requests in and out

    def add(self, req_id: int, prompt: Sequence[int], max_tokens: int, sampling: SamplingParams,
            stop_ids: frozenset[int] = frozenset()) -> None:
        """Queue a request: `prompt` ids (>= 1), at most `max_tokens` (>= 1) generated tokens (capped here by
        the context: the last position written is len(prompt) - 1 + max_tokens - 1), stopping at `stop_ids`.
        Raises ConfigError for a duplicate id, an empty prompt, a prompt longer than the context or
        max_tokens < 1 (the HTTP layer checks these first)."""
        if req_id in self._jobs:
            raise ConfigError(f"request id {req_id} is already scheduled")
        n = len(prompt)
        if not 1 <= n <= self.config.max_context:
            raise ConfigError(f"prompt of {n} tokens: expected 1..{self.config.max_context} (the context)")
        if max_tokens < 1:
            raise ConfigError(f"max_tokens {max_tokens}: expected >= 1")
        budget = min(max_tokens, self.config.max_context - n + 1)
        if not sampling.greedy:
            sampling = resolve_seed(sampling)  # one Philox key for every step of the request
        job = Job(req_id, tuple(prompt), budget, sampling, stop_ids, next(self._arrivals))
        self._jobs[req_id] = job
        bisect.insort(self._waiting, (job.arrival, req_id))

    def cancel(self, req_id: int) -> bool:
        """Drop a request wherever it is; its pages, wake and prefix lock return now. False if unknown."""
        job = self._jobs.pop(req_id, None)
        if job is None:
            return False
        if job.state == WAITING:
            self._waiting.remove((job.arrival, req_id))
        else:
            self._release(job)
        return True

    def _release(self, job: Job) -> None:
        """Return a running job's memory and row (the job object itself is left to the caller)."""
        if job.waking is not None:
            job.waking.close()
            job.waking = None
        if job.lease is not None:
            job.lease.close()  # also releases the prefix hit it holds (lease_from / wake hold=)
            job.lease = None
        if job.row is not None:
            heapq.heappush(self._free_rows, job.row)
            job.row = None
        job.placed = False
        self._running.pop(job.req_id, None)

    def _preempt(self, job: Job) -> None:
        self._release(job)
        job.state, job.computed, job.cached = WAITING, 0, 0
        bisect.insort(self._waiting, (job.arrival, job.req_id))
        self.stats.preemptions += 1

    # ------------------------------------------------------------ one step

    def schedule(self) -> Step:
        """Decide the next step (module docstring). Changes the pool (leases, grows, evictions, parks, wakes)
        but runs nothing on the device."""
        self.memory.poll()
        self._step_parks = self._step_evicted = 0
        preempted: list[int] = []
        failed: list[tuple[int, str]] = []
        admitted, reused = self._admit(preempted, failed)
        wakes = sum(1 for r in admitted if self._jobs[r].state == WAKING)
        self._take_woken()
        decodes = self._decode_rows(preempted)
        prefills = self._prefill_chunks(self.config.token_budget - len(decodes))
        return Step(tuple(prefills), tuple(decodes), tuple(admitted), tuple(reused), tuple(preempted),
                    tuple(failed), self._step_parks, wakes, self._step_evicted)

    def _admit(self, preempted: list[int], failed: list[tuple[int, str]]) -> tuple[list[int], list[int]]:
        admitted: list[int] = []
        reused: list[int] = []
        while self._waiting:
            arrival, req_id = self._waiting[0]
            job = self._jobs[req_id]
            if not self._free_rows and not self._preempt_younger(job, preempted):
                break
            outcome = self._start(job, preempted)
            if outcome == "wait":
                break
            self._waiting.pop(0)
            if outcome != "ok":
                del self._jobs[req_id]
                failed.append((req_id, outcome))
                continue
            job.row = heapq.heappop(self._free_rows)
            job.placed = False
            self._running[req_id] = job
            admitted.append(req_id)
            reused.append(job.cached)
            self.stats.admitted += 1
            self.stats.lookup_tokens += job.num_ids
            self.stats.reused_tokens += job.cached
        return admitted, reused

    def _aligned(self, hit_tokens: int) -> int:
        if self.config.batch_invariant_prefill:
            return hit_tokens
        return hit_tokens // self.config.chunk_tokens * self.config.chunk_tokens

    def _start(self, job: Job, preempted: list[int]) -> str:
        """Lease (or resume, or start waking) `job`'s pages: "ok", "wait" (memory not available now), or the
        failure message of a request that cannot fit an empty pool."""
        ids = job.ids()
        n = len(ids)
        while True:
            hit = self.prefix.lookup(ids) if n > 1 else None
            cached = self._aligned(hit.num_tokens) if hit is not None else 0
            if hit is not None and cached == 0:
                hit.close()
                hit = None
            try:
                if hit is None:
                    job.lease = self.memory.lease(n)
                    job.state = PREFILL
                elif hit.tier is ParkedTier:
                    job.waking = self.memory.wake(hit.kept, cached, n, hold=hit)
                    job.state = WAKING
                    self.stats.wakes += 1
                else:
                    job.lease = self.memory.lease_from(hit.kept, n, prefix_tokens=cached, hold=hit)
                    job.state = PREFILL
            except NotLanded:  # a parked hit whose park is still in flight: take it once it lands
                hit.close()  # type: ignore[union-attr]
                return "wait"
            except (Busy, Remapping):
                if hit is not None:
                    hit.close()
                if self._make_room(job, preempted):
                    continue
                return "wait"
            except ExceedsPool as exc:
                if hit is not None:
                    hit.close()
                return f"the request's {n} tokens cannot fit the KV pool: {exc}"
            job.cached = job.computed = cached
            return "ok"

    def _make_room(self, job: Job, preempted: list[int]) -> bool:
        """Free memory for `job`: True when something was freed now (ask again), False to wait a step."""
        if self.memory.parks_in_flight:
            return False  # their pages return when they land; do not evict more meanwhile
        park = self._park if self.memory.has_host else None
        if self.prefix.evict(park=park) is not None:
            self.stats.evictions += 1
            self._step_evicted += 1
            return True
        return self._preempt_younger(job, preempted)

    def _preempt_younger(self, job: Job, preempted: list[int]) -> bool:
        """Preempt the newest running job younger than `job` (never `job` itself); False when none is."""
        victims = [j for j in self._running.values() if j.arrival > job.arrival]
        if not victims:
            return False
        victim = max(victims, key=lambda j: j.arrival)
        self._preempt(victim)
        preempted.append(victim.req_id)
        return True

    def _park(self, kept: Any) -> Any:
        """`Prefix.evict`'s park callback: the parked form of `kept`, or None to drop it (host tier full and
        nothing parked left to drop, or the entry can never fit the host tier)."""
        while True:
            try:
                room = self.memory.room(kept)
            except Busy:
                if not self.prefix.evict_parked():
                    return None
                continue
            except ExceedsPool:
                return None
            parked = self.memory.park(room)
            self.stats.parks += 1
            self._step_parks += 1
            return parked

    def _take_woken(self) -> None:
        for job in self._running.values():
            if job.state == WAKING:
                lease = self.memory.awake(job.waking)
                if lease is not None:
                    job.lease, job.waking, job.state = lease, None, PREFILL

    def _decode_rows(self, preempted: list[int]) -> list[DecodeRow]:
        jobs = []
        for job in list(self._running.values()):
            if job.state == PREFILL and job.computed >= job.num_ids - 1:
                self._prefill_done(job)
            if job.state != DECODE or job.req_id not in self._running:
                continue
            if self._ensure(job, job.num_ids, preempted):
                jobs.append(job)
        # a row preempted after it was listed (to grow a later one) must not write pages it no longer holds
        jobs = [j for j in jobs if j.req_id in self._running]
        for job in jobs:  # after every row's own growth: a page taken early never makes another row evict
            self._grow_ahead(job)
        if jobs:
            self._compact(jobs)
        rows = []
        for job in jobs:
            history = None
            if not job.placed:
                history = job.ids()
                job.placed = True
            rows.append(DecodeRow(job.req_id, job.row, job.num_ids - 1, job.last_id,  # type: ignore[arg-type]
                                  tuple(job.lease.page_ids()), job.sampling, history))
        return rows

    def _compact(self, decoding: list[Job]) -> None:
        """Move the decoding jobs whose rows lie above the bucket their number needs into rows below it that no
        decoding job of this step holds: free rows first (lowest first), then rows of running jobs that do not
        decode this step (prefilling, waking, or skipped), which take the mover's row in exchange. A moved job
        is no longer placed (its next decode row carries its history)."""
        bucket = decode_bucket(len(decoding), self.config.max_seqs)
        movers = sorted((j for j in decoding if j.row >= bucket), key=lambda j: j.row)  # type: ignore[operator]
        if not movers:
            return
        taken = {j.row for j in decoding}
        holders = {j.row: j for j in self._running.values() if j.row is not None and j.row not in taken}
        free = sorted(r for r in self._free_rows if r < bucket)
        swaps = sorted(r for r in holders if r < bucket)
        for job in movers:
            old = job.row
            if free:
                new = free.pop(0)
                self._free_rows.remove(new)
                self._free_rows.append(old)  # type: ignore[arg-type]
                heapq.heapify(self._free_rows)
            else:
                new = swaps.pop(0)
                other = holders[new]
                other.row, other.placed = old, False
            job.row, job.placed = new, False

    def _ensure(self, job: Job, num_tokens: int, preempted: list[int]) -> bool:
        """Grow `job`'s lease to `num_tokens`; False when it must skip this step (or was preempted)."""
        while job.lease.capacity_tokens < num_tokens:  # the next decode writes position num_tokens - 1
            try:
                self.memory.grow(job.lease, num_tokens)
            except (Busy, Remapping):
                if self.memory.parks_in_flight:
                    return False
                park = self._park if self.memory.has_host else None
                if self.prefix.evict(park=park) is not None:
                    self.stats.evictions += 1
                    self._step_evicted += 1
                    continue
                victim = max(self._running.values(), key=lambda j: j.arrival)
                self._preempt(victim)
                preempted.append(victim.req_id)
                if victim is job:
                    return False
        return True

    def _grow_ahead(self, job: Job) -> None:
        """Grow `job`'s lease to cover `grow_ahead` positions past the one its next decode writes (never past its
        last position) when the pool has the pages now; a refusal is ignored (nothing is evicted for it)."""
        last = len(job.prompt) + job.max_tokens - 1  # ids the request can ever hold (its last position + 1)
        want = min(job.num_ids + self.config.grow_ahead, last)
        if want > job.lease.capacity_tokens:
            try:
                self.memory.grow(job.lease, want)
            except (Busy, Remapping, ExceedsPool):
                pass  # its own growth, when due, decides (and says ExceedsPool, if ever)

    def steady(self, step: Step) -> bool:
        """Whether the step after `step` is expected to decode the same rows, each one position on, so an engine may
        enqueue it before `step`'s tokens are read (the loop's `ahead`): `step` decodes some rows; every other
        request holding a row is prefilling and stays so after `step`'s chunks (none is waking); requests wait only
        when no row is free; every decoding request wants more than the token `step` gives it and its lease holds
        the next position. Unforeseen: a token that is a stop id, a cancellation, a preemption or a full prefix hit
        (the engine then uses what matches, or drops the step it enqueued). Pure: changes nothing."""
        if not step.decodes or (self._waiting and self._free_rows):
            return False
        stops = {c.req_id: c.stop for c in step.prefills}
        decoding = {r.req_id for r in step.decodes}
        for job in self._running.values():
            if job.req_id in decoding:
                if (job.state != DECODE or len(job.tokens) + 1 >= job.max_tokens
                        or job.lease.capacity_tokens < job.num_ids + 1):
                    return False
            elif job.state != PREFILL or stops.get(job.req_id, job.computed) >= job.num_ids - 1:
                return False
        return len(decoding) == sum(1 for j in self._running.values() if j.req_id in decoding)

    def _prefill_done(self, job: Job) -> None:
        """`job`'s prefill K/V are all written: file them in the prefix tree, move it to decode."""
        job.state = DECODE
        num_tokens = job.computed
        if num_tokens > job.cached:
            try:
                cp = self.memory.checkpoint(job.lease, num_tokens)
            except kern_pool.PoolError:
                return  # nothing to share this time; the request goes on
            self.prefix.insert(job.ids()[:num_tokens], cp)

    def _prefill_chunks(self, budget: int) -> list[PrefillChunk]:
        chunks = []
        chunk = self.config.chunk_tokens
        for job in self._running.values():
            if job.state != PREFILL or budget <= 0:
                continue
            end = job.num_ids - 1
            start = job.computed
            stop = min((start // chunk + 1) * chunk, end)
            if stop - start > budget:
                if not self.config.batch_invariant_prefill:
                    break
                stop = start + budget
            chunks.append(PrefillChunk(job.req_id, job.row, start, job.ids()[start:stop],  # type: ignore[arg-type]
                                       tuple(job.lease.page_ids())))
            budget -= stop - start
        return chunks

    def complete(self, step: Step, outputs: Sequence[Sampled | int]) -> list[Emitted]:
        """Fold the engine's results of `step` back: `outputs[i]` is the `Sampled` (or the bare token id) of
        `step.decodes[i]`. Prefill chunks advance their rows; each decode row emits one token, and a finished
        request leaves (its pages returned). Rows cancelled while the step ran are skipped."""
        assert len(outputs) == len(step.decodes), (len(outputs), len(step.decodes))
        for c in step.prefills:
            job = self._jobs.get(c.req_id)
            if job is not None and job.state == PREFILL and job.computed == c.start:
                job.computed = c.stop
        out = []
        for row, sampled in zip(step.decodes, outputs):
            job = self._jobs.get(row.req_id)
            if job is None or job.state != DECODE:
                continue
            if not isinstance(sampled, Sampled):
                sampled = Sampled(int(sampled))
            token = int(sampled.token_id)
            job.tokens.append(token)
            finish = None
            if token in job.stop_ids:
                finish = "stop"
            elif len(job.tokens) >= job.max_tokens:
                finish = "length"
            out.append(Emitted(row.req_id, token, finish, sampled.logprob, sampled.top_logprobs))
            if finish is not None:
                self._release(job)
                del self._jobs[job.req_id]
        return out

    def fail(self, step: Step) -> list[int]:
        """The engine failed `step`: drop every request in it (pages returned). Returns their ids."""
        ids = sorted({c.req_id for c in step.prefills} | {r.req_id for r in step.decodes})
        for req_id in ids:
            self.cancel(req_id)
        return ids

    def drain(self) -> list[int]:
        """Cancel everything (shutdown); returns the ids cancelled."""
        ids = list(self._jobs)
        for req_id in ids:
            self.cancel(req_id)
        return ids
