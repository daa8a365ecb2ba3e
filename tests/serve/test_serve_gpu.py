"""`kern serve` on the default tiny-en target on a loopback port: one non-streaming and one streaming completion
with httpx, each equal to `kern run` of the same prompt (greedy), then SIGTERM ends the server (after its drain, by the signal: status -15).

Run on the H200:  KERN_REQUIRE_GPU=1 uv run --frozen pytest -q -p no:cacheprovider tests/serve/test_serve_gpu.py
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
PROMPT = "Once upon a time"
STEPS = 24


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kern(*args: str) -> list[str]:
    return [sys.executable, "-m", "kern_run", *args]


@pytest.fixture(scope="module")
def server():
    import httpx  # here, not at the top: a machine without it fails these tests, not the whole collection

    port = _free_port()
    proc = subprocess.Popen(_kern("serve", "--target", "tiny-en", "--port", str(port), "--drain-timeout", "10"),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        if proc.poll() is not None:
            pytest.fail(f"kern serve exited {proc.returncode}:\n{proc.stdout.read()}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"kern serve not healthy after 180 s:\n{proc.stdout.read()}")
        time.sleep(0.5)
    yield base, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


@pytest.fixture(scope="module")
def alone() -> str:
    out = subprocess.run(_kern("run", "--target", "tiny-en", "--prompt", PROMPT, "--steps", str(STEPS)), cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.endswith("\n")
    return out.stdout[:-1]


def test_non_streaming_equals_kern_run(server, alone) -> None:
    import httpx

    base, _ = server
    resp = httpx.post(f"{base}/v1/completions", json={"model": "tiny-en", "prompt": PROMPT, "max_tokens": STEPS},
                      timeout=120)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["choices"][0]["text"] == alone
    assert body["usage"]["completion_tokens"] <= STEPS and body["usage"]["prompt_tokens"] > 0


def test_streaming_equals_kern_run(server, alone) -> None:
    import httpx

    base, _ = server
    text = []
    with httpx.stream("POST", f"{base}/v1/completions", timeout=120,
                      json={"model": "tiny-en", "prompt": PROMPT, "max_tokens": STEPS, "stream": True}) as resp:
        assert resp.status_code == 200
        lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        event = json.loads(line[len("data: "):])
        text.extend(c["text"] for c in event["choices"])
    assert "".join(text) == alone


def test_metrics_then_sigterm_ends_the_server(server) -> None:
    import httpx

    base, proc = server
    metrics = httpx.get(f"{base}/metrics", timeout=10).text
    assert "kern_ttft_seconds_count" in metrics and "kern_healthy 1.0" in metrics
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == -signal.SIGTERM  # uvicorn re-raises the signal after its graceful shutdown
