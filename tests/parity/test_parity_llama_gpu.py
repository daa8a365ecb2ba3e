"""Parity on the GPU at the Llama-3.2-1B (head_dim 64, tied) and Llama-3.1-8B (head_dim 128, untied) shapes: kern
(the manifest `kern manifest build --config` makes from the published config.json with prefill pins picked on the
GPU, the committed cubins) against
transformers' LlamaForCausalLM (bf16, eager attention; and float32 as the higher-precision reference) on the same
seeded checkpoint (tools/make_checkpoint.py --shape llama3.2-1b / llama3.1-8b), with the criteria of tools/parity.py:

- kern's max relative logit error against float32 stays within max(2e-2, 1.5 x bf16 transformers' own error against
  float32), and kern's top-1 differs from float32's only where float32's top-2 margin is within twice that step's
  error; against bf16 transformers likewise;
- the GPU argmax (`next_token`) equals the argmax of kern's own logits;
- cases: decode only from position 0, and a 600-token prompt through chunked prefill (chunks of 512 and of 7) then
  decode, so the llama3 rope table is read past its original-context band edges and across pages;
- greedy generation through chunk 512 with the decode graph, chunk 1 and eager decode: identical tokens; against
  transformers' greedy tokens: equal up to a step whose reference top-2 margin is within the measured error.

Ids are fed directly (no tokenizer), drawn below Llama 3's 128000 ordinary tokens. Each shape's kern results are
computed, kern closed, then each reference loaded in turn (the 8B in float32 is 32 GB).

Run on the H200:  KERN_REQUIRE_GPU=1 python3 -m pytest tests/parity/test_parity_llama_gpu.py -q
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
REL_TOL = 2e-2
DECODE_POSITIONS, PROMPT_TOKENS, AFTER_PROMPT = 96, 600, 24


def _ids(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 128000, size=n).tolist()


@pytest.fixture(scope="module", params=["llama3.2-1b", "llama3.1-8b"])
def ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tools import make_checkpoint as mc

    out = tmp_path_factory.mktemp("parity-llama") / request.param
    mc.write_checkpoint(out, mc.SHAPES[request.param], seed=0, with_tokenizer=False, log=lambda *_: None)
    return out


@pytest.fixture(scope="module")
def kern_side(ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The manifest built from the checkpoint's config.json with batch-invariant prefill pins picked on this GPU
    (kern_run.pins_cache.ensure_pins, into a private cache: chunk 1 and chunk 512 are bit-identical only on such
    pins), then every kern result of the module."""
    from kern_run.generate import GenerateOptions, Generator
    from kern_run.models.qwen3 import Qwen3Config, prefill_shapes
    from kern_run.models.qwen3.command import BuildRequest, build_texts, write_outputs
    from kern_run.pins_cache import ensure_pins
    from kern_run.preflight import read_manifest

    base = tmp_path_factory.mktemp("parity-llama-manifest")
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CACHE_HOME", str(base / "xdg"))
    try:
        cfg = Qwen3Config.from_json(json.loads((ckpt / "config.json").read_text()), str(ckpt / "config.json"))
        pins = ensure_pins(prefill_shapes(cfg), 0, 512)
    finally:
        mp.undo()
    manifest = base / f"{ckpt.name}.json"
    write_outputs(build_texts(BuildRequest(out=manifest, config=ckpt / "config.json", kernels=ROOT / "kernels",
                                           algos=pins, max_context=4096)))
    gen = Generator.open(manifest, ROOT / "kernels", ckpt, read_manifest(manifest), gpu=0, capacity_tokens=4096)
    try:
        decode_ids, prompt_ids = _ids(DECODE_POSITIONS, 1), _ids(PROMPT_TOKENS + AFTER_PROMPT, 2)
        greedy_prompt = _ids(50, 3)
        out = {"decode_ids": decode_ids, "prompt_ids": prompt_ids, "greedy_prompt": greedy_prompt,
               "decode": gen.teacher_forced(decode_ids, 0, 512),
               "prompt": gen.teacher_forced(prompt_ids, PROMPT_TOKENS, 512),
               "prompt chunk 7": gen.teacher_forced(prompt_ids, PROMPT_TOKENS, 7)}
        out["greedy"] = {
            "chunk 512, graph": gen.generate(greedy_prompt, GenerateOptions(48, 512, stop_at_eos=False)).tokens,
            "chunk 1, graph": gen.generate(greedy_prompt, GenerateOptions(48, 1, stop_at_eos=False)).tokens,
            "chunk 512, eager": gen.generate(greedy_prompt, GenerateOptions(48, 512, eager=True,
                                                                            stop_at_eos=False)).tokens,
        }
    finally:
        gen.close()
        del gen
        gc.collect()
    return out


