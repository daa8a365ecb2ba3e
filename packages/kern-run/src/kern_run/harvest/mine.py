"""The miner: from a capture's runs, one description of the step that every run agrees on, or every reason not.

The runs are one step at different token counts, so they must launch the same kernels in the same order: the
same function from the same cubin with the same parameter layout at every launch index (a layout that changed
between runs is refused). For each launch and parameter the runs' values (addresses.py) must be of one class:

- a pointer into the same named tensor (weight, state, input, output) or the same allocation ordinal
  (workspace), at byte offsets that fit one expression in the token count (fit.py);
- an integer that fits one expression (a literal when every run saw it);
- the same raw bytes.

Grids, blocks and dynamic shared memory are fitted the same way; so are input and output shapes and the size of
each intermediate allocation. A launch's module is its recorded cubin, checked to hold the function with the
recorded layout (cubin.py); a launch whose module the capture could not record is resolved by name and layout
among the capture's cubins (the specification's disambiguation of same-named instances). Everything that does
not fit is a Problem naming the run, launch and parameter; `mine` raises HarvestRefusal with all of them.
"""

from __future__ import annotations

import json

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Union

from .addresses import Pointer, Raw, RunParams, Scalar, Seen, classify_run
from .capture_format import Capture, Launch, Layout
from .cubin import CubinError, cubin_entries
from .errors import HarvestRefusal, Problem
from .fit import Fit, FitError, fit_samples


@dataclass(frozen=True)
class PointerArg:
    kind: str  # weight | state | input | output | workspace
    target: str  # tensor name, or `#k` (the k-th allocation of each run)
    offset: Fit


@dataclass(frozen=True)
class ScalarArg:
    size: int  # 4 or 8
    value: Fit


@dataclass(frozen=True)
class RawArg:
    data: bytes


Arg = Union[PointerArg, ScalarArg, RawArg]


@dataclass(frozen=True)
class MinedLaunch:
    index: int
    function: str
    module: str  # sha256 of the cubin
    params: Layout
    grid: tuple[Fit, Fit, Fit]
    block: tuple[Fit, Fit, Fit]
    shared_mem: Fit
    args: tuple[Arg, ...]


@dataclass(frozen=True)
class TensorDecl:
    """A named tensor as the manifest declares it: `shape` fitted per dim (weights and states: literals)."""

    name: str
    kind: str
    dtype: str
    shape: tuple[Fit, ...]
    nbytes_max: int


@dataclass(frozen=True)
class Allocation:
    """An intermediate allocation used by launches `first .. last`; `size` in bytes, fitted across runs."""

    ordinal: int
    size: Fit
    nbytes_max: int
    first: int
    last: int


@dataclass(frozen=True)
class Mined:
    """The step every run agrees on. `domain`: (min, max) of the runs' token counts."""

    var: str
    domain: tuple[int, int]
    tokens: tuple[int, ...]
    launches: tuple[MinedLaunch, ...]
    tensors: dict[str, TensorDecl]
    allocations: tuple[Allocation, ...]
    cubins: dict[str, bytes]
    source: dict = field(default_factory=dict)


class _Problems:
    def __init__(self) -> None:
        self.items: list[Problem] = []

    def add(self, where: str, message: str) -> None:
        self.items.append(Problem(where, message))

    def fit(self, samples: list[tuple[int, int]], where: str, what: str, var: str) -> Fit | None:
        try:
            return fit_samples(samples, var)
        except FitError as exc:
            self.add(where, f"{what}: {exc}")
            return None


def _fn(launch: Launch) -> str:
    return launch.function if len(launch.function) <= 80 else launch.function[:77] + "..."


