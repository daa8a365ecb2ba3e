"""`kern serve` as a subprocess on a free loopback port, and the openai client against it, for the GPU serve tests
(tests/serve/test_serve*_gpu.py)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OPENINGS = ["Once upon a time", "The little dog", "In the morning, the", "She opened the door and",
            "The king said that", "A long way from home,", "The children played", "When the rain stopped,",
            "The old man", "On the table there was", "He looked at the sky", "The best way to",
            "My favourite food is", "The teacher asked", "Every summer we", "The cat sat"]


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


def openai_module():
    """The `openai` package, or a test failure saying how to bring it (it comes to the GPU machine as wheels)."""
    try:
        import openai
    except ImportError as exc:
        pytest.fail(f"the openai client is missing ({exc}): carry its wheels to the GPU machine (.whl: openai, "
                    "jiter, distro, sniffio; see docs/serve.md 'GPU tests')")
    return openai


def clients(base: str, timeout_s: float, async_timeout_s: float) -> tuple:
    """(an OpenAI client of `base`, a factory of AsyncOpenAI clients): each asyncio.run() has its own event loop,
    and an AsyncOpenAI's connection pool is bound to the loop it first ran on (a second loop reusing it fails with
    "Event loop is closed")."""
    openai = openai_module()
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=timeout_s, max_retries=0)
    return client, lambda: openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", timeout=async_timeout_s,
                                              max_retries=0)


def prompts() -> list[str]:
    """64 distinct short English prompts."""
    return [f"{OPENINGS[i % 16]}{'' if i < 16 else ' ' + ['and then', 'but', 'so that'][i // 16 - 1]}"
            for i in range(64)]


def gather(aclient, bodies: list[dict], model: str) -> list:
    """The completions of `bodies`, all sent at once from one async client of the factory `aclient`."""
    async def go():
        async with aclient() as c:
            return await asyncio.gather(*(c.completions.create(model=model, **b) for b in bodies))
    return asyncio.run(go())
