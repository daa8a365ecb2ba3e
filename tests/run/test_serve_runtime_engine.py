"""kern serve's real engine adapter (serve/runtime_engine.py) and RuntimeMemory over a fake runtime with the
pool API: the scheduler drives the caller contract exactly as the Generator does, and every request gives the
tokens it gives run alone through the Generator, also with prefixes reused and pages evicted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fake_pool_runtime import FakePoolRuntime
from fake_serve_runtime import ServedFakeRuntime

from kern_run.generate import GenerateOptions, Generator
from kern_run.preflight import ManifestFacts, read_manifest
from kern_run.serve.errors import ConfigError
from kern_run.serve.memory import RuntimeMemory
from kern_run.serve.runtime_engine import RuntimeEngine
from kern_run.serve.sampling import GREEDY, SamplingParams, greedy_only_fault
from kern_run.serve.scheduler import Scheduler, SchedulerConfig


@pytest.fixture
def facts(tiny_manifest: Path) -> ManifestFacts:
    return read_manifest(tiny_manifest)  # tokens max 64, 1024 positions


def _ids(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 250, size=n).tolist()


def _alone(facts: ManifestFacts, prompt: list[int], steps: int, chunk: int) -> tuple[list[int], list[tuple]]:
    rt = FakePoolRuntime()
    tokens = Generator(rt, facts).generate(prompt, GenerateOptions(steps, chunk, stop_at_eos=False)).tokens
    return tokens, [(c[0], c[1]["tokens"]) for c in rt.calls]


def _serve(facts: ManifestFacts, prompts: list[list[int]], steps: int, chunk: int, num_pages: int = 64):
    rt = ServedFakeRuntime(num_pages=num_pages)
    gen = Generator(rt, facts)
    engine = RuntimeEngine(gen, chunk)
    sched = Scheduler(RuntimeMemory(rt), SchedulerConfig(max_seqs=1, chunk_tokens=chunk,
                                                         max_context=engine.max_context))
    out: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    for i, p in enumerate(prompts):
        sched.add(i, p, steps, GREEDY)
    while not sched.idle:
        step = sched.schedule()
        for c in step.prefills:
            engine.prefill(c)
        tokens = engine.decode(step.decodes) if step.decodes else []
        for e in sched.complete(step, tokens):
            out[e.req_id].append(e.token_id)
    return out, rt, sched


def test_one_request_drives_the_runtime_as_the_generator_does(facts: ManifestFacts) -> None:
    prompt = _ids(150, 1)
    want, calls = _alone(facts, prompt, 6, 64)
    out, rt, _ = _serve(facts, [prompt], 6, 64)
    assert out[0] == want == FakePoolRuntime.expected(prompt, 6)
    assert [(c[0], c[1]["tokens"]) for c in rt.calls] == calls  # prefill 64, 64, 21, then 6 decodes
    assert calls[:3] == [("prefill", 64), ("prefill", 64), ("prefill", 21)]


def test_shared_prefixes_are_reused_and_outputs_match_running_alone(facts: ManifestFacts) -> None:
    shared = _ids(130, 2)
    prompts = [shared + _ids(9, 3), shared + _ids(20, 4), shared[:100] + _ids(5, 5)]
    out, rt, sched = _serve(facts, prompts, 8, 64)
    for i, p in enumerate(prompts):
        assert out[i] == FakePoolRuntime.expected(p, 8), i
    assert sched.stats.reused_tokens == 128 + 64  # 130 and 100 shared tokens, aligned down to the chunk
    prefills = [c[1]["tokens"] for c in rt.calls if c[0] == "prefill"]
    assert prefills == [64, 64, 10, 150 - 1 - 128, 105 - 1 - 64]


def test_a_small_pool_evicts_and_still_matches(facts: ManifestFacts) -> None:
    prompts = [_ids(200, s) for s in range(6)]
    out, rt, sched = _serve(facts, prompts, 5, 64, num_pages=16)  # 15 pages of 16: one 205-token sequence
    for i, p in enumerate(prompts):
        assert out[i] == FakePoolRuntime.expected(p, 5), i
    assert sched.stats.evictions >= 4


def test_refusals(facts: ManifestFacts) -> None:
    gen = Generator(ServedFakeRuntime(), facts)
    with pytest.raises(ConfigError, match=r"chunk 65 outside the manifest's tokens var \[1, 64\]"):
        RuntimeEngine(gen, 65)
    engine = RuntimeEngine(gen, 64)
    assert (engine.max_seqs, engine.samples, engine.max_top_logprobs) == (1, True, 20)  # the sampler's manifest
    assert not SamplingParams(temperature=0.5).greedy
    # what the greedy-only engine serves: exact argmax, so no penalty either (the manifest's argmax applies none)
    assert greedy_only_fault(SamplingParams()) is None
    assert greedy_only_fault(SamplingParams(repetition_penalty=1.2))[0] == "repetition_penalty"
    assert greedy_only_fault(SamplingParams(logprobs=True, top_logprobs=2)) == ("logprobs", (
        "logprobs 2 needs GPU sampling, which this manifest's decode program lacks (no meta.caller.sampling: it "
        "decodes by argmax); send logprobs none or leave it out, or serve a manifest built with the GPU sampler"))
