#!/usr/bin/env python3
"""Serving benchmark, Qwen3-4B shape: `kern serve` under load from a bounded loopback load generator, against
transformers' own continuous batching on the same weights and request lengths, in one run (GPU machine).

    python3 bench/serve.py [--ckpt /tmp/kern-weights/qwen3-4b] [--manifest M.json] [--decode-manifest invariant|fast]
                           [--rates 4,16,inf] [--requests 64] [--prompt-tokens 512] [--output-tokens 128]
                           [--c1-requests 4] [--trace PATH] [--trace-requests 200] [--trace-seconds 60]
                           [--context 8192] [--only kern,peer] [--time-limit 120] [--json out.json] [--fake]

- The weights: tools/make_checkpoint.py --shape qwen3-4b (made when `--ckpt` lacks them). The manifest: unless
  `--manifest` names one, what `kern serve --weights CKPT --max-seqs 64` builds itself, as a user's first run
  does: batch-invariant (`--decode-manifest invariant`, the default; docs/serve.md "Which manifest") on the cuBLASLt
  pins it picks on this GPU on first use (prefill pins and the split-K invariant decode pins, cached under the
  user's cache directory), or with `--no-invariant` (`fast`: the v2 GEMV decode at one row, small-M cuBLASLt
  from two), the GPU sampler either way. The manifest path is read from the server's `built manifest` /
  `reused manifest` line, for the `kern run` comparison.
- `kern`: `kern serve` started here as a subprocess on a free loopback port (`--max-seqs 64`), then, one after
  another, these scenarios (each bounded by `--requests` / `--trace-requests` and `--time-limit`):
  * `poisson R/s`: `--requests` requests of `--prompt-tokens` random token ids (no shared prefix) and
    `--output-tokens` generated tokens (`ignore_eos`), arriving as a Poisson process at each rate of `--rates`
    (`inf`: all at once, the peer's closed batch).
  * `concurrency 1`: `--c1-requests` requests of the text `--c1-prompt` and `--output-tokens` tokens, one at a
    time; after kern serve has stopped, `kern run` of the same prompt on the same manifest (its logged `decode X
    ms/token`): the note compares the two TPOTs (issue 27: within 5%).
  * `mooncake`: the first `--trace-requests` requests of the Mooncake conversation trace (../shared/traces):
    input and output lengths scaled by one factor so the longest fits `--context`, its 512-token prefix blocks
    scaled alike and filled with token ids drawn from the block's hash id (requests that share hash ids share
    those prompt tokens), arrivals at the trace's timestamps compressed into `--trace-seconds`.
  * `prefix cold` / `prefix hit`: `--prefix-colds` requests, each of its own `--prefix-tokens` prefix plus 16
    tokens, then `--prefix-hits` more with the last one's prefix and other suffixes, one at a time (TTFT p50 on a
    prefix hit against the cold requests' p50: one cold request's TTFT varied 53-150 ms between runs).
  Every request streams (`stream: true`). Per request: TTFT = send -> first streamed chunk, TPOT = (last chunk
  - first chunk) / (tokens - 1), tokens from the usage chunk. Output tok/s = all generated tokens / (first send
  -> last response). Prefix hit rate, parks, wakes, preemptions, the mean rows of a decode step and the decode
  steps enqueued ahead (used / dropped) come from `/metrics` (differences over the scenario).
- `peer`: transformers `generate_batch` (continuous batching, `paged|sdpa` attention) on the same checkpoint in a
  subprocess after kern serve has stopped: the `inf` scenario's requests (same prompt ids, same lengths, greedy,
  EOS ignored) in one call (`peer_plan`: what it runs, checked before anything starts). Output tok/s = generated
  tokens / wall time of the call; TTFT / TPOT from its outputs' timestamps where it records them.
- `--fake` (a CPU smoke run, no GPU, numbers meaningless): bench/serve_fake.py in place of `kern serve` (the real
  app, scheduler and loop over the fake engine) and of `kern run`; the peer is planned, not run.

Only loopback addresses are ever a target (`check_loopback`). Prints one table last; JSON to `--json`, else
$OUT/bench-serve.json when OUT is set. Exit 1 when nothing was measured.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import math
import os
import random
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
TRACE_BLOCK_TOKENS = 512  # the Mooncake trace's prefix-hash block
TOKEN_ID_LOW, TOKEN_ID_HIGH = 1000, 100_000  # prompt token ids drawn from here (inside every Qwen3 vocabulary)
MAX_REQUESTS = 5000  # the most requests one scenario may send, whatever the flags say
METRICS = ("kern_prefix_lookup_tokens_total", "kern_prefix_reused_tokens_total", "kern_parks_total",
           "kern_wakes_total", "kern_preemptions_total", "kern_decode_rows_sum", "kern_decode_rows_count",
           "kern_evictions_total", 'kern_decode_ahead_total{outcome="used"}',
           'kern_decode_ahead_total{outcome="dropped"}')
C1_PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
HERE = Path(__file__).resolve().parent


# ---------------------------------------------------------------- pure parts (tests/serve/test_bench_serve_cpu.py)


def check_loopback(url: str) -> str:
    """`url` when its host is a loopback address (127.0.0.0/8, ::1, or `localhost`); else ValueError. The load
    generator sends nothing anywhere else."""
    host = urlsplit(url).hostname
    if host is None:
        raise ValueError(f"{url!r}: no host")
    if host == "localhost":
        return url
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{url!r}: the host must be a loopback address (127.0.0.1, ::1, localhost), not {host!r}") \
            from None
    if not addr.is_loopback:
        raise ValueError(f"{url!r}: {host} is not a loopback address; the load generator targets loopback only")
    return url


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """`n` arrival times (seconds from the start, non-decreasing) of a Poisson process of `rate` requests/s: the
    gaps are exponential with mean 1 / rate, the first arrival at 0. `rate` inf: all at 0. Raises ValueError for
    n < 0 or rate <= 0."""
    if n < 0 or not rate > 0:
        raise ValueError(f"poisson_arrivals: n {n} >= 0 and rate {rate} > 0 expected")
    if math.isinf(rate):
        return [0.0] * n
    rnd = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        if i:
            t += rnd.expovariate(rate)
        out.append(t)
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0..100) of `values` with linear interpolation between the closest ranks (numpy's
    default); NaN for no values."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class BenchRequest:
    """One request of a scenario: `prompt` token ids (or, when `text` is given, that text, tokenized by the server),
    `max_tokens` generated, sent `at` seconds after the start."""

    at: float
    prompt: tuple[int, ...]
    max_tokens: int
    text: str | None = None


def random_prompt(n: int, seed: int | str) -> tuple[int, ...]:
    """`n` token ids drawn from random.Random(`seed`) (a str seed hashes with SHA-512: the same ids in every run)."""
    rnd = random.Random(seed)
    return tuple(rnd.randrange(TOKEN_ID_LOW, TOKEN_ID_HIGH) for _ in range(n))


def poisson_requests(n: int, rate: float, prompt_tokens: int, output_tokens: int, seed: int) -> list[BenchRequest]:
    """`n` requests of distinct random prompts at Poisson arrivals (`poisson_arrivals`)."""
    return [BenchRequest(at, random_prompt(prompt_tokens, seed * 100_003 + i), output_tokens)
            for i, at in enumerate(poisson_arrivals(n, rate, seed))]


def prefix_requests(prefix_tokens: int, hits: int, output_tokens: int, seed: int,
                    colds: int = 1) -> list[BenchRequest]:
    """`colds` requests, each of its own `prefix_tokens` prefix (cold: no other request shares it), then `hits`
    requests sharing the last cold one's prefix (hits); every request has 16 tokens of its own after the prefix."""
    # seeds of their own namespace: an integer seed would meet the Poisson prompts' (seed * 100_003 + i) and the
    # trace blocks' hash ids, and the "cold" prefix would start with tokens an earlier request had cached
    prefixes = [random_prompt(prefix_tokens, f"prefix/{seed}/{c}") for c in range(colds)]
    cold = [BenchRequest(0.0, p + random_prompt(16, f"suffix/{seed}/cold/{c}"), output_tokens)
            for c, p in enumerate(prefixes)]
    return cold + [BenchRequest(0.0, prefixes[-1] + random_prompt(16, f"suffix/{seed}/hit/{i}"), output_tokens)
                   for i in range(hits)]


