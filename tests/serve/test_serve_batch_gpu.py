"""`kern serve` with batched decode and GPU sampling on the tiny-en model, driven by the real `openai` client.

The server runs `--target tiny-en` on a loopback port with `--max-seqs 64`, so it serves the target's
serve_manifest, the committed batch-invariant manifests/qwen3-tiny-en-inv.json (the same decode launches at every
bucket: docs/serve.md "Which manifest"). Checks:

- a completion, non-streaming and streaming, equals `kern run` of the same prompt on the same manifest;
- 64 concurrent greedy completions each equal the same request run alone (one at a time through the server,
  so at bucket 1), bit for bit, and the decode steps really carried more than 32 rows (`kern_decode_rows`);
- a seeded sampled completion (temperature, top-p, top-k, repetition penalty) gives the same text alone and
  among 63 other requests with other parameters and seeds;
- logprobs: the chosen token's logprob is the best of its top logprobs under greedy decoding.

The `openai` package and its dependencies come to the GPU machine as wheels (.whl, tools/gpu-env.sh); without
them these tests fail (they skip only where there is no GPU).

Run on the H200:  source tools/gpu-env.sh && KERN_REQUIRE_GPU=1 python3 -m pytest -q tests/serve/test_serve_batch_gpu.py
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.serve.gpu_server import clients, gather, kern, prompts, start, stop

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny-en-b64"


@pytest.fixture(scope="module")
def manifest64() -> Path:
    """What `kern serve --target tiny-en` serves (kern.toml serve_manifest): tiny-en's batch-invariant manifest."""
    from kern_run.config import load_targets
    from kern_run.preflight import read_manifest

    path = load_targets(REPO / "kern.toml")[1]["tiny-en"]["serve_manifest"]
    assert path == REPO / "manifests" / "qwen3-tiny-en-inv.json"
    facts = read_manifest(path)
    assert facts.decode_batch_invariant and facts.manifest.vars["seqs"].max == 64
    return path


@pytest.fixture(scope="module")
def server(manifest64: Path):
    proc, base = start(["--target", "tiny-en", "--max-seqs", "64", "--capacity", "65536", "--chunk", "512",
                        "--model-name", MODEL, "--drain-timeout", "10"], 240)
    yield base
    stop(proc)


@pytest.fixture(scope="module")
def both(server: str):
    return clients(server, 120, 300)


@pytest.fixture(scope="module")
def client(both):
    return both[0]


@pytest.fixture(scope="module")
def aclient(both):
    return both[1]


def test_completion_streaming_and_not_equal_kern_run(client, manifest64: Path) -> None:
    prompt, steps = "Once upon a time", 24
    out = subprocess.run(kern("run", "--manifest", str(manifest64), "--kernels", str(REPO / "kernels"), "--weights",
                               str(REPO / "models" / "qwen3-tiny-en"), "--prompt", prompt, "--steps", str(steps), "--greedy"),
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    alone = out.stdout[:-1] if out.stdout.endswith("\n") else out.stdout
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=steps)
    assert whole.choices[0].text == alone
    assert whole.usage.prompt_tokens > 0 and whole.usage.completion_tokens <= steps
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=steps, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == alone
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_64_concurrent_greedy_requests_each_equal_the_request_alone(client, aclient, server: str) -> None:
    import httpx

    bodies = [{"prompt": p, "max_tokens": 32 + (i % 5) * 8} for i, p in enumerate(prompts())]
    alone = [client.completions.create(model=MODEL, **b).choices[0].text for b in bodies]  # one at a time
    before = httpx.get(f"{server}/metrics").text
    together = [r.choices[0].text for r in gather(aclient, bodies, MODEL)]
    after = httpx.get(f"{server}/metrics").text
    mismatched = [i for i in range(64) if together[i] != alone[i]]
    assert not mismatched, f"{len(mismatched)} of 64 differ, e.g. #{mismatched[0]}: {together[mismatched[0]]!r} " \
                           f"vs alone {alone[mismatched[0]]!r}"

    def wide_steps(text: str) -> float:  # decode steps that carried more than 32 rows
        count = float(re.search(r"^kern_decode_rows_count (\S+)$", text, re.M).group(1))
        le32 = float(re.search(r'^kern_decode_rows_bucket\{le="32.0"\} (\S+)$', text, re.M).group(1))
        return count - le32

    assert wide_steps(after) - wide_steps(before) > 0, "no decode step carried more than 32 rows"


def test_a_seeded_sampled_request_gives_the_same_text_alone_and_under_load(client, aclient) -> None:
    seeded = {"prompt": "The little dog", "max_tokens": 40, "temperature": 0.8, "top_p": 0.95,
              "extra_body": {"top_k": 50, "repetition_penalty": 1.2}, "seed": 1234}
    alone = client.completions.create(model=MODEL, **seeded).choices[0].text
    greedy = client.completions.create(model=MODEL, prompt="The little dog", max_tokens=40).choices[0].text
    assert alone != greedy, "sampling at temperature 0.8 gave the greedy text"
    others = [{"prompt": p, "max_tokens": 48, **({"temperature": 1.0, "seed": i} if i % 2 else {})}
              for i, p in enumerate(prompts()[:63])]
    results = gather(aclient, others[:31] + [seeded] + others[31:], MODEL)
    assert results[31].choices[0].text == alone


def test_greedy_logprobs_pick_the_best_token(client) -> None:
    resp = client.completions.create(model=MODEL, prompt="The cat sat", max_tokens=8, logprobs=5,
                                     extra_body={"ignore_eos": True})
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == resp.usage.completion_tokens
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0 and 1 <= len(top) <= 5
        assert chosen == pytest.approx(max(top.values()), abs=1e-6)


def test_one_request_runs_the_pipelined_decode(client, server: str) -> None:
    """At concurrency 1 nearly every step is enqueued before the last one is read (docs/serve.md "Pipelined
    decode"): 47 of the 48 steps of a 48-token completion answer from a step enqueued ahead."""
    import httpx

    def used(text: str) -> float:
        m = re.search(r'^kern_decode_ahead_total\{outcome="used"\} (\S+)$', text, re.M)
        return float(m.group(1)) if m else 0.0

    before = used(httpx.get(f"{server}/metrics").text)
    resp = client.completions.create(model=MODEL, prompt="The old man", max_tokens=48,
                                     extra_body={"ignore_eos": True})
    assert resp.usage.completion_tokens == 48
    assert used(httpx.get(f"{server}/metrics").text) - before == 47
