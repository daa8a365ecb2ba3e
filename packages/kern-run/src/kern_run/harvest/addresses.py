"""What each launch parameter of one run was: the pointer classes (docs/harvest.md "Pointer classes").

A parameter of 8 bytes is a pointer when its value lies inside a tensor the capture named (weight, state,
input, output: `[address, address + bytes]`, the end included, a zero-size view's pointer) or inside an
allocation the step made that is alive at that launch (an intermediate); `0` is a null pointer (or an integer
zero: the same bytes). Two rules keep the class the same in every run, whatever the allocator reused:
- an output the step allocated is that output only once its allocation exists: before, its address belongs to
  whatever intermediate held that memory then, freed before the output's allocation took it (the H200 captures of
  2026-12-03 put `next_token` where the embedding's intermediate had been);
- a value strictly inside something beats a value at something's end: an intermediate that starts where a state
  ends (`k_cache.0 + 1048576` on the 4B shape) is the intermediate.

An 8-byte value below 2^32 that is in no range is an integer; any other is a pointer into memory the capture cannot
name: a fault. Parameters of 4 bytes are integers (or f32 bits: the bytes are kept as they are); other sizes are
raw bytes, in which every aligned 8-byte word is checked for a pointer (a struct holding a pointer cannot be
replayed by wiring).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Union

from .capture_format import Alloc, Free, Launch, Run, Tensor
from .errors import Problem

POINTER_BYTES = 8
SMALL_INT = 1 << 32
MAX_LIVE = 1024  # allocations of the step alive at once (a real step holds tens); bounds the miner's time


@dataclass(frozen=True)
class Pointer:
    """A pointer `offset` bytes into `target`: a named tensor's name, or `#k` for the run's k-th allocation."""

    kind: str  # weight | state | input | output | workspace
    target: str
    offset: int


@dataclass(frozen=True)
class Scalar:
    """An integer parameter of `size` bytes (4 or 8), `value` read as signed little-endian."""

    size: int
    value: int


@dataclass(frozen=True)
class Raw:
    """A parameter of another size, kept as its bytes."""

    data: bytes


Seen = Union[Pointer, Scalar, Raw]


class NamedRanges:
    """The named tensors of a run, looked up by address. Two names with the same range are one tensor (the
    first listed names it, the others are `aliases`); a partial overlap is a Problem."""

    def __init__(self, tensors: tuple[Tensor, ...], run: int) -> None:
        self.problems: list[Problem] = []
        self.aliases: dict[str, str] = {}
        by_range: dict[tuple[int, int], Tensor] = {}
        for t in tensors:
            first = by_range.setdefault((t.address, t.end), t)
            if first is not t:
                self.aliases[t.name] = first.name
        self.sorted = sorted(by_range.values(), key=lambda t: (t.address, t.end))
        for a, b in zip(self.sorted, self.sorted[1:]):
            if b.address < a.end:
                self.problems.append(Problem(f"run {run} tensor {b.name}", f"[0x{b.address:x}, 0x{b.end:x}) overlaps "
                                             f"{a.kind} {a.name} [0x{a.address:x}, 0x{a.end:x})"))
        self.starts = [t.address for t in self.sorted]

    def find(self, value: int) -> Tensor | None:
        """The tensor whose `[address, end]` holds `value` (the last one starting at or below it)."""
        found = self.candidates(value)
        return found[0] if found else None

    def candidates(self, value: int) -> list[Tensor]:
        """The tensors whose `[address, end]` holds `value`, the one starting last first: at most two (disjoint
        tensors share a point only where one ends and the next starts)."""
        i = bisect.bisect_right(self.starts, value) - 1
        return [self.sorted[k] for k in (i, i - 1) if k >= 0 and value <= self.sorted[k].end]


class LiveAllocations:
    """The step's allocations alive at the current event: ordinal (k-th alloc of the run), address, size."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.blocks: list[tuple[int, int, int]] = []  # (address, nbytes, ordinal), sorted by address
        self.count = 0
        self.sizes: list[int] = []  # nbytes by ordinal
        self.every: list[tuple[int, int, int]] = []  # (address, nbytes, ordinal) of every allocation, freed ones too
        self.alive: set[int] = set()  # ordinals of the live allocations

    def alloc(self, event: Alloc) -> None:
        i = bisect.bisect_left(self.starts, event.address)
        self.starts.insert(i, event.address)
        self.blocks.insert(i, (event.address, event.nbytes, self.count))
        self.sizes.append(event.nbytes)
        self.every.append((event.address, event.nbytes, self.count))
        self.alive.add(self.count)
        self.count += 1

    def free(self, event: Free) -> None:
        i = bisect.bisect_left(self.starts, event.address)
        if i < len(self.starts) and self.starts[i] == event.address:  # frees of memory from before the step: not ours
            self.alive.discard(self.blocks[i][2])
            del self.starts[i]
            del self.blocks[i]

    def find(self, value: int) -> tuple[int, int, bool] | None:
        """(ordinal, offset, at_end) of the live allocation holding `value` (its end included: `at_end`)."""
        i = bisect.bisect_right(self.starts, value) - 1
        if i >= 0:
            address, nbytes, ordinal = self.blocks[i]
            if value <= address + nbytes:
                return ordinal, value - address, value == address + nbytes
        return None


