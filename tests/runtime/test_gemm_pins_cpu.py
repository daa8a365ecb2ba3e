"""kern_runtime.gemm_pins on the CPU: the batch-invariant pin search (search.py) through the real DeviceBench and
PinPicker, with the fake driver (fake_cuda.py: device memory is host memory) and a numpy cuBLASLt (`NumpyBlas`).

NumpyBlas computes C = A @ W^T from the bf16 bits at the GEMM's device addresses, and each fake algorithm sums
the k products its own way: `exact` rounds the exact sum of every element once (the same bits at every M: batch-
invariant), `split_from=M0` sums two halves of k separately and rounds each to bf16 before adding them when the
GEMM's M >= M0 (a split-K kernel the heuristic takes for large M: not invariant), `odd_from=M0` does so only at
odd M >= M0 (caught by the m_max - 1 probe alone), `deep_from=R` only for the rows at position >= R of a GEMM
(caught only because a probe's rows sit at other positions in the M = m_max GEMM than in their own). Split-K:
`splits=s` sums k in s chunks, each rounded to bf16, then adds the chunks with a bf16 rounding after each add, in
chunk order (`order="fixed"`: the same at every M, so invariant) or starting from chunk M mod s (`order="by_m"`:
an order of arrival that moves with M, as an atomic reduction's does: not invariant). A clock advanced by each
algorithm's cost per GEMM (`launch_us` + `us_per_row` x M) feeds the fake's CUDA events, so the timings, and
the choice of the fastest, are exact.
"""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from fake_cuda import OK, FakeDriver, Handle, install

from kern_runtime import KernelArtifactError, PinSearchError
from kern_runtime.cuda import ALGO_KEYS
from kern_runtime.gemm_pins import (
    PINS_FORMAT, DeviceBench, PinPicker, invariant_decode_ms, is_invariant, pick_decode_pin,
    pick_invariant_decode_pin, pick_prefill_pin, pins_document, pins_text, probe_ms, reduction_refusal, timed_ms,
)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _view(address: int, shape: tuple[int, int]) -> np.ndarray:
    """uint16 `shape` over host memory at `address` (fake device memory)."""
    count = shape[0] * shape[1]
    return np.ctypeslib.as_array((ctypes.c_uint16 * count).from_address(address)).reshape(shape)


@dataclass
class FakeAlgo:
    """One configuration NumpyBlas knows: its pin, its cost per GEMM (us per row of M, plus a launch), where it
    applies, and how it sums."""

    pin: dict[str, int]
    us_per_row: float = 1.0
    applies_from: int = 1  # cublasLtMatmulAlgoCheck fails below this M
    applies_to: int | None = None  # ... and above this one (a split-K workspace past 32 MiB)
    split_from: int | None = None
    odd_from: int | None = None
    deep_from: int | None = None
    launch_us: float = 2.0
    splits: int = 1  # split-K: k summed in this many chunks
    order: str = "fixed"  # the chunks added in chunk order, or "by_m": from chunk M mod splits on

    def split_rows(self, m: int) -> np.ndarray:
        """bool [m]: the rows of a GEMM of M = m this algorithm sums in two rounded halves."""
        rows = np.zeros(m, dtype=bool)
        if (self.split_from is not None and m >= self.split_from) or (
                self.odd_from is not None and m >= self.odd_from and m % 2 == 1):
            rows[:] = True
        if self.deep_from is not None:
            rows[self.deep_from:] = True
        return rows

    def cost_ms(self, m: int) -> float:
        return (self.launch_us + self.us_per_row * m) / 1000.0

    def split_k_sum(self, a: np.ndarray, w: np.ndarray) -> np.ndarray:
        """float64 [m, n] of a [m, k] @ w[n, k]^T summed in `splits` chunks of k (each rounded to bf16), added with
        a bf16 rounding after each add, in the order `order` gives for this M."""
        chunks = np.array_split(np.arange(a.shape[1]), self.splits)
        parts = [from_bf16(to_bf16((a[:, c] @ w[:, c].T).astype(np.float32))) for c in chunks]  # f32 [m, n] each
        first = a.shape[0] % self.splits if self.order == "by_m" else 0
        acc = parts[first]
        for i in range(1, self.splits):
            acc = from_bf16(to_bf16(acc + parts[(first + i) % self.splits]))
        return acc.astype(np.float64)


