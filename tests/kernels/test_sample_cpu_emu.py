"""kernels-src/sample.cu on the CPU (tools/sample_cpu_emu.py --quick: the kernel source compiled with g++ against
tools/cpu_emu/, a block's threads as std::threads): the split sampler's grid run block by block in row-major and in
a shuffled order (a different block merges each row), every row against tools/reference_sample.py (greedy ties
across slices, thresholds, the draw in index order, logprobs, penalties, top-5 logprobs), each row merged by the
path its case names, outputs bit-identical between the two orders, every ticket back at 0; the concurrent case
(5 slices, the exact path) also with a row's blocks running at once (its helpers run tasks) and with 3 at once,
bit-identical to the one-at-a-time runs. Plus the constants the
host side and the builder share with the source. A logic check where no GPU is at hand."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from kern_run import sampling
from tools import sample_cpu_emu

SRC = (Path(__file__).resolve().parents[2] / "kernels-src" / "sample.cu").read_text()


def _define(name: str) -> int:
    match = re.search(rf"#define {name} (\d+)", SRC)
    assert match, f"#define {name} not found in sample.cu"
    return int(match.group(1))


def test_host_constants_are_the_kernels() -> None:
    assert sampling.SAMPLE_SLICE == _define("SAMPLE_SLICE")
    assert sampling.SAMPLE_THREADS == _define("SAMPLE_THREADS")
    assert sampling.WORK_BYTES_PER_ROW == 4 * _define("SAMPLE_WORK_WORDS")
    assert sampling.PARAM_ROW_BYTES == 4 * _define("SAMPLE_PARAM_WORDS")
    assert _define("SAMPLE_MAX_VOCAB") == 2**20 and sampling.sampler_splits(2**20) == _define("SAMPLE_MAX_SPLITS")
    assert [sampling.sampler_splits(v) for v in (1, 8192, 8193, 151936)] == [1, 1, 2, 19]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
def test_sampler_on_the_cpu_emulator(capsys: pytest.CaptureFixture[str]) -> None:
    code = sample_cpu_emu.main(["--quick", "--seed", "3"])
    out = capsys.readouterr().out
    assert code == 0, out
    quick_rows = sum(len(c.params) for c in sample_cpu_emu.CASES if c.quick)
    assert out.count(": ok") == quick_rows == 24, out
    assert "no helper ran" not in out and "5 blocks at once, order 0: helper tasks per row" in out, out
    for path in ("greedy", "plain", "candidates", "exact"):
        assert f"[{path}]" in out, f"no row merged by the {path} path"
