"""`kern serve --weights` on a made Qwen3-4B-shaped checkpoint, driven by the real `openai` client (issue 27's
GPU test at the 4B shape; tests/serve/test_serve_batch_gpu.py is the tiny-en one).

The server builds its manifest from the checkpoint's config.json as a user's first `kern serve --weights DIR`
does: 64 decode rows, batch-invariant, the cuBLASLt pins picked on this GPU on first use (docs/serve.md "Which
manifest"). The weights are random (tools/make_checkpoint.py, seed 0) with the real Qwen tokenizer, so the text
is noise; what is checked is identity, token for token, with EOS ignored:

- a completion non-streaming equals the same completion streaming;
- 64 concurrent greedy completions each equal the same request run alone (one at a time, so at bucket 1);
- a seeded sampled completion gives the same text alone and among 63 other requests.

Run on the H200:  source tools/gpu-env.sh && KERN_REQUIRE_GPU=1 python3 -m pytest -q tests/serve/test_serve_4b_gpu.py
(the checkpoint is made under $KERN_WEIGHTS, default /tmp/kern-weights, when missing: about 8 GB, seconds).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serve.gpu_server import clients, gather, prompts, start, stop

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
MODEL = "qwen3-4b-shape"
TOKENS = 24


@pytest.fixture(scope="module")
def server():
    ckpt = Path(os.environ.get("KERN_WEIGHTS", "/tmp/kern-weights")) / "qwen3-4b"
    subprocess.run([sys.executable, str(REPO / "tools" / "make_checkpoint.py"), "--shape", "qwen3-4b", "--out",
                    str(ckpt)], check=True, timeout=600)
    # a first run builds the manifest and picks the pins on this GPU: up to 600 s
    proc, base = start(["--weights", str(ckpt), "--max-seqs", "64", "--capacity", "65536", "--chunk", "512",
                        "--model-name", MODEL, "--drain-timeout", "10"], 600)
    yield base
    stop(proc)


@pytest.fixture(scope="module")
def both(server: str):
    return clients(server, 300, 600)


@pytest.fixture(scope="module")
def client(both):
    return both[0]


@pytest.fixture(scope="module")
def aclient(both):
    return both[1]


def test_streaming_equals_non_streaming(client) -> None:
    body = {"prompt": "The capital of France is", "max_tokens": TOKENS, "extra_body": {"ignore_eos": True}}
    whole = client.completions.create(model=MODEL, **body)
    assert whole.usage.completion_tokens == TOKENS and whole.usage.prompt_tokens > 0
    chunks = list(client.completions.create(model=MODEL, stream=True, **body))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_64_concurrent_greedy_requests_each_equal_the_request_alone(client, aclient) -> None:
    bodies = [{"prompt": p, "max_tokens": TOKENS + (i % 3) * 4, "extra_body": {"ignore_eos": True}}
              for i, p in enumerate(prompts())]
    alone = [client.completions.create(model=MODEL, **b).choices[0].text for b in bodies]
    together = [r.choices[0].text for r in gather(aclient, bodies, MODEL)]
    mismatched = [i for i in range(64) if together[i] != alone[i]]
    assert not mismatched, f"{len(mismatched)} of 64 differ, e.g. #{mismatched[0]}: {together[mismatched[0]]!r} " \
                           f"vs alone {alone[mismatched[0]]!r}"


def test_a_seeded_sampled_request_gives_the_same_text_alone_and_under_load(client, aclient) -> None:
    seeded = {"prompt": "The little dog", "max_tokens": TOKENS, "temperature": 0.8, "top_p": 0.95, "seed": 1234,
              "extra_body": {"top_k": 50, "repetition_penalty": 1.2, "ignore_eos": True}}
    alone = client.completions.create(model=MODEL, **seeded).choices[0].text
    others = [{"prompt": p, "max_tokens": TOKENS, **({"temperature": 1.0, "seed": i} if i % 2 else {}),
               "extra_body": {"ignore_eos": True}} for i, p in enumerate(prompts()[:63])]
    results = gather(aclient, others[:31] + [seeded] + others[31:], MODEL)
    assert results[31].choices[0].text == alone

