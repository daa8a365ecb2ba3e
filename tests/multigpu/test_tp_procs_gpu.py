"""`kern run --tp 2` as two rank processes on 2 GPUs (kern_run.tp_procs: descriptors over the rendezvous, rank 0
driving the step stream, the GEMV decode with the one-shot all-reduce), and tensor-parallel parity at real shapes.

- the trained tiny-en model (models/qwen3-tiny-en): `kern run --tp 2` (processes) prints exactly the text of
  `kern run --tp 2 --tp-local` (one process, connect_local: the same kernels, so the same bits) and of TP=1 on
  the same fused GEMV wiring (`--gemv v2`; on this model the greedy tokens do not sit at near ties:
  docs/perf.md "Tensor parallelism");
- tools/tp_parity.py --procs at Qwen3-4B and Qwen3-8B shapes (random weights, $KERN_WEIGHTS/<shape>, made when
  missing): TP=2 teacher-forced against TP=1 and float32 transformers with its criteria (no top-1 flip beyond
  twice the bf16 difference, error within 1.5 x TP=1's), exit 0. Minutes each (the checkpoint, three loads, the
  float32 reference), more than tools/gpu-suite.sh's group budget: they run when KERN_TP_PARITY=1.

Needs 2 GPUs. NVLink multicast stays off.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mg_helpers import REPO

pytestmark = pytest.mark.gpu

TINY_EN = REPO / "models" / "qwen3-tiny-en"
PROMPT = "Once upon a time, a little girl named Lily"


@pytest.fixture(scope="module")
def two_gpus() -> None:
    from kern_run.preflight import probe_device

    if probe_device(0) < 2:
        pytest.skip("needs 2 GPUs")


def _kern(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0"}
    return subprocess.run([sys.executable, "-m", "kern_run", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def test_kern_run_tp2_processes_print_the_local_groups_and_tp1s_text(two_gpus, tmp_path: Path) -> None:
    manifest = tmp_path / "tiny-en.json"
    build = ["manifest", "build", "--config", str(TINY_EN / "config.json"), "--name", "tiny-en", "--max-context",
             "2048", "--kernels", str(REPO / "kernels")]
    assert _kern(*build, "--gemv", "v2", "--out", str(manifest)).returncode == 0
    assert _kern(*build, "--tp", "2", "--out", str(manifest)).returncode == 0
    run = ["run", "--manifest", str(manifest), "--kernels", str(REPO / "kernels"), "--weights", str(TINY_EN),
           "--prompt", PROMPT, "--max-tokens", "48", "--ignore-eos", "--capacity", "1024", "--greedy"]
    procs, local, tp1 = _kern(*run, "--tp", "2"), _kern(*run, "--tp", "2", "--tp-local"), _kern(*run)
    for name, r in (("processes", procs), ("local", local), ("tp1", tp1)):
        assert r.returncode == 0, f"{name}: {r.stderr[-2000:]}"
    assert procs.stdout and procs.stdout == local.stdout, (procs.stdout, local.stdout)
    assert procs.stdout == tp1.stdout, (procs.stdout, tp1.stdout)
    assert "rank 1: followed" in procs.stderr


@pytest.mark.parametrize("shape", ["qwen3-4b", "qwen3-8b"])
def test_tp_parity_in_rank_processes(two_gpus, shape: str) -> None:
    from tools import tp_parity

    if os.environ.get("KERN_TP_PARITY") != "1":
        pytest.skip("minutes per shape: run with KERN_TP_PARITY=1")
    ckpt = Path(os.environ.get("KERN_WEIGHTS", "/tmp/kern-weights")) / shape
    code = tp_parity.main(["--shape", shape, "--ckpt", str(ckpt), "--tp", "2", "--procs", "--positions", "128",
                           "--prompt-tokens", "512", "--greedy", "32"])
    assert code == 0
