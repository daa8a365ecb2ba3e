"""Per-request sampling parameters and their packing into the sampler's per-row input buffers.

`SamplingParams` is one request's settings, checked when built (`SamplingError` names the field, the value
and the allowed range). The sampler kernel (`kern_sample_bf16` / `kern_sample_f32`, docs/kernels.md
"Sampling") reads small per-row buffers that the host writes before a step, outside any captured graph, so a
change of parameters never re-captures:

    params       PARAM_ROW_BYTES = 48 bytes per row (12 little-endian 4-byte words, `pack_params`)
    hist_tokens  int32 [rows, hist_cap]   distinct previous token ids of the row (`pack_history`)
    hist_counts  int32 [rows, hist_cap]   their counts (0: an empty slot)
    out          int32 token [rows] then float32 logprob [rows]: OUTPUT_BYTES_PER_ROW = 8 (`unpack_outputs`)
    work         WORK_BYTES_PER_ROW = 69664 bytes per row, the kernel's own (its slices' results and candidates,
                 the row's ticket in the first 4 bytes: zero before the first launch, zero after every launch)

The kernel's grid is (`sampler_splits(vocab)`, rows, 1): one block per SAMPLE_SLICE = 8192 logits of a row.

The per-row position (the Philox counter) is the decode program's existing `positions` input.

A manifest built with the sampler (`kern manifest build --sampler gpu`, the default; meta.caller.sampling) ends
its decode step with kern_decode_advance_packed: `next_token` and the token ring hold one int64 per row, the
token id in bits 0..31 and the f32 logprob's bit pattern in bits 32..63 (`unpack_packed`, `packed_token`). An
argmax manifest (no meta.caller.sampling) holds plain token ids there, which `packed_token` returns unchanged.
"""

from __future__ import annotations

import math
import secrets
import struct
from collections import Counter
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import numpy as np

from .errors import SamplingError

