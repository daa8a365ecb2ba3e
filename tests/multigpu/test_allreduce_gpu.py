"""The one-shot all-reduce (kernels-src/allreduce.cu) on 2 GPUs, 2 rank processes (allreduce_rank_worker.py, started
by spawn_ranks as `kern run --tp 2` starts its ranks; the export handles travel as fabric handles or POSIX file
descriptors over the rendezvous socket).

- `sum`, `add` and a captured burst of 20 `sum` calls bit for bit against tools/reference_kernels.allreduce_bf16
  (float32, rank order) at 8, 4 Ki, 8 Ki (16 KB), 64 Ki, 128 Ki (256 KB) and 1 Mi (2 MB) elements, on both ranks,
  and NCCL's all-reduce of the same data within bf16 rounding of it;
- status words zero after all of it;
- a rank that never calls: the other's call returns within the manifest's timeout (200 ms) plus slack, with status
  {1, 1, block, 1} (timed out, rank 1 missing, the first of the 8 blocks to give up, epoch 1);
- the all-gather of the vocabulary-parallel lm_head (kern_allgather_bf16): `gather` and a captured burst of 20 at
  1, 2 and 4 rows of a 151936 vocabulary (Qwen3's) and of 1003 (not a multiple of 8: the element path), bit for
  bit against tools/reference_kernels.allgather_bf16 on both ranks, status zero; a rank that never calls: status
  {1, 1, block, 1} within the timeout plus slack, as the all-reduce.

Needs 2 GPUs (skipped with fewer, failed under KERN_REQUIRE_GPU=1 with none). NVLink multicast stays off.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from allreduce_rank_worker import inputs, residual
from mg_helpers import REPO

pytestmark = pytest.mark.gpu

WORKER = str(Path(__file__).with_name("allreduce_rank_worker.py"))
SIZES = [8, 4096, 8192, 65536, 131072, 1 << 20]


@pytest.fixture(scope="module")
def two_gpus() -> None:
    from kern_run.preflight import probe_device

    if probe_device(0) < 2:
        pytest.skip("needs 2 GPUs")


def _manifest(tmp: Path, max_elements: int, timeout_ms: int = 1000, gather_vocab: int = 0) -> Path:
    from tools.gen_allreduce import main

    path = tmp / "allreduce-2.json"
    assert main(["--size", "2", "--out", str(path), "--max-elements", str(max_elements), "--timeout-ms",
                 str(timeout_ms), "--gather-vocab", str(gather_vocab), "--gather-rows", "4"]) == 0
    return path


def _spawn(args: list[str]) -> None:
    from kern_run.tp_rendezvous import spawn_ranks

    env = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), "NCCL_NVLS_ENABLE": "0"}
    spawn_ranks(2, [sys.executable, WORKER, *args], env, timeout_s=300)


def test_oneshot_allreduce_matches_numpy_over_two_processes(two_gpus, tmp_path: Path) -> None:
    from tools.reference_kernels import allreduce_bf16, from_bf16_bits

    manifest = _manifest(tmp_path, max(SIZES))
    _spawn(["check", str(manifest), str(REPO / "kernels"), str(tmp_path), ",".join(map(str, SIZES))])
    got = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    for n in SIZES:
        parts = np.stack([inputs(r, n) for r in range(2)])
        parts_g = np.stack([inputs(r + 100, n) for r in range(2)])
        want_sum = allreduce_bf16(parts)
        want_add = allreduce_bf16(parts, residual(0, n))
        want_g = allreduce_bf16(parts_g)
        for r in range(2):
            np.testing.assert_array_equal(got[r][f"sum_{n}"], want_sum, err_msg=f"sum n={n} rank {r}")
            np.testing.assert_array_equal(got[r][f"add_{n}"], want_add, err_msg=f"add n={n} rank {r}")
            np.testing.assert_array_equal(got[r][f"sum_g_{n}"], want_g, err_msg=f"sum_g n={n} rank {r}")
            nccl = from_bf16_bits(got[r][f"nccl_{n}"])
            ref = from_bf16_bits(want_g)
            np.testing.assert_allclose(nccl, ref, rtol=2 ** -7, atol=2 ** -7, err_msg=f"nccl n={n} rank {r}")
    for r in range(2):
        assert got[r]["status"].tolist() == [0, 0, 0, 0], r


def test_a_rank_that_never_calls_is_reported_in_bounded_time(two_gpus, tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, 8192, timeout_ms=200)
    _spawn(["absent", str(manifest), str(REPO / "kernels"), str(tmp_path), "4096"])
    result = json.loads((tmp_path / "rank0.json").read_text())
    code, missing, block, epoch = result["status"]
    assert (code, missing, epoch) == (1, 1, 1) and 0 <= block < 8
    assert 0.2 <= result["seconds"] < 2.0


@pytest.mark.parametrize("vocab", [151936, 1003])
def test_oneshot_allgather_matches_numpy_over_two_processes(two_gpus, tmp_path: Path, vocab: int) -> None:
    from allreduce_rank_worker import gather_inputs
    from tools.reference_kernels import allgather_bf16

    manifest = _manifest(tmp_path, 8192, gather_vocab=vocab)
    slice_ = json.loads(manifest.read_text())["meta"]["tp"]["lm_head"]["slice"]
    rows_list = [1, 2, 4]
    _spawn(["gather", str(manifest), str(REPO / "kernels"), str(tmp_path), ",".join(map(str, rows_list))])
    got = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    for rows in rows_list:
        for key, base in ((f"gather_{rows}", 0), (f"gather_g_{rows}", 100)):
            slices = np.stack([gather_inputs(r + base, rows * slice_).reshape(rows, slice_) for r in range(2)])
            want = allgather_bf16(slices, vocab).reshape(-1)
            for r in range(2):
                np.testing.assert_array_equal(got[r][key], want, err_msg=f"{key} rank {r}")
    for r in range(2):
        assert got[r]["status"].tolist() == [0, 0, 0, 0], r


def test_an_allgather_rank_that_never_calls_is_reported_in_bounded_time(two_gpus, tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, 8192, timeout_ms=200, gather_vocab=151936)
    _spawn(["absent", str(manifest), str(REPO / "kernels"), str(tmp_path), "1", "gather"])
    result = json.loads((tmp_path / "rank0.json").read_text())
    code, missing, block, epoch = result["status"]
    assert (code, missing, epoch) == (1, 1, 1) and 0 <= block < 32
    assert 0.2 <= result["seconds"] < 2.0
