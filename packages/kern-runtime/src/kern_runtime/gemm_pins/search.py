"""The pin searches, host logic over a `GemmBench`: which cuBLASLt configuration to pin for one (n, k) GEMM.

`pick_prefill_pin` is the batch-invariant search (kern_runtime.gemm_pins, steps 1-4): candidates without
split-K, each checked to apply at M = 1 and M = m_max, proven invariant (the rows of a GEMM at M = m_max equal,
bit for bit, the same rows computed as separate GEMMs of every probe M), then timed; the fastest invariant one
wins. `pick_decode_pin` picks the fastest applicable configuration at M = 1 (split-K allowed: decode caches
nothing it computes, so no invariance is needed), graph-timed. `pick_invariant_decode_pin` picks, split-K
allowed, a configuration proven row-invariant over the batched decode's M = 1 .. 64 (`--batch-invariant`
manifests run it at every decode bucket). The device side is kern_runtime.gemm_pins.bench;
CPU tests drive these functions with a numpy bench (tests/runtime/test_gemm_pins_cpu.py).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import numpy as np

from ..errors import PinSearchError

Pin = dict[str, int]  # a cuBLASLt algorithm configuration: kern_runtime.cuda.ALGO_KEYS -> value ("id" always)
Log = Callable[[str], None]

# the row counts recomputed against M = m_max (and m_max - 1); 1 .. 64 in powers of two are the batched decode's
# buckets, which `--batch-invariant` manifests run on these pins too
PROBE_MS = (1, 2, 3, 4, 7, 8, 16, 17, 32, 64, 100, 511)
TIMED_MS = (512,)  # timed besides m_max
CANDIDATE_MS = (1, 64, 512)  # the heuristic asked at these M (and at m_max)
HEURISTIC_COUNT = 24  # results asked of cuBLASLt's heuristic per M (prefill)
DECODE_COUNT = 32  # ... at M = 1 (decode), and at each of INVARIANT_DECODE_CANDIDATE_MS (invariant decode)
# the invariant decode pins: proven up to M = 64 (the batched decode's largest bucket, kern_run.cli SERVE_SEQS_MAX),
# candidates asked at three bucket sizes, timed (graph) at the same three
INVARIANT_DECODE_M_MAX = 64
INVARIANT_DECODE_CANDIDATE_MS = (1, 8, 64)
INVARIANT_DECODE_TIMED_MS = (1, 8, 64)
# cublasLtReductionScheme_t (nvmath.bindings.cublasLt.ReductionScheme): how a split-K configuration adds its
# partial sums. COMPUTE_TYPE / OUTPUT_TYPE: each split writes its partial tile to the workspace and a separate
# reduction adds the `split_k` partials of an element in split order (fixed by the configuration, not by M).
# INPLACE: the splits add into the output buffer itself, serialised by counters in the workspace: their order is
# whichever split arrives first, so it is refused whatever one test run shows
REDUCTION_NONE, REDUCTION_INPLACE, REDUCTION_COMPUTE_TYPE, REDUCTION_OUTPUT_TYPE = 0, 1, 2, 4


class GemmBench(Protocol):
    """One (n, k) bf16 GEMM `C[m, n] = A[m, k] @ W[n, k]^T` on random data, for M up to `m_max` (A holds m_max
    rows). kern_runtime.gemm_pins.bench.DeviceBench is the cuBLASLt one."""

    n: int
    k: int
    m_max: int

    def candidates(self, ms: Sequence[int], count: int, split_k: bool) -> list[Pin]:
        """Distinct configurations of cuBLASLt's heuristic (up to `count` per M) at each M of `ms`, in the order
        found; without split-K or a reduction scheme unless `split_k`."""

    def applies(self, pin: Pin, m: int) -> bool:
        """Whether `pin` applies at M = `m` (cublasLtMatmulAlgoCheck, as the runtime checks at load)."""

    def rows(self, first_row: int, m: int, pin: Pin | None) -> np.ndarray:
        """C of A's rows [first_row, first_row + m) computed as one GEMM of M = m from the start of its own
        buffer (as a prefill chunk is): uint16 [m, n], bf16 bits. `pin` None: the heuristic's choice."""

    def time_us(self, m: int, pin: Pin | None) -> float:
        """Median microseconds of one GEMM at M = `m`, launched back to back."""

    def time_graph_us(self, m: int, pin: Pin | None) -> float:
        """Median microseconds of one GEMM at M = `m` inside a captured CUDA graph (no host in the way)."""


