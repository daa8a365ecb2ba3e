"""The pipelined decode loop (inputs advanced on the device, steps queued ahead, tokens read from the ring)
against the synchronous loop, over a fake runtime that emulates kern_decode_advance
(kernels-src/step.cu, reference tools/reference_step.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kern_run.generate import GenerateOptions, Generator
from kern_run.preflight import ManifestFacts, read_manifest
from kern_run_testutil import FakeRuntime

from tools.reference_step import decode_advance  # noqa: E402


class _Event:
    def __init__(self, rt: "AdvancingFakeRuntime", step: int) -> None:
        self.rt, self.step = rt, step

    def ready(self) -> bool:
        return True

    def wait(self) -> None:
        self.rt.waited.append(self.step)


class AdvancingFakeRuntime(FakeRuntime):
    """FakeRuntime whose decode program ends like the generated one: the next step's inputs and the token
    ring are written "on the device" (numpy reference of kern_decode_advance) after the argmax."""

    def __init__(self, ring_len: int = 64, max_pos: int = 1024, **kw) -> None:
        super().__init__(**kw)
        self.ring = np.full((1, ring_len), -1, np.int64)
        self.max_pos = max_pos
        self.host_writes: list[str] = []
        self.waited: list[int] = []
        self.decodes = 0

    def write_input(self, name: str, array: np.ndarray) -> None:
        super().write_input(name, array)
        self.host_writes.append(name)

    def issue(self, program: str, values: dict[str, int], eager: bool = False) -> None:
        super().issue(program, values, eager)
        if program == "decode":
            self.decodes += 1
            bt = self.inputs["block_table"]
            for name in ("token_ids", "positions", "seq_lens", "slot_mapping"):
                self.inputs[name] = np.array(self.inputs[name])  # private copies, as device buffers are
            decode_advance(self.next_token, self.inputs["token_ids"], self.inputs["positions"], self.inputs["seq_lens"],
                           self.inputs["slot_mapping"], bt, self.ring, n_seqs=1, page_tokens=self.page_tokens,
                           bt_stride=bt.shape[1], max_pos=self.max_pos)

    def record_event(self) -> _Event:
        return _Event(self, self.decodes)

    def host_array(self, name: str) -> np.ndarray:
        assert name == "token_ring"
        return self.ring


@pytest.fixture
def facts(tiny_manifest: Path) -> ManifestFacts:
    return read_manifest(tiny_manifest)  # tokens max 64, 1024 positions, decode_advance ring of 64


def _run(rt: FakeRuntime, facts: ManifestFacts, prompt: list[int], opts: GenerateOptions, eos=frozenset()):
    seen: list[int] = []
    steps = rt if isinstance(rt, AdvancingFakeRuntime) else None  # what Generator.open gives: the DeviceSteps
    result = Generator(rt, facts, eos_ids=eos, steps=steps).generate(prompt, opts, seen.append)
    return result, seen


def test_manifest_declares_the_ring(facts: ManifestFacts) -> None:
    assert facts.decode_advance == {"ring": "token_ring", "ring_len": 64}
    assert facts.manifest.buffers["token_ring"].to_json() == {"kind": "output", "dtype": "i64", "shape": ["seqs", 64],
                                                              "placement": "host"}
    assert facts.manifest.programs["decode"].calls[-1].op == "decode_advance_packed"  # the sampler's step end


@pytest.mark.parametrize("lookahead", [1, 2, 4, 62, 500])
@pytest.mark.parametrize("chunk", [1, 64])
def test_pipelined_tokens_equal_synchronous(facts: ManifestFacts, lookahead: int, chunk: int) -> None:
    prompt = list(range(10, 110))
    sync, sync_seen = _run(FakeRuntime(), facts, prompt, GenerateOptions(150, chunk, lookahead=0))
    rt = AdvancingFakeRuntime()
    piped, seen = _run(rt, facts, prompt, GenerateOptions(150, chunk, lookahead=lookahead))
    assert piped.timings.pipelined and not sync.timings.pipelined
    assert piped.tokens == sync.tokens and seen == sync_seen and piped.stop_reason == sync.stop_reason == "steps"
    assert rt.decodes == 150  # never a step past the budget
    decode_at = next(i for i, c in enumerate(rt.calls) if c[0] == "decode")
    writes_after_prefill = rt.host_writes[-4:]
    assert sorted(writes_after_prefill) == ["positions", "seq_lens", "slot_mapping", "token_ids"]
    assert len(piped.timings.token_s) == 150 and piped.timings.decode_steps == 149
    assert all(c[0] == "decode" for c in rt.calls[decode_at:])


def test_eos_with_lag_discards_queued_steps(facts: ManifestFacts) -> None:
    prompt = [5, 6, 7]
    want, _ = _run(FakeRuntime(), facts, prompt, GenerateOptions(50, 64, lookahead=0))
    eos = frozenset({want.tokens[3]})
    sync, sync_seen = _run(FakeRuntime(), facts, prompt, GenerateOptions(50, 64, lookahead=0), eos)
    rt = AdvancingFakeRuntime()
    piped, seen = _run(rt, facts, prompt, GenerateOptions(50, 64, lookahead=4), eos)
    assert piped.stop_reason == sync.stop_reason == "eos"
    assert piped.tokens == sync.tokens and seen == sync_seen  # the stop token is not streamed
    assert 4 < rt.decodes <= 4 + 5  # up to lookahead + 1 steps were in flight, then drained
    assert sorted(rt.waited) == rt.waited and len(rt.waited) == rt.decodes


def test_context_stop_and_eager(facts: ManifestFacts) -> None:
    prompt = list(range(10))
    sync, _ = _run(FakeRuntime(num_pages=2), facts, prompt, GenerateOptions(50, 64, lookahead=0))
    rt = AdvancingFakeRuntime(num_pages=2)
    piped, _ = _run(rt, facts, prompt, GenerateOptions(50, 64, eager=True, lookahead=3))
    assert piped.stop_reason == sync.stop_reason == "context" and piped.tokens == sync.tokens
    assert rt.decodes == 7 and all(c[2] for c in rt.calls if c[0] == "decode")  # positions 9..15: never past the lease


def test_teacher_forcing_still_feeds_from_the_host(facts: ManifestFacts) -> None:
    rt = AdvancingFakeRuntime()
    ids = [9, 8, 7, 6, 5, 4]
    _, argmax = Generator(rt, facts, steps=rt).teacher_forced(ids, prefill_tokens=2, chunk=64)
    assert list(argmax) == [FakeRuntime.predict(t, p) for p, t in enumerate(ids)][2:]


def test_single_token_prompt_and_budget_one(facts: ManifestFacts) -> None:
    for budget in (1, 2):
        sync, _ = _run(FakeRuntime(), facts, [42], GenerateOptions(budget, 64, lookahead=0))
        rt = AdvancingFakeRuntime()
        piped, _ = _run(rt, facts, [42], GenerateOptions(budget, 64))
        assert piped.tokens == sync.tokens and rt.decodes == budget


def test_reference_advance_semantics() -> None:
    bt = np.array([[3, 5, -1, 7]], np.int32)
    tok, pos, lens, slots = (np.zeros(1, np.int32) for _ in range(4))
    ring = np.zeros((1, 8), np.int64)
    for p, want_slot in ((14, 3 * 16 + 15), (15, 5 * 16 + 0), (31, -1), (47, 7 * 16 + 0), (63, -1)):
        pos[0] = p
        decode_advance(np.array([123], np.int64), tok, pos, lens, slots, bt, ring, 1, 16, 4, 64)
        assert (tok[0], pos[0], lens[0], ring[0, (p + 1) % 8]) == (123, p + 1, p + 2, 123)
        assert slots[0] == want_slot, (p, slots[0], want_slot)