def c1_requests(n: int, text: str, output_tokens: int) -> list[BenchRequest]:
    """The concurrency-1 scenario: `n` requests of the text `text` (the prompt `kern run --prompt` is given)."""
    return [BenchRequest(0.0, (), output_tokens, text) for _ in range(n)]


def parse_run_tpot(log: str) -> float | None:
    """The decode ms per token `kern run` logs for its prompt (`...; decode X ms/token; ...`), or None."""
    m = re.search(r"decode ([0-9]+(?:\.[0-9]+)?) ms/token", log)
    return float(m.group(1)) if m else None


def c1_note(serve_tpot_ms: float, run_tpot_ms: float | None, what: str) -> str:
    """The concurrency-1 comparison line (issue 27's target: kern serve's TPOT within 5% of kern run's)."""
    if run_tpot_ms is None or not run_tpot_ms > 0 or serve_tpot_ms != serve_tpot_ms:
        return f"concurrency 1: kern serve TPOT p50 {serve_tpot_ms:.3f} ms; {what} TPOT not measured"
    ratio = serve_tpot_ms / run_tpot_ms
    verdict = "within" if ratio <= 1.05 else "outside"
    return (f"concurrency 1: kern serve TPOT p50 {serve_tpot_ms:.3f} ms vs {what} {run_tpot_ms:.3f} ms/token: "
            f"{100 * (ratio - 1):+.1f}% ({verdict} the 5% target)")


