"""CUDA graphs of programs: keys and the capture cache.

A graph program is captured once per key `(program, ((var, value), ...))` over only the vars its
launches read; every other var is normalised to its minimum before the program runs, so two calls
differing only in vars the program does not read share one graph. Capture happens on the runtime's
own non-blocking stream (never the legacy NULL stream), replay is one `cuGraphLaunch`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from kern_manifest import Var

from ..errors import ApiError, as_integer
from .driver import call, cu

GraphKey = tuple[str, tuple[tuple[str, int], ...]]


def normalise_vars(values: Mapping[str, int] | None, vars_: Mapping[str, Var], reads: frozenset[str],
                   program: str) -> dict[str, int]:
    """Full var values for a run of `program`: given values for the vars it reads (each in range),
    every other var at its min, whether the caller gave it or not and whatever its value (a var the program
    does not read cannot change what it runs; the original runtime's rule). `values` None is `{}`; a value
    is anything `operator.index` accepts (int, numpy integers) except a bool.

    Raises ApiError for `values` that is not a mapping, an unknown var, a value that is not an integer,
    a read var's value out of [min, max] or a read var left out.
    """
    if values is None:
        values = {}
    if not isinstance(values, Mapping):
        raise ApiError(f"program {program!r}: vars must be a mapping of var name -> int, got {type(values).__name__}")
    given: dict[str, int] = {}
    for name, value in values.items():
        spec = vars_.get(name) if isinstance(name, str) else None
        if spec is None:
            raise ApiError(f"program {program!r}: unknown var {name!r}; the manifest declares {sorted(vars_)}")
        number = as_integer(value)
        if number is None:
            raise ApiError(f"program {program!r}: var {name!r} = {value!r} is not an integer")
        if name in reads and not spec.min <= number <= spec.max:
            raise ApiError(f"program {program!r}: var {name!r} = {number} is outside [{spec.min}, {spec.max}]")
        given[name] = number
    out = {}
    for name, spec in vars_.items():
        if name in reads:
            if name not in given:
                raise ApiError(f"program {program!r} reads var {name!r}: pass it (range [{spec.min}, {spec.max}])")
            out[name] = given[name]
        else:
            out[name] = spec.min
    return out


def graph_key(program: str, values: Mapping[str, int], reads: frozenset[str]) -> GraphKey:
    """The capture key: the program and the values of only the vars it reads, sorted by name."""
    return (program, tuple(sorted((name, int(values[name])) for name in reads)))


def capture_mode() -> Any:
    """The capture mode of every graph kern captures: CU_STREAM_CAPTURE_MODE_THREAD_LOCAL (GraphCache.capture)."""
    return cu().CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL


class GraphCache:
    """Instantiated graphs by key. `replay(key, capture, stream)`: launch the graph for `key`,
    capturing it first with `capture()` (which enqueues the program's launches on `stream`)."""

    def __init__(self) -> None:
        self._execs: dict[GraphKey, Any] = {}

    def __contains__(self, key: GraphKey) -> bool:
        return key in self._execs

    def __len__(self) -> int:
        return len(self._execs)

    def keys(self) -> list[GraphKey]:
        return list(self._execs)

    def capture(self, key: GraphKey, enqueue: Callable[[], None], stream: Any) -> Any:
        """Capture `enqueue()` on `stream` and instantiate it. On failure the capture is ended and nothing is
        kept. Thread-local capture mode: only this thread's unsafe driver calls (cuMemAlloc, a synchronous copy)
        during the capture are refused, so an engine's other threads (its own allocator, another library) keep
        working while kern captures (CUDA driver API, cuStreamBeginCapture and CUstreamCaptureMode)."""
        call("cuStreamBeginCapture", stream, capture_mode())
        graph = None
        try:
            enqueue()
        except BaseException:
            try:
                graph = call("cuStreamEndCapture", stream)
            finally:
                if graph is not None:
                    call("cuGraphDestroy", graph)
            raise
        graph = call("cuStreamEndCapture", stream)
        try:
            exec_ = call("cuGraphInstantiate", graph, 0)
        finally:
            call("cuGraphDestroy", graph)
        self._execs[key] = exec_
        return exec_

    def put(self, key: GraphKey, exec_: Any) -> None:
        """Keep an instantiated graph captured elsewhere (multigpu.LocalGroup captures every rank at once)."""
        self._execs[key] = exec_

    def replay(self, key: GraphKey, enqueue: Callable[[], None], stream: Any) -> bool:
        """Launch the graph of `key`, capturing it first if new. Returns True when it was captured now."""
        exec_ = self._execs.get(key)
        captured = exec_ is None
        if captured:
            exec_ = self.capture(key, enqueue, stream)
        call("cuGraphLaunch", exec_, stream)
        return captured

    def close(self) -> None:
        while self._execs:
            _, exec_ = self._execs.popitem()
            call("cuGraphExecDestroy", exec_)
