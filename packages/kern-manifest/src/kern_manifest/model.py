"""The manifest as typed, frozen dataclasses (docs/manifest.md is the format; this mirrors it).

Every object keeps what it was written with: optional keys that were given explicitly are recorded in
`explicit` (not part of equality) so `to_json()` writes them back even at their default, and keys the
format does not know are kept in `extra` (the verifier rejects them). Thus `to_json()` reproduces the
parsed JSON value, and `Manifest.digest` equals the digest a generator computes over what it wrote.
Mappings are `FrozenMap` (insertion-ordered, hashable), lists are tuples.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from .errors import ManifestError
from .expr import Expr
from .frozen import FrozenMap, canonical_json, thaw

FORMAT = "kern-manifest/1"

DTYPE_BYTES: Mapping[str, int] = FrozenMap({
    "bf16": 2, "f16": 2, "f32": 4, "f64": 8,
    "i8": 1, "u8": 1, "i16": 2, "i32": 4, "u32": 4, "i64": 8, "u64": 8,
    "fp8_e4m3": 1, "fp8_e5m2": 1,
})  # fmt: skip

# Scalar encodings of wirings: name -> (bytes, lowest value, highest value); floats have no bounds.
INT_ENCODINGS: Mapping[str, tuple[int, int, int]] = FrozenMap({
    "i32": (4, -(2**31), 2**31 - 1), "u32": (4, 0, 2**32 - 1),
    "i64": (8, -(2**63), 2**63 - 1), "u64": (8, 0, 2**64 - 1),
})  # fmt: skip
FLOAT_ENCODINGS: Mapping[str, int] = FrozenMap({"f32": 4, "f64": 8})
POINTER_BYTES = 8
TENSORMAP_BYTES = 128

BUFFER_KINDS = ("input", "output", "workspace", "weight", "scratch")
PLACEMENTS = ("device", "host")
STATE_KINDS = ("fixed", "paged", "per_seq")
ARG_KINDS = ("ptr", "int")
PROGRAM_KINDS = ("run", "once", "derive")


def family_digest_of(obj: Mapping[str, Any]) -> str:
    """`Manifest.family_digest` of a manifest JSON object (the runtime computes it from raw JSON)."""
    body = {k: v for k, v in obj.items() if k not in ("digest", "name", "meta")}
    body["buffers"] = {n: {k: v for k, v in b.items() if k != "bind"} for n, b in obj.get("buffers", {}).items()}
    return hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()


def dtype_size(dtype: str) -> int:
    """Bytes per element of a manifest dtype (`bf16` -> 2). Raises `ManifestError` for an unknown dtype."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ManifestError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}") from None


def encoding_size(encoding: str) -> int:
    """Bytes of a scalar encoding (`i32` -> 4, `f64` -> 8). Raises `ManifestError` when unknown."""
    if encoding in INT_ENCODINGS:
        return INT_ENCODINGS[encoding][0]
    if encoding in FLOAT_ENCODINGS:
        return FLOAT_ENCODINGS[encoding]
    raise ManifestError(f"unknown encoding {encoding!r}; known: i32 u32 i64 u64 f32 f64")


def var_max(vars: Mapping[str, "Var"]) -> dict[str, int]:
    """Every var at its max: the values buffers and scratch are allocated at."""
    return {name: var.max for name, var in vars.items()}


def var_min(vars: Mapping[str, "Var"]) -> dict[str, int]:
    """Every var at its min: the values a graph capture normalises unread vars to."""
    return {name: var.min for name, var in vars.items()}


def _put(out: dict[str, Any], key: str, value: Any, default: Any, explicit: frozenset[str], conv: Any = None) -> None:
    """Write an optional key when it was given explicitly or differs from its default."""
    if key in explicit or value != default:
        out[key] = conv(value) if conv is not None and value is not None else value


def _exprs(values: tuple[Expr, ...]) -> list[int | str]:
    return [e.json for e in values]


