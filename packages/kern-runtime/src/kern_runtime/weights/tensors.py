"""The `Tensors` protocol: name -> dtype, shape, and bytes as a `Blob`.

A `Blob` says where a tensor's bytes are, so the loader can pick the copy:

- `HostBlob`: a slice of this process's memory (a 1-D uint8 numpy view),
- `FileBlob`: `nbytes` bytes of file `path` at byte `offset` (read with `os.pread`, never mmap),
- `DeviceBlob`: `nbytes` bytes at a device address readable in the runtime's context.

The runtime ships `SafetensorsTensors` (files) and `HostTensors` (numpy arrays, for tests and
derived sources); caches or object stores implement `Tensors` on the caller's side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol, runtime_checkable

import numpy as np

from ..cuda.dtypes import item_bytes, numpy_dtype
from ..errors import WeightArtifactError


@dataclass(frozen=True)
class TensorMeta:
    """A checkpoint tensor's element type (manifest dtype name, e.g. "bf16") and shape."""

    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * item_bytes(self.dtype)

    @property
    def rows(self) -> int:
        """Size of dim 0 (1 for a scalar)."""
        return self.shape[0] if self.shape else 1

    @property
    def row_bytes(self) -> int:
        """Bytes of one dim-0 row: prod(shape[1:]) x item size."""
        return math.prod(self.shape[1:]) * item_bytes(self.dtype)


@dataclass(frozen=True)
class HostBlob:
    """Bytes in this process's memory. `data`: 1-D uint8 array (a view; not copied)."""

    data: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def slice(self, start: int, stop: int) -> "HostBlob":
        return HostBlob(self.data[start:stop])


@dataclass(frozen=True)
class FileBlob:
    """`nbytes` bytes of file `path` starting at byte `offset`."""

    path: str
    offset: int
    nbytes: int

    def slice(self, start: int, stop: int) -> "FileBlob":
        return FileBlob(self.path, self.offset + start, stop - start)


@dataclass(frozen=True)
class DeviceBlob:
    """`nbytes` bytes at device address `address` (readable in the runtime's context)."""

    address: int
    nbytes: int

    def slice(self, start: int, stop: int) -> "DeviceBlob":
        return DeviceBlob(self.address + start, stop - start)


Blob = HostBlob | FileBlob | DeviceBlob


@runtime_checkable
class Tensors(Protocol):
    """A source of named tensors."""

    def names(self) -> Iterable[str]:
        """Every tensor name."""
        ...

    def meta(self, name: str) -> TensorMeta | None:
        """dtype and shape of `name`, or None when there is no such tensor."""
        ...

    def blob(self, name: str) -> Blob:
        """Where the bytes of `name` are (the whole tensor, `meta(name).nbytes` bytes)."""
        ...


class HostTensors:
    """Tensors held as numpy arrays: `HostTensors({"w": ("bf16", bits_u16_array), "b": ("f32", arr)})`.

    The array's bytes are used as they are (C order); `dtype` names the manifest element type, so
    bf16 data is passed as uint16 bits. Raises WeightArtifactError when the byte size disagrees or an
    array is big-endian (the bytes would load byte-swapped) or of Python objects.
    """

    def __init__(self, arrays: Mapping[str, tuple[str, np.ndarray]]) -> None:
        self._arrays: dict[str, tuple[TensorMeta, np.ndarray]] = {}
        for name, (dtype, array) in arrays.items():
            array = np.ascontiguousarray(array)
            if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and not np.little_endian):
                raise WeightArtifactError(
                    f"tensor {name!r}: array of {array.dtype} is big-endian; the device reads little-endian "
                    f"(convert with array.astype(array.dtype.newbyteorder('<')))"
                )
            if array.dtype.hasobject:
                raise WeightArtifactError(f"tensor {name!r}: array of {array.dtype} holds Python objects, not numbers")
            meta = TensorMeta(dtype, tuple(int(d) for d in array.shape))
            if array.nbytes != meta.nbytes:
                raise WeightArtifactError(
                    f"tensor {name!r}: array of {array.dtype} has {array.nbytes} bytes, {dtype}{list(meta.shape)} needs {meta.nbytes}"
                )
            self._arrays[name] = (meta, array)

    @classmethod
    def from_numpy(cls, arrays: Mapping[str, np.ndarray]) -> "HostTensors":
        """From arrays whose numpy dtype names the element type (f32, i32, ...; no bf16)."""
        by_numpy = {v: k for k, v in reversed(list(_NUMPY_NAMES.items()))}
        out = {}
        for name, array in arrays.items():
            dtype = by_numpy.get(np.dtype(array.dtype).newbyteorder("<"))
            if dtype is None:
                raise WeightArtifactError(f"tensor {name!r}: numpy dtype {array.dtype} has no manifest name")
            out[name] = (dtype, array)
        return cls(out)

    def names(self) -> Iterable[str]:
        return list(self._arrays)

    def meta(self, name: str) -> TensorMeta | None:
        entry = self._arrays.get(name)
        return entry[0] if entry else None

    def blob(self, name: str) -> Blob:
        entry = self._arrays.get(name)
        if entry is None:
            raise WeightArtifactError(f"no tensor {name!r}")
        return HostBlob(entry[1].reshape(-1).view(np.uint8))


_NUMPY_NAMES = {k: numpy_dtype(k) for k in ("f16", "f32", "f64", "i8", "u8", "i16", "i32", "u32", "i64", "u64")}
