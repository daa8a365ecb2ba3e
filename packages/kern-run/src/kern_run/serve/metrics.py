"""The server's Prometheus metrics (prometheus-client), in one registry per server (no global state).

Gauges are set by the scheduler thread after every step; counters advance by the scheduler's cumulative
`Stats`; TTFT (arrival to first token) and TPOT (between consecutive tokens of one request) histograms are
observed as tokens come out of the engine. Names (all prefixed `kern_`):

| metric | kind | meaning |
|---|---|---|
| `kern_queue_depth` | gauge | requests waiting for a row |
| `kern_running_rows` | gauge | requests holding a row (waking, prefilling or decoding) |
| `kern_kv_pages_in_use` | gauge | KV pages held (leases, cached prefixes, parks in flight) |
| `kern_prefix_hit_rate` | gauge | reused / looked-up prompt tokens since start |
| `kern_prefix_lookup_tokens_total`, `kern_prefix_reused_tokens_total` | counter | the two sides of the rate |
| `kern_parks_total`, `kern_wakes_total` | counter | host-tier parks and wakes started |
| `kern_evictions_total`, `kern_preemptions_total` | counter | prefix entries evicted, requests preempted |
| `kern_requests_total{finish}` | counter | requests ended, by finish reason (stop, length, cancelled, error) |
| `kern_steps_total`, `kern_step_tokens_total` | counter | engine steps and the tokens they carried |
| `kern_decode_rows` | histogram | rows of each decode step (the batch size; buckets 1, 2, 4, ..., 64) |
| `kern_ttft_seconds`, `kern_tpot_seconds` | histogram | time to first token, time per output token |
| `kern_decode_ahead_total{outcome}` | counter | decode steps enqueued before the last one was read: `used` (they
answered the next call), `dropped` (docs/serve.md "Pipelined decode") |
| `kern_healthy` | gauge | 1 while the engine has not failed a step |
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

from .scheduler import Scheduler, Stats

CONTENT_TYPE = CONTENT_TYPE_LATEST
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
DECODE_ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
TPOT_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 1.0)


class Metrics:
    """The registry and its metrics. Thread-safe (prometheus-client's own locks)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.queue_depth = Gauge("kern_queue_depth", "requests waiting for a row", registry=r)
        self.running_rows = Gauge("kern_running_rows", "requests holding a row", registry=r)
        self.pages_in_use = Gauge("kern_kv_pages_in_use", "KV pages held", registry=r)
        self.hit_rate = Gauge("kern_prefix_hit_rate", "reused / looked-up prompt tokens", registry=r)
        self.lookup_tokens = Counter("kern_prefix_lookup_tokens", "prompt tokens looked up", registry=r)
        self.reused_tokens = Counter("kern_prefix_reused_tokens", "prompt tokens reused from the cache",
                                     registry=r)
        self.parks = Counter("kern_parks", "host-tier parks started", registry=r)
        self.wakes = Counter("kern_wakes", "host-tier wakes started", registry=r)
        self.evictions = Counter("kern_evictions", "prefix entries evicted", registry=r)
        self.preemptions = Counter("kern_preemptions", "requests preempted", registry=r)
        self.requests = Counter("kern_requests", "requests ended", ["finish"], registry=r)
        self.steps = Counter("kern_steps", "engine steps", registry=r)
        self.step_tokens = Counter("kern_step_tokens", "tokens carried by engine steps", registry=r)
        self.decode_rows = Histogram("kern_decode_rows", "rows of each decode step", buckets=DECODE_ROWS_BUCKETS,
                                     registry=r)
        self.ttft = Histogram("kern_ttft_seconds", "time to first token", buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("kern_tpot_seconds", "time per output token", buckets=TPOT_BUCKETS, registry=r)
        self.healthy = Gauge("kern_healthy", "1 while the engine has not failed a step", registry=r)
        self.healthy.set(1)
        self.ahead = Counter("kern_decode_ahead", "decode steps enqueued before the last one was read",
                             ["outcome"], registry=r)
        self._seen = Stats()
        self._ahead_seen = (0, 0)

    def update(self, sched: Scheduler) -> None:
        """Set the gauges from `sched` and advance the counters by its stats since the last update."""
        self.queue_depth.set(sched.num_waiting)
        self.running_rows.set(sched.num_running)
        self.pages_in_use.set(sched.memory.pages_in_use)
        s, seen = sched.stats, self._seen
        for counter, now, before in ((self.lookup_tokens, s.lookup_tokens, seen.lookup_tokens),
                                     (self.reused_tokens, s.reused_tokens, seen.reused_tokens),
                                     (self.parks, s.parks, seen.parks), (self.wakes, s.wakes, seen.wakes),
                                     (self.evictions, s.evictions, seen.evictions),
                                     (self.preemptions, s.preemptions, seen.preemptions)):
            if now > before:
                counter.inc(now - before)
        self._seen = Stats(**vars(s))
        self.hit_rate.set(s.reused_tokens / s.lookup_tokens if s.lookup_tokens else 0.0)

    def update_engine(self, used: int, dropped: int) -> None:
        """Advance `kern_decode_ahead_total` to the engine's cumulative `ahead_used` / `ahead_dropped`."""
        for outcome, now, before in (("used", used, self._ahead_seen[0]), ("dropped", dropped, self._ahead_seen[1])):
            if now > before:
                self.ahead.labels(outcome=outcome).inc(now - before)
        self._ahead_seen = (used, dropped)

    def text(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