PARAM_ROW_BYTES = 48
OUTPUT_BYTES_PER_ROW = 8  # int32 token + float32 logprob
STATS_BYTES_PER_ROW = 16  # float32 (max l, log Z_kept, threshold, 1 / temperature)
MAX_TOP_LOGPROBS = 20
SAMPLE_SLICE = 8192  # logits per block of kern_sample_* (kernels-src/sample.cu SAMPLE_SLICE)
SAMPLE_THREADS = 512  # its block
WORK_BYTES_PER_ROW = 4 * 17416  # kernels-src/sample.cu SAMPLE_WORK_WORDS: the per-row work area
SEED_MAX = 2**64 - 1
PENALTY_LIMIT = 2.0  # presence / frequency penalties lie in [-2, 2] (the OpenAI API's range)
# temperature, top_k, top_p, min_p, repetition, presence, frequency, reserved, seed_lo, seed_hi, reserved x 2
_ROW = struct.Struct("<fifffffiIIII")


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SamplingError(f"sampling: {name} = {value!r} is not a number")
    if not math.isfinite(value):
        raise SamplingError(f"sampling: {name} = {value!r} is not finite")
    return float(value)


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SamplingError(f"sampling: {name} = {value!r} is not an integer")
    return value


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling settings; the defaults are greedy decoding.

    temperature: >= 0; 0 is greedy (argmax, ties to the smallest token id). top_k: >= 0, 0 = off. top_p: in
    (0, 1], 1 = off. min_p: in [0, 1], 0 = off. repetition_penalty: > 0, 1 = off (a previous token's logit
    x becomes x / r when x > 0, else x * r). presence_penalty, frequency_penalty: in [-2, 2], subtracted once /
    per occurrence. seed: None or an integer in [0, 2^64 - 1] (the Philox key; `resolve_seed` draws one for
    None). logprobs: return the chosen token's log-probability to the caller; top_logprobs: 0..20 most
    probable tokens with theirs. Raises SamplingError for any value outside these ranges."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        if _number("temperature", self.temperature) < 0:
            raise SamplingError(f"sampling: temperature = {self.temperature!r} is below 0 (allowed: >= 0; 0 is greedy)")
        if _integer("top_k", self.top_k) < 0:
            raise SamplingError(f"sampling: top_k = {self.top_k!r} is below 0 (allowed: >= 0; 0 is off)")
        if not 0.0 < _number("top_p", self.top_p) <= 1.0:
            raise SamplingError(f"sampling: top_p = {self.top_p!r} is outside (0, 1] (1 is off)")
        if not 0.0 <= _number("min_p", self.min_p) <= 1.0:
            raise SamplingError(f"sampling: min_p = {self.min_p!r} is outside [0, 1] (0 is off)")
        if not _number("repetition_penalty", self.repetition_penalty) > 0.0:
            raise SamplingError(
                f"sampling: repetition_penalty = {self.repetition_penalty!r} is not above 0 (allowed: > 0; 1 is off)")
        for name, value in (("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)):
            if not -PENALTY_LIMIT <= _number(name, value) <= PENALTY_LIMIT:
                raise SamplingError(f"sampling: {name} = {value!r} is outside [-2, 2] (0 is off)")
        if self.seed is not None and not 0 <= _integer("seed", self.seed) <= SEED_MAX:
            raise SamplingError(f"sampling: seed = {self.seed!r} is outside [0, 2^64 - 1]")
        if not isinstance(self.logprobs, bool):
            raise SamplingError(f"sampling: logprobs = {self.logprobs!r} is not true or false")
        if not 0 <= _integer("top_logprobs", self.top_logprobs) <= MAX_TOP_LOGPROBS:
            raise SamplingError(f"sampling: top_logprobs = {self.top_logprobs!r} is outside [0, {MAX_TOP_LOGPROBS}]")

    @property
    def greedy(self) -> bool:
        """True when the kernel takes the argmax (temperature 0): the seed and the filters are unused."""
        return self.temperature == 0.0

    @property
    def penalizes(self) -> bool:
        """True when some penalty differs from neutral, so the row's history is read."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def resolve_seed(params: SamplingParams) -> SamplingParams:
    """`params` with a seed: its own, else 64 random bits (`secrets.randbits`). Call once per request, at
    admission, so every step of the request uses one key."""
    return params if params.seed is not None else replace(params, seed=secrets.randbits(64))


def sampler_splits(vocab: int) -> int:
    """The x extent of kern_sample_*'s grid for a vocabulary of `vocab` logits: cdiv(vocab, SAMPLE_SLICE), one
    block per 8192 logits of each row (the kernel writes nothing under any other grid)."""
    return -(-vocab // SAMPLE_SLICE)


def pack_params(rows: Sequence[SamplingParams]) -> bytes:
    """The kernel's `params` buffer: PARAM_ROW_BYTES (48) bytes per row, `len(rows) * 48` in all. Row layout
    (little-endian 4-byte words): f32 temperature, i32 top_k, f32 top_p, f32 min_p, f32 repetition_penalty,
    f32 presence_penalty, f32 frequency_penalty, i32 0, u32 seed low word, u32 seed high word, u32 0, u32 0.
    A greedy row may have no seed (packed as 0); a sampled row must have been through `resolve_seed`."""
    out = bytearray()
    for r, p in enumerate(rows):
        assert p.greedy or p.seed is not None, f"row {r}: sampled row without a seed (resolve_seed first)"
        seed = p.seed or 0
        out += _ROW.pack(p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty, p.presence_penalty,
                         p.frequency_penalty, 0, seed & 0xFFFFFFFF, seed >> 32, 0, 0)
    return bytes(out)


def history_counts(tokens: Iterable[int]) -> list[tuple[int, int]]:
    """(token id, count) for each distinct token of `tokens`, in order of first occurrence."""
    return list(Counter(tokens).items())


def pack_history(rows: Sequence[Sequence[tuple[int, int]]], hist_cap: int) -> tuple[bytes, bytes]:
    """The kernel's `hist_tokens` and `hist_counts` buffers: int32 [len(rows), hist_cap] each (4 * rows *
    hist_cap bytes), row r holding rows[r]'s (distinct token id, count) pairs then empty slots (token -1,
    count 0). Raises SamplingError when a row holds more than hist_cap pairs or repeats a token id."""
    tokens, counts = bytearray(), bytearray()
    for r, pairs in enumerate(rows):
        if len(pairs) > hist_cap:
            raise SamplingError(f"sampling: row {r} has {len(pairs)} distinct previous tokens, more than the "
                                f"history capacity {hist_cap}")
        ids = [t for t, _ in pairs]
        if len(set(ids)) != len(ids):
            raise SamplingError(f"sampling: row {r}'s history repeats a token id (expected distinct ids)")
        pad = hist_cap - len(pairs)
        tokens += struct.pack(f"<{hist_cap}i", *ids, *([-1] * pad))
        counts += struct.pack(f"<{hist_cap}i", *(c for _, c in pairs), *([0] * pad))
    return bytes(tokens), bytes(counts)


def unpack_outputs(raw: bytes, rows: int) -> list[tuple[int, float]]:
    """(token id, logprob) per row from the 8 * rows bytes of the output buffer (int32 tokens [rows], then
    float32 logprobs [rows])."""
    assert len(raw) >= OUTPUT_BYTES_PER_ROW * rows, (len(raw), rows)
    ids = struct.unpack_from(f"<{rows}i", raw, 0)
    lps = struct.unpack_from(f"<{rows}f", raw, 4 * rows)
    return list(zip(ids, lps))


def packed_token(value: int) -> int:
    """The token id of one packed `next_token` / ring entry (bits 0..31). A plain token id (an argmax manifest's
    entry, 0 <= id < 2^31) is returned unchanged."""
    return int(value) & 0xFFFFFFFF


def unpack_packed(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(token ids i32, logprobs f32) of packed int64 entries of any shape (`next_token` i64 [seqs], a ring row):
    token = bits 0..31, logprob = the f32 whose bit pattern is bits 32..63."""
    raw = np.ascontiguousarray(values, dtype="<i8").view("<u8")
    tokens = (raw & np.uint64(0xFFFFFFFF)).astype("<u4").view("<i4")
    logprobs = (raw >> np.uint64(32)).astype("<u4").view("<f4")
    return tokens, logprobs
