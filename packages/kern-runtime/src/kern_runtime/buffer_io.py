"""Inputs, outputs and events of one runtime: `BufferIO`, held as `Runtime.io`.

- `write_input`: into an input buffer through its resident pinned staging area, async on the compute stream;
- `read_buffer` / `read_output` (synchronising) and `read_output_async` (pinned readback + event, the
  staging reused once a handle is waited or dropped and its copy done: `ReadbackHandle`);
- `record_event`: a point on the compute stream the host can poll or wait on (pooled events, no timing), so a
  caller can queue several steps ahead (`EventHandle`);
- `host_array`: a live numpy view of a `placement: host` buffer (pinned, device-mapped): kernels write it through
  the mapping and the host reads it after an event behind them (docs/caller.md "Decode on the device").

After a synchronising read, a readback or event waited, and an event (`EventHandle`) polled ready, the host calls
`after_wait()`: the runtime's error-word check (device_faults.py), which raises `DeviceFaultError` when a kernel
reported a fault. `write_input`'s wait for its staging area and `ReadbackHandle.ready()` do not call it.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
from kern_manifest import Buffer, Manifest

from .cuda.driver import call, cu
from .cuda.dtypes import numpy_dtype
from .cuda.memory import Allocation, Ledger
from .errors import ApiError, int_arg, with_article
from .kv.host_tier import event_done


class ReadbackHandle:
    """An output copy in flight: `ready()` polls, `wait()` blocks and returns the array (a copy)."""

    def __init__(self, staging: Allocation, event: Any, shape: tuple[int, ...], dtype: np.dtype, nbytes: int,
                 on_done: Callable[[], None], after_wait: Callable[[], None] = lambda: None) -> None:
        self._staging, self._event = staging, event
        self._shape, self._dtype, self._nbytes = shape, dtype, nbytes
        self._on_done = on_done
        self._after_wait = after_wait
        self._result: np.ndarray | None = None

    def ready(self) -> bool:
        """Whether the copy has completed (True once `wait()` has returned); does not block and does not read
        the error words. Raises DriverError when the event query fails."""
        return self._result is not None or event_done(self._event)

    def wait(self) -> np.ndarray:
        """Block until the copy has completed and return it as a new array of the buffer's numpy dtype (bf16 /
        fp8 as uint16 / uint8 bits) and its shape at var max, dim 0 cut to `rows` when `rows` was given; a
        later call returns the same array. Raises DriverError when the wait fails, DeviceFaultError when a
        kernel enqueued before the copy wrote an error word (raised by the first wait only: the word is
        cleared, the staging given back and the array kept, so a later call returns it)."""
        if self._result is None:
            call("cuEventSynchronize", self._event)
            raw = self._staging.host_view()[: self._nbytes].copy()
            self._result = raw.view(self._dtype).reshape(self._shape)
            self._on_done()
            self._after_wait()  # DeviceFaultError when a kernel before the copy wrote an error word
        return self._result


class EventHandle:
    """A point on the compute stream (`record_event`): `ready()` polls, `wait()` blocks until everything
    enqueued before it has finished. The event goes back to the runtime's pool on `wait()` or
    `release()`; a handle is single-use (after that, `ready()` is True and `wait()` returns at once)."""

    def __init__(self, event: Any, on_done: Callable[[], None], after_wait: Callable[[], None] = lambda: None) -> None:
        self._event = event
        self._on_done: Callable[[], None] | None = on_done
        self._after_wait = after_wait

    def ready(self) -> bool:
        """Whether the point was reached (DeviceFaultError, when it was, if a kernel before it reported a fault)."""
        if self._on_done is None:
            return True
        result = cu().cuEventQuery(self._event)
        done = int(result[0] if isinstance(result, tuple) else result) == 0
        if done:
            self._after_wait()
        return done

    def wait(self) -> None:
        """Block until the point is reached; DeviceFaultError when a kernel before it reported a fault (the event is
        given back first)."""
        if self._on_done is not None:
            call("cuEventSynchronize", self._event)
            self.release()
            self._after_wait()

    def release(self) -> None:
        """Give the event back without waiting (the recorded point stays enqueued; reuse re-records it)."""
        if self._on_done is not None:
            done, self._on_done = self._on_done, None
            done()


class BufferIO:
    """The buffers' host side. `manifest` / `max_values`: the loaded manifest and every var at its max (the
    shapes); `buffers`: name -> allocation; `input_staging`: input name -> (pinned staging, its event);
    `ledger`: where new readback staging and events are registered; `stream`: the compute stream;
    `activate()`: makes the runtime's context current, ApiError once it is closed; `after_wait()`: the error-word
    check, called after the waits the module docstring lists."""

    def __init__(self, manifest: Manifest, max_values: dict[str, int], buffers: dict[str, Allocation],
                 input_staging: dict[str, tuple[Allocation, Any]], ledger: Ledger, stream: Any,
                 activate: Callable[[], None], after_wait: Callable[[], None] = lambda: None) -> None:
        self._after_wait = after_wait
        self._manifest, self._max_values = manifest, max_values
        self._buffers, self._input_staging = buffers, input_staging
        self._ledger, self.stream, self._activate = ledger, stream, activate
        self._readback_free: list[tuple[Allocation, Any]] = []
        # (handle, its staging and event) per readback not yet waited: a dropped handle's pair is reused once
        # its copy has completed (_reclaim_readbacks), instead of staying pinned until close
        self._readback_busy: list[tuple[weakref.ref, tuple[Allocation, Any]]] = []
        self._events_free: list[Any] = []

    def buffer(self, name: str, kinds: tuple[str, ...] | None = None) -> tuple[Buffer, Allocation]:
        spec = self._manifest.buffers.get(name)
        if spec is None:
            raise ApiError(f"unknown buffer {name!r}")
        if kinds is not None and spec.kind not in kinds:
            raise ApiError(f"buffer {name!r} is {with_article(spec.kind)} buffer, expected {' or '.join(kinds)}")
        return spec, self._buffers[name]

    def write_input(self, name: str, array: np.ndarray) -> None:
        """Copy `array` into input buffer `name` (a prefix of rows is allowed: fewer dim-0 rows than
        the buffer holds at var max; later rows keep their old bytes). The dtype must be the buffer's
        numpy dtype exactly (bf16 / fp8 as uint16 / uint8 bits; a big-endian array is refused): nothing
        is cast. The bytes go into the buffer's resident pinned staging area and are copied on the
        compute stream after the work already enqueued. The call first blocks until the previous
        `write_input` of this buffer has been copied out of that staging area (so until the work enqueued
        before that copy has run); it does not wait for the copy it enqueues, and does not read the error
        words. Raises ApiError (the runtime is closed, `name` is not an input buffer, a dtype,
        trailing-shape or row count mismatch), DriverError."""
        self._activate()
        spec, alloc = self.buffer(name, ("input",))
        array = np.asarray(array)
        want = numpy_dtype(spec.dtype)
        if array.dtype.newbyteorder("<") != want.newbyteorder("<") or array.dtype.byteorder == ">":
            raise ApiError(f"input {name!r} is {spec.dtype} ({want}), got an array of {array.dtype}")
        shape = spec.shape_at(self._max_values)
        if array.ndim == 0 and not shape:
            pass
        elif array.ndim != len(shape) or tuple(array.shape[1:]) != tuple(shape[1:]) or array.shape[0] > shape[0]:
            raise ApiError(f"input {name!r} holds up to {list(shape)}, got an array of shape {list(array.shape)}")
        staging, event = self._input_staging[name]
        call("cuEventSynchronize", event)  # the previous copy out of the staging area is done
        nbytes = array.nbytes
        staging.host_view()[:nbytes] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        if nbytes:
            call("cuMemcpyHtoDAsync", alloc.address, staging.host_address, nbytes, self.stream)
        call("cuEventRecord", event, self.stream)

    def _rows_shape(self, spec: Buffer, rows: int | None, what: str) -> list[int]:
        """The buffer's shape at var max, dim 0 cut to `rows` when given. Raises ApiError naming `what` for
        `rows` not an integer in 0..the buffer's rows."""
        shape = list(spec.shape_at(self._max_values))
        if rows is not None:
            rows = int_arg(rows, f"{what} rows")
            if not shape or not 0 <= rows <= shape[0]:
                raise ApiError(f"{what} has {shape[0] if shape else 0} rows, asked for {rows}")
            shape[0] = rows
        return shape

    def read_buffer(self, name: str, rows: int | None = None) -> np.ndarray:
        """Synchronise the compute stream and copy any buffer into a new array of its numpy dtype, with the
        buffer's shape at var max, or dim 0 cut to `rows` when `rows` is given. bf16 / fp8 come back as raw
        bits (uint16 / uint8). Raises ApiError (the runtime is closed, unknown buffer, `rows` not an integer
        in 0..the buffer's rows), DeviceFaultError (after the synchronisation, when a kernel wrote an error
        word; nothing is returned), DriverError."""
        self._activate()
        spec, alloc = self.buffer(name)
        shape = self._rows_shape(spec, rows, f"buffer {name!r}")
        dtype = numpy_dtype(spec.dtype)
        out = np.empty(shape, dtype=dtype)
        call("cuStreamSynchronize", self.stream)
        self._after_wait()  # a faulted step's outputs are not returned
        if out.nbytes:
            if alloc.host_address:
                out.reshape(-1).view(np.uint8)[:] = alloc.host_view()[: out.nbytes]
            else:
                call("cuMemcpyDtoH", out.ctypes.data, alloc.address, out.nbytes)
        return out

    def read_output(self, name: str, rows: int | None = None) -> np.ndarray:
        """`read_buffer` for an output buffer: synchronises, and returns a new array with the buffer's shape
        at var max, or dim 0 cut to `rows` when `rows` is given. Raises as `read_buffer` (ApiError for any
        other kind of buffer too)."""
        self.buffer(name, ("output",))
        return self.read_buffer(name, rows)

    def read_output_async(self, name: str, rows: int | None = None) -> ReadbackHandle:
        """Enqueue a copy of output `name` into pinned memory after the work already on the compute
        stream; the handle's `wait()` returns the array. Raises ApiError (not an output buffer, `rows`
        not an integer in 0..the buffer's rows) before anything is allocated."""
        self._activate()
        spec, alloc = self.buffer(name, ("output",))
        shape = self._rows_shape(spec, rows, f"output {name!r}")
        dtype = numpy_dtype(spec.dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        self._reclaim_readbacks()
        pair = next((p for p in self._readback_free if p[0].nbytes >= nbytes), None)
        if pair is None:
            staging = self._ledger.pinned(max(nbytes, 8), f"readback {name}")
            event = call("cuEventCreate", 2)
            self._ledger.on_close("readback event", lambda e=event: call("cuEventDestroy", e))
            pair = (staging, event)
        else:
            self._readback_free.remove(pair)
        staging, event = pair
        if nbytes:
            call("cuMemcpyDtoHAsync", staging.host_address, alloc.address, nbytes, self.stream)
        call("cuEventRecord", event, self.stream)
        def done() -> None:  # the handle was waited: its pair is free now
            self._readback_busy.remove(entry)
            self._readback_free.append(pair)

        handle = ReadbackHandle(staging, event, tuple(shape), dtype, nbytes, done, self._after_wait)
        entry = (weakref.ref(handle), pair)  # this readback in _readback_busy (done() reads it when called)
        self._readback_busy.append(entry)
        return handle

    def _reclaim_readbacks(self) -> None:
        """Move the staging of every readback whose handle was dropped unwaited, and whose copy has completed,
        to the free list (a dropped handle's copy may still be running: its buffer is kept until it ends)."""
        for entry in list(self._readback_busy):
            ref, pair = entry
            if ref() is None and event_done(pair[1]):
                self._readback_busy.remove(entry)
                self._readback_free.append(pair)

    def record_event(self) -> EventHandle:
        """Record an event on the compute stream after everything enqueued so far (no synchronisation)."""
        self._activate()
        pool = self._events_free
        if pool:
            event = pool.pop()
        else:
            event = call("cuEventCreate", 2)  # CU_EVENT_DISABLE_TIMING
            self._ledger.on_close("step event", lambda e=event: call("cuEventDestroy", e))
        call("cuEventRecord", event, self.stream)
        return EventHandle(event, lambda: pool.append(event), self._after_wait)

    def host_array(self, name: str) -> np.ndarray:
        """A live view (no copy, no synchronisation) of `placement: host` buffer `name`, with its dtype and
        its shape at var max. Read it only after an event recorded behind the kernels that write it has
        completed. Raises ApiError for an unknown buffer or a device-placed one."""
        self._activate()
        spec, alloc = self.buffer(name)
        if spec.placement != "host" or not alloc.host_address:
            raise ApiError(f"buffer {name!r} is placed on the {spec.placement}; host_array needs placement host")
        shape = tuple(spec.shape_at(self._max_values))
        dtype = numpy_dtype(spec.dtype)
        count = math.prod(shape)
        return alloc.host_view()[: count * dtype.itemsize].view(dtype).reshape(shape)
