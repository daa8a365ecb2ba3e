"""Executing a persistent-kernel table on the host: does every wait end, and does the data-flow stay the sequential
program's?

`simulate(table)` runs the queues as the kernel's blocks would, all resident at once: at each step one queue whose
head instruction's wait is satisfied runs it (the queue is picked by a seeded RNG) and its counter goes up by one.
Counters only grow and running an instruction never blocks another, so the outcome (all done, or the same stuck
heads) is the same for every pick order: one run decides deadlock freedom for the table on that many blocks.
A stuck run is reported with every blocked head (queue, instruction, counter, value, target), which is what the
kernel's error word would hold after its bounded waits time out.

`check_dataflow(schedule)` proves, without timing, that every pair of conflicting accesses (one of them a write, on
overlapping elements of one buffer) is ordered by the schedule as the table (= today's decode program) orders them:
`a` happens before `b` when `b`'s queue runs `a` earlier, or when the counter `a` signals is complete before `b`
starts: what `b`'s wait completes, transitively through every queue predecessor and every signaller of a completed
counter (counter targets are all signallers, isa.Table.check). The ATTN instructions of one ticket (Instr.ticket,
read from the table) are taken as ordered among themselves: the kernel orders them (isa.Op.ATTN: the writer split
alone reads the token it writes, and faults when the caller's slot is another split's row; the ticket's last
arrival alone reads the partials and writes attn_out).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from .isa import NO_COUNTER, Table
from .schedule import Schedule


@dataclass(frozen=True)
class Blocked:
    """A queue stuck at `instr`, waiting for `counter` to reach `target` (it holds `value`)."""

    queue: int
    instr: int
    counter: int
    value: int
    target: int


@dataclass(frozen=True)
class SimResult:
    """`order`: instruction indices in the order they ran; `blocked`: the stuck heads (empty when all ran);
    `counters`: final values."""

    order: tuple[int, ...]
    blocked: tuple[Blocked, ...]
    counters: tuple[int, ...]

    @property
    def finished(self) -> bool:
        return not self.blocked


def simulate(table: Table, seed: int = 0) -> SimResult:
    """Run `table` (checked first: TableError) with every queue resident; see the module docstring."""
    table.check()
    rng = random.Random(seed)
    counters = [0] * table.num_counters
    heads = [0] * len(table.queues)
    order: list[int] = []
    waiting: dict[int, list[int]] = {}  # counter -> queues whose head waits on it
    ready: list[int] = []

    def offer(q: int) -> None:
        """Queue `q`'s head: ready now, or parked on its counter."""
        queue = table.queues[q]
        if heads[q] == len(queue):
            return
        ins = table.instrs[queue[heads[q]]]
        if ins.wait_counter == NO_COUNTER or counters[ins.wait_counter] >= ins.wait_target:
            ready.append(q)
        else:
            waiting.setdefault(ins.wait_counter, []).append(q)

    for q in range(len(table.queues)):
        offer(q)
    while ready:
        q = ready.pop(rng.randrange(len(ready)))
        index = table.queues[q][heads[q]]
        ins = table.instrs[index]
        order.append(index)
        heads[q] += 1
        c = ins.signal_counter
        counters[c] += 1
        offer(q)
        parked = waiting.pop(c, [])
        for other in parked:
            offer(other)
    blocked = []
    for q, queue in enumerate(table.queues):
        if heads[q] < len(queue):
            ins = table.instrs[queue[heads[q]]]
            blocked.append(Blocked(q, queue[heads[q]], ins.wait_counter, counters[ins.wait_counter], ins.wait_target))
    return SimResult(tuple(order), tuple(blocked), tuple(counters))


