"""Element types: the numpy views and safetensors names of kern_manifest's dtypes.

The byte sizes are kern_manifest's one table (`DTYPE_BYTES`); this module adds only what the runtime
exchanges arrays as.

numpy has no bfloat16 / float8: arrays of those types are exchanged as their raw bits
(`bf16` -> uint16, `fp8_*` -> uint8). Callers convert (e.g. `bits.astype(np.uint32) << 16`
viewed as float32 gives exact bf16 values).
"""

from __future__ import annotations

import numpy as np
from kern_manifest import DTYPE_BYTES

from ..errors import ApiError

NUMPY_DTYPE: dict[str, np.dtype] = {
    "bf16": np.dtype("<u2"), "f16": np.dtype("<f2"), "f32": np.dtype("<f4"), "f64": np.dtype("<f8"),
    "i8": np.dtype("i1"), "u8": np.dtype("u1"), "i16": np.dtype("<i2"), "i32": np.dtype("<i4"),
    "u32": np.dtype("<u4"), "i64": np.dtype("<i8"), "u64": np.dtype("<u8"),
    "fp8_e4m3": np.dtype("u1"), "fp8_e5m2": np.dtype("u1"),
}
assert set(NUMPY_DTYPE) == set(DTYPE_BYTES), "kern bug: a manifest dtype without a numpy view"
assert all(NUMPY_DTYPE[d].itemsize == n for d, n in DTYPE_BYTES.items()), "kern bug: numpy view of another size"

# safetensors header dtype -> manifest dtype name
SAFETENSORS_DTYPE: dict[str, str] = {
    "BF16": "bf16", "F16": "f16", "F32": "f32", "F64": "f64",
    "I8": "i8", "U8": "u8", "I16": "i16", "I32": "i32", "U32": "u32", "I64": "i64", "U64": "u64",
    "F8_E4M3": "fp8_e4m3", "F8_E5M2": "fp8_e5m2", "BOOL": "u8",
}


def item_bytes(dtype: str) -> int:
    """Bytes per element of manifest dtype `dtype`. Raises ApiError for an unknown name."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ApiError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPE_BYTES)}") from None


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype arrays of manifest dtype `dtype` are exchanged as (raw bits for bf16/fp8)."""
    try:
        return NUMPY_DTYPE[dtype]
    except KeyError:
        raise ApiError(f"unknown dtype {dtype!r}; expected one of {sorted(NUMPY_DTYPE)}") from None
