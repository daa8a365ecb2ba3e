"""numpy references for kern's kernels (kernels-src/, contract in docs/kernels.md).

Each reference computes in float64 (or float32 where the model computes in float32), rounding to bf16
exactly where the kernel (and transformers' Qwen3 in bf16) rounds. bf16 values travel as float32 arrays
holding bf16-representable numbers; `bf16_bits` / `from_bf16_bits` convert to and from the uint16 device
representation. Import-light (numpy only) so CPU and GPU tests share it.

KV cache arrays: [num_pages, 2, page_tokens, Hkv, D] (K then V per page), the device layout.
"""

from __future__ import annotations

import numpy as np

# -------------------------------------------------------------------------------------- bf16 helpers


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), round to nearest even; NaN stays a (quiet) NaN."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded = np.where(nan, ((u >> 16) | 0x0040).astype(np.uint16), rounded)
    return rounded


def from_bf16_bits(b: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) -> float32."""
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """Round to bf16 precision (RNE), returned as float32."""
    return from_bf16_bits(bf16_bits(np.asarray(x, dtype=np.float32)))


def _bf(x: np.ndarray) -> np.ndarray:
    """Round a float64 intermediate the way a bf16 op does: to fp32 first is exact enough, then bf16."""
    return bf16_round(np.asarray(x, dtype=np.float64).astype(np.float32)).astype(np.float64)


# ------------------------------------------------------------------------------------------ kernels


def embed_gather(table: np.ndarray, token_ids: np.ndarray) -> np.ndarray:
    """table [vocab, hidden], token_ids [n] -> [n, hidden]; ids outside [0, vocab) give zero rows."""
    vocab, hidden = table.shape
    ids = np.asarray(token_ids, dtype=np.int64)
    ok = (ids >= 0) & (ids < vocab)
    out = np.zeros((ids.shape[0], hidden), dtype=np.float32)
    out[ok] = table[ids[ok]]
    return out


def add_rmsnorm(residual: np.ndarray, delta: np.ndarray | None, weight: np.ndarray, eps: float):
    """residual/delta [n, hidden], weight [hidden] (bf16 values). Returns (new_residual, out), both
    bf16-valued float32: r = bf16(residual + delta) (or residual), out = bf16(w * bf16(r * rsqrt(mean r^2 + eps)))."""
    r = residual.astype(np.float64)
    if delta is not None:
        r = _bf(r + delta.astype(np.float64))
    rs = 1.0 / np.sqrt(np.mean(r * r, axis=-1, keepdims=True) + eps)
    out = _bf(weight.astype(np.float64) * _bf(r * rs))
    return r.astype(np.float32), out.astype(np.float32)


def default_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """f32[head_dim / 2]: f_i = 1 / theta^(2i / D) in fp32, as transformers' _compute_default_rope_parameters."""
    expo = (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)).astype(np.float32)
    return (np.float32(1.0) / np.power(np.float32(theta), expo, dtype=np.float32)).astype(np.float32)


def llama3_inv_freq(inv_freq: np.ndarray, factor: float, low_freq_factor: float, high_freq_factor: float,
                    original_max_position_embeddings: int) -> np.ndarray:
    """f32[n]: transformers' `_compute_llama3_parameters` remap of `inv_freq` (f32[n]) in fp32, each operation
    rounded once in its order (kern_rope_table_llama3's): wavelen = (1 / f) * 2 pi (torch's scalar / tensor is a
    reciprocal then a product); f where wavelen < orig / high, f / factor where wavelen > orig / low, else
    (1 - s) * f / factor + s * f with s = ((1 / wavelen) * orig - low) / (high - low)."""
    f32 = np.float32
    f = np.asarray(inv_freq, dtype=f32)
    factor_, low, high, orig = f32(factor), f32(low_freq_factor), f32(high_freq_factor), f32(original_max_position_embeddings)
    wavelen = (f32(1.0) / f) * f32(2 * np.pi)
    s = ((f32(1.0) / wavelen) * orig - low) / (high - low)
    smooth = ((f32(1.0) - s) * f) / factor_ + s * f
    out = np.where(wavelen > orig / low, f / factor_, np.where(wavelen < orig / high, f, smooth))
    return out.astype(f32)


