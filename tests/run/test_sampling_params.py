"""CPU tests of kern_run.sampling: parameter validation (one typed error naming the value and the range) and
the exact bytes of the per-row buffers the sampler kernel reads (docs/kernels.md "Sampling")."""

from __future__ import annotations

import struct

import pytest

from kern_run.errors import InputError, SamplingError
from kern_run.sampling import (
    OUTPUT_BYTES_PER_ROW, PARAM_ROW_BYTES, SamplingParams, history_counts, pack_history, pack_params,
    resolve_seed, unpack_outputs,
)


@pytest.mark.parametrize("field,value,message", [
    ("temperature", -0.5, "temperature = -0.5 is below 0 (allowed: >= 0; 0 is greedy)"),
    ("temperature", float("nan"), "temperature = nan is not finite"),
    ("temperature", "hot", "temperature = 'hot' is not a number"),
    ("top_k", -1, "top_k = -1 is below 0 (allowed: >= 0; 0 is off)"),
    ("top_k", 2.5, "top_k = 2.5 is not an integer"),
    ("top_k", True, "top_k = True is not an integer"),
    ("top_p", 0.0, "top_p = 0.0 is outside (0, 1] (1 is off)"),
    ("top_p", 1.01, "top_p = 1.01 is outside (0, 1] (1 is off)"),
    ("min_p", -0.1, "min_p = -0.1 is outside [0, 1] (0 is off)"),
    ("min_p", 1.5, "min_p = 1.5 is outside [0, 1] (0 is off)"),
    ("repetition_penalty", 0.0, "repetition_penalty = 0.0 is not above 0 (allowed: > 0; 1 is off)"),
    ("presence_penalty", 2.5, "presence_penalty = 2.5 is outside [-2, 2] (0 is off)"),
    ("frequency_penalty", -3, "frequency_penalty = -3 is outside [-2, 2] (0 is off)"),
    ("seed", 1.0, "seed = 1.0 is not an integer"),
    ("seed", "7", "seed = '7' is not an integer"),
    ("seed", -1, "seed = -1 is outside [0, 2^64 - 1]"),
    ("seed", 2**64, "seed = 18446744073709551616 is outside [0, 2^64 - 1]"),
    ("logprobs", 1, "logprobs = 1 is not true or false"),
    ("top_logprobs", 21, "top_logprobs = 21 is outside [0, 20]"),
])
def test_bad_values_raise_one_typed_error_naming_value_and_range(field, value, message):
    with pytest.raises(SamplingError) as info:
        SamplingParams(**{field: value})
    assert str(info.value) == f"sampling: {message}"
    assert isinstance(info.value, InputError)


def test_edges_of_each_range_are_accepted():
    p = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=1.0, repetition_penalty=1e-3,
                       presence_penalty=-2.0, frequency_penalty=2, seed=2**64 - 1, top_logprobs=20)
    assert p.greedy and p.penalizes
    assert not SamplingParams().penalizes
    assert not SamplingParams(temperature=0.1).greedy


def test_resolve_seed_keeps_a_given_seed_and_draws_64_bits_otherwise():
    assert resolve_seed(SamplingParams(seed=5)).seed == 5
    drawn = {resolve_seed(SamplingParams()).seed for _ in range(4)}
    assert len(drawn) == 4 and all(0 <= s < 2**64 for s in drawn)


def test_pack_params_exact_layout():
    rows = [SamplingParams(),
            SamplingParams(temperature=0.75, top_k=50, top_p=0.5, min_p=0.25, repetition_penalty=1.5,
                           presence_penalty=-0.5, frequency_penalty=0.125, seed=0x0123456789ABCDEF)]
    raw = pack_params(rows)
    assert len(raw) == 2 * PARAM_ROW_BYTES == 96
    assert struct.unpack_from("<fifffffiIIII", raw, 0) == (0.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0, 0, 0, 0, 0, 0)
    assert struct.unpack_from("<fifffffiIIII", raw, 48) == (
        0.75, 50, 0.5, 0.25, 1.5, -0.5, 0.125, 0, 0x89ABCDEF, 0x01234567, 0, 0)


def test_pack_params_refuses_an_unseeded_sampled_row_as_a_kern_bug():
    with pytest.raises(AssertionError, match="row 0: sampled row without a seed"):
        pack_params([SamplingParams(temperature=1.0)])


def test_history_counts_and_pack_history_exact():
    pairs = history_counts([7, 3, 7, 7, 9])
    assert pairs == [(7, 3), (3, 1), (9, 1)]
    tokens, counts = pack_history([pairs, []], hist_cap=4)
    assert struct.unpack("<8i", tokens) == (7, 3, 9, -1, -1, -1, -1, -1)
    assert struct.unpack("<8i", counts) == (3, 1, 1, 0, 0, 0, 0, 0)


def test_pack_history_refusals():
    with pytest.raises(SamplingError, match=r"^sampling: row 1 has 3 distinct previous tokens, more than the history capacity 2$"):
        pack_history([[], [(1, 1), (2, 1), (3, 1)]], hist_cap=2)
    with pytest.raises(SamplingError, match=r"row 0's history repeats a token id"):
        pack_history([[(1, 1), (1, 2)]], hist_cap=4)


def test_unpack_outputs_tokens_then_logprobs():
    raw = struct.pack("<3i3f", 5, 0, 151935, -0.5, 0.0, -2.25)
    assert len(raw) == 3 * OUTPUT_BYTES_PER_ROW
    assert unpack_outputs(raw, 3) == [(5, -0.5), (0, 0.0), (151935, -2.25)]