def _align(runs: list[RunParams], problems: _Problems) -> int:
    """The number of launch indices every run has the same kernel at (problems for every difference)."""
    first = runs[0].launches
    for r, run in enumerate(runs[1:], 1):
        if len(run.launches) != len(first):
            problems.add(f"run {r}", f"{len(run.launches)} launches, run 0 has {len(first)}: the runs did not execute "
                                     f"the same compiled step")
    count = min(len(r.launches) for r in runs)
    for i in range(count):
        base = first[i]
        for r, run in enumerate(runs[1:], 1):
            other = run.launches[i]
            if other.function != base.function or other.module != base.module:
                problems.add(f"run {r} launch {i}", f"{_fn(other)} (cubin {str(other.module)[:12]}), run 0 launched "
                                                    f"{_fn(base)} (cubin {str(base.module)[:12]}) here")
            elif other.params != base.params:
                problems.add(f"run {r} launch {i}", f"{_fn(base)}: parameter layout {[list(p) for p in other.params]} "
                                                    f"changed from run 0's {[list(p) for p in base.params]}")
    return count


def _entries_of(capture: Capture, problems: _Problems) -> dict[str, dict[str, Layout]]:
    out: dict[str, dict[str, Layout]] = {}
    for sha, data in capture.cubins.items():
        try:
            out[sha] = cubin_entries(data)
        except CubinError as exc:
            problems.add(f"cubin {sha[:12]}", f"not a readable cubin: {exc}")
    return out


def _module(launch: Launch, index: int, entries: dict[str, dict[str, Layout]], capture: Capture,
            problems: _Problems) -> str | None:
    where = f"launch {index}"
    if launch.module is not None:
        if launch.module not in capture.cubins:
            problems.add(where, f"{_fn(launch)}: its cubin {launch.module} is missing from the capture")
            return None
        table = entries.get(launch.module)
        if table is None:
            return None  # unreadable: reported once for the cubin
        if launch.function not in table:
            problems.add(where, f"{_fn(launch)} is no kernel of its cubin {launch.module[:12]}")
            return None
        if table[launch.function] != launch.params:
            problems.add(where, f"{_fn(launch)}: cuFuncGetParamInfo gave {[list(p) for p in launch.params]}, its cubin "
                                f"{launch.module[:12]} declares {[list(p) for p in table[launch.function]]}")
            return None
        return launch.module
    named = sorted(sha for sha, table in entries.items() if launch.function in table)
    matching = [sha for sha in named if entries[sha][launch.function] == launch.params]
    if len(matching) == 1:
        return matching[0]
    if not named:
        problems.add(where, f"{_fn(launch)}: no cubin of the capture holds it (and the capture did not record its "
                            f"module)")
    elif not matching:
        problems.add(where, f"{_fn(launch)}: {len(named)} cubin(s) hold it, none with the layout "
                            f"{[list(p) for p in launch.params]}")
    else:
        problems.add(where, f"{_fn(launch)}: ambiguous, cubins {', '.join(s[:12] for s in matching)} hold it with "
                            f"the same layout")
    return None


def _arg(i: int, j: int, seen: list[Seen | str], tokens: list[int], var: str, problems: _Problems,
         uses: dict[int, list[int]]) -> Arg | None:
    where = f"launch {i} param {j}"
    faults = [(r, s) for r, s in enumerate(seen) if isinstance(s, str)]
    if faults:
        for r, s in faults:
            problems.add(f"run {r} {where}", s)
        return None
    first = seen[0]
    kinds = {type(s) for s in seen}
    if len(kinds) > 1:
        problems.add(where, "the runs disagree on what it is: " + ", ".join(f"run {r} {_describe(s)}"
                                                                           for r, s in enumerate(seen)))
        return None
    if isinstance(first, Pointer):
        targets = {(s.kind, s.target) for s in seen}  # type: ignore[union-attr]
        if len(targets) > 1:
            problems.add(where, "points into different memory in different runs: " +
                         ", ".join(f"run {r} {_describe(s)}" for r, s in enumerate(seen)))
            return None
        fit = problems.fit([(t, s.offset) for t, s in zip(tokens, seen)], where, "pointer offset", var)  # type: ignore[union-attr]
        if fit is None:
            return None
        if first.kind == "workspace":
            uses.setdefault(int(first.target[1:]), []).append(i)
        return PointerArg(first.kind, first.target, fit)
    if isinstance(first, Scalar):
        fit = problems.fit([(t, s.value) for t, s in zip(tokens, seen)], where, "value", var)  # type: ignore[union-attr]
        return None if fit is None else ScalarArg(first.size, fit)
    datas = {s.data for s in seen}  # type: ignore[union-attr]
    if len(datas) > 1:
        problems.add(where, f"a {len(first.data)}-byte parameter whose bytes differ between runs")  # type: ignore[union-attr]
        return None
    return RawArg(first.data)  # type: ignore[union-attr]


