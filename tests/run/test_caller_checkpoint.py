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

from tools import make_checkpoint as mc


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


# ---------------------------------------------------------------- refusals, reruns, failures mid-write

SMALL = mc.Qwen3Shape(64, 2, 2, 1, 32, 96, vocab_size=1000)


@pytest.mark.parametrize(("args", "message"), [
    (["--seed", "-1"], "make_checkpoint: --seed -1: must be >= 0"),
    (["--threads", "-1"], "make_checkpoint: --threads -1: must be >= 1 (omit it for the CPU count)"),
    (["--threads", "0"], "make_checkpoint: --threads 0: must be >= 1 (omit it for the CPU count)"),
    (["--max-shard-gb", "nan"], "make_checkpoint: --max-shard-gb nan: must be a finite size > 0 (GiB)"),
    (["--max-shard-gb", "inf"], "make_checkpoint: --max-shard-gb inf: must be a finite size > 0 (GiB)"),
    (["--max-shard-gb", "0"], "make_checkpoint: --max-shard-gb 0.0: must be a finite size > 0 (GiB)"),
    (["--max-shard-gb", "-2"], "make_checkpoint: --max-shard-gb -2.0: must be a finite size > 0 (GiB)"),
])
def test_cli_options_are_checked_before_anything_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           args: list[str], message: str) -> None:
    out = tmp_path / "ckpt"
    assert mc.main(["--shape", "tiny", "--out", str(out), "--no-tokenizer", *args]) == 1
    captured = capsys.readouterr()
    assert captured.err == message + "\n" and captured.out == ""
    assert not out.exists()


def test_cli_out_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ckpt"
    out.write_text("keep")
    assert mc.main(["--shape", "tiny", "--out", str(out), "--no-tokenizer"]) == 1
    assert capsys.readouterr().err == f"make_checkpoint: --out {out} exists and is not a directory\n"
    assert out.read_text() == "keep"


def test_cli_bad_tokenizer_ranks_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ranks = tmp_path / "qwen.tiktoken"
    ranks.write_bytes(b"IQ== 0\n@@@ 1\n")
    out = tmp_path / "ckpt"
    assert mc.main(["--shape", "tiny", "--out", str(out), "--tokenizer-source", str(ranks)]) == 1
    assert capsys.readouterr().err == (f"make_checkpoint: {ranks}: ranks line 2: '@@@' is not base64 (Only base64 "
                                       "data is allowed)\n")
    assert not out.exists()  # the ranks are read before anything is written


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"seed": -1}, r"^seed -1: must be an integer >= 0"),
    ({"threads": 0}, r"^threads 0: must be >= 1"),
    ({"max_shard_bytes": 0}, r"^max_shard_bytes 0: must be >= 1"),
])
def test_write_checkpoint_refuses_bad_arguments_before_writing(tmp_path: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        mc.write_checkpoint(tmp_path / "x", SMALL, with_tokenizer=False, log=lambda *_: None, **kwargs)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("damage", ["delete", "truncate", "index"])
def test_a_matching_stamp_with_a_damaged_checkpoint_is_rewritten(tmp_path: Path, damage: str) -> None:
    logs: list[str] = []
    out = mc.write_checkpoint(tmp_path / "x", SMALL, seed=3, max_shard_bytes=100_000, with_tokenizer=False,
                              log=logs.append)
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) > 1
    before = {p.name: _sha(p) for p in shards}
    victim = shards[1]
    if damage == "delete":
        victim.unlink()
    elif damage == "truncate":
        victim.write_bytes(victim.read_bytes()[:-2])
    else:
        (out / "model.safetensors.index.json").unlink()
    mc.write_checkpoint(out, SMALL, seed=3, max_shard_bytes=100_000, with_tokenizer=False, log=logs.append)
    assert "nothing to do" not in logs[-1] and "tensors" in logs[-1]
    assert {p.name: _sha(p) for p in out.glob("model-*.safetensors")} == before
    mc.write_checkpoint(out, SMALL, seed=3, max_shard_bytes=100_000, with_tokenizer=False, log=logs.append)
    assert "nothing to do" in logs[-1]


def test_a_failure_mid_write_leaves_no_partial_shard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = mc.tensor_chunk_bf16

    def chunk(seed: int, name: str, numel: int, c: int) -> np.ndarray:
        if name == "model.layers.1.mlp.down_proj.weight":
            raise MemoryError("no room for the chunk")
        return real(seed, name, numel, c)

    monkeypatch.setattr(mc, "tensor_chunk_bf16", chunk)
    out = tmp_path / "x"
    with pytest.raises(MemoryError):
        mc.write_checkpoint(out, SMALL, max_shard_bytes=100_000, with_tokenizer=False, log=lambda *_: None)
    assert not out.exists()  # no shard, no temporary file, no stamp: the directory it made is gone too
