"""numpy reference of kern_decode_advance (kernels-src/step.cu, contract docs/kernels-step.md).

Arrays are updated in place, exactly as the kernel writes its device buffers; `token_ring` is
``[n_seqs, ring_len]`` (``ring_len`` is its second dimension; 0 columns skip the ring store).
"""

from __future__ import annotations

import numpy as np

INT32_MAX = 2**31 - 1


def decode_advance(next_token: np.ndarray, token_ids: np.ndarray, positions: np.ndarray, seq_lens: np.ndarray,
                   slot_mapping: np.ndarray, block_table: np.ndarray, token_ring: np.ndarray, n_seqs: int,
                   page_tokens: int, bt_stride: int, max_pos: int) -> None:
    """For each sequence s < n_seqs, with p = positions[s] + 1 (the position the next step processes):
    token_ring[s, p % ring_len] = next_token[s]; token_ids[s] = next_token[s] (as i32); positions[s] = p;
    seq_lens[s] = p + 1; slot_mapping[s] = block_table[s, p // page_tokens] * page_tokens + p % page_tokens,
    or -1 when p is outside [0, max_pos), the page index is >= bt_stride, the page id is negative, or the
    slot exceeds i32 (positions / seq_lens saturate at i32 max)."""
    flat_bt = np.asarray(block_table).reshape(-1)
    ring_len = token_ring.shape[1] if token_ring.ndim == 2 else 0
    for s in range(n_seqs):
        tok = int(next_token[s])
        p = int(positions[s]) + 1
        if ring_len > 0 and p >= 0:
            token_ring[s, p % ring_len] = tok
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