def _present(out: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """Add the optional `fields` that are set (not None), in the order given; returns `out`."""
    out.update((key, value) for key, value in fields.items() if value is not None)
    return out


def _json(expr: Expr | None) -> int | str | None:
    return None if expr is None else expr.json


def _list(values: tuple[Any, ...] | None) -> list[Any] | None:
    return None if values is None else list(values)


def _with_extra(out: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        out[key] = thaw(value)
    return out


_EMPTY: FrozenMap[str, Any] = FrozenMap()
_NONE: frozenset[str] = frozenset()


def _extra() -> Any:
    return field(default=_EMPTY)


def _explicit() -> Any:
    return field(default=_NONE, compare=False, repr=False)


# ---------------------------------------------------------------------------------------------- vars


@dataclass(frozen=True, kw_only=True)
class Var:
    """A named integer range `[min, max]`; the caller gives its value per run."""

    name: str
    min: int
    max: int
    extra: FrozenMap[str, Any] = _extra()

    def to_json(self) -> dict[str, Any]:
        return _with_extra({"min": self.min, "max": self.max}, self.extra)


@dataclass(frozen=True, kw_only=True)
class Module:
    """A pinned cubin: `sha256` (64 lowercase hex) of `<kernels_dir>/<name>-<sha12>.cubin`."""

    name: str
    sha256: str

    @property
    def cubin_filename(self) -> str:
        """The file name the runtime loads: `<module>-<first 12 hex of sha256>.cubin`."""
        return f"{self.name}-{self.sha256[:12]}.cubin"

    def to_json(self) -> str:
        return self.sha256


# ------------------------------------------------------------------------------------------- buffers


@dataclass(frozen=True, kw_only=True)
class TensorSegment:
    """A whole checkpoint tensor. `shape` (optional) declares the tensor's shape so the verifier can
    prove the tiling; the runtime checks it against the checkpoint."""

    tensor: str
    shape: tuple[int, ...] | None = None
    cols: tuple[int, int] | None = None  # column range [start, stop) of dim 1 (tensor-parallel slices)
    extra: FrozenMap[str, Any] = _extra()

    def known_rows(self) -> int | None:
        """Rows of the buffer this segment fills, or None when only the checkpoint knows."""
        return self.shape[0] if self.shape else None

    def to_json(self) -> dict[str, Any]:
        return _with_extra(_present({"tensor": self.tensor}, cols=_list(self.cols), shape=_list(self.shape)), self.extra)


@dataclass(frozen=True, kw_only=True)
class RowsSegment:
    """Rows `[start, stop)` (dim 0) of a checkpoint tensor; fills `stop - start` rows."""

    tensor: str
    start: int
    stop: int
    shape: tuple[int, ...] | None = None
    cols: tuple[int, int] | None = None  # column range [start, stop) of dim 1 (tensor-parallel slices)
    extra: FrozenMap[str, Any] = _extra()

    def known_rows(self) -> int:
        return self.stop - self.start

    def to_json(self) -> dict[str, Any]:
        out = {"tensor": self.tensor, "rows": [self.start, self.stop]}
        return _with_extra(_present(out, cols=_list(self.cols), shape=_list(self.shape)), self.extra)


@dataclass(frozen=True, kw_only=True)
class InterleaveSegment:
    """Blocks of `rows` rows taken from each tensor in turn until all are exhausted; fills
    `rows_of_each * len(tensors)` rows. `shape` (optional) is the shape every tensor has."""

    tensors: tuple[str, ...]
    rows: int
    shape: tuple[int, ...] | None = None
    extra: FrozenMap[str, Any] = _extra()

    def known_rows(self) -> int | None:
        return self.shape[0] * len(self.tensors) if self.shape else None

    def to_json(self) -> dict[str, Any]:
        out = {"interleave": list(self.tensors), "rows": self.rows}
        return _with_extra(_present(out, shape=_list(self.shape)), self.extra)


@dataclass(frozen=True, kw_only=True)
class DerivedSegment:
    """The whole buffer is filled by a program (`once` or `derive`), not from the checkpoint."""

    derived: bool = True
    extra: FrozenMap[str, Any] = _extra()

    def known_rows(self) -> None:
        return None

    def to_json(self) -> dict[str, Any]:
        return _with_extra({"derived": self.derived}, self.extra)


Segment = Union[TensorSegment, RowsSegment, InterleaveSegment, DerivedSegment]


@dataclass(frozen=True, kw_only=True)
class PeersOf:
    """A buffer that is the peer table of export buffer (or state) `of` for topology group `group`:
    `u64[group size]`, entry i = the address, mapped into this rank, of member i's `of`. Filled by the
    runtime's multi-GPU connect; a program run before that is refused."""

    of: str
    group: str
    extra: FrozenMap[str, Any] = _extra()

    def to_json(self) -> dict[str, Any]:
        return _with_extra({"of": self.of, "group": self.group}, self.extra)


@dataclass(frozen=True, kw_only=True)
class ErrorWord:
    """A buffer's `error` key: the buffer is an **error word**, `u32[n]` in pinned host memory that kernels write a
    nonzero code into (word 0; words 1.. carry detail) when they give up, e.g. on a bounded wait that timed out.
    The runtime reads word 0 wherever the host learns that work finished (an event or readback waited, a
    synchronise) and raises a typed error naming the code and the programs that pass the buffer. `codes`: decimal
    code (1 .. 2^32-1) -> what it means, shown in that error."""

    codes: FrozenMap[str, str] | None = None  # None: the key was not written
    extra: FrozenMap[str, Any] = _extra()

    def meaning(self, code: int) -> str | None:
        """The description of `code`, or None when the manifest gives none."""
        return None if self.codes is None else self.codes.get(str(code))

    def to_json(self) -> dict[str, Any]:
        codes = None if self.codes is None else dict(self.codes)
        return _with_extra(_present({}, codes=codes), self.extra)


@dataclass(frozen=True, kw_only=True)
class BufferInit:
    """A buffer's `init` key: its whole contents, written by the runtime at load before any program runs (a
    device-resident table: a persistent kernel's instruction table). `base64`: the bytes, RFC 4648 base64 with
    padding; they must be exactly the buffer's byte size."""

    base64: str
    extra: FrozenMap[str, Any] = _extra()

    def data(self) -> bytes:
        """The decoded bytes. Raises ManifestError for text that is not strict base64."""
        import base64
        import binascii

        try:
            return base64.b64decode(self.base64.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
            raise ManifestError(f"init.base64 is not base64 text: {exc}") from None

    def to_json(self) -> dict[str, Any]:
        return _with_extra({"base64": self.base64}, self.extra)


@dataclass(frozen=True, kw_only=True)
class Buffer:
    """Device or host memory of a fixed byte size (its shape at var max x dtype size)."""

    name: str
    kind: str  # input | output | workspace | weight | scratch
    dtype: str
    shape: tuple[Expr, ...]
    placement: str = "device"  # device | host
    export: bool = False
    bind: tuple[Segment, ...] | None = None  # weight buffers only
    peers: PeersOf | None = None  # this buffer is a peer table (multi-GPU)
    zero_each_run: bool = False  # zeroed at the start of every run of a program that passes it
    error: ErrorWord | None = None  # this buffer is an error word the runtime checks
    init: BufferInit | None = None  # contents written at load
    extra: FrozenMap[str, Any] = _extra()
    explicit: frozenset[str] = _explicit()

    def shape_at(self, values: Mapping[str, int]) -> tuple[int, ...]:
        """The shape with the given var values (raises `ExprError` when one is missing)."""
        return tuple(dim.eval(values) for dim in self.shape)

    def nbytes_at(self, values: Mapping[str, int]) -> int:
        """Bytes of the buffer with the given var values: product of `shape_at(values)` times the dtype size
        (raises `ExprError` when a var is missing, `ManifestError` for an unknown dtype)."""
        return math.prod(self.shape_at(values)) * dtype_size(self.dtype)

    def nbytes_at_max(self, vars: Mapping[str, Var]) -> int:
        """Bytes allocated: product of the shape with every var at its max, times the dtype size."""
        return self.nbytes_at(var_max(vars))

    @property
    def derived(self) -> bool:
        """Filled by a program (`once` / `derive`), not from the checkpoint: a bind with a derived segment."""
        return self.bind is not None and any(isinstance(s, DerivedSegment) for s in self.bind)

    def row_elems_at_max(self, vars: Mapping[str, Var]) -> int:
        """Elements per row (product of `shape[1:]`) with every var at its max."""
        return math.prod(self.shape_at(var_max(vars))[1:])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "dtype": self.dtype, "shape": _exprs(self.shape)}
        _put(out, "placement", self.placement, "device", self.explicit)
        _put(out, "export", self.export, False, self.explicit)
        _put(out, "zero_each_run", self.zero_each_run, False, self.explicit)
        bind = None if self.bind is None else [seg.to_json() for seg in self.bind]
        peers = None if self.peers is None else self.peers.to_json()
        error = None if self.error is None else self.error.to_json()
        init = None if self.init is None else self.init.to_json()
        return _with_extra(_present(out, bind=bind, peers=peers, error=error, init=init), self.extra)


# -------------------------------------------------------------------------------------------- states


@dataclass(frozen=True, kw_only=True)
class State:
    """`fixed` (`bytes`), `paged` (`bytes_per_token`, `page_tokens`) or `per_seq` (`bytes_per_seq`).
    Fields that do not belong to the kind are None."""

    name: str
    kind: str
    bytes: int | None = None
    bytes_per_token: int | None = None
    page_tokens: int | None = None
    bytes_per_seq: int | None = None
    extra: FrozenMap[str, Any] = _extra()

    @property
    def pooled(self) -> bool:
        """Paged and per-seq states live in the pool (kern-pool); fixed ones are one allocation."""
        return self.kind in ("paged", "per_seq")

    @property
    def page_bytes(self) -> int | None:
        """Bytes of one page of a paged state (`page_tokens * bytes_per_token`), else None."""
        if self.bytes_per_token is None or self.page_tokens is None:
            return None
        return self.bytes_per_token * self.page_tokens

    def to_json(self) -> dict[str, Any]:
        out = _present({"kind": self.kind}, bytes=self.bytes, bytes_per_token=self.bytes_per_token,
                       page_tokens=self.page_tokens, bytes_per_seq=self.bytes_per_seq)
        return _with_extra(out, self.extra)


# ---------------------------------------------------------------------------------------------- ops


@dataclass(frozen=True, kw_only=True)
class OpArg:
    """An interface argument: `ptr` (buffer or state, optionally + byte offset) or `int` (expression)."""

    name: str
    kind: str
    extra: FrozenMap[str, Any] = _extra()

    def to_json(self) -> dict[str, Any]:
        return _with_extra({"name": self.name, "kind": self.kind}, self.extra)


@dataclass(frozen=True, kw_only=True)
class ArgWiring:
    """Forward interface argument `arg`: a pointer (+ `offset` bytes) when `type` is None, else an int
    encoded as `type` (i32/u32/i64/u64)."""

    arg: str
    offset: Expr | None = None
    type: str | None = None
    extra: FrozenMap[str, Any] = _extra()

    @property
    def nbytes(self) -> int | None:
        return POINTER_BYTES if self.type is None else INT_ENCODINGS.get(self.type, (None,))[0]

    def vars_read(self) -> frozenset[str]:
        return self.offset.vars if self.offset is not None else frozenset()

    def to_json(self) -> dict[str, Any]:
        return _with_extra(_present({"arg": self.arg}, offset=_json(self.offset), type=self.type), self.extra)


@dataclass(frozen=True, kw_only=True)
class ScratchWiring:
    """Pointer to this op's scratch `scratch` (+ `offset` bytes)."""

    scratch: str
    offset: Expr | None = None
    extra: FrozenMap[str, Any] = _extra()

    nbytes = POINTER_BYTES

    def vars_read(self) -> frozenset[str]:
        return self.offset.vars if self.offset is not None else frozenset()

    def to_json(self) -> dict[str, Any]:
        return _with_extra(_present({"scratch": self.scratch}, offset=_json(self.offset)), self.extra)


@dataclass(frozen=True, kw_only=True)
class LiteralWiring:
    """A literal `value` encoded as `type` (i32 u32 i64 u64 f32 f64)."""

    type: str
    value: int | float
    extra: FrozenMap[str, Any] = _extra()

    @property
    def nbytes(self) -> int:
        return encoding_size(self.type)

    def vars_read(self) -> frozenset[str]:
        return frozenset()

    def to_json(self) -> dict[str, Any]:
        return _with_extra({self.type: self.value}, self.extra)


@dataclass(frozen=True, kw_only=True)
class ExprWiring:
    """An integer expression over vars, evaluated per run, encoded as `type`."""

    expr: Expr
    type: str | None = None
    extra: FrozenMap[str, Any] = _extra()

    @property
    def nbytes(self) -> int | None:
        return None if self.type is None else INT_ENCODINGS.get(self.type, (None,))[0]

    def vars_read(self) -> frozenset[str]:
        return self.expr.vars

    def to_json(self) -> dict[str, Any]:
        return _with_extra(_present({"expr": self.expr.json}, type=self.type), self.extra)


@dataclass(frozen=True, kw_only=True)
class RankWiring:
    """This process's index in topology group `rank`, burned in at load, encoded as `type`."""

    rank: str
    type: str | None = None
    extra: FrozenMap[str, Any] = _extra()

    @property
    def nbytes(self) -> int | None:
        return None if self.type is None else INT_ENCODINGS.get(self.type, (None,))[0]

    def vars_read(self) -> frozenset[str]:
        return frozenset()

    def to_json(self) -> dict[str, Any]:
        return _with_extra(_present({"rank": self.rank}, type=self.type), self.extra)


@dataclass(frozen=True, kw_only=True)
class NullWiring:
    """`nbytes` zero bytes (a null pointer when 8)."""

    nbytes: int
    extra: FrozenMap[str, Any] = _extra()

    def vars_read(self) -> frozenset[str]:
        return frozenset()

    def to_json(self) -> dict[str, Any]:
        return _with_extra({"null": self.nbytes}, self.extra)


@dataclass(frozen=True, kw_only=True)
class TensorMap:
    """A `CUtensorMap` encoded at load with `cuTensorMapEncodeTiled` over pointer argument `arg`
    (+ `offset` bytes). `dims` (elements, innermost first as the driver wants them), `strides` (bytes,
    `len(dims) - 1` of them: dims 1..), `box` and `elem_strides` (`len(dims)` each); the enum fields
    are passed through to the runtime as written. The outermost dim may be the constant 0, a fill dim:
    the map spans the reserved range of the pooled state the call passes (resolved by the runtime)."""

    arg: str
    dtype: str
    dims: tuple[Expr, ...]
    strides: tuple[Expr, ...]
    box: tuple[int, ...]
    offset: Expr | None = None
    elem_strides: tuple[int, ...] | None = None
    interleave: str | int | None = None
    swizzle: str | int | None = None
    l2_promotion: str | int | None = None
    oob_fill: str | int | None = None
    extra: FrozenMap[str, Any] = _extra()

    def vars_read(self) -> frozenset[str]:
        out: set[str] = set()
        for e in (*self.dims, *self.strides, *([self.offset] if self.offset is not None else [])):
            out |= e.vars
        return frozenset(out)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"arg": self.arg, "dtype": self.dtype, "dims": _exprs(self.dims),
                               "strides": _exprs(self.strides), "box": list(self.box)}
        _present(out, offset=_json(self.offset), elem_strides=_list(self.elem_strides), interleave=self.interleave,
                 swizzle=self.swizzle, l2_promotion=self.l2_promotion, oob_fill=self.oob_fill)
        return _with_extra(out, self.extra)


@dataclass(frozen=True, kw_only=True)
class PackTensorMapField:
    """A 128-byte tensor map at byte `offset` of the pack."""

    offset: int
    tensormap: TensorMap
    extra: FrozenMap[str, Any] = _extra()

    nbytes = TENSORMAP_BYTES

    def vars_read(self) -> frozenset[str]:
        return self.tensormap.vars_read()

    def to_json(self) -> dict[str, Any]:
        return _with_extra({"offset": self.offset, "tensormap": self.tensormap.to_json()}, self.extra)


@dataclass(frozen=True, kw_only=True)
class PackPointerField:
    """Pointer argument `arg` (8 bytes) at byte `offset` of the pack."""

    offset: int
    arg: str
    extra: FrozenMap[str, Any] = _extra()

    nbytes = POINTER_BYTES

    def vars_read(self) -> frozenset[str]:
        return frozenset()

    def to_json(self) -> dict[str, Any]:
        return _with_extra({"offset": self.offset, "arg": self.arg}, self.extra)


@dataclass(frozen=True, kw_only=True)
class PackLiteralField:
    """A literal encoded as `type` at byte `offset` of the pack."""

    offset: int
    type: str
    value: int | float
    extra: FrozenMap[str, Any] = _extra()

    @property
    def nbytes(self) -> int:
        return encoding_size(self.type)

    def vars_read(self) -> frozenset[str]:
        return frozenset()

    def to_json(self) -> dict[str, Any]:
        return _with_extra({"offset": self.offset, self.type: self.value}, self.extra)


PackField = Union[PackTensorMapField, PackPointerField, PackLiteralField]


@dataclass(frozen=True, kw_only=True)
class PackWiring:
    """`size` bytes assembled at load from `fields` (zero elsewhere)."""

    size: int
    fields: tuple[PackField, ...]
    extra: FrozenMap[str, Any] = _extra()  # keys beside "pack"
    pack_extra: FrozenMap[str, Any] = _extra()  # keys inside "pack" beside size/fields

    @property
    def nbytes(self) -> int:
        return self.size

    def vars_read(self) -> frozenset[str]:
        out: frozenset[str] = frozenset()
        for f in self.fields:
            out |= f.vars_read()
        return out

    def to_json(self) -> dict[str, Any]:
        inner = _with_extra({"size": self.size, "fields": [f.to_json() for f in self.fields]}, self.pack_extra)
        return _with_extra({"pack": inner}, self.extra)


Wiring = Union[ArgWiring, ScratchWiring, LiteralWiring, ExprWiring, RankWiring, NullWiring, PackWiring]


def _when_json(when: FrozenMap[str, tuple[Expr, Expr]]) -> dict[str, Any]:
    return {var: [lo.json, hi.json] for var, (lo, hi) in when.items()}


def _when_vars(when: FrozenMap[str, tuple[Expr, Expr]] | None) -> frozenset[str]:
    if when is None:
        return frozenset()
    out = set(when)
    for lo, hi in when.values():
        out |= lo.vars | hi.vars
    return frozenset(out)


def wiring_args_used(wiring: Wiring) -> frozenset[str]:
    """Interface argument names a wiring forwards (directly or inside a pack)."""
    if isinstance(wiring, ArgWiring):
        return frozenset((wiring.arg,))
    if isinstance(wiring, PackWiring):
        names = set()
        for f in wiring.fields:
            if isinstance(f, PackPointerField):
                names.add(f.arg)
            elif isinstance(f, PackTensorMapField):
                names.add(f.tensormap.arg)
        return frozenset(names)
    return frozenset()


@dataclass(frozen=True, kw_only=True)
class Launch:
    """One kernel launch: `entry` of pinned `module`, its geometry, ABI (`params`: `(offset, size)`
    bytes per parameter) and one wiring per parameter. `when` (var -> (lo, hi)) restricts it.
    `carveout` (percent 0..100, None = not set) is the function's preferred shared-memory carveout: a
    property of the function, so every launch of one (module, entry) that gives it gives the same.
    `cooperative`: launched with CU_LAUNCH_ATTRIBUTE_COOPERATIVE, every block co-resident (a persistent kernel
    whose blocks wait on each other); the runtime checks at load that the grid fits the device."""

    module: str
    entry: str
    grid: tuple[Expr, ...]
    block: tuple[Expr, ...]
    params: tuple[tuple[int, int], ...]
    args: tuple[Wiring, ...]
    shared_mem: Expr = Expr(0)
    cluster: tuple[Expr, ...] | None = None
    pdl: bool = False
    cooperative: bool = False
    carveout: int | None = None
    when: FrozenMap[str, tuple[Expr, Expr]] | None = None
    extra: FrozenMap[str, Any] = _extra()
    explicit: frozenset[str] = _explicit()

    @property
    def vars_read(self) -> frozenset[str]:
        """Vars this launch reads: grid, block, shared_mem, cluster, wirings (offsets, expressions,
        pack fields) and the vars its `when` selects on. Vars reaching it through forwarded `int`
        arguments come from the call: see `Program.vars_read`."""
        out: set[str] = set()
        for e in (*self.grid, *self.block, self.shared_mem, *(self.cluster or ())):
            out |= e.vars
        for w in self.args:
            out |= w.vars_read()
        return frozenset(out) | _when_vars(self.when)

    @property
    def args_used(self) -> frozenset[str]:
        out: frozenset[str] = frozenset()
        for w in self.args:
            out |= wiring_args_used(w)
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"module": self.module, "entry": self.entry,
                               "grid": _exprs(self.grid), "block": _exprs(self.block)}
        _put(out, "shared_mem", self.shared_mem, Expr(0), self.explicit, lambda e: e.json)
        _present(out, cluster=None if self.cluster is None else _exprs(self.cluster))
        _put(out, "pdl", self.pdl, False, self.explicit)
        _put(out, "cooperative", self.cooperative, False, self.explicit)
        _present(out, carveout=self.carveout)
        out["params"] = [[o, s] for o, s in self.params]
        out["args"] = [w.to_json() for w in self.args]
        when = None if self.when is None else _when_json(self.when)
        return _with_extra(_present(out, when=when), self.extra)


