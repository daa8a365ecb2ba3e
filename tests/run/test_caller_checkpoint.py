"""tools/make_checkpoint.py: HF layout, names, shapes, dtype, determinism."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

import make_checkpoint as mc


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_bf16(path: Path, name: str) -> np.ndarray:
    """f32 values of a bf16 tensor, parsing the safetensors header by hand (numpy has no bf16)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    info = json.loads(raw[8:8 + n])[name]
    assert info["dtype"] == "BF16"
    lo, hi = info["data_offsets"]
    bits = np.frombuffer(raw[8 + n + lo:8 + n + hi], dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])


def test_qwen3_4b_names_and_shapes() -> None:
    shapes = mc.tensor_shapes(mc.SHAPES["qwen3-4b"])
    assert len(shapes) == 36 * 11 + 2
    assert shapes["model.embed_tokens.weight"] == (151936, 2560)
    assert shapes["model.layers.35.self_attn.q_proj.weight"] == (4096, 2560)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (1024, 2560)
    assert shapes["model.layers.0.self_attn.o_proj.weight"] == (2560, 4096)
    assert shapes["model.layers.0.self_attn.q_norm.weight"] == (128,)
    assert shapes["model.layers.0.mlp.gate_proj.weight"] == (9728, 2560)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (2560, 9728)
    assert "lm_head.weight" not in shapes
    total = sum(math.prod(s) * 2 for s in shapes.values())
    assert total == 8_044_936_192  # Qwen3-4B: 4.02B parameters, 8.04 GB in bf16
    untied = mc.tensor_shapes(replace(mc.SHAPES["qwen3-4b"], tie_word_embeddings=False))
    assert untied["lm_head.weight"] == (151936, 2560)


def test_config_matches_qwen3_4b() -> None:
    cfg = mc.config_json(mc.SHAPES["qwen3-4b"])
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"], cfg["intermediate_size"], cfg["vocab_size"]) == (2560, 36, 32, 8, 128, 9728, 151936)
    assert cfg["tie_word_embeddings"] is True and cfg["torch_dtype"] == "bfloat16"
    assert cfg["rope_theta"] == 1000000 and cfg["rms_norm_eps"] == 1e-6 and cfg["max_position_embeddings"] == 40960


def test_tiny_checkpoint_layout(tiny_ckpt: Path) -> None:
    index = json.loads((tiny_ckpt / "model.safetensors.index.json").read_text())
    shapes = mc.tensor_shapes(mc.SHAPES["tiny"])
    assert set(index["weight_map"]) == set(shapes)
    assert index["metadata"]["total_size"] == sum(math.prod(s) * 2 for s in shapes.values())
    shard = tiny_ckpt / "model-00001-of-00001.safetensors"
    with safe_open(str(shard), framework="numpy") as f:
        assert set(f.keys()) == set(shapes)
    emb = _read_bf16(shard, "model.embed_tokens.weight")
    assert emb.shape == (151936, 256)
    assert abs(float(emb.std()) - 0.02) < 1e-3 and abs(float(emb.mean())) < 1e-3
    norm = _read_bf16(shard, "model.layers.0.input_layernorm.weight")
    assert abs(float(norm.mean()) - 1.0) < 0.02 and 0.02 < float(norm.std()) < 0.08
    assert json.loads((tiny_ckpt / "generation_config.json").read_text())["eos_token_id"] == [256]


def test_deterministic_across_threads_and_shards(tmp_path: Path) -> None:
    small = mc.Qwen3Shape(64, 2, 2, 1, 32, 96, vocab_size=1000)
    a = mc.write_checkpoint(tmp_path / "a", small, seed=3, with_tokenizer=False, threads=1, log=lambda *_: None)
    b = mc.write_checkpoint(tmp_path / "b", small, seed=3, with_tokenizer=False, threads=4, log=lambda *_: None)
    c = mc.write_checkpoint(tmp_path / "c", small, seed=4, with_tokenizer=False, log=lambda *_: None)
    files = sorted(p.name for p in a.glob("model-*.safetensors"))
    assert files == ["model-00001-of-00001.safetensors"]
    assert _sha(a / files[0]) == _sha(b / files[0]) != _sha(c / files[0])
    # sharding changes the files, never the tensors
    d = mc.write_checkpoint(tmp_path / "d", small, seed=3, max_shard_bytes=100_000, with_tokenizer=False,
                            log=lambda *_: None)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    for name, shard in index["weight_map"].items():
        np.testing.assert_array_equal(_read_bf16(d / shard, name), _read_bf16(a / files[0], name))


def test_stamp_skips_rework(tmp_path: Path) -> None:
    small = mc.Qwen3Shape(64, 1, 2, 1, 32, 96, vocab_size=500)
    logs: list[str] = []
    mc.write_checkpoint(tmp_path / "x", small, with_tokenizer=False, log=logs.append)
    mc.write_checkpoint(tmp_path / "x", small, with_tokenizer=False, log=logs.append)
    assert "nothing to do" in logs[-1]


def test_chunks_round_to_nearest_even() -> None:
    bits = mc.tensor_chunk_bf16(0, "model.layers.0.mlp.up_proj.weight", 1000, 0)
    rng = np.random.default_rng([0, mc._name_key("model.layers.0.mlp.up_proj.weight"), 0])
    want = rng.standard_normal(1000, dtype=np.float32) * np.float32(0.02)
    got = (bits.astype(np.uint32) << 16).view(np.float32)
    assert np.all(np.abs(got - want) <= np.abs(want) * 2.0**-8 + 1e-30)
