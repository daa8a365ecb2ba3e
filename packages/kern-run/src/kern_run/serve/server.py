"""`kern serve`: preflight and load a target, build the scheduler and the app, run uvicorn until SIGTERM.

SIGTERM (or Ctrl-C): uvicorn stops accepting connections and waits up to `drain_s` for the responses in flight
(their requests keep being scheduled meanwhile), then the app's shutdown waits for the scheduler to drain for
what is left of `drain_s` more, stops the scheduler thread (requests still in flight end with 503) and closes the
runtime. uvicorn then re-raises the signal: the process ends by SIGTERM (status 143), as any SIGTERM-ended one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..config import RunConfig
from ..errors import InputError

GIB = 1 << 30
MAX_HOST_GIB = 4096  # the largest --host-gib: 4 TiB of pinned host memory
MAX_DRAIN_S = 86400  # the longest --drain-timeout: a day
MAX_SEQS = 1024  # the largest --max-seqs taken (the manifest's seqs var max then caps it: 64 for issue 26's)
# decode positions past the next one the scheduler grows a lease to when pages are free: a step enqueued ahead
# computes position p + 1 with a slot its predecessor derived from the block table, so its pages must be there two
# positions early for the pipeline to run across page boundaries (runtime_engine.py "Pipelined decode")
GROW_AHEAD = 2


@dataclass(frozen=True)
class ServeOptions:
    """`kern serve`'s flags. `host` / `port`: where uvicorn listens; `max_seqs`: decode rows at most (capped by
    the manifest's `seqs` var max);
    `host_gib`: the pinned host tier for parked prefixes (GiB, 0: none); `api_key`: None for none; `max_queue`:
    requests in flight at most; `token_budget`: tokens per step (None: chunk + max_seqs); `drain_s`: seconds
    SIGTERM waits for requests in flight; `model_name`: the name requests use (None: the target's, else the
    weights directory's); `eager`: decode without the CUDA graph; `invariant`: run the target's `serve_manifest`
    (a batch-invariant decode) when it has one (`serving_config`), else its `manifest`."""

    host: str = "127.0.0.1"
    port: int = 8000
    max_seqs: int = 64
    host_gib: float = 0.0
    api_key: str | None = None
    max_queue: int = 256
    token_budget: int | None = None
    drain_s: float = 30.0
    model_name: str | None = None
    eager: bool = False
    invariant: bool = True

    def check(self) -> None:
        """Raises InputError naming the flag and its allowed range for a value out of range (NaN and infinities
        included); needs no device, so `kern serve` refuses before any probe or load."""
        if not 0 <= self.port <= 65535:
            raise InputError(f"--port {self.port}: expected 0..65535")
        if not 1 <= self.max_seqs <= MAX_SEQS:
            raise InputError(f"--max-seqs {self.max_seqs}: expected 1..{MAX_SEQS} (the manifest's seqs var max caps "
                             "it further)")
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


def serving_config(cfg: RunConfig, opts: ServeOptions) -> RunConfig:
    """The RunConfig `kern serve` loads: the target's `serve_manifest` in place of its `manifest` when it has one
    and `opts.invariant` (docs/serve.md "Which manifest"); `cfg` itself otherwise (no serve_manifest, --manifest
    given, or --no-invariant)."""
    if opts.invariant and cfg.serve_manifest is not None:
        return replace(cfg, manifest=cfg.serve_manifest, serve_manifest=None)
    return cfg


def model_name(cfg: RunConfig, opts: ServeOptions) -> str:
    if opts.model_name:
        return opts.model_name
    if cfg.target:
        return cfg.target
    weights = cfg.weights if isinstance(cfg.weights, Path) else Path(cfg.weights[0]).parent
    return weights.name or "kern"


def serve_rows(facts: Any, requested: int) -> int:
    """Decode rows the server runs: `requested` (--max-seqs), capped by the manifest's `seqs` var max and its
    `tokens` var max (a decode step at bucket B runs at tokens = B)."""
    seqs = facts.manifest.vars.get("seqs")
    return max(1, min(requested, int(seqs.max) if seqs is not None else 1, int(facts.tokens_max)))


def build(cfg: RunConfig, opts: ServeOptions, log: Any) -> tuple[Any, Any]:
    """Preflight, load and wire everything: (the FastAPI app, the ServeLoop, started). The engine decodes up to
    `serve_rows` rows a step, samples on the GPU when the manifest has the sampler (`meta.caller.sampling`) and
    has every bucket's CUDA graph captured before the server listens. Raises RefusalError /
    kern_runtime.KernError."""
    from ..session import open_generator, prepare
    from ..text import checkpoint_dir
    from .app import AppConfig, create_app
    from .chat_template import load_chat_template
    from .loop import ServeLoop
    from .memory import RuntimeMemory
    from .metrics import Metrics
    from .runtime_engine import RuntimeEngine
    from ..sampling_io import read_sampling_io
    from .scheduler import Scheduler, SchedulerConfig

    opts.check()
    cfg = serving_config(cfg, opts)
    prep = prepare(cfg, shared_pool=True)
    read_sampling_io(prep.facts.manifest, cfg.manifest)  # a malformed sampling block is refused before loading
    rows = serve_rows(prep.facts, opts.max_seqs)
    try:
        template = load_chat_template(checkpoint_dir(cfg.weights))
    except ValueError as exc:
        raise InputError(str(exc)) from None

    def scheduler_config(max_context: int) -> SchedulerConfig:
        try:
            return SchedulerConfig(max_seqs=rows, chunk_tokens=prep.chunk, max_context=max_context,
                                   token_budget=opts.token_budget,
                                   batch_invariant_prefill=prep.facts.prefill_batch_invariant,
                                   grow_ahead=GROW_AHEAD if prep.facts.decode_advance is not None else 0)
        except ValueError as exc:
            raise InputError(f"--token-budget: {exc}") from None

    scheduler_config(prep.facts.max_context)  # refused before loading
    gen = open_generator(prep, log)
    try:
        engine = RuntimeEngine(gen, prep.chunk, opts.eager, max_seqs=rows)
        t0 = time.perf_counter()
        warmed = engine.warm()
        log.info(f"decode buckets {warmed} warmed{'' if opts.eager else ' (CUDA graphs captured)'} in "
                 f"{time.perf_counter() - t0:.2f} s")
        memory = RuntimeMemory(gen.rt)
        if opts.host_gib > 0:
            nbytes = memory.reserve_host_bytes(int(opts.host_gib * GIB), engine.max_context)
            log.info(f"host tier: {nbytes / GIB:.2f} GiB pinned")
        loop = ServeLoop(Scheduler(memory, scheduler_config(engine.max_context)), engine, Metrics())
        tokenizer: Any = prep.codec.tokenizer
        app_cfg = AppConfig(model=model_name(cfg, opts), max_context=engine.max_context, max_queue=opts.max_queue,
                            api_key=opts.api_key, vocab_size=int(tokenizer.get_vocab_size()), samples=engine.samples,
                            max_top_logprobs=engine.max_top_logprobs, drain_s=opts.drain_s)
        app = create_app(loop, app_cfg, prep.codec, template, on_shutdown=gen.close)
    except BaseException:
        gen.close()
        raise
    sampler = "GPU sampling" if engine.samples else "greedy argmax decode (no meta.caller.sampling)"
    rows_note = ("batch-invariant decode: a row's tokens do not depend on its neighbours" if
                 prep.facts.decode_batch_invariant else "decode not batch-invariant: a row's last bits depend on "
                 "its bucket (docs/caller.md)")
    log.info(f"serving {app_cfg.model!r} from {cfg.manifest}: context {engine.max_context} tokens, {engine.max_seqs} "
             f"row(s) (manifest seqs max {engine.seqs_max}; {rows_note}), chunk {engine.chunk_tokens}, {sampler}; "
             f"chat template {'yes' if template else 'none'}")
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