@pytest.fixture(scope="module")
def ref_side(ckpt: Path, kern_side: dict[str, Any]) -> dict[str, Any]:
    """transformers' logits on the same ids, bf16 then float32 (one model on the GPU at a time), and bf16's greedy
    tokens after the greedy prompt."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from kern_run.reference import HfReference

    out: dict[str, Any] = {}
    for dtype in ("bfloat16", "float32"):
        ref = HfReference(ckpt, gpu=0, dtype=dtype)
        try:
            out[dtype] = {"decode": ref.logits(kern_side["decode_ids"], 0),
                          "prompt": ref.logits(kern_side["prompt_ids"], PROMPT_TOKENS)}
            if dtype == "bfloat16":
                prompt = kern_side["greedy_prompt"]
                out["greedy"] = ref.greedy(prompt, 48)
                ours = kern_side["greedy"]["chunk 512, graph"]
                first = next((i for i, (a, b) in enumerate(zip(ours, out["greedy"])) if a != b), None)
                out["divergence"] = None if first is None else (
                    first, ref.logits(prompt + out["greedy"][:first], len(prompt) + first - 1)[0])
        finally:
            ref.close()
            del ref
            gc.collect()
    return out


CASES = [("decode", "decode"), ("prompt", "prompt"), ("prompt chunk 7", "prompt")]


@pytest.mark.parametrize("case, ref_case", CASES)
def test_logits_within_the_float32_bound(kern_side: dict[str, Any], ref_side: dict[str, Any], case: str,
                                         ref_case: str) -> None:
    from kern_run.compare import compare_logits

    logits, _ = kern_side[case]
    f32 = ref_side["float32"][ref_case]
    ours, theirs = compare_logits(logits, f32, 0.0), compare_logits(ref_side["bfloat16"][ref_case], f32, 0.0)
    bound = max(REL_TOL, 1.5 * theirs.max_rel)
    assert ours.max_rel <= bound, (f"{case}: kern's max relative error vs float32 {ours.max_rel:.3e} > bound "
                                   f"{bound:.3e} (1.5 x bf16 transformers' own {theirs.max_rel:.3e})")
    bad = ours.mismatches_beyond_error(2.0)
    assert not bad, f"{case}: top-1 differs from float32 beyond kern's error bound at steps {bad[:10]}"


@pytest.mark.parametrize("case, ref_case", CASES)
def test_top1_against_bf16_transformers_and_the_gpu_argmax(kern_side: dict[str, Any], ref_side: dict[str, Any],
                                                           case: str, ref_case: str) -> None:
    from kern_run.compare import compare_logits

    logits, argmax = kern_side[case]
    cmp = compare_logits(logits, ref_side["bfloat16"][ref_case], 0.0)
    bad = cmp.mismatches_beyond_error(2.0)
    assert not bad, f"{case}: top-1 differs from bf16 transformers beyond the error bound at steps {bad[:10]}"
    assert list(argmax) == [int(i) for i in np.argmax(logits, axis=1)], f"{case}: GPU argmax != argmax of logits"


def test_chunking_and_replay_give_identical_greedy_tokens(kern_side: dict[str, Any]) -> None:
    runs = kern_side["greedy"]
    first = runs["chunk 512, graph"]
    assert len(first) == 48
    for name, tokens in runs.items():
        assert tokens == first, f"{name} differs from chunk 512 graph at step " \
                                f"{next(i for i, (a, b) in enumerate(zip(tokens, first)) if a != b)}"


def test_greedy_agrees_with_transformers_up_to_a_near_tie(kern_side: dict[str, Any], ref_side: dict[str, Any]) -> None:
    """Equal greedy tokens, or a first divergence where the reference's top-2 margin is within twice the largest
    error measured against it in the teacher-forced cases."""
    from kern_run.compare import compare_logits, top2_margin

    if ref_side["divergence"] is None:
        return
    step, row = ref_side["divergence"]
    error = max(compare_logits(kern_side[c][0], ref_side["bfloat16"][r], 0.0).max_abs for c, r in CASES)
    assert top2_margin(row) <= 2 * error, (f"greedy diverges from transformers at step {step} with reference margin "
                                           f"{top2_margin(row):.3e} > 2 x measured error {error:.3e}")
