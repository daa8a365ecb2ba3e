"""GPU tests of the batched decode partials of kernels-src/attention_decode.cu, kern_attn_decode_partial_stream (issue
26) and kern_attn_decode_partial_gqa (every test runs for each), with kern_attn_decode_reduce, from the BUILT cubins (kernels/kernels.json), against the float64
references of tools/reference_kernels.py.

- Ragged rows (contexts 0, 1, 15, 16, 17, 127, 128, 1000, 2048, 4097) at 1, 3, 8 and 64 rows, shuffled page ids,
  GQA groups 1, 2, 3, 4, 5, 6, 8, 16 and 32 (passes of 16 heads) at head_dim 32 to 128, pages of 4, 16 and 64
  tokens, the generator's splits and others: every used split's (m, l) and part_out against
  ref.attn_decode_partials, every split past a row's context left unwritten (its poison kept: the reduce never
  reads it), the reduced output against ref.attn_decode.
- Page ids outside [0, num_pages) masked exactly as the reference masks them (the bound below the cache, 0,
  negative; ids 2^31 - 1, -2^31, the id of the cache's poisoned guard): never read.
- The early contract: q and the K/V row of slot_mapping written by kern_qk_norm_rope_kv (serially, and under
  programmatic dependent launch with the slot rows poisoned beforehand, bit for bit the serial result); the
  deferred load of the slot's row gives the bits of an ordinary load (slot -1).
- Batch invariance: a row's partials and output bit for bit the same alone and at any index of 64 rows with
  other contexts, pages and queries around it; rows and splits the launch does not cover keep their poison.
- Launches outside the limits (block not the entry's 64 or 32 threads, head_dim not a multiple of 16 or above 128, an unaligned
  cache, the 32-bit row bound) write nothing; an unaligned q gives the aligned bits.

Run on the GPU machine:  KERN_REQUIRE_GPU=1 uv run --frozen pytest -q tests/kernels/test_decode_attention_gpu.py
"""

from __future__ import annotations

import ctypes
import struct
import sys

import numpy as np
import pytest
from cuda.bindings import driver as cu

from kern_run.models.qwen3 import EARLY_PARTIALS
from tests.kernels.gpu_helpers import _PACK, check
from tests.kernels.test_kernels_gpu import (
    I32_MAX, PAGE_BOUNDS, assert_close, bound_pages, cdiv, make_paged_cache, rand_bf16,
)
from tools import reference_kernels as ref

pytestmark = pytest.mark.gpu

STREAM, THREADS, MAX_D = EARLY_PARTIALS["stream"]
# blocks smaller than each entry's own (a larger one the driver refuses: __launch_bounds__)
WRONG_BLOCKS = {"stream": (32, 48), "gqa": (16, 24)}
WRONG = WRONG_BLOCKS["stream"]


@pytest.fixture(autouse=True, params=sorted(WRONG_BLOCKS))
def partial_entry(request, monkeypatch):
    """Every test of this module once per decode partial: STREAM, THREADS and WRONG name its entry."""
    entry, threads, _ = EARLY_PARTIALS[request.param]
    monkeypatch.setattr(sys.modules[__name__], "STREAM", entry)
    monkeypatch.setattr(sys.modules[__name__], "THREADS", threads)
    monkeypatch.setattr(sys.modules[__name__], "WRONG", WRONG_BLOCKS[request.param])
    return request.param
POISON32 = 0xFFFFFFFF

# (hq, hkv, head_dim, page_tokens): groups 1, 2, 4, 5, 8 at head_dim 64 and 128 (Qwen3-4B: 32 / 8 / 128; -14B
# group 5, -32B group 8), and groups 3, 6, 16, 32 (two passes of 16), head_dim 32 / 96, pages of 4 and 64
CONFIGS = [(8, 8, 128, 16), (8, 8, 64, 16), (4, 2, 128, 16), (4, 2, 64, 16), (32, 8, 128, 16), (32, 8, 64, 16),
           (40, 8, 128, 16), (10, 2, 64, 16), (64, 8, 128, 16), (16, 2, 64, 16), (6, 2, 64, 4), (12, 2, 96, 16),
           (4, 2, 32, 4), (16, 1, 128, 16), (32, 1, 64, 16), (32, 8, 128, 64)]
