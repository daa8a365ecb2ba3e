"""The real engine over a loaded runtime: decode steps of 1..seqs_max rows, sampling on the GPU where the
manifest has it (`meta.caller.sampling`, sampling_io.py), greedy argmax otherwise.

It drives a loaded `Generator`'s runtime through the caller contract (docs/caller.md) with the pages the
scheduler leased (engine.py). Prefill is one sequence at a time, as `Generator.prefill` writes it:

    prefill chunk [start, stop) (L tokens):  token_ids[:L], positions[:L] = start..stop-1,
        slot_mapping[:L] = slot(start..stop-1), seq_lens = [stop], cu_seqlens_q = [0, L],
        block_table[0] = the row's pages; issue prefill at tokens = L, seqs = 1

A decode step over rows R (the scheduler's row indices, stable per request) runs at the bucket B, the
smallest of 1, 2, 4, ..., seqs_max holding max(R) + 1 (engine.decode_bucket; one CUDA graph per bucket, all
captured by `warm()` at load). Row r < B of the per-row inputs holds its request's token, position, slot and
context length; a padding row (no request) holds token 0, position 0, seq_len 1, slot 0 and an all-zero
block-table row, so it reads and writes only the scratch page 0. Then `decode` is issued at seqs = tokens = B
and `next_token` (8 bytes a row) is read back, which synchronises. With sampling, each entry packs the token id
(bits 0..31) and its f32 logprob (bits 32..63); a row asking for top logprobs has the top-logprobs program
issued eagerly behind the step, before the readback.

What is written when (runtime.write_input writes a prefix of rows, so a change at row r rewrites rows 0..r
from host mirrors that hold what every row should be):

- token_ids, positions, slot_mapping, seq_lens: every step, B rows; except where the manifest's decode program
  advances them itself (`meta.caller.decode_advance`) and this step is the last one's rows, one position on,
  with every row of the bucket live, no block-table row changed and no prefill between: then the device
  already holds them.
- block_table: rows 0..r when row r's pages on the device differ from what the step needs (a new request, a
  page grown, a row turned padding, or row 0 after a prefill wrote its own pages there).
- sampling params (`pack_params`): rows 0..r when row r's request changed, when row r turned padding (a
  padding row is set greedy, the sampler's cheapest path: docs/caller.md "Sampling"), or when the request
  that skipped a step comes back to its row (its params are kept on the host meanwhile).
- history (`history_counts` / `pack_history` of the request's prompt and generated tokens, the first
  hist_cap distinct ids): rows 0..r when row r's request changed, or when its history on the device is stale.
  The graph appends each step's sampled token to every row of the bucket, padding rows included; the host
  mirror appends it for the rows that penalize, so their mirror stays what the device holds, and a row that
  was padding in some step (its request skipped a step) has its history written again before it decodes. A row
  whose parameters apply no penalty never reads its history, which is then neither written nor tracked.

Pipelined decode (ahead.py, docs/serve.md "Pipelined decode"): with `decode(rows, ahead=True)`, a manifest that
advances its inputs on the device and a runtime with `DeviceSteps` (events, the host-mapped token ring), the
engine enqueues the step after `rows` (each row one position on, nothing written by the host) behind this one
before it reads this one, when every row's block-table row already covers that next position; this step's tokens
are then read from the ring after an event behind it (`next_token` already holds the next step's). The next
`decode` takes that step's results when it computed what is asked (`AheadStep.matches`), itself enqueuing the
step after it first when all of its rows go on and no prefill came between (the block table grown in place if the
scheduler granted pages), and drops it otherwise: the per-row inputs and every row's history on the device are
then stale (rewritten before the next step), and its K/V writes lie at positions its rows write again or in pages
of requests that ended, which any later user writes first (one stream orders them).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Sequence

import numpy as np

from ..generate import slot_mapping
from ..sampling import SamplingParams, history_counts, pack_history, pack_params, unpack_packed
from .engine import DecodeRow, PrefillChunk, Sampled, decode_bucket
from .errors import ConfigError
from .sampling import greedy_only_fault
from ..sampling_io import SamplingIO, read_sampling_io
from .ahead import AheadStep

BUCKETS_KEPT = 100_000  # decode steps whose bucket `RuntimeEngine.buckets` remembers


class RuntimeEngine:
    """`engine.Engine` over `gen` (a `kern_run.generate.Generator`: its runtime, manifest facts, eager flag).

    `chunk_tokens`: the prefill chunk (the target's, at most the manifest's tokens var). `max_seqs`: rows at
    most (None: all the manifest allows, its `seqs` var max, at most its `tokens` var max). `samples` is True when
    the manifest has GPU sampling (sampling_io.py). Raises ConfigError for a chunk outside [1, tokens_max] or
    max_seqs < 1, kern_run ConfigError for a malformed `meta.caller.sampling`."""

    def __init__(self, gen: Any, chunk_tokens: int, eager: bool = False, max_seqs: int | None = None) -> None:
        facts = gen.facts
        if not 1 <= chunk_tokens <= facts.tokens_max:
            raise ConfigError(f"chunk {chunk_tokens} outside the manifest's tokens var [1, {facts.tokens_max}]")
        manifest = facts.manifest
        seqs_var = manifest.vars.get("seqs")
        self.seqs_max = min(int(seqs_var.max) if seqs_var is not None else 1, int(facts.tokens_max))
        if max_seqs is not None and max_seqs < 1:
            raise ConfigError(f"max_seqs {max_seqs}: expected >= 1")
        self.max_seqs = self.seqs_max if max_seqs is None else min(max_seqs, self.seqs_max)
        self.io: SamplingIO | None = read_sampling_io(manifest)
        self.samples = self.io is not None
        self.max_top_logprobs = self.io.top_n if self.io is not None else 0
        self.gen = gen
        self.rt = gen.rt
        self.facts = facts
        self.page_tokens = int(gen.page_tokens)
        self.chunk_tokens = chunk_tokens
        self.max_context = int(gen.max_positions)
        self.batch_invariant_prefill = bool(facts.prefill_batch_invariant)
        self.eager = eager
        rows = decode_bucket(self.max_seqs, self.seqs_max)  # the largest bucket a step can run at
        self._rows = rows
        self._table = np.zeros((rows, facts.pages_per_seq), dtype=np.int32)  # i32[rows, pages_per_seq] mirror
        self._table_rows: list[tuple[int, ...]] = [()] * rows  # the page ids each mirror row holds (): scratch
        self._device_rows: list[tuple[int, ...] | None] = [None] * rows  # ... each device row holds (None: unknown)
        self._row_req: list[int | None] = [None] * rows  # the request each row's mirrors belong to (its owner)
        self.buckets: deque[int] = deque(maxlen=BUCKETS_KEPT)  # the bucket of the last decode steps (tests, logs)
        self.advanced_steps = 0  # decode steps whose per-row inputs the device had advanced (nothing written)
        self._advances = facts.decode_advance is not None
        self._expect: dict[int, tuple[int, int, int]] | None = None  # row -> (req, position, token) advanced
        # the pipelined decode (module docstring): the runtime's DeviceSteps and the token ring, when both exist
        steps = gen.steps
        self._steps = steps if self._advances and steps is not None else None
        self._ring_name = str(facts.decode_advance["ring"]) if self._steps is not None else ""
        self._ring: np.ndarray | None = None  # i64[seqs, ring_len], host-mapped (read after an event)
        self._ahead: AheadStep | None = None  # the step enqueued behind the last one, not yet taken
        self.ahead_used = 0  # decode calls answered by a step enqueued ahead
        self.ahead_dropped = 0  # steps enqueued ahead that the next call did not match
        if self.io is not None:
            cap = self.io.hist_cap
            greedy = np.frombuffer(pack_params([SamplingParams()]), dtype=self.io.params_dtype)
            self._greedy = greedy
            self._params = np.tile(greedy, (rows, 1))  # [rows, 48 / itemsize]: what each device row should hold
            self._owner_params = self._params.copy()  # the params of the request each row belongs to
            self._params_owned = [False] * rows  # _params[b] is its owner's (else greedy: padding or unowned)
            self._hist_tokens = np.full((rows, cap), -1, dtype=np.int32)  # i32[rows, hist_cap] mirror
            self._hist_counts = np.zeros((rows, cap), dtype=np.int32)
            self._hist: list[dict[int, int] | None] = [None] * rows  # token -> slot, each penalizing row's mirror
            self._hist_ok = [False] * rows  # device history row == mirror row

    # ---------------------------------------------------------------- load

    def warm(self) -> list[int]:
        """Issue one all-padding decode step at every bucket up to the largest (capturing each bucket's CUDA
        graph now rather than in a request's step) and the top-logprobs program once; synchronises. Returns
        the buckets warmed."""
        warmed = []
        bucket = 1
        while True:
            bucket = min(bucket, self._rows)
            self._step_inputs([], bucket)
            self.rt.issue("decode", {"tokens": bucket, "seqs": bucket}, eager=self.eager)
            warmed.append(bucket)
            if bucket >= self._rows:
                break
            bucket *= 2
        if self.io is not None and self.io.top_program is not None:
            self.rt.issue(self.io.top_program, {"tokens": bucket, "seqs": bucket}, eager=True)
        self.rt.read_output(self._next_token_name, rows=1)  # synchronises
        self._expect = None
        if self.io is not None:
            self._hist_ok = [False] * self._rows  # padding tokens were appended everywhere
        return warmed

    @property
    def _next_token_name(self) -> str:
        return self.io.next_token if self.io is not None else "next_token"

    @property
    def pipelines(self) -> bool:
        """Whether `decode(rows, ahead=True)` may enqueue the next step before reading this one (the manifest
        advances its inputs on the device and the runtime has DeviceSteps)."""
        return self._steps is not None

    # ---------------------------------------------------------------- block table

    def _set_table_row(self, r: int, pages: tuple[int, ...]) -> None:
        old = self._table_rows[r]
        if len(pages) >= len(old) and pages[:len(old)] == old:
            self._table[r, len(old):len(pages)] = pages[len(old):]  # grown: the new entries only
        else:
            self._table[r, :] = 0
            self._table[r, :len(pages)] = pages
        self._table_rows[r] = pages

    def _write_table(self, want: Sequence[tuple[int, ...]]) -> bool:
        """Make device block-table rows 0..len(want)-1 hold `want` (page ids; (): scratch), writing rows 0..r for
        the highest row r that differs. True when it wrote."""
        high = 0
        for r, pages in enumerate(want):
            if self._table_rows[r] != pages:
                self._set_table_row(r, pages)
            if self._device_rows[r] != pages:
                high = r + 1
        if high:
            self.rt.write_input("block_table", self._table[:high])
            self._device_rows[:high] = self._table_rows[:high]
        return bool(high)

    # ---------------------------------------------------------------- prefill

    def prefill(self, chunk: PrefillChunk) -> None:
        length = len(chunk.token_ids)
        assert 1 <= length <= self.chunk_tokens, (length, self.chunk_tokens)  # the scheduler cuts chunks
        self._expect = None  # the per-row inputs are overwritten
        if self._ahead is not None:
            self._ahead.prefilled = True  # ... also those a step enqueued ahead advanced
        if self._device_rows[0] != chunk.page_ids:  # prefill runs at seqs = 1: block-table row 0
            row = np.zeros((1, self.facts.pages_per_seq), dtype=np.int32)  # i32[1, pages_per_seq]
            row[0, :len(chunk.page_ids)] = chunk.page_ids
            self.rt.write_input("block_table", row)
            self._device_rows[0] = chunk.page_ids
        self.rt.write_input("token_ids", np.asarray(chunk.token_ids, dtype=np.int32))  # i32[L]
        self.rt.write_input("positions", np.arange(chunk.start, chunk.stop, dtype=np.int32))  # i32[L]
        self.rt.write_input("slot_mapping", slot_mapping(chunk.page_ids, self.page_tokens, chunk.start, chunk.stop))
        self.rt.write_input("seq_lens", np.asarray([chunk.stop], dtype=np.int32))
        self.rt.write_input("cu_seqlens_q", np.asarray([0, length], dtype=np.int32))
        self.rt.issue("prefill", {"tokens": length, "seqs": 1})

    # ---------------------------------------------------------------- decode

    def _step_inputs(self, rows: Sequence[DecodeRow], bucket: int) -> None:
        """The per-row inputs of a step at `bucket` (padding rows: token 0, position 0, seq_len 1, slot 0), left
        as the device advanced them when they are what this step needs (module docstring)."""
        want: list[tuple[int, ...]] = [()] * bucket
        for r in rows:
            want[r.row] = r.page_ids
        wrote_table = self._write_table(want)
        expect = self._expect
        self._expect = None
        if (expect is not None and not wrote_table and len(rows) == bucket == len(expect)
                and all(expect.get(r.row) == (r.req_id, r.position, r.token_id) for r in rows)):
            self.advanced_steps += 1
            return
        tokens = np.zeros(bucket, dtype=np.int32)  # i32[bucket]
        positions = np.zeros(bucket, dtype=np.int32)
        slots = np.zeros(bucket, dtype=np.int32)
        lens = np.ones(bucket, dtype=np.int32)
        P = self.page_tokens
        for r in rows:
            p = r.position
            tokens[r.row] = r.token_id
            positions[r.row] = p
            slots[r.row] = r.page_ids[p // P] * P + p % P
            lens[r.row] = p + 1
        self.rt.write_input("token_ids", tokens)
        self.rt.write_input("positions", positions)
        self.rt.write_input("slot_mapping", slots)
        self.rt.write_input("seq_lens", lens)

    def _set_history(self, r: int, ids: Sequence[int]) -> None:
        io = self.io
        assert io is not None
        pairs = history_counts(ids)[:io.hist_cap]  # the first hist_cap distinct ids (the device then drops new ones)
        tok, cnt = pack_history([pairs], io.hist_cap)
        self._hist_tokens[r] = np.frombuffer(tok, dtype="<i4")
        self._hist_counts[r] = np.frombuffer(cnt, dtype="<i4")
        self._hist[r] = {t: i for i, (t, _) in enumerate(pairs)}

    def _append_history(self, r: int, token: int) -> None:
        """The device's kern_sample_history_append on the host mirror of row r: count + 1 where the row holds
        `token`, else the next empty slot gets (token, 1); a full row is left as it is."""
        slots = self._hist[r]
        assert slots is not None and self.io is not None
        slot = slots.get(token)
        if slot is not None:
            self._hist_counts[r, slot] += 1
        elif len(slots) < self.io.hist_cap:
            slot = len(slots)
            slots[token] = slot
            self._hist_tokens[r, slot] = token
            self._hist_counts[r, slot] = 1

    def _sampling_inputs(self, rows: Sequence[DecodeRow], bucket: int) -> None:
        io = self.io
        assert io is not None
        params_high = hist_high = 0
        live = {r.row for r in rows}
        for b in range(bucket):
            if b not in live and self._params_owned[b]:  # padding this step: greedy (the owner may come back)
                self._params[b] = self._greedy
                self._params_owned[b] = False
                params_high = b + 1
        for r in rows:
            changed = self._row_req[r.row] != r.req_id
            if changed and r.history is None:
                raise ConfigError(f"decode row {r.row}: request {r.req_id} is new in the row but carries no history "
                                  "(the scheduler passes it when it places a request)")
            if changed or r.history is not None:
                self._owner_params[r.row] = np.frombuffer(pack_params([r.sampling]), dtype=io.params_dtype)
                self._row_req[r.row] = r.req_id
                self._params_owned[r.row] = False
                if r.sampling.penalizes:
                    self._set_history(r.row, r.history)  # type: ignore[arg-type]
                else:
                    self._hist[r.row] = None
                self._hist_ok[r.row] = False
            if not self._params_owned[r.row]:
                self._params[r.row] = self._owner_params[r.row]
                self._params_owned[r.row] = True
                params_high = max(params_high, r.row + 1)
            if r.sampling.penalizes and not self._hist_ok[r.row]:
                hist_high = max(hist_high, r.row + 1)
        if params_high:
            self.rt.write_input(io.params, self._params[:params_high])
        if hist_high:
            self.rt.write_input(io.hist_tokens, self._hist_tokens[:hist_high])
            self.rt.write_input(io.hist_counts, self._hist_counts[:hist_high])
            for b in range(hist_high):
                self._hist_ok[b] = True

    def _advanced(self, rows: Sequence[DecodeRow], tokens: np.ndarray) -> None:
        """What the device's decode_advance left in the per-row inputs for the next step."""
        if self._advances:
            self._expect = {r.row: (r.req_id, r.position + 1, int(tokens[r.row])) for r in rows}

    # ---------------------------------------------------------------- pipelined decode (ahead.py)

    def _covers(self, rows: Sequence[DecodeRow], step: int) -> bool:
        """Every row's block-table row on the device holds position `position + step`."""
        P = self.page_tokens
        return all(len(self._device_rows[r.row] or ()) * P > r.position + step for r in rows)

    def _enqueue_after(self, rows: Sequence[DecodeRow], bucket: int) -> None:
        """Enqueue the step after `rows` at `bucket` (its inputs advanced on the device) and keep it as ahead."""
        assert self._steps is not None and self._ahead is None
        self.rt.issue("decode", {"tokens": bucket, "seqs": bucket}, eager=self.eager)
        self._ahead = AheadStep.after(rows, bucket, self._steps.record_event())
        self._expect = None  # the device's inputs are now two steps on

    def _ring_rows(self, rows: Sequence[DecodeRow], bucket: int, event: Any) -> np.ndarray:
        """i64[bucket]: each row's entry of the step behind `event` (ring[row, (position + 1) % ring_len]), read
        after the event; padding rows 0."""
        event.wait()
        if self._ring is None:
            assert self._steps is not None
            self._ring = self._steps.host_array(self._ring_name)
        ring_len = int(self._ring.shape[-1])
        raw = np.zeros(bucket, dtype=np.int64)
        for r in rows:
            raw[r.row] = self._ring[r.row, (r.position + 1) % ring_len]
        return raw

    def _drop(self, ahead: AheadStep) -> None:
        """Forget a step enqueued ahead that the next call did not ask for (module docstring)."""
        ahead.event.release()
        self._expect = None
        if self.io is not None:
            for b in range(ahead.bucket):
                self._hist_ok[b] = False  # it appended its tokens to every row's history
        self.ahead_dropped += 1

    def _take(self, ahead: AheadStep, rows: Sequence[DecodeRow], go_on: bool) -> list[Sampled]:
        """`rows`' results from `ahead` (which matches them), first enqueuing the step after it when `go_on`, all
        of its rows continue, no prefill came between, its rows' pages on the device cover that step's positions
        and the scheduler only appended pages to them since (written in place before the step)."""
        bucket = ahead.bucket
        complete = ahead.complete(rows)
        want: list[tuple[int, ...]] = [()] * bucket
        for r in rows:
            want[r.row] = r.page_ids
        grown = all(want[b][:len(self._device_rows[b] or ())] == self._device_rows[b] for b in range(bucket))
        if go_on and complete and not ahead.prefilled and self._covers(rows, 1) and grown:
            self._write_table(want)  # pages granted since: only appended, read from the next position on
            self._enqueue_after(rows, bucket)
        raw = self._ring_rows(rows, bucket, ahead.event)
        self.ahead_used += 1
        return self._finish(rows, bucket, raw, 0, complete and not ahead.prefilled and self._ahead is None)

    # ---------------------------------------------------------------- decode

    def decode(self, rows: Sequence[DecodeRow], ahead: bool = False) -> list[Sampled]:
        assert 1 <= len(rows) <= self.max_seqs and len({r.row for r in rows}) == len(rows), [r.row for r in rows]
        pending, self._ahead = self._ahead, None
        if pending is not None:
            if pending.matches(rows):
                return self._take(pending, rows, ahead)
            self._drop(pending)
        bucket = decode_bucket(max(r.row for r in rows) + 1, self.seqs_max)
        assert bucket <= self._rows, (bucket, self._rows)
        io = self.io
        if io is None:
            for r in rows:
                assert greedy_only_fault(r.sampling) is None, r.sampling  # the HTTP layer refuses the rest
        else:
            self._sampling_inputs(rows, bucket)
        self._step_inputs(rows, bucket)
        self.rt.issue("decode", {"tokens": bucket, "seqs": bucket}, eager=self.eager)
        top = max(r.sampling.top_logprobs for r in rows)
        if top:
            assert io is not None and io.top_program is not None and top <= io.top_n, top  # the HTTP layer checks
            self.rt.issue(io.top_program, {"tokens": bucket, "seqs": bucket}, eager=True)
        elif ahead and self._steps is not None and self._covers(rows, 1):
            event = self._steps.record_event()
            self._enqueue_after(rows, bucket)
            return self._finish(rows, bucket, self._ring_rows(rows, bucket, event), 0, False)
        raw = self.rt.read_output(self._next_token_name, rows=bucket)  # i64[bucket]: 8 bytes a row, synchronises
        return self._finish(rows, bucket, raw, top, True)

    def _finish(self, rows: Sequence[DecodeRow], bucket: int, raw: np.ndarray, top: int,
                advanced: bool) -> list[Sampled]:
        """The step's `Sampled` per row from its packed entries `raw` (i64[bucket]) and, with `top`, the top
        logprobs read back; the host mirrors updated (histories, what the device advanced when `advanced`), and
        the step enqueued ahead, if any, told the tokens it was fed."""
        io = self.io
        self.buckets.append(bucket)
        tokens, logprobs = unpack_packed(raw)  # an argmax manifest's plain ids come out unchanged
        if advanced:
            self._advanced(rows, tokens)
        if self._ahead is not None:
            self._ahead.fed(rows, [int(tokens[r.row]) for r in rows])
        if io is None:
            return [Sampled(int(tokens[r.row])) for r in rows]
        top_ids = top_lps = None
        if top:
            top_ids = np.asarray(self.rt.read_output(io.top_ids, rows=bucket)).view(np.int32)  # i32[bucket, top_n]
            top_lps = np.asarray(self.rt.read_output(io.top_logprobs, rows=bucket)).view(np.float32)
        out = []
        live = set()
        for r in rows:
            token = int(tokens[r.row])
            live.add(r.row)
            if r.sampling.penalizes:
                self._append_history(r.row, token)
            else:
                self._hist_ok[r.row] = False  # appended on the device, not tracked: never read
            n = r.sampling.top_logprobs
            pairs: tuple[tuple[int, float], ...] = ()
            if n:
                assert top_ids is not None and top_lps is not None
                pairs = tuple((int(t), float(v)) for t, v in zip(top_ids[r.row, :n], top_lps[r.row, :n])
                              if t >= 0)  # id -1: past the vocabulary
            out.append(Sampled(token, float(logprobs[r.row]) if r.sampling.logprobs else None, pairs))
        for b in range(bucket):
            if b not in live:
                self._hist_ok[b] = False  # a padding row: the graph appended its token to row b's history
        return out
