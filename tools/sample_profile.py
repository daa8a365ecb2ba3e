"""The sampler's phase profile: parse the stamps of kernels-src/sample.cu built with -DSAMPLE_PROFILE, summarize them
per phase, format the table bench/sample_phases.py prints. numpy only (no CUDA): tested on synthetic stamps.

Stamp layout (sample.cu, "SAMPLE_PROF_SLOTS"): uint64 prof[rows, slices, SLOTS] per launch, SLOTS = 64 per block:
  [0] %globaltimer (ns) at the block's start, [1] at its end (0: the block never finished its log);
  [2] smid | merged << 32 | n_events << 40;
  [3 + i] event i: id << 56 | (clock64 & (2^56 - 1)), i < n_events; event 0 is SP_START.
Each stamp is a barrier and then thread 0's clock64, so event i closes the phase that began at event i - 1: a
phase's duration is clock(i) - clock(i - 1) in SM cycles (one SM: the block never moves), converted to us by a
clock rate fitted from the blocks' own globaltimer spans (`cycles_per_ns`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

SLOTS = 64
MAX_EVENTS = SLOTS - 3
CLOCK_MASK = (1 << 56) - 1
# sample.cu's SP_* ids -> the name of the phase each closes
EVENTS = {
    0: "start",
    1: "penalties",
    2: "load + reduce",
    3: "export top-k bound",
    4: "export round",
    5: "export write",
    6: "ticket",
    7: "merge headers",
    8: "candidate gather",
    9: "candidate count",
    10: "top-k round",
    11: "top-p round",
    12: "top-p sums",
    13: "draw",
    14: "write",
    15: "to exact path",
    16: "mass pass",
    17: "kept pass",
    18: "help wait",
    19: "slice tasks",
    20: "phase wait",
}
SP_START, SP_TICKET, SP_GATHER, SP_DRAW, SP_EXACT = 0, 6, 8, 13, 15
ROUNDS = {4, 10, 11, 18, 19, 20}  # repeated phases: numbered 1, 2, ... in a block's log
MIN_FIT_NS = 3000  # blocks at least this long (globaltimer) fit the clock rate


class StampError(ValueError):
    """A stamp array that is not the layout above (shape, dtype, an event log that is not one)."""


@dataclass(frozen=True)
class BlockTrace:
    """One block of one launch: where it ran, when (globaltimer ns), and its phases (label, SM cycles) in order."""

    row: int
    slice: int
    merged: bool
    smid: int
    start_ns: int
    end_ns: int
    phases: tuple[tuple[str, int], ...]

    @property
    def cycles(self) -> int:
        return sum(c for _, c in self.phases)

    def cycles_to(self, label: str) -> int | None:
        """SM cycles from the block's start to the end of phase `label` (None: no such phase)."""
        run = 0
        for name, c in self.phases:
            run += c
            if name == label:
                return run
        return None

    @property
    def path(self) -> str:
        """The merge path of a merging block (greedy / plain / candidates / exact), "-" for the others."""
        if not self.merged:
            return "-"
        names = {n for n, _ in self.phases}
        if "to exact path" in names:
            return "exact"
        if "candidate gather" in names:
            return "candidates"
        return "plain" if "draw" in names else "greedy"


def phase_labels(ids: list[int]) -> list[str]:
    """The labels of events 1.. of one block's log (event ids, the first SP_START): the id's name, rounds numbered
    ("top-k round 2"), "exact " before the phases after the hand-off to the exact path."""
    labels, seen, prefix = [], {}, ""
    for ev in ids[1:]:
        if ev not in EVENTS or ev == SP_START:
            raise StampError(f"event id {ev} is not one of sample.cu's SP_* ids 1..{max(EVENTS)}")
        name = EVENTS[ev]
        if ev in ROUNDS:
            seen[(prefix, ev)] = seen.get((prefix, ev), 0) + 1
            name = f"{name} {seen[(prefix, ev)]}"
        labels.append(prefix + name if ev != SP_EXACT else name)
        if ev == SP_EXACT:
            prefix = "exact "
    return labels