ALGO_KEYS = ("id", "tile", "stages", "split_k", "reduction", "swizzle", "custom", "inner_shape", "cluster_shape")


@dataclass(frozen=True, kw_only=True)
class Algo:
    """A pinned cuBLASLt algorithm: `cublasLtMatmulAlgoConfigAttributes_t` values; None = not set."""

    id: int
    tile: int | None = None
    stages: int | None = None
    split_k: int | None = None
    reduction: int | None = None
    swizzle: int | None = None
    custom: int | None = None
    inner_shape: int | None = None
    cluster_shape: int | None = None
    extra: FrozenMap[str, Any] = _extra()

    def to_json(self) -> dict[str, Any]:
        return _with_extra(_present({}, **{k: getattr(self, k) for k in ALGO_KEYS}), self.extra)


# extern name -> (required positional kinds, optional trailing kinds); "p" pointer, "i" integer,
# "r" rank wiring.
EXTERNS: Mapping[str, tuple[str, str]] = FrozenMap({
    "cublaslt_bf16_tn": ("pppiii", "ii"),
    "cublaslt_bf16_tn_acc": ("pppiii", "ii"),
    "cublas_bf16_tn_f32": ("pppiii", "i"),
    "cublaslt_fp8_tn": ("pppppiii", "i"),
    "cublaslt_fp8_tn_f32": ("pppppiii", "i"),
    **{f"nccl_{c}_{t}": ("ppir", "") for c in ("allreduce", "allgather", "reducescatter", "alltoall")
       for t in ("f32", "bf16")},
})  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ExternLaunch:
    """A call into an op built into the runtime (cuBLASLt, cuBLAS, NCCL); `extern` as written (the
    `extern:` prefix is accepted), `name` without it."""

    extern: str
    args: tuple[Wiring, ...]
    algo: Algo | None = None
    when: FrozenMap[str, tuple[Expr, Expr]] | None = None
    extra: FrozenMap[str, Any] = _extra()

    @property
    def name(self) -> str:
        return self.extern.removeprefix("extern:")

    @property
    def vars_read(self) -> frozenset[str]:
        """Vars its wirings and `when` read (see `Launch.vars_read`)."""
        out: frozenset[str] = frozenset()
        for w in self.args:
            out |= w.vars_read()
        return out | _when_vars(self.when)

    @property
    def args_used(self) -> frozenset[str]:
        out: frozenset[str] = frozenset()
        for w in self.args:
            out |= wiring_args_used(w)
        return out

    def to_json(self) -> dict[str, Any]:
        out = {"extern": self.extern, "args": [w.to_json() for w in self.args]}
        algo = None if self.algo is None else self.algo.to_json()
        when = None if self.when is None else _when_json(self.when)
        return _with_extra(_present(out, algo=algo, when=when), self.extra)