def peer_plan(requests: int, prompt_tokens: int, output_tokens: int, seed: int, attn: str,
              cb_config: str) -> dict[str, Any]:
    """What the peer runs: the closed batch's requests (the `inf` scenario's prompts), its GenerationConfig fields
    (greedy, EOS ignored, exactly `output_tokens` new tokens) and the ContinuousBatchingConfig fields of the
    `--peer-cb-config` JSON object. Raises ValueError naming the flag for JSON that is not an object."""
    try:
        fields = json.loads(cb_config)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--peer-cb-config {cb_config!r}: not JSON ({exc.msg})") from None
    if not isinstance(fields, dict):
        raise ValueError(f"--peer-cb-config {cb_config!r}: expected a JSON object of ContinuousBatchingConfig fields")
    reqs = poisson_requests(requests, math.inf, prompt_tokens, output_tokens, seed)
    gen = {"max_new_tokens": output_tokens, "min_new_tokens": output_tokens, "do_sample": False,
           "eos_token_id": None, "pad_token_id": 0}
    return {"inputs": [list(r.prompt) for r in reqs], "generation_config": gen, "cb_config": fields, "attn": attn}


def read_trace(path: Path, limit: int) -> list[dict[str, Any]]:
    """The first `limit` records of a Mooncake trace (JSON lines: timestamp ms, input_length, output_length,
    hash_ids). Raises ValueError naming the line for a record without those fields or with
    len(hash_ids) != ceil(input_length / 512)."""
    out = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if len(out) >= limit:
                break
            if not line.strip():
                continue
            rec = json.loads(line)
            try:
                ok = (len(rec["hash_ids"]) == -(-int(rec["input_length"]) // TRACE_BLOCK_TOKENS)
                      and int(rec["output_length"]) >= 1 and float(rec["timestamp"]) >= 0)
            except (KeyError, TypeError, ValueError):
                ok = False
            if not ok:
                raise ValueError(f"{path}:{lineno}: not a Mooncake trace record: {line.strip()[:120]}")
            out.append(rec)
    return out


def trace_scale(records: Sequence[dict[str, Any]], context: int) -> float:
    """The one factor (<= 1) that scales every record's input + output length so the longest fits `context`
    positions (prompt + generated tokens - 1 <= context - 1)."""
    longest = max(int(r["input_length"]) + int(r["output_length"]) for r in records)
    return min(1.0, (context - 1) / longest)


def trace_requests(records: Sequence[dict[str, Any]], context: int, seconds: float, seed: int = 0
                   ) -> tuple[list[BenchRequest], float]:
    """(requests, scale) of a Mooncake trace window scaled to `context` (`trace_scale`): input and output
    lengths times the scale (at least 1 token each), the 512-token hash blocks times the scale (at least 1
    token), block `h` filled with token ids drawn from (seed, h) so requests sharing a leading hash id share
    those tokens; arrivals at the timestamps, compressed so the last arrives at `seconds` (not stretched when
    the window is shorter)."""
    scale = trace_scale(records, context)
    block = max(1, round(TRACE_BLOCK_TOKENS * scale))
    t_last = max(float(r["timestamp"]) for r in records) / 1e3
    squeeze = min(1.0, seconds / t_last) if t_last > 0 else 1.0
    blocks: dict[int, tuple[int, ...]] = {}
    out = []
    for r in records:
        n_in = max(1, round(int(r["input_length"]) * scale))
        n_out = max(1, round(int(r["output_length"]) * scale))
        ids: list[int] = []
        for h in r["hash_ids"]:
            if h not in blocks:
                blocks[h] = random_prompt(block, seed * 1_000_003 + int(h))
            ids.extend(blocks[h])
            if len(ids) >= n_in:
                break
        ids = ids[:n_in]
        while len(ids) < n_in:  # a scaled length past its scaled blocks (rounding): pad from the last block
            ids.append(ids[-1] if ids else TOKEN_ID_LOW)
        out.append(BenchRequest(float(r["timestamp"]) / 1e3 * squeeze, tuple(ids), n_out))
    return out, scale


def parse_metrics(text: str) -> dict[str, float]:
    """`name -> value` of the samples of a Prometheus text exposition (METRICS and the rest); a labelled sample
    keyed by its name and labels as written (`kern_decode_ahead_total{outcome="used"}`)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


@dataclass
class Outcome:
    """One request's measurements (seconds from the scenario start; tokens from the usage chunk)."""

    sent: float
    first: float | None = None
    last: float | None = None
    tokens: int = 0
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.sent

    @property
    def tpot(self) -> float | None:
        if self.first is None or self.last is None or self.tokens < 2:
            return None
        return (self.last - self.first) / (self.tokens - 1)


def summarize(name: str, outcomes: Sequence[Outcome], before: dict[str, float], after: dict[str, float]
              ) -> dict[str, Any]:
    """The scenario's row: requests done / failed, output tok/s, TTFT and TPOT p50 / p99 (ms), and the server's
    counters over the scenario (prefix hit rate, parks, wakes, preemptions, mean decode rows)."""
    done = [o for o in outcomes if o.error is None and o.last is not None]
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in METRICS}
    span = (max(o.last for o in done) - min(o.sent for o in done)) if done else float("nan")  # type: ignore[type-var]
    tokens = sum(o.tokens for o in done)
    ttft = [1e3 * o.ttft for o in done if o.ttft is not None]
    tpot = [1e3 * o.tpot for o in done if o.tpot is not None]
    lookup = delta["kern_prefix_lookup_tokens_total"]
    rows = delta["kern_decode_rows_count"]
    used, dropped = (delta[f'kern_decode_ahead_total{{outcome="{o}"}}'] for o in ("used", "dropped"))
    return {
        "scenario": name, "requests": len(outcomes), "done": len(done), "failed": len(outcomes) - len(done),
        "output_tokens": tokens, "seconds": span, "output_tok_s": tokens / span if done and span > 0 else float("nan"),
        "ttft_ms_p50": percentile(ttft, 50), "ttft_ms_p99": percentile(ttft, 99),
        "tpot_ms_p50": percentile(tpot, 50), "tpot_ms_p99": percentile(tpot, 99),
        "prefix_hit_rate": delta["kern_prefix_reused_tokens_total"] / lookup if lookup else 0.0,
        "parks": delta["kern_parks_total"], "wakes": delta["kern_wakes_total"],
        "preemptions": delta["kern_preemptions_total"], "evictions": delta["kern_evictions_total"],
        "mean_decode_rows": delta["kern_decode_rows_sum"] / rows if rows else float("nan"),
        "ahead_used": used, "ahead_dropped": dropped,
        "errors": sorted({o.error for o in outcomes if o.error})[:3],
    }