def rope_table(max_pos: int, head_dim: int, theta: float, llama3: tuple[float, float, float, int] | None = None
               ) -> np.ndarray:
    """[max_pos, head_dim] float32: [cos(p f_i)] ++ [sin(p f_i)], f_i = 1/theta^(2i/D) in fp32 as
    transformers computes it (with `llama3` = (factor, low_freq_factor, high_freq_factor,
    original_max_position_embeddings): llama3_inv_freq of it), each value rounded to bf16 precision."""
    half = head_dim // 2
    inv_freq = default_inv_freq(head_dim, theta)
    if llama3 is not None:
        inv_freq = llama3_inv_freq(inv_freq, *llama3)
    angle = (np.arange(max_pos, dtype=np.float32)[:, None] * inv_freq[None, :half]).astype(np.float32)
    cos = np.cos(angle.astype(np.float64))
    sin = np.sin(angle.astype(np.float64))
    return bf16_round(np.concatenate([cos, sin], axis=1).astype(np.float32))


def _head_norm_rope(x: np.ndarray, w: np.ndarray | None, cos: np.ndarray, sin: np.ndarray, eps: float) -> np.ndarray:
    """x [..., D] bf16 values -> bf16(bf16(n*cos) + bf16(rotate_half(n)*sin)), n = Qwen3 RMSNorm of x (w None:
    n = x, Llama's rope without a q/k norm)."""
    x = x.astype(np.float64)
    if w is None:
        n = x
    else:
        rs = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        n = _bf(w.astype(np.float64) * _bf(x * rs))
    half = x.shape[-1] // 2
    rot = np.concatenate([-n[..., half:], n[..., :half]], axis=-1)
    return _bf(_bf(n * cos) + _bf(rot * sin))


def qk_norm_rope_kv(qkv, q_norm_w, k_norm_w, rope, positions, slot_mapping, q_out, kv_cache,
                    num_q_heads, num_kv_heads, head_dim, eps):
    """In-place reference of kern_qk_norm_rope_kv on numpy arrays (q_norm_w / k_norm_w None: that head kind is
    not normalized, the kernel's null weight pointer).

    qkv [n, (Hq + 2 Hkv) D]; rope [max_pos, D]; q_out [n, Hq, D] and kv_cache [pages, 2, pt, Hkv, D]
    are updated in place (rows with an out-of-range position, or K/V with an out-of-range slot, are
    left untouched).
    """
    hq, hkv, d = num_q_heads, num_kv_heads, head_dim
    max_pos = rope.shape[0]
    pages, _, page_tokens = kv_cache.shape[:3]
    num_slots = pages * page_tokens
    half = d // 2
    for t in range(qkv.shape[0]):
        pos = int(positions[t])
        if not 0 <= pos < max_pos:
            continue
        cos = np.concatenate([rope[pos, :half], rope[pos, :half]]).astype(np.float64)
        sin = np.concatenate([rope[pos, half:], rope[pos, half:]]).astype(np.float64)
        row = qkv[t]
        q = row[: hq * d].reshape(hq, d)
        k = row[hq * d : (hq + hkv) * d].reshape(hkv, d)
        v = row[(hq + hkv) * d :].reshape(hkv, d)
        q_out[t] = _head_norm_rope(q, q_norm_w, cos, sin, eps)
        slot = int(slot_mapping[t])
        if 0 <= slot < num_slots:
            page, off = divmod(slot, page_tokens)
            kv_cache[page, 0, off] = _head_norm_rope(k, k_norm_w, cos, sin, eps)
            kv_cache[page, 1, off] = v


