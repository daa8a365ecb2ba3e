"""kern_run.harvest.replay and bench/decode.py's "kern (harvested inductor kernels)" worker over the fake driver:
the prompt is fed a token a step, each greedy token is fed back, outputs come back per step."""

from __future__ import annotations

import argparse
import ctypes
import json
from pathlib import Path

import numpy as np
import pytest

from kern_run.harvest.capture_format import write_capture
from kern_run.harvest.generate import generate
from tests.harvest.harvest_testkit import synthetic_capture
from tests.harvest.test_generate import _checkpoint
from tests.runtime.fake_cuda import OK, FakeDriver, fake_cuda  # noqa: F401 - the fixture


@pytest.fixture
def harvested(fake_cuda: FakeDriver, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Path, Path, list[int]]:
    """The synthetic capture generated; the fake runs two kernels: the first embed records the token id it reads,
    argmax_final writes that id + 1 as next_token (so a fed-back token is visible)."""
    write_capture(tmp_path / "c", synthetic_capture())
    _, mined = generate(tmp_path / "c", tmp_path / "out", "synthetic")
    fake_cuda.entries = {ml.function: ml.params for ml in mined.launches}
    _checkpoint(tmp_path / "model.safetensors")
    ids: list[int] = []

    def launch(self: FakeDriver, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra) -> tuple:  # type: ignore[no-untyped-def]
        pointers = (ctypes.c_void_p * len(self.entries[f.entry])).from_address(int(params))
        arg = lambda i: ctypes.c_uint64.from_address(pointers[i]).value  # noqa: E731
        if f.entry == "kern_embed_gather" and ctypes.c_int32.from_address(pointers[4]).value == 64:
            ids.append(ctypes.c_int64.from_address(arg(1)).value)
        elif f.entry == "kern_argmax_final":
            ctypes.c_int64.from_address(arg(3)).value = ids[-1] + 1
        return (OK,)

    monkeypatch.setattr(FakeDriver, "_cuLaunchKernel", launch, raising=False)
    return tmp_path / "out", tmp_path / "model.safetensors", ids


def test_greedy_feeds_the_prompt_then_its_tokens(harvested: tuple[Path, Path, list[int]]) -> None:
    from kern_run.harvest.replay import HarvestedStep

    out, ckpt, ids = harvested
    with HarvestedStep(out, ckpt) as step:
        tokens, logits = step.greedy([5, 9], 3, eager=True)
    assert ids == [5, 9, 10, 11]  # the prompt, then each greedy token fed back
    assert tokens == [10, 11, 12]
    assert logits.shape == (4, 64) and logits.dtype == np.float32


def test_step_reads_the_outputs_asked_for(harvested: tuple[Path, Path, list[int]]) -> None:
    from kern_runtime import ApiError

    from kern_run.harvest.replay import HarvestedStep

    out, ckpt, _ = harvested
    with HarvestedStep(out, ckpt) as step:
        both = step.step(np.array([5]), np.array([0]), eager=True)
        one = step.step(np.array([5]), np.array([1]), eager=True, read=("next_token",))
        assert sorted(both) == ["logits", "next_token"] and list(one) == ["next_token"]
        assert one["next_token"].tolist() == both["next_token"].tolist()
        with pytest.raises(ApiError, match="hidden"):
            step.step(np.array([5]), np.array([2]), eager=True, read=("hidden",))


def test_bench_row(harvested: tuple[Path, Path, list[int]], tmp_path: Path) -> None:
    from bench.decode import harvest_worker

    out, ckpt, _ = harvested
    rows = tmp_path / "rows.jsonl"
    harvest_worker(argparse.Namespace(harvest=out, ckpt=ckpt, gpu=0, contexts=[8, 60], steps=4), str(rows))
    got = [json.loads(line) for line in rows.read_text().splitlines()]
    assert [(r["peer"], r["ctx"], "ms_per_token" in r, r.get("skipped")) for r in got] == [
        ("kern (harvested inductor kernels)", 8, True, None),
        ("kern (harvested inductor kernels)", 60, False, "captured context 64")]
    assert got[0]["steps"] == 4


def test_feed_greedy_order_and_refusals() -> None:
    from kern_run.harvest.greedy import feed_greedy

    seen = []
    tokens, rows = feed_greedy([3, 4], 2, lambda t, p: (seen.append((t, p)) or t * 10, p))
    assert seen == [(3, 0), (4, 1), (40, 2)] and tokens == [40, 400] and rows == [0, 1, 2]
    with pytest.raises(ValueError, match="need at least one of each"):
        feed_greedy([], 1, lambda t, p: (t, p))


@pytest.mark.parametrize("peer", ["kern-harvest", "torch-harvest", "kern,torch-harvest"])
def test_a_harvest_peer_without_a_harvest_is_refused_at_once(peer: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from bench.decode import main

    with pytest.raises(SystemExit) as exit_:
        main(["--only", peer, "--ckpt", str(tmp_path)])
    assert exit_.value.code == 2 and "needs --harvest DIR" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--only", peer, "--ckpt", str(tmp_path), "--harvest", str(tmp_path / "none")])
