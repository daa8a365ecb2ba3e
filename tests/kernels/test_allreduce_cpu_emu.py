"""kernels-src/allreduce.cu run on the CPU (tools/allreduce_cpu_emu.py --quick: the kernel source compiled with g++
against tools/cpu_emu_allreduce/, every rank a forked process over one shared mapping, every thread a std::thread):
both entries bit for bit against tools/reference_kernels.allreduce_bf16 over several calls in a row at 2, 3, 4 and 8
ranks with shuffled arrival, data whose float32 sum depends on the order, the timeout status naming the absent rank
(and no second wait), refused arguments reported on every rank without a wait; and kern_allgather_bf16 against
tools/reference_kernels.allgather_bf16 (the vocabulary-parallel logits: every column from its owner, vocab divisible
or not by the ranks, the vector and the element path), its timeout status as the all-reduce's, its refusals. A
logic check where no GPU is at
hand; the memory-ordering side needs tests/multigpu/test_allreduce_gpu.py."""

from __future__ import annotations

import shutil

import pytest

from tools import allreduce_cpu_emu


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
def test_allreduce_on_the_cpu_emulator(capsys: pytest.CaptureFixture[str]) -> None:
    code = allreduce_cpu_emu.main(["--quick", "--seed", "5"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count(": ok") == 18, out
