"""Values that reach the real device probe (issue 29, bounded work): `--gpu` past the visible devices is one line
naming the ordinal and the device count, exit 3, for `kern run` and `kern test`, with the real driver. Nothing is
loaded: the tiny test manifest, stub kernels and checkpoint pass every host-side check, then the probe refuses.

Run on the H200:  KERN_REQUIRE_GPU=1 python3 -m pytest tests/run/test_cli_bounds_gpu.py -q
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kern_run.cli import app

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def no_repo_targets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty-kern.toml"
    empty.write_text("")
    monkeypatch.setenv("KERN_TOML", str(empty))


@pytest.mark.parametrize("command", ["run", "test"])
@pytest.mark.parametrize("gpu", [99, 2**70])
def test_a_gpu_past_the_devices_is_one_line(tiny_manifest: Path, kernels_dir: Path, tiny_ckpt: Path, command: str,
                                            gpu: int) -> None:
    result = CliRunner().invoke(app, [command, "--manifest", str(tiny_manifest), "--kernels", str(kernels_dir),
                                      "--weights", str(tiny_ckpt), "--gpu", str(gpu)])
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert (result.exit_code, len(lines)) == (3, 1), (result.exit_code, result.stderr)
    assert re.fullmatch(rf"kern {command}: --gpu {gpu} but (\d+) CUDA device\(s\) are visible: pass --gpu 0\.\.\d+",
                        lines[0]), lines[0]