RAGGED = [1, 15, 16, 17, 127, 128, 1000, 2048, 4097]
# (split_tokens = the minimum split length, num_splits = the launch constant): the generator's (64, 16), splits
# that grow past the minimum, a single split, 32 splits of >= 16, odd counts
SPLITS = [(64, 16), (16, 32), (64, 4), (16, 1), (32, 7), (96, 3)]


def stream_kernel(dev):
    if not any(STREAM in m["entries"] for m in dev.meta["modules"].values()):
        pytest.skip(f"{STREAM} not built")
    return dev.kernel(STREAM)


class Rows:
    """One launch's inputs on the device: q [seqs, hq, D], a paged cache with shuffled page ids, the block table,
    seq_lens and slot_mapping (default -1: no row to reload)."""

    def __init__(self, dev, rng, hq, hkv, head_dim, page_tokens, seq_lens, bound=None, q_scale=None):
        self.hq, self.hkv, self.d, self.page_tokens = hq, hkv, head_dim, page_tokens
        self.seq_lens = np.asarray(seq_lens, dtype=np.int32)
        self.seqs = len(self.seq_lens)
        cache, table = make_paged_cache(rng, page_tokens, hkv, head_dim, self.seq_lens, spare_pages=3, spare_cols=2)
        self.bt_stride = table.shape[1]
        self.num_pages, self.table = bound_pages(rng, table, self.seq_lens, page_tokens, cache.shape[0], bound)
        self.cache = cache
        q = rand_bf16(rng, (self.seqs, hq, head_dim))
        q[-1] *= 8.0 if q_scale is None else q_scale  # a peaky softmax for the last row
        self.q = ref.bf16_round(q)
        self.scale = head_dim**-0.5
        self.d_q = dev.array(ref.bf16_bits(self.q))
        self.d_cache = dev.array(ref.bf16_bits(cache))
        self.d_bt, self.d_lens = dev.array(self.table), dev.array(self.seq_lens)
        self.d_slots = dev.array(np.full(self.seqs, -1, dtype=np.int32))

    def partial_args(self, d_po, d_ml, split_tokens, num_splits, head_dim=None, q_ptr=None, cache_ptr=None,
                     num_pages=None):
        return [("p", self.d_q.ptr if q_ptr is None else q_ptr),
                ("p", self.d_cache.ptr if cache_ptr is None else cache_ptr), ("p", self.d_bt.ptr),
                ("p", self.d_lens.ptr), ("p", self.d_slots.ptr), ("p", d_po.ptr), ("p", d_ml.ptr), ("i", self.hq),
                ("i", self.hkv), ("i", self.d if head_dim is None else head_dim), ("i", self.page_tokens),
                ("i", self.bt_stride), ("i", self.num_pages if num_pages is None else num_pages),
                ("i", split_tokens), ("i", num_splits), ("f", self.scale)]


