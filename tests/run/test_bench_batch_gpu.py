"""`bench/decode.py --batch` end to end on the GPU, at the tiny shape (seconds): the worker loads kern and the torch
peer, the check passes for every batch, and every (batch, context) gets a kern and a peer step time.

- today's manifest (manifests/qwen3-tiny.json, seqs max 1): `--batch 1`;
- a batched one (`kern manifest build --seqs-max 8 --gemv v2`): `--batch 1,3,8`, ragged check rows.

Run on the H200:  KERN_REQUIRE_GPU=1 python3 -m pytest tests/run/test_bench_batch_gpu.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tools import make_checkpoint as mc

    out = tmp_path_factory.mktemp("bench-batch") / "qwen3-tiny"
    mc.write_checkpoint(out, mc.SHAPES["tiny"], seed=0, with_tokenizer=False, log=lambda *_: None)
    return out


def _batched_manifest(tmp_path: Path) -> Path:
    out = tmp_path / "qwen3-tiny-b8.json"
    proc = subprocess.run([sys.executable, "-m", "kern_run.cli", "manifest", "build", "--shape", "tiny",
                           "--seqs-max", "8", "--gemv", "v2", "--algos", str(ROOT / "manifests" / "algos" / "h200.json"),
                           "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise AssertionError(f"kern manifest build failed: {proc.stderr[-800:]}")
    return out


@pytest.mark.parametrize("which", ["today", "batched"])
def test_batched_bench_checks_and_times_every_config(ckpt: Path, tmp_path: Path, which: str) -> None:
    from bench import decode_batch

    if which == "today":
        manifest, batches = ROOT / "manifests" / "qwen3-tiny.json", [1]
    else:
        manifest, batches = _batched_manifest(tmp_path), [1, 3, 8]
    out = tmp_path / "bench.json"
    code = decode_batch.main(["--batch", ",".join(map(str, batches)), "--contexts", "16,40", "--manifest",
                              str(manifest), "--ckpt", str(ckpt), "--steps", "4", "--rounds", "2", "--compile-mode",
                              "eager", "--check-tokens", "12", "--check-rel-tol", "0.1", "--budget", "240",
                              "--json", str(out)])
    summary = json.loads(out.read_text())
    results = summary["results"]
    checks = {r["batch"]: r for r in results if r.get("side") == "check"}
    assert sorted(checks) == batches and all(r["ok"] for r in checks.values()), checks
    for side in ("kern", "torch"):
        got = {(r["batch"], r["ctx"]): r for r in results if r.get("side") == side}
        assert sorted(got) == sorted((b, c) for b in batches for c in (16, 40)), side
        assert all(r["ms_per_step"] > 0 and r["steps"] == 8 for r in got.values())
    assert code == 0, summary["notes"]
