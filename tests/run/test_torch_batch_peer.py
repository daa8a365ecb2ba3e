"""bench/torch_qwen3.py's batched decode step (the peer of `bench/decode.py --batch`) against its own bs=1
forward, on the tiny checkpoint: on the GPU when there is one, else on the CPU. Skipped where torch is not
installed (the CPU machines; the GPU machine has it). What the batched bench's check relies on: a batched step
over caches filled by bs=1 prefills gives each row the logits of that row's own bs=1 forward, writes each
row's K/V at its own position only, and rows do not see each other."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from bench import decode_batch as bb  # noqa: E402
from bench.torch_qwen3 import TorchQwen3  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def model(tiny_ckpt: Path) -> TorchQwen3:
    return TorchQwen3(tiny_ckpt, max_context=128, device=DEVICE)


def _prompts(lengths: list[int], seed: int = 3) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 151643, size=n + 1).tolist() for n in lengths]


def test_batched_step_equals_each_rows_own_forward(model: TorchQwen3) -> None:
    lengths = bb.check_lengths(9, 6)  # ragged: 9, 14, 19, 24, 9, 14 tokens before the step
    prompts = _prompts(lengths)
    ref, k_rows, v_rows = bb.peer_reference(model, prompts)
    assert ref.shape == (6, 151936) and k_rows.shape == (4, 6, 2, bb.cache_size(25), 128)
    for b in (1, 4, 6):
        got = bb.peer_batch_logits(model, k_rows, v_rows, [p[-1] for p in prompts[:b]], lengths[:b])
        verdict = bb.judge(got, ref[:b], 0.02)
        assert verdict["ok"], verdict["failures"]
        assert verdict["top1"] == 1.0 and verdict["max_rel"] < 0.02


def test_batched_step_writes_each_rows_kv_at_its_position(model: TorchQwen3) -> None:
    size = 32
    model.set_batch_cache(3, size)
    assert model.kb.shape == (4, 3, 2, size, 128) and not model.kb.any()
    positions = torch.tensor([0, 7, 31], dtype=torch.int64, device=DEVICE)
    tokens = torch.tensor([5, 6, 7], dtype=torch.int64, device=DEVICE)
    with torch.inference_mode():
        logits = model.forward_batch(tokens, positions)
    assert logits.shape == (3, 151936)
    written = (model.kb != 0).any(dim=-1)  # [layers, rows, kv heads, positions]
    for r, p in enumerate([0, 7, 31]):
        want = torch.zeros(size, dtype=torch.bool, device=DEVICE)
        want[p] = True
        assert torch.equal(written[:, r], want.expand(4, 2, size)), f"row {r}"
    # row 1's K at position 7 against the bs=1 forward of that token alone at that position: layer 0 (before any
    # attention) bit for bit, later layers within bf16 rounding (the attention differs: matmuls vs SDPA)
    model.resize_cache(size)
    with torch.inference_mode():
        model.forward(tokens[1:2], positions[1:2])
    torch.testing.assert_close(model.kb[0, 1, :, 7], model.k_cache[0, 7], rtol=0, atol=0)
    torch.testing.assert_close(model.kb[:, 1, :, 7].float(), model.k_cache[:, 7].float(), rtol=0.05, atol=0.1)
    torch.testing.assert_close(model.vb[0, 1, :, 7], model.v_cache[0, 7], rtol=0, atol=0)
    # a row's logits do not depend on its neighbours
    model.set_batch_cache(1, size)
    with torch.inference_mode():
        alone = model.forward_batch(tokens[1:2], positions[1:2])
    torch.testing.assert_close(alone.float(), logits[1:2].float(), rtol=2e-2, atol=2e-2)
    model.kb = model.vb = None


def test_cache_sizes_are_checked(model: TorchQwen3) -> None:
    with pytest.raises(ValueError, match="batch 0 must be >= 1"):
        model.set_batch_cache(0, 16)
    with pytest.raises(ValueError, match="size 129 inside"):
        model.set_batch_cache(2, 129)
    with pytest.raises(ValueError, match="cache size 0 outside"):
        model.resize_cache(0)