def owners(tensors: tuple[Tensor, ...], live: LiveAllocations) -> dict[str, int]:
    """Name -> ordinal of the step's allocation that holds each named tensor when the step ends (`live` walked
    over the whole run): the outputs the step allocated itself."""
    out = {}
    for t in tensors:
        found = live.find(t.address)
        if found is not None and not found[2] and t.end <= t.address - found[1] + live.sizes[found[0]]:
            out[t.name] = found[0]
    return out


def _pointer(value: int, named: NamedRanges, live: LiveAllocations, owned: dict[str, int]) -> Pointer | None:
    """The class of `value` at this launch (module docstring, the two rules)."""
    block = live.find(value)
    tensor = None
    for t in named.candidates(value):
        if t.name in owned and owned[t.name] not in live.alive:
            continue  # an output whose allocation does not exist yet: the memory is someone else's now
        if value == t.end and block is not None and not block[2] and owned.get(t.name) != block[0]:
            continue  # at this tensor's end, strictly inside another allocation: that allocation's
        tensor = t
        break
    if tensor is not None:
        return Pointer(tensor.kind, tensor.name, value - tensor.address)
    if block is not None:
        return Pointer("workspace", f"#{block[0]}", block[1])
    return None


def classify_param(data: bytes, named: NamedRanges, live: LiveAllocations,
                   owned: dict[str, int] | None = None) -> Seen | str:
    """What one parameter's bytes are (module docstring); a string says why they are a fault. `owned`: the
    step's own tensors (`owners`), checked against `live`."""
    owned = owned or {}
    if len(data) == POINTER_BYTES:
        value = int.from_bytes(data, "little")
        if value == 0:
            return Scalar(8, 0)
        pointer = _pointer(value, named, live, owned)
        if pointer is not None:
            return pointer
        if value < SMALL_INT:
            return Scalar(8, value)
        return f"0x{value:x} points into no tensor the capture names and no allocation alive at this launch"
    if len(data) == 4:
        return Scalar(4, int.from_bytes(data, "little", signed=True))
    for at in range(0, len(data) - 7, 8):
        word = int.from_bytes(data[at:at + 8], "little")
        if word and _pointer(word, named, live, owned) is not None:
            return f"a {len(data)}-byte parameter holds a pointer (0x{word:x}) at byte {at}: a struct of pointers " \
                   f"cannot be wired"
    return Raw(data)


@dataclass
class RunParams:
    """Per launch (in order) the classified parameters of one run; `sizes`: allocation bytes by ordinal;
    `owned`: named tensor -> ordinal of the step's allocation holding it when the step ends (`owners`)."""

    launches: list[Launch]
    seen: list[list[Seen | str]]
    sizes: list[int]
    named: NamedRanges
    owned: dict[str, int]

    def allocation_of(self, tensor: Tensor) -> int | None:
        """The ordinal of the step's allocation that holds `tensor` when the step ends (an output the step
        allocated), if any."""
        return self.owned.get(tensor.name)


def classify_run(run: Run, index: int) -> tuple[RunParams, list[Problem]]:
    """Walk a run's events in order, classifying every parameter of every launch against the tensors and the
    allocations alive at it. Problems: overlapping tensors, and every driver call that is no launch, alloc or
    free (a memcpy or memset the manifest cannot express)."""
    named = NamedRanges(run.tensors, index)
    final = LiveAllocations()  # a first walk: which allocation holds each named tensor at the end
    for e in run.events:
        if isinstance(e, Alloc):
            if len(final.blocks) >= MAX_LIVE:
                break
            final.alloc(e)
        elif isinstance(e, Free):
            final.free(e)
    owned = owners(run.tensors, final)
    live = LiveAllocations()
    problems = list(named.problems)
    for t in run.tensors:
        freed = [o for a, n, o in final.every if a <= t.address < a + n] if t.name not in owned else []
        if freed:
            problems.append(Problem(f"run {index} tensor {t.name}", f"lies in memory the step freed (allocation "
                                                                    f"#{freed[-1]}): its bytes may be another's"))
    launches: list[Launch] = []
    seen: list[list[Seen | str]] = []
    for number, e in enumerate(run.events):
        if isinstance(e, Alloc):
            live.alloc(e)
            if len(live.blocks) > MAX_LIVE:
                problems.append(Problem(f"run {index} event {number}", f"more than {MAX_LIVE} allocations of the step "
                                                                      f"alive at once; the rest of the run is not read"))
                break
        elif isinstance(e, Free):
            live.free(e)
        elif isinstance(e, Launch):
            launches.append(e)
            seen.append([classify_param(e.param(j), named, live, owned) for j in range(len(e.params))])
        else:
            problems.append(Problem(f"run {index} after launch {len(launches) - 1}",
                                    f"{e.name} inside the step: a manifest only launches kernels (no copies, no sets)"))
    return RunParams(launches, seen, live.sizes, named, owned), problems
