"""kern test's sampled prompts stay inside the checkpoint's vocabulary (a 151643-id prompt on the
8192-token default model tripped a device-side assert in transformers on the H200)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from kern_run.abtest import PROMPTS, sample_prompts
from kern_run.text import TextCodec

ROOT = Path(__file__).resolve().parents[2]


def test_random_prompt_ids_below_base_vocab() -> None:
    codec = TextCodec(Tokenizer.from_file(str(ROOT / "models" / "qwen3-tiny-en" / "tokenizer.json")), frozenset({0}))
    prompts = sample_prompts(codec, len(PROMPTS) + 3, seed=0, random_tokens=300, max_tokens=1000)
    assert len(prompts) == len(PROMPTS) + 3
    randoms = prompts[len(PROMPTS):]
    assert [len(p) for p in randoms] == [300, 600, 900]
    assert max(max(p) for p in randoms) < 8192 and min(min(p) for p in randoms) >= 0
    assert max(max(p) for p in randoms) > 8000  # the whole range is used, not a small corner
