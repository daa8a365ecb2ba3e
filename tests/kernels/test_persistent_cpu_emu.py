"""kernels-src/persistent_decode.cu run on the CPU (tools/persistent_cpu_emu.py --quick: the kernel source compiled
with g++ against tools/cpu_emu_persist/, every block of the grid at once as 256 std::threads each, the builder's
table): one decode step of a tiny Qwen3 shape on 3 blocks and on 1 against the numpy model of today's step (logits,
next_token, q, the written K/V row, attn_out, the final residual, every counter at its signallers, the error word
zero), and a planted hang ending with code 1 and its detail. A logic check where no GPU is at hand."""

from __future__ import annotations

import shutil

import pytest

from tools import persistent_cpu_emu


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
def test_persistent_decode_on_the_cpu_emulator(capsys: pytest.CaptureFixture[str]) -> None:
    code = persistent_cpu_emu.main(["--quick", "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count(": ok") == 3, out