def parse_block(slots: np.ndarray, row: int, slice_: int) -> BlockTrace:
    """One block's SLOTS uint64 -> its BlockTrace. Raises StampError on an unfinished or inconsistent log."""
    s = [int(v) for v in slots]
    n = (s[2] >> 40) & 0xFF
    if s[1] == 0 or n == 0:
        raise StampError(f"block (slice {slice_}, row {row}) has no finished log (end {s[1]}, {n} events)")
    if n > MAX_EVENTS:
        raise StampError(f"block (slice {slice_}, row {row}): {n} events, at most {MAX_EVENTS}")
    ev = s[3 : 3 + n]
    ids, clocks = [e >> 56 for e in ev], [e & CLOCK_MASK for e in ev]
    if ids[0] != SP_START:
        raise StampError(f"block (slice {slice_}, row {row}): first event id {ids[0]}, expected {SP_START} (start)")
    if s[1] < s[0]:
        raise StampError(f"block (slice {slice_}, row {row}): ends at {s[1]} ns before its start {s[0]}")
    durations = [(b - a) & CLOCK_MASK for a, b in pairwise(clocks)]
    return BlockTrace(row=row, slice=slice_, merged=bool((s[2] >> 32) & 1), smid=s[2] & 0xFFFFFFFF, start_ns=s[0],
                      end_ns=s[1], phases=tuple(zip(phase_labels(ids), durations)))


def parse(stamps: np.ndarray) -> list[list[BlockTrace]]:
    """stamps uint64 [launches, rows, slices, SLOTS] -> per launch, its blocks (row-major). Raises StampError
    on another shape or dtype, a block without a finished log, or a row without exactly one merging block."""
    if stamps.dtype != np.uint64 or stamps.ndim != 4 or stamps.shape[3] != SLOTS:
        raise StampError(f"stamps {stamps.dtype} {list(stamps.shape)}, "
                         f"expected uint64 [launches, rows, slices, {SLOTS}]")
    out = []
    for launch in stamps:
        blocks = [parse_block(launch[r, s], r, s) for r in range(launch.shape[0]) for s in range(launch.shape[1])]
        for r in range(launch.shape[0]):
            merged = sum(b.merged for b in blocks if b.row == r)
            if merged != 1:
                raise StampError(f"row {r}: {merged} merging blocks, expected 1")
        out.append(blocks)
    return out


def cycles_per_ns(launches: list[list[BlockTrace]], fallback: float) -> float:
    """The SM clock (cycles per ns): the median over blocks of at least MIN_FIT_NS of cycles / globaltimer span;
    `fallback` (e.g. the device's CLOCK_RATE attribute) when no block is that long."""
    fits = [b.cycles / (b.end_ns - b.start_ns) for bl in launches for b in bl if b.end_ns - b.start_ns >= MIN_FIT_NS]
    return statistics.median(fits) if fits else fallback


def _order(seqs: list[list[str]]) -> list[str]:
    """Every label of the sequences once, in log order: a label new to the order goes after its predecessor in the
    first sequence that has it, past the labels there that this sequence lacks (another path's branch), so one
    path's phases stay together (merging blocks first: their logs hold the others' phases too)."""
    order: list[str] = []
    for seq in seqs:
        here, prev = set(seq), None
        for label in seq:
            if label not in order:
                at = order.index(prev) + 1 if prev is not None else 0
                while at < len(order) and order[at] not in here:
                    at += 1
                order.insert(at, label)
            prev = label
    return order


@dataclass(frozen=True)
class PhaseRow:
    """One phase's us, each the median over launches of a per-launch statistic over blocks (None: absent)."""

    label: str
    merge_med: float | None  # the merging blocks' median over rows
    merge_max: float | None  # their max over rows
    other_med: float | None  # the non-merging blocks' median
    other_max: float | None  # their max


@dataclass(frozen=True)
class CaseSummary:
    """A case's profile over its launches (us, medians over launches); `paths` counts the rows' merge paths."""

    launches: int
    rows: int
    slices: int
    cycles_per_ns: float
    phases: tuple[PhaseRow, ...]
    span_us: float               # first block start -> last block end
    last_start_us: float         # first block start -> last block start
    max_resident: int            # most blocks running at one time
    sms: int                     # distinct SMs used
    merge_begin_med_us: float    # first block start -> a merging block's ticket, median over rows
    merge_begin_max_us: float    # ... the last row's
    paths: dict[str, int]