def silu_mul(gate_up: np.ndarray) -> np.ndarray:
    """gate_up [n, 2I] -> bf16(bf16(silu(gate)) * up), [n, I]."""
    inter = gate_up.shape[1] // 2
    g = gate_up[:, :inter].astype(np.float64)
    u = gate_up[:, inter:].astype(np.float64)
    return _bf(_bf(g / (1.0 + np.exp(-g))) * u).astype(np.float32)


def kv_present(block_table_row: np.ndarray, num_tokens: int, page_tokens: int, num_pages: int) -> np.ndarray:
    """bool [num_tokens]: whether each of a sequence's first num_tokens tokens has a page. Token t's page is
    block_table_row[t // page_tokens]; it is absent when that index is past the row (bt_stride) or the page
    id lies outside [0, num_pages) (the attention kernels' `num_pages` bound, docs/kernels.md "Block tables")."""
    row = np.asarray(block_table_row, dtype=np.int64).reshape(-1)
    index = np.arange(num_tokens) // page_tokens
    ids = np.full(num_tokens, -1, dtype=np.int64)
    inside = index < row.shape[0]
    ids[inside] = row[index[inside]]
    return (ids >= 0) & (ids < num_pages)


def gather_kv(kv_cache: np.ndarray, block_table_row: np.ndarray, num_tokens: int, num_pages: int | None = None):
    """K, V of one sequence's first num_tokens tokens: two [num_tokens, Hkv, D] float64 arrays. A token
    without a page (`kv_present`; num_pages defaults to the cache's page count) reads as zeros, as
    kern_attn_prefill reads it."""
    pages_in_cache, _, page_tokens = kv_cache.shape[:3]
    num_pages = pages_in_cache if num_pages is None else int(num_pages)
    present = kv_present(block_table_row, num_tokens, page_tokens, num_pages)
    tok = np.arange(num_tokens)[present]
    pages = np.asarray(block_table_row, dtype=np.int64).reshape(-1)[tok // page_tokens]
    if pages.size and pages.max() >= pages_in_cache:
        raise ValueError(f"page {pages.max()} is below num_pages {num_pages} but past the cache's {pages_in_cache}")
    offs = tok % page_tokens
    k = np.zeros((num_tokens,) + kv_cache.shape[3:], dtype=np.float64)
    v = np.zeros_like(k)
    k[present] = kv_cache[pages, 0, offs]
    v[present] = kv_cache[pages, 1, offs]
    return k, v


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray, scale: float) -> np.ndarray:
    """Causal GQA attention in float64: q [n, Hq, D] at absolute positions [n]; k, v [ctx, Hkv, D];
    query i attends to keys [0, positions[i]]. Returns [n, Hq * D]. A query with no key (a negative position,
    or ctx = 0) gets zeros, as the kernels write them."""
    n, hq, d = q.shape
    ctx, hkv = k.shape[0], k.shape[1]
    if ctx == 0:
        return np.zeros((n, hq * d))
    group = hq // hkv
    kk = np.repeat(k, group, axis=1)  # [ctx, Hq, D]
    vv = np.repeat(v, group, axis=1)
    scores = np.einsum("nhd,chd->hnc", q.astype(np.float64), kk) * scale  # [Hq, n, ctx]
    mask = np.arange(ctx)[None, :] > np.asarray(positions)[:, None]  # [n, ctx]
    scores = np.where(mask[None], -np.inf, scores)
    top = scores.max(axis=-1, keepdims=True)
    p = np.exp(scores - np.where(np.isfinite(top), top, 0.0))  # a row without a key: all zeros
    total = p.sum(axis=-1, keepdims=True)
    p = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
    out = np.einsum("hnc,chd->nhd", p, vv)
    return out.reshape(n, hq * d)


DECODE_SPLIT_GRANULE = 16  # kern_attn_decode_partial rounds a split length up to a multiple of this


