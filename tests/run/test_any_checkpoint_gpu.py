"""`kern run --weights DIR` on the GPU with the real kernels (kern_run.kernels_dir()): a made checkpoint with a GQA
group of 5 and an untied lm_head builds its manifest, generates, and the second run reuses it with the same text;
on an H200 the committed pins serve the tiny shape and `kern test --against chunk1` finds no mismatch (prefill
batch-invariant); a made Qwen3-1.7B checkpoint, whose shapes no committed pins cover, gets its pins picked on first
use (one progress line), and the second run reuses pins and manifest with the same tokens.

Run on the H200:  KERN_REQUIRE_GPU=1 python3 -m pytest tests/run/test_any_checkpoint_gpu.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kern_run.cli import app
from kern_run.models.qwen3 import SHAPES, Qwen3Shape
from kern_run_testutil import byte_tokenizer
from tools import make_checkpoint

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def own_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "kern"


def _checkpoint(out: Path, shape: Qwen3Shape) -> Path:
    """A seeded checkpoint of `shape` with the byte-level test tokenizer (eos id 256)."""
    make_checkpoint.write_checkpoint(out, shape, seed=0, with_tokenizer=False, log=lambda *_: None)
    byte_tokenizer(out / "tokenizer.json")
    for name in ("config.json", "generation_config.json"):
        doc = json.loads((out / name).read_text())
        doc["eos_token_id"] = 256 if name == "config.json" else [256]
        (out / name).write_text(json.dumps(doc))
    return out


def test_weights_alone_builds_generates_and_reuses(tmp_path: Path, own_cache: Path) -> None:
    shape = Qwen3Shape(256, 2, 10, 2, 128, 512, vocab_size=512, tie_word_embeddings=False)  # group 5, untied
    ckpt = _checkpoint(tmp_path / "g5", shape)
    args = ["run", "--weights", str(ckpt), "--no-pins", "--steps", "12", "--ignore-eos", "--prompt", "Hello"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.stderr
    built = sorted((own_cache / "manifests").iterdir())
    assert len(built) == 1
    assert first.stderr.splitlines()[0] == (f"kern run: built manifest {built[0]} (from {ckpt / 'config.json'}, "
                                            "--no-pins: prefill not batch-invariant)")
    assert len(first.stdout) > 0
    second = CliRunner().invoke(app, args)
    assert second.exit_code == 0, second.stderr
    assert second.stderr.splitlines()[0].startswith(f"kern run: reused manifest {built[0]} ")
    assert second.stdout == first.stdout
    eager = CliRunner().invoke(app, [*args, "--eager"])
    assert eager.exit_code == 0, eager.stderr
    assert eager.stdout == first.stdout


def test_pinned_prefill_is_batch_invariant_on_an_h200(tmp_path: Path) -> None:
    from kern_run.pins_cache import device_stamp

    device, _ = device_stamp(0)
    if device != "NVIDIA H200":
        pytest.skip(f"the committed pins are the H200's; this is {device}")
    ckpt = _checkpoint(tmp_path / "tiny", SHAPES["tiny"])
    result = CliRunner().invoke(app, ["test", "--weights", str(ckpt), "--against", "chunk1", "--prompts", "3",
                                      "--steps", "16"])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    line = result.stderr.splitlines()[0]
    assert line.startswith("kern test: built manifest ") and line.endswith(
        f"(from {ckpt / 'config.json'}, pins {ROOT / 'manifests' / 'algos' / 'h200.json'})"), line
    rows = result.stdout.strip().splitlines()
    assert len(rows) == 2 + 3 and all("100.0%" in r for r in rows[2:]), result.stdout


def test_first_use_picks_the_pins_and_the_second_run_reuses_them(tmp_path: Path, own_cache: Path) -> None:
    from kern_run.pins_cache import device_stamp, pins_cache_path

    device, version = device_stamp(0)
    cached = pins_cache_path(device, version)
    assert cached.parent.parent == own_cache and not cached.exists()
    ckpt = _checkpoint(tmp_path / "qwen3-1.7b", SHAPES["qwen3-1.7b"])
    args = ["run", "--weights", str(ckpt), "--steps", "16", "--ignore-eos", "--prompt", "The capital of France is"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.stderr
    (manifest,) = sorted((own_cache / "manifests").iterdir())
    assert first.stderr.splitlines()[:2] == [
        f"kern run: picking batch-invariant cuBLASLt pins for 4 GEMM shapes (2048x2048, 2048x6144, 4096x2048, "
        f"12288x2048) on {device} (cuBLASLt {version}), first use: cached in {cached}",
        f"kern run: built manifest {manifest} (from {ckpt / 'config.json'}, pins {cached})"]
    doc = json.loads(cached.read_text())
    assert doc["m_max"] == 2048 and [(p["n"], p["k"]) for p in doc["pins"]] == [
        (2048, 2048), (2048, 6144), (4096, 2048), (12288, 2048)]
    assert all(p["algo"]["split_k"] <= 1 and p["algo"].get("reduction", 0) == 0 for p in doc["pins"])
    assert json.loads(manifest.read_text())["meta"]["caller"]["prefill_batch_invariant"] is True
    text = cached.read_text()
    second = CliRunner().invoke(app, args)
    assert second.exit_code == 0, second.stderr
    assert second.stderr.splitlines()[0] == (f"kern run: reused manifest {manifest} (from {ckpt / 'config.json'}, "
                                             f"pins {cached})")
    assert "picking" not in second.stderr and cached.read_text() == text
    assert second.stdout == first.stdout and len(first.stdout) > 0
    # the picked pins make prefill batch-invariant: chunk 1 gives the same tokens as chunk 512
    chunk1 = CliRunner().invoke(app, ["test", "--weights", str(ckpt), "--against", "chunk1", "--prompts", "2",
                                      "--steps", "16"])
    assert chunk1.exit_code == 0, (chunk1.stdout, chunk1.stderr)
    assert chunk1.stderr.splitlines()[0].startswith(f"kern test: reused manifest {manifest} ")
    rows = chunk1.stdout.strip().splitlines()
    assert len(rows) == 2 + 2 and all("100.0%" in r for r in rows[2:]), chunk1.stdout
