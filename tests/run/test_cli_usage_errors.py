"""A flag value that does not parse, an unknown option or command, a missing argument: one stderr line naming the
flag and the value, exit 2 (docs/caller.md "Refusals"), not click's multi-line usage box. Help is unchanged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kern_run.cli import app


@pytest.fixture(autouse=True)
def no_repo_targets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty-kern.toml"
    empty.write_text("")
    monkeypatch.setenv("KERN_TOML", str(empty))


def _one_line(args: list[str]) -> str:
    result = CliRunner().invoke(app, args)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1, (result.exit_code, result.stderr)
    assert result.stdout == "" and "Traceback" not in result.stderr
    return lines[0]


@pytest.mark.parametrize("args, line", [
    (["run", "--steps", "abc"], "kern run: --steps: 'abc' is not a valid integer"),
    (["run", "--tp", "1.5"], "kern run: --tp: '1.5' is not a valid integer"),
    (["run", "--gpu", "x"], "kern run: --gpu: 'x' is not a valid integer"),
    (["run", "-n", "many"], "kern run: -n: 'many' is not a valid integer"),
    (["run", "--capacity=lots"], "kern run: --capacity: 'lots' is not a valid integer"),
    (["test", "--margin-tol", "wide"], "kern test: --margin-tol: 'wide' is not a valid number"),
])
def test_bad_flag_value_is_one_line(args: list[str], line: str) -> None:
    assert _one_line(args) == line


@pytest.mark.parametrize("args, needles", [
    (["run", "--bogus"], ("kern run:", "--bogus")),
    (["nope"], ("kern:", "'nope'")),
    (["run", "--steps"], ("kern run:", "--steps", "requires an argument")),
    (["inspect"], ("kern inspect:", "'manifest'")),
    (["manifest", "check"], ("kern manifest check:", "'manifest'")),
    (["run", "--log-level", "bogus"], ("kern run: --log-level 'bogus' is not one of debug, info, warning, error",)),
])
def test_other_usage_errors_are_one_line(args: list[str], needles: tuple[str, ...]) -> None:
    line = _one_line(args)
    for needle in needles:
        assert needle in line, line


def test_help_is_unchanged() -> None:
    for args, needle in ((["--help"], "inspect"), (["run", "--help"], "--steps")):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "Usage" in result.stdout and needle in result.stdout and result.stderr == ""
    bare = CliRunner().invoke(app, [])  # no command: the help, exit 2 (typer's no_args_is_help)
    assert bare.exit_code == 2 and "Usage" in bare.output and "run" in bare.output


def test_module_entry_point_prints_one_line() -> None:
    """`python -m kern_run.cli` (main()) and the `kern` script go through the same group."""
    proc = subprocess.run([sys.executable, "-m", "kern_run.cli", "run", "--steps", "abc"], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == ["kern run: --steps: 'abc' is not a valid integer"], proc.stderr


@pytest.mark.parametrize("args, line", [
    (["--steps", "-5"], "kern run: --steps -5 must be >= 0"),
    (["--tp", "0"], "kern run: --tp 0 must be >= 1"),
    (["--chunk", "0"], "kern run: chunk = 0 must be an integer >= 1"),
    (["--capacity", "-1"], "kern run: capacity = -1 must be an integer >= 1"),
    (["--gpu", "-1"], "kern run: gpu = -1 must be an integer >= 0"),
])
def test_weights_alone_checks_the_flags_before_the_device_probe(args: list[str], line: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`kern run --weights DIR --steps -5` said "no CUDA device": the manifest build (and its device probe for
    the pins) ran before the flag checks."""
    from kern_run import auto_manifest
    from kern_run.errors import NoDeviceError

    def probe(*_: object, **__: object) -> None:
        raise NoDeviceError("no CUDA device (the probe ran)")

    monkeypatch.setattr(auto_manifest, "auto_config", probe)
    (tmp_path / "config.json").write_text("{}")
    assert _one_line(["run", "--weights", str(tmp_path), *args]) == line
