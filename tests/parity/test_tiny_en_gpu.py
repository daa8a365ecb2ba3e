"""The default target (models/qwen3-tiny-en, trained by tools/train_tiny.py): kern's greedy output equals
transformers' greedy `generate` token for token, 64 tokens on five prompts, and reads as English.

Needs torch + transformers (present on the GPU machine).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "qwen3-tiny-en"
MANIFEST = ROOT / "manifests" / "qwen3-tiny-en.json"
STEPS = 64
PROMPTS = (
    "The history of",
    "If the file does not exist,",
    "In this chapter, we will",
    "The main advantage of this approach is",
    "A process can",
)
COMMON_WORDS = frozenset("the a an of to in is are be and or that this it for with as by on can will not".split())


@pytest.fixture(scope="module")
def codec():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(MODEL / "tokenizer.json"))


@pytest.fixture(scope="module")
def kern_outputs(codec) -> dict[str, list[int]]:
    from kern_run.generate import GenerateOptions, Generator
    from kern_run.preflight import read_manifest

    outputs = {}
    with Generator.open(MANIFEST, ROOT / "kernels", MODEL, read_manifest(MANIFEST), gpu=0, capacity_tokens=2048) as gen:
        for prompt in PROMPTS:
            ids = codec.encode(prompt, add_special_tokens=False).ids
            outputs[prompt] = gen.generate(ids, GenerateOptions(STEPS, 512, stop_at_eos=False)).tokens
    return outputs


@pytest.fixture(scope="module")
def hf_outputs(codec, kern_outputs) -> dict[str, list[int]]:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.Qwen3ForCausalLM.from_pretrained(MODEL, dtype=torch.bfloat16).cuda().eval()
    outputs = {}
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = codec.encode(prompt, add_special_tokens=False).ids
            x = torch.tensor([ids], device="cuda")
            # min_new_tokens keeps generate from stopping at EOS, as kern's stop_at_eos=False does
            out = model.generate(x, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False,
                                 attention_mask=torch.ones_like(x), pad_token_id=0)
            outputs[prompt] = out[0, len(ids):].tolist()
    del model
    torch.cuda.empty_cache()
    return outputs


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_identical_to_transformers_generate(prompt, kern_outputs, hf_outputs, codec) -> None:
    ours, theirs = kern_outputs[prompt], hf_outputs[prompt]
    assert len(ours) == STEPS and len(theirs) == STEPS
    if ours != theirs:
        first = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
        pytest.fail(f"{prompt!r}: kern and transformers diverge at step {first}:\n"
                    f"  kern: {codec.decode(ours)!r}\n  hf:   {codec.decode(theirs)!r}")


def test_output_reads_as_english(kern_outputs, codec) -> None:
    text = " ".join(codec.decode(tokens) for tokens in kern_outputs.values())
    words = re.findall(r"[A-Za-z']+", text.lower())
    assert len(words) >= 5 * 25, f"too few words: {text!r}"
    common = sum(w in COMMON_WORDS for w in words) / len(words)
    letters = sum(c.isalpha() or c.isspace() for c in text) / len(text)
    assert common >= 0.15, f"only {common:.0%} common English words: {text!r}"
    assert letters >= 0.85, f"only {letters:.0%} letters/spaces: {text!r}"