def _config(pin: dict[str, int]) -> dict[str, int]:
    """The full attribute set cuBLASLt reports (Blas.heuristic): every ALGO_KEYS key, 0 where the pin has none."""
    return {key: pin.get(key, 0) for key in ALGO_KEYS}


class Clock:
    now_ms = 0.0


class NumpyBlas:
    """The Blas surface DeviceBench uses (heuristic, plan, matmul), computed in numpy over the fake's memory.
    `offers[m]`: the algorithms the heuristic returns at M = m (default: all), `heuristic`: its own choice."""

    def __init__(self, driver: "TimedDriver", algos: list[FakeAlgo], heuristic: FakeAlgo,
                 offers: dict[int, list[FakeAlgo]] | None = None) -> None:
        self.driver, self.algos, self.default, self.offers = driver, algos, heuristic, offers or {}
        self.asked: list[tuple[int, int]] = []  # (M, count) of each heuristic query

    def _algo(self, pin: dict[str, int] | None) -> FakeAlgo:
        if pin is None:
            return self.default
        return next(a for a in self.algos if a.pin == pin)

    def heuristic(self, g: Any, count: int) -> list[dict[str, int]]:
        self.asked.append((g.m, count))
        return [_config(a.pin) for a in self.offers.get(g.m, self.algos)][:count]

    def plan(self, g: Any, pin: dict[str, int] | None = None, where: str = "") -> None:
        algo = self._algo(pin)
        if g.m < algo.applies_from or (algo.applies_to is not None and g.m > algo.applies_to):
            raise KernelArtifactError(f"{where}: pinned cuBLASLt algo {pin} does not apply to m={g.m}")

    def matmul(self, g: Any, stream: int, pin: dict[str, int] | None = None, where: str = "") -> None:
        self.plan(g, pin, where)
        algo = self._algo(pin)
        if self.driver.capture is not None:  # recorded into the graph, run at cuGraphLaunch
            self.driver.capture.append(algo.cost_ms(g.m))
            return
        self.driver.clock.now_ms += algo.cost_ms(g.m)
        a = from_bf16(_view(g.a, (g.m, g.k))).astype(np.float64)  # [m, k]
        w = from_bf16(_view(g.w, (g.n, g.k))).astype(np.float64)  # [n, k]
        c = (a[:, None, :] * w[None, :, :]).sum(axis=2)  # [m, n], the same sum for a row at every M
        if algo.splits > 1:
            c = algo.split_k_sum(a, w)
        split = algo.split_rows(g.m)
        if split.any():
            h = g.k // 2
            halves = [from_bf16(to_bf16((a[split, s] @ w[:, s].T).astype(np.float32)))
                      for s in (slice(0, h), slice(h, None))]
            c[split] = halves[0].astype(np.float64) + halves[1]
        _view(g.c, (g.m, g.n))[:] = to_bf16(c.astype(np.float32))


class TimedDriver(FakeDriver):
    """FakeDriver with a clock behind its CUDA events and graphs, and a device name."""

    def __init__(self) -> None:
        super().__init__()
        self.clock, self.events, self.capture = Clock(), {}, None
        self.graphs: dict[int, list[float]] = {}
        self.alloc_fails_at: int | None = None  # the n-th cuMemAlloc returns CUDA_ERROR_OUT_OF_MEMORY

    def _cuMemAlloc(self, nbytes: int) -> tuple:
        if self.called("cuMemAlloc") == self.alloc_fails_at:
            return (2,)
        return super()._cuMemAlloc(nbytes)

    def _cuDeviceGetName(self, length: int, device: Any) -> tuple:
        return (OK, b"NVIDIA H200\x00\x00\x00")

    def _cuEventRecord(self, event: Any, stream: Any) -> tuple:
        self.events[int(event)] = self.clock.now_ms
        return (OK,)

    def _cuEventElapsedTime(self, start: Any, stop: Any) -> tuple:
        return (OK, self.events[int(stop)] - self.events[int(start)])

    def _cuStreamBeginCapture(self, stream: Any, mode: Any) -> tuple:
        self.capture = []
        self.capture_modes = [*getattr(self, "capture_modes", []), mode]
        return (OK,)

    def _cuStreamEndCapture(self, stream: Any) -> tuple:
        graph = Handle("graph")
        self.graphs[int(graph)], self.capture = self.capture, None
        return (OK, graph)

    def _cuGraphInstantiate(self, graph: Any, flags: int) -> tuple:
        exec_ = Handle("graph exec")
        self.graphs[int(exec_)] = self.graphs[int(graph)]
        return (OK, exec_)

    def _cuGraphLaunch(self, exec_: Any, stream: Any) -> tuple:
        self.clock.now_ms += sum(self.graphs[int(exec_)])
        return (OK,)


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> TimedDriver:
    return install(monkeypatch, TimedDriver())