AnyLaunch = Union[Launch, ExternLaunch]


@dataclass(frozen=True, kw_only=True)
class Op:
    """An interface (`args`, ordered) plus its implementation (`launches`, in order) and private
    `scratch` (name -> byte-size expression, allocated once at var max)."""

    name: str
    args: tuple[OpArg, ...]
    launches: tuple[AnyLaunch, ...]
    scratch: FrozenMap[str, Expr] = field(default=FrozenMap())
    extra: FrozenMap[str, Any] = _extra()
    explicit: frozenset[str] = _explicit()

    def arg(self, name: str) -> OpArg | None:
        """The interface argument called `name`, or None."""
        for a in self.args:
            if a.name == name:
                return a
        return None

    @property
    def vars_read(self) -> frozenset[str]:
        """Union of its launches' `vars_read`."""
        out: frozenset[str] = frozenset()
        for launch in self.launches:
            out |= launch.vars_read
        return out

    @property
    def args_used(self) -> frozenset[str]:
        """Interface arguments some launch forwards."""
        out: frozenset[str] = frozenset()
        for launch in self.launches:
            out |= launch.args_used
        return out

    def scratch_nbytes_at_max(self, vars: Mapping[str, Var]) -> dict[str, int]:
        """Bytes of every scratch with each var at its max."""
        at_max = var_max(vars)
        return {name: e.eval(at_max) for name, e in self.scratch.items()}

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"args": [a.to_json() for a in self.args]}
        _put(out, "scratch", self.scratch, FrozenMap(), self.explicit, lambda s: {k: e.json for k, e in s.items()})
        out["launches"] = [launch.to_json() for launch in self.launches]
        return _with_extra(out, self.extra)