def probe_ms(m_max: int) -> list[int]:
    """The M of each recomputation the invariance proof compares with M = m_max: PROBE_MS below m_max, then
    m_max - 1 (none at m_max = 1)."""
    ms = [m for m in PROBE_MS if m < m_max]
    if m_max > 1 and m_max - 1 not in ms:
        ms.append(m_max - 1)
    return ms


def timed_ms(m_max: int) -> list[int]:
    """The M a prefill pin is timed at: TIMED_MS below m_max, and m_max."""
    return sorted({m for m in TIMED_MS if m < m_max} | {m_max})


def is_invariant(bench: GemmBench, pin: Pin | None) -> bool:
    """Rows recomputed at each probe M (`probe_ms`: a window of A's rows centred in [0, m_max)) equal the
    M = m_max result bit for bit."""
    full = bench.rows(0, bench.m_max, pin)  # uint16 [m_max, n]
    for m in probe_ms(bench.m_max):
        first = (bench.m_max - m) // 2
        if not np.array_equal(bench.rows(first, m, pin), full[first:first + m]):
            return False
    return True


def invariant_decode_ms() -> list[int]:
    """The M a candidate invariant decode pin must apply at: every M the invariance proof runs at M_max = 64
    (`probe_ms(64)`: the decode buckets 1, 2, 4, 8, 16, 32, the odd probes 3, 7, 17, and 63) and 64 itself."""
    return sorted(set(probe_ms(INVARIANT_DECODE_M_MAX)) | {INVARIANT_DECODE_M_MAX})


def reduction_refusal(pin: Pin) -> str | None:
    """Why `pin`'s split-K reduction cannot be batch-invariant, or None. Refused: the in-place reduction (order of
    arrival), a scheme outside NONE / COMPUTE_TYPE / OUTPUT_TYPE, and a split (split_k > 1) naming no scheme."""
    reduction, split = pin.get("reduction", REDUCTION_NONE), pin.get("split_k", 1)
    if reduction == REDUCTION_INPLACE:
        return "in-place split-K reduction (order of arrival)"
    if reduction not in (REDUCTION_NONE, REDUCTION_COMPUTE_TYPE, REDUCTION_OUTPUT_TYPE):
        return f"reduction scheme {reduction} (not NONE, COMPUTE_TYPE or OUTPUT_TYPE)"
    if split > 1 and reduction == REDUCTION_NONE:
        return f"split_k {split} with no reduction scheme named"
    return None


def _time_key(m: int, m_max: int, prefix: str) -> str:
    return f"{prefix}us_max" if m == m_max else f"{prefix}us_{m}"


Best = tuple[float, Pin, dict[int, float]]  # (sum of the times, the pin, M -> microseconds)


