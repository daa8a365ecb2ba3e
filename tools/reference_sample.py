"""numpy references for kernels-src/sample.cu (contract: docs/kernels.md "Sampling").

- ``philox4x32_10``: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
  SC11; Random123's ``philox4x32`` with 10 rounds), vectorized over rows; ``sample_uniform`` the sampler's
  one uniform per (seed, position).
- ``penalize``: the in-place penalty step, rounded as the kernel rounds (float32 operations, then the
  buffer's dtype).
- ``thresholds`` / ``distribution``: the exact probability vector the kernel samples from after
  temperature, top-k, top-p and min-p (float32 logits and thresholds as the kernel forms them, masses summed
  in float64).
- ``draw`` / ``draw_agrees``: which token a uniform picks: the inverse CDF over the kept set in index order.
- ``chi2_sf``: the chi-square survival function (regularized upper incomplete gamma), for the GPU
  goodness-of-fit tests; numpy and the standard library only.

Logits travel as float32 arrays (bf16 logits: float32 holding bf16-representable values, as in
tools/reference_kernels.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tools.reference_kernels import bf16_round

PHILOX_M = (0xD2511F53, 0xCD9E8D57)  # multipliers
PHILOX_W = (0x9E3779B9, 0xBB67AE85)  # Weyl key increments
_MASK = np.uint64(0xFFFFFFFF)


def philox4x32_10(counter: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Philox4x32-10 blocks: counter [n, 4] and key [n, 2] (any unsigned ints below 2^32) -> [n, 4] uint32.
    Round r (r = 0..9) uses key + r * W (mod 2^32); a round maps (c0, c1, c2, c3) to
    (hi(M1*c2) ^ c1 ^ k0, lo(M1*c2), hi(M0*c0) ^ c3 ^ k1, lo(M0*c0))."""
    c = np.asarray(counter, dtype=np.uint64).reshape(-1, 4).copy()
    k = np.asarray(key, dtype=np.uint64).reshape(-1, 2).copy()
    m0, m1 = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1])
    for r in range(10):
        if r:
            k[:, 0] = (k[:, 0] + np.uint64(PHILOX_W[0])) & _MASK
            k[:, 1] = (k[:, 1] + np.uint64(PHILOX_W[1])) & _MASK
        p0 = m0 * c[:, 0]  # < 2^64: no wrap
        p1 = m1 * c[:, 2]
        c = np.stack([(p1 >> np.uint64(32)) ^ c[:, 1] ^ k[:, 0], p1 & _MASK,
                      (p0 >> np.uint64(32)) ^ c[:, 3] ^ k[:, 1], p0 & _MASK], axis=1)
    return c.astype(np.uint32)


def sample_uniform(seed: int, position: int) -> np.float32:
    """The sampler's uniform in [0, 1): word 0 of Philox4x32-10(counter = (position mod 2^32, 0, 0, 0),
    key = (seed mod 2^32, seed >> 32)), top 24 bits, times 2^-24."""
    w = philox4x32_10(np.array([[position & 0xFFFFFFFF, 0, 0, 0]]), np.array([[seed & 0xFFFFFFFF, seed >> 32]]))
    return np.float32((int(w[0, 0]) >> 8) * 2.0**-24)


def penalize(row: np.ndarray, tokens, counts, repetition: float, presence: float, frequency: float,
             dtype: str = "bf16") -> np.ndarray:
    """The row after the penalty step: for each (token, count > 0) with token in [0, len(row)):
    x' = (x > 0 ? x / repetition : x * repetition) - frequency * count - presence, each operation in float32,
    the result rounded to ``dtype`` ("bf16" or "f32"). A row whose three penalties are all neutral (1, 0, 0)
    is returned unchanged. row [vocab] float32 -> new [vocab] float32."""
    out = np.array(row, dtype=np.float32, copy=True)
    if repetition == 1.0 and presence == 0.0 and frequency == 0.0:
        return out
    rep, pres, freq = np.float32(repetition), np.float32(presence), np.float32(frequency)
    for tok, cnt in zip(tokens, counts):
        if cnt <= 0 or not 0 <= tok < out.size:
            continue
        x = out[tok]
        y = x / rep if x > 0 else x * rep
        y = (y - freq * np.float32(cnt)) - pres
        out[tok] = bf16_round(np.array([y], dtype=np.float32))[0] if dtype == "bf16" else y
    return out


