"""examples/custom_manifest.py and examples/decode_loop.py on a real device, with the shipped cubins
(kern_run.kernels_dir()): the embed + argmax manifest agrees with numpy, and the hand-driven decode loop prints
the text `kern run` prints for the same prompt (tiny-en, greedy, EOS ignored).

Run on the H200:  KERN_REQUIRE_GPU=1 uv run --frozen pytest -q -p no:cacheprovider tests/runtime/test_examples_gpu.py
"""

from __future__ import annotations

import ast
import runpy
from pathlib import Path

import pytest
from kern_run.cli import app
from typer.testing import CliRunner

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
PROMPT = "The capital of France is"


def example_main(name: str):  # type: ignore[no-untyped-def]
    return runpy.run_path(str(ROOT / "examples" / name), run_name="example")["main"]


@pytest.mark.parametrize("tokens", [1, 7, 64])
def test_custom_manifest_matches_numpy_on_the_gpu(tokens: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert example_main("custom_manifest.py")(["--tokens", str(tokens)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "matches numpy"
    assert len(ast.literal_eval(out[1].removeprefix("next_token "))) == tokens


def test_decode_loop_prints_what_kern_run_prints(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    assert example_main("decode_loop.py")(["--prompt", PROMPT, "--steps", "24"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "resumed from the checkpoint (6 tokens): the same 24 tokens"
    text = ast.literal_eval(out[2].removeprefix("text       "))
    monkeypatch.chdir(ROOT)  # kern.toml: the default target is models/qwen3-tiny-en
    result = CliRunner().invoke(app, ["run", "--prompt", PROMPT, "--steps", "24", "--ignore-eos", "--greedy"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == text.strip()
    assert text.strip()  # the tiny model writes English, not nothing
