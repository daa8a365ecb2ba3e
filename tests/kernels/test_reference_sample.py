"""CPU tests of the sampler references (tools/reference_sample.py) that the GPU tests compare
kernels-src/sample.cu with: Philox4x32-10 against Random123's published known answers, the penalty rounding,
each filter's threshold and probability vector on hand-computed cases, and the chi-square p-value."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tools import reference_sample as rs

# Random123 (github.com/DEShawResearch/random123), tests/kat_vectors, the three "philox4x32 10" lines:
# counter (4 words), key (2 words), expected (4 words)
PHILOX_KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def test_philox_matches_random123_known_answers():
    ctr = np.array([c for c, _, _ in PHILOX_KAT], dtype=np.uint32)
    key = np.array([k for _, k, _ in PHILOX_KAT], dtype=np.uint32)
    want = np.array([w for _, _, w in PHILOX_KAT], dtype=np.uint32)
    np.testing.assert_array_equal(rs.philox4x32_10(ctr, key), want)


def test_sample_uniform_is_word0_top_24_bits():
    # counter (5, 0, 0, 0), key (seed lo, seed hi)
    seed = 0x0123456789ABCDEF
    w = rs.philox4x32_10(np.array([[5, 0, 0, 0]]), np.array([[0x89ABCDEF, 0x01234567]]))
    u = rs.sample_uniform(seed, 5)
    assert u == np.float32((int(w[0, 0]) >> 8) / 2**24)
    assert 0.0 <= u < 1.0
    assert rs.sample_uniform(seed, 5) == u and rs.sample_uniform(seed, 6) != u and rs.sample_uniform(seed + 1, 5) != u
    assert rs.sample_uniform(0, 0) == np.float32(0x6627E8D5 >> 8) / np.float32(2**24)


def test_penalize_hand_cases_and_bf16_rounding():
    row = np.array([2.0, -2.0, 3.0, 1.0, 0.0], dtype=np.float32)
    # token 0 (x > 0): 2 / 1.5 - 0.25 * 2 - 0.5 = 0.3333; token 1 (x < 0): -2 * 1.5 - 0.25 - 0.5 = -3.75
    out = rs.penalize(row, [0, 1, 4, 9, 3], [2, 1, 1, 1, 0], 1.5, 0.5, 0.25, dtype="f32")
    expect0 = (np.float32(2.0) / np.float32(1.5) - np.float32(0.5)) - np.float32(0.5)
    np.testing.assert_array_equal(out, np.array([expect0, -3.75, 3.0, 1.0, -0.75], dtype=np.float32))
    out_bf = rs.penalize(row, [0], [2], 1.5, 0.5, 0.25, dtype="bf16")
    assert out_bf[0] == np.float32(0.333984375)  # 0.33333 rounded to bf16 (8 bits of mantissa)
    np.testing.assert_array_equal(rs.penalize(row, [0], [5], 1.0, 0.0, 0.0), row)


def test_scaled_maps_nan_to_minus_inf_and_greedy_ties_to_smallest_index():
    row = np.array([1.0, np.nan, 3.0, 3.0], dtype=np.float32)
    np.testing.assert_array_equal(rs.scaled(row, 0.5), np.array([2.0, -np.inf, 6.0, 6.0], dtype=np.float32))
    assert rs.greedy(row) == 2
    assert rs.greedy(np.array([np.nan, np.nan], dtype=np.float32)) == 0


LOGS = np.log(np.array([0.4, 0.3, 0.15, 0.1, 0.05])).astype(np.float32)  # probabilities at T = 1


def test_top_k_keeps_the_k_largest_with_ties_at_the_boundary():
    t = rs.thresholds(LOGS, top_k=2)
    assert t.thr == LOGS[1]
    np.testing.assert_allclose(rs.distribution(LOGS, t.thr), [0.4 / 0.7, 0.3 / 0.7, 0, 0, 0], rtol=1e-6)
    tied = np.array([1.0, 0.0, 0.0, -1.0], dtype=np.float32)  # the 2nd largest value is held twice
    np.testing.assert_allclose(rs.distribution(tied, rs.thresholds(tied, top_k=2).thr),
                               np.array([np.e, 1, 1, 0]) / (np.e + 2), rtol=1e-6)
    assert rs.thresholds(LOGS, top_k=5).thr == -np.inf  # k >= vocab: off


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    # cumulative 0.4, 0.7, 0.85, 0.95, 1.0: top_p 0.7 keeps 2, 0.71 keeps 3, 0.3 keeps 1
    for top_p, kept in ((0.7, 2), (0.71, 3), (0.3, 1), (0.96, 5)):
        probs = rs.distribution(LOGS, rs.thresholds(LOGS, top_p=top_p).thr)
        p = np.exp(LOGS.astype(np.float64))
        np.testing.assert_allclose(probs, np.where(np.arange(5) < kept, p, 0) / p[:kept].sum(), rtol=1e-6)


def test_top_p_after_top_k_renormalizes_over_the_top_k():
    # top-k 3: 0.4, 0.3, 0.15 renormalized: 0.47, 0.35, 0.18 -> top_p 0.8 keeps 2 (0.82 >= 0.8)
    t = rs.thresholds(LOGS, top_k=3, top_p=0.8)
    assert t.t_k == LOGS[2] and t.t_p == LOGS[1] and t.thr == LOGS[1]
    # without top-k, 0.8 needs 3 (0.85)
    assert rs.thresholds(LOGS, top_p=0.8).thr == LOGS[2]


def test_min_p_keeps_probabilities_at_least_min_p_times_the_largest():
    # 0.4 * 0.3 = 0.12: keeps 0.4, 0.3, 0.15
    probs = rs.distribution(LOGS, rs.thresholds(LOGS, min_p=0.3).thr)
    np.testing.assert_allclose(probs, [0.4 / 0.85, 0.3 / 0.85, 0.15 / 0.85, 0, 0], rtol=1e-6)


def test_temperature_sharpens_and_greedy_is_a_point_mass():
    probs = rs.sampling_distribution(LOGS, 0.5)  # p^2 normalized
    p2 = np.array([0.4, 0.3, 0.15, 0.1, 0.05]) ** 2
    np.testing.assert_allclose(probs, p2 / p2.sum(), rtol=1e-5)
    np.testing.assert_array_equal(rs.sampling_distribution(LOGS, 0.0), [1, 0, 0, 0, 0])


def test_log_probs_of_the_filtered_distribution_and_greedy():
    lp = rs.log_probs(LOGS, 1.0, top_k=2)
    np.testing.assert_allclose(lp[:2], np.log([0.4 / 0.7, 0.3 / 0.7]), rtol=1e-6)
    assert np.all(lp[2:] == -np.inf)
    np.testing.assert_allclose(rs.log_probs(LOGS, 0.0, top_k=2), np.log([0.4, 0.3, 0.15, 0.1, 0.05]), rtol=1e-5)


def test_top_n_orders_by_value_then_index():
    row = np.array([0.5, 2.0, 0.5, 3.0, 2.0], dtype=np.float32)
    np.testing.assert_array_equal(rs.top_n(row, 1.0, 4), [3, 1, 4, 0])


@pytest.mark.parametrize("df,x,p", [(1, 10.828, 1e-3), (4, 18.467, 1e-3), (10, 29.588, 1e-3), (10, 9.342, 0.5),
                                    (99, 148.230, 1e-3), (2, 2.0, math.exp(-1.0))])
def test_chi2_sf_matches_published_critical_values(df, x, p):
    assert rs.chi2_sf(x, df) == pytest.approx(p, rel=2e-3)


def test_chi_square_pools_small_cells_and_refuses_impossible_draws():
    probs = np.array([0.5, 0.25, 0.25, 0.0])
    stat, df, pval = rs.chi_square(np.array([50, 25, 25, 0]), probs)
    assert (stat, df, pval) == (0.0, 2, 1.0)
    stat, df, _ = rs.chi_square(np.array([60, 20, 20, 0]), probs)
    assert df == 2 and stat == pytest.approx(100 / 50 + 25 / 25 + 25 / 25)
    with pytest.raises(ValueError, match="1 draws fell on tokens of probability 0"):
        rs.chi_square(np.array([50, 25, 24, 1]), probs)


def test_log_probs_at_and_rounding_boundary():
    np.testing.assert_allclose(rs.log_probs_at(LOGS, LOGS[1]), [np.log(0.4 / 0.7), np.log(0.3 / 0.7), -np.inf,
                                                                -np.inf, -np.inf], rtol=1e-6)
    # top_p 0.7 is met exactly by the two largest (0.4 + 0.3): keeping 2 or 3 is a rounding boundary
    assert rs.rounding_boundary(LOGS, LOGS[1], LOGS[2], 0, 0.7, 0.0)
    # 0.6 is not near a cumulative mass (0.4, 0.7): not a boundary; nor thresholds with a value between them
    assert not rs.rounding_boundary(LOGS, LOGS[1], LOGS[2], 0, 0.6, 0.0)
    assert not rs.rounding_boundary(LOGS, LOGS[0], LOGS[2], 0, 0.7, 0.0)
    # min_p 0.375 puts t_min at log(0.15): 0.15 and 0.1 straddle it only by rounding
    assert rs.rounding_boundary(LOGS, LOGS[2], LOGS[3], 0, 1.0, 0.375)
    assert not rs.rounding_boundary(LOGS, LOGS[2], LOGS[3], 0, 1.0, 0.3)


def test_draw_is_the_inverse_cdf_in_index_order():
    # masses exp(l - m) of [0.1, 0.4, 0.2, 0.3] in index order: intervals [0, .1) [.1, .5) [.5, .7) [.7, 1)
    l = np.log(np.array([0.1, 0.4, 0.2, 0.3])).astype(np.float32)
    lo, hi = rs.draw_interval(l, -np.inf)
    np.testing.assert_allclose(hi / hi[-1], [0.1, 0.5, 0.7, 1.0], rtol=1e-6)
    np.testing.assert_allclose(lo, hi - np.exp(l.astype(np.float64) - l.max()))
    assert [rs.draw(l, -np.inf, u) for u in (0.0, 0.09, 0.11, 0.49, 0.51, 0.69, 0.71, 0.999)] == [0, 0, 1, 1, 2, 2, 3, 3]
    # a threshold drops the tokens below it and renormalizes the rest: 0.4 and 0.3 over 0.7
    assert [rs.draw(l, l[3], u) for u in (0.0, 0.57, 0.58, 0.99)] == [1, 1, 3, 3]
    assert rs.draw_agrees(l, -np.inf, 0.3, 1) and not rs.draw_agrees(l, -np.inf, 0.3, 2)
    # at an interval's edge either neighbour agrees within rel; a dropped token never does
    assert rs.draw_agrees(l, -np.inf, 0.1 + 1e-7, 0) and rs.draw_agrees(l, -np.inf, 0.1 + 1e-7, 1)
    assert not rs.draw_agrees(l, -np.inf, 0.1 + 1e-3, 0)
    assert not rs.draw_agrees(l, l[3], 0.01, 0) and not rs.draw_agrees(l, l[3], 0.01, 7)
