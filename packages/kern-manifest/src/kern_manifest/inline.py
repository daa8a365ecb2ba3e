"""Inlined programs (`{"program": name}` calls): how large a program's expansion is, and the expansion.

Both walk with an explicit stack, never Python recursion, so a chain of inlined programs longer than the
recursion limit is fine. Sizes are computed first, over the call graph (each program once, capped), so an
expansion too large to make is refused before anything is expanded: 30 programs that each call the next twice
would otherwise expand to 2^30 calls.

The size of a program is its *expansion steps*: the calls met while expanding it, op calls and inline calls
alike (an inline call costs a step even when the program it names is empty). The limits (docs/manifest.md,
"Programs"):

- MAX_PROGRAM_CALLS (65,536) expansion steps per program;
- MAX_MANIFEST_CALLS (1,048,576) expansion steps of all programs together (the runtime expands every one).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, NamedTuple

from .errors import ManifestError

if TYPE_CHECKING:
    from .model import Call, Manifest

# The Qwen3-4B prefill program has 319 calls; a CUDA graph of 65,536 launches is far past any model kern runs.
MAX_PROGRAM_CALLS = 1 << 16
MAX_MANIFEST_CALLS = 1 << 20
_CAP = MAX_MANIFEST_CALLS + 1  # sizes saturate here: a 2^1000 expansion is never computed


class Size(NamedTuple):
    """A program's expansion: `op_calls` (what a run replays) and `steps` (op calls plus inline calls met while
    expanding), each saturating at MAX_MANIFEST_CALLS + 1."""

    op_calls: int
    steps: int


def expanded_size(manifest: Manifest, root: str, memo: dict[str, Size] | None = None) -> Size:
    """The expansion size of program `root` (see `Size`). `memo` (program -> size) may be shared between calls
    on one manifest, so sizing every program costs one pass over all calls. Raises `ManifestError` for an inline
    cycle or an unknown program reached from `root` (a verified manifest has neither)."""
    from .model import ProgramCall

    memo = {} if memo is None else memo
    programs = manifest.programs
    if root not in programs:
        raise ManifestError(f"unknown program {root!r}")
    # frames of (program, iterator over its calls, [op calls, steps] so far); `on_stack` the programs open
    frames: list[tuple[str, Iterator[object], list[int]]] = [(root, iter(programs[root].calls), [0, 0])]
    on_stack, stacked = [root], {root}
    while frames:
        name, calls, total = frames[-1]
        call = next(calls, None)
        if call is None:
            frames.pop()
            stacked.discard(on_stack.pop())
            memo[name] = Size(total[0], total[1])
            if frames:
                _add(frames[-1][2], memo[name].op_calls, memo[name].steps)
            continue
        if not isinstance(call, ProgramCall):
            _add(total, 1, 1)
            continue
        target = call.program
        if target in memo:
            _add(total, memo[target].op_calls, memo[target].steps + 1)
        elif target in stacked:
            raise ManifestError(f"program cycle: {' -> '.join((*on_stack[on_stack.index(target):], target))}")
        elif target not in programs:
            raise ManifestError(f"program {name!r} inlines unknown program {target!r}")
        else:
            _add(total, 0, 1)
            frames.append((target, iter(programs[target].calls), [0, 0]))
            on_stack.append(target)
            stacked.add(target)
    return memo[root]


def _add(total: list[int], op_calls: int, steps: int) -> None:
    total[0] = min(total[0] + op_calls, _CAP)
    total[1] = min(total[1] + steps, _CAP)


def expanded_sizes(manifest: Manifest) -> Mapping[str, Size]:
    """`expanded_size` of every program that has one (programs on a cycle or reaching an unknown program are
    left out: the verifier reports those at their calls)."""
    memo: dict[str, Size] = {}
    for name in manifest.programs:
        if name not in memo:
            try:
                expanded_size(manifest, name, memo)
            except ManifestError:
                continue
    return memo


def size_faults(manifest: Manifest) -> list[tuple[str, str]]:
    """(program, message) for every program past MAX_PROGRAM_CALLS steps whose inlined programs are within it
    (the program where the expansion first grows too large; those that inline it are not listed again), and
    ("", message) when all programs together pass MAX_MANIFEST_CALLS."""
    from .model import ProgramCall

    sizes = manifest.program_sizes

    def over(name: str) -> bool:
        return name in sizes and sizes[name].steps > MAX_PROGRAM_CALLS

    out = [(name, f"program {name!r} expands to {_count(size.steps)} calls (op calls and inlined programs, "
                  f"expanded); at most {MAX_PROGRAM_CALLS} per program")
           for name, size in sizes.items() if over(name) and not any(
               isinstance(c, ProgramCall) and over(c.program) for c in manifest.programs[name].calls)]
    total = sum(size.steps for size in sizes.values())
    if total > MAX_MANIFEST_CALLS:
        shown = _count(_CAP) if any(size.steps >= _CAP for size in sizes.values()) else str(total)
        out.append(("", f"the programs together expand to {shown} calls (op calls and inlined programs, "
                        f"expanded); at most {MAX_MANIFEST_CALLS} in one manifest"))
    return out


def _count(steps: int) -> str:
    return f"more than {MAX_MANIFEST_CALLS}" if steps >= _CAP else str(steps)


def num_calls(manifest: Manifest, root: str) -> int:
    """Op calls per run of program `root`, inlined programs expanded, counted without expanding. Raises
    `ManifestError` for an inline cycle, an unknown program, or a program or manifest past the limits."""
    size = manifest.program_sizes.get(root)
    if size is None:
        expanded_size(manifest, root)  # raises: a cycle or an unknown program
        raise AssertionError(f"program {root!r} is sized only outside program_sizes: a bug in kern-manifest")
    faults = manifest.program_size_faults
    if faults:
        raise ManifestError(faults[0][1])
    return size.op_calls


def flat_calls(manifest: Manifest, root: str) -> list[Call]:
    """The op calls of program `root` in replay order, inlined programs expanded. Raises `ManifestError` as
    `num_calls` does, before expanding anything."""
    from .model import ProgramCall

    num_calls(manifest, root)
    out: list[Call] = []
    stack = [iter(manifest.programs[root].calls)]
    while stack:
        call = next(stack[-1], None)
        if call is None:
            stack.pop()
        elif isinstance(call, ProgramCall):
            stack.append(iter(manifest.programs[call.program].calls))
        else:
            out.append(call)
    return out