def table(rows: Sequence[dict[str, Any]], notes: Iterable[str] = ()) -> str:
    """The results as one text table (NaN shown as -)."""
    def f(v: Any, fmt: str) -> str:
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    head = (f"{'scenario':34s} {'reqs':>5s} {'fail':>4s} {'out tok/s':>10s} {'TTFT p50':>9s} {'p99':>8s} "
            f"{'TPOT p50':>9s} {'p99':>7s} {'hit':>5s} {'parks':>6s} {'wakes':>6s} {'rows':>5s}")
    lines = ["", "===== kern serve under load (TTFT / TPOT in ms; hit: prefix hit rate; rows: mean decode rows)",
             head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['scenario'][:34]:34s} {r['requests']:>5d} {r.get('failed', 0):>4d} "
                     f"{f(r.get('output_tok_s'), '10.1f'):>10s} {f(r.get('ttft_ms_p50'), '9.1f'):>9s} "
                     f"{f(r.get('ttft_ms_p99'), '8.1f'):>8s} {f(r.get('tpot_ms_p50'), '9.2f'):>9s} "
                     f"{f(r.get('tpot_ms_p99'), '7.2f'):>7s} {f(r.get('prefix_hit_rate'), '5.2f'):>5s} "
                     f"{f(r.get('parks'), '6.0f'):>6s} {f(r.get('wakes'), '6.0f'):>6s} "
                     f"{f(r.get('mean_decode_rows'), '5.1f'):>5s}")
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


# ---------------------------------------------------------------- the load generator


async def _one(client: Any, url: str, model: str, req: BenchRequest, t0: float, out: Outcome) -> None:
    body = {"model": model, "prompt": req.text if req.text is not None else list(req.prompt),
            "max_tokens": req.max_tokens, "stream": True, "ignore_eos": True, "temperature": 0}
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                out.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode()[:200]}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    out.error = str(event["error"].get("message"))[:200]
                    return
                now = time.perf_counter() - t0
                if event.get("choices"):
                    if out.first is None:
                        out.first = now
                    out.last = now
                if event.get("usage"):
                    out.tokens = int(event["usage"]["completion_tokens"])
    except Exception as exc:  # noqa: BLE001 - a failed request is counted, the scenario goes on
        out.error = f"{type(exc).__name__}: {exc}"[:200]


async def run_requests(base: str, model: str, requests: Sequence[BenchRequest], time_limit: float
                       ) -> list[Outcome]:
    """Send `requests` to `base` (a loopback URL) at their arrival times and stream the responses; stops sending
    at `time_limit` seconds and cancels what is still running then (the server cancels those requests too)."""
    import httpx

    check_loopback(base)
    if len(requests) > MAX_REQUESTS:
        raise ValueError(f"{len(requests)} requests: at most {MAX_REQUESTS} per scenario")
    url = f"{base}/v1/completions"
    limits = httpx.Limits(max_connections=len(requests) + 8, max_keepalive_connections=64)
    outcomes: list[Outcome] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(time_limit + 30), limits=limits) as client:
        t0 = time.perf_counter()
        tasks = []
        for req in sorted(requests, key=lambda r: r.at):
            if req.at > time_limit:
                break
            delay = req.at - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            out = Outcome(sent=time.perf_counter() - t0)
            outcomes.append(out)
            tasks.append(asyncio.create_task(_one(client, url, model, req, t0, out)))
        left = time_limit - (time.perf_counter() - t0)
        _, pending = await asyncio.wait(tasks, timeout=max(left, 0.1)) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        for task, out in zip(tasks, outcomes):
            if task in pending:
                out.error = f"cut at the {time_limit:.0f} s time limit"
        await asyncio.gather(*pending, return_exceptions=True)
    return outcomes


