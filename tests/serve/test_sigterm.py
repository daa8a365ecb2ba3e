"""SIGTERM on real uvicorn over a loopback port (the fake engine, no GPU): the request in flight finishes, new
connections are refused, and the process ends within the drain timeout by the signal itself (uvicorn re-raises a
captured SIGTERM after its graceful shutdown, so the exit status is -15 / 143, as for any process SIGTERM ends)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sigterm_drains_the_request_in_flight_then_ends_the_process() -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, str(HERE / "fake_server.py"), str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the fake server did not come up"
            time.sleep(0.1)
        got = {}

        def slow() -> None:  # 80 steps of 10 ms
            got["resp"] = httpx.post(f"{base}/v1/completions", timeout=30, json={
                "model": "tiny", "prompt": "drain", "max_tokens": 80, "ignore_eos": True})

        worker = threading.Thread(target=slow)
        worker.start()
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        worker.join(30)
        assert got["resp"].status_code == 200 and got["resp"].json()["usage"]["completion_tokens"] == 80
        assert proc.wait(15) == -signal.SIGTERM
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{base}/health", timeout=1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
