"""`kern run --weights DIR` on the GPU with the real kernels (kern_run.kernels_dir()): a made checkpoint with a GQA
group of 5 and an untied lm_head builds its manifest, generates, and the second run reuses it with the same text;
on an H200 the committed pins serve the tiny shape and `kern test --against chunk1` finds no mismatch (prefill
batch-invariant).

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