async def run_one_at_a_time(base: str, model: str, requests: Sequence[BenchRequest], time_limit: float
                            ) -> list[Outcome]:
    """Send `requests` one after another (each once the last has finished), within `time_limit` seconds."""
    import httpx

    check_loopback(base)
    outcomes: list[Outcome] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(time_limit + 30)) as client:
        t0 = time.perf_counter()
        for req in requests:
            left = time_limit - (time.perf_counter() - t0)
            if left <= 0:
                break
            out = Outcome(sent=time.perf_counter() - t0)
            outcomes.append(out)
            try:
                await asyncio.wait_for(_one(client, f"{base}/v1/completions", model, req, t0, out), left)
            except asyncio.TimeoutError:
                out.error = f"cut at the {time_limit:.0f} s time limit"
    return outcomes


def scrape(base: str) -> dict[str, float]:
    import httpx

    return parse_metrics(httpx.get(f"{check_loopback(base)}/metrics", timeout=10).text)


def run_scenario(base: str, model: str, name: str, requests: Sequence[BenchRequest], time_limit: float
                 ) -> dict[str, Any]:
    before = scrape(base)
    outcomes = asyncio.run(run_requests(base, model, requests, time_limit))
    row = summarize(name, outcomes, before, scrape(base))
    print(json.dumps(row), flush=True)
    return row


# ---------------------------------------------------------------- kern serve and the peer


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def served_manifest(log: str) -> Path | None:
    """The manifest `kern serve --weights` says it built or reused (`kern serve: built manifest PATH (...)`), or
    None when the log names none."""
    m = re.search(r"^kern serve: (?:built|reused) manifest (\S+) \(", log, re.M)
    return Path(m.group(1)) if m else None


def server_command(args: argparse.Namespace, manifest: Path | None, port: int) -> list[str]:
    """`kern serve` of `manifest` on 127.0.0.1:`port`, or with `--fake` bench/serve_fake.py's server."""
    if args.fake:
        return [sys.executable, str(HERE / "serve_fake.py"), "serve", "--host", "127.0.0.1", "--port", str(port),
                "--model", "bench", "--max-seqs", str(args.max_seqs), "--context", str(args.context),
                "--capacity", str(args.capacity), "--step-ms", str(args.fake_step_ms), "--max-queue", str(MAX_REQUESTS)]
    # no --manifest: kern serve --weights builds its own (and picks the pins on first use)
    chosen = ["--manifest", str(manifest), "--kernels", str(args.kernels)] if manifest is not None else \
        ([] if args.decode_manifest == "invariant" else ["--no-invariant"])
    return [sys.executable, "-m", "kern_run", "serve", *chosen,
            "--weights", str(args.ckpt), "--host", "127.0.0.1", "--port", str(port), "--max-seqs", str(args.max_seqs),
            "--capacity", str(args.capacity), "--host-gib", str(args.host_gib), "--max-queue", str(MAX_REQUESTS),
            "--model-name", "bench", "--drain-timeout", "5", "--log-level", "info", "--gpu", str(args.gpu)]


def run_command(args: argparse.Namespace, manifest: Path | None) -> list[str]:
    """`kern run` of the concurrency-1 prompt on `manifest` (or the fake's stand-in), EOS ignored."""
    if args.fake:
        return [sys.executable, str(HERE / "serve_fake.py"), "run", "--prompt", args.c1_prompt, "--max-tokens",
                str(args.output_tokens), "--context", str(args.context), "--step-ms", str(args.fake_step_ms)]
    return [sys.executable, "-m", "kern_run", "run", "--manifest", str(manifest), "--kernels", str(args.kernels),
            "--weights", str(args.ckpt), "--prompt", args.c1_prompt, "--max-tokens", str(args.output_tokens),
            "--ignore-eos", "--capacity", str(min(args.capacity, args.context)), "--gpu", str(args.gpu)]


