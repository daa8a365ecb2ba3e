"""TMA descriptors for pack fields: `cuTensorMapEncodeTiled` over a finished pointer.

A pack's tensormap field (docs/manifest.md, "pack") is JSON: `dtype`, `dims` (elements, innermost
first), `strides` (bytes, dims 1..), `box`, optional `elem_strides`, `interleave`, `swizzle`,
`l2_promotion`, `oob_fill`. Enum fields are integers or names, with or without the driver prefix
(`"128B"`, `"CU_TENSOR_MAP_SWIZZLE_128B"`). `tiled_args` is pure (CPU-tested); `encode_tiled` calls
the driver and returns the 128-byte image.

A fill dim (the outermost dim written as the constant 0, allowed only over a pooled state) is not a
size: `fill_dim` finds it, and `resolve_fill` replaces it, before encoding, by the number of whole
outermost rows in the state's reserved range (records.py does this at compile time), so pages and
slots that later remaps map are addressable through a map encoded once at load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from kern_manifest import DTYPE_BYTES, Expr

from .driver import call, cu
from ..errors import ApiError, ManifestError

TENSORMAP_DTYPES = {
    "u8": "UINT8", "u16": "UINT16", "u32": "UINT32", "i32": "INT32", "u64": "UINT64", "i64": "INT64",
    "f16": "FLOAT16", "f32": "FLOAT32", "f64": "FLOAT64", "bf16": "BFLOAT16", "fp8_e4m3": "UINT8", "fp8_e5m2": "UINT8",
    "i8": "UINT8",
}
ENUM_PREFIX = {
    "interleave": ("CUtensorMapInterleave", "CU_TENSOR_MAP_INTERLEAVE_", "NONE"),
    "swizzle": ("CUtensorMapSwizzle", "CU_TENSOR_MAP_SWIZZLE_", "NONE"),
    "l2_promotion": ("CUtensorMapL2promotion", "CU_TENSOR_MAP_L2_PROMOTION_", "NONE"),
    "oob_fill": ("CUtensorMapFloatOOBfill", "CU_TENSOR_MAP_FLOAT_OOB_FILL_", "NONE"),
}
MAX_TENSORMAP_DIM = 1 << 32  # cuTensorMapEncodeTiled: every globalDim is 1..2^32


@dataclass(frozen=True)
class TiledArgs:
    """Evaluated arguments of cuTensorMapEncodeTiled (enum fields still as names or ints)."""

    dtype: str
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    elem_strides: tuple[int, ...]
    enums: Mapping[str, str | int]


def tiled_args(tm: Mapping[str, Any], values: Mapping[str, int], where: str = "tensormap") -> TiledArgs:
    """Evaluate a tensormap field's expressions. Raises ManifestError for inconsistent ranks, a
    stride that is not a multiple of 16 bytes, or an unknown dtype."""
    dims = tuple(Expr(d).eval(values) for d in tm["dims"])
    strides = tuple(Expr(s).eval(values) for s in tm.get("strides", []))
    box = tuple(int(b) for b in tm["box"])
    elem = tuple(int(e) for e in tm.get("elem_strides") or [1] * len(dims))
    rank = len(dims)
    if not 1 <= rank <= 5 or len(strides) != rank - 1 or len(box) != rank or len(elem) != rank:
        raise ManifestError(f"{where}: rank {rank} needs {rank - 1} strides and {rank} box / elem_strides, "
                            f"got {len(strides)}, {len(box)}, {len(elem)}")
    for j, d in enumerate(dims):
        if d < 1:
            hint = (" (a fill dim: resolve it against the pooled state's reserved range first, resolve_fill)"
                    if d == 0 and j == rank - 1 else "")
            raise ManifestError(f"{where}: dims[{j}] is {d}; a tensor map dim must be >= 1{hint}")
    if any(s % 16 for s in strides):
        raise ManifestError(f"{where}: strides {list(strides)} must be multiples of 16 bytes")
    if tm["dtype"] not in TENSORMAP_DTYPES:
        raise ManifestError(f"{where}: dtype {tm['dtype']!r} has no tensor-map type")
    enums = {k: tm[k] for k in ENUM_PREFIX if tm.get(k) is not None}
    return TiledArgs(tm["dtype"], dims, strides, box, elem, enums)


def fill_dim(tm: Mapping[str, Any]) -> int | None:
    """The index of `tm`'s fill dim: its outermost dim when written as the constant 0 (docs/manifest.md,
    "pack"); None when it has none."""
    dims = tm.get("dims") or []
    if not dims:
        return None
    e = Expr(dims[-1])
    return len(dims) - 1 if e.is_const and e.eval({}) == 0 else None


def resolve_fill(tm: Mapping[str, Any], span_bytes: int, values: Mapping[str, int], where: str = "tensormap",
                 state: str = "the state") -> dict[str, Any]:
    """`tm` with its fill dim replaced by the outermost rows whose bytes lie inside `span_bytes` (the pooled
    state's reserved range from the map's address to its end). Rows start every outermost stride
    (`strides[-1]`; for a rank-1 map, every element); row r covers bytes `[r * stride, r * stride + extent)`,
    `extent` = one element plus `(dims[i] - 1) * stride_i` over the inner dims; rows = the whole strides in
    the span, fewer when rows overlap (extent > stride) so that the last row ends inside it. Raises ApiError when
    the range holds no whole row, or more rows than cuTensorMapEncodeTiled takes (2^32): both depend on the
    capacity the caller loaded with."""
    k = fill_dim(tm)
    if k is None:
        return dict(tm)
    strides = tm.get("strides") or []
    elem = DTYPE_BYTES.get(tm["dtype"])
    if elem is None:
        raise ManifestError(f"{where}: dtype {tm['dtype']!r} has no element size")
    if k > 0:
        if len(strides) != k:
            raise ManifestError(f"{where}: a rank-{k + 1} map needs {k} strides, got {len(strides)}")
        row = Expr(strides[k - 1]).eval(values)
    else:
        row = elem
    if row < 1:
        raise ManifestError(f"{where}: the outermost stride is {row} bytes; it must be >= 1")
    dims = list(tm["dims"])
    extent = elem  # the bytes one outermost row touches, from its start
    for i in range(k):
        extent += (Expr(dims[i]).eval(values) - 1) * (elem if i == 0 else Expr(strides[i - 1]).eval(values))
    # whole strides only (a partial trailing stride is not a row), and the last row's bytes inside the span
    rows = min(span_bytes // row, (span_bytes - extent) // row + 1) if span_bytes >= extent else 0
    if rows < 1:
        raise ApiError(f"{where}: the fill dim spans {span_bytes} bytes of {state}'s reserved range, less than one "
                       f"{row}-byte row; load with a larger capacity")
    if rows > MAX_TENSORMAP_DIM:
        raise ApiError(f"{where}: the fill dim spans {rows} rows of {row} bytes in {state}'s reserved range, more "
                       f"than cuTensorMapEncodeTiled's {MAX_TENSORMAP_DIM}; load with a smaller capacity")
    out = dict(tm)
    out["dims"] = [*list(tm["dims"])[:k], rows]
    return out


def _enum(kind: str, value: str | int | None):
    driver = cu()
    cls_name, prefix, default = ENUM_PREFIX[kind]
    cls = getattr(driver, cls_name)
    if value is None:
        value = default
    if isinstance(value, int):
        return cls(value)
    name = value if value.startswith("CU_") else prefix + value.upper()
    try:
        return getattr(cls, name)
    except AttributeError:
        raise ManifestError(f"tensormap {kind}: unknown value {value!r}") from None


def encode_tiled(address: int, tm: Mapping[str, Any], values: Mapping[str, int]) -> bytes:
    """128-byte CUtensorMap over `address` (cuTensorMapEncodeTiled)."""
    driver = cu()
    a = tiled_args(tm, values)
    dtype = getattr(driver.CUtensorMapDataType, "CU_TENSOR_MAP_DATA_TYPE_" + TENSORMAP_DTYPES[a.dtype])
    tmap = call("cuTensorMapEncodeTiled", dtype, len(a.dims), address, list(a.dims), list(a.strides),
                list(a.box), list(a.elem_strides), _enum("interleave", a.enums.get("interleave")),
                _enum("swizzle", a.enums.get("swizzle")), _enum("l2_promotion", a.enums.get("l2_promotion")),
                _enum("oob_fill", a.enums.get("oob_fill")))
    opaque = list(getattr(tmap, "opaque", []))
    raw = b"".join((int(w) & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little") for w in opaque)
    if len(raw) != 128:
        raise ManifestError("cuTensorMapEncodeTiled gave an unexpected CUtensorMap object")
    return raw
