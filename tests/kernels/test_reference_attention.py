"""CPU tests of the attention references (tools/reference_kernels.py) that the GPU tests compare the kernels
with: block-table entries outside [0, num_pages) (or past the row) are absent, masked in decode and K = V = 0
in prefill (docs/kernels.md "Block tables")."""

from __future__ import annotations


import numpy as np
import pytest


from tools import reference_kernels as ref  # noqa: E402

I32_MAX = 2**31 - 1


def cache_of(rng, pages, page_tokens=4, hkv=2, head_dim=8):
    return ref.bf16_round(rng.standard_normal((pages, 2, page_tokens, hkv, head_dim)).astype(np.float32))


def test_kv_present_checks_row_end_and_both_page_bounds() -> None:
    row = np.array([3, -1, 7, I32_MAX], dtype=np.int32)  # bt_stride 4
    present = ref.kv_present(row, 18, 4, 8)  # 18 tokens: the 5th page index is past the row
    assert present.tolist() == [True] * 4 + [False] * 4 + [True] * 4 + [False] * 4 + [False] * 2
    assert not ref.kv_present(row, 18, 4, 0).any()
    assert not ref.kv_present(row, 18, 4, -3).any()
    assert ref.kv_present(row, 12, 4, 4).tolist() == [True] * 4 + [False] * 8  # 7 >= 4
    assert ref.kv_present(row, 0, 4, 8).shape == (0,)


def test_gather_kv_reads_absent_tokens_as_zeros_and_refuses_pages_past_the_array() -> None:
    rng = np.random.default_rng(0)
    cache = cache_of(rng, 6)
    row = np.array([5, 6, -2, 0], dtype=np.int32)
    k, v = ref.gather_kv(cache, row, 14, num_pages=6)
    assert np.array_equal(k[:4], cache[5, 0]) and np.array_equal(v[:4], cache[5, 1])
    assert not k[4:12].any() and not v[4:12].any()  # page 6 >= num_pages, page -2 negative
    assert np.array_equal(k[12:], cache[0, 0, :2])
    with pytest.raises(ValueError, match="past the cache"):
        ref.gather_kv(cache, row, 8, num_pages=7)  # page 6 is below the bound but the array has 6 pages


