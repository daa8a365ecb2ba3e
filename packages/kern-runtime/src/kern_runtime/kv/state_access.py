"""Whole-state access for tests and tools (`read_state`, `write_state_at`, `zero_states`): `StateAccess`,
held as `Runtime.states`.

A state is bytes (the manifest gives it no dtype or shape). Its whole extent is, for a fixed state, its
declared `bytes`; for a pooled state (paged, per-seq), the bytes mapped at load from the base of its
reserved range (`PoolLayout.mapped_bytes`: the blocks covering the initial pages or slots, what
`describe()` reports). The spec (runtime.md, state memory) allows whole-state reads and writes only before
the first remap: a remap maps, unmaps and zeroes blocks of a pooled state on a background thread, after
which the state is no longer one mapped run from its base. So each call refuses a pooled state that a
remap plan has touched (`PoolState.remapped`, set when the plan starts); fixed states are never remapped.

Ordering follows the rest of the I/O API: every copy and memset is on the compute stream, after the work
already enqueued there (the host tier's transfer stream is not waited for: `settle()` or `Waking.wait()`
first). Refusals are `ApiError`s raised before anything is enqueued.

"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from kern_manifest import Manifest

from ..cuda.driver import call
from ..errors import ApiError, int_arg


class StateAccess:
    """Read, write and zero whole states (valid only before the first remap). `manifest`: the loaded manifest;
    `states` / `buffers`: name -> allocation; `pooled`: the pooled states' PoolState (None without any), whose
    `remapped` record refuses a remapped state; `stream`: the compute stream; `activate()`: makes the runtime's
    context current, ApiError once it is closed."""

    def __init__(self, manifest: Manifest, states: dict[str, Any], buffers: dict[str, Any], pooled: Any,
                 stream: Any, activate: Callable[[], None]) -> None:
        self._manifest, self._states, self._buffers, self._pooled = manifest, states, buffers, pooled
        self.stream, self._activate = stream, activate

    def _whole_state(self, name: object, what: str) -> tuple[int, int]:
        """(device address, size in bytes) of state `name` for whole-state access `what`.
        Raises ApiError: not a string, unknown, or a pooled state a remap plan has touched."""
        if not isinstance(name, str):
            raise ApiError(f"{what}: a state name must be a string, got {name!r} ({type(name).__name__})")
        spec = self._manifest.states.get(name)
        if spec is None:
            kind = "a buffer, not a state" if name in self._buffers else "not a state"
            raise ApiError(f"{what}: {name!r} is {kind}; states: {sorted(self._manifest.states)}")
        ps = self._pooled
        serial = ps.remapped.get(name) if ps is not None else None
        if serial is not None:
            raise ApiError(f"{what}: state {name!r} ({spec.kind}) was remapped (remap plan {serial}): whole-state "
                           f"reads and writes are valid only before the first remap (runtime.md, state memory); "
                           f"use state_object_address(state, id) for one page or slot")
        size = (spec.bytes or 0) if spec.kind == "fixed" else self._states[name].nbytes
        return self._states[name].address, size

    def read_state(self, name: str) -> np.ndarray:
        """Synchronise the compute stream and copy the whole of state `name` into a new `uint8[size]`
        array (size in bytes: a fixed state's declared `bytes`, a pooled state's bytes mapped at load).
        Raises ApiError: the runtime is closed, `name` is not a state's name, or a remap has touched the
        state."""
        self._activate()
        address, size = self._whole_state(name, "read_state")
        out = np.empty(size, np.uint8)
        call("cuStreamSynchronize", self.stream)
        if size:
            call("cuMemcpyDtoH", out.ctypes.data, address, size)
        return out

    def write_state_at(self, name: str, offset_bytes: int, data: bytes | bytearray | memoryview | np.ndarray) -> None:
        """Copy the bytes of `data` (bytes-like, or a numpy array's C-order bytes) into state `name` at byte
        `offset_bytes`, on the compute stream after the work already enqueued; returns when they have
        landed (synchronises). Bytes outside `[offset_bytes, offset_bytes + len)` keep their value.
        Raises ApiError: the runtime is closed; `name` is not a state's name or a remap has touched it;
        `offset_bytes` is not an integer; `data` is not bytes / bytearray / memoryview / numpy array, or
        is an object or big-endian array; `offset_bytes < 0` or `offset_bytes + len(bytes) > size`."""
        self._activate()
        address, size = self._whole_state(name, "write_state_at")
        offset = int_arg(offset_bytes, f"write_state_at {name!r} offset_bytes")
        raw = _as_bytes(data, f"write_state_at {name!r} data")
        if offset < 0 or offset + raw.nbytes > size:
            raise ApiError(f"write_state_at: {raw.nbytes} bytes at offset {offset} do not fit state {name!r} "
                           f"of {size} bytes")
        if raw.nbytes:
            call("cuMemcpyHtoDAsync", address + offset, raw.ctypes.data, raw.nbytes, self.stream)
            call("cuStreamSynchronize", self.stream)  # `raw` may be a temporary: the copy has read it

    def zero_states(self, names: Iterable[str] | None = None) -> None:
        """Zero every byte of the named states (all states when None), one `cuMemsetD8Async` each on the
        compute stream; does not synchronise. Every name is checked before anything is enqueued.
        Raises ApiError: the runtime is closed; `names` is neither None nor a list / tuple / set of
        strings (a bare string is refused: pass [name]); a name is not a state's; a remap has touched
        a named state (with None: any pooled state)."""
        self._activate()
        if names is None:
            chosen = list(self._manifest.states)
        elif isinstance(names, (list, tuple, set, frozenset)):
            chosen = list(names)
        else:
            raise ApiError(f"zero_states: names must be None or a list / tuple / set of state names, "
                           f"got {type(names).__name__}")
        targets = [self._whole_state(name, "zero_states") for name in chosen]
        for address, size in targets:
            if size:
                call("cuMemsetD8Async", address, 0, size, self.stream)


def _as_bytes(data: object, what: str) -> np.ndarray:
    """`data` as a contiguous `uint8` array of its bytes (C order). Raises ApiError naming `what`."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        array = np.asarray(memoryview(data))
    elif isinstance(data, np.ndarray):
        array = data
    else:
        raise ApiError(f"{what} must be bytes, bytearray, memoryview or a numpy array, got {type(data).__name__}")
    if array.dtype.hasobject:
        raise ApiError(f"{what}: an array of {array.dtype} holds Python objects, not bytes")
    if _big_endian(array.dtype):
        raise ApiError(f"{what}: a big-endian array ({array.dtype}); the device is little-endian, pass "
                       f"array.astype(array.dtype.newbyteorder('<'))")
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _big_endian(dtype: np.dtype) -> bool:
    """Whether any scalar in `dtype` (a structured dtype's fields and sub-arrays included) is big-endian."""
    if dtype.fields:
        return any(_big_endian(field[0]) for field in dtype.fields.values())
    if dtype.subdtype is not None:
        return _big_endian(dtype.subdtype[0])
    return dtype.byteorder == ">"