def _live(driver: TimedDriver) -> int:
    return len(driver.mem)


N, K = 24, 32

EXACT_SLOW = FakeAlgo({"id": 2, "tile": 18, "split_k": 1}, us_per_row=3.0)
EXACT_FAST = FakeAlgo({"id": 3, "tile": 20, "split_k": 1}, us_per_row=2.0)
SPLIT_FASTEST = FakeAlgo({"id": 1, "tile": 18, "split_k": 1}, us_per_row=0.5, split_from=64)
NOT_AT_M1 = FakeAlgo({"id": 4, "split_k": 1}, us_per_row=0.1, applies_from=8)
SPLIT_K = FakeAlgo({"id": 5, "split_k": 4, "reduction": 1}, us_per_row=0.2)


# ---------------------------------------------------------------- the proof's M and the timed M


def test_probe_and_timed_ms() -> None:
    assert probe_ms(2048) == [1, 2, 3, 4, 7, 8, 16, 17, 32, 64, 100, 511, 2047]
    assert probe_ms(512) == [1, 2, 3, 4, 7, 8, 16, 17, 32, 64, 100, 511]  # m_max - 1 is 511 already
    assert probe_ms(600) == [1, 2, 3, 4, 7, 8, 16, 17, 32, 64, 100, 511, 599]
    assert probe_ms(2) == [1] and probe_ms(1) == []
    assert timed_ms(2048) == [512, 2048] and timed_ms(512) == [512] and timed_ms(300) == [300]


# ---------------------------------------------------------------- the prefill search, end to end on the bench


def test_the_fastest_invariant_candidate_wins(driver: TimedDriver) -> None:
    """Candidates: a split one (fastest, not invariant from M = 64), an inapplicable one (not at M = 1), a
    split-K one (never a candidate), two exact ones: the faster exact one is pinned; the heuristic (the split
    one) is timed and found not invariant."""
    blas = NumpyBlas(driver, [SPLIT_FASTEST, NOT_AT_M1, SPLIT_K, EXACT_SLOW, EXACT_FAST], heuristic=SPLIT_FASTEST)
    bench = DeviceBench(blas, N, K, 600, seed=1)
    lines: list[str] = []
    row = pick_prefill_pin(bench, lines.append)
    bench.close()
    assert row == {"n": N, "k": K, "algo": EXACT_FAST.pin,
                   "us_512": round(2.0 + 2.0 * 512, 2), "us_max": round(2.0 + 2.0 * 600, 2),
                   "heuristic_us_512": round(2.0 + 0.5 * 512, 2), "heuristic_us_max": round(2.0 + 0.5 * 600, 2),
                   "heuristic_invariant": False, "candidates": 4}
    assert lines == [
        f"  n={N} k={K} {SPLIT_FASTEST.pin}: not batch-invariant",
        f"  n={N} k={K} {EXACT_SLOW.pin}: invariant, M=512 1538.0 us, M=600 1802.0 us",
        f"  n={N} k={K} {EXACT_FAST.pin}: invariant, M=512 1026.0 us, M=600 1202.0 us",
    ]
    # the heuristic asked at M = 1, 64, 512 and m_max, 24 results each
    assert blas.asked == [(1, 24), (64, 24), (512, 24), (600, 24)]
    assert _live(driver) == 0  # every buffer freed