def decode_split_len(seq_len: int, split_tokens: int, num_splits: int) -> int:
    """Effective split length of kern_attn_decode_partial / _reduce for a context of seq_len tokens:
    split_tokens is the minimum; a longer context gets cdiv(seq_len, num_splits) rounded up to a multiple
    of DECODE_SPLIT_GRANULE, so num_splits splits always cover it."""
    per = -(-max(int(seq_len), 0) // num_splits)
    g = DECODE_SPLIT_GRANULE
    return max(int(split_tokens), -(-per // g) * g)


def _decode_scores(q_s, kv_cache, block_table_row, n_ctx, scale, num_pages):
    """Scores [Hq, ctx] (scale q.k, float64, -inf where the token has no page) and V [ctx, Hq, D] of one
    sequence (absent tokens' V zero)."""
    hq = q_s.shape[0]
    group = hq // kv_cache.shape[3]
    num_pages = kv_cache.shape[0] if num_pages is None else int(num_pages)
    present = kv_present(block_table_row, n_ctx, kv_cache.shape[2], num_pages)
    k, v = gather_kv(kv_cache, block_table_row, n_ctx, num_pages)
    kk = np.repeat(k, group, axis=1)  # [ctx, Hq, D]
    scores = np.einsum("hd,chd->hc", q_s.astype(np.float64), kk) * scale  # [Hq, ctx]
    return np.where(present[None, :], scores, -np.inf), np.repeat(v, group, axis=1)


def attn_decode_partials(q, kv_cache, block_table, seq_lens, scale, split_tokens, num_splits, num_pages=None):
    """Reference of kern_attn_decode_partial in float64: (part_out [seqs, Hq, num_splits, D],
    part_ml [seqs, Hq, num_splits, 2]). Split x of sequence s covers tokens [x L, min((x+1) L, n)),
    L = decode_split_len(n, ...); part_ml = (m, l) with m = max_j scale q.k_j (natural log units),
    l = sum_j exp(scale q.k_j - m), part_out = sum_j exp(scale q.k_j - m) v_j, over the split's tokens
    that have a page (`kv_present` with the kernel's `num_pages`, default the cache's page count);
    empty splits, and splits whose tokens all lack a page, (-inf, 0) and 0."""
    seqs, hq, d = q.shape
    po = np.zeros((seqs, hq, num_splits, d))
    ml = np.zeros((seqs, hq, num_splits, 2))
    ml[..., 0] = -np.inf
    for s in range(seqs):
        n_ctx = max(int(seq_lens[s]), 0)
        if n_ctx == 0:
            continue
        length = decode_split_len(n_ctx, split_tokens, num_splits)
        scores, vv = _decode_scores(q[s], kv_cache, block_table[s], n_ctx, scale, num_pages)
        for x in range(num_splits):
            lo, hi = x * length, min((x + 1) * length, n_ctx)
            if lo >= hi:
                continue
            sc = scores[:, lo:hi]
            if np.isneginf(sc).all():
                continue  # no token of the split has a page
            m = sc.max(axis=1)
            p = np.exp(sc - m[:, None])  # absent tokens: exp(-inf) = 0
            ml[s, :, x, 0] = m
            ml[s, :, x, 1] = p.sum(axis=1)
            po[s, :, x] = np.einsum("hc,chd->hd", p, vv[lo:hi])
    return po, ml


def attn_decode(q, kv_cache, block_table, seq_lens, scale, num_pages=None):
    """q [seqs, Hq, D] -> [seqs, Hq * D] float64; sequence s attends to those of its seq_lens[s] cached
    tokens that have a page (`kv_present`); none (or seq_lens[s] <= 0) gives zeros."""
    seqs, hq, d = q.shape
    out = np.zeros((seqs, hq * d))
    for s in range(seqs):
        n_ctx = int(seq_lens[s])
        if n_ctx <= 0:
            continue
        scores, vv = _decode_scores(q[s], kv_cache, block_table[s], n_ctx, scale, num_pages)
        if np.isneginf(scores).all():
            continue
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[s] = np.einsum("hc,chd->hd", p, vv).reshape(hq * d)
    return out


def attn_prefill(q, kv_cache, block_table, cu_seqlens_q, seq_lens, scale, num_pages=None):
    """q [total, Hq, D] -> [total, Hq * D] float64; the chunk's rows of sequence s sit at the last
    q_len positions of its seq_lens[s] tokens, all read from the cache. A token without a page
    (`kv_present` with the kernel's `num_pages`, default the cache's page count) has K = V = 0: it still
    takes part in the softmax with score 0 (kern_attn_prefill reads it as zeros)."""
    total, hq, d = q.shape
    out = np.zeros((total, hq * d))
    for s in range(len(seq_lens)):
        lo, hi = int(cu_seqlens_q[s]), int(cu_seqlens_q[s + 1])
        n_ctx = int(seq_lens[s])
        if hi <= lo:
            continue
        k, v = gather_kv(kv_cache, block_table[s], n_ctx, num_pages)
        positions = n_ctx - (hi - lo) + np.arange(hi - lo)
        out[lo:hi] = attention(q[lo:hi], k, v, positions, scale)
    return out


def argmax(logits: np.ndarray) -> np.ndarray:
    """logits [rows, n] -> int64 [rows]: first index of the largest non-NaN value (NaN never wins;
    -0.0 == +0.0 ties); an all-NaN row gives 0. Same as a CPU scan `if v > best` from the first number."""
    x = np.asarray(logits, dtype=np.float32)
    out = np.zeros(x.shape[0], dtype=np.int64)
    for r in range(x.shape[0]):
        row = x[r]
        ok = ~np.isnan(row)
        if not ok.any():
            continue
        best = row[ok].max()
        out[r] = int(np.flatnonzero(ok & (row == best))[0])
    return out


# ---------------------------------------------------------------------------------- tensor parallelism


def vocab_split(vocab: int, size: int, slice_: int, rank: int) -> tuple[int, int, int]:
    """(window start, owned columns' start, stop) of `rank` in the vocabulary-parallel split of kern_allgather_bf16:
    the rank computes the lm_head rows [window, window + slice_) and owns the logits columns [start, stop)."""
    window = min(rank * slice_, vocab - slice_)
    return window, min(rank * slice_, vocab), min((rank + 1) * slice_, vocab)


def allgather_bf16(slices: np.ndarray, vocab: int) -> np.ndarray:
    """kern_allgather_bf16 (kernels-src/allreduce.cu), bit for bit: slices uint16[size, rows, slice] (rank s's logits
    of its window) -> uint16[rows, vocab], each column taken from the rank that owns it (a copy, no arithmetic)."""
    size, rows, slice_ = slices.shape
    out = np.zeros((rows, vocab), dtype=np.uint16)
    for s in range(size):
        window, lo, hi = vocab_split(vocab, size, slice_, s)
        out[:, lo:hi] = slices[s, :, lo - window:hi - window]
    return out


def allreduce_bf16(partials: np.ndarray, residual: np.ndarray | None = None) -> np.ndarray:
    """kern_allreduce_bf16 / kern_allreduce_add_bf16 (kernels-src/allreduce.cu), bit for bit.

    partials: bf16 bits uint16[size, count], rank s's partial in row s; residual: bf16 bits uint16[count] or None.
    Returns bf16 bits uint16[count]: the float32 sum in rank order 0..size-1 (acc = 0, then acc += x_s one rank at
    a time, each add rounded to float32), rounded to bf16 (RNE); with `residual`, bf16(float(residual) + acc)."""
    vals = from_bf16_bits(np.asarray(partials, dtype=np.uint16))  # f32[size, count]
    acc = np.zeros(vals.shape[1], dtype=np.float32)
    for row in vals:
        acc = acc + row  # float32 adds, rank order
    if residual is not None:
        acc = from_bf16_bits(np.asarray(residual, dtype=np.uint16)) + acc
    return bf16_bits(acc)
