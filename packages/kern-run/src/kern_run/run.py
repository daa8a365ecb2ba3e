"""`kern run`: one prompt, or every prompt of a file decoded together in batches, streamed to stdout.

stdout carries only the generated text: one line per prompt, in prompt order (the earliest unfinished prompt
streams as its tokens arrive, later ones are written when their turn comes), each cut before the first of its
stop strings (`stop_text`: never a partial stop string across a token boundary). Everything else goes to
stderr through structlog: the warm-up line (session.open_generator), per prompt its tokens, cached and
prefilled tokens and TTFT, and one summary line (prefill, decode ms per step, tokens/s).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Sequence, TextIO

from .batch import (
    BatchDecoder, BatchOptions, RowRequest, RowResult, TokenInfo, buckets_upto, decode_rows_max, max_rows,
)
from .batch_pages import BatchPages
from .config import RunConfig
from .sampling import SamplingParams
from .session import open_generator, prepare
from .stop_text import TokenText, check_stops


@dataclass(frozen=True)
class RunRequest:
    """What `kern run` asks for every prompt: `steps` tokens at most (--max-tokens), `sampling` (the flags over
    the target's defaults, validated), `stops` (stop strings), and where the sampling settings came from (for
    refusals)."""

    prompt: str
    steps: int = 128
    eager: bool = False
    ignore_eos: bool = False
    sampling: SamplingParams = SamplingParams()
    stops: tuple[str, ...] = ()
    sampling_from: str = "sampling"


class OrderedPrinter:
    """Each row's text on its own line of `out`, rows in order: the first unfinished row is written as its
    text comes (flushed), later rows are kept until every earlier row has ended."""

    def __init__(self, out: TextIO, rows: int) -> None:
        self.out = out
        self._parts: list[list[str]] = [[] for _ in range(rows)]
        self._done = [False] * rows
        self._head = 0

    def text(self, row: int, piece: str) -> None:
        if not piece:
            return
        if row == self._head:
            self.out.write(piece)
            self.out.flush()
        else:
            self._parts[row].append(piece)

    def finish(self, row: int) -> None:
        self._done[row] = True
        while self._head < len(self._done):
            head = self._head
            if self._parts[head]:
                self.out.write("".join(self._parts[head]))
                self._parts[head] = []
            if not self._done[head]:
                break
            self.out.write("\n")
            self._head += 1
        self.out.flush()


def run_target(cfg: RunConfig, req: RunRequest, log: Any, out: TextIO | None = None) -> RowResult:
    """`kern run --prompt P`: preflight, load, warm up, generate one row, stream to `out` (default: stdout).
    Raises RefusalError / kern_runtime.KernError."""
    return _run(cfg, [req.prompt], req, log, out, prefix=False)[0]


def run_prompts(cfg: RunConfig, prompts: list[str], req: RunRequest, log: Any,
                out: TextIO | None = None) -> list[RowResult]:
    """`kern run --prompts FILE`: preflight and load once, then every prompt decoded in batches (kern_run.batch),
    shared prefixes prefilled once (a prefix cache over the runtime's pool). Raises RefusalError /
    kern_runtime.KernError."""
    return _run(cfg, prompts, req, log, out, prefix=True)


def _run(cfg: RunConfig, prompts: Sequence[str], req: RunRequest, log: Any, out: TextIO | None,
         prefix: bool) -> list[RowResult]:
    from kern_pool import Prefix

    out = out if out is not None else sys.stdout
    stops = check_stops(req.stops)
    # every prompt and the sampling settings checked (and named) before the device probe
    prep = prepare(cfg, prompts=prompts, sampling=req.sampling, sampling_from=req.sampling_from)
    all_ids = [tuple(ids) for ids in prep.prompt_ids]
    seqs_max = decode_rows_max(prep.facts)
    sampled = "greedy" if req.sampling.greedy else f"sampled ({_settings(req.sampling)})"
    log.info(f"{len(all_ids)} prompt(s) of {', '.join(str(len(i)) for i in all_ids[:8])}"
             f"{', ...' if len(all_ids) > 8 else ''} tokens; chunk {prep.chunk}; max tokens {req.steps}; {sampled}; "
             f"{'eager' if req.eager else 'graph'} decode, up to {max_rows(seqs_max)} rows per step")
    requests = [RowRequest(ids, req.steps, req.sampling, not req.ignore_eos) for ids in all_ids]
    with open_generator(prep, log, warm_buckets=buckets_upto(len(requests), seqs_max), eager=req.eager) as gen:
        pages = BatchPages(gen.rt, gen.page_tokens, Prefix() if prefix else None, prep.chunk,
                           prep.facts.prefill_batch_invariant)
        decoder = BatchDecoder(gen, BatchOptions(prep.chunk, req.eager), prep.sampler, pages)
        printer = OrderedPrinter(out, len(requests))
        texts = [TokenText(prep.codec, stops) for _ in requests]

        def on_token(i: int, info: TokenInfo) -> bool:
            piece, stopped = texts[i].push(info.token)
            printer.text(i, piece)
            return stopped

        def on_finish(i: int, result: RowResult) -> None:
            printer.text(i, texts[i].finish())
            printer.finish(i)

        try:
            results = decoder.run(requests, on_token, on_finish)
        finally:
            pages.close()
    _log_results(results, decoder, log, prep.codec)
    return results


def _settings(p: SamplingParams) -> str:
    parts = [f"temperature {p.temperature}"]
    for name, value, off in (("top_k", p.top_k, 0), ("top_p", p.top_p, 1.0), ("min_p", p.min_p, 0.0),
                             ("repetition_penalty", p.repetition_penalty, 1.0),
                             ("presence_penalty", p.presence_penalty, 0.0),
                             ("frequency_penalty", p.frequency_penalty, 0.0)):
        if value != off:
            parts.append(f"{name} {value}")
    parts.append(f"seed {p.seed}" if p.seed is not None else "seed random per prompt")
    return ", ".join(parts)


def _log_results(results: list[RowResult], decoder: BatchDecoder, log: Any, codec: Any) -> None:
    t = decoder.timings
    for i, r in enumerate(results, 1):
        decode = ""
        if len(r.tokens) > 1:
            decode = f"; decode {(r.token_s[-1] - r.token_s[0]) * 1e3 / (len(r.tokens) - 1):.3f} ms/token"
        where = f"prompt {i}/{len(results)}: " if len(results) > 1 else ""
        cached = f", {r.cached_tokens} cached" if len(results) > 1 else ""
        log.info(f"{where}{len(r.prompt_ids)} prompt tokens{cached}, prefill {r.prefill_tokens} tokens + first token "
                 f"in {r.ttft_s * 1e3:.1f} ms{decode}; {len(r.tokens)} tokens generated (stop: {r.stop_reason})"
                 f"{f'; seed {r.sampling.seed}' if not r.sampling.greedy else ''}")
        if r.logprobs:
            shown = " ".join(f"{codec.decode([tok])!r}:{lp:.4f}" for tok, lp in zip(r.tokens, r.logprobs))
            log.info(f"{where}logprobs {shown}")
        for k, top in enumerate(r.top_logprobs):
            log.info(f"{where}token {k + 1} top: " + " ".join(f"{codec.decode([tok])!r}:{lp:.4f}" for tok, lp in top))
    if t.pool_limited:
        log.warning(f"{t.pool_limited} wave(s) held fewer than {decoder.max_rows} rows: the KV pool "
                    f"({decoder.pages.max_tokens} tokens) was full; raise --capacity to decode more prompts together")
    generated = sum(len(r.tokens) for r in results)
    steps = " ".join(f"{b}:{n}" for b, n in sorted(t.steps.items()))
    per_step = t.decode_s * 1e3 / t.decode_steps if t.decode_steps else 0.0
    rate = generated / t.decode_s if t.decode_s > 0 else 0.0
    log.info(f"{len(results)} prompt(s) in {t.waves} wave(s): prefill {t.prefill_s * 1e3:.1f} ms; {t.decode_steps} "
             f"decode steps (rows:steps {steps or '-'}; {t.segments} segment(s), "
             f"{'pipelined' if t.pipelined else 'synchronous'}) in {t.decode_s * 1e3:.1f} ms = {per_step:.3f} "
             f"ms/step; {generated} tokens, {rate:.0f} tokens/s")
