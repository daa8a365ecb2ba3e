"""Logit comparison shared by `kern test`, the parity tests and tools/parity.py.

Per step (a row of logits predicting the next token): max |a - b|, the error relative to the row's
max |b|, whether the top-1 ids agree, and B's top-2 margin. A top-1 disagreement counts as a real
mismatch only where B's margin exceeds the tolerance (`margin_tol`): inside it, two correct bf16
computations may legitimately pick different ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepStats:
    max_abs: float
    rel: float
    top1_a: int
    top1_b: int
    margin_b: float


@dataclass(frozen=True)
class Comparison:
    steps: tuple[StepStats, ...]
    margin_tol: float

    @property
    def max_abs(self) -> float:
        return max((s.max_abs for s in self.steps), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((s.rel for s in self.steps), default=0.0)

    @property
    def top1_agreement(self) -> float:
        return sum(s.top1_a == s.top1_b for s in self.steps) / max(len(self.steps), 1)

    @property
    def first_divergence(self) -> int | None:
        """Index of the first step whose top-1 ids differ (None: never)."""
        return next((i for i, s in enumerate(self.steps) if s.top1_a != s.top1_b), None)

    def mismatches_beyond_error(self, factor: float = 2.0) -> list[int]:
        """Steps whose top-1 ids differ although B's top-2 margin exceeds `factor` x that step's max |a - b|
        (and the fixed tolerance): the error measured at that step cannot explain the different choice."""
        return [i for i, s in enumerate(self.steps)
                if s.top1_a != s.top1_b and s.margin_b > max(self.margin_tol, factor * s.max_abs)]

    @property
    def hard_mismatches(self) -> list[int]:
        """Steps whose top-1 ids differ although B's top-2 margin exceeds the tolerance."""
        return [i for i, s in enumerate(self.steps) if s.top1_a != s.top1_b and s.margin_b > self.margin_tol]


def top2_margin(row: np.ndarray) -> float:
    """Largest minus second-largest value of a 1-D array."""
    top = np.partition(row, -2)[-2:]
    return float(top[1] - top[0])


def compare_logits(a: np.ndarray, b: np.ndarray, margin_tol: float) -> Comparison:
    """Compare f32[steps, vocab] logits `a` (under test) with `b` (reference). Shapes must agree."""
    if a.shape != b.shape:
        raise ValueError(f"logit shapes differ: {a.shape} vs {b.shape}")
    steps = []
    for ra, rb in zip(a, b):
        diff = float(np.max(np.abs(ra - rb)))
        scale = float(np.max(np.abs(rb))) or 1.0
        steps.append(StepStats(diff, diff / scale, int(np.argmax(ra)), int(np.argmax(rb)), top2_margin(rb)))
    return Comparison(tuple(steps), margin_tol)


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    """Plain fixed-width table (monospace terminals, logs)."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join(fmt.format(*map(str, r)) for r in [header, *rows])


def teacher_forced_vs(gen, reference, ids: list[int], prefill_tokens: int, chunk: int, margin_tol: float = 0.0,
                      eager: bool = False) -> tuple[Comparison, np.ndarray]:
    """kern (`gen`, a Generator) against `reference.logits(ids, start)` over positions prefill_tokens..len-1.

    Returns the comparison (a = kern, b = reference) and kern's GPU argmax per step. Both sides see the
    same ids (teacher forcing), so an early different choice does not derail the rest.
    """
    logits, argmax = gen.teacher_forced(ids, prefill_tokens, chunk, eager)
    ref = reference.logits(ids, prefill_tokens)
    return compare_logits(logits, ref, margin_tol), argmax
