"""`kern-manifest check M | head -1`: each kern command line exits quietly when its reader closes the pipe, with
exit 1 (as click exits on a closed pipe) and nothing on stderr, instead of a BrokenPipeError traceback. A real subprocess whose
stdout pipe is closed before it writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = str(ROOT / "manifests" / "qwen3-tiny.json")
TRACE = str(ROOT / "tests" / "pool" / "data" / "tiny.jsonl")


COMMANDS = [
    ["-m", "kern_manifest.cli", "check", MANIFEST],
    ["-m", "kern_pool.cli", "simulate", TRACE],
    ["-m", "kern_pool.cli", "simulate", TRACE, "--sweep", "--json"],
    ["-m", "kern_run.cli", "inspect", MANIFEST],
    ["-m", "kern_run.cli", "manifest", "check", MANIFEST],
    ["-m", "kern_run.cli", "--version"],
]
IDS = ["kern-manifest check", "kern-pool simulate", "kern-pool sweep", "kern inspect", "kern manifest check",
       "kern --version"]


@pytest.mark.parametrize("argv", COMMANDS, ids=IDS)
def test_a_closed_stdout_ends_the_command_quietly(argv: list[str]) -> None:
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    proc.stdout.close()  # the reader goes away before the command writes a byte (`| head -0`)
    err = proc.stderr.read().decode()
    assert (proc.wait(timeout=120), err) == (1, "")


@pytest.mark.parametrize("argv", COMMANDS, ids=IDS)
def test_a_closed_stdout_descriptor_ends_the_command_quietly(argv: list[str]) -> None:
    """`kern-manifest check M >&-`: fd 1 closed, so Python starts with sys.stdout None; the first print or the
    final flush was an AttributeError traceback ('NoneType' object has no attribute 'flush')."""
    proc = subprocess.Popen(["sh", "-c", 'exec "$0" "$@" >&-', sys.executable, *argv], stderr=subprocess.PIPE,
                            cwd=ROOT)
    err = proc.stderr.read().decode()
    assert (proc.wait(timeout=120), err) == (1, "")


def test_a_closed_stderr_descriptor_ends_a_refusal_quietly() -> None:
    """`kern-manifest check MISSING 2>&-`: the refusal line has nowhere to go; exit 1 without a traceback on
    stdout."""
    proc = subprocess.run(["sh", "-c", 'exec "$0" "$@" 2>&-', sys.executable, "-m", "kern_manifest.cli", "check",
                           "/nonexistent/m.json"], stdout=subprocess.PIPE, cwd=ROOT, timeout=120, check=False)
    assert (proc.returncode, proc.stdout) == (1, b"")


def test_an_open_stdout_is_unchanged() -> None:
    done = subprocess.run([sys.executable, "-m", "kern_manifest.cli", "check", MANIFEST], capture_output=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stderr == b""
    assert done.stdout.decode().splitlines()[0].startswith("qwen3-tiny  (kern-manifest/1, digest ")
