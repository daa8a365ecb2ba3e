"""The scheduler thread: the only thread that touches the engine (and so the GPU) and the scheduler.

The HTTP layer `submit`s requests and `cancel`s them through a thread-safe inbox; the thread drains the inbox
at each step boundary, runs one `Scheduler.schedule()` step on the engine and hands every token to its
request's `deliver` callback (the app's is `loop.call_soon_threadsafe` into an asyncio queue). An exception
from the engine fails that step's requests (each gets an `EngineFault`), is logged, and leaves the loop
unhealthy: the requests still in flight end with 503 and new ones are refused with 503 (the device state is
suspect), while /health reports it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .engine import Engine
from .errors import EngineFault, ServeError, Unavailable
from .metrics import Metrics
from .sampling import SamplingParams
from .scheduler import Scheduler

log = logging.getLogger("kern.serve")

IDLE_WAIT_S = 0.05  # the inbox wait when nothing is scheduled (seconds)
MEMORY_WAIT_S = 0.0005  # the pause when requests wait for memory (parks or wakes landing) and nothing runs


@dataclass(frozen=True)
class Token:
    """One generated token; `finish` as scheduler.Emitted (None: more follow); `logprob` / `top_logprobs` as
    the engine's `Sampled` (None / empty unless the request asked)."""

    token_id: int
    finish: str | None
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Failed:
    """The request ended without finishing: `error` is the ServeError its response carries."""

    error: ServeError


@dataclass
class Submission:
    """A request handed to the loop. `deliver(event)` is called from the loop thread with each `Token` or a
    final `Failed`; it must not block."""

    req_id: int
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop_ids: frozenset[int]
    deliver: Callable[[Token | Failed], None]
    arrived_s: float = field(default_factory=time.perf_counter)
    last_token_s: float | None = None


def _send(sub: Submission, event: Token | Failed) -> None:
    """Deliver `event`; a callback that fails is logged, never allowed to stop the loop."""
    try:
        sub.deliver(event)
    except Exception:  # noqa: BLE001 - the loop serves every other request
        log.exception("delivering an event of request %d failed", sub.req_id)


