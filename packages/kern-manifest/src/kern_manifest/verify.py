"""`verify(manifest)`: every consistency rule of docs/manifest.md, all faults at once, each with the
JSON path of the offending value and what to fix.

Expressions are checked at every corner of the box of the var ranges they read (all min/max
combinations): undeclared vars, divisors <= 0, values outside the signed 64-bit range, sizes below
their floor, and values that do not fit the wiring's encoding are faults.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import ExprError, Fault, ManifestError, ManifestVerifyError
from .expr import FUNCS, I64_MAX, Expr
from .frozen import index_path, key_path
from .model import (
    BUFFER_KINDS,
    DTYPE_BYTES,
    EXTERNS,
    FLOAT_ENCODINGS,
    FORMAT,
    INT_ENCODINGS,
    PLACEMENTS,
    PROGRAM_KINDS,
    STATE_KINDS,
    TENSORMAP_BYTES,
    ArgWiring,
    Buffer,
    Call,
    DerivedSegment,
    ExprWiring,
    ExternLaunch,
    InterleaveSegment,
    Launch,
    LiteralWiring,
    Manifest,
    NullWiring,
    Op,
    PackLiteralField,
    PackPointerField,
    PackTensorMapField,
    PackWiring,
    Program,
    ProgramCall,
    RankWiring,
    Ref,
    RowsSegment,
    ScratchWiring,
    State,
    TensorMap,
    TensorSegment,
    Wiring,
)

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_CORNER_VARS = 12  # 4096 corners
F32_MAX = 3.4028234663852886e38
MAX_BLOCK_THREADS = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_TENSORMAP_RANK = 5
MAX_TENSORMAP_BOX = 256
STATE_FIELDS = {"fixed": ("bytes",), "paged": ("bytes_per_token", "page_tokens"), "per_seq": ("bytes_per_seq",)}
EXTERN_INT_ROLES = {  # extern -> {position: role} for integer arguments that must be >= 1
    name: {i: "mnk" for i in range(len(req)) if req[i] == "i"} for name, (req, _) in EXTERNS.items()
    if not name.startswith("nccl_")
}

TOP_KEYS = ("format", "name", "meta", "vars", "modules", "buffers", "states", "ops", "programs", "topology", "digest")


def verify(manifest: Manifest) -> None:
    """Check a parsed manifest for consistency. Raises `ManifestVerifyError` carrying every fault found
    (each a `Fault(path, message)`); returns None when the manifest is consistent."""
    faults = find_faults(manifest)
    if faults:
        raise ManifestVerifyError(faults)


def find_faults(manifest: Manifest) -> list[Fault]:
    """The faults `verify` would raise, as a list (empty for a consistent manifest)."""
    return _Verifier(manifest).run()


class _Verifier:
    def __init__(self, m: Manifest) -> None:
        self.m = m
        self.faults: list[Fault] = []

    # -------------------------------------------------------------------------------- helpers

    def fault(self, path: str, message: str) -> None:
        self.faults.append(Fault(path, message))

    def unknown(self, extra: Mapping[str, Any], path: str, known: Iterable[str]) -> None:
        for key in extra:
            self.fault(key_path(path, key), f"unknown key {key!r}; allowed here: {', '.join(known)}")

    def name(self, name: str, path: str, what: str) -> None:
        if not NAME.fullmatch(name):
            self.fault(path, f"{what} name {name!r} must match [A-Za-z_][A-Za-z0-9_.-]*")

    def corners(self, names: frozenset[str]) -> list[dict[str, int]]:
        ordered = sorted(names)
        ranges = [sorted({self.m.vars[n].min, self.m.vars[n].max}) for n in ordered]
        return [dict(zip(ordered, combo)) for combo in itertools.product(*ranges)]

    def values(self, e: Expr, path: str, what: str, lo: int | None = None, hi: int | None = None,
               hint: str = "") -> list[tuple[dict[str, int], int]] | None:
        """Evaluate `e` at every corner; record faults for undeclared vars, evaluation errors, and values
        outside [lo, hi]. Returns (corner, value) pairs, or None when it cannot be evaluated."""
        missing = sorted(v for v in e.vars if v not in self.m.vars)
        if missing:
            self.fault(path, f"{what} {e.source!r} reads undeclared var(s) {', '.join(missing)}; declare them in "
                             f"$.vars or fix the expression")
            return None
        if len(e.vars) > MAX_CORNER_VARS:
            self.fault(path, f"{what} {e.source!r} reads {len(e.vars)} vars; at most {MAX_CORNER_VARS} are supported")
            return None
        out = []
        for corner in self.corners(e.vars):
            at = ", ".join(f"{k}={v}" for k, v in corner.items())
            where = f" at {at}" if at else ""
            try:
                value = e.eval(corner)
            except ExprError as exc:
                self.fault(path, f"{what} {e.source!r}{where}: {exc.message}")
                return None
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                bounds = f">= {lo}" if hi is None else (f"<= {hi}" if lo is None else f"in [{lo}, {hi}]")
                self.fault(path, f"{what} {e.source!r} is {value}{where}; it must be {bounds}{hint}")
                return None
            out.append((corner, value))
        return out

    def max_value(self, e: Expr, path: str, what: str, lo: int | None = None, hi: int | None = None) -> int | None:
        vals = self.values(e, path, what, lo, hi)
        return None if vals is None else max(v for _, v in vals)

    # -------------------------------------------------------------------------------- top level

    def run(self) -> list[Fault]:
        m = self.m
        self.unknown(m.extra, "$", TOP_KEYS)
        if m.format != FORMAT:
            self.fault("$.format", f"format is {m.format!r}; this verifier reads {FORMAT!r}")
        if not m.name:
            self.fault("$.name", "name is empty; give the model a human name such as 'qwen3-4b'")
        self.check_vars()
        for name, module in m.modules.items():
            path = key_path("$.modules", name)
            self.name(name, path, "module")
            if not SHA256.fullmatch(module.sha256):
                self.fault(path, f"module hash {module.sha256!r} must be 64 lowercase hex digits (the cubin's sha256)")
        for name, group in m.topology.groups.items():
            path = key_path("$.topology", name)
            self.name(name, path, "topology group")
            self.unknown(group.extra, path, ("size",))
            if group.size < 1:
                self.fault(key_path(path, "size"), f"group size is {group.size}; it must be >= 1")
        for name, buf in m.buffers.items():
            self.check_buffer(buf, key_path("$.buffers", name))
        self.check_states()
        for name, op in m.ops.items():
            self.check_op(op, key_path("$.ops", name))
        self.check_programs()
        if m.declared_digest is not None and m.declared_digest != m.digest:
            self.fault("$.digest", f"digest is {m.declared_digest!r} but the manifest hashes to {m.digest!r}; "
                                   "recompute it (sha256 of the canonical JSON without 'digest') or remove it")
        return self.faults

    def check_vars(self) -> None:
        for name, var in self.m.vars.items():
            path = key_path("$.vars", name)
            self.unknown(var.extra, path, ("min", "max"))
            if not VAR_NAME.fullmatch(name) or name in FUNCS:
                self.fault(path, f"var name {name!r} must match [A-Za-z_][A-Za-z0-9_]* and not be min, max or cdiv "
                                 "(vars appear inside expressions, where '-' and '.' are not part of a name)")
            if var.min < 0:
                self.fault(key_path(path, "min"), f"min is {var.min}; vars are >= 0")
            if var.max > I64_MAX:
                self.fault(key_path(path, "max"), f"max is {var.max}; it must fit a signed 64-bit integer")
            if var.min > var.max:
                self.fault(path, f"min {var.min} > max {var.max}")

    # -------------------------------------------------------------------------------- buffers

    def check_buffer(self, buf: Buffer, path: str) -> None:
        m = self.m
        self.name(buf.name, path, "buffer")
        self.unknown(buf.extra, path, ("kind", "dtype", "shape", "placement", "export", "bind"))
        if buf.name in m.states:
            self.fault(path, f"{buf.name!r} names both a buffer and a state; call arguments could not tell them apart")
        if buf.kind not in BUFFER_KINDS:
            self.fault(key_path(path, "kind"), f"unknown buffer kind {buf.kind!r}; use one of {', '.join(BUFFER_KINDS)}")
        if buf.dtype not in DTYPE_BYTES:
            self.fault(key_path(path, "dtype"), f"unknown dtype {buf.dtype!r}; use one of {', '.join(DTYPE_BYTES)}")
        if buf.placement not in PLACEMENTS:
            self.fault(key_path(path, "placement"), f"unknown placement {buf.placement!r}; use device or host")
        dims_ok = True
        at_max = {n: v.max for n, v in m.vars.items()}
        for i, dim in enumerate(buf.shape):
            dpath = index_path(key_path(path, "shape"), i)
            vals = self.values(dim, dpath, "dimension", lo=0)
            if vals is None:
                dims_ok = False
                continue
            top = dim.eval({k: at_max[k] for k in dim.vars})
            worst = max(vals, key=lambda cv: cv[1])
            if worst[1] > top:
                at = ", ".join(f"{k}={v}" for k, v in worst[0].items())
                self.fault(dpath, f"dimension {dim.source!r} is {worst[1]} at {at} but {top} with every var at max; "
                                  "buffers are allocated at var max, so a dimension must be largest there")
                dims_ok = False
        if dims_ok and buf.dtype in DTYPE_BYTES:
            nbytes = buf.nbytes_at_max(m.vars)
            if nbytes > I64_MAX:
                self.fault(key_path(path, "shape"), f"buffer is {nbytes} bytes at var max; it must fit in 64 bits")
        if buf.kind == "weight":
            if buf.bind is None:
                self.fault(path, "a weight buffer needs 'bind': the segments that fill it")
            else:
                self.check_bind(buf, path, dims_ok)
        elif buf.bind is not None:
            self.fault(key_path(path, "bind"), f"only weight buffers have 'bind' (this one is {buf.kind!r})")

    def check_bind(self, buf: Buffer, path: str, dims_ok: bool) -> None:
        bpath = key_path(path, "bind")
        if not buf.bind:
            self.fault(bpath, "bind is empty; list the segments that fill the buffer")
            return
        for i, seg in enumerate(buf.bind):
            spath = index_path(bpath, i)
            known = {TensorSegment: ("tensor", "shape"), RowsSegment: ("tensor", "rows", "shape"),
                     InterleaveSegment: ("interleave", "rows", "shape"), DerivedSegment: ("derived",)}[type(seg)]
            self.unknown(seg.extra, spath, known)
            if isinstance(seg, DerivedSegment):
                if not seg.derived:
                    self.fault(key_path(spath, "derived"), "write {\"derived\": true} (false has no meaning)")
                if len(buf.bind) != 1:
                    self.fault(spath, "a derived segment must be the only segment of its bind")
        if any(isinstance(s, DerivedSegment) for s in buf.bind):
            return
        if not buf.shape:
            self.fault(key_path(path, "shape"), "a bound weight buffer needs at least one dimension (rows)")
            return
        if not dims_ok:
            return
        read = set().union(*(d.vars for d in buf.shape))
        if read:
            self.fault(key_path(path, "shape"), f"a weight buffer's shape must be constant (it reads "
                                                f"{', '.join(sorted(read))}); the bind tiles a fixed row count")
            return
        shape = buf.shape_at({})
        rows, trailing = shape[0], shape[1:]
        filled = 0
        unknown = []
        for i, seg in enumerate(buf.bind):
            spath = index_path(bpath, i)
            names = seg.tensors if isinstance(seg, InterleaveSegment) else (seg.tensor,)
            for name in names:
                if not name:
                    self.fault(spath, "empty checkpoint tensor name")
            if isinstance(seg, InterleaveSegment) and not seg.tensors:
                self.fault(key_path(spath, "interleave"), "interleave needs at least one tensor")
                return
            if seg.shape is not None:
                if len(seg.shape) != len(shape) or any(d < 1 for d in seg.shape):
                    self.fault(key_path(spath, "shape"), f"tensor shape {list(seg.shape)} must have {len(shape)} "
                                                         "dimensions (as the buffer), each >= 1")
                    return
                if tuple(seg.shape[1:]) != trailing:
                    self.fault(key_path(spath, "shape"), f"row width mismatch: the tensor's trailing dims "
                                                         f"{list(seg.shape[1:])} must equal the buffer's {list(trailing)}")
                    return
            if isinstance(seg, RowsSegment):
                if not 0 <= seg.start < seg.stop:
                    self.fault(key_path(spath, "rows"), f"row range [{seg.start}, {seg.stop}) must satisfy "
                                                        "0 <= start < stop")
                    return
                if seg.shape is not None and seg.stop > seg.shape[0]:
                    self.fault(key_path(spath, "rows"), f"row range ends at {seg.stop} but the tensor has "
                                                        f"{seg.shape[0]} rows")
                    return
            if isinstance(seg, InterleaveSegment):
                if seg.rows < 1:
                    self.fault(key_path(spath, "rows"), f"interleave block is {seg.rows} rows; it must be >= 1")
                    return
                if seg.shape is not None and seg.shape[0] % seg.rows:
                    self.fault(key_path(spath, "rows"), f"each tensor has {seg.shape[0]} rows, not a multiple of the "
                                                        f"interleave block {seg.rows}")
                    return
            n = seg.known_rows()
            if n is None:
                unknown.append((i, seg))
            else:
                filled += n
        if not unknown:
            if filled < rows:
                self.fault(bpath, f"gap: the segments fill {filled} rows of the buffer's {rows}; add segments for "
                                  f"the last {rows - filled} rows")
            elif filled > rows:
                self.fault(bpath, f"overlap: the segments fill {filled} rows but the buffer has {rows}; remove "
                                  f"{filled - rows} rows or enlarge shape[0]")
        elif filled + len(unknown) > rows:
            self.fault(bpath, f"overlap: segments of known size already fill {filled} of {rows} rows, leaving less "
                              f"than one row for each of the {len(unknown)} segment(s) without 'shape'")
        elif len(unknown) == 1:
            i, seg = unknown[0]
            if isinstance(seg, InterleaveSegment) and (rows - filled) % (seg.rows * len(seg.tensors)):
                self.fault(index_path(bpath, i), f"the interleave must fill the remaining {rows - filled} rows, not a "
                                                 f"multiple of {seg.rows} x {len(seg.tensors)} tensors")

    # -------------------------------------------------------------------------------- states

    def check_states(self) -> None:
        page_tokens: dict[int, str] = {}
        for name, st in self.m.states.items():
            path = key_path("$.states", name)
            self.name(name, path, "state")
            self.unknown(st.extra, path, ("kind", "bytes", "bytes_per_token", "page_tokens", "bytes_per_seq"))
            if st.kind not in STATE_KINDS:
                self.fault(key_path(path, "kind"), f"unknown state kind {st.kind!r}; use fixed, paged or per_seq")
                continue
            wanted = STATE_FIELDS[st.kind]
            for key in ("bytes", "bytes_per_token", "page_tokens", "bytes_per_seq"):
                value = getattr(st, key)
                if key in wanted and value is None:
                    self.fault(path, f"a {st.kind} state needs {key!r}")
                elif key not in wanted and value is not None:
                    self.fault(key_path(path, key), f"{key!r} does not belong to a {st.kind} state "
                                                    f"(it takes {', '.join(wanted)})")
                elif value is not None and not 1 <= value <= I64_MAX:
                    self.fault(key_path(path, key), f"{key} is {value}; it must be >= 1")
            if st.kind == "paged" and st.page_tokens is not None:
                page_tokens.setdefault(st.page_tokens, name)
        if len(page_tokens) > 1:
            seen = ", ".join(f"{v} ({n} tokens)" for n, v in page_tokens.items())
            for n, v in list(page_tokens.items())[1:]:
                self.fault(key_path(key_path("$.states", v), "page_tokens"),
                           f"all paged states must share one page_tokens; found {seen}")

    # -------------------------------------------------------------------------------- ops

    def check_op(self, op: Op, path: str) -> None:
        self.name(op.name, path, "op")
        self.unknown(op.extra, path, ("args", "scratch", "launches"))
        seen: set[str] = set()
        for i, arg in enumerate(op.args):
            apath = index_path(key_path(path, "args"), i)
            self.unknown(arg.extra, apath, ("name", "kind"))
            self.name(arg.name, key_path(apath, "name"), "argument")
            if arg.name in seen:
                self.fault(key_path(apath, "name"), f"argument {arg.name!r} is declared twice")
            seen.add(arg.name)
            if arg.kind not in ("ptr", "int"):
                self.fault(key_path(apath, "kind"), f"unknown argument kind {arg.kind!r}; use ptr or int")
        scratch_bytes: dict[str, int | None] = {}
        for name, e in op.scratch.items():
            spath = key_path(key_path(path, "scratch"), name)
            self.name(name, spath, "scratch")
            scratch_bytes[name] = self.max_value(e, spath, "scratch size", lo=0)
        if not op.launches:
            self.fault(key_path(path, "launches"), "an op needs at least one launch")
        for i, launch in enumerate(op.launches):
            lpath = index_path(key_path(path, "launches"), i)
            if isinstance(launch, ExternLaunch):
                self.check_extern(op, launch, lpath, scratch_bytes)
            else:
                self.check_launch(op, launch, lpath, scratch_bytes)
        self.check_when_partition(op, path)

    def check_launch(self, op: Op, launch: Launch, path: str, scratch: dict[str, int | None]) -> None:
        self.unknown(launch.extra, path, ("module", "entry", "grid", "block", "shared_mem", "cluster", "pdl", "params",
                                          "args", "when"))
        if launch.module not in self.m.modules:
            self.fault(key_path(path, "module"), f"unknown module {launch.module!r}; declare it in $.modules "
                                                 f"(known: {', '.join(self.m.modules) or 'none'})")
        if not launch.entry:
            self.fault(key_path(path, "entry"), "entry (the kernel's symbol name) is empty")
        for key, dims, floor in (("grid", launch.grid, 1), ("block", launch.block, 1), ("cluster", launch.cluster, 1)):
            if dims is None:
                continue
            kpath = key_path(path, key)
            if len(dims) != 3:
                self.fault(kpath, f"{key} has {len(dims)} dimensions; write exactly 3 (x, y, z)")
                continue
            maxima = []
            for j, e in enumerate(dims):
                hi = MAX_GRID[j] if key == "grid" else None
                maxima.append(self.max_value(e, index_path(kpath, j), f"{key} dimension", lo=floor, hi=hi))
            if key == "block" and None not in maxima and math.prod(maxima) > MAX_BLOCK_THREADS:
                self.fault(kpath, f"block has up to {math.prod(maxima)} threads; CUDA allows {MAX_BLOCK_THREADS}")
        self.values(launch.shared_mem, key_path(path, "shared_mem"), "shared_mem", lo=0)
        ppath = key_path(path, "params")
        end = 0
        for j, (offset, size) in enumerate(launch.params):
            if size < 1 or offset < 0:
                self.fault(index_path(ppath, j), f"param [{offset}, {size}]: offset must be >= 0 and size >= 1")
            elif offset < end:
                self.fault(index_path(ppath, j), f"param [{offset}, {size}] starts at byte {offset}, before the "
                                                 f"previous param ends (byte {end}); params are ascending and do not "
                                                 "overlap")
            end = max(end, offset + size)
        apath = key_path(path, "args")
        if len(launch.args) != len(launch.params):
            self.fault(apath, f"{len(launch.args)} wirings for {len(launch.params)} params; give one wiring per param")
        for j, wiring in enumerate(launch.args):
            wpath = index_path(apath, j)
            nbytes = self.check_wiring(op, wiring, wpath, scratch, extern=False)
            if j < len(launch.params) and nbytes is not None and nbytes != launch.params[j][1]:
                self.fault(wpath, f"wiring is {nbytes} bytes but param {j} is {launch.params[j][1]} bytes")
        self.check_when(launch.when, key_path(path, "when"))

    def check_wiring(self, op: Op, w: Wiring, path: str, scratch: dict[str, int | None], extern: bool) -> int | None:
        """Check one wiring; returns its byte size (None when unknown)."""
        if isinstance(w, ArgWiring):
            self.unknown(w.extra, path, ("arg", "offset", "type"))
            arg = op.arg(w.arg)
            if arg is None:
                self.fault(key_path(path, "arg"), f"unknown argument {w.arg!r}; the op declares "
                                                  f"{', '.join(a.name for a in op.args) or 'none'}")
                return w.nbytes
            if arg.kind == "ptr":
                if w.type is not None:
                    self.fault(key_path(path, "type"), f"{w.arg!r} is a ptr argument; remove 'type' (pointers are 8 "
                                                       "bytes)")
                if w.offset is not None:
                    self.values(w.offset, key_path(path, "offset"), "byte offset", lo=0)
                return 8
            if w.offset is not None:
                self.fault(key_path(path, "offset"), f"{w.arg!r} is an int argument; 'offset' only applies to ptr")
            if w.type is None:
                if not extern:
                    self.fault(path, f"{w.arg!r} is an int argument: say how to encode it with 'type' "
                                     "(i32, u32, i64 or u64)")
                return None
            if w.type not in INT_ENCODINGS:
                self.fault(key_path(path, "type"), f"unknown int encoding {w.type!r}; use i32, u32, i64 or u64")
                return None
            return w.nbytes
        if isinstance(w, ScratchWiring):
            self.unknown(w.extra, path, ("scratch", "offset"))
            if w.scratch not in op.scratch:
                self.fault(key_path(path, "scratch"), f"unknown scratch {w.scratch!r}; declare it in the op's "
                                                      "'scratch'")
            elif w.offset is not None:
                hi = scratch.get(w.scratch)
                self.values(w.offset, key_path(path, "offset"), "scratch offset", lo=0, hi=hi,
                            hint=" (the scratch size at var max)")
            return 8
        if isinstance(w, LiteralWiring):
            self.unknown(w.extra, path, (w.type,))
            self.check_literal(w.type, w.value, key_path(path, w.type))
            return w.nbytes
        if isinstance(w, ExprWiring):
            self.unknown(w.extra, path, ("expr", "type"))
            if w.type is None:
                if not extern:
                    self.fault(path, "say how to encode the expression with 'type' (i32, u32, i64 or u64)")
                self.values(w.expr, key_path(path, "expr"), "expression")
                return None
            if w.type not in INT_ENCODINGS:
                self.fault(key_path(path, "type"), f"unknown int encoding {w.type!r}; use i32, u32, i64 or u64")
                return None
            _, lo, hi = INT_ENCODINGS[w.type]
            self.values(w.expr, key_path(path, "expr"), "expression", lo=lo, hi=hi, hint=f" to fit {w.type}")
            return w.nbytes
        if isinstance(w, RankWiring):
            self.unknown(w.extra, path, ("rank", "type"))
            if w.rank not in self.m.topology.groups:
                self.fault(key_path(path, "rank"), f"unknown topology group {w.rank!r}; declare it in $.topology")
            if w.type is None:
                if not extern:
                    self.fault(path, "say how to encode the rank with 'type' (i32, u32, i64 or u64)")
                return None
            if w.type not in INT_ENCODINGS:
                self.fault(key_path(path, "type"), f"unknown int encoding {w.type!r}; use i32, u32, i64 or u64")
                return None
            return w.nbytes
        if isinstance(w, NullWiring):
            self.unknown(w.extra, path, ("null",))
            if w.nbytes < 1:
                self.fault(key_path(path, "null"), f"null wiring of {w.nbytes} bytes; give the param's size (>= 1)")
                return None
            return w.nbytes
        assert isinstance(w, PackWiring), w
        self.unknown(w.extra, path, ("pack",))
        ppath = key_path(path, "pack")
        self.unknown(w.pack_extra, ppath, ("size", "fields"))
        if w.size < 1:
            self.fault(key_path(ppath, "size"), f"pack size is {w.size}; it must be >= 1")
            return None
        spans: list[tuple[int, int, int]] = []
        for k, f in enumerate(w.fields):
            fpath = index_path(key_path(ppath, "fields"), k)
            nbytes = self.check_pack_field(op, f, fpath)
            if nbytes is None:
                continue
            if f.offset < 0 or f.offset + nbytes > w.size:
                self.fault(key_path(fpath, "offset"), f"field of {nbytes} bytes at offset {f.offset} does not fit in "
                                                      f"the {w.size}-byte pack")
                continue
            for start, stop, other in spans:
                if f.offset < stop and start < f.offset + nbytes:
                    self.fault(key_path(fpath, "offset"), f"field [{f.offset}, {f.offset + nbytes}) overlaps field "
                                                          f"{other} [{start}, {stop})")
            spans.append((f.offset, f.offset + nbytes, k))
        return w.size

    def check_pack_field(self, op: Op, f: Any, path: str) -> int | None:
        if isinstance(f, PackPointerField):
            self.unknown(f.extra, path, ("offset", "arg"))
            self.ptr_arg(op, f.arg, key_path(path, "arg"))
            return f.nbytes
        if isinstance(f, PackLiteralField):
            self.unknown(f.extra, path, ("offset", f.type))
            self.check_literal(f.type, f.value, key_path(path, f.type))
            return f.nbytes
        assert isinstance(f, PackTensorMapField), f
        self.unknown(f.extra, path, ("offset", "tensormap"))
        if f.offset % 64:
            self.fault(key_path(path, "offset"), f"a tensor map is 64-byte aligned; offset {f.offset} is not a "
                                                 "multiple of 64")
        self.check_tensormap(op, f.tensormap, key_path(path, "tensormap"))
        return TENSORMAP_BYTES

    def check_tensormap(self, op: Op, t: TensorMap, path: str) -> None:
        self.unknown(t.extra, path, ("arg", "offset", "dtype", "dims", "strides", "box", "elem_strides", "interleave",
                                     "swizzle", "l2_promotion", "oob_fill"))
        self.ptr_arg(op, t.arg, key_path(path, "arg"))
        if t.dtype not in DTYPE_BYTES:
            self.fault(key_path(path, "dtype"), f"unknown dtype {t.dtype!r}; use one of {', '.join(DTYPE_BYTES)}")
        rank = len(t.dims)
        if not 1 <= rank <= MAX_TENSORMAP_RANK:
            self.fault(key_path(path, "dims"), f"tensor map rank {rank}; it must be 1..{MAX_TENSORMAP_RANK}")
            return
        for key, items, want in (("strides", t.strides, rank - 1), ("box", t.box, rank),
                                 ("elem_strides", t.elem_strides, rank)):
            if items is not None and len(items) != want:
                self.fault(key_path(path, key), f"{key} has {len(items)} entries; a rank-{rank} map needs {want}")
        for j, e in enumerate(t.dims):
            self.values(e, index_path(key_path(path, "dims"), j), "tensor map dimension", lo=1)
        for j, e in enumerate(t.strides):
            self.values(e, index_path(key_path(path, "strides"), j), "tensor map stride (bytes)", lo=1)
        for j, b in enumerate(t.box):
            if not 1 <= b <= MAX_TENSORMAP_BOX:
                self.fault(index_path(key_path(path, "box"), j), f"box size {b}; it must be 1..{MAX_TENSORMAP_BOX}")
        for j, s in enumerate(t.elem_strides or ()):
            if not 1 <= s <= 8:
                self.fault(index_path(key_path(path, "elem_strides"), j), f"element stride {s}; it must be 1..8")
        if t.offset is not None:
            self.values(t.offset, key_path(path, "offset"), "byte offset", lo=0)

    def ptr_arg(self, op: Op, name: str, path: str) -> None:
        arg = op.arg(name)
        if arg is None:
            self.fault(path, f"unknown argument {name!r}; the op declares {', '.join(a.name for a in op.args) or 'none'}")
        elif arg.kind != "ptr":
            self.fault(path, f"{name!r} is an {arg.kind} argument; a pointer is needed here")

    def check_literal(self, enc: str, value: int | float, path: str) -> None:
        if enc in INT_ENCODINGS:
            _, lo, hi = INT_ENCODINGS[enc]
            if not lo <= value <= hi:
                self.fault(path, f"{value} does not fit {enc} [{lo}, {hi}]")
        elif enc == "f32" and abs(value) > F32_MAX:
            self.fault(path, f"{value} overflows f32")

    def check_extern(self, op: Op, launch: ExternLaunch, path: str, scratch: dict[str, int | None]) -> None:
        self.unknown(launch.extra, path, ("extern", "args", "algo", "when"))
        spec = EXTERNS.get(launch.name)
        if spec is None:
            self.fault(key_path(path, "extern"), f"unknown extern op {launch.extern!r}; known: {', '.join(EXTERNS)}")
        apath = key_path(path, "args")
        for j, w in enumerate(launch.args):
            self.check_wiring(op, w, index_path(apath, j), scratch, extern=True)
        if launch.algo is not None:
            gpath = key_path(path, "algo")
            self.unknown(launch.algo.extra, gpath, ("id", "tile", "stages", "split_k", "reduction", "swizzle", "custom",
                                                    "inner_shape", "cluster_shape"))
            if not launch.name.startswith("cublaslt_"):
                self.fault(gpath, f"'algo' pins a cuBLASLt algorithm; {launch.name!r} is not a cuBLASLt extern")
            for key in ("id", "tile", "stages", "split_k", "reduction", "swizzle", "custom", "inner_shape",
                        "cluster_shape"):
                value = getattr(launch.algo, key)
                if value is not None and not 0 <= value <= 2**31 - 1:
                    self.fault(key_path(gpath, key), f"{key} is {value}; cuBLASLt attributes are >= 0 and fit int32")
        self.check_when(launch.when, key_path(path, "when"))
        if spec is None:
            return
        required, optional = spec
        if not len(required) <= len(launch.args) <= len(required) + len(optional):
            want = str(len(required)) if not optional else f"{len(required)} to {len(required) + len(optional)}"
            self.fault(apath, f"{launch.name} takes {want} arguments, got {len(launch.args)}")
        for j, (w, role) in enumerate(zip(launch.args, required + optional)):
            wpath = index_path(apath, j)
            if role == "p":
                is_ptr = isinstance(w, ScratchWiring) or (
                    isinstance(w, ArgWiring) and (a := op.arg(w.arg)) is not None and a.kind == "ptr")
                if not is_ptr and not (isinstance(w, ArgWiring) and op.arg(w.arg) is None):
                    self.fault(wpath, f"argument {j} of {launch.name} is a pointer: wire a ptr argument or a scratch")
            elif role == "i":
                is_int = isinstance(w, ExprWiring) or (isinstance(w, LiteralWiring) and w.type in INT_ENCODINGS) or (
                    isinstance(w, ArgWiring) and (a := op.arg(w.arg)) is not None and a.kind == "int")
                if not is_int and not (isinstance(w, ArgWiring) and op.arg(w.arg) is None):
                    self.fault(wpath, f"argument {j} of {launch.name} is an integer: wire an int argument, an 'expr' "
                                      "or an integer literal")
                elif isinstance(w, (ExprWiring, LiteralWiring)) and role == "i" and j in EXTERN_INT_ROLES.get(
                        launch.name, {}) and j < len(required):
                    e = w.expr if isinstance(w, ExprWiring) else Expr(int(w.value))
                    self.values(e, wpath, "GEMM dimension", lo=1)
                    if launch.name.startswith("cublaslt_fp8") and j == len(required) - 1:
                        for corner, value in self.values(e, wpath, "k") or ():
                            if value % 16:
                                self.fault(wpath, f"fp8 GEMMs need k % 16 == 0; k is {value}")
                                break
            elif role == "r" and not isinstance(w, RankWiring):
                self.fault(wpath, f"argument {j} of {launch.name} names the topology group: write {{\"rank\": group}}")

    # -------------------------------------------------------------------------------- when

    def check_when(self, when: Any, path: str) -> None:
        if when is None:
            return
        if not when:
            self.fault(path, "'when' is empty; remove it or name a var range")
        for var, (lo, hi) in when.items():
            vpath = key_path(path, var)
            if var not in self.m.vars:
                self.fault(vpath, f"'when' names undeclared var {var!r}")
                continue
            if not lo.is_const or not hi.is_const:
                self.fault(vpath, "'when' bounds must be constant expressions (no vars), so launch selection is fixed "
                                  "by the selecting var alone")
                continue
            try:
                a, b = lo.eval({}), hi.eval({})
            except ExprError as exc:
                self.fault(vpath, f"'when' bound: {exc}")
                continue
            v = self.m.vars[var]
            if not v.min <= a <= b <= v.max:
                self.fault(vpath, f"'when' range [{a}, {b}] must satisfy {v.min} <= lo <= hi <= {v.max} "
                                  f"(the range of {var!r})")

    def when_box(self, when: Any) -> dict[str, tuple[int, int]] | None:
        box = {}
        for var, (lo, hi) in when.items():
            if var not in self.m.vars or not lo.is_const or not hi.is_const:
                return None
            try:
                a, b = lo.eval({}), hi.eval({})
            except ExprError:
                return None
            v = self.m.vars[var]
            if not v.min <= a <= b <= v.max:
                return None
            box[var] = (a, b)
        return box or None

    def check_when_partition(self, op: Op, path: str) -> None:
        """Launches with `when` come in groups: a group is a run of consecutive `when` launches over the same
        var set, closed as soon as their ranges cover the var box (or by a launch without `when`, a launch
        over other vars, or the end of the op). Inside a group no two ranges may overlap, and a closed
        group must cover every point."""
        group: list[tuple[int, dict[str, tuple[int, int]]]] = []

        def close() -> None:
            if group:
                hole = self.uncovered(group)
                if hole is not None:
                    first = index_path(key_path(path, "launches"), group[0][0])
                    idx = ", ".join(str(i) for i, _ in group)
                    self.fault(key_path(first, "when"), f"the 'when' ranges of launches {idx} leave {hole} uncovered; "
                                                        "every var value needs exactly one launch")
                group.clear()

        for i, launch in enumerate(op.launches):
            if launch.when is None:
                close()
                continue
            box = self.when_box(launch.when)
            if box is None:
                close()
                continue
            if group and set(group[0][1]) != set(box):
                close()
            for j, other in group:
                if all(max(box[v][0], other[v][0]) <= min(box[v][1], other[v][1]) for v in box):
                    at = ", ".join(f"{v}=[{max(box[v][0], other[v][0])}, {min(box[v][1], other[v][1])}]" for v in box)
                    self.fault(key_path(index_path(key_path(path, "launches"), i), "when"),
                               f"'when' overlaps launch {j} at {at}; ranges of one group must not overlap")
                    break
            group.append((i, box))  # even when it overlaps: a hole is then only reported if there is one
            if self.uncovered(group) is None:
                group.clear()
        close()

    def uncovered(self, group: list[tuple[int, dict[str, tuple[int, int]]]]) -> str | None:
        """A description of one point-range no box covers, or None when the boxes cover the var box."""
        names = sorted(group[0][1])
        cuts = []
        for n in names:
            v = self.m.vars[n]
            points = {v.min, v.max + 1}
            for _, box in group:
                points |= {box[n][0], box[n][1] + 1}
            cuts.append(sorted(p for p in points if v.min <= p <= v.max + 1))
        for cell in itertools.product(*[list(zip(c, c[1:])) for c in cuts]):
            if not any(all(box[n][0] <= cell[k][0] and cell[k][1] - 1 <= box[n][1] for k, n in enumerate(names))
                       for _, box in group):
                return ", ".join(f"{n}={a}" if a == b - 1 else f"{n}={a}..{b - 1}" for n, (a, b) in zip(names, cell))
        return None

    # -------------------------------------------------------------------------------- programs

    def check_programs(self) -> None:
        m = self.m
        cyclic = self.check_cycles()
        for name, prog in m.programs.items():
            path = key_path("$.programs", name)
            self.name(name, path, "program")
            self.unknown(prog.extra, path, ("kind", "graph", "sources", "calls"))
            if prog.kind not in PROGRAM_KINDS:
                self.fault(key_path(path, "kind"), f"unknown program kind {prog.kind!r}; use run, once or derive")
            if prog.graph and prog.kind != "run":
                self.fault(key_path(path, "graph"), f"only run programs are captured; a {prog.kind} program runs "
                                                    "once per load, remove 'graph'")
            local: set[str] = set()
            if prog.sources is not None:
                if prog.kind != "derive":
                    self.fault(key_path(path, "sources"), "only derive programs have 'sources'")
                for src, tensor in prog.sources.items():
                    spath = key_path(key_path(path, "sources"), src)
                    self.name(src, spath, "source")
                    if src in m.buffers or src in m.states:
                        self.fault(spath, f"source name {src!r} shadows a buffer or state; rename it")
                    if not tensor:
                        self.fault(spath, "empty checkpoint tensor name")
                    local.add(src)
            elif prog.kind == "derive":
                self.fault(path, "a derive program needs 'sources': name -> checkpoint tensor it reads")
            for i, call in enumerate(prog.calls):
                cpath = index_path(key_path(path, "calls"), i)
                if isinstance(call, ProgramCall):
                    self.unknown(call.extra, cpath, ("program",))
                    target = m.programs.get(call.program)
                    if target is None:
                        self.fault(key_path(cpath, "program"), f"unknown program {call.program!r}")
                    elif target.kind == "derive":
                        self.fault(key_path(cpath, "program"), f"{call.program!r} is a derive program; its sources "
                                                               "are staged only for its own run, it cannot be inlined")
                else:
                    self.check_call(call, cpath, local)

    def check_cycles(self) -> set[str]:
        """Fault every cycle of `{"program": ...}` references once; returns the programs on cycles."""
        m = self.m
        on_cycle: set[str] = set()
        reported: set[frozenset[str]] = set()

        color: dict[str, int] = {}  # absent: unvisited, 1: on the DFS stack, 2: done

        def walk(name: str, stack: list[str]) -> None:
            color[name] = 1
            for i, call in enumerate(m.programs[name].calls):
                if not isinstance(call, ProgramCall) or call.program not in m.programs:
                    continue
                state = color.get(call.program)
                if state == 1:
                    cycle = stack[stack.index(call.program):]
                    on_cycle.update(cycle)
                    if frozenset(cycle) not in reported:
                        reported.add(frozenset(cycle))
                        cpath = key_path(index_path(key_path(key_path("$.programs", name), "calls"), i), "program")
                        self.fault(cpath, f"program cycle {' -> '.join([*cycle, call.program])}; inlining must end")
                elif state is None:
                    walk(call.program, [*stack, call.program])
            color[name] = 2

        for name in m.programs:
            if name not in color:
                walk(name, [name])
        return on_cycle

    def check_call(self, call: Call, path: str, local: set[str]) -> None:
        m = self.m
        self.unknown(call.extra, path, ("op", "args"))
        op = m.ops.get(call.op)
        if op is None:
            self.fault(key_path(path, "op"), f"unknown op {call.op!r}; declare it in $.ops")
            return
        apath = key_path(path, "args")
        for name in call.args:
            if op.arg(name) is None:
                self.fault(key_path(apath, name), f"op {op.name!r} has no argument {name!r} (it takes "
                                                  f"{', '.join(a.name for a in op.args) or 'none'})")
        for arg in op.args:
            value = call.args.get(arg.name)
            vpath = key_path(apath, arg.name)
            if value is None:
                self.fault(apath, f"missing argument {arg.name!r} of op {op.name!r}")
                continue
            if arg.kind == "ptr":
                if isinstance(value, Expr):
                    self.fault(vpath, f"{arg.name!r} is a ptr argument; pass a buffer or state name")
                    continue
                self.check_ref(op, arg.name, value, vpath, local)
            elif arg.kind == "int":
                if not isinstance(value, Expr):
                    self.fault(vpath, f"{arg.name!r} is an int argument; pass an expression")
                    continue
                self.check_int_arg(op, arg.name, value, vpath)

    def check_ref(self, op: Op, arg: str, ref: Ref, path: str, local: set[str]) -> None:
        m = self.m
        if ref.form != "name":
            self.unknown(ref.extra, path, (ref.form, "offset"))
        target: Buffer | State | None
        if ref.form == "buffer":
            target = m.buffers.get(ref.name)
            if target is None and ref.name not in local:
                self.fault(key_path(path, "buffer"), f"unknown buffer {ref.name!r}")
                return
        elif ref.form == "state":
            target = m.states.get(ref.name)
            if target is None:
                self.fault(key_path(path, "state"), f"unknown state {ref.name!r}")
                return
        else:
            target = m.buffers.get(ref.name) or m.states.get(ref.name)
            if target is None and ref.name not in local:
                self.fault(path, f"unknown buffer or state {ref.name!r}")
                return
        nbytes: int | None = None
        if isinstance(target, Buffer):
            try:
                nbytes = target.nbytes_at_max(m.vars)
            except ManifestError:  # the buffer's own faults are reported at the buffer
                nbytes = None
        elif isinstance(target, State) and target.kind == "fixed":
            nbytes = target.bytes
        offsets = [(ref.offset, key_path(path, "offset"))] if ref.offset is not None else []
        if not offsets:
            offsets = [(Expr(0), path)]
        # The call's offset plus every launch-side offset on this argument must stay inside the target.
        launch_offsets = [w.offset for launch in op.launches for w in launch.args
                          if isinstance(w, ArgWiring) and w.arg == arg and w.offset is not None]
        for e, epath in offsets:
            if self.values(e, epath, "byte offset", lo=0, hi=nbytes, hint=" (the target's byte size)") is None:
                return
            for extra in launch_offsets:
                both = e.vars | extra.vars
                if nbytes is None or not all(v in m.vars for v in both) or len(both) > MAX_CORNER_VARS:
                    continue
                for corner in self.corners(both):
                    try:
                        total = e.eval(corner) + extra.eval(corner)
                    except ExprError:
                        break  # reported at the launch
                    if total > nbytes:
                        at = ", ".join(f"{k}={v}" for k, v in corner.items())
                        self.fault(epath, f"call offset {e.source!r} + launch offset {extra.source!r} is {total} "
                                          f"bytes{' at ' + at if at else ''}, past the end of {ref.name!r} "
                                          f"({nbytes} bytes)")
                        break

    def check_int_arg(self, op: Op, arg: str, e: Expr, path: str) -> None:
        encodings = {w.type for launch in op.launches for w in launch.args
                     if isinstance(w, ArgWiring) and w.arg == arg and w.type in INT_ENCODINGS}
        lo, hi = None, None
        if encodings:
            lo = max(INT_ENCODINGS[t][1] for t in encodings)
            hi = min(INT_ENCODINGS[t][2] for t in encodings)
        hint = f" to fit {', '.join(sorted(encodings))}" if encodings else ""
        if self.values(e, path, "int argument", lo=lo, hi=hi, hint=hint) is None:
            return
        for launch in op.launches:
            if not isinstance(launch, ExternLaunch) or launch.name not in EXTERN_INT_ROLES:
                continue
            required, _ = EXTERNS[launch.name]
            for j, w in enumerate(launch.args[:len(required)]):
                if isinstance(w, ArgWiring) and w.arg == arg and j in EXTERN_INT_ROLES[launch.name]:
                    self.values(e, path, f"GEMM dimension (argument {j} of {launch.name})", lo=1)
                    if launch.name.startswith("cublaslt_fp8") and j == len(required) - 1:
                        for _, value in self.values(e, path, "k") or ():
                            if value % 16:
                                self.fault(path, f"fp8 GEMMs need k % 16 == 0; k is {value}")
                                break
