"""`kern run --weights DIR` on the GPU with a made Llama checkpoint (the real kernels): head_dim 64 tied and head_dim
128 untied, each builds its manifest (llama3 rope table, no q/k norm), generates, and the eager decode gives the same
text; and the made Llama-3.2-1B shape loads and generates from its published config.

Run on the H200:  KERN_REQUIRE_GPU=1 python3 -m pytest tests/run/test_llama_checkpoint_gpu.py -q
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kern_run.cli import app
from kern_run.models.qwen3 import SHAPES, LlamaShape
from test_any_checkpoint_gpu import _checkpoint  # a made checkpoint with the byte-level tokenizer, eos id 256

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def own_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "kern"


@pytest.mark.parametrize("shape", [
    LlamaShape(256, 2, 4, 2, 64, 512, vocab_size=512),  # head_dim 64, tied (as 3.2-1B)
    LlamaShape(384, 2, 3, 1, 128, 512, vocab_size=512, tie_word_embeddings=False, rope_factor=8.0),  # group 3
], ids=["d64-tied", "d128-untied"])
def test_weights_alone_builds_and_generates(shape: LlamaShape, tmp_path: Path, own_cache: Path) -> None:
    ckpt = _checkpoint(tmp_path / "llama", shape)
    args = ["run", "--weights", str(ckpt), "--no-pins", "--steps", "12", "--ignore-eos", "--prompt", "Hello"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.stderr
    (built,) = sorted((own_cache / "manifests").iterdir())
    assert json.loads(built.read_text())["meta"]["family"] == "llama"
    assert len(first.stdout) > 0
    eager = CliRunner().invoke(app, [*args, "--eager"])
    assert eager.exit_code == 0, eager.stderr
    assert eager.stdout == first.stdout


def test_the_llama_3_2_1b_shape_loads_and_generates(tmp_path: Path, own_cache: Path) -> None:
    ckpt = _checkpoint(tmp_path / "llama3.2-1b", SHAPES["llama3.2-1b"])
    result = CliRunner().invoke(app, ["run", "--weights", str(ckpt), "--no-pins", "--steps", "16", "--ignore-eos",
                                      "--prompt", "The capital of France is"])
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines()[0].startswith("kern run: built manifest ")
    # the made tokenizer knows 257 ids of the 128256: most sampled ids decode to no text, so the count is the check
    assert re.search(r"\b16 tokens generated\b", result.stderr), result.stderr
