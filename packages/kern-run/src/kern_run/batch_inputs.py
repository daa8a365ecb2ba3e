"""The host-written inputs of a batched decode step: one row per sequence, padded to the bucket.

A decode call at `seqs = tokens = bucket` reads, for each row r < bucket (docs/caller.md "Batched decode"):

    token_ids[r]    the row's last token (the last prompt token, then its last generated token)
    positions[r]    the position that token sits at (also the sampler's Philox counter)
    slot_mapping[r] slot(positions[r]) through the row's own block-table row
    seq_lens[r]     positions[r] + 1
    block_table[r]  the row's page ids, padded with its last page id (generate.block_row)
    cu_seqlens_q    [0, 1, ..., bucket]: one query row per sequence
    sample_params[r], hist_tokens[r], hist_counts[r]   with the GPU sampler (kern_run.sampler_meta)

A padding row (rows len(rows) .. bucket-1) reads and writes only the scratch page 0: block-table row all 0,
position 0, seq_len 1, slot 0 (page 0's first slot), token 0, greedy params, empty history. The device advance
moves it to position p, slot p % page_tokens, still in page 0, whatever p.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from .generate import block_row
from .sampling import SamplingParams, pack_history, pack_params

GREEDY = SamplingParams()


class History:
    """One row's penalty history as `kern_sample_history_append` keeps it on the device: distinct token ids with
    their counts, in order of first occurrence, at most `cap` of them; an id that is new once the list is full is
    not added (its occurrences are not counted), an id already there is counted. Seeded with the prompt's ids
    (docs/caller.md "Sampling": penalties count the prompt's tokens and the generated ones)."""

    def __init__(self, cap: int, tokens: Iterable[int] = ()) -> None:
        self.cap = cap
        self._counts: dict[int, int] = {}  # insertion order = first occurrence
        for t in tokens:
            self.add(t)

    def add(self, token: int) -> None:
        token = int(token)
        if token in self._counts:
            self._counts[token] += 1
        elif len(self._counts) < self.cap:
            self._counts[token] = 1

    def pairs(self) -> list[tuple[int, int]]:
        """(token id, count) in slot order (what `pack_history` writes)."""
        return list(self._counts.items())


@dataclass(frozen=True)
class RowInput:
    """One live row of a decode call: its last `token` at `position`, its block-table row `page_ids`, its
    sampling `params` (seeded) and `history` (None: the row applies no penalty)."""

    token: int
    position: int
    page_ids: tuple[int, ...]
    params: SamplingParams = GREEDY
    history: History | None = None


def step_inputs(rows: Sequence[RowInput], bucket: int, page_tokens: int) -> dict[str, np.ndarray]:
    """token_ids, positions, slot_mapping, seq_lens (i32[bucket] each): what changes every step (written by the
    host in the synchronous loop, by `kern_decode_advance` on the device otherwise). Rows past `rows` padding."""
    assert len(rows) <= bucket, (len(rows), bucket)
    tokens = np.zeros(bucket, dtype=np.int32)
    positions = np.zeros(bucket, dtype=np.int32)
    slots = np.zeros(bucket, dtype=np.int32)  # padding: slot 0 of the scratch page
    for r, row in enumerate(rows):
        tokens[r] = row.token
        positions[r] = row.position
        page = row.page_ids[row.position // page_tokens]
        slots[r] = page * page_tokens + row.position % page_tokens
    return {"token_ids": tokens, "positions": positions, "slot_mapping": slots, "seq_lens": positions + 1}


def decode_inputs(rows: Sequence[RowInput], bucket: int, pages_per_seq: int, page_tokens: int,
                  sampler: Any = None) -> dict[str, np.ndarray]:
    """Every input of a decode call at `bucket` rows, rows past `rows` padding: `step_inputs`, block_table
    i32[bucket, pages_per_seq], cu_seqlens_q i32[bucket + 1] and, with a `sampler` (sampler_meta.SamplerFacts),
    its params u32[bucket, 12] and, when some row penalizes, its history i32[bucket, hist_cap] x 2 (rows that
    do not penalize: empty). Raises SamplingError when a history exceeds the manifest's hist_cap (History keeps
    it within)."""
    out = step_inputs(rows, bucket, page_tokens)
    table = np.zeros((bucket, pages_per_seq), dtype=np.int32)  # padding: all scratch page 0
    for r, row in enumerate(rows):
        table[r] = block_row(row.page_ids, pages_per_seq)
    out["block_table"] = table
    out["cu_seqlens_q"] = np.arange(bucket + 1, dtype=np.int32)
    if sampler is not None:
        params = [row.params for row in rows] + [GREEDY] * (bucket - len(rows))
        out[sampler.params] = np.frombuffer(pack_params(params), dtype="<u4").reshape(bucket, -1).copy()
        if any(row.history is not None for row in rows):
            pairs = [row.history.pairs() if row.history is not None else [] for row in rows]
            pairs += [[]] * (bucket - len(rows))
            tok, cnt = pack_history(pairs, sampler.hist_cap)
            out[sampler.hist_tokens] = np.frombuffer(tok, dtype="<i4").reshape(bucket, -1).copy()
            out[sampler.hist_counts] = np.frombuffer(cnt, dtype="<i4").reshape(bucket, -1).copy()
    return out


def padding_inputs(bucket: int, pages_per_seq: int, sampler: Any = None) -> dict[str, np.ndarray]:
    """`decode_inputs` of `bucket` padding rows (the warm-up's decode call)."""
    return decode_inputs([], bucket, pages_per_seq, 1, sampler)