def scaled(row: np.ndarray, temperature: float) -> np.ndarray:
    """l = x * float32(1 / temperature) in float32 (NaN -> -inf, -0 -> +0); temperature <= 0 scales by 1."""
    inv_t = np.float32(1.0) / np.float32(temperature) if temperature > 0 else np.float32(1.0)
    x = np.asarray(row, dtype=np.float32)
    return np.where(np.isnan(x), np.float32(-np.inf), x * inv_t + np.float32(0.0)).astype(np.float32)


@dataclass(frozen=True)
class Thresholds:
    """The kernel's thresholds over l (float32): kept = l >= thr."""

    m: np.float32  # max l
    t_k: np.float32  # -inf when top-k is off
    t_p: np.float32  # -inf when top-p is off
    t_min: np.float32  # -inf when min-p is off
    thr: np.float32


def thresholds(l: np.ndarray, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> Thresholds:
    """Thresholds by the kernel's definitions over l [vocab] float32 (at least one finite value):
    t_min = m + float32(log(min_p)); t_k = the top_k-th largest l (with multiplicity); t_p = the largest value
    v >= t_k with mass(l >= v) >= top_p * mass(l >= t_k), mass = sum exp(l - m) in float64. top_k <= 0 or
    >= vocab, top_p >= 1 and min_p <= 0 switch a filter off."""
    l = np.asarray(l, dtype=np.float32)
    n = l.size
    ninf = np.float32(-np.inf)
    m = np.float32(l.max())
    t_min = np.float32(m + np.float32(math.log(np.float32(min_p)))) if min_p > 0 else ninf  # min_p as packed
    s = np.sort(l)[::-1]  # descending
    p = np.exp(s.astype(np.float64) - float(m))
    t_k = np.float32(s[top_k - 1]) if 0 < top_k < n else ninf
    t_p = ninf
    if top_p < 1.0:
        # mass of l >= s[j]: the cumulative sum up to the last element equal to s[j]
        last = np.searchsorted(-s, -s, side="right") - 1
        mass_ge = np.cumsum(p)[last]
        z_k = p[s >= t_k].sum()
        ok = (s >= t_k) & (mass_ge >= float(np.float32(top_p)) * z_k)  # top_p as packed (float32)
        t_p = np.float32(s[ok].max())
    thr = np.float32(max(t_k, t_p, t_min))
    return Thresholds(m, t_k, t_p, t_min, thr)


def distribution(l: np.ndarray, thr: float) -> np.ndarray:
    """Probabilities [vocab] float64 of sampling each token: exp(l - m) over l >= thr, normalized."""
    l = np.asarray(l, dtype=np.float32)
    m = float(l.max())
    w = np.where(l >= thr, np.exp(l.astype(np.float64) - m), 0.0)
    return w / w.sum()


def sampling_distribution(row: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0,
                          min_p: float = 0.0) -> np.ndarray:
    """The whole pipeline after penalties: row [vocab] float32 (already penalized) -> probabilities [vocab]
    float64. temperature <= 0: a point mass on the greedy token."""
    if not temperature > 0:
        out = np.zeros(np.asarray(row).size)
        out[greedy(row)] = 1.0
        return out
    l = scaled(row, temperature)
    return distribution(l, thresholds(l, top_k, top_p, min_p).thr)


def draw(l: np.ndarray, thr: float, u: float) -> int:
    """The token the sampler draws with uniform u in [0, 1) from the kept set {l >= thr} of l [vocab] float32: the
    first index, in index order, where the running kept mass sum exp(l - m) (float64) exceeds u times its total
    (the inverse CDF over the vocabulary in index order)."""
    lo, hi = draw_interval(l, thr)
    target = float(u) * hi[-1]
    return int(np.flatnonzero((hi > lo) & (hi > target))[0])


def draw_interval(l: np.ndarray, thr: float) -> tuple[np.ndarray, np.ndarray]:
    """Each token's interval [lo, hi) of the running kept mass in index order (float64, unnormalized): the draw
    picks the token whose interval holds u times the total, hi[-1]. Tokens outside the kept set have lo == hi."""
    l = np.asarray(l, dtype=np.float32)
    m = float(l.max())
    w = np.where(l >= thr, np.exp(l.astype(np.float64) - m), 0.0)
    hi = np.cumsum(w)
    return hi - w, hi


def draw_agrees(l: np.ndarray, thr: float, u: float, token: int, rel: float = 1e-5) -> bool:
    """Whether a kernel's `token` is the draw of u over {l >= thr} up to float rounding: its interval of the
    running kept mass, widened by rel times the total on each side, holds u times the total (a kernel sums the
    masses in its own precision, so at an interval's edge either neighbour may come out)."""
    lo, hi = draw_interval(l, thr)
    if not 0 <= token < len(hi) or hi[token] == lo[token]:
        return False
    slack, target = rel * hi[-1], float(u) * hi[-1]
    return lo[token] - slack <= target < hi[token] + slack


def greedy(row: np.ndarray) -> int:
    """argmax with NaN below every number and ties to the smallest index (0 for an all-NaN row)."""
    x = np.asarray(row, dtype=np.float32)
    x = np.where(np.isnan(x), np.float32(-np.inf), x)
    return int(np.argmax(x))


def log_probs(row: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0,
              min_p: float = 0.0) -> np.ndarray:
    """Log-probabilities [vocab] float64 under the sampled distribution (-inf outside the kept set);
    temperature <= 0: the log-softmax of the row at temperature 1 with no filter (the greedy logprob)."""
    if temperature > 0:
        l = scaled(row, temperature)
        thr = thresholds(l, top_k, top_p, min_p).thr
    else:
        l, thr = scaled(row, 1.0), -np.inf
    return log_probs_at(l, thr)


def log_probs_at(l: np.ndarray, thr: float) -> np.ndarray:
    """Log-probabilities [vocab] float64 of l [vocab] float32 restricted to l >= thr (-inf elsewhere)."""
    l64 = np.asarray(l, dtype=np.float32).astype(np.float64)
    m = l64.max()
    kept = np.asarray(l) >= thr
    log_z = math.log(np.exp(l64[kept] - m).sum())
    return np.where(kept, l64 - m - log_z, -np.inf)


def rounding_boundary(l: np.ndarray, thr_a: float, thr_b: float, top_k: int, top_p: float, min_p: float,
                      rel: float = 1e-4) -> bool:
    """Whether two thresholds over l [vocab] differ only at a float-rounding boundary: no value of l lies
    strictly between them, and at the higher one either the top-p mass meets top_p * mass(l >= t_k) within
    ``rel`` of that mass, or the value sits within ``rel`` (relative to max(1, |m|)) of t_min. A kernel that
    sums its masses in float32 may decide such a boundary either way."""
    l = np.asarray(l, dtype=np.float32)
    lo, hi = min(thr_a, thr_b), max(thr_a, thr_b)
    if ((l > lo) & (l < hi)).any():
        return False
    t = thresholds(l, top_k, top_p, min_p)
    m = float(t.m)
    p = np.exp(l.astype(np.float64) - m)
    if top_p < 1.0:
        z_k = p[l >= t.t_k].sum()
        if abs(p[l >= hi].sum() - float(np.float32(top_p)) * z_k) <= rel * z_k:
            return True
    return min_p > 0 and abs(hi - float(t.t_min)) <= rel * max(1.0, abs(m))


def top_n(row: np.ndarray, temperature: float, n: int) -> np.ndarray:
    """Indices [n] of the n largest l (l desc, index asc), as kern_sample_top_logprobs orders them."""
    l = scaled(row, temperature)
    order = np.lexsort((np.arange(l.size), -l.astype(np.float64)))
    return order[:n]


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df): Q(df / 2, x / 2), the regularized upper incomplete gamma (series
    below a + 1, Lentz continued fraction above; Numerical Recipes 6.2), to ~1e-12 relative."""
    a, x2 = df / 2.0, x / 2.0
    if x2 <= 0:
        return 1.0
    log_front = a * math.log(x2) - x2 - math.lgamma(a)
    if x2 < a + 1:
        term = total = 1.0 / a
        ap = a
        for _ in range(10000):
            ap += 1
            term *= x2 / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = x2 + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(log_front) * h


def chi_square(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> tuple[float, int, float]:
    """Pearson's goodness of fit of observed counts [vocab] to probs [vocab]: cells whose expected count is
    below ``min_expected`` are pooled into one cell (dropped if that cell still expects less). Returns
    (statistic, degrees of freedom, p-value). Raises ValueError where a count falls on a probability of 0."""
    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    impossible = counts[probs == 0].sum()
    if impossible:
        raise ValueError(f"{int(impossible)} draws fell on tokens of probability 0")
    total = counts.sum()
    expected = probs * total
    big = expected >= min_expected
    obs = list(counts[big])
    exp = list(expected[big])
    if expected[~big].sum() >= min_expected:
        obs.append(counts[~big].sum())
        exp.append(expected[~big].sum())
    obs_a, exp_a = np.array(obs), np.array(exp)
    stat = float(((obs_a - exp_a) ** 2 / exp_a).sum())
    df = len(obs) - 1
    return stat, df, chi2_sf(stat, df) if df > 0 else 1.0