def _fastest_invariant(bench: GemmBench, pins: Sequence[Pin], ms: Sequence[int], time: Callable[[int, Pin], float],
                       timed: Sequence[int], digits: int, log: Log,
                       refusal: Callable[[Pin], str | None] = lambda pin: None) -> tuple[Best | None, int, int]:
    """The search loop both invariant searches share: in order, each pin `refusal` names is dropped (logged), each
    that does not apply at every M of `ms` is passed over, each that applies is proven (`is_invariant`), and each
    invariant one timed by `time` at every M of `timed` (logged to `digits` decimals); the least sum wins, the
    first on a tie. Returns (the best or None, how many were refused, how many applied)."""
    n, k = bench.n, bench.k
    best: Best | None = None
    refused = applicable = 0
    for pin in pins:
        why = refusal(pin)
        if why is not None:
            refused += 1
            log(f"  n={n} k={k} {pin}: refused, {why}")
            continue
        if not all(bench.applies(pin, m) for m in ms):
            continue
        applicable += 1
        if not is_invariant(bench, pin):
            log(f"  n={n} k={k} {pin}: not batch-invariant")
            continue
        times = {m: time(m, pin) for m in timed}
        log(f"  n={n} k={k} {pin}: invariant, " + ", ".join(f"M={m} {t:.{digits}f} us" for m, t in times.items()))
        if best is None or sum(times.values()) < best[0]:
            best = (sum(times.values()), pin, times)
    return best, refused, applicable


def pick_prefill_pin(bench: GemmBench, log: Log | None = None) -> dict[str, Any]:
    """The fastest batch-invariant configuration of `bench`'s shape, by the sum of its times at `timed_ms`.

    Returns the pins-file row `{"n", "k", "algo": Pin, "us_512", "us_max", "heuristic_us_512",
    "heuristic_us_max", "heuristic_invariant": bool, "candidates": int}` (times in microseconds, rounded to
    0.01; `us_512` only when m_max > 512). Raises PinSearchError naming the shape and how many candidates
    there were and applied when none is invariant. `log` (default: silent) gets one line per candidate."""
    log = log or (lambda msg: None)
    n, k, m_max = bench.n, bench.k, bench.m_max
    timed = timed_ms(m_max)
    heuristic = {m: bench.time_us(m, None) for m in timed}
    heuristic_invariant = is_invariant(bench, None)
    cands = bench.candidates(sorted({m for m in CANDIDATE_MS if m <= m_max} | {m_max}), HEURISTIC_COUNT, False)
    best, _, applicable = _fastest_invariant(bench, cands, (1, m_max), bench.time_us, timed, 1, log)
    if best is None:
        raise PinSearchError(f"no batch-invariant cuBLASLt configuration for n={n} k={k} up to M = {m_max} "
                             f"({len(cands)} candidates, {applicable} applicable)")
    _, pin, times = best
    row: dict[str, Any] = {"n": n, "k": k, "algo": pin}
    row.update({_time_key(m, m_max, ""): round(t, 2) for m, t in times.items()})
    row.update({_time_key(m, m_max, "heuristic_"): round(t, 2) for m, t in heuristic.items()})
    row["heuristic_invariant"] = heuristic_invariant
    row["candidates"] = len(cands)
    return row


def pick_decode_pin(bench: GemmBench, log: Log | None = None) -> dict[str, Any]:
    """The fastest applicable configuration at M = 1 (split-K allowed), graph-timed, against the heuristic's own.

    Returns the `decode_pins` row `{"n", "k", "algo": Pin, "us_1", "heuristic_us_1", "candidates"}`
    (microseconds, rounded to 0.01). Raises PinSearchError when no candidate applies."""
    log = log or (lambda msg: None)
    n, k = bench.n, bench.k
    heuristic = bench.time_graph_us(1, None)
    cands = bench.candidates([1], DECODE_COUNT, True)
    best: tuple[float, Pin] | None = None
    for pin in cands:
        if not bench.applies(pin, 1):
            continue
        t = bench.time_graph_us(1, pin)
        log(f"  M=1 n={n} k={k} {pin}: {t:.2f} us")
        if best is None or t < best[0]:
            best = (t, pin)
    if best is None:
        raise PinSearchError(f"no applicable cuBLASLt configuration at M = 1 for n={n} k={k} "
                             f"({len(cands)} candidates)")
    return {"n": n, "k": k, "algo": best[1], "us_1": round(best[0], 2), "heuristic_us_1": round(heuristic, 2),
            "candidates": len(cands)}