def test_the_m_max_minus_one_probe_catches_an_odd_m_kernel(driver: TimedDriver) -> None:
    odd = FakeAlgo({"id": 6, "split_k": 1}, us_per_row=0.1, odd_from=513)  # splits at M = 599 only
    blas = NumpyBlas(driver, [odd, EXACT_SLOW], heuristic=EXACT_SLOW)
    bench = DeviceBench(blas, N, K, 600, seed=2)
    assert not is_invariant(bench, odd.pin) and is_invariant(bench, EXACT_SLOW.pin)
    assert pick_prefill_pin(bench)["algo"] == EXACT_SLOW.pin
    bench.close()


def test_probe_windows_sit_elsewhere_in_the_full_gemm(driver: TimedDriver) -> None:
    """A kernel whose rows depend on their position in the GEMM (here: rows 256 and later) agrees with itself
    on windows taken from row 0; the centred windows catch it."""
    deep = FakeAlgo({"id": 7, "split_k": 1}, us_per_row=0.1, deep_from=256)
    bench = DeviceBench(NumpyBlas(driver, [deep], heuristic=deep), N, K, 600, seed=9)
    full = bench.rows(0, 600, deep.pin)
    assert all(np.array_equal(bench.rows(0, m, deep.pin), full[:m]) for m in probe_ms(600))
    assert not is_invariant(bench, deep.pin)
    bench.close()


def test_a_window_is_computed_from_its_own_buffer(driver: TimedDriver) -> None:
    """rows(first, m) is C of A's rows [first, first + m): the same bits as those rows of the full GEMM (exact
    algorithm), and the reference numpy product rounded once."""
    blas = NumpyBlas(driver, [EXACT_SLOW], heuristic=EXACT_SLOW)
    bench = DeviceBench(blas, N, K, 64, seed=3)
    full = bench.rows(0, 64, EXACT_SLOW.pin)
    a = from_bf16(_view(bench.a, (64, K))).astype(np.float64)
    w = from_bf16(_view(bench.w, (N, K))).astype(np.float64)
    reference = to_bf16((a @ w.T).astype(np.float32))
    assert np.abs(from_bf16(full) - from_bf16(reference)).max() <= 2 ** -7 * np.abs(from_bf16(reference)).max()
    assert np.array_equal(bench.rows(10, 7, EXACT_SLOW.pin), full[10:17])
    assert float(np.std(from_bf16(full))) > 0.5  # W scaled by k^-1/2: C is about N(0, 1), not all zeros
    bench.close()


def test_no_invariant_candidate_names_the_shape_and_counts(driver: TimedDriver) -> None:
    blas = NumpyBlas(driver, [SPLIT_FASTEST, NOT_AT_M1], heuristic=SPLIT_FASTEST)
    bench = DeviceBench(blas, N, K, 600, seed=4)
    with pytest.raises(PinSearchError) as exc:
        pick_prefill_pin(bench)
    bench.close()
    assert str(exc.value) == (f"no batch-invariant cuBLASLt configuration for n={N} k={K} up to M = 600 (2 "
                              "candidates, 1 applicable)")


def test_candidates_are_deduplicated_across_m(driver: TimedDriver) -> None:
    blas = NumpyBlas(driver, [EXACT_SLOW, EXACT_FAST, SPLIT_K],
                     heuristic=EXACT_SLOW, offers={1: [EXACT_FAST, SPLIT_K], 64: [EXACT_SLOW, EXACT_FAST]})
    bench = DeviceBench(blas, N, K, 64, seed=5)
    assert bench.candidates([1, 64], 24, False) == [EXACT_FAST.pin, EXACT_SLOW.pin]
    assert bench.candidates([1, 64], 24, True) == [EXACT_FAST.pin, SPLIT_K.pin, EXACT_SLOW.pin]
    bench.close()


# ---------------------------------------------------------------- the decode search


