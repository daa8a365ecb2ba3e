"""Launching kernels-src/sample.cu's entries from the built cubin (tests/kernels/gpu_helpers.py's `Gpu`) with
kern_run.sampling's packing, for the GPU tests and bench/kernels.py."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kern_run.sampling import (PARAM_ROW_BYTES, SAMPLE_THREADS, WORK_BYTES_PER_ROW, SamplingParams, pack_history,
                               pack_params, sampler_splits)
from tools import reference_kernels as ref

THREADS = SAMPLE_THREADS  # the sampler's block (512): one per 8192 logits of a row
WORK_WORDS = WORK_BYTES_PER_ROW // 4


@dataclass
class SampleResult:
    tokens: np.ndarray  # [rows] int32
    logprobs: np.ndarray  # [rows] float32
    logits_after: np.ndarray  # [rows, vocab] float32: the buffer after the launch (penalized in place)
    stats: np.ndarray | None  # [rows, 4] float32


def device_logits(logits: np.ndarray, dtype: str) -> np.ndarray:
    """The device representation: bf16 bits (uint16) or float32."""
    return ref.bf16_bits(logits) if dtype == "bf16" else np.ascontiguousarray(logits, dtype=np.float32)


def host_logits(raw: np.ndarray, dtype: str) -> np.ndarray:
    return ref.from_bf16_bits(raw) if dtype == "bf16" else raw


def fresh_work(rows: int) -> np.ndarray:
    """The sampler's work area as a manifest's fixed state holds it before the first launch, except that every word
    but the rows' tickets is poison (0xFFFFFFFF) instead of zero, so nothing may rely on them: u32 [rows, WORK_WORDS]."""
    work = np.full((rows, WORK_WORDS), 0xFFFFFFFF, dtype=np.uint32)
    work[:, 0] = 0
    return work


class Sampler:
    """Buffers for `rows` x `vocab` sampling launches on `dev` (a tests/kernels/gpu_helpers.Gpu): grid
    (sampler_splits(vocab), rows), block 512, the work area allocated once (tickets 0) and checked after every
    launch (`read`: every ticket back at 0)."""

    def __init__(self, dev, rows: int, vocab: int, dtype: str = "bf16", hist_cap: int = 0, stats: bool = False):
        self.dev, self.rows, self.vocab, self.dtype, self.hist_cap = dev, rows, vocab, dtype, hist_cap
        elem = 2 if dtype == "bf16" else 4
        self.kernel = dev.kernel(f"kern_sample_{dtype}")
        self.logits = dev.alloc(rows * vocab * elem)
        self.params = dev.alloc(rows * PARAM_ROW_BYTES)
        self.positions = dev.alloc(rows * 4)
        self.hist_tokens = dev.alloc(max(1, rows * hist_cap * 4)) if hist_cap else None
        self.hist_counts = dev.alloc(max(1, rows * hist_cap * 4)) if hist_cap else None
        self.out = dev.alloc(rows * 8)
        self.stats = dev.alloc(rows * 16) if stats else None
        self.work = dev.array(fresh_work(rows))

    def write(self, logits: np.ndarray, params: list[SamplingParams], positions, history=None) -> None:
        """Host-side writes of one step's inputs (what a caller does outside the graph)."""
        assert logits.shape == (self.rows, self.vocab) and len(params) == self.rows
        self.logits.upload(device_logits(logits, self.dtype))
        self.params.upload(np.frombuffer(pack_params(params), dtype=np.uint8).copy())
        self.positions.upload(np.asarray(positions, dtype=np.int32))
        if self.hist_cap:
            rows = history if history is not None else [[] for _ in range(self.rows)]
            tokens, counts = pack_history(rows, self.hist_cap)
            self.hist_tokens.upload(np.frombuffer(tokens, dtype=np.uint8).copy())
            self.hist_counts.upload(np.frombuffer(counts, dtype=np.uint8).copy())
        self.out.poison()
        if self.stats is not None:
            self.stats.poison()

    def args(self) -> list[tuple[str, int]]:
        null = 0
        return [("p", self.logits.ptr), ("p", self.params.ptr), ("p", self.positions.ptr),
                ("p", self.hist_tokens.ptr if self.hist_cap else null),
                ("p", self.hist_counts.ptr if self.hist_cap else null), ("i", self.hist_cap), ("i", self.vocab),
                ("p", self.out.ptr), ("p", self.out.ptr + 4 * self.rows),
                ("p", self.stats.ptr if self.stats is not None else null), ("p", self.work.ptr)]

    def launch(self, stream=0, sync: bool = True) -> None:
        self.kernel.launch((sampler_splits(self.vocab), self.rows), (THREADS,), self.args(), stream=stream, sync=sync)

    def tickets(self) -> np.ndarray:
        """Each row's ticket word (int32 [rows]) as the last launch left it."""
        return self.work.download(np.int32, (self.rows, WORK_WORDS))[:, 0].copy()

    def read(self) -> SampleResult:
        """The outputs of the last launch. Raises AssertionError when a row's ticket is not back at 0 or a guard
        region of the work area was written."""
        left = np.flatnonzero(self.tickets())
        assert left.size == 0, f"tickets not back at 0 after the launch: rows {left[:8].tolist()}"
        self.work.check_guards("sampler work")
        raw = self.out.download(np.uint8, (8 * self.rows,))
        elem = np.uint16 if self.dtype == "bf16" else np.float32
        after = host_logits(self.logits.download(elem, (self.rows, self.vocab)), self.dtype)
        stats = self.stats.download(np.float32, (self.rows, 4)) if self.stats is not None else None
        return SampleResult(raw[: 4 * self.rows].view(np.int32).copy(), raw[4 * self.rows :].view(np.float32).copy(),
                            after, stats)

    def run(self, logits, params, positions, history=None) -> SampleResult:
        self.write(logits, params, positions, history)
        self.launch()
        return self.read()
