"""kern_run.harvest.torch_step's two compile scopes (GPU machine, where torch is; the step runs on the CPU here):
eager, scope "layer" and scope "step" give the same logits bit for bit; compiled (inductor's default mode on the
CPU) with the token dimension unbacked, each scope serves 2, 1 and 3 tokens without recompiling (scope "layer": one
graph each for the prelude, the one shared layer and the head), within a few bf16 steps of eager."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kern_run.harvest.torch_step import Qwen3Step  # noqa: E402

pytestmark = pytest.mark.gpu

TINY = Path(__file__).resolve().parents[2] / "models" / "qwen3-tiny-en"
RUNS = ((0, [392, 1493]), (2, [6034]), (3, [294, 7436, 691]))  # (first position, token ids): 2, 1, 3 tokens


def _logits(step: Qwen3Step) -> list:
    return [step.step(step.inputs(len(ids), start=start, ids=ids))["logits"].float() for start, ids in RUNS]


def test_the_scopes_agree_eagerly() -> None:
    whole = _logits(Qwen3Step(TINY, 64, mode=None, device="cpu", scope="step"))
    layered = _logits(Qwen3Step(TINY, 64, mode=None, device="cpu", scope="layer"))
    assert all(torch.equal(a, b) for a, b in zip(whole, layered))


@pytest.mark.parametrize(("scope", "graphs"), [("layer", 3), ("step", 1)])
def test_compiled_unbacked_serves_every_token_count_without_recompiling(scope: str, graphs: int) -> None:
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eager = _logits(Qwen3Step(TINY, 64, mode=None, device="cpu", scope="step"))
    compiled = _logits(Qwen3Step(TINY, 64, mode="default", device="cpu", scope=scope))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
    for a, b in zip(eager, compiled):
        assert a.shape == b.shape
        scale = a.abs().max().item()
        assert (a - b).abs().max().item() <= 2 ** -6 * scale  # a few bf16 roundings apart, not another function