def run_stream(dev, rows, split_tokens, num_splits, block=None, grid_seqs=None, extra_rows=0, **arg_overrides):
    """Launch the stream partial over rows.seqs rows (or grid_seqs) into poisoned part_out / part_ml sized for
    `extra_rows` more rows, then the reduce into a poisoned output; returns (part_out bits, part_ml bits, output
    bits) over every row of the buffers ([seqs + extra, hq, num_splits, D], [..., 2], [seqs + extra, hq * D])."""
    n = rows.seqs + extra_rows
    seqs = rows.seqs if grid_seqs is None else grid_seqs
    d_po = dev.alloc(n * rows.hq * num_splits * rows.d * 4)
    d_ml = dev.alloc(n * rows.hq * num_splits * 2 * 4)
    d_out = dev.alloc(n * rows.hq * rows.d * 2)
    for buf in (d_po, d_ml, d_out):
        buf.poison()
    stream_kernel(dev).launch((rows.hkv, num_splits, seqs), (THREADS if block is None else block,),
                              rows.partial_args(d_po, d_ml, split_tokens, num_splits, **arg_overrides))
    dev.kernel("kern_attn_decode_reduce").launch(
        (rows.hq, seqs), (rows.d,),
        [("p", d_po.ptr), ("p", d_ml.ptr), ("p", rows.d_lens.ptr), ("p", d_out.ptr), ("i", rows.hq), ("i", rows.d),
         ("i", split_tokens), ("i", num_splits)])
    return (d_po.download(np.uint32, (n, rows.hq, num_splits, rows.d)),
            d_ml.download(np.uint32, (n, rows.hq, num_splits, 2)),
            d_out.download(np.uint16, (n, rows.hq * rows.d)))


def least_sum_of_exp(m_nat: np.ndarray) -> np.ndarray:
    """The least sum of exp the stream partial can report for splits whose max is m_nat (natural-log units, as
    part_ml holds it). Its terms are exp2(fmaf(s, sl2, -m2)) with m2 = fmaxf(..., mx * sl2), the max score times
    sl2 rounded (attention_decode.cu), so the max term is exp2 of that product's rounding error, within half an ulp
    of |m2| of 1 either way: a shift every term of the split shares (part_out too), which cancels in the output.
    The sum is >= 1 only when the scaled max is exact (1 - 1.2e-6 seen at m2 = 48). Bound: a whole ulp of 2 |m2|
    below 1 and 2^-21 for exp2f."""
    m2 = np.abs(np.asarray(m_nat, dtype=np.float64)) / np.log(2.0)
    return np.exp2(-np.spacing((2.0 * m2).astype(np.float32)).astype(np.float64)) * (1.0 - 2.0**-21)


def check_against_reference(rows, split_tokens, num_splits, po_bits, ml_bits, out_bits):
    """Used splits against ref.attn_decode_partials (splits whose tokens all lack a page: (-inf, 0) and zeros),
    splits past the context unwritten, the output against ref.attn_decode (zeros where no token has a page)."""
    hq, seqs = rows.hq, rows.seqs
    po, ml = po_bits[:seqs].view(np.float32), ml_bits[:seqs].view(np.float32)
    want_po, want_ml = ref.attn_decode_partials(rows.q, rows.cache, rows.table, rows.seq_lens, rows.scale,
                                                split_tokens, num_splits, num_pages=rows.num_pages)
    for s, n in enumerate(rows.seq_lens):
        length = ref.decode_split_len(int(n), split_tokens, num_splits)
        assert num_splits * length >= n, f"row {s}: splits do not cover the context"
        empty = np.arange(num_splits) * length >= n
        dead = ~empty & np.isneginf(want_ml[s, 0, :, 0])
        live = ~empty & ~dead
        assert (po_bits[s][:, empty] == POISON32).all(), f"row {s} (ctx {n}): a split past the context written (po)"
        assert (ml_bits[s][:, empty] == POISON32).all(), f"row {s} (ctx {n}): a split past the context written (ml)"
        assert (ml[s][:, dead, 0] == -np.inf).all() and (ml[s][:, dead, 1] == 0).all(), f"row {s}: all-absent ml"
        assert (po[s][:, dead] == 0).all(), f"row {s}: all-absent split part_out not zero"
        if live.any():
            got_m, want_m = ml[s][:, live, 0].astype(np.float64), want_ml[s][:, live, 0]
            assert np.all(np.abs(got_m - want_m) <= 1e-4 * (1.0 + np.abs(want_m))), f"row {s} (ctx {n}): split max m"
            assert (ml[s][:, live, 1] >= least_sum_of_exp(ml[s][:, live, 0])).all(), \
                f"row {s}: non-empty split with sum of exp below its max term's least value"
            assert_close(f"row {s} (ctx {n}) split sums l", ml[s][:, live, 1], want_ml[s][:, live, 1], rel=1e-3,
                         elem_rel=1e-3, elem_abs=0.0)
            assert_close(f"row {s} (ctx {n}) part_out", po[s][:, live], want_po[s][:, live], rel=1e-3, elem_rel=1e-3,
                         elem_abs=1e-4)
    got = ref.from_bf16_bits(out_bits[:seqs])
    want = ref.attn_decode(rows.q, rows.cache, rows.table, rows.seq_lens, rows.scale, num_pages=rows.num_pages)
    for s in range(seqs):
        n = int(rows.seq_lens[s])
        if n <= 0 or not ref.kv_present(rows.table[s], n, rows.page_tokens, rows.num_pages).any():
            assert (got[s] == 0).all(), f"row {s} (ctx {n}, no token with a page): output not zero"
            continue
        assert_close(f"row {s} (ctx {n}) output", got[s], want[s], elem_rel=2.0**-6, elem_abs=4e-3)