def _med(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(launches: list[list[BlockTrace]], cycles_per_ns_: float) -> CaseSummary:
    """The per-phase table of a case's parsed launches (`parse`), cycles converted at `cycles_per_ns_`."""
    to_us = 1.0 / (cycles_per_ns_ * 1000.0)
    merge_seqs = [[n for n, _ in b.phases] for bl in launches for b in bl if b.merged]
    other_seqs = [[n for n, _ in b.phases] for bl in launches for b in bl if not b.merged]
    labels = _order(merge_seqs + other_seqs) + ["total"]
    per = {label: ([], [], [], []) for label in labels}  # per launch: merge med, merge max, other med, other max
    spans, last_starts, resident, merge_med, merge_max = [], [], [], [], []
    for bl in launches:
        for label in labels:
            for k, merged in ((0, True), (2, False)):
                if label == "total":
                    vals = [b.cycles * to_us for b in bl if b.merged == merged]
                else:
                    vals = [c * to_us for b in bl if b.merged == merged for n, c in b.phases if n == label]
                if vals:
                    per[label][k].append(statistics.median(vals))
                    per[label][k + 1].append(max(vals))
        t0 = min(b.start_ns for b in bl)
        spans.append((max(b.end_ns for b in bl) - t0) / 1000.0)
        last_starts.append((max(b.start_ns for b in bl) - t0) / 1000.0)
        edges = sorted([(b.start_ns, 1) for b in bl] + [(b.end_ns, -1) for b in bl], key=lambda e: (e[0], e[1]))
        resident.append(int(np.max(np.cumsum([d for _, d in edges]))))
        begins = [(b.start_ns - t0) / 1000.0 + b.cycles_to("ticket") * to_us for b in bl if b.merged]
        merge_med.append(statistics.median(begins))
        merge_max.append(max(begins))
    paths: dict[str, int] = {}
    for b in launches[0]:
        if b.merged:
            paths[b.path] = paths.get(b.path, 0) + 1
    rows = tuple(PhaseRow(label, *(_med(v) for v in per[label])) for label in labels)
    first = launches[0]
    return CaseSummary(launches=len(launches), rows=1 + max(b.row for b in first),
                       slices=1 + max(b.slice for b in first),
                       cycles_per_ns=cycles_per_ns_, phases=rows, span_us=statistics.median(spans),
                       last_start_us=statistics.median(last_starts), max_resident=int(statistics.median(resident)),
                       sms=len({b.smid for bl in launches for b in bl}),
                       merge_begin_med_us=statistics.median(merge_med),
                       merge_begin_max_us=statistics.median(merge_max), paths=paths)


def _cell(v: float | None) -> str:
    return f"{v:10.2f}" if v is not None else f"{'-':>10s}"


def format_case(name: str, s: CaseSummary, normal_us: float | None = None, profiled_us: float | None = None) -> str:
    """The table of one case: a header (wall times of the normal and the profiled build, us per launch, when
    given), the timeline, then one line per phase (us) and the blocks' totals."""
    paths = ", ".join(f"{p} x{n}" for p, n in sorted(s.paths.items()))
    head = f"{name} [{paths}]: {s.rows} rows x {s.slices} blocks, clock {s.cycles_per_ns:.3f} GHz"
    if normal_us is not None and profiled_us is not None:
        head += (f"; wall {normal_us:.2f} us normal, {profiled_us:.2f} us profiled "
                 f"({100.0 * (profiled_us / normal_us - 1.0):+.1f}%)")
    lines = [head,
             (f"  timeline (median of {s.launches} launches): span {s.span_us:.2f} us, last block starts at "
             f"+{s.last_start_us:.2f}, at most {s.max_resident} blocks resident on {s.sms} SMs; merges begin at "
             f"+{s.merge_begin_med_us:.2f} (median row), +{s.merge_begin_max_us:.2f} (last row)"),
             f"  {'phase (us)':28s} {'merge med':>10s} {'merge max':>10s} {'other med':>10s} {'other max':>10s}"]
    for p in s.phases:
        cells = " ".join(_cell(v) for v in (p.merge_med, p.merge_max, p.other_med, p.other_max))
        lines.append(f"  {p.label:28s} {cells}")
    return "\n".join(lines)