# ------------------------------------------------------------------------------------------ programs


@dataclass(frozen=True, kw_only=True)
class Ref:
    """A `ptr` call argument: buffer or state `name` plus `offset` bytes. `form` records how it was
    written: `"name"` (a bare string), `"buffer"` (`{"buffer": .., "offset": ..}`) or `"state"`."""

    name: str
    offset: Expr | None = None
    form: str = "name"
    extra: FrozenMap[str, Any] = _extra()

    def to_json(self) -> Any:
        if self.form == "name":
            return self.name
        return _with_extra(_present({self.form: self.name}, offset=_json(self.offset)), self.extra)


@dataclass(frozen=True, kw_only=True)
class PagesOf:
    """An `int` call argument `{"pages_of": state}`: the number of pages in paged state `state`'s
    reserved virtual range. Only the runtime knows it (the range is sized at load from the caller's
    capacity), so it is a constant resolved once at load: it reads no var and never enters a graph key.
    Kernels take it as the bound of the page ids they read from block tables."""

    state: str
    extra: FrozenMap[str, Any] = _extra()

    @property
    def vars(self) -> frozenset[str]:
        """No vars: the value is fixed when the runtime loads."""
        return frozenset()

    def to_json(self) -> dict[str, Any]:
        return _with_extra({"pages_of": self.state}, self.extra)


