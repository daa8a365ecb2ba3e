"""kern_run.prefix_cache over a fake runtime with the pool API: cached prefixes, chunk-aligned reuse,
eviction, outputs identical to running each prompt alone, the prompts file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fake_pool_runtime import FakePoolRuntime
from kern_run_testutil import FakeRuntime

from kern_run.errors import InputError
from kern_run.generate import GenerateOptions, Generator
from kern_run.prefix_cache import PrefixSession, aligned_prefix, read_prompts
from kern_run.preflight import ManifestFacts, read_manifest


@pytest.fixture
def facts(tiny_manifest: Path) -> ManifestFacts:
    return read_manifest(tiny_manifest)  # tokens max 64, 1024 positions


def _ids(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 250, size=n).tolist()


def _alone(facts: ManifestFacts, prompt: list[int], opts: GenerateOptions) -> tuple[list[int], list[int]]:
    """Tokens and prefill chunk sizes of the prompt run alone on a fresh fake."""
    rt = FakePoolRuntime()
    result = Generator(rt, facts).generate(prompt, opts)
    return result.tokens, [c[1]["tokens"] for c in rt.calls if c[0] == "prefill"]


_SHARING_600_OPTS = GenerateOptions(4, 64, stop_at_eos=False)


def _second_of_two_sharing_600(facts: ManifestFacts):
    """Two prompts sharing 600 tokens (then 50 and 90 of their own) through one PrefixSession (chunk 64) on a fresh
    fake: (runtime, session, the second prompt, its result, the prefill chunk sizes it ran)."""
    shared = _ids(600, 4)
    a, b = shared + _ids(50, 5), shared + _ids(90, 6)
    rt = FakePoolRuntime()
    session = PrefixSession(Generator(rt, facts), chunk=64)
    session.generate(a, _SHARING_600_OPTS)
    before = len(rt.calls)
    rb = session.generate(b, _SHARING_600_OPTS)
    sizes = [c[1]["tokens"] for c in rt.calls[before:] if c[0] == "prefill"]
    return rt, session, b, rb, sizes


@pytest.mark.parametrize("aligned, hit, chunk", [(600, 600, 40), (576, 600, 64), (0, 30, 40), (0, 5, 0)])
def test_aligned_prefix(aligned: int, hit: int, chunk: int) -> None:
    assert aligned_prefix(hit, chunk) == aligned
    assert aligned_prefix(hit, chunk, batch_invariant=True) == hit


def test_batch_invariant_manifest_reuses_the_whole_hit_and_prefills_only_new_tokens(facts: ManifestFacts) -> None:
    import dataclasses

    inv = dataclasses.replace(facts, prefill_batch_invariant=True)
    rt, session, b, rb, sizes = _second_of_two_sharing_600(inv)
    assert rb.cached_tokens == 600  # not rounded down to 576
    assert sum(sizes) == len(b) - 1 - 600 == rb.result.timings.prefill_tokens
    assert sizes == [64, 25]  # the new 89 prefill tokens, chunked from position 600
    assert rb.result.tokens == FakePoolRuntime.expected(b, 4)
    session.close()
    rt.kern_pool.check()


def test_two_prompts_sharing_600_tokens_reuse_them_and_match_running_alone(facts: ManifestFacts) -> None:
    shared = _ids(600, 1)
    a, b = shared + _ids(100, 2), shared + _ids(80, 3)
    opts = GenerateOptions(12, 40, stop_at_eos=False)
    rt = FakePoolRuntime()
    session = PrefixSession(Generator(rt, facts), chunk=40)
    ra = session.generate(a, opts)
    assert ra.cached_tokens == 0
    before = len(rt.calls)
    rb = session.generate(b, opts)
    assert rb.cached_tokens == 600  # 600 = 15 chunks of 40; mid-page (37.5 pages): one page copied
    assert rt.copied_pages == 1
    prefills = [c[1]["tokens"] for c in rt.calls[before:] if c[0] == "prefill"]
    assert sum(prefills) == len(b) - 1 - 600 and rb.result.timings.prefill_tokens == len(b) - 1 - 600
    for prompt, got in ((a, ra), (b, rb)):
        alone, _ = _alone(facts, prompt, opts)
        assert got.result.tokens == alone == FakePoolRuntime.expected(prompt, 12)
    session.close()
    rt.kern_pool.check()
    assert rt.kern_pool.held_pages == 0


def test_reuse_is_rounded_down_to_the_chunk_so_prefill_chunks_match_running_alone(facts: ManifestFacts) -> None:
    rt, session, b, rb, sizes = _second_of_two_sharing_600(facts)
    assert rb.cached_tokens == 576
    tokens, alone_sizes = _alone(facts, b, _SHARING_600_OPTS)
    assert alone_sizes[576 // 64:] == sizes  # the same chunk boundaries from 576 on
    assert rb.result.tokens == tokens
    session.close()


def test_pool_pressure_evicts_the_coldest_prefix(facts: ManifestFacts) -> None:
    prompts = [_ids(300, 10 + i) for i in range(4)]  # unrelated: 19 pages each kept, 39 leasable
    opts = GenerateOptions(6, 32, stop_at_eos=False)
    rt = FakePoolRuntime(num_pages=40)
    gen = Generator(rt, facts)
    session = PrefixSession(gen, chunk=32)
    for p in prompts:
        r = session.generate(p, opts)
        assert r.cached_tokens == 0 and r.result.tokens == FakePoolRuntime.expected(p, 6)
    assert len(session.prefix) == 2  # 19 kept + 20 leased pages: from the third prompt on the coldest goes
    again = session.generate(prompts[-1] + [7, 8], opts)
    assert again.cached_tokens == 288  # 299 cached tokens, rounded down to chunks of 32
    assert again.result.tokens == FakePoolRuntime.expected(prompts[-1] + [7, 8], 6)
    session.close()
    assert rt.kern_pool.held_pages == 0


def test_same_prompt_twice_reuses_all_but_the_last_token(facts: ManifestFacts) -> None:
    p = _ids(161, 20)  # 160 prefill tokens = 5 chunks of 32
    opts = GenerateOptions(5, 32, stop_at_eos=False)
    rt = FakePoolRuntime()
    session = PrefixSession(Generator(rt, facts), chunk=32)
    first = session.generate(p, opts)
    before = len(rt.calls)
    second = session.generate(p, opts)
    assert second.cached_tokens == 160 and not [c for c in rt.calls[before:] if c[0] == "prefill"]
    assert first.result.tokens == second.result.tokens == FakePoolRuntime.expected(p, 5)
    session.close()


def test_session_needs_the_pool_api(facts: ManifestFacts) -> None:
    with pytest.raises(InputError, match="pool API"):
        PrefixSession(Generator(FakeRuntime(), facts), chunk=32)


def test_read_prompts(tmp_path: Path) -> None:
    text = tmp_path / "p.txt"
    text.write_text("first prompt\n\n  second one\n")
    assert read_prompts(text) == ["first prompt", "  second one"]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a\\nb"}\n{"prompt": "c", "id": 2}\n')
    assert read_prompts(jsonl) == ["a\nb", "c"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"text": "c"}\n')
    with pytest.raises(InputError, match=":2"):
        read_prompts(bad)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(InputError, match="no prompts"):
        read_prompts(tmp_path / "empty")