def _describe(s: Seen | str) -> str:
    if isinstance(s, Pointer):
        return f"{s.kind} {s.target} + {s.offset}"
    if isinstance(s, Scalar):
        return f"integer {s.value}"
    if isinstance(s, Raw):
        return f"{len(s.data)} raw bytes"
    return s


def _fits3(values: list[tuple[int, int, int]], tokens: list[int], where: str, what: str, var: str,
           problems: _Problems) -> tuple[Fit, Fit, Fit] | None:
    fits = [problems.fit([(t, v[d]) for t, v in zip(tokens, values)], where, f"{what}.{'xyz'[d]}", var)
            for d in range(3)]
    return None if None in fits else (fits[0], fits[1], fits[2])  # type: ignore[return-value]


def _tensors(capture: Capture, tokens: list[int], problems: _Problems) -> dict[str, TensorDecl]:
    per_run = [{t.name: t for t in run.tensors} for run in capture.runs]
    names = list(per_run[0])
    for r, table in enumerate(per_run[1:], 1):
        if set(table) != set(per_run[0]):
            extra = sorted(set(table) ^ set(per_run[0]))
            problems.add(f"run {r}", f"names other tensors than run 0 (differing: {', '.join(extra[:5])})")
    out: dict[str, TensorDecl] = {}
    for name in names:
        ts = [table[name] for table in per_run if name in table]
        if len(ts) != len(per_run):
            continue
        t0 = ts[0]
        if any(t.kind != t0.kind or t.dtype != t0.dtype or len(t.shape) != len(t0.shape) for t in ts):
            problems.add(f"tensor {name}", "kind, dtype or rank differs between runs")
            continue
        if t0.kind in ("weight", "state") and any((t.address, t.shape) != (t0.address, t0.shape) for t in ts):
            problems.add(f"tensor {name}", f"a {t0.kind} that moved or changed shape between runs")
            continue
        dims = [problems.fit([(tk, t.shape[d]) for tk, t in zip(tokens, ts)], f"tensor {name}", f"dim {d}",
                             capture.var) for d in range(len(t0.shape))]
        if None in dims:
            continue
        out[name] = TensorDecl(name, t0.kind, t0.dtype, tuple(dims), max(t.nbytes for t in ts))  # type: ignore[arg-type]
    return out


