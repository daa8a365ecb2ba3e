"""`kern serve`'s whole wiring (serve.server.build: preflight, load, engine, warm-up, scheduler, app) at 64 rows
over the fake batch runtime: the builder's tiny manifest at --seqs-max 64 with the GPU sampler, the tests' tiny
checkpoint, 64 concurrent requests through httpx, each equal to its request run alone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from fake_batch_runtime import FakeBatchRuntime, expected, manifest_dict, unpack_params
from tests.run.kern_run_testutil import stub_kernels, tiny_ckpt, with_device  # noqa: F401 - fixtures

from kern_run.config import RunConfig
from kern_run.log import setup_logging
from kern_run.sampling import SamplingParams, pack_params
from kern_run.serve.server import ServeOptions, build
from kern_run.text import load_codec


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from kern_run.generate import Generator

    kernels = stub_kernels(tmp_path / "kernels")
    manifest = tmp_path / "tiny-b64.json"
    manifest.write_text(json.dumps(manifest_dict(hist_cap=64, kernels=kernels)))
    made: list[FakeBatchRuntime] = []

    def open_fake(manifest_path, kernels_dir, weights, facts, gpu=0, capacity_tokens=4096, eos_ids=frozenset(),
                  progress=None, resident=None):
        rt = FakeBatchRuntime(facts.manifest, page_tokens=16, num_pages=capacity_tokens // 16)
        made.append(rt)
        return Generator(rt, facts, eos_ids)

    monkeypatch.setattr(Generator, "open", staticmethod(open_fake))
    return manifest, kernels, made


def params_of(sp: SamplingParams) -> tuple:
    return unpack_params(np.frombuffer(pack_params([sp]), dtype=np.uint32))


def test_build_serves_64_rows(with_device, target, tiny_ckpt: Path) -> None:  # noqa: F811
    manifest, kernels, made = target
    cfg = RunConfig(manifest=manifest, kernels=kernels, weights=tiny_ckpt, capacity_tokens=16384, chunk=64,
                    capacity_from="--capacity")
    web, loop = build(cfg, ServeOptions(model_name="tiny"), setup_logging("error"))
    rt = made[0]
    codec = load_codec(tiny_ckpt)
    prompts = [f"request {i}: " + "abc" * (i % 7) for i in range(64)]
    sampled = SamplingParams(temperature=0.9, top_p=0.9, repetition_penalty=1.3, seed=77)
    try:
        assert (loop.engine.max_seqs, loop.scheduler.config.max_seqs, loop.engine.samples) == (64, 64, True)
        assert [i[1]["seqs"] for i in rt.issues if i[0] == "decode"] == [1, 2, 4, 8, 16, 32, 64]  # warmed

        # Hold the submissions until all 64 are in, then hand them over together: the loop thread admits a whole
        # inbox before it schedules, so the rows share steps however the requests happened to arrive.
        held, submit = [], loop.submit

        def hold(sub) -> None:
            held.append(sub)
            if len(held) == len(prompts):
                for s in held:
                    submit(s)

        loop.submit = hold

        async def go():
            transport = httpx.ASGITransport(app=web)
            async with httpx.AsyncClient(transport=transport, base_url="http://kern", timeout=60) as client:
                bodies = [{"model": "tiny", "prompt": p, "max_tokens": 12, "ignore_eos": True} for p in prompts]
                bodies[5] = {**bodies[5], "temperature": 0.9, "top_p": 0.9, "repetition_penalty": 1.3, "seed": 77}
                return await asyncio.gather(*(client.post("/v1/completions", json=b) for b in bodies))

        responses = asyncio.run(go())
        for i, resp in enumerate(responses):
            assert resp.status_code == 200, resp.text
            sp = sampled if i == 5 else SamplingParams()
            want = expected(codec.encode(prompts[i]), 12, params_of(sp), cap=64 if sp.penalizes else None)
            assert resp.json()["choices"][0]["text"] == codec.decode([t for t, _ in want]), i
        assert max(loop.engine.buckets) == 64  # all 64 rows shared a decode step
    finally:
        loop.stop()