def test_the_decode_pin_is_the_fastest_at_m1_split_k_allowed(driver: TimedDriver) -> None:
    blas = NumpyBlas(driver, [EXACT_SLOW, SPLIT_K, NOT_AT_M1], heuristic=EXACT_SLOW)
    bench = DeviceBench(blas, N, K, 1, seed=6)
    lines: list[str] = []
    row = pick_decode_pin(bench, lines.append)
    bench.close()
    assert row == {"n": N, "k": K, "algo": SPLIT_K.pin, "us_1": 2.2, "heuristic_us_1": 5.0, "candidates": 3}
    assert lines == [f"  M=1 n={N} k={K} {EXACT_SLOW.pin}: 5.00 us", f"  M=1 n={N} k={K} {SPLIT_K.pin}: 2.20 us"]
    assert blas.asked == [(1, 32)]
    # the candidates were timed in graphs captured thread-local, as every capture of kern_runtime
    assert driver.capture_modes and set(driver.capture_modes) == {
        driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL}
    with pytest.raises(PinSearchError, match=f"no applicable cuBLASLt configuration at M = 1 for n={N} k={K} "
                                             r"\(1 candidates\)"):
        bench = DeviceBench(NumpyBlas(driver, [NOT_AT_M1], heuristic=EXACT_SLOW), N, K, 1, seed=7)
        try:
            pick_decode_pin(bench)
        finally:
            bench.close()
    assert _live(driver) == 0


# ---------------------------------------------------------------- the invariant decode search (split-K allowed)

# cost per GEMM: launch_us + us_per_row x M; the sums over M = 1, 8, 64 below are 45.5 (SPLIT4), 76 (SPLIT2, the
# fastest invariant one at M = 1), 225 (EXACT_SLOW); the in-place, M-ordered and big-workspace ones are faster still
INV_SPLIT4 = FakeAlgo({"id": 10, "tile": 18, "split_k": 4, "reduction": 2}, launch_us=3.0, us_per_row=0.5, splits=4)
INV_SPLIT2 = FakeAlgo({"id": 11, "split_k": 2, "reduction": 4}, launch_us=1.0, us_per_row=1.0, splits=2)
INPLACE = FakeAlgo({"id": 12, "split_k": 4, "reduction": 1}, launch_us=0.5, us_per_row=0.1, splits=4)
BY_M = FakeAlgo({"id": 13, "split_k": 4, "reduction": 2}, launch_us=0.5, us_per_row=0.1, splits=4, order="by_m")
BIG_WORKSPACE = FakeAlgo({"id": 14, "split_k": 8, "reduction": 2}, launch_us=0.5, us_per_row=0.1, splits=8,
                         applies_to=32)


def test_invariant_decode_ms_and_reduction_refusals() -> None:
    assert invariant_decode_ms() == [1, 2, 3, 4, 7, 8, 16, 17, 32, 63, 64]
    assert reduction_refusal({"id": 1}) is None and reduction_refusal({"id": 1, "split_k": 1}) is None
    assert reduction_refusal({"id": 1, "split_k": 3, "reduction": 2}) is None
    assert reduction_refusal({"id": 1, "split_k": 3, "reduction": 4}) is None
    assert reduction_refusal({"id": 1, "split_k": 3, "reduction": 1}) == "in-place split-K reduction (order of arrival)"
    assert reduction_refusal({"id": 1, "split_k": 3, "reduction": 3}) == ("reduction scheme 3 (not NONE, COMPUTE_TYPE "
                                                                          "or OUTPUT_TYPE)")
    assert reduction_refusal({"id": 1, "split_k": 3}) == "split_k 3 with no reduction scheme named"


def test_the_fake_split_k_is_invariant_in_fixed_order_only(driver: TimedDriver) -> None:
    """The model itself: fixed-order split-K gives every row the same bits at every M (and other bits than the
    exact sum: the chunks are rounded), the M-ordered one does not, and the in-place one in this fake is fixed-order
    (so only its reduction scheme refuses it)."""
    blas = NumpyBlas(driver, [INV_SPLIT4, BY_M, INPLACE, EXACT_SLOW], heuristic=EXACT_SLOW)
    bench = DeviceBench(blas, N, K, 64, seed=11)
    assert is_invariant(bench, INV_SPLIT4.pin) and is_invariant(bench, INPLACE.pin)
    assert not is_invariant(bench, BY_M.pin)
    assert not np.array_equal(bench.rows(0, 64, INV_SPLIT4.pin), bench.rows(0, 64, EXACT_SLOW.pin))
    bench.close()


