"""The harvest on the H200: capture tiny-en under torch.compile with CUPTI, mine, generate, replay under
Runtime.load, and compare 64 greedy tokens (and every step's logits) with torch.compile's own run of the very kernels
captured. The capture test also lays down tests/data/harvest/tiny-en (the committed capture the CPU test mines)
when it is missing or KERN_HARVEST_UPDATE=1: commit it after a GPU session.

    KERN_REQUIRE_GPU=1 pytest -q tests/harvest/test_harvest_gpu.py               # tiny-en (minutes)
    KERN_REQUIRE_GPU=1 KERN_HARVEST_4B=1 pytest -q tests/harvest/test_harvest_gpu.py -k 4b   # the 4B shape
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kern_manifest import load_manifest
from kern_run.harvest.capture_format import read_capture
from kern_run.harvest.errors import HarvestRefusal
from kern_run.harvest.generate import generate
from kern_run.harvest.mine import mine

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "models" / "qwen3-tiny-en"
COMMITTED = ROOT / "tests" / "data" / "harvest" / "tiny-en"
PROMPT = [392, 1493, 6034, 294, 7436, 691]  # "The capital of France is" in tiny-en's tokenizer (truncated)
STEPS = 64


def _worker(weights: Path, out: Path, context: int, timeout: float) -> dict:
    """Run the worker; its stderr goes to $KERN_HARVEST_LOG when set (kept if the step is killed), else a pipe."""
    log = os.environ.get("KERN_HARVEST_LOG")
    with open(log, "a") if log else open(os.devnull, "w") as sink:
        proc = subprocess.run([sys.executable, "-m", "tests.harvest.harvest_gpu_worker", "--weights", str(weights),
                               "--out", str(out), "--context", str(context), "--steps", str(STEPS),
                               "--prompt", ",".join(map(str, PROMPT))],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=sink if log else subprocess.PIPE, text=True,
                              timeout=timeout, check=False)
    err = Path(log).read_text(errors="replace") if log else proc.stderr
    assert proc.returncode == 0, err[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _harvest(weights: Path, tmp: Path, context: int, timeout: float) -> tuple[Path, dict]:
    info = _worker(weights, tmp, context, timeout)
    try:
        generate(tmp / "capture", tmp / "harvest", weights.name)
    except HarvestRefusal as exc:  # every problem into the log, not the first three
        log = os.environ.get("KERN_HARVEST_LOG")
        if log:
            with open(log, "a") as f:
                f.write("\n".join(["harvest refused:", *exc.report()]) + "\n")
        keep = os.environ.get("KERN_HARVEST_REFUSED")  # the refused capture, to mine again on the CPU
        if keep:
            shutil.rmtree(keep, ignore_errors=True)
            shutil.copytree(tmp / "capture", keep)
        raise
    return tmp, info


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    return _harvest(TINY, tmp_path_factory.mktemp("harvest-tiny"), 128, 1200)


def test_tiny_en_capture_mines_and_generates(tiny: tuple[Path, dict]) -> None:
    root, info = tiny
    capture = read_capture(root / "capture")
    assert [r.tokens for r in capture.runs] == [1, 2]
    assert info["launches"][0] == info["launches"][1] > 6  # one compiled step: the same launches at 1 and 2 tokens
    assert all(l.module is not None for r in capture.runs for l in r.launches)  # cuFuncGetModule paired every one
    mined = mine(capture)
    kinds = {a.kind for ml in mined.launches for a in ml.args if hasattr(a, "kind")}
    assert kinds == {"weight", "state", "input", "output", "workspace"}
    m = load_manifest(root / "harvest" / "manifest.json")
    assert m.programs["decode"].num_calls(m) == info["launches"][0]
    if not COMMITTED.exists() or os.environ.get("KERN_HARVEST_UPDATE") == "1":
        shutil.rmtree(COMMITTED, ignore_errors=True)
        COMMITTED.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(root / "capture", COMMITTED)
    size = sum(p.stat().st_size for p in COMMITTED.rglob("*") if p.is_file())
    assert size < 4 << 20, f"tests/data/harvest/tiny-en is {size} bytes: too large to commit"


def _replay_matches(root: Path, weights: Path) -> None:
    from kern_run.harvest.replay import HarvestedStep

    reference = np.load(root / "reference.npz")
    with HarvestedStep(root / "harvest", weights) as step:
        tokens, logits = step.greedy(PROMPT, STEPS)
    assert tokens == reference["tokens"].tolist()
    want = reference["logits"]
    assert logits.shape == want.shape
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(logits, want, rtol=0, atol=scale / 128)  # bf16 noise at worst (same kernels)


def test_tiny_en_replay_gives_torch_compiles_tokens(tiny: tuple[Path, dict]) -> None:
    _replay_matches(tiny[0], TINY)


def test_tiny_en_graph_and_eager_agree(tiny: tuple[Path, dict]) -> None:
    from kern_run.harvest.replay import HarvestedStep

    with HarvestedStep(tiny[0] / "harvest", TINY) as step:
        graph, _ = step.greedy(PROMPT, 8)
    with HarvestedStep(tiny[0] / "harvest", TINY) as step:
        eager, _ = step.greedy(PROMPT, 8, eager=True)
    assert graph == eager


@pytest.mark.skipif(os.environ.get("KERN_HARVEST_4B") != "1", reason="the 4B capture compiles for minutes: "
                    "KERN_HARVEST_4B=1 runs it")
def test_4b_shape_replay_gives_torch_compiles_tokens(tmp_path: Path) -> None:
    """The 4B shape, captured at 512 cache positions (room for bench/decode.py's ctx 128 + 256 steps). With
    KERN_HARVEST_KEEP=DIR the generated harvest (manifest and kernels) is copied to DIR once the tokens match, for
    `bench/decode.py --only kern-harvest --harvest DIR` (tools/device-session.sh harvest-4b)."""
    ckpt = Path(os.environ.get("KERN_WEIGHTS", "/tmp/kern-weights")) / "qwen3-4b"
    if not (ckpt / "config.json").is_file():
        subprocess.run([sys.executable, str(ROOT / "tools" / "make_checkpoint.py"), "--shape", "qwen3-4b", "--out",
                        str(ckpt)], check=True)
    root, _ = _harvest(ckpt, tmp_path, 512, 3600)
    _replay_matches(root, ckpt)
    keep = os.environ.get("KERN_HARVEST_KEEP")
    if keep:
        shutil.rmtree(keep, ignore_errors=True)
        shutil.copytree(root / "harvest", keep)
