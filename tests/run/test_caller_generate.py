"""kern_run.generate.Generator over a fake runtime: the exact inputs of the caller contract."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kern_run.errors import InputError
from kern_run.generate import GenerateOptions, Generator, bf16_to_f32
from kern_run.preflight import ManifestFacts, read_manifest
from kern_run.text import StreamDecoder, TextCodec
from kern_run_testutil import FakeRuntime, byte_tokenizer


@pytest.fixture
def facts(tiny_manifest: Path) -> ManifestFacts:
    return read_manifest(tiny_manifest)  # tokens max 64, 1024 positions


def _expected(prompt: list[int], steps: int) -> list[int]:
    tokens, tok, pos = [], prompt[-1], len(prompt) - 1
    for _ in range(steps):
        tok = FakeRuntime.predict(tok, pos)
        tokens.append(tok)
        pos += 1
    return tokens


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_prefill_then_decode(facts: ManifestFacts, chunk: int) -> None:
    rt = FakeRuntime()
    gen = Generator(rt, facts)
    prompt = list(range(10, 110))  # 100 tokens
    result = gen.generate(prompt, GenerateOptions(5, chunk))
    assert result.tokens == _expected(prompt, 5) and result.stop_reason == "steps"
    prefills = [c for c in rt.calls if c[0] == "prefill"]
    sizes = [c[1]["tokens"] for c in prefills]
    assert sum(sizes) == 99 and all(s == chunk for s in sizes[:-1]) and sizes[-1] == 99 - chunk * (len(sizes) - 1)
    decodes = [c for c in rt.calls if c[0] == "decode"]
    assert len(decodes) == 5 and all(c[1] == {"tokens": 1, "seqs": 1} and c[2] is False for c in decodes)
    assert rt.calls[:len(prefills)] == prefills  # all prefill before any decode
    assert list(rt.inputs["block_table"][0, :8]) == [1, 2, 3, 4, 5, 6, 7, 7]  # 105 positions -> 7 pages, padded
    assert rt.inputs["block_table"].shape == (1, facts.pages_per_seq)
    assert result.timings.prefill_tokens == 99 and result.timings.decode_steps == 4


def test_single_token_prompt_skips_prefill(facts: ManifestFacts) -> None:
    rt = FakeRuntime()
    result = Generator(rt, facts).generate([42], GenerateOptions(3, 64, eager=True))
    assert [c[0] for c in rt.calls] == ["decode"] * 3 and all(c[2] for c in rt.calls)
    assert result.tokens == _expected([42], 3)


def test_stops_at_eos_and_context(facts: ManifestFacts) -> None:
    prompt = [5, 6, 7]
    want = _expected(prompt, 50)
    eos = want[3]
    rt = FakeRuntime()
    streamed: list[int] = []
    result = Generator(rt, facts, eos_ids=frozenset({eos})).generate(prompt, GenerateOptions(50, 64), streamed.append)
    first = want.index(eos)
    assert result.stop_reason == "eos" and result.tokens == want[:first + 1]
    assert streamed == want[:first]  # the stop token is not streamed
    small = FakeRuntime(num_pages=2)  # scratch page + 1 page: 16 positions
    result = Generator(small, facts).generate(list(range(10)), GenerateOptions(50, 64))
    assert result.stop_reason == "context" and len(result.tokens) == 7  # positions 9..15 write KV
    with pytest.raises(InputError, match="17 tokens"):
        Generator(FakeRuntime(num_pages=2), facts).generate(list(range(17)), GenerateOptions(1, 64))


def test_streaming_callback_sees_every_token(facts: ManifestFacts) -> None:
    seen: list[int] = []
    result = Generator(FakeRuntime(), facts).generate([1, 2], GenerateOptions(6, 64), seen.append)
    assert seen == result.tokens


def test_teacher_forced(facts: ManifestFacts) -> None:
    rt = FakeRuntime()
    ids = list(range(20, 60))
    logits, argmax = Generator(rt, facts).teacher_forced(ids, prefill_tokens=30, chunk=8)
    assert logits.shape == (10, 300) and logits.dtype == np.float32
    assert list(argmax) == [FakeRuntime.predict(ids[p], p) for p in range(30, 40)]
    assert list(np.argmax(logits, axis=1)) == list(argmax)
    assert [c[1]["tokens"] for c in rt.calls if c[0] == "prefill"] == [8, 8, 8, 6]


def test_bf16_bits_to_f32() -> None:
    bits = np.asarray([0x3F80, 0xC000, 0x0000], dtype=np.uint16)
    assert list(bf16_to_f32(bits)) == [1.0, -2.0, 0.0]


def test_stream_decoder_holds_partial_utf8(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(byte_tokenizer(tmp_path / "tokenizer.json")))
    codec = TextCodec(tok, frozenset())
    text = "héllo 🤖 世界!"
    ids = codec.encode(text)
    assert len(ids) == len(text.encode())  # one token per byte
    stream = StreamDecoder(codec)
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) + stream.flush() == text
    assert all("\ufffd" not in p for p in pieces)
    assert pieces[ids.index(ids[1]) + 1] == "é"  # emitted once its second byte arrived


def test_pages_from_the_runtime_pool_when_it_has_the_pool_api(facts: ManifestFacts) -> None:
    """A runtime with `lease` (kern_runtime.Runtime): the sequence's pages are a lease of the runtime's own
    pool, returned when the next generation starts and on close; no second (shadow) pool."""
    from types import SimpleNamespace

    from fake_pool_runtime import FakePoolRuntime

    rt = FakePoolRuntime(num_pages=64)
    rt.pool = SimpleNamespace(layout=rt.kern_pool.layout)
    gen = Generator(rt, facts)
    assert gen.pages.source == "runtime pool lease"
    assert gen.max_positions == min(63 * 16, facts.max_context)
    prompt = list(range(3, 43))
    assert gen.generate(prompt, GenerateOptions(8, 16, stop_at_eos=False)).tokens == FakePoolRuntime.expected(prompt, 8)
    assert rt.kern_pool.held_pages == 3  # 40 + 8 tokens: the lease stays until the next generation
    gen.generate(prompt[:20], GenerateOptions(4, 16, stop_at_eos=False))
    assert rt.kern_pool.held_pages == 2
    with pytest.raises(InputError, match="do not fit the KV pool"):
        gen.pages.reserve(64 * 16)
    assert rt.kern_pool.held_pages == 0  # the failed reserve released the previous lease first
    gen.pages.release()
    rt.kern_pool.check()


def test_pages_from_kern_pool_lease(facts: ManifestFacts) -> None:
    """With the runtime's pool layout, pages come from a kern_pool lease (never the scratch page 0)."""
    from kern_runtime import Capacity, load_spec, plan_pool

    spec = load_spec(facts.raw)
    layout = plan_pool(spec.states, Capacity(tokens=256, seqs=1), 2 << 20)
    rt = FakeRuntime(num_pages=layout.num_pages)
    rt.pool = layout
    gen = Generator(rt, facts)
    assert gen.pages.source == "kern_pool lease over the runtime's layout"
    assert gen.max_positions == min((layout.num_pages - 1) * 16, facts.max_context)
    result = gen.generate(list(range(40)), GenerateOptions(8, 16))
    assert result.tokens == _expected(list(range(40)), 8)
    row = rt.inputs["block_table"][0]
    assert 0 not in row[:3] and len(set(row[:3])) == 3
    gen.generate(list(range(30)), GenerateOptions(4, 16))  # the previous lease was returned
    with pytest.raises(InputError, match="hold 1024"):
        gen.teacher_forced(list(range(gen.max_positions + 1)))


def test_open_hands_the_verified_manifest_to_the_runtime(facts: ManifestFacts, tiny_manifest: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """read_manifest parses and verifies once; Generator.open passes that kern_manifest.Manifest (not the path)
    to Runtime.load, and the runtime's load_spec accepts it without verifying it again."""
    import sys

    import kern_manifest
    import kern_runtime
    from kern_runtime.runtime import load_spec

    assert isinstance(facts.parsed, kern_manifest.Manifest)
    seen: list[object] = []

    class Loaded(Exception):
        pass

    def fake_load(manifest, kernels, tensors, **kwargs):
        seen.append(manifest)
        raise Loaded

    monkeypatch.setattr(kern_runtime.SafetensorsTensors, "open", staticmethod(lambda path: None))
    monkeypatch.setattr(kern_runtime.Runtime, "load", staticmethod(fake_load))
    with pytest.raises(Loaded):
        Generator.open(tiny_manifest, "kernels", "weights", facts)
    assert seen == [facts.parsed]
    verifier = sys.modules["kern_manifest.verify"]
    monkeypatch.setattr(verifier, "find_faults", lambda m: pytest.fail("verified a second time"))
    assert load_spec(facts.parsed).vars["tokens"].max == facts.tokens_max