def ragged_lens(page_tokens):
    """The ragged contexts, those around this page size, and an empty row."""
    return sorted(set(RAGGED + [page_tokens - 1, page_tokens, page_tokens + 1]) - {0}) + [0]


# every config at the generator's splits and at 32 splits of >= 16; a few configs at every SPLITS entry
RAGGED_CASES = ([(*cfg, *sp) for cfg in CONFIGS for sp in SPLITS[:2]]
                + [(*cfg, *sp) for cfg in [(32, 8, 128, 16), (4, 2, 32, 4), (40, 8, 128, 16), (32, 1, 64, 16)]
                   for sp in SPLITS[2:]])


@pytest.mark.parametrize("hq,hkv,head_dim,page_tokens,split_tokens,num_splits", RAGGED_CASES)
def test_stream_matches_reference_on_ragged_rows(dev, hq, hkv, head_dim, page_tokens, split_tokens, num_splits):
    rng = np.random.default_rng(hq * 31 + hkv * 7 + head_dim + page_tokens * 3 + split_tokens * 5 + num_splits)
    rows = Rows(dev, rng, hq, hkv, head_dim, page_tokens, rng.permutation(ragged_lens(page_tokens)))
    check_against_reference(rows, split_tokens, num_splits, *run_stream(dev, rows, split_tokens, num_splits))


@pytest.mark.parametrize("seqs", [1, 3, 8, 64])
@pytest.mark.parametrize("hq,hkv,head_dim,page_tokens", [(32, 8, 128, 16), (40, 8, 128, 16), (8, 8, 64, 16)])
def test_stream_matches_reference_at_batch(dev, seqs, hq, hkv, head_dim, page_tokens):
    """1 to 64 rows, each its own context drawn from the ragged list, its own shuffled pages and q, at the
    generator's splits (16 of at least 64 tokens)."""
    rng = np.random.default_rng(seqs * 101 + hq + head_dim)
    rows = Rows(dev, rng, hq, hkv, head_dim, page_tokens, rng.choice(RAGGED, size=seqs))
    check_against_reference(rows, 64, 16, *run_stream(dev, rows, 64, 16))


@pytest.mark.parametrize("hq,hkv,head_dim,page_tokens", [(32, 8, 128, 16), (4, 2, 32, 4), (8, 1, 128, 16),
                                                         (6, 2, 64, 16), (32, 1, 64, 16)])