IntValue = Union[Expr, PagesOf]
CallArg = Union[Ref, Expr, PagesOf]


@dataclass(frozen=True, kw_only=True)
class Call:
    """A call of op `op`; `args` maps every interface argument: `Ref` for `ptr`, `Expr` or `PagesOf`
    for `int`."""

    op: str
    args: FrozenMap[str, CallArg]
    extra: FrozenMap[str, Any] = _extra()

    def to_json(self) -> dict[str, Any]:
        args = {k: (v.json if isinstance(v, Expr) else v.to_json()) for k, v in self.args.items()}
        return _with_extra({"op": self.op, "args": args}, self.extra)


@dataclass(frozen=True, kw_only=True)
class ProgramCall:
    """`{"program": name}`: inline another program's calls here."""

    program: str
    extra: FrozenMap[str, Any] = _extra()

    def to_json(self) -> dict[str, Any]:
        return _with_extra({"program": self.program}, self.extra)


@dataclass(frozen=True, kw_only=True)
class Program:
    """An ordered call table. `kind`: run | once | derive; `graph`: captured into a CUDA graph keyed by
    the values of `vars_read(manifest)`; `sources` (derive only): name -> checkpoint tensor."""

    name: str
    calls: tuple[Call | ProgramCall, ...]
    kind: str = "run"
    graph: bool = False
    sources: FrozenMap[str, str] | None = None
    extra: FrozenMap[str, Any] = _extra()
    explicit: frozenset[str] = _explicit()

    def flat_calls(self, manifest: Manifest) -> list[Call]:
        """The op calls in replay order, inlined programs expanded (iteratively). Raises `ManifestError` on a
        missing or cyclic program reference, or an expansion past `inline.MAX_PROGRAM_CALLS` op calls, found
        before expanding (a verified manifest has none of these)."""
        from .inline import flat_calls

        return flat_calls(manifest, self.name)

    def located_calls(self, manifest: Manifest) -> list[tuple[str, Call]]:
        """`flat_calls` with the JSON path of each call where it is written (`programs.P.calls[i]`, P the
        program that holds it: this one or one it inlines). Raises like `flat_calls`."""
        from .inline import located_calls

        return located_calls(manifest, self.name)

    def vars_read(self, manifest: Manifest) -> frozenset[str]:
        """The vars a run of this program depends on (the graph capture key): every var its ops'
        launches read plus the vars of the call arguments those launches forward, through inlined
        programs (a `pages_of` argument reads none). Unknown ops are skipped (a verified manifest has
        none)."""
        out: set[str] = set()
        for call in self.flat_calls(manifest):
            op = manifest.ops.get(call.op)
            if op is None:
                continue
            out |= op.vars_read
            used = op.args_used
            for arg_name, value in call.args.items():
                if arg_name not in used:
                    continue
                if isinstance(value, Expr):
                    out |= value.vars
                elif isinstance(value, Ref) and value.offset is not None:
                    out |= value.offset.vars
        return frozenset(out)

    def num_calls(self, manifest: Manifest) -> int:
        """Op calls per run, inlined programs expanded (counted without expanding). Raises `ManifestError` as
        `flat_calls` does."""
        from .inline import num_calls

        return num_calls(manifest, self.name)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        _put(out, "kind", self.kind, "run", self.explicit)
        _put(out, "graph", self.graph, False, self.explicit)
        _present(out, sources=None if self.sources is None else dict(self.sources))
        out["calls"] = [c.to_json() for c in self.calls]
        return _with_extra(out, self.extra)