def start_server(args: argparse.Namespace, manifest: Path | None, log: Path) -> tuple[subprocess.Popen, str]:
    import httpx

    port = args.port or free_port()
    base = check_loopback(f"http://127.0.0.1:{port}")
    with open(log, "w") as sink:  # the child keeps its own descriptor
        proc = subprocess.Popen(server_command(args, manifest, port), stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + args.start_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited {proc.returncode}: {log.read_text()[-1500:]}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the server is not healthy after {args.start_timeout:.0f} s: {log.read_text()[-1500:]}")


def run_alone_tpot(args: argparse.Namespace, manifest: Path | None, notes: list[str]) -> float | None:
    """`kern run`'s decode ms per token for the concurrency-1 prompt (None, with a note, when it fails)."""
    try:
        proc = subprocess.run(run_command(args, manifest), capture_output=True, text=True, timeout=args.peer_timeout)
    except subprocess.TimeoutExpired:
        notes.append(f"kern run: timed out after {args.peer_timeout:.0f} s")
        return None
    tpot = parse_run_tpot(proc.stderr)
    if proc.returncode != 0 or tpot is None:
        notes.append(f"kern run: exit {proc.returncode}, no `decode X ms/token` line: {proc.stderr.strip()[-400:]}")
    return tpot


def peer_worker(args: argparse.Namespace) -> None:
    """transformers `generate_batch` over `peer_plan`'s requests; one JSON line on stdout."""
    import torch
    from transformers import GenerationConfig

    from kern_run.reference import HfReference

    plan = peer_plan(args.requests, args.prompt_tokens, args.output_tokens, args.seed, args.peer_attn,
                     args.peer_cb_config)
    t0 = time.perf_counter()
    model = HfReference(Path(args.ckpt), gpu=args.gpu, attn_implementation=plan["attn"]).model
    load_s = time.perf_counter() - t0
    gc = GenerationConfig(**plan["generation_config"])
    inputs = plan["inputs"]
    kwargs: dict[str, Any] = {}
    if plan["cb_config"]:
        from transformers.generation import ContinuousBatchingConfig

        kwargs["continuous_batching_config"] = ContinuousBatchingConfig(**plan["cb_config"])

    def generate(ids: list[list[int]], config: Any) -> Any:
        try:
            return model.generate_batch(inputs=ids, generation_config=config, record_timestamps=True, **kwargs)
        except TypeError:  # a transformers without per-token timestamps
            return model.generate_batch(inputs=ids, generation_config=config, **kwargs)

    def problems(outs: list[Any]) -> list[str]:  # what the peer's outputs say about requests that produced nothing
        return [f"{getattr(o, 'status', '?')}: {str(getattr(o, 'error', None) or 'no tokens')[:200]}"
                for o in outs if not getattr(o, "generated_tokens", None)]

    # not under torch.inference_mode(): generate_batch steps on its own thread, where the mode is off, and resets
    # tensors made under it in place ("Inplace update to inference tensor outside InferenceMode", transformers
    # 5.17 on the H200, 2026-12-02: every request came back without a token); it runs its forward under no_grad
    warm = generate(inputs[:2], GenerationConfig(max_new_tokens=4, do_sample=False, eos_token_id=None,
                                                 pad_token_id=0))
    warm_outs = list(warm.values()) if isinstance(warm, dict) else list(warm)
    warm_tokens = sum(len(getattr(o, "generated_tokens", None) or ()) for o in warm_outs)
    torch.cuda.synchronize()  # warm-up done
    t1 = time.perf_counter()
    outputs = generate(inputs, gc)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t1
    outs = list(outputs.values()) if isinstance(outputs, dict) else list(outputs)
    bad = problems(outs)
    tokens = sum(len(getattr(o, "generated_tokens", None) or ()) for o in outs)
    report = (f"{tokens} tokens, {len(bad)} of {len(outs)} requests without a token{': ' + bad[0] if bad else ''}; "
              f"warm-up {warm_tokens} tokens")  # what the outputs said
    print(report, file=sys.stderr, flush=True)
    ttft, tpot, source = [], [], "timestamps"
    for o in outs:
        stamps = getattr(o, "timestamps", None)
        created = getattr(o, "created_time", None)
        span = getattr(o, "lifespan", None)
        if stamps and created is not None:
            ttft.append(1e3 * (stamps[0] - created))
            if len(stamps) > 1:
                tpot.append(1e3 * (stamps[-1] - stamps[0]) / (len(stamps) - 1))
        elif span and span[1] > span[0] > 0 and o.generated_tokens:  # scheduled -> finished, prefill included
            source = "lifespan / tokens (an upper bound)"
            tpot.append(1e3 * (span[1] - span[0]) / len(o.generated_tokens))
    print(json.dumps({"scenario": f"peer: transformers generate_batch ({plan['attn']})", "requests": len(inputs),
                      "done": len(outs) - len(bad), "failed": len(inputs) - len(outs) + len(bad),
                      "output_tokens": tokens, "seconds": wall,
                      "output_tok_s": tokens / wall, "ttft_ms_p50": percentile(ttft, 50),
                      "ttft_ms_p99": percentile(ttft, 99), "tpot_ms_p50": percentile(tpot, 50),
                      "tpot_ms_p99": percentile(tpot, 99), "tpot_from": source, "load_s": load_s, "report": report,
                      "transformers": __import__("transformers").__version__}), flush=True)


def peer_command(args: argparse.Namespace) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--worker", "peer", "--ckpt", str(args.ckpt), "--gpu",
            str(args.gpu), "--requests", str(args.requests), "--prompt-tokens", str(args.prompt_tokens),
            "--output-tokens", str(args.output_tokens), "--seed", str(args.seed), "--peer-attn", args.peer_attn,
            "--peer-cb-config", args.peer_cb_config]


def run_peer(args: argparse.Namespace, notes: list[str], out_dir: Path) -> dict[str, Any] | None:
    """The peer worker in its own process (GPU memory isolated, killed after --peer-timeout); its stderr goes to
    `out_dir`/bench-serve-peer.log, what its outputs said into `notes`."""
    try:
        proc = subprocess.run(peer_command(args), capture_output=True, text=True, timeout=args.peer_timeout)
    except subprocess.TimeoutExpired:
        notes.append(f"peer: timed out after {args.peer_timeout:.0f} s")
        return None
    log = out_dir / "bench-serve-peer.log"
    log.write_text(proc.stderr)
    notes.append(f"peer log: {log}")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if rows and rows[-1].get("report"):
        notes.append(f"peer: {rows[-1]['report']}")
    if proc.returncode != 0 or not rows:
        notes.append(f"peer: exit {proc.returncode}: {proc.stderr.strip()[-400:]}")
        return None
    return rows[-1]


