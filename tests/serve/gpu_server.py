"""`kern serve` as a subprocess on a free loopback port, for the GPU serve tests (tests/serve/test_serve*_gpu.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kern(*args: str) -> list[str]:
    """The command line of `kern ARGS` in this interpreter."""
    return [sys.executable, "-m", "kern_run", *args]


def start(serve_args: list[str], healthy_within_s: float) -> tuple[subprocess.Popen, str]:
    """Start `kern serve SERVE_ARGS --port P` (stdout and stderr piped together) and wait until GET /health answers
    200. Returns (the process, its base URL). Fails the test, with the server's output, when it exits first or is
    not healthy within `healthy_within_s` seconds (then it is killed)."""
    import httpx  # here, not at the top: a machine without it fails these tests, not the whole collection

    port = free_port()
    proc = subprocess.Popen(kern("serve", *serve_args, "--port", str(port)), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + healthy_within_s
    while True:
        if proc.poll() is not None:
            pytest.fail(f"kern serve exited {proc.returncode}:\n{proc.stdout.read()}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"kern serve not healthy after {healthy_within_s:.0f} s:\n{proc.stdout.read()}")
        time.sleep(0.5)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (the server drains), then kill after 60 s."""
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
