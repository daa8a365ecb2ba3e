"""What a program run does besides its launches: the `zero_each_run` buffers it zeroes first, and which programs
pass an error word (docs/manifest.md, "Buffers").

A buffer with `zero_each_run` is zeroed (one `cuMemsetD8Async` over its whole extent, a memset node inside a
captured graph) at the start of every enqueue of a program whose calls pass it, before the program's first launch:
the per-step counters and flags of a persistent kernel then need no host work. `run_range` zeroes the buffers that
the calls of its range pass. Pure Python over the manifest: the CPU tests check the spans directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kern_manifest import Manifest, Ref


@dataclass(frozen=True)
class ZeroSpan:
    """Buffer `buffer` (at `address`, `nbytes` bytes) zeroed before a run whose calls include one of `calls`
    (indices into the program's flattened call list)."""

    buffer: str
    address: int
    nbytes: int
    calls: frozenset[int]

    def applies(self, calls: range | None) -> bool:
        """Whether an enqueue of the calls in `calls` (None: the whole program) zeroes this buffer."""
        return calls is None or any(i in calls for i in self.calls)


def buffers_passed(manifest: Manifest, program: str) -> dict[str, list[int]]:
    """Buffer name -> indices of the calls (flattened, inlined programs expanded) of `program` that pass it as a
    `ptr` argument, in first-use order."""
    out: dict[str, list[int]] = {}
    for index, call in enumerate(manifest.programs[program].flat_calls(manifest)):
        for value in call.args.values():
            if isinstance(value, Ref) and value.name in manifest.buffers:
                uses = out.setdefault(value.name, [])
                if not uses or uses[-1] != index:
                    uses.append(index)
    return out


def zero_spans(manifest: Manifest, program: str, address_of: Callable[[str], int],
               nbytes_of: Callable[[str], int]) -> tuple[ZeroSpan, ...]:
    """The `zero_each_run` buffers `program` passes, in first-use order, with their address and byte size."""
    spans = []
    for name, calls in buffers_passed(manifest, program).items():
        if manifest.buffers[name].zero_each_run:
            spans.append(ZeroSpan(name, address_of(name), nbytes_of(name), frozenset(calls)))
    return tuple(spans)


def programs_passing(manifest: Manifest, buffer: str) -> tuple[str, ...]:
    """The programs (not `derive` ones: they run only while weights load) whose calls pass `buffer`, in manifest
    order: what an error word's fault report names."""
    return tuple(name for name, prog in manifest.programs.items()
                 if prog.kind != "derive" and buffer in buffers_passed(manifest, name))
