"""Rough edges of `kern` met by a new user (issue 29): each is one clear line, never a traceback, and says what the
thing is (a directory, a cuBLASLt pins file, weights that were never made) and what to do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kern_run.cli import app


@pytest.fixture(autouse=True)
def no_repo_targets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty-kern.toml"
    empty.write_text("")
    monkeypatch.setenv("KERN_TOML", str(empty))


def _refusal(args: list[str], code: int = 2) -> str:
    result = CliRunner().invoke(app, args)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert (result.exit_code, len(lines)) == (code, 1), (result.exit_code, result.stderr)
    assert "Traceback" not in result.stderr
    return lines[0]


# ---------------------------------------------------------------- help


@pytest.mark.parametrize("args, flags", [
    (["run", "--help"], ("--eager", "--ignore-eos", "--help")),
    (["--help"], ("--version", "--help")),
    (["manifest", "check", "--help"], ("--help",)),
])
def test_a_flag_shows_no_value_type_in_the_help(args: list[str], flags: tuple[str, ...]) -> None:
    """`--eager <bool>` read as if it took a value, and `--eager true` is refused: the help shows none."""
    result = CliRunner().invoke(app, args, terminal_width=120)
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.stdout
    for flag in flags:
        assert re.search(rf"{flag} {{2,}}[A-Za-z]", result.stdout), (flag, result.stdout)
    if args[0] == "run":
        assert re.search(r"--steps +-n +<int> ", result.stdout)  # an option with a value keeps its type
        assert _refusal(["run", "--eager", "true"]) == "kern run: Got unexpected extra argument(s) (true)"


# ---------------------------------------------------------------- a pins file for a manifest

ROOT = Path(__file__).resolve().parents[2]
PINS_FILE = ROOT / "manifests" / "algos" / "h200.json"
PINS_IS = ("is a cuBLASLt algorithm pins file (format 'kern-cublaslt-pins/1'; tools/pick_algos.py writes it, "
           "tools/gen_qwen3.py --algos reads it), not a manifest: pass a manifest (kern-manifest/1, e.g. "
           "manifests/*.json)")


@pytest.mark.parametrize("args, line", [
    (["inspect", str(PINS_FILE)], f"kern inspect: manifest {PINS_FILE} {PINS_IS}"),
    (["run", "--manifest", str(PINS_FILE), "--kernels", str(ROOT), "--weights", str(ROOT)],
     f"kern run: manifest {PINS_FILE} {PINS_IS}"),
])
def test_a_pins_file_given_for_a_manifest_is_named(args: list[str], line: str) -> None:
    assert _refusal(args) == line


def test_kern_manifest_check_names_a_pins_file() -> None:
    result = CliRunner().invoke(app, ["manifest", "check", str(PINS_FILE)])
    assert (result.exit_code, result.stdout, result.stderr) == (1, "", f"{PINS_FILE} {PINS_IS}\n")