# ------------------------------------------------------------------------------------------ topology


@dataclass(frozen=True, kw_only=True)
class RankGroup:
    """A named group of `size` ranks; `{"rank": name}` wirings resolve to this process's index in it."""

    name: str
    size: int
    extra: FrozenMap[str, Any] = _extra()

    def to_json(self) -> dict[str, Any]:
        return _with_extra({"size": self.size}, self.extra)


@dataclass(frozen=True, kw_only=True)
class Topology:
    """Rank groups by name (empty for a single-GPU manifest)."""

    groups: FrozenMap[str, RankGroup] = field(default=FrozenMap())

    def sizes(self) -> dict[str, int]:
        """Group name -> number of ranks."""
        return {name: g.size for name, g in self.groups.items()}

    def to_json(self) -> dict[str, Any]:
        return {name: g.to_json() for name, g in self.groups.items()}


# ------------------------------------------------------------------------------------------ manifest


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """A whole manifest. Build one with `parse_manifest` / `load_manifest`; `to_json()` gives back the
    JSON value (`parse_manifest(m.to_json()) == m`)."""

    name: str
    vars: FrozenMap[str, Var]
    modules: FrozenMap[str, Module]
    buffers: FrozenMap[str, Buffer]
    ops: FrozenMap[str, Op]
    programs: FrozenMap[str, Program]
    states: FrozenMap[str, State] = field(default=FrozenMap())
    topology: Topology = field(default=Topology())
    format: str = FORMAT
    meta: Any = None  # frozen JSON value (FrozenMap / tuple / scalars), never interpreted
    declared_digest: str | None = None  # the "digest" key as written
    extra: FrozenMap[str, Any] = _extra()
    explicit: frozenset[str] = _explicit()

    def to_json(self, *, with_digest: bool = True) -> dict[str, Any]:
        """The manifest as a JSON value; `with_digest=False` leaves out the `digest` key."""
        out: dict[str, Any] = {"format": self.format, "name": self.name}
        if self.meta is not None or "meta" in self.explicit:
            out["meta"] = thaw(self.meta)
        out["vars"] = {k: v.to_json() for k, v in self.vars.items()}
        out["modules"] = {k: m.to_json() for k, m in self.modules.items()}
        out["buffers"] = {k: b.to_json() for k, b in self.buffers.items()}
        _put(out, "states", self.states, FrozenMap(), self.explicit, lambda s: {k: v.to_json() for k, v in s.items()})
        out["ops"] = {k: op.to_json() for k, op in self.ops.items()}
        out["programs"] = {k: p.to_json() for k, p in self.programs.items()}
        _put(out, "topology", self.topology, Topology(), self.explicit, lambda t: t.to_json())
        if with_digest and self.declared_digest is not None:
            out["digest"] = self.declared_digest
        return _with_extra(out, self.extra)

    @functools.cached_property
    def digest(self) -> str:
        """sha256 (hex) of the canonical JSON of the manifest without its `digest` key."""
        return hashlib.sha256(canonical_json(self.to_json(with_digest=False)).encode("ascii")).hexdigest()

    @functools.cached_property
    def program_sizes(self) -> Mapping[str, Any]:
        """Each program's expansion size, `kern_manifest.inline.Size` (op calls, expansion steps), saturating
        past the limits; programs on an inline cycle or reaching an unknown program are absent."""
        from .inline import expanded_sizes

        return FrozenMap(expanded_sizes(self))

    @functools.cached_property
    def program_size_faults(self) -> tuple[tuple[str, str], ...]:
        """(program, message) per program past kern_manifest.inline's size limits ("" for the whole manifest)."""
        from .inline import size_faults

        return tuple(size_faults(self))

    @functools.cached_property
    def family_digest(self) -> str:
        """sha256 of the canonical JSON without `digest`, `name`, `meta` and every buffer's `bind`.

        Ranks of one tensor-parallel model load per-rank manifests that differ only in which slice
        of the checkpoint each weight buffer binds; everything the ranks must agree on (vars, buffers'
        shapes, states, ops, programs, topology) is in this digest. The multi-GPU handshake compares it."""
        return family_digest_of(self.to_json(with_digest=False))

    def state_or_buffer(self, name: str) -> Buffer | State | None:
        """The buffer or state a `ptr` call argument names, or None."""
        return self.buffers.get(name) or self.states.get(name)
