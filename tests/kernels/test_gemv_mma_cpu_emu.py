"""kernels-src/gemv_mma.cu run on the CPU (tools/gemv_mma_cpu_emu.py --quick: the kernel source compiled with g++
against tools/cpu_emu_mma/, every thread a std::thread, mma.sync from the PTX fragment layout): each entry against
the float64 reference within the GPU tests' bounds, rows >= m untouched, batch invariance over m, tile, position and
grids of one warps-per-tile, the residual epilogue bit for bit, refused launches writing nothing. A logic check
where no GPU is at hand."""

from __future__ import annotations

import shutil

import pytest

from tools import gemv_mma_cpu_emu


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
def test_gemv_mma_on_the_cpu_emulator(capsys: pytest.CaptureFixture[str]) -> None:
    code = gemv_mma_cpu_emu.main(["--quick", "--seed", "3"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count(": ok") == 13, out  # 12 shapes (warps per tile 1, 4 and 8 among them) and the refusals