def test_the_invariant_decode_pin_is_the_fastest_invariant_by_the_sum_at_1_8_64(driver: TimedDriver) -> None:
    blas = NumpyBlas(driver, [INPLACE, BY_M, BIG_WORKSPACE, INV_SPLIT2, INV_SPLIT4, EXACT_SLOW, NOT_AT_M1],
                     heuristic=EXACT_SLOW)
    bench = DeviceBench(blas, N, K, 64, seed=12)
    lines: list[str] = []
    row = pick_invariant_decode_pin(bench, lines.append)
    bench.close()
    assert row == {"n": N, "k": K, "algo": INV_SPLIT4.pin, "us_1": 3.5, "us_8": 7.0, "us_64": 35.0, "m_max": 64,
                   "candidates": 7}
    assert lines == [
        f"  n={N} k={K} {INPLACE.pin}: refused, in-place split-K reduction (order of arrival)",
        f"  n={N} k={K} {BY_M.pin}: not batch-invariant",
        f"  n={N} k={K} {INV_SPLIT2.pin}: invariant, M=1 2.00 us, M=8 9.00 us, M=64 65.00 us",
        f"  n={N} k={K} {INV_SPLIT4.pin}: invariant, M=1 3.50 us, M=8 7.00 us, M=64 35.00 us",
        f"  n={N} k={K} {EXACT_SLOW.pin}: invariant, M=1 5.00 us, M=8 26.00 us, M=64 194.00 us",
    ]
    assert blas.asked == [(1, 32), (8, 32), (64, 32)]  # the heuristic asked at M = 1, 8, 64, split-K kept
    assert _live(driver) == 0


def test_no_invariant_decode_candidate_names_the_shape_and_counts(driver: TimedDriver) -> None:
    blas = NumpyBlas(driver, [INPLACE, BY_M, BIG_WORKSPACE, NOT_AT_M1], heuristic=EXACT_SLOW)
    bench = DeviceBench(blas, N, K, 64, seed=13)
    with pytest.raises(PinSearchError) as exc:
        pick_invariant_decode_pin(bench)
    bench.close()
    assert str(exc.value) == (f"no batch-invariant cuBLASLt configuration for the decode of n={N} k={K} at M = 1 .. "
                              "64 (4 candidates, 1 refused for their reduction, 1 applicable)")


def test_the_prefill_pin_is_the_fallback_candidate_of_the_invariant_decode_search(driver: TimedDriver) -> None:
    """No split-K candidate survives, but the shape's prefill pin (passed as `fallback`) is invariant: it wins,
    timed like the others, and its row says so; as one candidate among good split-K ones it loses to a faster one
    (and is tried only once when the heuristic also offers it)."""
    split_k = [INPLACE, BY_M, BIG_WORKSPACE, NOT_AT_M1]  # what the heuristic offers; the prefill pin it does not
    blas = NumpyBlas(driver, [*split_k, EXACT_SLOW], heuristic=EXACT_SLOW, offers={m: split_k for m in (1, 8, 64)})
    bench = DeviceBench(blas, N, K, 64, seed=14)
    row = pick_invariant_decode_pin(bench, None, fallback=EXACT_SLOW.pin)
    assert row["algo"] == EXACT_SLOW.pin and row["fallback"] == "prefill" and row["candidates"] == 4
    assert (row["us_1"], row["us_8"], row["us_64"]) == (5.0, 26.0, 194.0)
    bench.close()
    blas = NumpyBlas(driver, [INV_SPLIT4, EXACT_SLOW], heuristic=EXACT_SLOW)
    bench = DeviceBench(blas, N, K, 64, seed=15)
    lines: list[str] = []
    row = pick_invariant_decode_pin(bench, lines.append, fallback=INV_SPLIT4.pin)
    bench.close()
    assert row["algo"] == INV_SPLIT4.pin and "fallback" not in row
    assert sum(str(INV_SPLIT4.pin) in line for line in lines) == 1
    assert _live(driver) == 0


# ---------------------------------------------------------------- PinPicker: the device, its stamp, its undo


