"""The table of known Qwen3 shapes (gpt-fast's `transformer_configs`): name -> the config.json fields that decide
tensor shapes, and the config.json transformers writes for one.

`tools/make_checkpoint.py --shape NAME` writes a checkpoint of a shape; `kern manifest build --shape NAME` builds
its manifest without a config.json file (the config text `config_text` renders is the one make_checkpoint writes,
so `meta.config_sha256` is that file's sha256).
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Qwen3Shape:
    """The Qwen3 hyper-parameters that decide tensor shapes (names and units as in config.json)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int = 151936
    tie_word_embeddings: bool = True
    rope_theta: float = 1000000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 40960


SHAPES: dict[str, Qwen3Shape] = {
    # Qwen/Qwen3-4B config.json
    "qwen3-4b": Qwen3Shape(2560, 36, 32, 8, 128, 9728),
    # Qwen/Qwen3-0.6B config.json
    "qwen3-0.6b": Qwen3Shape(1024, 28, 16, 8, 128, 3072),
    # the other published dense sizes (their config.json files: tests/data/configs/Qwen3-*.json); GQA groups 2
    # (0.6B, 1.7B), 4 (4B, 8B), 5 (14B), 8 (32B: 64 q heads); lm_head tied up to 4B, untied from 8B
    "qwen3-1.7b": Qwen3Shape(2048, 28, 16, 8, 128, 6144),
    "qwen3-8b": Qwen3Shape(4096, 36, 32, 8, 128, 12288, tie_word_embeddings=False),
    "qwen3-14b": Qwen3Shape(5120, 40, 40, 8, 128, 17408, tie_word_embeddings=False),
    "qwen3-32b": Qwen3Shape(5120, 64, 64, 8, 128, 25600, tie_word_embeddings=False),
    # Fast tests: the real vocabulary (so the real tokenizer applies), head_dim 128 as every Qwen3,
    # q width (4 x 128 = 512) != hidden (256) as in the 4B shape, 4 layers.
    "tiny": Qwen3Shape(256, 4, 4, 2, 128, 512),
}


def config_json(shape: Qwen3Shape) -> dict:
    """config.json with the keys and values transformers' Qwen3Config writes (Qwen3-4B's file as template)."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "hidden_size": shape.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": shape.intermediate_size,
        "max_position_embeddings": shape.max_position_embeddings,
        "max_window_layers": shape.num_hidden_layers,
        "model_type": "qwen3",
        "num_attention_heads": shape.num_attention_heads,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_key_value_heads": shape.num_key_value_heads,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": int(shape.rope_theta) if float(shape.rope_theta).is_integer() else shape.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": shape.vocab_size,
    }


def config_text(shape: Qwen3Shape) -> str:
    """The config.json text tools/make_checkpoint.py writes for `shape`: sorted keys, indent 2, trailing newline."""
    return json.dumps(config_json(shape), indent=2, sort_keys=True) + "\n"
