"""Mixin of `Runtime` for callers that keep the GPU busy across steps, and for profiling.

- `record_event()`: a point on the compute stream the host can poll or wait on (pooled events, no
  timing), so a caller can queue several steps ahead and learn when each has finished.
- `host_array(name)`: a live numpy view of a `placement: host` buffer (pinned, device-mapped): kernels
  write it through the mapping and the host reads it after an event behind them, with no copy on the
  stream between steps (the decode program's token ring, docs/caller.md "Decode on the device").
- `records(program)` / `run_hooked(program, vars, on_launch)`: the compiled launch records and an eager
  replay calling `on_launch(index, record)` before each launch, so a profiler can put events between
  launches (bench/decode.py --breakdown).

Needs from `Runtime`: `stream`, `manifest`, `programs`, `_ledger`, `_activate()`, `_program()`, `_buffer()`,
`_require_ready()`.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np

from ..cuda.driver import call, cu
from ..cuda.dtypes import numpy_dtype
from ..errors import ApiError
from ..cuda.graphs import normalise_vars
from .records import Record


class EventHandle:
    """A point on the compute stream (`record_event`): `ready()` polls, `wait()` blocks until everything
    enqueued before it has finished. The event goes back to the runtime's pool on `wait()` or
    `release()`; a handle is single-use (after that, `ready()` is True and `wait()` returns at once)."""

    def __init__(self, event: Any, on_done: Callable[[], None]) -> None:
        self._event = event
        self._on_done: Callable[[], None] | None = on_done

    def ready(self) -> bool:
        if self._on_done is None:
            return True
        result = cu().cuEventQuery(self._event)
        return int(result[0] if isinstance(result, tuple) else result) == 0

    def wait(self) -> None:
        if self._on_done is not None:
            call("cuEventSynchronize", self._event)
            self.release()

    def release(self) -> None:
        """Give the event back without waiting (the recorded point stays enqueued; reuse re-records it)."""
        if self._on_done is not None:
            done, self._on_done = self._on_done, None
            done()


class StepMethods:
    """Mixin of `Runtime`: events, host-mapped views, hooked eager replay."""

    stream: Any
    spec: Any
    _ledger: Any

    def _activate(self) -> None: ...  # provided by Runtime

    def _event_pool(self) -> list[Any]:
        pool = self.__dict__.get("_step_events_free")
        if pool is None:
            pool = self.__dict__["_step_events_free"] = []
        return pool

    def record_event(self) -> EventHandle:
        """Record an event on the compute stream after everything enqueued so far (no synchronisation)."""
        self._activate()
        pool = self._event_pool()
        if pool:
            event = pool.pop()
        else:
            event = call("cuEventCreate", 2)  # CU_EVENT_DISABLE_TIMING
            self._ledger.on_close("step event", lambda e=event: call("cuEventDestroy", e))
        call("cuEventRecord", event, self.stream)
        return EventHandle(event, lambda: pool.append(event))

    def host_array(self, name: str) -> np.ndarray:
        """A live view (no copy, no synchronisation) of `placement: host` buffer `name`, with its dtype and
        its shape at var max. Read it only after an event recorded behind the kernels that write it has
        completed. Raises ApiError for an unknown buffer or a device-placed one."""
        self._activate()
        spec, alloc = self._buffer(name)  # type: ignore[attr-defined]
        if spec.placement != "host" or not alloc.host_address:
            raise ApiError(f"buffer {name!r} is placed on the {spec.placement}; host_array needs placement host")
        shape = tuple(spec.shape_at(self.max_values))
        dtype = numpy_dtype(spec.dtype)
        count = math.prod(shape)
        return alloc.host_view()[: count * dtype.itemsize].view(dtype).reshape(shape)

    def records(self, program: str) -> list[Record]:
        """The compiled launch records of `program` in order (`rec.op`, `rec.call_index`, `rec.active` after
        the last patch, `rec.launch.entry` or `rec.launch.extern`)."""
        return list(self._program(program).records)  # type: ignore[attr-defined]

    def run_hooked(self, program: str, vars: Mapping[str, int] | None,
                   on_launch: Callable[[int, Record], None]) -> None:
        """`run` (eager, no synchronisation) calling `on_launch(index, record)` on this thread before each
        active record is enqueued; the hook may enqueue its own work on `self.stream` (events, a gate).
        Raises ApiError (unknown program, bad vars, `on_launch` not callable), CallError (a failing call)."""
        self._activate()
        if not callable(on_launch):
            raise ApiError(f"run_hooked: on_launch must be callable(index, record), got {type(on_launch).__name__}")
        state = self._program(program)  # type: ignore[attr-defined]
        self._require_ready(state)  # type: ignore[attr-defined]
        values = normalise_vars(vars, self.manifest.vars, state.reads, program)
        self.programs.enqueue_hooked(state, values, on_launch)  # type: ignore[attr-defined]
