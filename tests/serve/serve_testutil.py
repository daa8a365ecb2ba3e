"""Helpers for the serve tests: a scheduler over a bare kern_pool pool driving a FakeEngine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import kern_pool
from kern_run.serve.fake_engine import FakeEngine
from kern_run.serve.memory import PoolMemory
from kern_run.serve.sampling import GREEDY
from kern_run.serve.scheduler import Scheduler, SchedulerConfig, Step


@dataclass
class Rig:
    engine: FakeEngine
    pool: kern_pool.Pool
    host: kern_pool.Host | None
    memory: PoolMemory
    sched: Scheduler
    out: dict[int, list[int]] = field(default_factory=dict)
    finish: dict[int, str] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)

    def add(self, req_id: int, prompt: list[int], max_tokens: int = 8, stop_ids: frozenset[int] = frozenset(),
            sampling: Any = GREEDY) -> None:
        self.sched.add(req_id, prompt, max_tokens, sampling, stop_ids)
        self.out[req_id] = []

    def step(self) -> Step:
        step = self.sched.schedule()
        self.steps.append(step)
        for chunk in step.prefills:
            self.engine.prefill(chunk)
        tokens = self.engine.decode(step.decodes) if step.decodes else []
        for e in self.sched.complete(step, tokens):
            self.out[e.req_id].append(e.token_id)
            if e.finish is not None:
                self.finish[e.req_id] = e.finish
        for req_id, _ in step.failed:
            self.finish[req_id] = "failed"
        return step

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if self.sched.idle:
                return
            self.step()
        raise AssertionError(f"not idle after {max_steps} steps: {self.sched.num_waiting} waiting, "
                             f"{self.sched.num_running} running")


def rig(pages: int = 64, host_pages: int = 0, max_seqs: int = 4, page_tokens: int = 4, chunk: int = 8,
        max_context: int = 256, budget: int | None = None, land_after: int = 0, grow_ahead: int = 0,
        **engine: Any) -> Rig:
    eng = FakeEngine(max_seqs=max_seqs, page_tokens=page_tokens, chunk_tokens=chunk, max_context=max_context,
                     **engine)
    pool = kern_pool.Pool(kern_pool.Layout.simple(page_tokens, pages))
    host = kern_pool.Host(pool, host_pages) if host_pages else None
    memory = PoolMemory(pool, host, land_after=land_after, executor=eng)
    cfg = SchedulerConfig(max_seqs=max_seqs, chunk_tokens=chunk, max_context=max_context, token_budget=budget,
                          batch_invariant_prefill=eng.batch_invariant_prefill, grow_ahead=grow_ahead)
    return Rig(eng, pool, host, memory, Scheduler(memory, cfg))


class CharCodec:
    """A tokenizer for the HTTP tests: a character per token in, a letter per token out."""

    eos_ids = frozenset({999})

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 900 for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(65 + i % 26) for i in ids)


@dataclass
class Served:
    app: Any
    loop: Any
    rig: Rig
    codec: CharCodec

    def reference_text(self, prompt: str, max_tokens: int, sampling: Any = None) -> tuple[str, list[int]]:
        tokens = self.rig.engine.reference(self.codec.encode(prompt), max_tokens, self.codec.eos_ids, sampling)
        shown = [t for t in tokens if t not in self.codec.eos_ids]
        return self.codec.decode(shown), tokens


def served(chat_template: str | None = None, samples: bool = False, api_key: str | None = None,
           max_queue: int = 8, start: bool = True, max_top_logprobs: int = 20, **rig_kwargs: Any) -> Served:
    from kern_run.serve.app import AppConfig, create_app
    from kern_run.serve.chat_template import ChatTemplate
    from kern_run.serve.loop import ServeLoop
    from kern_run.serve.metrics import Metrics

    r = rig(**rig_kwargs)
    r.engine.samples = samples
    loop = ServeLoop(r.sched, r.engine, Metrics())
    cfg = AppConfig(model="tiny", max_context=r.sched.config.max_context, max_queue=max_queue, api_key=api_key,
                    vocab_size=900, samples=samples, max_top_logprobs=max_top_logprobs, drain_s=2.0)
    template = ChatTemplate(chat_template, "", "<eos>") if chat_template is not None else None
    app = create_app(loop, cfg, CharCodec(), template)
    if start:
        loop.start()
    return Served(app, loop, r, CharCodec())
