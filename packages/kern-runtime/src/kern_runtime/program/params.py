"""Kernel parameter staging: a little-endian block of u64 slots plus the `void**` array pointing at it.

`cuLaunchKernel` takes `kernelParams`, an array of pointers, one per kernel parameter, each pointing
at that parameter's bytes. A `ParamBlock` owns both arrays for one launch, built once at load:
parameter i occupies `cdiv(size_i, 8)` consecutive u64 slots of `slots` and `pointers[i]` holds
their address. Replay writes only the parameters whose value changed (`write`), then passes
`address` (the `void**`) to the driver, which copies the values at launch (so patching the block
after a launch, or after a stream capture, does not affect what was already issued).
"""

from __future__ import annotations

import math
import struct

import numpy as np

from ..errors import ApiError

_SCALAR_FORMATS: dict[str, str] = {"i32": "<i", "u32": "<I", "i64": "<q", "u64": "<Q", "f32": "<f", "f64": "<d"}
INT_RANGES: dict[str, tuple[int, int]] = {
    "i32": (-(2**31), 2**31 - 1), "u32": (0, 2**32 - 1), "i64": (-(2**63), 2**63 - 1), "u64": (0, 2**64 - 1),
}


def encode_scalar(type_name: str, value: int | float) -> bytes:
    """Little-endian bytes of `value` as `type_name` (i32 u32 i64 u64 f32 f64).

    Raises ApiError when an integer does not fit the type (e.g. a var expression overflowing i32).
    """
    fmt = _SCALAR_FORMATS.get(type_name)
    if fmt is None:
        raise ApiError(f"unknown scalar type {type_name!r}; expected one of {sorted(_SCALAR_FORMATS)}")
    if type_name in INT_RANGES:
        lo, hi = INT_RANGES[type_name]
        ivalue = int(value)
        if ivalue != value or not lo <= ivalue <= hi:
            raise ApiError(f"value {value!r} does not fit {type_name} [{lo}, {hi}]")
        return struct.pack(fmt, ivalue)
    return struct.pack(fmt, float(value))


def encode_pointer(address: int) -> bytes:
    """8 little-endian bytes of a device address."""
    if not 0 <= address < 2**64:
        raise ApiError(f"address {address:#x} is not a 64-bit unsigned value")
    return struct.pack("<Q", address)


class ParamBlock:
    """Staged parameters of one kernel launch.

    `sizes`: byte size of each kernel parameter, in order (from the manifest's `params`).
    The block is zero-filled; `write(i, data)` stores parameter i's bytes (len(data) == sizes[i]).
    `address` is the `void**` to pass as `kernelParams` (valid while this object lives).
    """

    __slots__ = ("sizes", "slots", "pointers", "_first_slot")

    def __init__(self, sizes: tuple[int, ...] | list[int]) -> None:
        self.sizes = tuple(int(s) for s in sizes)
        first = []
        total = 0
        for size in self.sizes:
            if size <= 0:
                raise ApiError(f"kernel parameter size {size} is not positive")
            first.append(total)
            total += math.ceil(size / 8)
        self._first_slot = tuple(first)
        self.slots = np.zeros(max(total, 1), dtype="<u8")  # [total] u64, the staged values
        base = self.slots.ctypes.data
        self.pointers = np.array([base + 8 * s for s in first] or [0], dtype="<u8")  # [n] void*

    @property
    def address(self) -> int:
        """Address of the pointer array (`void**`), or 0 for a kernel without parameters."""
        return self.pointers.ctypes.data if self.sizes else 0

    def write(self, index: int, data: bytes) -> None:
        """Store parameter `index`'s bytes. Raises ApiError on a size mismatch (a bug in the wiring)."""
        size = self.sizes[index]
        if len(data) != size:
            raise ApiError(f"parameter {index}: {len(data)} bytes staged, the kernel takes {size}")
        start = 8 * self._first_slot[index]
        self.slots.view(np.uint8)[start : start + size] = np.frombuffer(data, dtype=np.uint8)

    def read(self, index: int) -> bytes:
        """Parameter `index`'s staged bytes (tests, describe)."""
        start = 8 * self._first_slot[index]
        return self.slots.view(np.uint8)[start : start + self.sizes[index]].tobytes()