# ---------------------------------------------------------------- main


def _rates(text: str) -> list[float]:
    return [math.inf if r.strip() in ("inf", "closed") else float(r) for r in text.split(",") if r.strip()]


def default_trace() -> Path:
    for candidate in (ROOT.parent / "shared" / "traces", ROOT / "shared" / "traces"):
        path = candidate / "mooncake_conversation_trace.jsonl"
        if path.is_file():
            return path
    return ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--ckpt", type=Path, default=Path(os.environ.get("KERN_WEIGHTS", "/tmp/kern-weights")) / "qwen3-4b")
    p.add_argument("--manifest", type=Path, default=None, help="default: built with --seqs-max (see above)")
    p.add_argument("--decode-manifest", choices=["invariant", "fast"], default="invariant",
                   help="without --manifest: kern serve --weights's own manifest, batch-invariant (invariant) or "
                   "--no-invariant (fast)")
    p.add_argument("--kernels", type=Path, default=ROOT / "kernels")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--only", default="kern,peer")
    p.add_argument("--rates", default="4,16,inf", help="Poisson arrival rates, requests/s (inf: all at once)")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--c1-requests", type=int, default=4, help="0: no concurrency-1 scenario")
    p.add_argument("--c1-prompt", default=C1_PROMPT)
    p.add_argument("--prefix-tokens", type=int, default=2048)
    p.add_argument("--prefix-hits", type=int, default=8, help="0: no prefix scenario")
    p.add_argument("--prefix-colds", type=int, default=5, help="cold requests (each its own prefix): their median "
                   "TTFT is the one a hit is compared with (one cold request varied 3x between runs, 2026-12-02)")
    p.add_argument("--trace", type=Path, default=default_trace())
    p.add_argument("--trace-requests", type=int, default=200, help="0: no trace scenario")
    p.add_argument("--trace-seconds", type=float, default=60.0)
    p.add_argument("--context", type=int, default=8192, help="manifest context; the trace is scaled to it")
    p.add_argument("--max-seqs", type=int, default=64)
    p.add_argument("--capacity", type=int, default=262_144, help="KV pool tokens (kern serve --capacity)")
    p.add_argument("--host-gib", type=float, default=16.0)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit", type=float, default=120.0, help="seconds per scenario at most")
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--peer-attn", default="paged|sdpa")
    p.add_argument("--peer-cb-config", default="{}", help="ContinuousBatchingConfig fields (JSON; {}: the "
                   "defaults, no config passed), e.g. '{\"use_cuda_graph\": true}'")
    p.add_argument("--peer-timeout", type=float, default=900.0)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--fake", action="store_true", help="CPU smoke run: bench/serve_fake.py for kern serve and kern "
                   "run, the peer only planned")
    p.add_argument("--fake-step-ms", type=float, default=1.0, help="with --fake: the fake engine's ms per step")
    p.add_argument("--worker", choices=["peer"], help=argparse.SUPPRESS)
    return p


