"""GPU test of kern_attn_decode_gqa_rows (kernels-src/attention_decode.cu): one block per (kv head, row) whose warps
stream the row's splits and merge them, against the two launches it replaces (kern_attn_decode_partial_gqa +
kern_attn_decode_reduce), bit for bit, at every block size it takes; and the launches it refuses write nothing.

Run on the GPU machine:  KERN_REQUIRE_GPU=1 uv run --frozen pytest -q tests/kernels/test_decode_attention_rows_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest

from kern_run.models.qwen3 import EARLY_PARTIALS
from kern_run.models.qwen3.entries import GQA_ROWS, GQA_ROWS_MAX_WARPS
from tests.kernels import test_decode_attention_gpu as dec

pytestmark = pytest.mark.gpu

ENTRY, SMEM_PER_WARP = GQA_ROWS


def _gqa_two_launches(dev, monkeypatch, rows, split_tokens, num_splits):
    """(part_out, part_ml, output) bits of the gqa partial + the reduce, checked against the reference."""
    entry, threads, _ = EARLY_PARTIALS["gqa"]
    monkeypatch.setattr(dec, "STREAM", entry)
    monkeypatch.setattr(dec, "THREADS", threads)
    want = dec.run_stream(dev, rows, split_tokens, num_splits)
    dec.check_against_reference(rows, split_tokens, num_splits, *want)
    return want


def _run_rows(dev, rows, split_tokens, num_splits, warps, shared_mem=None, grid_y=1):
    """(part_out, part_ml, output) bits of one kern_attn_decode_gqa_rows launch into poisoned buffers."""
    n, hq, hkv, d = rows.seqs, rows.hq, rows.hkv, rows.d
    d_po = dev.alloc(n * hq * num_splits * d * 4)
    d_ml = dev.alloc(n * hq * num_splits * 2 * 4)
    d_out = dev.alloc(n * hq * d * 2)
    for buf in (d_po, d_ml, d_out):
        buf.poison()
    args = rows.partial_args(d_po, d_ml, split_tokens, num_splits)
    dev.kernel(ENTRY).launch((hkv, grid_y, n), (int(32 * warps),), args[:7] + [("p", d_out.ptr)] + args[7:],
                             shared_mem=int(warps * SMEM_PER_WARP) if shared_mem is None else shared_mem)
    return (d_po.download(np.uint32, (n, hq, num_splits, d)), d_ml.download(np.uint32, (n, hq, num_splits, 2)),
            d_out.download(np.uint16, (n, hq * d)))


@pytest.mark.parametrize("hq,hkv,head_dim,page_tokens,split_tokens,num_splits",
                         [(32, 8, 128, 16, 64, 16), (40, 8, 128, 16, 16, 32), (16, 1, 128, 16, 64, 4),
                          (12, 2, 96, 16, 32, 7), (4, 2, 32, 4, 16, 1), (64, 2, 64, 16, 64, 20)])
def test_gqa_rows_gives_the_bits_of_gqa_and_the_reduce(dev, monkeypatch, hq, hkv, head_dim, page_tokens,
                                                       split_tokens, num_splits):
    """64 ragged rows, empty ones included: part_out, part_ml and the output bit for bit those of the gqa partial +
    the reduce, with blocks of 1 to GQA_ROWS_MAX_WARPS warps (groups past 8 q heads: two passes; more than 16
    splits: past the reduce's first batch)."""
    rng = np.random.default_rng(29)
    lens = rng.choice(dec.RAGGED + [0, 1, 0, 576, 640], size=64)
    rows = dec.Rows(dev, rng, hq, hkv, head_dim, page_tokens, lens)
    want = _gqa_two_launches(dev, monkeypatch, rows, split_tokens, num_splits)
    for warps in range(1, GQA_ROWS_MAX_WARPS + 1):
        got = _run_rows(dev, rows, split_tokens, num_splits, warps)
        for a, b, what in zip(want, got, ("part_out", "part_ml", "output")):
            assert np.array_equal(a, b), f"{warps} warps: {what} bits differ from gqa + reduce"


def test_gqa_rows_deferred_slot_row_gives_the_same_bits(dev, monkeypatch):
    """slot_mapping naming each row's last token, or a row of its first tile (loaded after the PDL wait instead of
    by cp.async): the bits of slot -1."""
    hq, hkv, head_dim, page_tokens = 32, 8, 128, 16
    rng = np.random.default_rng(31)
    lens = np.asarray([576, 1, 2048, 17, 600, 4097, 64, 640], dtype=np.int32)
    rows = dec.Rows(dev, rng, hq, hkv, head_dim, page_tokens, lens)
    want = _gqa_two_launches(dev, monkeypatch, rows, 64, 16)
    t, pt = rows.table, page_tokens
    for pos in (lambda n: n - 1, lambda n: min(3, n - 1)):
        rows.d_slots.upload(np.asarray([int(t[s, pos(int(n)) // pt]) * pt + pos(int(n)) % pt
                                        for s, n in enumerate(lens)], dtype=np.int32))
        got = _run_rows(dev, rows, 64, 16, 3)
        for a, b, what in zip(want, got, ("part_out", "part_ml", "output")):
            assert np.array_equal(a, b), f"{what} bits differ with the slot rows deferred"


@pytest.mark.parametrize("what,warps,shared_mem,grid_y", [
    ("dynamic shared memory one byte short", 3, 3 * SMEM_PER_WARP - 1, 1),
    ("a block of 48 threads", 1.5, 2 * SMEM_PER_WARP, 1),
    ("a grid with two splits in y", 3, 3 * SMEM_PER_WARP, 2),
])
def test_gqa_rows_outside_its_limits_writes_nothing(dev, what, warps, shared_mem, grid_y):
    """A launch it refuses leaves part_out, part_ml and the output as they were (poisoned)."""
    rng = np.random.default_rng(37)
    rows = dec.Rows(dev, rng, 32, 8, 128, 16, [576, 100])
    for bits in _run_rows(dev, rows, 64, 16, warps, shared_mem=shared_mem, grid_y=grid_y):
        assert (bits.view(np.uint8) == 0xFF).all(), f"{what}: the launch wrote"
