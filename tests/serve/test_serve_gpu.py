"""`kern serve` on the default tiny-en target on a loopback port: one non-streaming and one streaming completion
with httpx, each equal to `kern run` of the same prompt (greedy), then SIGTERM ends the server (after its drain, by the signal: status -15).

Run on the H200:  KERN_REQUIRE_GPU=1 uv run --frozen pytest -q -p no:cacheprovider tests/serve/test_serve_gpu.py
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.serve.gpu_server import kern, start

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
PROMPT = "Once upon a time"
STEPS = 24


@pytest.fixture(scope="module")
def server():
    proc, base = start(["--target", "tiny-en", "--drain-timeout", "10"], 180)
    yield base, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


@pytest.fixture(scope="module")
def alone() -> str:
    out = subprocess.run(kern("run", "--target", "tiny-en", "--greedy", "--prompt", PROMPT, "--steps", str(STEPS)), cwd=REPO,
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
