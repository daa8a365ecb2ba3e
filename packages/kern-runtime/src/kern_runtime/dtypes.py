"""Element types: manifest names, byte sizes, numpy views and safetensors names.

numpy has no bfloat16 / float8: arrays of those types are exchanged as their raw bits
(`bf16` -> uint16, `fp8_*` -> uint8). Callers convert (e.g. `bits.astype(np.uint32) << 16`
viewed as float32 gives exact bf16 values).
"""

from __future__ import annotations

import numpy as np

from .errors import ApiError

ITEM_BYTES: dict[str, int] = {
    "bf16": 2, "f16": 2, "f32": 4, "f64": 8,
    "i8": 1, "u8": 1, "i16": 2, "i32": 4, "u32": 4, "i64": 8, "u64": 8,
    "fp8_e4m3": 1, "fp8_e5m2": 1,
}

NUMPY_DTYPE: dict[str, np.dtype] = {
    "bf16": np.dtype("<u2"), "f16": np.dtype("<f2"), "f32": np.dtype("<f4"), "f64": np.dtype("<f8"),
    "i8": np.dtype("i1"), "u8": np.dtype("u1"), "i16": np.dtype("<i2"), "i32": np.dtype("<i4"),
    "u32": np.dtype("<u4"), "i64": np.dtype("<i8"), "u64": np.dtype("<u8"),
    "fp8_e4m3": np.dtype("u1"), "fp8_e5m2": np.dtype("u1"),
}

# safetensors header dtype -> manifest dtype name
SAFETENSORS_DTYPE: dict[str, str] = {
    "BF16": "bf16", "F16": "f16", "F32": "f32", "F64": "f64",
    "I8": "i8", "U8": "u8", "I16": "i16", "I32": "i32", "U32": "u32", "I64": "i64", "U64": "u64",
    "F8_E4M3": "fp8_e4m3", "F8_E5M2": "fp8_e5m2", "BOOL": "u8",
}


def item_bytes(dtype: str) -> int:
    """Bytes per element of manifest dtype `dtype`. Raises ApiError for an unknown name."""
    try:
        return ITEM_BYTES[dtype]
    except KeyError:
        raise ApiError(f"unknown dtype {dtype!r}; expected one of {sorted(ITEM_BYTES)}") from None


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype arrays of manifest dtype `dtype` are exchanged as (raw bits for bf16/fp8)."""
    try:
        return NUMPY_DTYPE[dtype]
    except KeyError:
        raise ApiError(f"unknown dtype {dtype!r}; expected one of {sorted(NUMPY_DTYPE)}") from None
