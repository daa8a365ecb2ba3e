"""The llama3 rope table on the CPU: tools/reference_kernels.llama3_inv_freq (the float32 model of
kern_rope_table_llama3) against transformers' `_compute_llama3_parameters` formula written out in float64, and
kernels-src/rope.cu run on the CPU emulator (tools/rope_cpu_emu.py: both rope tables against the reference, the q/k
rope + K/V write with and without the q/k norm, the warp entry bit for bit the block entry)."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest

from tools import reference_kernels as ref
from tools import rope_cpu_emu


def _llama3_float64(inv_freq: np.ndarray, factor: float, low: float, high: float, orig: int) -> np.ndarray:
    """The remap as transformers' modeling_rope_utils describes it, element by element in float64."""
    out = []
    for f in inv_freq.astype(np.float64):
        wavelen = 2 * math.pi / f
        if wavelen > orig / low:
            out.append(f / factor)
        elif wavelen < orig / high:
            out.append(f)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return np.array(out)


@pytest.mark.parametrize("head_dim, theta, scaling", [(64, 500000.0, rope_cpu_emu.LLAMA32),
                                                      (128, 500000.0, rope_cpu_emu.LLAMA31),
                                                      (64, 10000.0, (4.0, 2.0, 3.0, 1024))])
def test_llama3_inv_freq_is_the_transformers_formula(head_dim: int, theta: float, scaling: tuple) -> None:
    base = ref.default_inv_freq(head_dim, theta)
    got = ref.llama3_inv_freq(base, *scaling)
    want = _llama3_float64(base, *scaling)
    assert got.dtype == np.float32 and got.shape == (head_dim // 2,)
    np.testing.assert_allclose(got, want, rtol=4e-7, atol=0)
    factor, low, high, orig = scaling
    wavelen = 2 * np.pi / base.astype(np.float64)
    kept, divided = wavelen < orig / high, wavelen > orig / low
    middle = ~kept & ~divided
    # every band is populated at these shapes; the high frequencies keep their bits, the low ones are f / factor
    assert kept.any() and divided.any() and middle.any()
    np.testing.assert_array_equal(got[kept], base[kept])
    np.testing.assert_array_equal(got[divided], (base[divided] / np.float32(factor)).astype(np.float32))
    assert ((got[middle] < base[middle]) & (got[middle] > base[middle] / factor)).all()


def test_llama3_rope_table_rows() -> None:
    """Row p of the table is [cos(p f)] ++ [sin(p f)] of the remapped f, rounded to bf16; row 0 is [1] ++ [0]."""
    table = ref.rope_table(9000, 64, 500000.0, rope_cpu_emu.LLAMA32)
    f = ref.llama3_inv_freq(ref.default_inv_freq(64, 500000.0), *rope_cpu_emu.LLAMA32)
    np.testing.assert_array_equal(table[0], np.r_[np.ones(32), np.zeros(32)].astype(np.float32))
    angle = (np.float32(8999) * f).astype(np.float64)
    np.testing.assert_allclose(table[8999], np.r_[np.cos(angle), np.sin(angle)], rtol=2.0**-8, atol=2.0**-9)
    plain = ref.rope_table(9000, 64, 500000.0)
    assert not np.array_equal(table[8999, 32:], plain[8999, 32:])  # the scaling reaches the table


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
def test_rope_kernels_on_the_cpu_emulator(capsys: pytest.CaptureFixture[str]) -> None:
    code = rope_cpu_emu.main(["--seed", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count(": ok") == 13, out
