"""The Qwen3 caller contract (docs/caller.md) over a loaded kern runtime: `Generator`.

One sequence (bs=1; `kern_run.batch` decodes many prompts together, one row each, over the same Generator).
Prefill: the first n-1 prompt tokens in chunks of `chunk` tokens through the `prefill` program (fills the KV
cache only). The last prompt token goes through `decode`, which yields the first generated token; every further
token is one `decode` step. Sampling is greedy on the GPU (the manifest's two-stage argmax, or its sampler with
row 0's params written greedy at each generation): each step reads back 8 bytes (`next_token`, i64[1]; the token
id is bits 0..31, `sampling.packed_token`). `warm_up` runs the first-use costs (cuBLASLt kernels, module loading,
the decode graphs' capture) on the scratch page at load (docs/caller.md "Warm-up").

Per prefill chunk `[start, stop)` (length L) the caller writes prefixes of the inputs:
    token_ids[:L] = ids[start:stop]           positions[:L] = start..stop-1
    slot_mapping[:L] = slot(start..stop-1)     seq_lens = [stop]      cu_seqlens_q = [0, L]
and issues `prefill` with tokens=L. Per decode step at position p with token t:
    token_ids = [t]  positions = [p]  slot_mapping = [slot(p)]  seq_lens = [p + 1]
and issues `decode` with tokens=1 (captured once as a CUDA graph unless eager). The block table is
written once per sequence. `slot(p) = page_ids[p // page_tokens] * page_tokens + p % page_tokens`.

Pages: the Generator is given a page source (contract.PageSource). The default, `SeqPages`, takes one
lease of the runtime's pool (`CallerRuntime.lease`) per generation, for prompt + steps tokens; its
`page_ids()` are the block-table row and `slot(p)` its slot mapping (page 0 is the runtime's scratch page
and is never leased). `prefix_cache.PrefixPages` resumes a cached prefix instead: its reservation says
how many prompt positions already hold their K/V, and prefill starts after them. The block-table row is
padded with the last page id: entries past the sequence's length are never read.

The next step is issued before the previous token is detokenized and printed, so host work overlaps
the GPU's step instead of adding to the step boundary.

Decode on the device (manifests whose `meta.caller.decode_advance` names a token ring; docs/caller.md):
the decode program ends with `kern_decode_advance`, which writes the next step's four inputs from this
step's argmax and stores the token into a host-mapped ring at (position + 1) % ring_len. The caller then
writes inputs only for the first decode step, keeps up to `lookahead` further steps queued on the GPU,
and reads each token from the ring once an event recorded behind its step has completed; stop conditions
(EOS, steps, context) are checked as tokens arrive, and the few steps queued past a stop are waited for
and discarded. Tokens are identical to the synchronous loop (`lookahead=0`), which remains the path for
a Generator given no `DeviceSteps` (the TP group) and for teacher forcing.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from kern_manifest import var_min

from .contract import CallerRuntime, DeviceSteps, PageSource, Reserved, SeqLease
from .errors import InputError
from .preflight import ManifestFacts
from .sampler_meta import read_sampler
from .sampling import SamplingParams, pack_params, packed_token


@dataclass(frozen=True)
class GenerateOptions:
    """`max_new_tokens`: generated tokens at most; `chunk`: prefill chunk (tokens); `eager`: no graph;
    `lookahead`: decode steps kept queued beyond the one being read back (0: the synchronous loop)."""

    max_new_tokens: int
    chunk: int
    eager: bool = False
    stop_at_eos: bool = True
    lookahead: int = 4


@dataclass
class Timings:
    """Wall-clock seconds measured by the caller (host side, after the synchronising readback)."""

    prefill_tokens: int = 0
    prefill_s: float = 0.0  # first prefill issue -> first generated token read back (TTFT)
    decode_steps: int = 0  # decode steps after the first token
    decode_s: float = 0.0
    token_s: list[float] = field(default_factory=list)  # time.perf_counter() as each generated token arrived
    pipelined: bool = False  # decode inputs advanced on the device, steps queued ahead

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_ms_per_token(self) -> float:
        return 1e3 * self.decode_s / self.decode_steps if self.decode_steps else 0.0


@dataclass(frozen=True)
class GenerateResult:
    prompt_ids: list[int]
    tokens: list[int]  # generated ids (the stop token included when stopped by EOS)
    stop_reason: str  # "eos" | "steps" | "context"
    timings: Timings = field(default_factory=Timings)


@dataclass(frozen=True)
class WarmUp:
    """What `Generator.warm_up` ran at load, and its host wall-clock seconds (each part synchronised)."""

    prefill_tokens: tuple[int, ...]  # one scratch-page prefill chunk of each of these lengths
    prefill_s: float
    buckets: tuple[int, ...]  # one decode step (its graph captured, unless eager) at each of these row counts
    decode_s: float

    @property
    def seconds(self) -> float:
        return self.prefill_s + self.decode_s

    def line(self) -> str:
        """The run summary's line: `warm-up 14.2 ms (prefill chunks of 1, 2 tokens 12.4 ms; decode at 1, 2, 4
        rows 1.8 ms)`."""
        chunks = ", ".join(map(str, self.prefill_tokens))
        rows = ", ".join(map(str, self.buckets))
        return (f"warm-up {self.seconds * 1e3:.1f} ms (prefill chunks of {chunks} tokens {self.prefill_s * 1e3:.1f} "
                f"ms; decode at {rows} rows {self.decode_s * 1e3:.1f} ms)")


def prefill_warm_sizes(facts: ManifestFacts) -> tuple[int, ...]:
    """Chunk lengths that run every launch variant of `prefill` once: 1 and the lower bound of every `when` range
    on `tokens` of the ops prefill calls (today's Qwen3 manifests: 1 and 2, the q/k norm + rope kernel differs
    at one token), within [1, tokens max]."""
    manifest = facts.manifest
    at_min = var_min(manifest.vars)
    sizes = {1}
    for op in {c.op for c in manifest.programs["prefill"].flat_calls(manifest)}:
        for launch in manifest.ops[op].launches:
            if launch.when is not None and "tokens" in launch.when:
                sizes.add(int(launch.when["tokens"][0].eval(at_min)))
    return tuple(sorted(n for n in sizes if 1 <= n <= facts.tokens_max))


def bf16_to_f32(array: np.ndarray) -> np.ndarray:
    """A bf16 array as the runtime returns it (uint16 bits, ml_dtypes bfloat16, or float) -> float32."""
    if array.dtype == np.uint16 or array.dtype == np.int16:
        return (array.astype(np.uint32) << 16).view(np.float32)
    if array.dtype.name == "bfloat16":
        return array.astype(np.float32)
    return np.asarray(array, dtype=np.float32)


class SeqPages:
    """The `PageSource` of a single generation: one lease of the runtime's pool (`CallerRuntime.lease`) per
    sequence. The tensor-parallel group's `lease` comes from a kern_pool `Pool` over its ranks' shared layout.

    `max_tokens`: tokens one sequence can hold, (num_pages - 1) * page_tokens (page 0 is the scratch page);
    `reserve(n)` returns the page ids (block-table row) covering n tokens (a fresh lease: the previous one is
    released; `cached_tokens` 0); `release()` returns them. Raises InputError when the pool cannot hold n tokens.
    """

    source = "runtime pool lease"

    def __init__(self, runtime: CallerRuntime, page_tokens: int) -> None:
        self.rt = runtime
        self.page_tokens = page_tokens
        self.max_tokens = pool_tokens(runtime, page_tokens)
        self._lease: SeqLease | None = None

    def reserve(self, num_tokens: int, prompt_ids: Sequence[int] = ()) -> Reserved:
        from kern_pool import PoolError

        self.release()
        try:
            self._lease = self.rt.lease(num_tokens)
        except PoolError as exc:
            raise InputError(f"{num_tokens} tokens do not fit the KV pool: {exc}") from None
        return Reserved(tuple(self._lease.page_ids()))

    def release(self) -> None:
        if self._lease is not None:
            self._lease.close()
            self._lease = None


def pool_tokens(runtime: CallerRuntime, page_tokens: int) -> int:
    """Tokens one sequence of `runtime`'s pool can hold: every page but the scratch page 0 (0 without pages)."""
    return max(0, (runtime.num_pages or 0) - 1) * page_tokens


def block_row(page_ids: Sequence[int], pages_per_seq: int) -> np.ndarray:
    """i32[pages_per_seq]: a sequence's block-table row, its page ids then its last page id repeated (entries past
    the sequence's length are never read); all scratch page 0 for no pages (a padding row)."""
    row = np.full(pages_per_seq, page_ids[-1] if len(page_ids) else 0, dtype=np.int32)
    row[:len(page_ids)] = page_ids
    return row


def slot_mapping(page_ids: Sequence[int], page_tokens: int, start: int, stop: int) -> np.ndarray:
    """i32[stop - start]: the KV slot of each position start..stop-1 of a sequence whose block-table row is
    `page_ids`: page_ids[p // page_tokens] * page_tokens + p % page_tokens (the caller contract, docs/caller.md).
    IndexError for a position past the row's pages."""
    pos = np.arange(start, stop)  # i64[L]
    pages = np.asarray(page_ids, dtype=np.int64)[pos // page_tokens]
    return (pages * page_tokens + pos % page_tokens).astype(np.int32)


class Generator:
    """Drives one sequence through a runtime loaded from a Qwen3 manifest. Not thread-safe.

    `runtime`: the `CallerRuntime` (docs/caller.md "The runtime contract"). `pages`: the `PageSource` of the
    sequence's KV pages (default `SeqPages(runtime)`: a fresh lease per generation; `prefix_cache.PrefixPages`
    resumes cached prefixes). `steps`: the runtime's events and host views (`DeviceSteps`) when it has them,
    for the pipelined decode loop; None: the synchronous loop.
    """

    def __init__(self, runtime: CallerRuntime, facts: ManifestFacts, eos_ids: frozenset[int] = frozenset(), *,
                 pages: PageSource | None = None, steps: DeviceSteps | None = None) -> None:
        self.rt = runtime
        self.facts = facts
        self.eos_ids = eos_ids
        self.page_tokens = int(runtime.page_tokens or facts.page_tokens)
        self.pages: PageSource = pages if pages is not None else SeqPages(runtime, self.page_tokens)
        self.steps = steps
        self.max_positions = min(self.pages.max_tokens, facts.max_context)  # positions 0..max_positions-1 fit
        self._page_ids: tuple[int, ...] = ()
        self._advance: Mapping[str, Any] | None = facts.decode_advance  # checked by preflight.read_manifest
        self._ring: np.ndarray | None = None
        self.warmed: WarmUp | None = None  # what warm_up ran (session.open_generator, asked by kern run)
        # the GPU sampler's inputs (meta.caller.sampling), if any: a generation writes row 0's params greedy
        self.sampler = read_sampler(facts.manifest, facts.manifest.name)

    def with_pages(self, pages: PageSource) -> "Generator":
        """A Generator over the same runtime, facts, eos ids and steps that takes its pages from `pages`. This
        one's pages are released; it stays usable (its next generation leases anew)."""
        self.pages.release()
        return Generator(self.rt, self.facts, self.eos_ids, pages=pages, steps=self.steps)

    @property
    def can_pipeline(self) -> bool:
        """The manifest advances decode inputs on the device and the runtime's `DeviceSteps` were given."""
        return self._advance is not None and self.steps is not None

    def ring_view(self) -> np.ndarray:
        """i64[seqs, ring_len]: the decode program's token ring (host-mapped, read after the step's event)."""
        if self._ring is None:
            assert self._advance is not None and self.steps is not None
            self._ring = self.steps.host_array(str(self._advance["ring"]))
        return self._ring

    # ---------------------------------------------------------------- loading

    @classmethod
    def open(cls, manifest: Any, kernels: Any, weights: Any, facts: ManifestFacts, gpu: int = 0,
             capacity_tokens: int = 4096, eos_ids: frozenset[int] = frozenset(),
             progress: Callable[[int, int], None] | None = None, resident: Any = None) -> "Generator":
        """Load the runtime (verify, kernels, weights, once programs). Raises kern_runtime.KernError.

        `manifest`: its path; the runtime loads `facts.manifest`, the Manifest read_manifest parsed and verified
        (`Runtime.load` takes it as it is), instead of reading the file again. `weights`: a checkpoint directory or one
        .safetensors file, or a list of .safetensors files (config.Weights), as `SafetensorsTensors.open` takes
        them. `resident`: weights kept by an earlier runtime's `into_resident()` (loaded over, not re-read).
        The Generator gets the runtime's `DeviceSteps` (the pipelined decode loop).
        """
        from kern_runtime import Capacity, Runtime, SafetensorsTensors

        from .config import runtime_weights

        tensors = SafetensorsTensors.open(runtime_weights(weights))
        extra = {"resident": resident} if resident is not None else {}
        seqs = int(facts.manifest.vars["seqs"].max)  # the decode rows (kern_run.batch); per-seq slots if any
        rt = Runtime.load(facts.manifest, str(kernels), tensors, gpu=gpu,
                          capacity=Capacity(tokens=capacity_tokens, seqs=seqs), progress=progress, **extra)
        return cls(rt, facts, eos_ids, steps=rt)

    def warm_up(self, buckets: Sequence[int] = (1,), eager: bool = False, sampler: Any = None) -> WarmUp:
        """Run, on the scratch page only, what the first generation would otherwise pay for (docs/caller.md
        "Warm-up"): one `prefill` chunk of each `prefill_warm_sizes` length (the first cuBLASLt matmul of each
        GEMM shape and the first launch of each kernel) and one `decode` step at each of `buckets` rows
        (capturing its CUDA graph unless `eager`), every row a padding row. `sampler`: the manifest's
        `sampler_meta.SamplerFacts`, whose params are then written greedy. Synchronises. Writes the decode and
        prefill inputs and block-table rows (a generation writes its own before its first call) and only page 0's
        KV; the decode steps' token ring entries are never read. Returns the `WarmUp` timings."""
        from .batch_inputs import padding_inputs

        t0 = time.perf_counter()
        sizes = prefill_warm_sizes(self.facts)
        self.rt.write_input("block_table", np.zeros((1, self.facts.pages_per_seq), dtype=np.int32))
        for length in sizes:
            positions = np.arange(length, dtype=np.int32)  # i32[L]
            self.rt.write_input("token_ids", np.zeros(length, dtype=np.int32))
            self.rt.write_input("positions", positions)
            self.rt.write_input("slot_mapping", positions % self.page_tokens)  # slots of page 0
            self.rt.write_input("seq_lens", np.asarray([length], dtype=np.int32))
            self.rt.write_input("cu_seqlens_q", np.asarray([0, length], dtype=np.int32))
            self.rt.issue("prefill", {"tokens": length, "seqs": 1})
        self.rt.read_output("next_token", 1)  # synchronises
        t1 = time.perf_counter()
        for rows in buckets:
            for name, array in padding_inputs(rows, self.facts.pages_per_seq, sampler).items():
                self.rt.write_input(name, array)
            self.rt.issue("decode", {"tokens": rows, "seqs": rows}, eager=eager)
        self.rt.read_output("next_token", 1)
        return WarmUp(sizes, t1 - t0, tuple(buckets), time.perf_counter() - t1)

    def close(self) -> None:
        self.pages.release()
        self.rt.close()

    def __enter__(self) -> "Generator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- the contract

    def slot(self, position: int) -> int:
        """KV slot of `position`: page_ids[p // page_tokens] * page_tokens + p % page_tokens."""
        return self._page_ids[position // self.page_tokens] * self.page_tokens + position % self.page_tokens

    def slots(self, start: int, stop: int) -> np.ndarray:
        """i32[stop - start]: slots of positions start..stop-1."""
        return slot_mapping(self._page_ids, self.page_tokens, start, stop)

    def _begin(self, num_tokens: int, prompt_ids: Sequence[int] = ()) -> int:
        """A new sequence of up to `num_tokens` tokens starting with `prompt_ids`: pages from the page source,
        block table written once. Returns the positions the source already holds (`Reserved.cached_tokens`)."""
        self.pages.release()
        reserved = self.pages.reserve(num_tokens, prompt_ids)
        self.use_pages(reserved.page_ids)
        if self.sampler is not None:  # greedy, whatever a batch (kern_run.batch) left in row 0
            self.rt.write_input(self.sampler.params, np.frombuffer(pack_params([SamplingParams()]), "<u4").reshape(1, -1))
        return reserved.cached_tokens

    def use_pages(self, page_ids: Sequence[int]) -> None:
        """Make `page_ids` the sequence that `prefill` and `slot` address: block-table row 0 is written with them
        (`block_row`). The batch caller (kern_run.batch) prefills each of its rows' leases this way."""
        self._page_ids = tuple(int(p) for p in page_ids)
        self.rt.write_input("block_table", block_row(self._page_ids, self.facts.pages_per_seq).reshape(1, -1))

    def prefill(self, ids: list[int], chunk: int, start: int = 0) -> None:
        """Run `ids` (absolute positions start..start+len-1) through `prefill` in chunks of `chunk`."""
        if not 1 <= chunk <= self.facts.tokens_max:
            raise InputError(f"chunk {chunk} outside the manifest's tokens var [1, {self.facts.tokens_max}]")
        for lo in range(0, len(ids), chunk):
            piece = np.asarray(ids[lo:lo + chunk], dtype=np.int32)  # i32[L]
            pos0 = start + lo
            length = len(piece)
            positions = np.arange(pos0, pos0 + length, dtype=np.int32)  # i32[L]
            self.rt.write_input("token_ids", piece)
            self.rt.write_input("positions", positions)
            self.rt.write_input("slot_mapping", self.slots(pos0, pos0 + length))
            self.rt.write_input("seq_lens", np.asarray([pos0 + length], dtype=np.int32))
            self.rt.write_input("cu_seqlens_q", np.asarray([0, length], dtype=np.int32))
            self.rt.issue("prefill", {"tokens": length, "seqs": 1})

    def _decode_issue(self, token: int, position: int, eager: bool) -> None:
        self.rt.write_input("token_ids", np.asarray([token], dtype=np.int32))
        self.rt.write_input("positions", np.asarray([position], dtype=np.int32))
        self.rt.write_input("slot_mapping", np.asarray([self.slot(position)], dtype=np.int32))
        self.rt.write_input("seq_lens", np.asarray([position + 1], dtype=np.int32))
        self.rt.issue("decode", {"tokens": 1, "seqs": 1}, eager=eager)

    def _next_token(self) -> int:
        # i64[1]: 8-byte readback, synchronises; the sampler's manifests pack the logprob above the token id
        return packed_token(self.rt.read_output("next_token", 1)[0])

    def check_fits(self, num_prompt_tokens: int) -> None:
        if num_prompt_tokens > self.max_positions:
            raise InputError(f"the prompt is {num_prompt_tokens} tokens, the KV pool and context hold "
                             f"{self.max_positions}: shorten it or raise --capacity")

    def _stop_reason(self, token: int, count: int, budget: int, opts: GenerateOptions) -> str | None:
        """Why generation stops at its `count`-th token `token`, or None to go on: "eos" (the stop token is
        kept in the result but not passed to on_token), "steps" (max_new_tokens reached) or "context" (the
        budget was cut by the context)."""
        if opts.stop_at_eos and token in self.eos_ids:
            return "eos"
        if count >= budget:
            return "steps" if budget == opts.max_new_tokens else "context"
        return None

    def generate(self, prompt_ids: list[int], opts: GenerateOptions,
                 on_token: Callable[[int], None] | None = None) -> GenerateResult:
        """Greedy generation. `on_token(id)` is called for every generated id, while the next step runs.

        Stops at an EOS id (when `opts.stop_at_eos`), after `opts.max_new_tokens`, or when the context
        is full. Raises InputError when the prompt does not fit.
        """
        n = len(prompt_ids)
        if n == 0:
            raise InputError("empty prompt")
        self.check_fits(n)
        budget = min(opts.max_new_tokens, self.max_positions - n + 1)  # last position written: n - 1 + budget - 1
        cached = self._begin(min(n + max(budget, 0), self.max_positions), prompt_ids)
        skip = min(cached, n - 1)  # prompt positions whose K/V the page source resumed
        timings = Timings(prefill_tokens=n - 1 - skip)
        tokens: list[int] = []
        if budget <= 0:
            return GenerateResult(list(prompt_ids), tokens, "steps" if opts.max_new_tokens <= 0 else "context", timings)
        t0 = time.perf_counter()
        if n - 1 > skip:
            self.prefill(prompt_ids[skip:-1], opts.chunk, start=skip)
        if opts.lookahead > 0 and self.can_pipeline:
            return self._generate_pipelined(prompt_ids, opts, on_token, budget, timings, t0)
        self._decode_issue(prompt_ids[-1], n - 1, opts.eager)
        token = self._next_token()
        t1 = time.perf_counter()
        timings.prefill_s = t1 - t0
        timings.token_s.append(t1)
        while True:
            tokens.append(token)
            stop_reason = self._stop_reason(token, len(tokens), budget, opts)
            if stop_reason is not None:
                if stop_reason != "eos" and on_token is not None:
                    on_token(token)
                break
            self._decode_issue(token, n - 1 + len(tokens), opts.eager)  # the next step runs on the GPU ...
            if on_token is not None:
                on_token(token)  # ... while the host detokenizes and prints this token
            token = self._next_token()
            timings.token_s.append(time.perf_counter())
        timings.decode_steps = len(tokens) - 1
        timings.decode_s = time.perf_counter() - t1
        return GenerateResult(list(prompt_ids), tokens, stop_reason, timings)

    def _generate_pipelined(self, prompt_ids: list[int], opts: GenerateOptions,
                            on_token: Callable[[int], None] | None, budget: int, timings: Timings,
                            t0: float) -> GenerateResult:
        """The decode loop of `generate` with inputs advanced on the device (prefill already enqueued).

        Step i (i = 0 .. budget-1) processes position n-1+i and its token lands in ring[(n+i) % ring_len].
        At most `lookahead + 1` steps are in flight (< ring_len, so no ring entry is overwritten before it
        is read); each token is read after the event recorded behind its step."""
        n = len(prompt_ids)
        ring = self.ring_view()
        ring_len = int(ring.shape[-1])
        in_flight = max(1, min(opts.lookahead + 1, ring_len - 1))
        base = n - 1  # position of step 0
        self._decode_issue(prompt_ids[-1], base, opts.eager)  # step 0: inputs from the host
        steps = self.steps
        assert steps is not None  # can_pipeline
        pending: deque[tuple[int, Any]] = deque([(base, steps.record_event())])
        issued = 1

        def issue_next() -> None:
            nonlocal issued
            self.rt.issue("decode", {"tokens": 1, "seqs": 1}, eager=opts.eager)  # inputs advanced on the GPU
            pending.append((base + issued, steps.record_event()))
            issued += 1

        while issued < budget and len(pending) < in_flight:
            issue_next()
        tokens: list[int] = []
        stop_reason = "steps"
        t1 = t0
        while pending:
            position, event = pending.popleft()
            event.wait()
            token = packed_token(ring[0, (position + 1) % ring_len])
            now = time.perf_counter()
            if not tokens:
                t1 = now
                timings.prefill_s = now - t0
            timings.token_s.append(now)
            tokens.append(token)
            reason = self._stop_reason(token, len(tokens), budget, opts)
            if reason is not None:
                stop_reason = reason
                if reason != "eos" and on_token is not None:
                    on_token(token)
                break
            if issued < budget:
                issue_next()  # keep the GPU fed ...
            if on_token is not None:
                on_token(token)  # ... while the host detokenizes and prints this token
        for _, event in pending:  # steps queued past the stop: wait, discard their tokens
            event.wait()
        timings.decode_steps = len(tokens) - 1
        timings.decode_s = time.perf_counter() - t1
        timings.pipelined = True
        return GenerateResult(list(prompt_ids), tokens, stop_reason, timings)

    def teacher_forced(self, ids: list[int], prefill_tokens: int = 0, chunk: int | None = None,
                       eager: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Logits at every position from `prefill_tokens` on, feeding `ids` (not the model's choices).

        The first `prefill_tokens` ids go through chunked `prefill`; then each remaining id i goes through
        one `decode` step at position i. Returns (logits f32[m, vocab], argmax i64[m]) with
        m = len(ids) - prefill_tokens: row j predicts the token after ids[prefill_tokens + j]; argmax is the
        GPU's `next_token` of that step.
        Raises InputError when ids do not fit.
        """
        n = len(ids)
        if not 0 <= prefill_tokens < n:
            raise InputError(f"prefill_tokens {prefill_tokens} must lie in [0, {n})")
        self.check_fits(n)
        self._begin(n)
        if prefill_tokens:
            self.prefill(ids[:prefill_tokens], chunk or min(512, self.facts.tokens_max))
        rows, argmax = [], []
        for pos in range(prefill_tokens, n):
            self._decode_issue(ids[pos], pos, eager)
            argmax.append(self._next_token())
            rows.append(bf16_to_f32(np.asarray(self.rt.read_buffer("logits", 1))).reshape(-1))  # f32[vocab]
        return np.stack(rows), np.asarray(argmax, dtype=np.int64)