def mine(capture: Capture) -> Mined:
    """The step `capture` records, fitted across its runs (module docstring). Raises HarvestRefusal listing
    every problem: overlapping tensors, memcpy/memset calls, runs that launch different kernels or layouts,
    missing or unreadable cubins, a function its cubin lacks or declares with another layout, a parameter that
    is a fault in some run (a pointer into unnamed memory, a struct holding a pointer), a class, target or value
    that differs between runs in a way no expression fits, tensors that differ between runs, and an input or
    output no launch touches."""
    problems = _Problems()
    var = capture.var
    tokens = [run.tokens for run in capture.runs]
    classified = []
    for r, run in enumerate(capture.runs):
        params, found = classify_run(run, r)
        classified.append(params)
        problems.items += found
    count = _align(classified, problems)
    entries = _entries_of(capture, problems)
    uses: dict[int, list[int]] = {}
    launches = []
    for i in range(count):
        base = classified[0].launches[i]
        module = _module(base, i, entries, capture, problems)
        where = f"launch {i}"
        grid = _fits3([run.launches[i].grid for run in classified], tokens, where, "grid", var, problems)
        block = _fits3([run.launches[i].block for run in classified], tokens, where, "block", var, problems)
        smem = problems.fit([(t, run.launches[i].shared_mem) for t, run in zip(tokens, classified)], where,
                            "shared_mem", var)
        same_layout = all(run.launches[i].params == base.params for run in classified)
        args = [_arg(i, j, [run.seen[i][j] for run in classified], tokens, var, problems, uses)
                for j in range(len(base.params))] if same_layout else [None]
        if module is None or grid is None or block is None or smem is None or None in args:
            continue
        launches.append(MinedLaunch(i, base.function, module, base.params, grid, block, smem, tuple(args)))  # type: ignore[arg-type]
    tensors = _tensors(capture, tokens, problems)
    touched = {a.target for ml in launches for a in ml.args if isinstance(a, PointerArg)}
    for t in tensors.values():
        if t.kind in ("input", "output") and t.name not in touched and not problems.items:
            problems.add(f"tensor {t.name}", f"an {t.kind} no launch reads or writes (a view of another tensor, or "
                                             f"computed on the host?)")
    allocations = _allocations(classified, uses, tokens, var, problems)
    _views_of_intermediates(capture, classified, uses, problems)
    if problems.items:
        recorder = capture.source.get("recorder")
        if recorder and any(l.module is None for run in capture.runs for l in run.launches):
            problems.items.insert(0, Problem("capture", "launches without a recorded module; the recorder's account: "
                                                         f"{json.dumps(recorder, sort_keys=True)}"))
        raise HarvestRefusal(problems.items)
    used = {name: decl for name, decl in tensors.items() if name in touched or decl.kind in ("input", "output")}
    lo, hi = min(tokens), max(tokens)
    return Mined(var, (lo, hi), tuple(tokens), tuple(launches), used, allocations,
                 {ml.module: capture.cubins[ml.module] for ml in launches}, dict(capture.source))


def _allocations(runs: list[RunParams], uses: dict[int, list[int]], tokens: list[int], var: str,
                 problems: _Problems) -> tuple[Allocation, ...]:
    out = []
    for ordinal in sorted(uses):
        sizes = [run.sizes[ordinal] if ordinal < len(run.sizes) else None for run in runs]
        if None in sizes:
            problems.add(f"allocation #{ordinal}", "made in some runs only")
            continue
        fit = problems.fit(list(zip(tokens, sizes)), f"allocation #{ordinal}", "size", var)  # type: ignore[arg-type]
        if fit is not None:
            out.append(Allocation(ordinal, fit, max(sizes), min(uses[ordinal]), max(uses[ordinal])))  # type: ignore[type-var]
    return tuple(out)


def _views_of_intermediates(capture: Capture, runs: list[RunParams], uses: dict[int, list[int]],
                            problems: _Problems) -> None:
    """An output that is a view into an allocation that launches also reach outside the view: the replay gives the
    output and the workspace separate memory, so what those launches write would not land in the output."""
    for r, (run, params) in enumerate(zip(capture.runs, runs)):
        for t in run.tensors:
            ordinal = params.allocation_of(t) if t.kind == "output" else None
            if ordinal is not None and ordinal in uses:
                problems.add(f"run {r} tensor {t.name}", f"an output inside allocation #{ordinal}, which launches "
                                                         f"{sorted(set(uses[ordinal]))[:5]} also reach outside it: "
                                                         f"replayed as separate buffers they would not alias")


def count_args(mined: Mined, keep: Callable[[Arg], bool]) -> int:
    """How many launch arguments of `mined` satisfy `keep` (for the report)."""
    return sum(1 for ml in mined.launches for a in ml.args if keep(a))