@pytest.mark.parametrize("split_tokens,num_splits", [(64, 16), (16, 32), (32, 7)])
@pytest.mark.parametrize("bound", sorted(PAGE_BOUNDS))
def test_stream_masks_page_ids_outside_num_pages(dev, hq, hkv, head_dim, page_tokens, split_tokens, num_splits, bound):
    """Block-table entries >= num_pages (the bound, real pages past it, the id of the cache's poisoned guard,
    2^30, 2^31 - 1) and negative ones are masked as the reference masks them; all-absent splits (-inf, 0); a
    row without a page gives zeros; nothing read past the bound (a read of the guard would give NaN)."""
    rng = np.random.default_rng(hq * 3 + head_dim + page_tokens * 5 + split_tokens + num_splits)
    seq_lens = [600, 1, page_tokens + 1, 3000, 129, 48, 0, 4097, 200, page_tokens, 2048]
    rows = Rows(dev, rng, hq, hkv, head_dim, page_tokens, seq_lens, bound=PAGE_BOUNDS[bound])
    check_against_reference(rows, split_tokens, num_splits, *run_stream(dev, rows, split_tokens, num_splits))


def test_stream_row_is_batch_invariant(dev):
    """Row r's part_out / part_ml (used splits) and output, bit for bit: alone; at index 0, 37 and 63 of 64 rows
    whose neighbours have other contexts (1 to 4097), pages and queries; and with a launch of 64 rows into
    buffers of 80 (rows 64..79 keep their poison)."""
    hq, hkv, head_dim, page_tokens, split_tokens, num_splits = 32, 8, 128, 16, 64, 16
    for ctx in (1, 17, 128, 1000, 2048, 4097):
        rng = np.random.default_rng(ctx)
        alone = Rows(dev, rng, hq, hkv, head_dim, page_tokens, [ctx])
        po1, ml1, out1 = run_stream(dev, alone, split_tokens, num_splits)
        used = cdiv(ctx, ref.decode_split_len(ctx, split_tokens, num_splits))
        for index in (0, 37, 63):
            lens = rng.choice(RAGGED + [0], size=64)
            lens[index] = ctx
            batch = Rows(dev, rng, hq, hkv, head_dim, page_tokens, lens)
            # row `index` gets the lone row's q and K/V: its pages hold the lone row's cache pages' contents
            q = batch.q.copy()
            q[index] = alone.q[0]
            cache = batch.cache.copy()
            for i in range(cdiv(ctx, page_tokens)):
                cache[batch.table[index, i]] = alone.cache[alone.table[0, i]]
            batch.q, batch.cache = q, cache
            batch.d_q.upload(ref.bf16_bits(q))
            batch.d_cache.upload(ref.bf16_bits(cache))
            po, ml, out = run_stream(dev, batch, split_tokens, num_splits, extra_rows=16)
            assert np.array_equal(po[index, :, :used], po1[0, :, :used]), f"ctx {ctx} at {index}: part_out bits"
            assert np.array_equal(ml[index, :, :used], ml1[0, :, :used]), f"ctx {ctx} at {index}: part_ml bits"
            assert np.array_equal(out[index], out1[0]), f"ctx {ctx} at {index}: output bits"
            assert (po[64:] == POISON32).all() and (ml[64:] == POISON32).all(), "rows past the launch written"
            assert (out[64:] == 0xFFFF).all(), "output rows past the launch written"
            if ctx == 2048 and index == 37:  # (the float64 reference of 64 rows is slow: once)
                check_against_reference(batch, split_tokens, num_splits, po[:64], ml[:64], out[:64])
            dev.check_all_guards()


