"""`kern serve` on the CPU: its flag refusals (one line, before anything loads) and the whole wiring of
serve.server.build over a fake runtime with the pool API, answered through httpx."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")  # the dev group has it; the GPU machines may not (their -m gpu run collects this)
pytest.importorskip("fastapi")
from fake_pool_runtime import FakePoolRuntime
from fake_serve_runtime import ServedFakeRuntime
from kern_run_testutil import patch_generator_open
from typer.testing import CliRunner

from kern_run.cli import app
from kern_run.config import RunConfig
from kern_run.log import setup_logging
from kern_run.sampling import SamplingParams, pack_params
from kern_run.serve.server import ServeOptions, build
from kern_run.text import load_codec


@pytest.fixture
def served_runtime(monkeypatch: pytest.MonkeyPatch) -> list[ServedFakeRuntime]:
    return patch_generator_open(monkeypatch, ServedFakeRuntime)


@pytest.mark.parametrize("flags, needle", [
    (["--max-seqs", "0"], "--max-seqs 0: expected 1..1024 (the manifest's seqs var max caps it further)"),
    (["--port", "70000"], "--port 70000: expected 0..65535"),
    (["--max-queue", "0"], "--max-queue 0: expected >= 1"),
    (["--host-gib", "-1"], "--host-gib -1.0: expected 0..4096 GiB"),
    (["--api-key", ""], "--api-key '': an empty key"),
    (["--token-budget", "3"], "--token-budget: scheduler token_budget 3: expected an int >= chunk_tokens + max_seqs"),
])
def test_flag_refusals_are_one_line(with_device, served_runtime, tiny_manifest: Path, kernels_dir: Path,
                                    tiny_ckpt: Path, flags: list[str], needle: str) -> None:
    result = CliRunner().invoke(app, ["serve", "--manifest", str(tiny_manifest), "--kernels", str(kernels_dir),
                                      "--weights", str(tiny_ckpt), *flags])
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1, (result.exit_code, result.stderr)
    assert lines[0].startswith("kern serve: ") and needle in lines[0], lines[0]
    assert served_runtime == []  # refused before loading


@pytest.mark.parametrize("flags, line", [
    (["--host-gib", "nan"], "--host-gib nan: expected 0..4096 GiB"),
    (["--host-gib", "inf"], "--host-gib inf: expected 0..4096 GiB"),
    (["--host-gib", "1e30"], "--host-gib 1e+30: expected 0..4096 GiB"),
    (["--drain-timeout", "nan"], "--drain-timeout nan: expected 0..86400 seconds"),
    (["--drain-timeout", "inf"], "--drain-timeout inf: expected 0..86400 seconds"),
    (["--token-budget", "0"], "--token-budget 0: expected >= 1 (and at least chunk + max-seqs)"),
    (["--max-seqs", "2000"], "--max-seqs 2000: expected 1..1024 (the manifest's seqs var max caps it further)"),
])
def test_flag_refusals_come_before_any_device_probe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     flags: list[str], line: str) -> None:
    """NaN / infinite / huge --host-gib and --drain-timeout, and --token-budget 0, were accepted; --max-seqs out of
    range is refused before the device probe too."""
    from kern_run import session
    from kern_run.errors import NoDeviceError

    def probe(*_: object, **__: object) -> None:
        raise NoDeviceError("no CUDA device (the probe ran)")

    monkeypatch.setattr(session, "prepare", probe)
    result = CliRunner().invoke(app, ["serve", "--manifest", str(tmp_path / "m.json"), "--kernels", str(tmp_path),
                                      "--weights", str(tmp_path), *flags])
    assert (result.exit_code, result.stderr) == (2, f"kern serve: {line}\n")


def test_build_serves_the_target(with_device, served_runtime, tiny_manifest: Path, kernels_dir: Path,
                                 tiny_ckpt: Path) -> None:
    cfg = RunConfig(manifest=tiny_manifest, kernels=kernels_dir, weights=tiny_ckpt, capacity_tokens=2048, chunk=16,
                    capacity_from="--capacity")  # above the context: requests share the pool
    web, loop = build(cfg, ServeOptions(api_key="k", model_name="tiny"), setup_logging("error"))
    codec = load_codec(tiny_ckpt)
    prompt = "Hello, kern serve"
    ids = codec.encode(prompt)
    want = FakePoolRuntime.expected(ids, 7)
    try:
        async def go():
            transport = httpx.ASGITransport(app=web)
            async with httpx.AsyncClient(transport=transport, base_url="http://kern",
                                         headers={"authorization": "Bearer k"}) as client:
                one = await client.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 7,
                                                                 "ignore_eos": True})
                two = await client.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 7,
                                                                 "ignore_eos": True, "stream": True})
                sampled = await client.post("/v1/completions", json={"model": "tiny", "prompt": prompt,
                                                                     "temperature": 0.8, "seed": 9, "max_tokens": 2})
                models = await client.get("/v1/models")
                metrics = await client.get("/metrics")
                return one, two, sampled, models, metrics

        one, two, sampled, models, metrics = asyncio.run(go())
        assert one.status_code == 200, one.text
        assert one.json()["choices"][0]["text"] == codec.decode(want)
        assert one.json()["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 7,
                                       "total_tokens": len(ids) + 7}
        assert two.text.endswith("data: [DONE]\n\n")
        assert sampled.status_code == 200, sampled.text  # the tiny manifest has the GPU sampler
        params = served_runtime[0].sampler_inputs["sample_params"]  # what the engine packed for the request
        assert params.tobytes() == pack_params([SamplingParams(temperature=0.8, seed=9)])
        assert loop.engine.max_seqs == 1 and served_runtime[0].warm_steps == 1  # seqs max 1: one bucket warmed
        assert models.json()["data"][0]["max_model_len"] == 1024
        assert loop.scheduler.stats.reused_tokens == 2 * ((len(ids) - 1) // 16 * 16)  # the 2nd and 3rd reused it
        held = served_runtime[0].kern_pool.held_pages  # the cached prefix, read through RuntimeMemory
        assert held == -(-(len(ids) - 1) // 16) and f"kern_kv_pages_in_use {float(held)}" in metrics.text
    finally:
        loop.stop()
    assert not served_runtime[0].closed  # closed by the app's shutdown (lifespan), not by build


def test_an_argmax_manifest_serves_greedy_only(with_device, served_runtime, kernels_dir: Path, tiny_ckpt: Path,
                                               tmp_path: Path) -> None:
    from kern_run.models import qwen3
    from tools import make_checkpoint

    cfg_json = make_checkpoint.config_json(make_checkpoint.SHAPES["tiny"])
    cfg_json["tie_word_embeddings"] = True
    manifest = qwen3.build_manifest(qwen3.Qwen3Config.from_json(cfg_json), qwen3.read_kernel_abi(kernels_dir),
                                    qwen3.BuildOptions("tiny-argmax", 64, 1024, sampler="argmax"))
    path = tmp_path / "argmax.json"
    path.write_text(qwen3.dumps(manifest))
    cfg = RunConfig(manifest=path, kernels=kernels_dir, weights=tiny_ckpt, capacity_tokens=2048, chunk=16,
                    capacity_from="--capacity")
    web, loop = build(cfg, ServeOptions(model_name="tiny"), setup_logging("error"))
    try:
        async def go():
            transport = httpx.ASGITransport(app=web)
            async with httpx.AsyncClient(transport=transport, base_url="http://kern") as client:
                sampled = await client.post("/v1/completions", json={"model": "tiny", "prompt": "x",
                                                                     "temperature": 0.8})
                lps = await client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "logprobs": 1})
                greedy = await client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
                return sampled, lps, greedy

        sampled, lps, greedy = asyncio.run(go())
        assert sampled.status_code == 400 and sampled.json()["error"]["param"] == "temperature"
        assert "meta.caller.sampling" in sampled.json()["error"]["message"]
        assert lps.status_code == 400 and lps.json()["error"]["code"] == "unsupported_sampling"
        assert greedy.status_code == 200 and not loop.engine.samples
    finally:
        loop.stop()
