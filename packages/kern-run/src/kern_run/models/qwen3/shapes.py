"""The table of known shapes (gpt-fast's `transformer_configs`): name -> the config.json fields that decide tensor
shapes, and the config.json transformers writes for one. Qwen3 dense (`Qwen3Shape`) and Llama 3.x dense
(`LlamaShape`: the published Llama-3.2-1B / -3B and Llama-3.1-8B; the -Instruct checkpoints have the same shapes).

`tools/make_checkpoint.py --shape NAME` writes a checkpoint of a shape; `kern manifest build --shape NAME` builds
its manifest without a config.json file (the config text `config_text` renders is the one make_checkpoint writes,
so `meta.config_sha256` is that file's sha256).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class Qwen3Shape:
    """The Qwen3 hyper-parameters that decide tensor shapes (names and units as in config.json)."""

    family: ClassVar[str] = "qwen3"
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


@dataclass(frozen=True)
class LlamaShape:
    """The Llama 3.x hyper-parameters that decide tensor shapes and RoPE (names and units as in config.json; rope_*
    the rope_scaling of rope_type "llama3", `llama3_rope` false: rope_scaling null, plain RoPE as Llama 3.0).
    `transformers_version` and `write_head_dim` only make config_json the published file (Llama-3.1-8B's has no
    head_dim key: transformers derives hidden_size / num_attention_heads)."""

    family: ClassVar[str] = "llama"
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int = 128256
    tie_word_embeddings: bool = True
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 131072
    rope_factor: float = 32.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position_embeddings: int = 8192
    llama3_rope: bool = True
    transformers_version: str = "4.45.0.dev0"
    write_head_dim: bool = True


SHAPES: dict[str, Qwen3Shape | LlamaShape] = {
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
    # meta-llama/Llama-3.2-1B, -3B, Llama-3.1-8B config.json (tests/data/configs/Llama-*.json): head_dim 64 at 1B,
    # GQA groups 4 / 3 / 4, lm_head tied at 3.2, untied at 3.1-8B, rope_scaling factor 32 (3.2) and 8 (3.1)
    "llama3.2-1b": LlamaShape(2048, 16, 32, 8, 64, 8192),
    "llama3.2-3b": LlamaShape(3072, 28, 24, 8, 128, 8192),
    "llama3.1-8b": LlamaShape(4096, 32, 32, 8, 128, 14336, tie_word_embeddings=False, rope_factor=8.0,
                              transformers_version="4.43.0.dev0", write_head_dim=False),
}


def _number(x: float) -> float | int:
    """An integral value as a JSON integer (as the published Qwen3 files write rope_theta)."""
    return int(x) if float(x).is_integer() else x


def llama_config_json(shape: LlamaShape) -> dict:
    """config.json with the keys and values of the published Llama 3.x files (Llama-3.2-1B's as template)."""
    out = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "hidden_size": shape.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": shape.intermediate_size,
        "max_position_embeddings": shape.max_position_embeddings,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": shape.num_attention_heads,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_key_value_heads": shape.num_key_value_heads,
        "pretraining_tp": 1,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_scaling": {"factor": shape.rope_factor, "high_freq_factor": shape.rope_high_freq_factor,
                         "low_freq_factor": shape.rope_low_freq_factor,
                         "original_max_position_embeddings": shape.rope_original_max_position_embeddings,
                         "rope_type": "llama3"} if shape.llama3_rope else None,
        "rope_theta": shape.rope_theta,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "torch_dtype": "bfloat16",
        "transformers_version": shape.transformers_version,
        "use_cache": True,
        "vocab_size": shape.vocab_size,
    }
    if not shape.write_head_dim:
        del out["head_dim"]
    return out


def config_json(shape: Qwen3Shape | LlamaShape) -> dict:
    """config.json with the keys and values transformers writes: Qwen3Config's (Qwen3-4B's file as template) or
    the published Llama 3.x files' (llama_config_json)."""
    if isinstance(shape, LlamaShape):
        return llama_config_json(shape)
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
        "rope_theta": _number(shape.rope_theta),
        "sliding_window": None,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": shape.vocab_size,
    }


def config_text(shape: Qwen3Shape | LlamaShape) -> str:
    """The config.json text tools/make_checkpoint.py writes for `shape`: sorted keys, indent 2, trailing newline."""
    return json.dumps(config_json(shape), indent=2, sort_keys=True) + "\n"
