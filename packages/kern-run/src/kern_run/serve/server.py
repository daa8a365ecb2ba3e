"""`kern serve`: preflight and load a target, build the scheduler and the app, run uvicorn until SIGTERM.

SIGTERM (or Ctrl-C): uvicorn stops accepting connections and waits up to `drain_s` for the responses in flight
(their requests keep being scheduled meanwhile), then the app's shutdown waits for the scheduler to drain for
what is left of `drain_s` more, stops the scheduler thread (requests still in flight end with 503) and closes the
runtime. uvicorn then re-raises the signal: the process ends by SIGTERM (status 143), as any SIGTERM-ended one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import RunConfig
from ..errors import InputError

GIB = 1 << 30
MAX_HOST_GIB = 4096  # the largest --host-gib: 4 TiB of pinned host memory
MAX_DRAIN_S = 86400  # the longest --drain-timeout: a day


@dataclass(frozen=True)
class ServeOptions:
    """`kern serve`'s flags. `host` / `port`: where uvicorn listens; `max_seqs`: decode rows (1 until issue 26);
    `host_gib`: the pinned host tier for parked prefixes (GiB, 0: none); `api_key`: None for none; `max_queue`:
    requests in flight at most; `token_budget`: tokens per step (None: chunk + max_seqs); `drain_s`: seconds
    SIGTERM waits for requests in flight; `model_name`: the name requests use (None: the target's, else the
    weights directory's); `eager`: decode without the CUDA graph."""

    host: str = "127.0.0.1"
    port: int = 8000
    max_seqs: int = 1
    host_gib: float = 0.0
    api_key: str | None = None
    max_queue: int = 256
    token_budget: int | None = None
    drain_s: float = 30.0
    model_name: str | None = None
    eager: bool = False

    def check(self) -> None:
        """Raises InputError naming the flag and its allowed range for a value out of range (NaN and infinities
        included); needs no device, so `kern serve` refuses before any probe or load."""
        from .runtime_engine import RuntimeEngine

        if not 0 <= self.port <= 65535:
            raise InputError(f"--port {self.port}: expected 0..65535")
        if self.max_seqs < 1:
            raise InputError(f"--max-seqs {self.max_seqs}: expected >= 1")
        if self.max_seqs > RuntimeEngine.max_seqs:
            raise InputError(f"--max-seqs {self.max_seqs}: today's runtime decodes {RuntimeEngine.max_seqs} sequence "
                             "per step (batched decode is issue 26): pass --max-seqs 1")
        if not 0 <= self.host_gib <= MAX_HOST_GIB:  # False for NaN
            raise InputError(f"--host-gib {self.host_gib}: expected 0..{MAX_HOST_GIB} GiB")
        if self.max_queue < 1:
            raise InputError(f"--max-queue {self.max_queue}: expected >= 1")
        if self.token_budget is not None and self.token_budget < 1:
            raise InputError(f"--token-budget {self.token_budget}: expected >= 1 (and at least chunk + max-seqs)")
        if not 0 <= self.drain_s <= MAX_DRAIN_S:
            raise InputError(f"--drain-timeout {self.drain_s}: expected 0..{MAX_DRAIN_S} seconds")
        if self.api_key == "":
            raise InputError("--api-key '': an empty key (an unset shell variable?): give the key or leave it out")


def model_name(cfg: RunConfig, opts: ServeOptions) -> str:
    if opts.model_name:
        return opts.model_name
    if cfg.target:
        return cfg.target
    weights = cfg.weights if isinstance(cfg.weights, Path) else Path(cfg.weights[0]).parent
    return weights.name or "kern"


def build(cfg: RunConfig, opts: ServeOptions, log: Any) -> tuple[Any, Any]:
    """Preflight, load and wire everything: (the FastAPI app, the ServeLoop, started). Raises RefusalError /
    kern_runtime.KernError."""
    from ..session import open_generator, prepare
    from ..text import checkpoint_dir
    from .app import AppConfig, create_app
    from .chat_template import load_chat_template
    from .loop import ServeLoop
    from .memory import RuntimeMemory
    from .metrics import Metrics
    from .runtime_engine import RuntimeEngine
    from .scheduler import Scheduler, SchedulerConfig

    opts.check()
    prep = prepare(cfg, shared_pool=True)
    try:
        template = load_chat_template(checkpoint_dir(cfg.weights))
    except ValueError as exc:
        raise InputError(str(exc)) from None

    def scheduler_config(max_context: int) -> SchedulerConfig:
        try:
            return SchedulerConfig(max_seqs=RuntimeEngine.max_seqs, chunk_tokens=prep.chunk, max_context=max_context,
                                   token_budget=opts.token_budget,
                                   batch_invariant_prefill=prep.facts.prefill_batch_invariant)
        except ValueError as exc:
            raise InputError(f"--token-budget: {exc}") from None

    scheduler_config(prep.facts.max_context)  # refused before loading
    gen = open_generator(prep, log)
    try:
        engine = RuntimeEngine(gen, prep.chunk, opts.eager)
        memory = RuntimeMemory(gen.rt)
        if opts.host_gib > 0:
            nbytes = memory.reserve_host_bytes(int(opts.host_gib * GIB), engine.max_context)
            log.info(f"host tier: {nbytes / GIB:.2f} GiB pinned")
        loop = ServeLoop(Scheduler(memory, scheduler_config(engine.max_context)), engine, Metrics())
        tokenizer: Any = prep.codec.tokenizer
        app_cfg = AppConfig(model=model_name(cfg, opts), max_context=engine.max_context, max_queue=opts.max_queue,
                            api_key=opts.api_key, vocab_size=int(tokenizer.get_vocab_size()), samples=engine.samples,
                            drain_s=opts.drain_s)
        app = create_app(loop, app_cfg, prep.codec, template, on_shutdown=gen.close)
    except BaseException:
        gen.close()
        raise
    log.info(f"serving {app_cfg.model!r}: context {engine.max_context} tokens, {engine.max_seqs} row(s), chunk "
             f"{engine.chunk_tokens}, greedy decode; chat template {'yes' if template else 'none'}")
    loop.start()
    return app, loop


def serve_target(cfg: RunConfig, opts: ServeOptions, log: Any) -> None:
    """`kern serve`: build, then run uvicorn on `opts.host:opts.port` until SIGTERM / SIGINT (module docstring)."""
    import uvicorn

    app, loop = build(cfg, opts, log)
    try:
        config = uvicorn.Config(app, host=opts.host, port=opts.port, log_level="info",
                                timeout_graceful_shutdown=int(opts.drain_s) or None, lifespan="on")
        uvicorn.Server(config).run()
    finally:
        loop.stop()