def _masked_decode_by_compaction(q, cache, row, n, scale, num_pages):
    """Decode attention over only the tokens that have a page, gathered into a fresh context (an independent
    formulation of the masking)."""
    page_tokens = cache.shape[2]
    keep = [t for t in range(n) if 0 <= row[t // page_tokens] < num_pages] if n else []
    if not keep:
        return np.zeros(q.shape[0] * q.shape[1])
    k = np.stack([cache[row[t // page_tokens], 0, t % page_tokens] for t in keep]).astype(np.float64)
    v = np.stack([cache[row[t // page_tokens], 1, t % page_tokens] for t in keep]).astype(np.float64)
    return ref.attention(q[None], k, v, np.array([len(keep) - 1]), scale)[0]


@pytest.mark.parametrize("num_pages", [9, 7, 3, 0, -4])
def test_decode_masks_absent_tokens_and_partials_merge_to_it(num_pages: int) -> None:
    rng = np.random.default_rng(num_pages + 10)
    cache = cache_of(rng, 9)
    hq, d, scale = 4, 8, 8**-0.5
    table = np.array([[0, 8, 2, 7, -1, 3, I32_MAX, 1],    # pages 8, 7 present only when num_pages allows
                      [5, 6, 4, 2**30, -(2**31), 0, 0, 0],
                      [-1, -1, -1, 9, 10, 2**30, -5, -6]],  # never a page
                     dtype=np.int32)
    seq_lens = np.array([30, 19, 25], dtype=np.int32)
    q = ref.bf16_round(rng.standard_normal((3, hq, d)).astype(np.float32))
    out = ref.attn_decode(q, cache, table, seq_lens, scale, num_pages=num_pages)
    for s in range(3):
        want = _masked_decode_by_compaction(q[s], cache, table[s], int(seq_lens[s]), scale, num_pages)
        np.testing.assert_allclose(out[s], want, rtol=1e-12, atol=1e-12)
    assert not out[2].any()
    for split_tokens, num_splits in ((4, 8), (16, 2), (8, 5)):
        po, ml = ref.attn_decode_partials(q, cache, table, seq_lens, scale, split_tokens, num_splits,
                                          num_pages=num_pages)
        m = ml[..., 0]
        dead = np.isneginf(m)
        assert (ml[..., 1][dead] == 0).all() and not po[dead].any()
        assert (ml[..., 1][~dead] >= 1.0).all()
        top = np.where(dead.all(axis=2, keepdims=True), 0.0, np.max(m, axis=2, keepdims=True))  # [s, h, 1]
        w = np.where(dead, 0.0, np.exp(m - top))
        den = (w * ml[..., 1]).sum(axis=2)
        merged = np.where(den[..., None] > 0, (w[..., None] * po).sum(axis=2) / np.where(den > 0, den, 1)[..., None],
                          0.0)
        np.testing.assert_allclose(merged.reshape(3, hq * d), out, rtol=1e-12, atol=1e-12)


def test_decode_with_an_intact_table_is_unchanged() -> None:
    rng = np.random.default_rng(3)
    cache = cache_of(rng, 8)
    table = np.array([[4, 0, 6, 2, -1], [1, 3, 5, 7, -1]], dtype=np.int32)
    seq_lens = np.array([13, 16], dtype=np.int32)
    q = ref.bf16_round(rng.standard_normal((2, 4, 8)).astype(np.float32))
    out = ref.attn_decode(q, cache, table, seq_lens, 0.3)
    for s in range(2):
        k, v = ref.gather_kv(cache, table[s], int(seq_lens[s]))
        np.testing.assert_allclose(out[s], ref.attention(q[s : s + 1], k, v, np.array([seq_lens[s] - 1]), 0.3)[0],
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("num_pages", [8, 5, 0])
def test_prefill_reads_absent_tokens_as_zero_k_and_v(num_pages: int) -> None:
    """The same as a cache where every absent entry points at an all-zero page."""
    rng = np.random.default_rng(num_pages)
    cache = cache_of(rng, 8)
    table = np.array([[0, 9, 2, -1, 5, I32_MAX, 7], [6, 1, -(2**31), 3, 4, 2**30, 0]], dtype=np.int32)
    plan = [(10, 11), (3, 22)]  # (prefix, chunk)
    q_lens = np.array([c for _, c in plan])
    seq_lens = np.array([p + c for p, c in plan], dtype=np.int32)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = ref.bf16_round(rng.standard_normal((int(cu[-1]), 4, 8)).astype(np.float32))
    got = ref.attn_prefill(q, cache, table, cu, seq_lens, 0.35, num_pages=num_pages)
    zero_page = cache.shape[0]
    cache2 = np.concatenate([cache, np.zeros_like(cache[:1])])
    table2 = np.where((table >= 0) & (table < num_pages), table, zero_page).astype(np.int32)
    np.testing.assert_allclose(got, ref.attn_prefill(q, cache2, table2, cu, seq_lens, 0.35), rtol=1e-12, atol=1e-12)
    if num_pages == 0:
        assert not got.any()


def test_queries_without_a_key_get_zeros() -> None:
    """Negative positions (a chunk longer than its sequence) and an empty context give zero rows, not NaN; the
    rows that do have keys are unchanged by them."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((5, 4, 8))
    k, v = rng.standard_normal((3, 2, 8)), rng.standard_normal((3, 2, 8))
    positions = np.array([-3, -1, 0, 1, 2])
    out = ref.attention(q, k, v, positions, 0.4)
    assert not np.isnan(out).any()
    assert not out[:2].any() and out[2:].all()
    np.testing.assert_allclose(out[2:], ref.attention(q[2:], k, v, positions[2:], 0.4), rtol=1e-12, atol=0)
    np.testing.assert_allclose(out[2], np.repeat(v[0], 2, axis=0).ravel(), rtol=1e-12)  # one key: its V
    assert not ref.attention(q, k[:0], v[:0], positions, 0.4).any()