class ServeLoop:
    """Owns `scheduler` and `engine` on one thread (`start()`); `submit` / `cancel` from any thread."""

    def __init__(self, scheduler: Scheduler, engine: Engine, metrics: Metrics) -> None:
        self.scheduler = scheduler
        self.engine = engine
        self.metrics = metrics
        self.healthy = True
        self.fault: str | None = None
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._subs: dict[int, Submission] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._in_flight = 0

    # ------------------------------------------------------------ any thread

    @property
    def in_flight(self) -> int:
        """Requests submitted and not ended (waiting, running, or still in the inbox)."""
        with self._lock:
            return self._in_flight

    def try_reserve(self, max_queue: int) -> bool:
        """Count one more request in flight unless `max_queue` are already; False when full."""
        with self._lock:
            if self._in_flight >= max_queue:
                return False
            self._in_flight += 1
            return True

    def submit(self, sub: Submission) -> None:
        """Queue `sub` (already counted by `try_reserve`)."""
        self._inbox.put(("add", sub))

    def cancel(self, req_id: int) -> None:
        """Cancel a request (client gone, stop string seen): its pages return at the next step boundary."""
        self._inbox.put(("cancel", req_id))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kern-serve-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread after its current step; requests still in flight fail with 503."""
        self._stop.set()
        self._inbox.put(("wake", None))
        if self._thread is not None:
            self._thread.join(timeout_s)

    def drain(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for every request in flight to end; True when none is left."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.in_flight == 0

    # ------------------------------------------------------------ the loop thread

    def _end(self, req_id: int) -> Submission | None:
        sub = self._subs.pop(req_id, None)
        if sub is not None:
            with self._lock:
                self._in_flight -= 1
        return sub

    def _fail(self, req_id: int, error: ServeError) -> None:
        sub = self._end(req_id)
        if sub is not None:
            self.metrics.requests.labels(finish="error").inc()
            _send(sub, Failed(error))

    def _take(self, block: bool) -> None:
        try:
            kind, item = self._inbox.get(timeout=IDLE_WAIT_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if kind == "add":
                self._admit(item)
            elif kind == "cancel":
                if self.scheduler.cancel(item) or item in self._subs:
                    if self._end(item) is not None:
                        self.metrics.requests.labels(finish="cancelled").inc()
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _admit(self, sub: Submission) -> None:
        if not self.healthy or self._stop.is_set():
            with self._lock:
                self._in_flight -= 1
            _send(sub, Failed(Unavailable(self.fault or "the server is shutting down", code="unavailable")))
            return
        self._subs[sub.req_id] = sub
        try:
            self.scheduler.add(sub.req_id, sub.prompt_ids, sub.max_tokens, sub.sampling, sub.stop_ids)
        except ValueError as exc:  # ConfigError: the app checks these first
            self._fail(sub.req_id, ServeError(str(exc)))

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._take(block=self.scheduler.idle)
                if self.scheduler.idle:
                    continue
                try:
                    self._step()
                except Exception as exc:  # noqa: BLE001 - a kern bug outside the engine: fail loudly, keep answering
                    log.exception("scheduler step failed")
                    self._unhealthy(f"the scheduler failed ({type(exc).__name__}: {exc}); the server is unhealthy")
                    for req_id in list(self._subs):
                        self.scheduler.cancel(req_id)
                        self._fail(req_id, EngineFault(self.fault or "", code="scheduler_error"))
        finally:
            for req_id in list(self._subs):
                self.scheduler.cancel(req_id)
                self._fail(req_id, Unavailable("the server stopped before this request finished",
                                               code="unavailable"))

    def _unhealthy(self, fault: str) -> None:
        self.healthy = False
        self.fault = fault
        self.metrics.healthy.set(0)

    def _step(self) -> None:
        sched = self.scheduler
        step = sched.schedule()
        for req_id, message in step.failed:
            self._fail(req_id, ServeError(message, code="does_not_fit"))
        if step.empty:
            self.metrics.update(sched)
            time.sleep(MEMORY_WAIT_S)  # waiting for memory only: parks or wakes in flight
            return
        try:
            for chunk in step.prefills:
                self.engine.prefill(chunk)
            # ahead: the next step should carry these rows again, so the engine may enqueue it before reading this
            # one (the GPU then never waits for this thread between steps: docs/serve.md "Pipelined decode")
            tokens = self.engine.decode(step.decodes, ahead=sched.steady(step)) if step.decodes else []
        except Exception as exc:  # noqa: BLE001 - any engine fault fails the step, the server stays up
            log.exception("engine step failed")
            self._unhealthy(f"the engine failed a step ({type(exc).__name__}: {exc}); the server is unhealthy")
            for req_id in sched.fail(step):
                self._fail(req_id, EngineFault(self.fault, code="engine_error"))
            for req_id in sched.drain():  # the device state is suspect: serve nothing more
                self._fail(req_id, Unavailable(self.fault, code="unavailable"))
            self.metrics.update(sched)
            return
        now = time.perf_counter()
        self.metrics.update_engine(self.engine.ahead_used, self.engine.ahead_dropped)
        self.metrics.steps.inc()
        self.metrics.step_tokens.inc(step.num_tokens)
        if step.decodes:
            self.metrics.decode_rows.observe(len(step.decodes))
        out: list[tuple[Submission, Token]] = []
        for e in sched.complete(step, tokens):
            sub = self._subs.get(e.req_id)
            if sub is None:
                continue
            if sub.last_token_s is None:
                self.metrics.ttft.observe(now - sub.arrived_s)
            else:
                self.metrics.tpot.observe(now - sub.last_token_s)
            sub.last_token_s = now
            if e.finish is not None:
                self._end(e.req_id)
                self.metrics.requests.labels(finish=e.finish).inc()
            out.append((sub, Token(e.token_id, e.finish, e.logprob, e.top_logprobs)))
        self.metrics.update(sched)  # before the tokens go out: a client that saw its last token reads these gauges
        for sub, token in out:
            _send(sub, token)
