"""Launching kernels-src/sample.cu's entries from the built cubin (tests/kernels/gpu_helpers.py's `Gpu`) with
kern_run.sampling's packing, for the GPU tests and bench/kernels.py."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kern_run.sampling import PARAM_ROW_BYTES, SamplingParams, pack_history, pack_params
from tools import reference_kernels as ref

THREADS = 1024  # the sampler's block


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


class Sampler:
    """Buffers for `rows` x `vocab` sampling launches on `dev` (a tests/kernels/gpu_helpers.Gpu)."""

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
                ("p", self.stats.ptr if self.stats is not None else null)]

    def launch(self, stream=0, sync: bool = True) -> None:
        self.kernel.launch((self.rows,), (THREADS,), self.args(), stream=stream, sync=sync)

    def read(self) -> SampleResult:
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