def test_stream_deferred_slot_row_gives_the_bits_of_a_plain_load(dev):
    """slot_mapping naming a row inside a split's first 64 tokens (whose chunks are then loaded after the PDL
    wait instead of by cp.async), the last token's row, a row of another page, or -1: the same bits."""
    hq, hkv, head_dim, page_tokens = 32, 8, 128, 16
    rng = np.random.default_rng(5)
    seq_lens = np.asarray([128, 1, 2048, 17, 600, 4097, 64], dtype=np.int32)
    rows = Rows(dev, rng, hq, hkv, head_dim, page_tokens, seq_lens)
    ref_bits = run_stream(dev, rows, 64, 16)
    t = rows.table
    pt = page_tokens

    def slot(s, pos):
        return int(t[s, pos // pt]) * pt + pos % pt

    for slots in ([slot(s, int(n) - 1) for s, n in enumerate(seq_lens)],   # the new token's row (the last)
                  [slot(s, 3) for s in range(len(seq_lens))],              # a row of the first tile
                  [slot(s, min(40, int(n) - 1)) for s, n in enumerate(seq_lens)],  # a second-tile row
                  [int(t[(s + 1) % len(seq_lens), 0]) * pt for s in range(len(seq_lens))]):  # another row's page
        rows.d_slots.upload(np.asarray(slots, dtype=np.int32))
        got = run_stream(dev, rows, 64, 16)
        for a, b, what in zip(got, ref_bits, ("part_out", "part_ml", "output")):
            assert np.array_equal(a, b), f"slots {slots[:3]}...: {what} bits differ from slot -1"


# ------------------------------------------------------------------------------- the early contract


def launch_ex(kernel, grid, block, args, stream, pdl):
    """cuLaunchKernelEx of a 3-D grid on `stream`, with the programmatic stream serialization attribute when
    `pdl` (the launch may start before the previous kernel ends; its griddepcontrol.wait orders the reads)."""
    holders = []
    for (kind, value), (_, size) in zip(args, kernel.params, strict=True):
        raw = struct.pack(_PACK[kind], int(value) if kind in "piq" else float(value))
        assert len(raw) == size, (kernel.name, kind, size)
        holders.append(ctypes.create_string_buffer(raw, len(raw)))
    pointers = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = (tuple(grid) + (1, 1))[:3]
    config.blockDimX, config.blockDimY, config.blockDimZ = (tuple(block) + (1, 1))[:3]
    config.sharedMemBytes = 0
    config.hStream = stream
    if pdl:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        config.attrs = [attr]
        config.numAttrs = 1
    else:
        config.numAttrs = 0
    check(cu.cuLaunchKernelEx(config, kernel.func, ctypes.addressof(pointers), 0), f"cuLaunchKernelEx({kernel.name})")


@pytest.mark.parametrize("hq,hkv,head_dim,page_tokens", [(32, 8, 128, 16), (40, 8, 128, 16), (4, 2, 64, 4)])
def test_stream_after_the_rope_kernel_serial_and_under_pdl(dev, hq, hkv, head_dim, page_tokens):
    """kern_qk_norm_rope_kv writes q and each row's new K/V at slot_mapping (the row's last position; one slot -1,
    one past num_pages * page_tokens: no write), then the stream partial and the reduce. Serially: the output
    against the float64 reference of the whole chain. Under PDL (each launch may start before the one before it
    ends; the partial reads the block table and first K/V tiles before its wait), with q and the slot rows
    poisoned (NaN) before each run: bit for bit the serial bits, 8 times."""
    rng = np.random.default_rng(hq + head_dim + page_tokens)
    max_pos, split_tokens, num_splits, eps = 8192, 64, 16, 1e-6
    seq_lens = np.asarray([128, 1, 4097, 17, 600, 2048, 40, 33, 1000, 64] * 4, dtype=np.int32)
    seqs = len(seq_lens)
    cache, table = make_paged_cache(rng, page_tokens, hkv, head_dim, seq_lens, spare_pages=3, spare_cols=2)
    bt_stride, num_pages = table.shape[1], cache.shape[0]
    positions = (seq_lens - 1).astype(np.int32)
    slots = np.array([table[s, p // page_tokens] * page_tokens + p % page_tokens for s, p in enumerate(positions)],
                     dtype=np.int32)
    slots[6] = -1
    slots[7] = num_pages * page_tokens
    width = (hq + 2 * hkv) * head_dim
    qkv = rand_bf16(rng, (seqs, width), scale=2.0)
    q_w = ref.bf16_round((1.0 + 0.3 * rng.standard_normal(head_dim)).astype(np.float32))
    k_w = ref.bf16_round((1.0 + 0.3 * rng.standard_normal(head_dim)).astype(np.float32))
    rope = ref.rope_table(max_pos, head_dim, 1000000.0)
    scale = head_dim**-0.5
    d_qkv, d_qw, d_kw = dev.array(ref.bf16_bits(qkv)), dev.array(ref.bf16_bits(q_w)), dev.array(ref.bf16_bits(k_w))
    d_rope, d_pos, d_slots = dev.array(rope), dev.array(positions), dev.array(slots)
    d_bt, d_lens = dev.array(table), dev.array(seq_lens)
    d_cache, d_q = dev.alloc(cache.nbytes), dev.alloc(seqs * hq * head_dim * 2)
    part = seqs * hq * num_splits
    d_po, d_ml, d_out = dev.alloc(part * head_dim * 4), dev.alloc(part * 2 * 4), dev.alloc(seqs * hq * head_dim * 2)
    poisoned = ref.bf16_bits(cache).reshape(num_pages, 2, page_tokens, hkv, head_dim).copy()
    for s in range(seqs):
        if 0 <= slots[s] < num_pages * page_tokens:
            poisoned[slots[s] // page_tokens, :, slots[s] % page_tokens] = 0xFFFF  # NaN until the rope writes it
    rope_k = dev.kernel("kern_qk_norm_rope_kv")
    part_k, red_k = stream_kernel(dev), dev.kernel("kern_attn_decode_reduce")
    stream = check(cu.cuStreamCreate(0), "cuStreamCreate")

    def chain(pdl):
        d_cache.upload(poisoned)
        for buf in (d_q, d_po, d_ml, d_out):
            buf.poison()
        check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        launch_ex(rope_k, (seqs, hq + hkv), (head_dim,),
                  [("p", d_qkv.ptr), ("p", d_qw.ptr), ("p", d_kw.ptr), ("p", d_rope.ptr), ("p", d_pos.ptr),
                   ("p", d_slots.ptr), ("p", d_q.ptr), ("p", d_cache.ptr), ("i", seqs), ("i", hq), ("i", hkv),
                   ("i", head_dim), ("i", page_tokens), ("i", max_pos), ("i", num_pages), ("f", eps)], stream, pdl)
        launch_ex(part_k, (hkv, num_splits, seqs), (THREADS,),
                  [("p", d_q.ptr), ("p", d_cache.ptr), ("p", d_bt.ptr), ("p", d_lens.ptr), ("p", d_slots.ptr),
                   ("p", d_po.ptr), ("p", d_ml.ptr), ("i", hq), ("i", hkv), ("i", head_dim), ("i", page_tokens),
                   ("i", bt_stride), ("i", num_pages), ("i", split_tokens), ("i", num_splits), ("f", scale)],
                  stream, pdl)
        launch_ex(red_k, (hq, seqs), (head_dim,),
                  [("p", d_po.ptr), ("p", d_ml.ptr), ("p", d_lens.ptr), ("p", d_out.ptr), ("i", hq), ("i", head_dim),
                   ("i", split_tokens), ("i", num_splits)], stream, pdl)
        check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
        return d_out.download(np.uint16, (seqs, hq * head_dim)), d_ml.download(np.uint32, part * 2)

    try:
        serial_out, serial_ml = chain(pdl=False)
        want_q = np.zeros((seqs, hq, head_dim), dtype=np.float32)
        want_cache = ref.from_bf16_bits(poisoned)  # the slots the rope kernel skips keep their poison ...
        in_range = np.where((slots >= 0) & (slots < num_pages * page_tokens), slots, -1).astype(np.int32)
        ref.qk_norm_rope_kv(qkv, q_w, k_w, rope, positions, in_range, want_q, want_cache, hq, hkv, head_dim, eps)
        want = ref.attn_decode(ref.bf16_round(want_q), want_cache, table, seq_lens, scale)
        got = ref.from_bf16_bits(serial_out)
        for s in range(seqs):
            assert_close(f"row {s} (ctx {seq_lens[s]})", got[s], want[s], elem_rel=2.0**-5, elem_abs=8e-3)
        for attempt in range(8):
            out, ml = chain(pdl=True)
            assert np.array_equal(out, serial_out), f"PDL chain (try {attempt}): output differs from the serial run"
            assert np.array_equal(ml, serial_ml), f"PDL chain (try {attempt}): part_ml differs from the serial run"
    finally:
        check(cu.cuStreamDestroy(stream), "cuStreamDestroy")


# ---------------------------------------------------------------------------------------- the limits


def test_stream_writes_nothing_outside_its_limits(dev):
    """A block smaller than the entry's (WRONG: 32 or 48 threads for stream's 64, 16 or 24 for gqa's 32; more the
    driver refuses, __launch_bounds__),
    head_dim 72 (not a multiple of 16) or 256, a cache pointer 2 bytes off 16-byte
    alignment, num_pages one past the 32-bit row bound: part_out and part_ml keep their poison (the reduce then
    reads poison: the output is not checked). A q pointer 2 bytes off alignment gives the aligned launch's bits."""
    rng = np.random.default_rng(11)
    hq, hkv, head_dim, page_tokens, split_tokens, num_splits = 8, 2, 64, 16, 16, 8
    rows = Rows(dev, rng, hq, hkv, head_dim, page_tokens, [300, 1, 0, 77])

    def untouched(po, ml, what):
        assert (po == POISON32).all(), f"{what}: part_out written"
        assert (ml == POISON32).all(), f"{what}: part_ml written"

    for block in WRONG:
        po, ml, _ = run_stream(dev, rows, split_tokens, num_splits, block=block)
        untouched(po, ml, f"block {block}")
    for d in (72, 256):
        po, ml, _ = run_stream(dev, rows, split_tokens, num_splits, head_dim=d)
        untouched(po, ml, f"head_dim {d}")
    # the same cache contents 2 bytes past a 16-byte boundary
    d_off = dev.alloc(rows.cache.nbytes + 16)
    raw = np.zeros(rows.cache.size + 8, dtype=np.uint16)
    raw[1:1 + rows.cache.size] = ref.bf16_bits(rows.cache).reshape(-1)
    d_off.upload(raw)
    po, ml, _ = run_stream(dev, rows, split_tokens, num_splits, cache_ptr=d_off.ptr + 2)
    untouched(po, ml, "cache 2 bytes off alignment")
    limit = I32_MAX // (2 * page_tokens)
    po, ml, _ = run_stream(dev, rows, split_tokens, num_splits, num_pages=limit + 1)
    untouched(po, ml, "num_pages past the 32-bit row bound")
    # num_pages at the bound still works (block-table entries at or past it, and negative ones, masked)
    limit_rows = Rows(dev, rng, hq, hkv, head_dim, page_tokens, [300, 1, 0, 77], bound=lambda cache_pages: limit)
    check_against_reference(limit_rows, split_tokens, num_splits, *run_stream(dev, limit_rows, split_tokens, num_splits))
    # an unaligned q
    d_q_off = dev.alloc(rows.q.nbytes // 2 + 16)
    raw_q = np.zeros(rows.q.size + 8, dtype=np.uint16)
    raw_q[1:1 + rows.q.size] = ref.bf16_bits(rows.q).reshape(-1)
    d_q_off.upload(raw_q)
    aligned = run_stream(dev, rows, split_tokens, num_splits)
    unaligned = run_stream(dev, rows, split_tokens, num_splits, q_ptr=d_q_off.ptr + 2)
    for a, b, what in zip(aligned, unaligned, ("part_out", "part_ml", "output")):
        assert np.array_equal(a, b), f"unaligned q: {what} bits differ"
    check_against_reference(rows, split_tokens, num_splits, *aligned)