def completed_before(table: Table) -> list[int]:
    """Per instruction, a bitset (int) of the counters certainly complete when it starts (module docstring)."""
    n = len(table.instrs)
    queue_prev = [-1] * n
    for queue in table.queues:
        for a, b in zip(queue, queue[1:]):
            queue_prev[b] = a
    signallers: dict[int, list[int]] = {}
    for i, ins in enumerate(table.instrs):
        signallers.setdefault(ins.signal_counter, []).append(i)
    known = [0] * n
    complete: dict[int, int] = {}  # counter -> what its completion implies
    for i, ins in enumerate(table.instrs):  # table order: every signaller of a waited counter comes first
        bits = known[queue_prev[i]] if queue_prev[i] >= 0 else 0
        c = ins.wait_counter
        if c != NO_COUNTER:
            if c not in complete:
                implied = 1 << c
                for s in signallers[c]:
                    implied |= known[s]
                complete[c] = implied
            bits |= complete[c]
        known[i] = bits
    return known


class DataflowError(AssertionError):
    """Two conflicting accesses the schedule does not order as the sequential program does."""


def check_dataflow(schedule: Schedule, cohorts: bool = True) -> int:
    """Check every conflicting pair of accesses (module docstring) in table order, buffer by buffer, over an interval
    map of each buffer: each segment keeps its last writer and the readers since. `cohorts` False: one ticket's
    ATTN pairs are checked like any other (a negative control). Returns the number of ordering facts checked.
    Raises DataflowError naming both instructions, the buffer and the elements."""
    table = schedule.table
    ticket = [ins.ticket if cohorts else None for ins in table.instrs]
    known = completed_before(table)
    place: dict[int, tuple[int, int]] = {}
    for qi, queue in enumerate(table.queues):
        for pos, i in enumerate(queue):
            place[i] = (qi, pos)

    def before(a: int, b: int) -> bool:
        if a == b:
            return True
        if ticket[a] is not None and ticket[a] == ticket[b]:
            return True
        if (known[b] >> table.instrs[a].signal_counter) & 1:
            return True
        qa, pa = place[a]
        qb, pb = place[b]
        return qa == qb and pa < pb

    maps: dict[str, _Segments] = {}
    checks = 0
    for i, step in enumerate(schedule.steps):
        # reads first: an instruction that reads and writes the same elements (the residual add) reads the old value
        for acc in sorted(step.accesses, key=lambda a: a.write):
            segments = maps.setdefault(acc.buffer, _Segments())
            for seg in segments.cover(acc.lo, acc.hi):
                pending = ([seg.writer] if seg.writer is not None else []) + (seg.readers if acc.write else [])
                for other in pending:
                    checks += 1
                    if not before(other, i):
                        kind = "write" if acc.write else "read"
                        raise DataflowError(f"instruction {i} ({table.instrs[i].op.name}) may {kind} {acc.buffer}"
                                            f"[{seg.lo}:{seg.hi}] before instruction {other} "
                                            f"({table.instrs[other].op.name}), which the program runs first, is done")
                if acc.write:
                    seg.writer, seg.readers = i, []
                else:
                    seg.readers.append(i)
    return checks


class _Seg:
    __slots__ = ("lo", "hi", "writer", "readers")

    def __init__(self, lo: int, hi: int, writer: int | None = None, readers: list[int] | None = None) -> None:
        self.lo, self.hi, self.writer, self.readers = lo, hi, writer, readers if readers is not None else []


class _Segments:
    """Disjoint segments of one buffer, sorted; `cover(lo, hi)` splits at lo and hi and returns those inside."""

    def __init__(self) -> None:
        self.segs: list[_Seg] = []

    def _split(self, at: int) -> None:
        for k, s in enumerate(self.segs):
            if s.lo < at < s.hi:
                self.segs[k: k + 1] = [_Seg(s.lo, at, s.writer, list(s.readers)), _Seg(at, s.hi, s.writer, list(s.readers))]
                return

    def cover(self, lo: int, hi: int) -> Iterable[_Seg]:
        self._split(lo)
        self._split(hi)
        out, cursor, merged = [], lo, []
        for s in self.segs:
            if s.hi <= lo or s.lo >= hi:
                merged.append(s)
                continue
            if s.lo > cursor:  # a gap never touched before
                gap = _Seg(cursor, s.lo)
                merged.append(gap)
                out.append(gap)
            merged.append(s)
            out.append(s)
            cursor = s.hi
        if cursor < hi:
            gap = _Seg(cursor, hi)
            merged.append(gap)
            out.append(gap)
        merged.sort(key=lambda s: s.lo)
        self.segs = merged
        return out
