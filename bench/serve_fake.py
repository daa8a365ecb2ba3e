#!/usr/bin/env python3
"""The stand-ins of `bench/serve.py --fake` (a smoke run on the CPU, no GPU): `kern serve`'s own app, scheduler
and loop over the fake engine (kern_run.serve.fake_engine) on real uvicorn, and a `kern run` stand-in (the fake
engine driven alone through the scheduler) that logs its decode ms per token as `kern run` does. The numbers mean
nothing: the fake engine sleeps `--step-ms` per decode step and hashes the ids it reads back.

    python3 bench/serve_fake.py serve --port P [--step-ms 1] [--max-seqs 64] [--context 8192] [--capacity TOKENS]
    python3 bench/serve_fake.py run --prompt TEXT --max-tokens N [--step-ms 1] [--context 8192]

Token ids run up to VOCAB (the Qwen3 vocabulary's size), so bench/serve.py's prompts are taken as they are; text
is one id per character. Only a loopback address is listened on.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
import time

VOCAB = 151_936
PAGE_TOKENS = 16
CHUNK = 512


class CharCodec:
    """Text <-> ids for the fake: one id per character (1000 + its code point, below VOCAB), a letter per id out."""

    eos_ids: frozenset[int] = frozenset()

    def encode(self, text: str) -> list[int]:
        return [1000 + ord(c) % (VOCAB - 1000) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(97 + i % 26) for i in ids)


def _scheduler(args: argparse.Namespace, engine, host_pages: int = 0):  # type: ignore[no-untyped-def]
    import kern_pool
    from kern_run.serve.memory import PoolMemory
    from kern_run.serve.scheduler import Scheduler, SchedulerConfig

    pool = kern_pool.Pool(kern_pool.Layout.simple(PAGE_TOKENS, max(1, args.capacity // PAGE_TOKENS)))
    host = kern_pool.Host(pool, host_pages) if host_pages else None
    memory = PoolMemory(pool, host, land_after=1, executor=engine)
    cfg = SchedulerConfig(max_seqs=engine.max_seqs, chunk_tokens=engine.chunk_tokens, max_context=engine.max_context,
                          batch_invariant_prefill=True, grow_ahead=2)
    return Scheduler(memory, cfg)


def _engine(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from kern_run.serve.fake_engine import FakeEngine

    return FakeEngine(max_seqs=args.max_seqs, page_tokens=PAGE_TOKENS, chunk_tokens=min(CHUNK, args.context),
                      max_context=args.context, vocab=VOCAB, eos_id=0, step_s=args.step_ms / 1e3,
                      batch_invariant_prefill=True)


def serve(args: argparse.Namespace) -> None:
    """`kern serve` over the fake engine (a host tier of half the pool, so parks and wakes happen) until SIGTERM."""
    import uvicorn

    from kern_run.serve.app import AppConfig, create_app
    from kern_run.serve.loop import ServeLoop
    from kern_run.serve.metrics import Metrics

    if not ipaddress.ip_address(args.host).is_loopback:
        raise SystemExit(f"serve_fake: --host {args.host} is not a loopback address")
    engine = _engine(args)
    loop = ServeLoop(_scheduler(args, engine, host_pages=args.capacity // PAGE_TOKENS // 2), engine, Metrics())
    cfg = AppConfig(model=args.model, max_context=args.context, max_queue=args.max_queue, vocab_size=VOCAB,
                    samples=True, drain_s=5.0)
    app = create_app(loop, cfg, CharCodec(), None)
    loop.start()
    uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                                  timeout_graceful_shutdown=5, lifespan="on")).run()


def run(args: argparse.Namespace) -> None:
    """One prompt through the fake engine and the scheduler alone (no HTTP): logs `decode X ms/token` on stderr as
    `kern run` does, and the text on stdout."""
    from kern_run.serve.sampling import GREEDY

    engine = _engine(args)
    sched = _scheduler(args, engine)
    ids = CharCodec().encode(args.prompt)
    sched.add(1, ids, args.max_tokens, GREEDY)
    stamps: list[float] = []
    tokens: list[int] = []
    while not sched.idle:
        step = sched.schedule()
        for chunk in step.prefills:
            engine.prefill(chunk)
        out = engine.decode(step.decodes, ahead=sched.steady(step)) if step.decodes else []
        for e in sched.complete(step, out):
            stamps.append(time.perf_counter())
            tokens.append(e.token_id)
    per = (stamps[-1] - stamps[0]) * 1e3 / (len(tokens) - 1) if len(tokens) > 1 else 0.0
    print(f"{len(ids)} prompt tokens; decode {per:.3f} ms/token; {len(tokens)} tokens generated", file=sys.stderr)
    print(CharCodec().decode(tokens))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["serve", "run"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default="bench")
    p.add_argument("--step-ms", type=float, default=1.0, help="the fake engine's sleep per decode step")
    p.add_argument("--max-seqs", type=int, default=64)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--capacity", type=int, default=262_144, help="KV pool tokens")
    p.add_argument("--max-queue", type=int, default=5000)
    p.add_argument("--prompt", default="Once upon a time")
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args(argv)
    (serve if args.mode == "serve" else run)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
