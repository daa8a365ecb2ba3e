"""GPU test of kern_attn_decode_gqa_fused (kernels-src/attention_decode.cu): the gqa decode partial with its rows'
merge done by each (row, kv head)'s last split, counted by tickets, against the two launches it replaces
(kern_attn_decode_partial_gqa + kern_attn_decode_reduce), bit for bit.

Run on the GPU machine:  KERN_REQUIRE_GPU=1 uv run --frozen pytest -q tests/kernels/test_decode_attention_fused_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest

from kern_run.models.qwen3 import EARLY_PARTIALS
from tests.kernels import test_decode_attention_gpu as dec

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("hq,hkv,head_dim,page_tokens,split_tokens,num_splits",
                         [(32, 8, 128, 16, 64, 16), (40, 8, 128, 16, 16, 32), (16, 1, 128, 16, 64, 4),
                          (12, 2, 96, 16, 32, 7), (4, 2, 32, 4, 16, 1)])
def test_gqa_fused_gives_the_bits_of_gqa_and_the_reduce(dev, monkeypatch, hq, hkv, head_dim, page_tokens,
                                                        split_tokens, num_splits):
    """64 ragged rows, empty ones included, three launches in a row on the same tickets: part_out, part_ml and the
    output bit for bit those of the gqa partial + the reduce, and the tickets back to zero after each launch."""
    entry, threads, _ = EARLY_PARTIALS["gqa"]
    monkeypatch.setattr(dec, "STREAM", entry)
    monkeypatch.setattr(dec, "THREADS", threads)
    fused = dev.kernel(EARLY_PARTIALS["gqa-fused"][0])
    rng = np.random.default_rng(23)
    lens = rng.choice(dec.RAGGED + [0, 1, 0], size=64)
    rows = dec.Rows(dev, rng, hq, hkv, head_dim, page_tokens, lens)
    want = dec.run_stream(dev, rows, split_tokens, num_splits)
    dec.check_against_reference(rows, split_tokens, num_splits, *want)
    n = rows.seqs
    d_tickets = dev.array(np.zeros(n * hkv, dtype=np.int32))
    for attempt in range(3):
        d_po = dev.alloc(n * hq * num_splits * head_dim * 4)
        d_ml = dev.alloc(n * hq * num_splits * 2 * 4)
        d_out = dev.alloc(n * hq * head_dim * 2)
        for buf in (d_po, d_ml, d_out):
            buf.poison()
        args = rows.partial_args(d_po, d_ml, split_tokens, num_splits)
        fused.launch((hkv, num_splits, n), (threads,), args[:7] + [("p", d_tickets.ptr), ("p", d_out.ptr)] + args[7:])
        got = (d_po.download(np.uint32, want[0].shape), d_ml.download(np.uint32, want[1].shape),
               d_out.download(np.uint16, want[2].shape))
        for a, b, what in zip(want, got, ("part_out", "part_ml", "output")):
            assert np.array_equal(a, b), f"launch {attempt}: {what} bits differ from gqa + reduce"
        assert (d_tickets.download(np.int32, (n * hkv,)) == 0).all(), f"launch {attempt}: a ticket left nonzero"
