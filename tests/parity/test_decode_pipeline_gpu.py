"""On the GPU: the pipelined decode loop (inputs advanced by kern_decode_advance, steps queued ahead, tokens
read from the host-mapped ring after events) gives exactly the tokens of the synchronous loop, graph and
eager, with stops found a few steps late; and the device-side inputs equal what the host would write.

Run with `KERN_REQUIRE_GPU=1 pytest tests/parity/test_decode_pipeline_gpu.py` (manifests/qwen3-tiny.json,
the committed cubins, the seeded `tiny` checkpoint).
"""

from __future__ import annotations

import pytest
from test_parity_gpu import _ids, _open

from kern_run.sampling import packed_token

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gen(tmp_path_factory: pytest.TempPathFactory):
    from tools import make_checkpoint as mc

    ckpt = tmp_path_factory.mktemp("pipeline") / "qwen3-tiny"
    mc.write_checkpoint(ckpt, mc.SHAPES["tiny"], seed=0, with_tokenizer=False, log=lambda *_: None)
    g = _open(ckpt, "qwen3-tiny.json")
    yield g
    g.close()


def test_pipelined_equals_synchronous(gen) -> None:
    from kern_run.generate import GenerateOptions

    assert gen.can_pipeline
    prompt = _ids(150, seed=11)
    sync = gen.generate(prompt, GenerateOptions(100, 64, stop_at_eos=False, lookahead=0))
    assert not sync.timings.pipelined and len(sync.tokens) == 100
    for eager in (False, True):
        for lookahead in (1, 4, 62):
            r = gen.generate(prompt, GenerateOptions(100, 64, eager=eager, stop_at_eos=False, lookahead=lookahead))
            assert r.timings.pipelined
            assert r.tokens == sync.tokens, f"eager={eager} lookahead={lookahead}: first difference at " \
                f"{next(i for i, (a, b) in enumerate(zip(r.tokens, sync.tokens)) if a != b)}"


def test_eos_found_late_gives_the_same_tokens(gen) -> None:
    from kern_run.generate import GenerateOptions

    prompt = _ids(40, seed=12)
    free = gen.generate(prompt, GenerateOptions(40, 64, stop_at_eos=False, lookahead=0)).tokens
    stop = free[17]
    gen.eos_ids = frozenset({stop})
    try:
        sync = gen.generate(prompt, GenerateOptions(40, 64, lookahead=0))
        piped = gen.generate(prompt, GenerateOptions(40, 64, lookahead=4))
    finally:
        gen.eos_ids = frozenset()
    assert sync.stop_reason == piped.stop_reason == "eos"
    assert piped.tokens == sync.tokens == free[: free.index(stop) + 1]
    # the steps queued past the stop did not disturb the next generation
    again = gen.generate(prompt, GenerateOptions(40, 64, stop_at_eos=False, lookahead=4)).tokens
    assert again == free


def test_device_advanced_inputs_match_the_host_contract(gen) -> None:
    """After a decode step, the inputs on the device are those the host would write for the next position."""
    from kern_run.generate import GenerateOptions

    prompt = _ids(37, seed=13)
    r = gen.generate(prompt, GenerateOptions(5, 64, stop_at_eos=False, lookahead=0))
    # the last step processed position 37 + 5 - 2 and advanced to the next one
    p = len(prompt) + len(r.tokens) - 1
    rt = gen.rt
    assert int(rt.read_buffer("positions")[0]) == p
    assert int(rt.read_buffer("seq_lens")[0]) == p + 1
    assert int(rt.read_buffer("slot_mapping")[0]) == gen.slot(p)
    assert int(rt.read_buffer("token_ids")[0]) == r.tokens[-1]
    ring = rt.host_array("token_ring")
    assert packed_token(ring[0, p % ring.shape[1]]) == r.tokens[-1]  # bits 0..31 (plain ids with --sampler argmax)
