"""numpy reference of kernels-src/step.cu (contract docs/kernels-step.md): kern_decode_advance,
kern_decode_advance_packed and kern_sample_inputs_init.

Arrays are updated in place, exactly as the kernels write their device buffers; `token_ring` is
``[n_seqs, ring_len]`` (``ring_len`` is its second dimension; 0 columns skip the ring store).
"""

from __future__ import annotations

import struct

import numpy as np

INT32_MAX = 2**31 - 1
# kern_run.sampling.pack_params(SamplingParams()) as words: temperature 0, top_k 0, top_p 1.0, min_p 0,
# repetition 1.0, presence 0, frequency 0, reserved 0, seed 0 / 0, reserved 0 / 0 (written from the documented
# layout here, not imported: tests compare the two)
GREEDY_PARAM_WORDS = (0, 0, 0x3F800000, 0, 0x3F800000, 0, 0, 0, 0, 0, 0, 0)


def pack(token: int, logprob: float) -> int:
    """The packed int64 of kern_decode_advance_packed: bits 0..31 the token id (its int32 bits), bits 32..63 the
    IEEE-754 binary32 bit pattern of `logprob` (rounded to f32 first), as a signed 64-bit value."""
    bits = struct.unpack("<I", struct.pack("<f", logprob))[0]
    value = (int(token) & 0xFFFFFFFF) | (bits << 32)
    return value - (1 << 64) if value >= 1 << 63 else value


def _advance_row(s: int, tok: int, ring_value: int, token_ids: np.ndarray, positions: np.ndarray,
                 seq_lens: np.ndarray, slot_mapping: np.ndarray, flat_bt: np.ndarray, token_ring: np.ndarray,
                 page_tokens: int, bt_stride: int, max_pos: int) -> None:
    ring_len = token_ring.shape[1] if token_ring.ndim == 2 else 0
    p = int(positions[s]) + 1
    if ring_len > 0 and p >= 0:
        token_ring[s, p % ring_len] = ring_value
    slot = -1
    if page_tokens > 0 and 0 <= p < max_pos:
        idx = p // page_tokens
        if idx < bt_stride:
            page = int(flat_bt[s * bt_stride + idx])
            full = page * page_tokens + p % page_tokens
            if page >= 0 and full <= INT32_MAX:
                slot = full
    token_ids[s] = np.int64(tok).astype(np.int32)
    positions[s] = min(p, INT32_MAX)
    seq_lens[s] = min(p + 1, INT32_MAX)
    slot_mapping[s] = slot


def decode_advance(next_token: np.ndarray, token_ids: np.ndarray, positions: np.ndarray, seq_lens: np.ndarray,
                   slot_mapping: np.ndarray, block_table: np.ndarray, token_ring: np.ndarray, n_seqs: int,
                   page_tokens: int, bt_stride: int, max_pos: int) -> None:
    """For each sequence s < n_seqs, with p = positions[s] + 1 (the position the next step processes):
    token_ring[s, p % ring_len] = next_token[s]; token_ids[s] = next_token[s] (as i32); positions[s] = p;
    seq_lens[s] = p + 1; slot_mapping[s] = block_table[s, p // page_tokens] * page_tokens + p % page_tokens,
    or -1 when p is outside [0, max_pos), the page index is >= bt_stride, the page id is negative, or the
    slot exceeds i32 (positions / seq_lens saturate at i32 max)."""
    flat_bt = np.asarray(block_table).reshape(-1)
    for s in range(n_seqs):
        tok = int(next_token[s])
        _advance_row(s, tok, tok, token_ids, positions, seq_lens, slot_mapping, flat_bt, token_ring, page_tokens,
                     bt_stride, max_pos)


def decode_advance_packed(sample_token: np.ndarray, sample_logprob: np.ndarray, next_token: np.ndarray,
                          token_ids: np.ndarray, positions: np.ndarray, seq_lens: np.ndarray,
                          slot_mapping: np.ndarray, block_table: np.ndarray, token_ring: np.ndarray, n_seqs: int,
                          page_tokens: int, bt_stride: int, max_pos: int) -> None:
    """decode_advance after the sampler: the token from sample_token[s] (i32), next_token[s] and the ring entry
    = pack(sample_token[s], sample_logprob[s]) (i64); token_ids / positions / seq_lens / slot_mapping as
    decode_advance writes them for that token."""
    flat_bt = np.asarray(block_table).reshape(-1)
    for s in range(n_seqs):
        tok = int(np.int32(sample_token[s]))
        packed = pack(tok, float(np.float32(sample_logprob[s])))
        next_token[s] = packed
        _advance_row(s, tok, packed, token_ids, positions, seq_lens, slot_mapping, flat_bt, token_ring,
                     page_tokens, bt_stride, max_pos)


def sample_inputs_init(params: np.ndarray, hist_tokens: np.ndarray, hist_counts: np.ndarray, rows: int) -> None:
    """kern_sample_inputs_init: rows 0..rows-1 of params (u32 [*, 12]) the greedy row GREEDY_PARAM_WORDS, of
    hist_tokens (i32 [*, hist_cap]) -1, of hist_counts 0; later rows untouched."""
    params[:rows] = np.asarray(GREEDY_PARAM_WORDS, dtype=np.uint32)
    hist_tokens[:rows] = -1
    hist_counts[:rows] = 0