def kern_scenarios(args: argparse.Namespace, base: str, rows: list[dict[str, Any]], notes: list[str]) -> None:
    """Every kern serve scenario against the server at `base`, in order (module docstring)."""
    for rate in _rates(args.rates):
        reqs = poisson_requests(args.requests, rate, args.prompt_tokens, args.output_tokens, args.seed)
        label = "closed batch (all at once)" if math.isinf(rate) else f"{rate:g}/s"
        rows.append(run_scenario(base, "bench", f"poisson {label} {args.prompt_tokens}/{args.output_tokens}",
                                 reqs, args.time_limit))
    if args.c1_requests:
        before = scrape(base)
        outs = asyncio.run(run_one_at_a_time(base, "bench", c1_requests(args.c1_requests, args.c1_prompt,
                                                                        args.output_tokens), args.time_limit))
        rows.append(summarize(f"concurrency 1 (text)/{args.output_tokens}", outs, before, scrape(base)))
    if args.prefix_hits:
        before = scrape(base)
        reqs = prefix_requests(args.prefix_tokens, args.prefix_hits, 16, args.seed, args.prefix_colds)
        colds = asyncio.run(run_one_at_a_time(base, "bench", reqs[:args.prefix_colds], args.time_limit))
        middle = scrape(base)
        hits = asyncio.run(run_one_at_a_time(base, "bench", reqs[args.prefix_colds:], args.time_limit))
        label = f"{args.prefix_tokens}+16 one at a time"
        rows.append(summarize(f"prefix cold {label}", colds, before, middle))
        rows.append(summarize(f"prefix hit {label}", hits, middle, scrape(base)))
        cold, hit = rows[-2]["ttft_ms_p50"], rows[-1]["ttft_ms_p50"]
        if cold == cold and hit == hit and cold > 0:  # not NaN
            notes.append(f"prefix hit TTFT p50 {hit:.1f} ms = {100 * hit / cold:.0f}% of the cold p50 {cold:.1f} ms "
                         f"(median of {args.prefix_colds} cold requests, each its own {args.prefix_tokens}-token "
                         f"prefix; {args.prefix_hits} hits on the last one's)")
    if args.trace_requests:
        if args.trace.is_file():
            records = read_trace(args.trace, args.trace_requests)
            reqs, scale = trace_requests(records, args.context, args.trace_seconds, args.seed)
            mean_in = sum(len(r.prompt) for r in reqs) / len(reqs)
            mean_out = sum(r.max_tokens for r in reqs) / len(reqs)
            notes.append(f"mooncake: {len(reqs)} requests of {args.trace.name}, lengths x {scale:.4f} "
                         f"(context {args.context}), mean prompt {mean_in:.0f} / output {mean_out:.0f} tokens, "
                         f"arrivals over {max(r.at for r in reqs):.0f} s")
            rows.append(run_scenario(base, "bench", "mooncake conversation (scaled)", reqs, args.time_limit))
        else:
            notes.append(f"mooncake: {args.trace} not found (pass --trace; ../shared does not travel)")


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.worker == "peer":
        peer_worker(args)
        return 0
    if not 1 <= args.requests <= MAX_REQUESTS or not 0 <= args.trace_requests <= MAX_REQUESTS:
        p.error(f"--requests and --trace-requests: at most {MAX_REQUESTS}")
    if not 0 <= args.c1_requests <= MAX_REQUESTS:
        p.error(f"--c1-requests: 0..{MAX_REQUESTS}")
    if not 1 <= args.prefix_colds <= MAX_REQUESTS:
        p.error(f"--prefix-colds: 1..{MAX_REQUESTS}")
    try:  # the peer's plan is checked before anything starts
        plan = peer_plan(args.requests, args.prompt_tokens, args.output_tokens, args.seed, args.peer_attn,
                         args.peer_cb_config)
    except ValueError as exc:
        p.error(str(exc))
    only = {s for s in args.only.split(",") if s}
    notes: list[str] = ["--fake: bench/serve_fake.py's fake engine on the CPU, numbers meaningless"] \
        if args.fake else []
    rows: list[dict[str, Any]] = []
    out_dir = Path(os.environ.get("OUT") or "/tmp/kern-bench-serve")
    out_dir.mkdir(parents=True, exist_ok=True)
    if not args.fake and not (args.ckpt / "config.json").is_file():
        print(f"# {args.ckpt} missing: making it (tools/make_checkpoint.py --shape qwen3-4b)", flush=True)
        subprocess.run([sys.executable, str(ROOT / "tools" / "make_checkpoint.py"), "--shape", "qwen3-4b", "--out",
                        str(args.ckpt)], check=True)
    manifest = None
    if "kern" in only:
        manifest = args.manifest
        server_log = out_dir / "bench-serve-server.log"
        proc, base = start_server(args, manifest, server_log)
        if manifest is None and not args.fake:
            manifest = served_manifest(server_log.read_text(errors="replace"))
            notes.append(f"manifest: {manifest} (kern serve --weights, built or reused by the server)" if manifest
                         else "manifest: the server's log names none; the kern run comparison is skipped")
        try:
            kern_scenarios(args, base, rows, notes)
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        notes.append(f"server log: {server_log}")
        c1 = next((r for r in rows if r["scenario"].startswith("concurrency 1")), None)
        if c1 is not None and (manifest is not None or args.fake):  # kern run of the same prompt, same manifest
            what = "the fake kern run" if args.fake else f"kern run ({manifest.name})"
            notes.append(c1_note(c1["tpot_ms_p50"], run_alone_tpot(args, manifest, notes), what))
    if "peer" in only:
        if args.fake:
            tokens = sum(len(x) for x in plan["inputs"])
            notes.append(f"peer (planned, not run with --fake): generate_batch ({plan['attn']}) of "
                         f"{len(plan['inputs'])} requests, {tokens} prompt tokens, "
                         f"{plan['generation_config']['max_new_tokens']} new tokens each, greedy, EOS ignored; "
                         f"ContinuousBatchingConfig {plan['cb_config'] or 'defaults'}: "
                         f"{' '.join(peer_command(args)[1:4])}")
        else:
            peer = run_peer(args, notes, out_dir)
            if peer is not None:
                rows.append(peer)
                if peer.get("tpot_from", "timestamps") != "timestamps":
                    notes.append(f"peer TPOT: {peer['tpot_from']}")
                closed = next((r for r in rows if r["scenario"].startswith("poisson closed")), None)
                if closed is not None and closed.get("output_tok_s") and peer.get("output_tok_s"):
                    notes.append(f"closed batch: kern serve {closed['output_tok_s']:.0f} tok/s = "
                                 f"{closed['output_tok_s'] / peer['output_tok_s']:.1f}x the peer's "
                                 f"{peer['output_tok_s']:.0f} (transformers {peer.get('transformers')})")
    target = args.json or (Path(os.environ["OUT"]) / "bench-serve.json" if os.environ.get("OUT") else None)
    if target:
        Path(target).write_text(json.dumps({"rows": rows, "notes": notes, "args": {k: str(v) for k, v in
                                                                                  vars(args).items()}}, indent=1))
        notes.append(f"JSON: {target}")
    print(table(rows, notes))
    return 0 if any(r.get("output_tok_s") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
