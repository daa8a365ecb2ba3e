"""GPU tests of kern's kernels: each entry launched from its BUILT cubin (kernels/kernels.json) through
cuda.bindings.driver and compared with tools/reference_kernels.py on fresh random inputs.

Outputs are poisoned (0xFF bytes: NaN) before each launch, so an unwritten element fails; every device
buffer has poisoned guard regions, checked after each test, so an out-of-bounds write fails.
Run on the GPU machine:  KERN_REQUIRE_GPU=1 python -m pytest tests/kernels -q
"""

from __future__ import annotations


import numpy as np
import pytest

pytestmark = pytest.mark.gpu


from kern_run.models.qwen3 import (
    KERNEL_SIGNATURES, PREFILL_ATTN, PREFILL_WG_HEAD_DIMS, prefill_rows_per_block, rope_warp_heads,
)
from tools import reference_kernels as ref

BF = np.uint16  # device representation of bf16


def rand_bf16(rng, shape, scale=1.0):
    """bf16-valued float32 array (normal * scale)."""
    return ref.bf16_round((rng.standard_normal(shape) * scale).astype(np.float32))


def cdiv(a, b):
    return -(-a // b)


def assert_close(name, out, expect, rel=1e-2, elem_rel=2.0**-6, elem_abs=1e-6):
    """||out-ref||/||ref|| < rel, and |out-ref| <= elem_rel*|ref| + elem_abs*max|ref| per element; no NaN."""
    out = np.asarray(out, dtype=np.float64)
    expect = np.asarray(expect, dtype=np.float64)
    assert out.shape == expect.shape, (name, out.shape, expect.shape)
    nan = np.isnan(out) & ~np.isnan(expect)
    assert not nan.any(), f"{name}: {nan.sum()} NaN elements (unwritten?), first at {np.argwhere(nan)[0].tolist()}"
    denom = np.linalg.norm(expect)
    err = np.linalg.norm(out - expect) / (denom if denom > 0 else 1.0)
    assert err < rel, f"{name}: relative error {err:.3e} >= {rel}"
    scale = np.abs(expect).max() if expect.size else 0.0
    bad = np.abs(out - expect) > elem_rel * np.abs(expect) + elem_abs * scale
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(
            f"{name}: {bad.sum()} of {bad.size} elements off, first {list(i)}: got {out[i]!r} want {expect[i]!r} (rel err {err:.2e})"
        )


# ------------------------------------------------------------------------------------------ embed


@pytest.mark.parametrize("n_tokens,hidden,vocab", [(5, 64, 50), (7, 2560, 1000), (4, 37, 20)])
def test_embed_gather(dev, n_tokens, hidden, vocab):
    rng = np.random.default_rng(1000 + hidden)
    table = rand_bf16(rng, (vocab, hidden))
    ids = rng.integers(0, vocab, n_tokens).astype(np.int32)
    ids[0] = vocab - 1
    ids[1] = -1  # out of range: zeros
    ids[-1] = vocab  # out of range: zeros
    d_table, d_ids = dev.array(ref.bf16_bits(table)), dev.array(ids)
    d_out = dev.alloc(n_tokens * hidden * 2)
    d_out.poison()
    dev.kernel("kern_embed_gather").launch(
        (n_tokens,), (256,), [("p", d_table.ptr), ("p", d_ids.ptr), ("p", d_out.ptr), ("i", n_tokens), ("i", hidden), ("i", vocab)]
    )
    out = ref.from_bf16_bits(d_out.download(BF, (n_tokens, hidden)))
    np.testing.assert_array_equal(out, ref.embed_gather(table, ids))


# ------------------------------------------------------------------------------------------- norm


@pytest.mark.parametrize("with_delta", [True, False])
@pytest.mark.parametrize("n_tokens,hidden", [(1, 64), (3, 2560), (17, 2560), (5, 37), (2, 4096)])
def test_add_rmsnorm(dev, n_tokens, hidden, with_delta):
    rng = np.random.default_rng(hidden * 7 + n_tokens)
    row_scale = np.array([1e-3, 1.0, 50.0] * n_tokens)[:n_tokens, None]  # variance extremes per row
    residual = ref.bf16_round((rng.standard_normal((n_tokens, hidden)) * row_scale).astype(np.float32))
    delta = rand_bf16(rng, (n_tokens, hidden)) * np.float32(row_scale) if with_delta else None
    if delta is not None:
        delta = ref.bf16_round(delta)
    weight = ref.bf16_round((1.0 + 0.2 * rng.standard_normal(hidden)).astype(np.float32))
    eps = 1e-6
    d_res = dev.array(ref.bf16_bits(residual))
    d_delta = dev.array(ref.bf16_bits(delta)) if delta is not None else None
    d_w = dev.array(ref.bf16_bits(weight))
    d_out = dev.alloc(n_tokens * hidden * 2)
    d_out.poison()
    dev.kernel("kern_add_rmsnorm").launch(
        (n_tokens,),
        (256,),
        [("p", d_res.ptr), ("p", d_delta.ptr if d_delta else 0), ("p", d_w.ptr), ("p", d_out.ptr),
         ("i", n_tokens), ("i", hidden), ("f", eps)],
    )
    want_res, want_out = ref.add_rmsnorm(residual, delta, weight, eps)
    got_res = ref.from_bf16_bits(d_res.download(BF, (n_tokens, hidden)))
    np.testing.assert_array_equal(got_res, want_res, err_msg="residual (bf16(residual + delta)) differs")
    got = ref.from_bf16_bits(d_out.download(BF, (n_tokens, hidden)))
    for t in range(n_tokens):  # per row: rows have very different scales
        assert_close(f"rmsnorm row {t}", got[t], want_out[t])


# ------------------------------------------------------------------------------------------- rope


# llama3: (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings) of Llama 3.2 (factor 32) and
# 3.1 (factor 8), kern_rope_table_llama3; None: kern_rope_table
@pytest.mark.parametrize("max_pos,head_dim,theta,llama3", [(64, 32, 10000.0, None), (4096, 128, 1000000.0, None),
                                                           (4096, 64, 500000.0, (32.0, 1.0, 4.0, 8192)),
                                                           (4096, 128, 500000.0, (8.0, 1.0, 4.0, 8192))])
def test_rope_table(dev, max_pos, head_dim, theta, llama3):
    d_rope = dev.alloc(max_pos * head_dim * 4)
    d_rope.poison()
    extra = [] if llama3 is None else [("f", float(v)) for v in llama3]
    dev.kernel("kern_rope_table" if llama3 is None else "kern_rope_table_llama3").launch(
        (max_pos,), (head_dim // 2,), [("p", d_rope.ptr), ("i", max_pos), ("i", head_dim), ("f", theta), *extra]
    )
    got = d_rope.download(np.float32, (max_pos, head_dim))
    want = ref.rope_table(max_pos, head_dim, theta, llama3)
    assert not np.isnan(got).any(), "rope table has unwritten (NaN) entries"
    # One bf16 ulp of a value <= 1 is <= 2^-8; allow a rounding flip when cos/sin sit near a tie, and
    # the fp32 angle's own error at large positions (p * f_i rounded in fp32, as in transformers).
    diff = np.abs(got.astype(np.float64) - want)
    assert diff.max() <= 2.0**-7, f"rope table max |diff| {diff.max():.3e} at {np.unravel_index(diff.argmax(), diff.shape)}"
    # powf may differ from numpy's float32 power by an ulp; that moves angles by ~1e-4 at p ~ 4k and
    # flips a few bf16 roundings, never more than one ulp (checked above).
    assert (diff > 0).mean() < 0.1, f"{(diff > 0).mean():.2%} of rope entries differ from the reference"


# entry -> (launch of n tokens x heads: grid, block); kern_qk_norm_rope_kv_warp (head_dim a multiple of 64, at most
# 256; head_dim / 8 lanes per head: several heads per warp at head_dim <= 128, an idle quarter at 192) must equal
# kern_qk_norm_rope_kv bit for bit, with the generator's grid and with a larger one
ROPE_ENTRIES = {
    "kern_qk_norm_rope_kv": lambda n, heads, d: ((n, heads), (d,)),
    "kern_qk_norm_rope_kv_warp": lambda n, heads, d: ((n, cdiv(heads, rope_warp_heads(d))), (256,)),
    # one warp per head, the grid of the earlier contract: larger than needed, the extra heads exit
    "kern_qk_norm_rope_kv_warp/wide": lambda n, heads, d: ((n, cdiv(heads, 8)), (256,)),
}


# which norm weights are passed (the others null): both (Qwen3), none (Llama: rope + K/V write only), k only
ROPE_NORMS = {"qk": (True, True), "none": (False, False), "k": (False, True)}


@pytest.mark.parametrize("norms", sorted(ROPE_NORMS))
@pytest.mark.parametrize("entry", sorted(ROPE_ENTRIES))
@pytest.mark.parametrize(
    "hq,hkv,head_dim,page_tokens",
    [(4, 2, 32, 4), (4, 2, 64, 16), (4, 2, 128, 16), (32, 8, 128, 16), (6, 3, 256, 16), (5, 1, 192, 8),
     (32, 8, 64, 16), (24, 8, 128, 16)],  # Llama-3.2-1B and -3B
)
def test_qk_norm_rope_kv(dev, entry, hq, hkv, head_dim, page_tokens, norms):
    """Against the float64 reference; the warp entry also against the block entry, bit for bit (q and cache).
    head_dim 32 (not a multiple of 64): the warp entry writes nothing. A null norm weight leaves that head kind
    unnormalized (exactly the reference's rope then: no rsqrtf)."""
    rng = np.random.default_rng(hq * 1000 + head_dim + page_tokens)
    n_tokens, max_pos, num_pages, eps = 11, 512, 6, 1e-6
    num_slots = num_pages * page_tokens
    width = (hq + 2 * hkv) * head_dim
    qkv = rand_bf16(rng, (n_tokens, width), scale=3.0)
    q_w = ref.bf16_round((1.0 + 0.3 * rng.standard_normal(head_dim)).astype(np.float32))
    k_w = ref.bf16_round((1.0 + 0.3 * rng.standard_normal(head_dim)).astype(np.float32))
    rope = ref.rope_table(max_pos, head_dim, 1000000.0)
    positions = rng.integers(0, max_pos, n_tokens).astype(np.int32)
    positions[0], positions[1] = max_pos - 1, 0
    positions[2] = max_pos  # out of range: no writes at all for this token
    # distinct slots (two tokens writing one slot would race); the last slot is placed explicitly below
    slots = rng.permutation(num_slots - 1)[:n_tokens].astype(np.int32)
    slots[3] = num_slots  # out of range: q written, K/V not
    slots[4] = -5
    slots[5] = num_slots - 1  # last slot of the last page
    cache = rand_bf16(rng, (num_pages, 2, page_tokens, hkv, head_dim))  # prior contents must survive
    d_qkv, d_qw, d_kw = dev.array(ref.bf16_bits(qkv)), dev.array(ref.bf16_bits(q_w)), dev.array(ref.bf16_bits(k_w))
    use_q, use_k = ROPE_NORMS[norms]
    d_rope, d_pos, d_slots = dev.array(rope), dev.array(positions), dev.array(slots)
    d_q = dev.alloc(n_tokens * hq * head_dim * 2)
    d_q.poison()
    d_cache = dev.array(ref.bf16_bits(cache))

    def launch(name, q_buf, cache_buf):
        grid, block = ROPE_ENTRIES[name](n_tokens, hq + hkv, head_dim)
        dev.kernel(name.split("/")[0]).launch(
            grid, block,
            [("p", d_qkv.ptr), ("p", d_qw.ptr if use_q else 0), ("p", d_kw.ptr if use_k else 0), ("p", d_rope.ptr),
             ("p", d_pos.ptr),
             ("p", d_slots.ptr), ("p", q_buf.ptr), ("p", cache_buf.ptr), ("i", n_tokens), ("i", hq), ("i", hkv),
             ("i", head_dim), ("i", page_tokens), ("i", max_pos), ("i", num_pages), ("f", eps)],
        )

    launch(entry, d_q, d_cache)
    if entry.startswith("kern_qk_norm_rope_kv_warp") and head_dim % 64:
        assert (d_q.download(np.uint8, (n_tokens * hq * head_dim * 2,)) == 0xFF).all(), "q written"
        np.testing.assert_array_equal(d_cache.download(BF, cache.shape), ref.bf16_bits(cache))
        return
    if entry != "kern_qk_norm_rope_kv":
        d_q0, d_cache0 = dev.alloc(n_tokens * hq * head_dim * 2), dev.array(ref.bf16_bits(cache))
        d_q0.poison()
        launch("kern_qk_norm_rope_kv", d_q0, d_cache0)
        np.testing.assert_array_equal(d_q.download(BF, (n_tokens, hq, head_dim)),
                                      d_q0.download(BF, (n_tokens, hq, head_dim)), err_msg=f"{entry} q != block entry")
        np.testing.assert_array_equal(d_cache.download(BF, cache.shape), d_cache0.download(BF, cache.shape),
                                      err_msg=f"{entry} cache != block entry")
    want_q = np.full((n_tokens, hq, head_dim), np.nan, dtype=np.float32)
    want_cache = cache.copy()
    ref.qk_norm_rope_kv(qkv, q_w if use_q else None, k_w if use_k else None, rope, positions, slots, want_q,
                        want_cache, hq, hkv, head_dim, eps)
    got_q = ref.from_bf16_bits(d_q.download(BF, (n_tokens, hq, head_dim)))
    assert np.isnan(got_q[2]).all(), "q of a token with an out-of-range position was written"
    keep = [t for t in range(n_tokens) if t != 2]
    # RoPE can cancel (y = n*cos - n'*sin near 0): a one-ulp flip in n is absolute, hence elem_abs.
    assert_close("q_out", got_q[keep], want_q[keep], elem_abs=2.0**-6)
    if not use_q:  # no norm: every operation is the reference's
        np.testing.assert_array_equal(got_q[keep], want_q[keep], err_msg="q without a norm differs")
    got_cache = ref.from_bf16_bits(d_cache.download(BF, cache.shape))
    written = np.zeros(cache.shape[:3], dtype=bool)  # [page, k/v, offset]
    for t in keep:
        if 0 <= slots[t] < num_slots:
            written[slots[t] // page_tokens, :, slots[t] % page_tokens] = True
    np.testing.assert_array_equal(got_cache[~written], cache[~written], err_msg="cache slots not addressed were modified")
    assert_close("kv_cache written slots", got_cache[written], want_cache[written], elem_abs=2.0**-6)
    if not use_k:
        np.testing.assert_array_equal(got_cache[written], want_cache[written], err_msg="K without a norm differs")
    v_written = written.copy()
    v_written[:, 0] = False
    np.testing.assert_array_equal(got_cache[v_written], want_cache[v_written], err_msg="V copy not exact")


# -------------------------------------------------------------------------------------------- act


@pytest.mark.parametrize("n_tokens,inter", [(1, 64), (5, 9728), (3, 37), (2, 1030)])
def test_silu_mul(dev, n_tokens, inter):
    rng = np.random.default_rng(inter + n_tokens)
    gate_up = rand_bf16(rng, (n_tokens, 2 * inter), scale=4.0)
    d_in = dev.array(ref.bf16_bits(gate_up))
    d_out = dev.alloc(n_tokens * inter * 2)
    d_out.poison()
    dev.kernel("kern_silu_mul").launch(
        (n_tokens, cdiv(inter, 1024)), (256,), [("p", d_in.ptr), ("p", d_out.ptr), ("i", n_tokens), ("i", inter)]
    )
    got = ref.from_bf16_bits(d_out.download(BF, (n_tokens, inter)))
    assert_close("silu_mul", got, ref.silu_mul(gate_up))


# -------------------------------------------------------------------------------------- attention


def make_paged_cache(rng, page_tokens, hkv, head_dim, seq_lens, spare_pages, spare_cols):
    """Random cache and a shuffled (non-identity) block table giving each sequence its own pages. The cache holds
    the pages the contexts need plus `spare_pages` (never in the table); the table is as wide as the longest
    context's pages plus `spare_cols` entries of -1 (its bt_stride is block_table.shape[1])."""
    num_pages = sum(cdiv(int(n), page_tokens) for n in seq_lens) + spare_pages
    bt_stride = cdiv(max(int(max(seq_lens)), 1), page_tokens) + spare_cols
    cache = rand_bf16(rng, (num_pages, 2, page_tokens, hkv, head_dim))
    perm = rng.permutation(num_pages)
    block_table = np.full((len(seq_lens), bt_stride), -1, dtype=np.int32)
    used = 0
    for s, n in enumerate(seq_lens):
        need = cdiv(n, page_tokens)
        block_table[s, :need] = perm[used : used + need]
        used += need
    assert used <= num_pages
    return cache, block_table


I32_MAX = 2**31 - 1


def absent_page_ids(num_pages, cache_pages):
    """Page ids the attention kernels must treat as absent under the bound `num_pages` (the cache array holds
    `cache_pages >= num_pages` pages): the bound itself and the next id (real pages past the bound when the
    cache has them: read, they would change the result), the first id past the cache array (its poisoned
    guard: read, it would give NaN) and one further, huge ids (read, they would fault), negative ids."""
    ids = [num_pages, num_pages + 1, cache_pages, cache_pages + 7, 2**30, I32_MAX, -1, -7, -(2**31)]
    return [i for i in ids if (i < 0 or i >= num_pages) and -(2**31) <= i <= I32_MAX]  # block tables are i32


def bound_pages(rng, block_table, seq_lens, page_tokens, cache_pages, bound):
    """(num_pages, block table) for a kernel launch: `bound` None: the cache's page count and the intact table;
    else num_pages = bound(cache_pages) and the table corrupted by corrupt_block_table."""
    if bound is None:
        return cache_pages, block_table
    num_pages = bound(cache_pages)
    return num_pages, corrupt_block_table(rng, block_table, seq_lens, page_tokens, num_pages, cache_pages)


def corrupt_block_table(rng, block_table, seq_lens, page_tokens, num_pages, cache_pages):
    """A copy of `block_table` whose entries the context reads partly lie outside [0, num_pages): sequence 0
    loses every page; then, by s % 4: 1 the first and the last (partial) page, 2 every third page and the
    middle one, 3 a random quarter of its pages, 0 none (and its first entry becomes the last valid page,
    num_pages - 1, when the cache array holds it). Entries past the context get I32_MAX (never read)."""
    table = block_table.copy()
    bad = absent_page_ids(num_pages, cache_pages)
    for s, n in enumerate(seq_lens):
        need = cdiv(max(int(n), 0), page_tokens)
        table[s, need:] = I32_MAX
        if need == 0:
            continue
        if s == 0:
            hit = list(range(need))
        elif s % 4 == 1:
            hit = sorted({0, need - 1})
        elif s % 4 == 2:
            hit = sorted(set(range(1, need, 3)) | {need // 2})
        elif s % 4 == 3:
            hit = sorted(rng.choice(need, size=max(1, need // 4), replace=False).tolist())
        else:
            hit = []
            if 0 < num_pages <= cache_pages:
                table[s, 0] = num_pages - 1
        for j, i in enumerate(hit):
            table[s, i] = bad[(s + j) % len(bad)]
    return table


ATTN_CONFIGS = [(4, 2, 32, 4), (4, 2, 64, 16), (4, 2, 128, 16), (8, 1, 128, 16), (32, 8, 128, 16), (4, 2, 96, 16)]
# prefill also: groups of 1 (64 query rows per block with kern_attn_prefill, 128 with kern_attn_prefill_r32 and the
# wgmma entry) and 3 (a pass of 4 warps with one idle)
# (and pages of 4 and 64 tokens at the wgmma entry's head_dims)
PREFILL_CONFIGS = ATTN_CONFIGS + [(4, 4, 128, 16), (6, 2, 64, 16), (4, 2, 64, 4), (8, 1, 128, 64),
                                  (40, 8, 128, 16), (64, 8, 128, 16)]  # Qwen3-14B (group 5) and -32B (group 8)


def run_attn_decode(dev, rng, hq, hkv, head_dim, page_tokens, seq_lens, split_tokens, num_splits,
                    partial="kern_attn_decode_partial", bound=None):
    """Launch kern_attn_decode_partial + kern_attn_decode_reduce with one fixed launch shape (num_splits,
    split_tokens: as a captured graph would) over sequences of the given lengths; check the partials
    against ref.attn_decode_partials (split lengths derived from seq_lens, empty splits (-inf, 0) and
    zero rows) and the output against ref.attn_decode.

    `bound` None: num_pages = the cache's page count and an intact block table. Else the kernel gets
    num_pages = bound(cache_pages) and a block table corrupted by corrupt_block_table: every entry outside
    [0, num_pages) must read as absent (masked), exactly as the reference masks it."""
    seq_lens = np.asarray(seq_lens, dtype=np.int32)
    seqs = len(seq_lens)
    cache, block_table = make_paged_cache(rng, page_tokens, hkv, head_dim, seq_lens, spare_pages=3, spare_cols=2)
    bt_stride = block_table.shape[1]
    num_pages, block_table = bound_pages(rng, block_table, seq_lens, page_tokens, cache.shape[0], bound)
    q = rand_bf16(rng, (seqs, hq, head_dim))
    q[-1] *= 8.0  # a peaky softmax for the last sequence
    q = ref.bf16_round(q)
    scale = head_dim**-0.5
    d_q = dev.array(ref.bf16_bits(q))
    d_cache = dev.array(ref.bf16_bits(cache))
    d_bt, d_lens = dev.array(block_table), dev.array(seq_lens)
    d_po = dev.alloc(seqs * hq * num_splits * head_dim * 4)
    d_ml = dev.alloc(seqs * hq * num_splits * 2 * 4)
    d_out = dev.alloc(seqs * hq * head_dim * 2)
    for b in (d_po, d_ml, d_out):
        b.poison()
    dev.kernel(partial).launch(
        (hkv, num_splits, seqs),
        (128,),
        [("p", d_q.ptr), ("p", d_cache.ptr), ("p", d_bt.ptr), ("p", d_lens.ptr), ("p", d_po.ptr), ("p", d_ml.ptr),
         ("i", hq), ("i", hkv), ("i", head_dim), ("i", page_tokens), ("i", bt_stride), ("i", num_pages),
         ("i", split_tokens), ("i", num_splits), ("f", scale)],
    )
    ml = d_ml.download(np.float32, (seqs, hq, num_splits, 2))
    po = d_po.download(np.float32, (seqs, hq, num_splits, head_dim))
    assert not np.isnan(ml).any(), "part_ml has unwritten entries"
    assert not np.isnan(po).any(), "part_out has unwritten entries"
    want_po, want_ml = ref.attn_decode_partials(q, cache, block_table, seq_lens, scale, split_tokens, num_splits,
                                                num_pages=num_pages)
    for s, n in enumerate(seq_lens):
        length = ref.decode_split_len(int(n), split_tokens, num_splits)
        empty = np.arange(num_splits) * length >= n
        # splits with tokens but none of them with a page (the reference masks per token, so per split)
        dead = ~empty & np.isneginf(want_ml[s, 0, :, 0])
        live = ~empty & ~dead
        assert np.array_equal(np.isneginf(want_ml[s, :, :, 0]), np.broadcast_to(empty | dead, (hq, num_splits))), \
            f"seq {s}: reference split layout"
        assert num_splits * length >= n, f"seq {s}: splits do not cover the context"
        for what, split in (("empty", empty), ("all-absent", dead)):
            assert (ml[s, :, split, 0] == -np.inf).all() and (ml[s, :, split, 1] == 0).all(), f"seq {s}: {what} split ml"
            assert (po[s, :, split] == 0).all(), f"seq {s}: {what} split part_out not zero"
        if live.any():
            assert (ml[s, :, live, 1] >= 1.0 - 1e-6).all(), f"seq {s}: non-empty split with sum of exp < 1"
            got_m, want_m = ml[s, :, live, 0].astype(np.float64), want_ml[s, :, live, 0]
            assert np.all(np.abs(got_m - want_m) <= 1e-4 * (1.0 + np.abs(want_m))), f"seq {s}: split max m differs"
            assert_close(f"decode seq {s} (ctx {n}) split sums l", ml[s, :, live, 1], want_ml[s, :, live, 1],
                         rel=1e-3, elem_rel=1e-3, elem_abs=0.0)
            assert_close(f"decode seq {s} (ctx {n}) part_out", po[s][:, live], want_po[s][:, live],
                         rel=1e-3, elem_rel=1e-3, elem_abs=1e-4)
    dev.kernel("kern_attn_decode_reduce").launch(
        (hq, seqs),
        (head_dim,),
        [("p", d_po.ptr), ("p", d_ml.ptr), ("p", d_lens.ptr), ("p", d_out.ptr), ("i", hq), ("i", head_dim),
         ("i", split_tokens), ("i", num_splits)],
    )
    got = ref.from_bf16_bits(d_out.download(BF, (seqs, hq * head_dim)))
    want = ref.attn_decode(q, cache, block_table, seq_lens, scale, num_pages=num_pages)
    for s in range(seqs):
        if seq_lens[s] <= 0 or not ref.kv_present(block_table[s], int(seq_lens[s]), page_tokens, num_pages).any():
            assert (got[s] == 0).all(), f"decode seq {s} (ctx {seq_lens[s]}, no token with a page): output not zero"
            continue
        assert_close(f"decode seq {s} (ctx {seq_lens[s]})", got[s], want[s], elem_rel=2.0**-6, elem_abs=4e-3)


@pytest.mark.parametrize("hq,hkv,head_dim,page_tokens", ATTN_CONFIGS)
@pytest.mark.parametrize("split_tokens", [64, 96, 512])
def test_attn_decode(dev, hq, hkv, head_dim, page_tokens, split_tokens):
    rng = np.random.default_rng(hq * 31 + head_dim + page_tokens + split_tokens)
    seq_lens = [1, page_tokens - 1, page_tokens, page_tokens + 1, 3000, 200]
    num_splits = cdiv(max(seq_lens), split_tokens) + 1  # one split past every context
    run_attn_decode(dev, rng, hq, hkv, head_dim, page_tokens, seq_lens, split_tokens, num_splits)


# (split_tokens = minimum split length, num_splits = launch constant): contexts much longer than
# num_splits * split_tokens (splits grow to cdiv(n, num_splits) rounded up to 16), much shorter (only the
# first split is used), a single split, the generator's shape (32 splits of at least 16 tokens).
DECODE_SPLITS = [(16, 32), (16, 1), (64, 4), (512, 40), (32, 7), (96, 3)]


@pytest.mark.parametrize("hq,hkv,head_dim,page_tokens", [(32, 8, 128, 16), (4, 2, 32, 4), (8, 1, 128, 16), (4, 2, 64, 16)])
@pytest.mark.parametrize("split_tokens,num_splits", DECODE_SPLITS)
def test_attn_decode_split_semantics(dev, hq, hkv, head_dim, page_tokens, split_tokens, num_splits):
    rng = np.random.default_rng(hq * 7 + head_dim + page_tokens + split_tokens * 3 + num_splits)
    seq_lens = [1, page_tokens - 1, page_tokens + 1, 3000, 0, 129, 4096, 200]
    run_attn_decode(dev, rng, hq, hkv, head_dim, page_tokens, seq_lens, split_tokens, num_splits)


# kern_attn_decode_partial_fast: the same contract (every check of run_attn_decode) ...
@pytest.mark.parametrize("hq,hkv,head_dim,page_tokens", [(32, 8, 128, 16), (4, 2, 32, 4), (8, 1, 128, 16), (4, 2, 96, 16),
                                                         (4, 4, 64, 16), (6, 2, 64, 16)])
@pytest.mark.parametrize("split_tokens,num_splits", DECODE_SPLITS)
def test_attn_decode_partial_fast(dev, hq, hkv, head_dim, page_tokens, split_tokens, num_splits):
    if "kern_attn_decode_partial_fast" not in dev.meta["modules"]["attention"]["entries"]:
        pytest.skip("kern_attn_decode_partial_fast not built")
    rng = np.random.default_rng(hq * 5 + head_dim + page_tokens + split_tokens * 3 + num_splits)
    seq_lens = [1, page_tokens - 1, page_tokens + 1, 3000, 0, 129, 4096, 200, 128]
    run_attn_decode(dev, rng, hq, hkv, head_dim, page_tokens, seq_lens, split_tokens, num_splits,
                    partial="kern_attn_decode_partial_fast")


# ... and bit for bit the old entry's partials (same math in the same order; only the load order and the
# empty-split path differ), poisoned outputs, the generator's launch (32 splits of >= 16) among others.
@pytest.mark.parametrize("hq,hkv,head_dim,page_tokens", [(32, 8, 128, 16), (4, 2, 32, 4), (6, 2, 64, 16), (4, 2, 96, 16)])
@pytest.mark.parametrize("split_tokens,num_splits", [(16, 32), (64, 4), (32, 7)])
@pytest.mark.parametrize("absent_pages", [False, True])
def test_attn_decode_partial_fast_bitwise(dev, hq, hkv, head_dim, page_tokens, split_tokens, num_splits, absent_pages):
    if "kern_attn_decode_partial_fast" not in dev.meta["modules"]["attention"]["entries"]:
        pytest.skip("kern_attn_decode_partial_fast not built")
    rng = np.random.default_rng(hq + head_dim * 3 + split_tokens + num_splits)
    seq_lens = np.asarray([128, 1, 0, 4096, 17, 600], dtype=np.int32)
    seqs = len(seq_lens)
    cache, block_table = make_paged_cache(rng, page_tokens, hkv, head_dim, seq_lens, spare_pages=3, spare_cols=2)
    bt_stride = block_table.shape[1]
    # absent_pages: page ids outside [0, num_pages) masked the same way, bit for bit
    num_pages, block_table = bound_pages(rng, block_table, seq_lens, page_tokens, cache.shape[0],
                                         (lambda cache_pages: cache_pages - 2) if absent_pages else None)
    q = ref.bf16_round(rand_bf16(rng, (seqs, hq, head_dim)))
    d_q, d_cache = dev.array(ref.bf16_bits(q)), dev.array(ref.bf16_bits(cache))
    d_bt, d_lens = dev.array(block_table), dev.array(seq_lens)
    results = []
    for entry in ("kern_attn_decode_partial", "kern_attn_decode_partial_fast"):
        d_po = dev.alloc(seqs * hq * num_splits * head_dim * 4)
        d_ml = dev.alloc(seqs * hq * num_splits * 2 * 4)
        d_po.poison()
        d_ml.poison()
        dev.kernel(entry).launch(
            (hkv, num_splits, seqs), (128,),
            [("p", d_q.ptr), ("p", d_cache.ptr), ("p", d_bt.ptr), ("p", d_lens.ptr), ("p", d_po.ptr),
             ("p", d_ml.ptr), ("i", hq), ("i", hkv), ("i", head_dim), ("i", page_tokens), ("i", bt_stride),
             ("i", num_pages), ("i", split_tokens), ("i", num_splits), ("f", head_dim**-0.5)])
        results.append((d_po.download(np.uint32, seqs * hq * num_splits * head_dim),
                        d_ml.download(np.uint32, seqs * hq * num_splits * 2)))
    (po_old, ml_old), (po_new, ml_new) = results
    assert np.array_equal(ml_old, ml_new), f"part_ml differs at {np.flatnonzero(ml_old != ml_new)[:8].tolist()}"
    assert np.array_equal(po_old, po_new), f"part_out differs at {np.flatnonzero(po_old != po_new)[:8].tolist()}"


# kern_qk_norm_rope_kv + kern_attn_decode_partial_fast + kern_attn_decode_reduce against the float64 reference,
# with sequences that exercise each rule of the rope kernel's slot contract, and kern_attn_decode_partial_early =
# kern_attn_decode_partial_fast, bit for bit, on the same cases.
# group sizes G = hq / hkv: 4 (Qwen3-4B), 3, 8 (two full passes of 4 heads), 2, 1, 6 and 5 (a second, partial
# pass: 2 and 1 heads), at head_dim 32..256
DECODE_CONFIGS = [(32, 8, 128, 16), (4, 2, 32, 4), (6, 2, 64, 16), (8, 1, 128, 16), (4, 2, 96, 16), (4, 4, 64, 16),
                 (16, 2, 256, 16), (12, 2, 128, 16), (10, 2, 64, 16), (40, 8, 128, 16), (64, 8, 128, 16)]


def run_decode_chain(dev, rng, hq, hkv, head_dim, page_tokens, split_tokens, num_splits, num_pages_cut=0):
    """One decode token for each of 9 sequences: contexts 128, 1, 4096, 17, 600 (slot = the block table's row
    of the last position), 0 (an empty context whose token still writes K/V), 40 with slot -1 and 33 with a
    slot past num_pages * page_tokens (no write: the attention reads the cache as it is), 50 whose slot is the
    row of its position 3 (written there and read there), and 20 with a position past max_pos (no write, q
    left unwritten: not checked). `num_pages_cut`: num_pages = cache pages - cut (rows past it read as absent, writes skipped)."""
    max_pos = 8192
    seq_lens = np.asarray([128, 1, 4096, 17, 600, 0, 40, 33, 50, 20], dtype=np.int32)
    seqs = len(seq_lens)
    alloc_lens = np.maximum(seq_lens, 1)  # the empty context still gets a page for its new token
    cache, block_table = make_paged_cache(rng, page_tokens, hkv, head_dim, alloc_lens, spare_pages=3, spare_cols=2)
    bt_stride = block_table.shape[1]
    num_pages = cache.shape[0] - num_pages_cut
    positions = np.maximum(seq_lens - 1, 0).astype(np.int32)
    slots = np.array([block_table[s, p // page_tokens] * page_tokens + p % page_tokens
                      for s, p in enumerate(positions)], dtype=np.int32)
    slots[6] = -1
    slots[7] = num_pages * page_tokens
    slots[8] = block_table[8, 0] * page_tokens + 3
    positions[9] = max_pos
    width = (hq + 2 * hkv) * head_dim
    qkv = rand_bf16(rng, (seqs, width), scale=2.0)
    q_w = ref.bf16_round((1.0 + 0.3 * rng.standard_normal(head_dim)).astype(np.float32))
    k_w = ref.bf16_round((1.0 + 0.3 * rng.standard_normal(head_dim)).astype(np.float32))
    rope = ref.rope_table(max_pos, head_dim, 1000000.0)
    scale, eps = head_dim**-0.5, 1e-6
    d_qkv, d_qw, d_kw = dev.array(ref.bf16_bits(qkv)), dev.array(ref.bf16_bits(q_w)), dev.array(ref.bf16_bits(k_w))
    d_rope, d_pos, d_slots = dev.array(rope), dev.array(positions), dev.array(slots)
    d_bt, d_lens = dev.array(block_table), dev.array(seq_lens)
    part = seqs * hq * num_splits

    # the rope kernel writes q and the new K/V; then each partial entry + the reduce reads them
    d_cache = dev.array(ref.bf16_bits(cache))
    d_q = dev.alloc(seqs * hq * head_dim * 2)
    d_q.poison()
    dev.kernel("kern_qk_norm_rope_kv").launch(
        (seqs, hq + hkv), (head_dim,),
        [("p", d_qkv.ptr), ("p", d_qw.ptr), ("p", d_kw.ptr), ("p", d_rope.ptr), ("p", d_pos.ptr), ("p", d_slots.ptr),
         ("p", d_q.ptr), ("p", d_cache.ptr), ("i", seqs), ("i", hq), ("i", hkv), ("i", head_dim),
         ("i", page_tokens), ("i", max_pos), ("i", num_pages), ("f", eps)])

    def partial_then_reduce(entry, slots_arg, block=128):
        """(part_ml bits [seqs, hq * num_splits * 2], output bits [seqs, hq * D]) of `entry` + the reduce."""
        d_po, d_ml, d_out = dev.alloc(part * head_dim * 4), dev.alloc(part * 2 * 4), dev.alloc(seqs * hq * head_dim * 2)
        for buf in (d_po, d_ml, d_out):
            buf.poison()
        dev.kernel(entry).launch(
            (hkv, num_splits, seqs), (block,),
            [("p", d_q.ptr), ("p", d_cache.ptr), ("p", d_bt.ptr), ("p", d_lens.ptr), *slots_arg, ("p", d_po.ptr),
             ("p", d_ml.ptr), ("i", hq), ("i", hkv), ("i", head_dim), ("i", page_tokens), ("i", bt_stride),
             ("i", num_pages), ("i", split_tokens), ("i", num_splits), ("f", scale)])
        dev.kernel("kern_attn_decode_reduce").launch(
            (hq, seqs), (head_dim,),
            [("p", d_po.ptr), ("p", d_ml.ptr), ("p", d_lens.ptr), ("p", d_out.ptr), ("i", hq), ("i", head_dim),
             ("i", split_tokens), ("i", num_splits)])
        return d_ml.download(np.uint32, (seqs, part // seqs * 2)), d_out.download(np.uint16, (seqs, hq * head_dim))

    ml_fast, out_fast = partial_then_reduce("kern_attn_decode_partial_fast", [])
    # kern_attn_decode_partial_early (the fast entry with its reads before the PDL wait and the slot's row
    # reloaded after it): bit for bit the fast entry's partials and output, on the same q and cache
    ml_early, out_early = partial_then_reduce("kern_attn_decode_partial_early", [("p", d_slots.ptr)])
    valid = positions < max_pos  # a position past max_pos leaves q unwritten (NaN) on both
    assert np.array_equal(ml_early[valid], ml_fast[valid]), "early partial: part_ml differs from the fast entry"
    assert np.array_equal(out_early[valid], out_fast[valid]), "early partial: output differs from the fast entry"
    # and against the float64 reference (q and K/V of the new token from ref.qk_norm_rope_kv)
    want_q = np.zeros((seqs, hq, head_dim), dtype=np.float32)
    want_cache = cache.copy()
    in_range = np.where((slots >= 0) & (slots < num_pages * page_tokens), slots, -1).astype(np.int32)
    ref.qk_norm_rope_kv(qkv, q_w, k_w, rope, positions, in_range, want_q, want_cache, hq, hkv, head_dim, eps)
    want = ref.attn_decode(ref.bf16_round(want_q), want_cache, block_table, seq_lens, scale, num_pages=num_pages)
    got = ref.from_bf16_bits(out_fast)
    assert (out_fast[5] == 0).all(), "the empty context must give zeros"
    for s in np.flatnonzero(valid & (seq_lens > 0)):
        if not ref.kv_present(block_table[s], int(seq_lens[s]), page_tokens, num_pages).any():
            continue
        assert_close(f"decode seq {s} (ctx {seq_lens[s]})", got[s], want[s], elem_rel=2.0**-5, elem_abs=8e-3)
    # kern_attn_decode_partial_wide (8 warps x 4 slots, head_dim <= 128): the early contract, the same reference
    # bound (its per-warp softmax sums in another order); at head_dim > 128 it writes nothing
    ml_wide, out_wide = partial_then_reduce("kern_attn_decode_partial_wide", [("p", d_slots.ptr)], block=256)
    if head_dim > 128:
        assert (ml_wide == 0xFFFFFFFF).all(), "wide partial at head_dim > 128 must write nothing (poison kept)"
        return
    ml_bad, _ = partial_then_reduce("kern_attn_decode_partial_wide", [("p", d_slots.ptr)], block=128)
    assert (ml_bad == 0xFFFFFFFF).all(), "wide partial launched with 128 threads must write nothing"
    got_wide = ref.from_bf16_bits(out_wide)
    assert (out_wide[5] == 0).all(), "wide partial: the empty context must give zeros"
    empty_ml = ml_fast[valid].view(np.float32) == -np.inf
    assert np.array_equal(ml_wide[valid].view(np.float32) == -np.inf, empty_ml), "wide partial: other empty splits"
    for s in np.flatnonzero(valid & (seq_lens > 0)):
        if not ref.kv_present(block_table[s], int(seq_lens[s]), page_tokens, num_pages).any():
            continue
        assert_close(f"wide decode seq {s} (ctx {seq_lens[s]})", got_wide[s], want[s], elem_rel=2.0**-5, elem_abs=8e-3)


@pytest.mark.parametrize("hq,hkv,head_dim,page_tokens", DECODE_CONFIGS)
@pytest.mark.parametrize("split_tokens,num_splits", [(16, 16), (16, 32), (64, 4), (64, 16), (32, 7)])
def test_attn_decode_chain_and_early_partial(dev, hq, hkv, head_dim, page_tokens, split_tokens, num_splits):
    rng = np.random.default_rng(hq * 13 + head_dim + page_tokens * 5 + split_tokens + num_splits)
    run_decode_chain(dev, rng, hq, hkv, head_dim, page_tokens, split_tokens, num_splits)


@pytest.mark.parametrize("hq,hkv,head_dim,page_tokens", [(32, 8, 128, 16), (4, 2, 32, 4)])
def test_attn_decode_chain_bounds_pages_and_slots_by_num_pages(dev, hq, hkv, head_dim, page_tokens):
    """num_pages below the cache's pages: rows of pages past it read as absent, slots past it are not written."""
    rng = np.random.default_rng(hq + head_dim + 77)
    run_decode_chain(dev, rng, hq, hkv, head_dim, page_tokens, 16, 16, num_pages_cut=5)


# Prefill entries: name -> (query rows per grid.x step, dynamic shared memory bytes, threads). kern_attn_prefill_r32 is
# kern_attn_prefill with two m-tiles per warp; its rows must equal kern_attn_prefill's bit for bit. The wgmma
# entries (attention_wg.cu) run only at the head_dims they are compiled for.
PREFILL_ENTRIES = {entry: (rows, smem, threads) for entry, rows, smem, threads in PREFILL_ATTN.values()}
PREFILL_BITWISE = set(PREFILL_ENTRIES) - {"kern_attn_prefill"}  # rows bit for bit kern_attn_prefill's
WG_ENTRIES = {entry for entry in PREFILL_ENTRIES if KERNEL_SIGNATURES[entry][0] == "attention_wg"}


def prefill_cases(configs, entries=None):
    """(entry, *config) for every prefill entry (or `entries`) and config whose head_dim (config[2]) it takes."""
    return [(e, *c) for e in sorted(entries or PREFILL_ENTRIES) for c in configs
            if e not in WG_ENTRIES or c[2] in PREFILL_WG_HEAD_DIMS]


def built(dev, entry):
    return any(entry in info["entries"] for info in dev.meta["modules"].values())


def launch_attn_prefill(dev, entry, max_q, hq, hkv, seqs, args, shared_mem=None, extra_blocks=0):
    """The generator's launch of `entry` (grid.x = cdiv(max_q, rows per block at the GQA group hq / hkv)), plus
    `extra_blocks` along x (a larger grid is allowed: those blocks exit)."""
    rows, smem, threads = PREFILL_ENTRIES[entry]
    grid_x = cdiv(max_q, prefill_rows_per_block(rows, hq // hkv)) + extra_blocks
    dev.kernel(entry).launch((grid_x, hkv, seqs), (threads,), args,
                             shared_mem=smem if shared_mem is None else shared_mem)


def run_attn_prefill(dev, rng, hq, hkv, head_dim, page_tokens, plan, bound=None, entry="kern_attn_prefill",
                     seq_lens=None, q_misalign=False, extra_blocks=0):
    """Launch `entry` over the chunks of `plan` ((cached prefix, chunk length) per sequence) and check
    every sequence's rows against ref.attn_prefill. `bound` None: num_pages = the cache's page count and an
    intact block table; else num_pages = bound(cache_pages) and a table from corrupt_block_table, whose
    entries outside [0, num_pages) must read as K = V = 0, exactly as the reference reads them. For an entry
    in PREFILL_BITWISE, also launch kern_attn_prefill on the same inputs: the two outputs must be identical bit
    for bit. `seq_lens` (optional) replaces prefix + chunk per sequence: shorter than the chunk puts its first
    rows at negative positions (no key: zeros). `q_misalign`: q
    starts 4 bytes past a 16-byte boundary (the element-load path for Q). `extra_blocks`: launch `entry` with that
    many more blocks along x than the generator does. Returns the output bits."""
    if not built(dev, entry):
        pytest.fail(f"{entry} not built (kernels/kernels.json)")
    q_lens = np.array([c for _, c in plan], dtype=np.int32)
    seq_lens = np.array([p + c for p, c in plan] if seq_lens is None else seq_lens, dtype=np.int32)
    seqs = len(plan)
    cu_seqlens = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    total = int(cu_seqlens[-1])
    cache, block_table = make_paged_cache(rng, page_tokens, hkv, head_dim, seq_lens, spare_pages=2, spare_cols=1)
    bt_stride = block_table.shape[1]
    num_pages, block_table = bound_pages(rng, block_table, seq_lens, page_tokens, cache.shape[0], bound)
    q = rand_bf16(rng, (total, hq, head_dim))
    q[cu_seqlens[1] : cu_seqlens[2]] *= 6.0  # peaky rows
    q = ref.bf16_round(q)
    scale = head_dim**-0.5
    q_bits = ref.bf16_bits(q)
    if q_misalign:  # q 4 bytes past a 16-byte boundary: the entries' element-load path for Q
        d_q_buf = dev.array(np.concatenate([np.zeros(2, dtype=q_bits.dtype), q_bits.ravel()]))
        d_q = type("Shifted", (), {"ptr": d_q_buf.ptr + 4})()
    else:
        d_q = dev.array(q_bits)
    d_cache = dev.array(ref.bf16_bits(cache))
    d_bt, d_cu, d_lens = dev.array(block_table), dev.array(cu_seqlens), dev.array(seq_lens)
    d_out = dev.alloc(total * hq * head_dim * 2)
    d_out.poison()
    def args(d_out):
        return [("p", d_q.ptr), ("p", d_cache.ptr), ("p", d_bt.ptr), ("p", d_cu.ptr), ("p", d_lens.ptr),
                ("p", d_out.ptr), ("i", hq), ("i", hkv), ("i", head_dim), ("i", page_tokens), ("i", bt_stride),
                ("i", num_pages), ("f", scale)]

    launch_attn_prefill(dev, entry, int(q_lens.max()), hq, hkv, seqs, args(d_out), extra_blocks=extra_blocks)
    bits = d_out.download(BF, (total, hq * head_dim))
    if entry in PREFILL_BITWISE:
        d_base = dev.alloc(total * hq * head_dim * 2)
        d_base.poison()
        launch_attn_prefill(dev, "kern_attn_prefill", int(q_lens.max()), hq, hkv, seqs, args(d_base))
        base = d_base.download(BF, (total, hq * head_dim))
        diff = np.flatnonzero(bits != base)
        assert diff.size == 0, (f"{entry}: {diff.size} of {bits.size} outputs differ from kern_attn_prefill "
                                f"(first at row {diff[0] // (hq * head_dim)})")
    got = ref.from_bf16_bits(bits)
    want = ref.attn_prefill(q, cache, block_table, cu_seqlens, seq_lens, scale, num_pages=num_pages)
    for s in range(seqs):
        lo, hi = cu_seqlens[s], cu_seqlens[s + 1]
        if not ref.kv_present(block_table[s], int(seq_lens[s]), page_tokens, num_pages).any():
            assert (got[lo:hi] == 0).all(), f"prefill seq {s}: no token with a page, output not zero"
            continue
        assert_close(f"prefill seq {s} (prefix {plan[s][0]}, chunk {plan[s][1]})", got[lo:hi], want[lo:hi],
                     elem_rel=2.0**-5, elem_abs=8e-3)
    return bits


# (cached prefix, chunk length): fresh prompt, chunk after a prefix, long prefix, single token, chunks ending on /
# just past page boundaries, a chunk longer than one 16-row query tile. A longer chunk after a prefix crosses many
# 64-token K/V tiles, masked and unmasked.
def prefill_plan(page_tokens):
    return [(0, 37), (50, 20), (3000, 17), (7, 1), (page_tokens - 1, 1), (0, page_tokens), (page_tokens, 33),
            (0, 130), (100, 300)]


@pytest.mark.parametrize("entry,hq,hkv,head_dim,page_tokens", prefill_cases(PREFILL_CONFIGS))
def test_attn_prefill(dev, entry, hq, hkv, head_dim, page_tokens):
    rng = np.random.default_rng(hq * 17 + head_dim + page_tokens)
    run_attn_prefill(dev, rng, hq, hkv, head_dim, page_tokens, prefill_plan(page_tokens), entry=entry)


@pytest.mark.parametrize("entry,hq,hkv,head_dim,page_tokens",
                         prefill_cases([(32, 8, 128, 16), (8, 1, 128, 16), (6, 2, 64, 16)],
                                       entries={"kern_attn_prefill_r32"} | WG_ENTRIES))
def test_attn_prefill_long_chunks(dev, entry, hq, hkv, head_dim, page_tokens):
    """Chunks of several hundred rows after long prefixes (many blocks, every m-tile of a warp masked apart),
    one row short of and one past a 32-row warp tile: rows equal the reference (and kern_attn_prefill's, for
    r32)."""
    rng = np.random.default_rng(hq * 29 + head_dim)
    run_attn_prefill(dev, rng, hq, hkv, head_dim, page_tokens, [(0, 511), (1000, 257), (64, 31), (5, 33)],
                     entry=entry)


@pytest.mark.parametrize("entry,hq,hkv,head_dim", prefill_cases([(8, 8, 128), (16, 8, 64), (32, 8, 128)]))
def test_attn_prefill_grid_larger_than_needed(dev, entry, hq, hkv, head_dim):
    """Groups of 1, 2 and 4 (a block covers 4x, 2x and 1x the rows of a group of 4): three more blocks along x than
    the generator launches exit without writing (the rows still equal the reference and kern_attn_prefill's); the
    heaviest-first order (qt = gridDim.x - 1 - blockIdx.x) does not depend on the grid being tight."""
    rng = np.random.default_rng(hq * 13 + head_dim)
    run_attn_prefill(dev, rng, hq, hkv, head_dim, 16, [(0, 130), (40, 257), (9, 1)], entry=entry, extra_blocks=3)


@pytest.mark.parametrize("entry,hq,hkv,head_dim", prefill_cases([(32, 8, 128), (16, 2, 64), (6, 2, 64)]))
def test_attn_prefill_short_context_and_unaligned_q(dev, entry, hq, hkv, head_dim):
    """seq_lens shorter than the chunk (the first rows at negative positions write zeros; a sequence of length 0
    writes all zeros), groups of 3 and 8 (passes), and q 4 bytes off a 16-byte boundary (element loads)."""
    rng = np.random.default_rng(hq * 7 + head_dim)
    run_attn_prefill(dev, rng, hq, hkv, head_dim, 16, [(0, 40), (0, 70), (0, 5)], entry=entry, seq_lens=[10, 65, 0],
                     q_misalign=True)


REFUSALS = [(entry, "short shared memory") for entry in sorted({"kern_attn_prefill_r32"} | WG_ENTRIES)] + [
    (entry, fault) for entry in sorted(WG_ENTRIES)
    for fault in ("unaligned kv_cache", "head_dim 96", "block of 256 threads", "num_q_heads 0")]


@pytest.mark.parametrize("entry,hq,hkv,head_dim,page_tokens",
                         prefill_cases([(32, 8, 128, 16), (16, 8, 64, 16), (8, 8, 128, 64)]))
def test_attn_prefill_rows_do_not_depend_on_the_chunking(dev, entry, hq, hkv, head_dim, page_tokens):
    """A sequence's rows computed in one chunk of 700 and as the chunks 0-299, 300-556, 557-699 (after their
    prefixes, on the same cache) are identical bit for bit: the K/V tiles start at position 0 whatever the
    chunk, which is what makes a cached prefix resume exactly."""
    if not built(dev, entry):
        pytest.fail(f"{entry} not built (kernels/kernels.json)")
    rng = np.random.default_rng(hq * 3 + head_dim + page_tokens)
    n = 700
    seq_lens = np.array([n], dtype=np.int32)
    cache, table = make_paged_cache(rng, page_tokens, hkv, head_dim, seq_lens, spare_pages=1, spare_cols=1)
    q = ref.bf16_round(rand_bf16(rng, (n, hq, head_dim)))
    d_q, d_cache, d_bt = dev.array(ref.bf16_bits(q)), dev.array(ref.bf16_bits(cache)), dev.array(table)

    def rows(lo, hi):
        """Rows lo..hi-1 as one chunk after a prefix of lo tokens."""
        d_cu = dev.array(np.array([0, hi - lo], dtype=np.int32))
        d_lens_c = dev.array(np.array([hi], dtype=np.int32))
        d_out = dev.alloc((hi - lo) * hq * head_dim * 2)
        d_out.poison()
        launch_attn_prefill(dev, entry, hi - lo, hq, hkv, 1,
                            [("p", d_q.ptr + lo * hq * head_dim * 2), ("p", d_cache.ptr), ("p", d_bt.ptr),
                             ("p", d_cu.ptr), ("p", d_lens_c.ptr), ("p", d_out.ptr), ("i", hq), ("i", hkv),
                             ("i", head_dim), ("i", page_tokens), ("i", table.shape[1]), ("i", cache.shape[0]),
                             ("f", head_dim**-0.5)])
        return d_out.download(BF, (hi - lo, hq * head_dim))

    whole = rows(0, n)
    for lo, hi in ((0, 300), (300, 557), (557, n)):
        part = rows(lo, hi)
        diff = np.flatnonzero(part != whole[lo:hi])
        assert diff.size == 0, f"{entry}: rows {lo}..{hi - 1} as a chunk differ from the whole prompt's ({diff.size})"


@pytest.mark.parametrize("entry,fault", REFUSALS)
def test_attn_prefill_refuses_launch_outside_its_contract(dev, entry, fault):
    """Launched with less dynamic shared memory than it needs (up to 1,040 bytes short: the wgmma entries' 1,024
    of alignment slack), or (wgmma entries) a kv_cache 2 bytes past a 16-byte boundary, a head_dim it is not
    compiled for, a block other than its 384 threads (its warpgroup roles) or no q head, the entry writes nothing
    (and returns: no hang)."""
    rng = np.random.default_rng(5)
    hq, hkv, d, page = 4, 2, 96 if fault == "head_dim 96" else 64, 16
    cache, table = make_paged_cache(rng, page, hkv, d, np.array([40], dtype=np.int32), spare_pages=0, spare_cols=0)
    q = ref.bf16_round(rand_bf16(rng, (40, hq, d)))
    d_q, d_cache, d_bt = dev.array(ref.bf16_bits(q)), dev.array(ref.bf16_bits(cache)), dev.array(table)
    d_cu, d_lens = dev.array(np.array([0, 40], dtype=np.int32)), dev.array(np.array([40], dtype=np.int32))
    d_out = dev.alloc(40 * hq * d * 2)
    d_out.poison()
    smem = PREFILL_ENTRIES[entry][1]
    kv_ptr = d_cache.ptr + (2 if fault == "unaligned kv_cache" else 0)
    rows, _, threads = PREFILL_ENTRIES[entry]
    dev.kernel(entry).launch((cdiv(40, rows), hkv, 1), (256 if fault == "block of 256 threads" else threads,),
                             [("p", d_q.ptr), ("p", kv_ptr), ("p", d_bt.ptr), ("p", d_cu.ptr), ("p", d_lens.ptr),
                              ("p", d_out.ptr), ("i", 0 if fault == "num_q_heads 0" else hq), ("i", hkv), ("i", d),
                              ("i", page), ("i", table.shape[1]), ("i", cache.shape[0]), ("f", d**-0.5)],
                             shared_mem=smem - 1040 if fault == "short shared memory" else smem)
    assert (d_out.download(np.uint8, (40 * hq * d * 2,)) == 0xFF).all(), f"{entry} wrote output despite {fault}"


# ------------------------------------------------------------------------- attention: the num_pages bound

# How the kernel's num_pages relates to the pages the cache array holds: 2 real pages past the bound (so
# reading one would change the result), no page at all (0, or negative: every page is absent).
PAGE_BOUNDS = {"below-cache": lambda cache_pages: cache_pages - 2, "zero": lambda cache_pages: 0,
               "negative": lambda cache_pages: -5}


@pytest.mark.parametrize("partial", ["kern_attn_decode_partial", "kern_attn_decode_partial_fast"])
@pytest.mark.parametrize("hq,hkv,head_dim,page_tokens", [(32, 8, 128, 16), (4, 2, 32, 4), (8, 1, 128, 16), (6, 2, 64, 16)])
@pytest.mark.parametrize("split_tokens,num_splits", [(16, 32), (64, 4), (32, 7)])
@pytest.mark.parametrize("bound", sorted(PAGE_BOUNDS))
def test_attn_decode_masks_page_ids_outside_num_pages(dev, partial, hq, hkv, head_dim, page_tokens, split_tokens,
                                                       num_splits, bound):
    """Block-table entries >= num_pages (the bound, real pages past it, the id just past the cache array whose
    guard is poison, 2^30, 2^31 - 1) and negative ones (-1, -7, -2^31) are masked: partials, all-absent splits
    (-inf, 0) and the reduced output equal the reference that masks them; nothing unwritten, no fault."""
    if partial not in dev.meta["modules"]["attention"]["entries"]:
        pytest.skip(f"{partial} not built")
    rng = np.random.default_rng(hq * 3 + head_dim + page_tokens * 5 + split_tokens + num_splits)
    # sequence 0 loses every page (zeros out); the others lose patterns of pages (corrupt_block_table)
    seq_lens = [600, 1, page_tokens + 1, 3000, 129, 48, 0, 4096, 200, page_tokens]
    run_attn_decode(dev, rng, hq, hkv, head_dim, page_tokens, seq_lens, split_tokens, num_splits, partial=partial,
                    bound=PAGE_BOUNDS[bound])


@pytest.mark.parametrize("entry,hq,hkv,head_dim,page_tokens", prefill_cases(PREFILL_CONFIGS))
@pytest.mark.parametrize("bound", sorted(PAGE_BOUNDS))
def test_attn_prefill_zeros_page_ids_outside_num_pages(dev, entry, hq, hkv, head_dim, page_tokens, bound):
    """Block-table entries outside [0, num_pages) read K = V = 0 (the reference's zeros), in prefix pages and
    in the chunk's own pages; a sequence without a single page gives zeros; nothing unwritten, no fault."""
    rng = np.random.default_rng(hq * 13 + head_dim + page_tokens * 3)
    run_attn_prefill(dev, rng, hq, hkv, head_dim, page_tokens, prefill_plan(page_tokens), bound=PAGE_BOUNDS[bound],
                     entry=entry)


@pytest.mark.parametrize("hq,hkv,head_dim,page_tokens", [(32, 8, 128, 16), (4, 2, 64, 16)])
def test_attn_prefill_takes_the_largest_bound(dev, hq, hkv, head_dim, page_tokens):
    """num_pages = 2^31 - 1 (prefill indexes in 64 bits): intact pages read as usual; entry 2^31 - 1 itself and
    negative ones are still absent."""
    rng = np.random.default_rng(hq + head_dim * 7 + page_tokens)
    run_attn_prefill(dev, rng, hq, hkv, head_dim, page_tokens, prefill_plan(page_tokens),
                     bound=lambda cache_pages: I32_MAX)


@pytest.mark.parametrize("partial", ["kern_attn_decode_partial", "kern_attn_decode_partial_fast"])
@pytest.mark.parametrize("page_tokens", [16, 4])
def test_attn_decode_page_bound_limit_of_32_bit_rows(dev, partial, page_tokens):
    """Decode indexes K/V rows as page * 2 * page_tokens + t in 32 bits: num_pages = (2^31 - 1) // (2 *
    page_tokens) still works (equals the reference on an intact table), one more is outside the kernel's limits
    and it returns without writing (part_out / part_ml keep their poison), as docs/kernels.md says."""
    if partial not in dev.meta["modules"]["attention"]["entries"]:
        pytest.skip(f"{partial} not built")
    rng = np.random.default_rng(page_tokens)
    hq, hkv, head_dim, split_tokens, num_splits = 4, 2, 64, 16, 8
    limit = I32_MAX // (2 * page_tokens)
    run_attn_decode(dev, rng, hq, hkv, head_dim, page_tokens, [300, 1, 0, 77], split_tokens, num_splits,
                    partial=partial, bound=lambda cache_pages: limit)
    seq_lens = np.asarray([300, 1], dtype=np.int32)
    cache, block_table = make_paged_cache(rng, page_tokens, hkv, head_dim, seq_lens, spare_pages=0, spare_cols=0)
    bt_stride = block_table.shape[1]
    q = ref.bf16_round(rand_bf16(rng, (2, hq, head_dim)))
    d_q, d_cache = dev.array(ref.bf16_bits(q)), dev.array(ref.bf16_bits(cache))
    d_bt, d_lens = dev.array(block_table), dev.array(seq_lens)
    d_po = dev.alloc(2 * hq * num_splits * head_dim * 4)
    d_ml = dev.alloc(2 * hq * num_splits * 2 * 4)
    d_po.poison()
    d_ml.poison()
    dev.kernel(partial).launch(
        (hkv, num_splits, 2), (128,),
        [("p", d_q.ptr), ("p", d_cache.ptr), ("p", d_bt.ptr), ("p", d_lens.ptr), ("p", d_po.ptr), ("p", d_ml.ptr),
         ("i", hq), ("i", hkv), ("i", head_dim), ("i", page_tokens), ("i", bt_stride), ("i", limit + 1),
         ("i", split_tokens), ("i", num_splits), ("f", head_dim**-0.5)])
    assert (d_po.download(np.uint8, d_po.nbytes) == 0xFF).all(), "part_out written past the 32-bit row limit"
    assert (d_ml.download(np.uint8, d_ml.nbytes) == 0xFF).all(), "part_ml written past the 32-bit row limit"


# ----------------------------------------------------------------------------------------- argmax


def run_argmax(dev, logits, chunk):
    rows, n = logits.shape
    num_chunks = cdiv(n, chunk) + 1  # one empty chunk past the end
    d_logits = dev.array(ref.bf16_bits(logits))
    d_val, d_idx, d_out = dev.alloc(rows * num_chunks * 4), dev.alloc(rows * num_chunks * 4), dev.alloc(rows * 8)
    for b in (d_val, d_idx, d_out):
        b.poison()
    dev.kernel("kern_argmax_partial").launch(
        (num_chunks, rows), (256,),
        [("p", d_logits.ptr), ("i", n), ("i", chunk), ("p", d_val.ptr), ("p", d_idx.ptr), ("i", num_chunks)],
    )
    dev.kernel("kern_argmax_final").launch(
        (rows,), (256,), [("p", d_val.ptr), ("p", d_idx.ptr), ("i", num_chunks), ("p", d_out.ptr)]
    )
    return d_out.download(np.int64, (rows,))


@pytest.mark.parametrize("n,chunk", [(151936, 1024), (151936, 4096), (1000, 100), (37, 8), (37, 5)])
def test_argmax(dev, n, chunk):
    rng = np.random.default_rng(n + chunk)
    rows = 6
    logits = rand_bf16(rng, (rows, n), scale=3.0)
    # row 0: plain. row 1: a tie of the max at two places (smallest wins). row 2: NaNs incl. at the max's
    # spot and first. row 3: all NaN (-> 0). row 4: all -inf (-> 0). row 5: -0.0 / +0.0 tie as the max.
    top = logits[1].max() + 1.0
    a, b = sorted(rng.choice(n, 2, replace=False))
    logits[1, b] = top
    logits[1, a] = top
    logits[2, rng.choice(n, max(1, n // 10), replace=False)] = np.nan
    logits[2, 0] = np.nan
    logits[2, int(np.nanargmax(logits[2]))] = np.nan
    logits[3] = np.nan
    logits[4] = -np.inf
    logits[5] = -np.abs(logits[5]) - 1.0
    i, j = sorted(rng.choice(n, 2, replace=False))
    logits[5, i], logits[5, j] = -0.0, 0.0
    got = run_argmax(dev, logits, chunk)
    want = ref.argmax(logits)
    assert want[1] == a and want[5] == i
    np.testing.assert_array_equal(got, want, err_msg=f"argmax rows differ: got {got.tolist()} want {want.tolist()}")
