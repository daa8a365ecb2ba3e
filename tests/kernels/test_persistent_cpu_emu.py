"""kernels-src/persistent_decode.cu run on the CPU (tools/persistent_cpu_emu.py --quick: the kernel source compiled
with g++ against tools/cpu_emu_persist/, every block of the grid at once as 256 std::threads each, the builder's
table): one decode step of a tiny Qwen3 shape on 3 blocks and on 1, and of a wider one (hidden 552, intermediate 640:
several ring steps per batch, uneven chunks per lane, DOWN's row split) on 2, against the numpy model of today's step
(logits, next_token, q, the written K/V row, attn_out, the final residual, every counter at its signallers, the error
word zero), a planted hang ending with code 1 naming a wait it blocks, and the attention-only tables (ATTN_PARTIAL / ATTN_REDUCE
at several head dims and groups against a float64 reference). A logic check where no GPU is at hand."""

from __future__ import annotations

import shutil

import pytest

from tools import persistent_cpu_emu


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
def test_persistent_decode_on_the_cpu_emulator(capsys: pytest.CaptureFixture[str]) -> None:
    code = persistent_cpu_emu.main(["--quick", "--seed", "1", "--only", "step"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count(": ok") == 6, out


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
def test_persistent_attention_on_the_cpu_emulator(capsys: pytest.CaptureFixture[str]) -> None:
    """The attention-only tables (tools/persistent_cpu_emu.ATTN_CASES): every split's acc, m, l within 1e-4 of the
    float64 reference (empty splits 0, -inf, 0) and attn_out within bf16 rounding, at head_dim 48 (scalar path), 64,
    128 and 256, groups 1, 2, 3, 4 and 8, with absent pages and empty splits, and 20 splits (ATTN_REDUCE's
    two-pass path); each case again as ATTN (the fused attention: its rope from the raw qkv row, the new token's K / V
    written, the ticket's reduce), once on one block with the writer split first, and once with slot_mapping
    past the last token's slot (fault 5, nothing written)."""
    code = persistent_cpu_emu.main(["--seed", "1", "--only", "attention"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count(": ok") == len(persistent_cpu_emu.ATTN_CASES) == 16, out
