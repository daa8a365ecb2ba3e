"""Prefix reuse on the GPU: the tiny shape (tools/make_checkpoint.py, manifests/qwen3-tiny.json, the
committed cubins); two prompts sharing a 600-token prefix give the same tokens with the prefix cached
as each run alone, and the second prefills only its new tokens.

Run on the H200:  KERN_REQUIRE_GPU=1 python3 -m pytest tests/run/test_prefix_gpu.py -q
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gen(tmp_path_factory: pytest.TempPathFactory):
    from tools import make_checkpoint as mc

    from kern_run.generate import Generator
    from kern_run.preflight import read_manifest

    ckpt = tmp_path_factory.mktemp("prefix") / "qwen3-tiny"
    try:
        mc.write_checkpoint(ckpt, mc.SHAPES["tiny"], seed=0)
    except FileNotFoundError:  # no tokenizer ranks: ids are fed directly
        mc.write_checkpoint(ckpt, mc.SHAPES["tiny"], seed=0, with_tokenizer=False)
    manifest = ROOT / "manifests" / "qwen3-tiny.json"
    g = Generator.open(manifest, ROOT / "kernels", ckpt, read_manifest(manifest), gpu=0, capacity_tokens=4096)
    yield g
    g.close()


def _ids(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 151643, size=n).tolist()


@pytest.mark.parametrize("chunk", [40, 64])
def test_shared_600_token_prefix_is_reused_and_outputs_match_running_alone(gen, chunk: int) -> None:
    from kern_run.generate import GenerateOptions
    from kern_run.prefix_cache import PrefixSession

    shared = _ids(600, 1)
    prompts = [shared + _ids(90, 2), shared + _ids(70, 3), shared + _ids(70, 3)]
    opts = GenerateOptions(24, chunk, stop_at_eos=False)
    alone = [gen.generate(p, opts).tokens for p in prompts]
    session = PrefixSession(gen, chunk)
    try:
        runs = [session.generate(p, opts) for p in prompts]
    finally:
        session.close()
    # The committed manifest pins its prefill GEMMs (batch-invariant): the whole hit is reused at any chunk,
    # not rounded down to it. 600 is mid-page (37.5 pages of 16), so lease_from copied that page on the device.
    assert gen.facts.prefill_batch_invariant, "regenerate manifests/qwen3-tiny.json with --algos"
    cached = 600
    assert [r.cached_tokens for r in runs] == [0, cached, len(prompts[2]) - 1]
    assert runs[1].result.timings.prefill_tokens == len(prompts[1]) - 1 - cached
    for i, (r, want) in enumerate(zip(runs, alone)):
        assert r.result.tokens == want, f"prompt {i}: cached {r.cached_tokens}"
    print([(r.cached_tokens, round(r.result.timings.prefill_s * 1e3, 2)) for r in runs], file=sys.stderr)
