"""CPU checks of tools/reference_step.py, the reference the step GPU tests compare against: the packed advance
writes the inputs the plain one writes for the same tokens, packs (token, logprob) as kern_run.sampling unpacks
it, and the init's greedy row is kern_run.sampling.pack_params' (the two written independently)."""

from __future__ import annotations

import numpy as np

from kern_run.sampling import SamplingParams, pack_params, unpack_packed
from tools.reference_step import GREEDY_PARAM_WORDS, decode_advance, decode_advance_packed, pack, sample_inputs_init


def test_greedy_words_are_pack_params_default_row() -> None:
    assert np.asarray(GREEDY_PARAM_WORDS, "<u4").tobytes() == pack_params([SamplingParams()])


def test_pack_layout() -> None:
    assert pack(5, 0.0) == 5
    assert pack(5, -0.0) == 5 - 2**63  # only the sign bit of the high word
    assert pack(151935, -1.0) == (0xBF800000 << 32 | 151935) - 2**64
    assert pack(-1, 0.0) == 0xFFFFFFFF  # the token's int32 bits, not sign-extended


def test_packed_advance_is_the_plain_advance_plus_the_logprob() -> None:
    rng = np.random.default_rng(0)
    n, page_tokens, bt_stride, max_pos, ring_len = 50, 16, 6, 90, 5
    bt = rng.integers(-2, 300, size=(n, bt_stride)).astype(np.int32)
    pos0 = rng.integers(-2, max_pos + 3, size=n).astype(np.int32)
    tokens = rng.integers(0, 151936, size=n).astype(np.int32)
    lp = (-rng.exponential(3.0, size=n)).astype(np.float32)
    plain = [np.zeros(n, np.int32), pos0.copy(), np.zeros(n, np.int32), np.zeros(n, np.int32)]
    plain_ring = np.zeros((n, ring_len), np.int64)
    decode_advance(tokens.astype(np.int64), plain[0], plain[1], plain[2], plain[3], bt, plain_ring, n, page_tokens,
                   bt_stride, max_pos)
    packed = [np.zeros(n, np.int32), pos0.copy(), np.zeros(n, np.int32), np.zeros(n, np.int32)]
    ring, nxt = np.zeros((n, ring_len), np.int64), np.zeros(n, np.int64)
    decode_advance_packed(tokens, lp, nxt, packed[0], packed[1], packed[2], packed[3], bt, ring, n, page_tokens,
                          bt_stride, max_pos)
    for a, b in zip(plain, packed):
        np.testing.assert_array_equal(a, b)
    got_t, got_lp = unpack_packed(nxt)
    np.testing.assert_array_equal(got_t, tokens)
    np.testing.assert_array_equal(got_lp, lp)
    written = plain_ring != 0
    ring_t, ring_lp = unpack_packed(ring)
    np.testing.assert_array_equal(ring_t[written], plain_ring[written])
    rows = np.nonzero(written)[0]
    np.testing.assert_array_equal(ring_lp[written], lp[rows])


def test_inputs_init_touches_its_rows_only() -> None:
    params = np.full((4, 12), 7, np.uint32)
    toks, counts = np.full((4, 3), 9, np.int32), np.full((4, 3), 9, np.int32)
    sample_inputs_init(params, toks, counts, 3)
    assert params[:3].tobytes() == pack_params([SamplingParams()] * 3) and params[3].tolist() == [7] * 12
    assert toks[:3].tolist() == [[-1] * 3] * 3 and counts[:3].tolist() == [[0] * 3] * 3
    assert toks[3].tolist() == [9] * 3 and counts[3].tolist() == [9] * 3
