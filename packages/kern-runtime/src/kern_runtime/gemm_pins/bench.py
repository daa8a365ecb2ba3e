"""`DeviceBench`: the cuBLASLt `GemmBench` of one (n, k) shape: device buffers of random bf16 data, a stream and
two events, on the current context (kern_runtime.gemm_pins.PinPicker makes one).

Buffers (bf16, row-major): A [m_max, k] of N(0, 1) and its copy window A2, W [n, k] of N(0, 1/k) (so C stays
near N(0, 1)), C and C2 [m_max, n]. Timings are CUDA events around bursts of back-to-back GEMMs (or one captured
graph of them), the median of several repeats.
"""

from __future__ import annotations

import statistics
from contextlib import ExitStack
from typing import Sequence

import numpy as np

from ..cuda import Blas, call, gemm_call
from ..cuda.blas import GemmCall
from ..cuda.graphs import capture_mode
from ..errors import KernelArtifactError
from .search import Pin


def bf16_bits(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    """Random bf16 of N(0, scale^2), as uint16 bits `shape` (float32 rounded to nearest even)."""
    x = (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).view(np.uint32)
    return ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16)


class DeviceBench:
    """The GemmBench (kern_runtime.gemm_pins.search) of `C[m, n] = A[m, k] @ W[n, k]^T` through `blas` for M up to
    `m_max`, on the current CUDA context; `seed` seeds A and W. Raises DriverError (allocation; what was
    allocated is freed). `close()` frees everything."""

    def __init__(self, blas: Blas, n: int, k: int, m_max: int, seed: int) -> None:
        self.blas, self.n, self.k, self.m_max = blas, n, k, m_max
        self.where = f"gemm_pins n={n} k={k}"
        rng = np.random.default_rng(seed)
        host_a = bf16_bits(rng, (m_max, k), 1.0)  # uint16 [m_max, k]
        host_w = bf16_bits(rng, (n, k), k ** -0.5)  # uint16 [n, k]
        with ExitStack() as undo:
            self.a, self.a2 = (self._alloc(undo, m_max * k * 2) for _ in range(2))
            self.w = self._alloc(undo, n * k * 2)
            self.c, self.c2 = (self._alloc(undo, m_max * n * 2) for _ in range(2))
            call("cuMemcpyHtoD", self.a, host_a.ctypes.data, host_a.nbytes)
            call("cuMemcpyHtoD", self.w, host_w.ctypes.data, host_w.nbytes)
            self.stream = call("cuStreamCreate", 1)
            undo.callback(call, "cuStreamDestroy", self.stream)
            self.start = call("cuEventCreate", 0)
            undo.callback(call, "cuEventDestroy", self.start)
            self.stop = call("cuEventCreate", 0)
            undo.callback(call, "cuEventDestroy", self.stop)
            self._undo = undo.pop_all()

    @staticmethod
    def _alloc(undo: ExitStack, nbytes: int) -> int:
        ptr = int(call("cuMemAlloc", nbytes))
        undo.callback(call, "cuMemFree", ptr)
        return ptr

    def close(self) -> None:
        self._undo.close()

    def _gemm(self, a: int, c: int, m: int) -> GemmCall:
        return gemm_call("cublaslt_bf16_tn", (a, self.w, c, m, self.n, self.k), self.where)

    def _run(self, a: int, c: int, m: int, pin: Pin | None) -> None:
        self.blas.matmul(self._gemm(a, c, m), int(self.stream), pin, self.where)

    def candidates(self, ms: Sequence[int], count: int, split_k: bool) -> list[Pin]:
        seen, out = set(), []
        for m in ms:
            for cfg in self.blas.heuristic(self._gemm(self.a, self.c, m), count):
                if not split_k and (cfg["split_k"] > 1 or cfg["reduction"] != 0):
                    continue
                pin = {key: v for key, v in cfg.items() if key in ("id", "split_k") or v != 0}
                if tuple(sorted(pin.items())) not in seen:
                    seen.add(tuple(sorted(pin.items())))
                    out.append(pin)
        return out

    def applies(self, pin: Pin, m: int) -> bool:
        try:
            self.blas.plan(self._gemm(self.a, self.c, m), pin, self.where)
        except KernelArtifactError:
            return False
        return True

    def rows(self, first_row: int, m: int, pin: Pin | None) -> np.ndarray:
        if first_row == 0 and m == self.m_max:
            a, c = self.a, self.c
        else:  # the window copied to the start of A2: a chunk starts at its own buffer's first row
            a, c = self.a2, self.c2
            # on the bench's stream, so the GEMM after it reads the copied rows: a plain cuMemcpyDtoD runs on the
            # legacy stream, which a non-blocking stream does not wait for, so the GEMM could read the previous
            # window (the likely cause of every candidate "not batch-invariant" under load on the H200, 2026-12-02)
            call("cuMemcpyDtoDAsync", a, self.a + first_row * self.k * 2, m * self.k * 2, self.stream)
        self._run(a, c, m, pin)
        call("cuStreamSynchronize", self.stream)
        out = np.empty((m, self.n), dtype=np.uint16)  # bf16 bits [m, n]
        call("cuMemcpyDtoH", out.ctypes.data, c, out.nbytes)
        return out

    def _event_us(self, launch, burst: int) -> float:
        call("cuEventRecord", self.start, self.stream)
        launch()
        call("cuEventRecord", self.stop, self.stream)
        call("cuEventSynchronize", self.stop)
        return float(call("cuEventElapsedTime", self.start, self.stop)) * 1000.0 / burst

    def time_us(self, m: int, pin: Pin | None, reps: int = 5, burst: int = 10) -> float:
        def launch() -> None:
            for _ in range(burst):
                self._run(self.a, self.c, m, pin)

        for _ in range(3):  # warm-up (the plan is made on the first)
            self._run(self.a, self.c, m, pin)
        return statistics.median(self._event_us(launch, burst) for _ in range(reps))

    def time_graph_us(self, m: int, pin: Pin | None, reps: int = 7, burst: int = 20) -> float:
        self._run(self.a, self.c, m, pin)  # plan outside the capture
        call("cuStreamBeginCapture", self.stream, capture_mode())  # thread-local, as every capture of kern
        try:
            for _ in range(burst):
                self._run(self.a, self.c, m, pin)
        finally:
            graph = call("cuStreamEndCapture", self.stream)
        try:
            exec_ = call("cuGraphInstantiate", graph, 0)
        finally:
            call("cuGraphDestroy", graph)
        try:
            call("cuGraphLaunch", exec_, self.stream)  # upload
            return statistics.median(self._event_us(lambda: call("cuGraphLaunch", exec_, self.stream), burst)
                                     for _ in range(reps))
        finally:
            call("cuGraphExecDestroy", exec_)