@pytest.fixture
def fake_lt(monkeypatch: pytest.MonkeyPatch) -> None:
    """nvmath.bindings.cublasLt reporting version 130100 (the picker's stamp)."""
    import sys
    import types

    lt = types.SimpleNamespace(get_version=lambda: 130100)
    bindings = types.ModuleType("nvmath.bindings")
    bindings.cublasLt = lt  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nvmath", types.ModuleType("nvmath"))
    monkeypatch.setitem(sys.modules, "nvmath.bindings", bindings)
    monkeypatch.setitem(sys.modules, "nvmath.bindings.cublasLt", lt)


def test_the_picker_stamps_picks_and_releases(driver: TimedDriver, fake_lt: None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[int] = []

    class Blas(NumpyBlas):
        def __init__(self, workspace: int) -> None:
            assert workspace in driver.mem  # the 32 MiB workspace, allocated first
            super().__init__(driver, [SPLIT_FASTEST, EXACT_FAST], heuristic=SPLIT_FASTEST)

        def close(self) -> None:
            closed.append(1)

    monkeypatch.setattr("kern_runtime.gemm_pins.picker.Blas", Blas)
    with PinPicker(0) as picker:
        assert (picker.device, picker.cublaslt_version) == ("NVIDIA H200", 130100)
        assert picker.prefill(N, K, 600)["algo"] == EXACT_FAST.pin
        assert picker.decode(N, K)["algo"] == SPLIT_FASTEST.pin  # fastest at M = 1 (no invariance needed)
        assert picker.invariant_decode(N, K)["algo"] == EXACT_FAST.pin  # SPLIT_FASTEST splits from M = 64
        assert _live(driver) == 1  # the workspace; each bench freed its buffers
    assert closed == [1] and _live(driver) == 0
    assert driver.called("cuDevicePrimaryCtxRetain") == driver.called("cuDevicePrimaryCtxRelease") == 1


def test_a_failed_picker_releases_what_it_took(driver: TimedDriver, fake_lt: None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from kern_runtime import BlasError

    def no_blas(workspace: int) -> None:
        raise BlasError("cublasLtCreate", "CUBLAS_STATUS_NOT_INITIALIZED", 1)

    monkeypatch.setattr("kern_runtime.gemm_pins.picker.Blas", no_blas)
    with pytest.raises(BlasError):
        PinPicker(0)
    assert _live(driver) == 0 and driver.called("cuDevicePrimaryCtxRelease") == 1


def test_a_failed_allocation_frees_the_bench_buffers(driver: TimedDriver) -> None:
    from kern_runtime import DriverError

    driver.alloc_fails_at = 3  # W: A and A2 are allocated, then freed
    with pytest.raises(DriverError, match="cuMemAlloc failed with CUDA_ERROR_OUT_OF_MEMORY"):
        DeviceBench(NumpyBlas(driver, [EXACT_SLOW], heuristic=EXACT_SLOW), N, K, 64, seed=8)
    assert driver.called("cuMemAlloc") == 3 and driver.called("cuMemFree") == 2 and _live(driver) == 0


# ---------------------------------------------------------------- the file


def test_the_pins_document() -> None:
    row = {"n": 1, "k": 2, "algo": {"id": 3}}
    doc = pins_document("NVIDIA H200", 130100, 2048, [row])
    assert doc == {"format": PINS_FORMAT, "device": "NVIDIA H200", "cublaslt_version": 130100, "m_max": 2048,
                   "pins": [row]}
    assert PINS_FORMAT == "kern-cublaslt-pins/1"
    assert "decode_pins" in pins_document("x", 1, 1, [], [row])
    inv = {"n": 1, "k": 2, "algo": {"id": 3, "split_k": 4, "reduction": 2}, "us_1": 1.5, "us_8": 2.0, "us_64": 9.25,
           "m_max": 64, "candidates": 5}
    both = pins_document("x", 1, 1, [], None, [inv])
    assert "decode_pins" not in both and both["invariant_decode_pins"] == [inv]
    assert json.loads(pins_text(both)) == both  # the round trip
    assert pins_text(doc) == (
        '{\n "format": "kern-cublaslt-pins/1",\n "device": "NVIDIA H200",\n "cublaslt_version": 130100,\n '
        '"m_max": 2048,\n "pins": [\n  {\n   "n": 1,\n   "k": 2,\n   "algo": {\n    "id": 3\n   }\n  }\n ]\n}\n')
