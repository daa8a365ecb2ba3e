"""`kern harvest mine | generate | capture` through the CLI: the report on stdout, refusals as one line (after the
whole report for an unexplained capture), nothing written on a refusal."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kern_run.cli import app
from kern_run.harvest.capture_format import write_capture
from tests.harvest.harvest_testkit import synthetic_capture, u64, with_param


def kern(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, list(args))


def test_mine_prints_the_report(tmp_path: Path) -> None:
    write_capture(tmp_path / "c", synthetic_capture())
    result = kern("harvest", "mine", str(tmp_path / "c"))
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "runs at tokens = 1, 2; 5 launches each, 4 kernels in 3 cubins"
    assert "input token_ids shape = [tokens]" in lines


def test_generate_then_check(tmp_path: Path) -> None:
    write_capture(tmp_path / "c", synthetic_capture())
    result = kern("harvest", "generate", str(tmp_path / "c"), "--out", str(tmp_path / "o"), "--name", "tiny")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith("tiny: 3 module(s), 4 op(s), 5 call(s) in decode (graph), digest ")
    check = kern("manifest", "check", str(tmp_path / "o" / "manifest.json"))
    assert check.exit_code == 0 and check.stdout.startswith("tiny  (kern-manifest/1, digest ")


def test_an_unexplained_capture_is_reported_and_nothing_written(tmp_path: Path) -> None:
    capture = with_param(synthetic_capture(), 0, 0, 1, u64(0x7E00_0000_0000))
    write_capture(tmp_path / "c", with_param(capture, 1, 3, 3, u64(0x7E00_0000_0008)))
    result = kern("harvest", "generate", str(tmp_path / "c"), "--out", str(tmp_path / "o"))
    assert result.exit_code == 1 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[:2] == ["unexplained: run 0 launch 0 param 1: 0x7e0000000000 points into no tensor the capture names "
                         "and no allocation alive at this launch",
                         "unexplained: run 1 launch 3 param 3: 0x7e0000000008 points into no tensor the capture names "
                         "and no allocation alive at this launch"]
    assert lines[2].startswith("kern harvest generate: 2 unexplained: run 0 launch 0 param 1:") and len(lines) == 3
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args", [
    ["harvest", "mine", "/nonexistent/capture"],
    ["harvest", "generate", "/nonexistent/capture", "--out", "/tmp/never-written-by-kern"],
])
def test_a_missing_capture_is_one_line(args: list[str]) -> None:
    result = kern(*args)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "/nonexistent/capture: not a directory" in result.stderr
    assert not Path("/tmp/never-written-by-kern").exists()


def test_capture_refuses_bad_options_before_touching_a_gpu(tmp_path: Path) -> None:
    result = kern("harvest", "capture", "--weights", str(tmp_path), "--out", str(tmp_path / "c"), "--tokens", "1",
                  "--tokens", "1")
    assert result.exit_code == 3 and "give distinct token counts" in result.stderr
    result = kern("harvest", "capture", "--weights", str(tmp_path), "--out", str(tmp_path / "c"))
    assert result.exit_code == 3 and f"--weights {tmp_path}: no config.json" in result.stderr
    result = kern("harvest", "capture", "--weights", str(tmp_path), "--out", str(tmp_path / "c"), "--context", "1",
                  "--tokens", "1", "--tokens", "4")
    assert result.exit_code == 3 and "--context 1: must hold the largest token count (4)" in result.stderr
    result = kern("harvest", "capture", "--weights", str(tmp_path), "--out", str(tmp_path / "c"), "--warmup", "0")
    assert result.exit_code == 3 and "--warmup 0: at least 1" in result.stderr
    result = kern("harvest", "capture", "--weights", str(tmp_path), "--out", str(tmp_path / "c"), "--autotune-tokens",
                  "0")
    assert result.exit_code == 3 and "--autotune-tokens 0: at least 1" in result.stderr
    assert not (tmp_path / "c").exists()