def pick_invariant_decode_pin(bench: GemmBench, log: Log | None = None, fallback: Pin | None = None) -> dict[str, Any]:
    """The fastest configuration of `bench`'s shape (split-K allowed) that is batch-invariant over M = 1 .. 64: what
    a `--batch-invariant` decode runs at every bucket. `bench.m_max` must be INVARIANT_DECODE_M_MAX (64).

    1. candidates: cuBLASLt's heuristic at M = 1, 8 and 64 (DECODE_COUNT results each, split-K and reduction
       schemes included), deduplicated; those `reduction_refusal` names (the in-place reduction) are dropped;
    2. applicability at every M of `invariant_decode_ms` (cublasLtMatmulAlgoCheck: a split-K configuration whose
       workspace outgrows 32 MiB at some M fails here);
    3. invariance (`is_invariant` at m_max = 64: the rows at M = 64 equal, bit for bit, those rows recomputed at
       M = 1, 2, 3, 4, 7, 8, 16, 17, 32, 63). A split-K configuration sums each element's k products in
       `split_k` fixed chunks and adds the chunks in a fixed order; this proves the order does not depend on M;
    4. speed: graph-timed at M = 1, 8 and 64 (`time_graph_us`, as the decode runs inside a CUDA graph).

    Cost: the sum of the three times. Each is one projection of a decode step at a bucket a server runs (1: a lone
    request, 8: a typical batch, 64: the largest bucket), so the sum weighs each bucket by its own cost: a
    configuration fast at M = 1 only (many splits) but slow at M = 64 (its reduction adds 64 rows of partials)
    loses to one good at all three, which the time at M = 1 alone (pick_decode_pin's cost) would not see. The
    three are of one magnitude at these M (weight-read bound: the prefill-pin decode of the 4B measured 6.54,
    5.83 and 7.34 ms per step at 1, 8 and 64 rows, docs/perf.md), so no one of them drowns the others.

    `fallback`: the shape's prefill pin (no split-K, proven invariant up to its own m_max >= 64 by
    pick_prefill_pin), a candidate besides the heuristic's, so the result is never slower than the decode on the
    prefill pins and a shape whose split-K candidates all fail still gets a pin (its row says
    `"fallback": "prefill"` when it wins). It goes through steps 2-4 like the others.

    Returns the `invariant_decode_pins` row `{"n", "k", "algo": Pin, "us_1", "us_8", "us_64", "m_max": 64,
    "candidates": int}` (microseconds, rounded to 0.01; `candidates` counts the heuristic's distinct ones before
    any refusal, the fallback not included). Raises PinSearchError naming the shape and how many candidates there
    were, were refused for their reduction, and applied, when none is invariant. `log` (default: silent) gets one
    line per candidate."""
    log = log or (lambda msg: None)
    n, k, m_max = bench.n, bench.k, bench.m_max
    assert m_max == INVARIANT_DECODE_M_MAX, m_max
    cands = bench.candidates(list(INVARIANT_DECODE_CANDIDATE_MS), DECODE_COUNT, True)
    tried = cands if fallback is None or fallback in cands else [*cands, fallback]
    best, refused, applicable = _fastest_invariant(bench, tried, invariant_decode_ms(), bench.time_graph_us,
                                                   INVARIANT_DECODE_TIMED_MS, 2, log, reduction_refusal)
    if best is None:
        raise PinSearchError(f"no batch-invariant cuBLASLt configuration for the decode of n={n} k={k} at M = 1 .. "
                             f"{m_max} ({len(cands)} candidates, {refused} refused for their reduction, "
                             f"{applicable} applicable)")
    _, pin, times = best
    row: dict[str, Any] = {"n": n, "k": k, "algo": pin}
    row.update({f"us_{m}": round(t, 2) for m, t in times.items()})
    row.update({"m_max": m_max, "candidates": len(cands)})
    if fallback is not None and pin == fallback and fallback not in cands:
        row["fallback"] = "prefill"
    return row
