"""Verifier checks of ops: launches, ABI params and wirings, packs and tensor maps, extern ops, and the
`when` partition of each op's launches."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .errors import ExprError
from .expr import I64_MAX, I64_MIN, Expr
from .frozen import index_path, key_path
from .model import (
    DTYPE_BYTES,
    EXTERNS,
    INT_ENCODINGS,
    TENSORMAP_BYTES,
    ArgWiring,
    Buffer,
    Call,
    ExprWiring,
    ExternLaunch,
    Launch,
    LiteralWiring,
    NullWiring,
    Op,
    PackLiteralField,
    PackPointerField,
    PackTensorMapField,
    PackWiring,
    RankWiring,
    Ref,
    ScratchWiring,
    State,
    TensorMap,
    Wiring,
)
from .verify_base import (
    EXTERN_INT_ROLES,
    F32_MAX,
    MAX_BLOCK_THREADS,
    MAX_GRID,
    MAX_TENSORMAP_BOX,
    MAX_TENSORMAP_RANK,
    MAX_WHEN_WORK,
    VerifierBase,
)


def is_fill(e: Expr) -> bool:
    """True for a tensor map dim written as the constant 0: a fill dim (docs/manifest.md, "pack"), allowed as
    the outermost dim of a map over a pooled state, resolved by the runtime at load."""
    if not e.is_const:
        return False
    try:
        return e.eval({}) == 0
    except ExprError:  # a bad constant is reported by the dim check
        return False


def fill_tensormaps(op: Op, path: str) -> list[tuple[str, int, TensorMap, int]]:
    """The tensor maps of `op` (at `path`, e.g. `$.ops.attn`) with a fill outermost dim: (JSON path of the
    tensor map, launch index, the map, the index of its fill dim)."""
    out = []
    for li, launch in enumerate(op.launches):
        lpath = index_path(key_path(path, "launches"), li)
        for wi, w in enumerate(launch.args):
            if not isinstance(w, PackWiring):
                continue
            fields_path = key_path(key_path(index_path(key_path(lpath, "args"), wi), "pack"), "fields")
            for fi, f in enumerate(w.fields):
                if isinstance(f, PackTensorMapField) and f.tensormap.dims and is_fill(f.tensormap.dims[-1]):
                    tpath = key_path(index_path(fields_path, fi), "tensormap")
                    out.append((tpath, li, f.tensormap, len(f.tensormap.dims) - 1))
    return out


class OpChecks(VerifierBase):
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
        self.unknown(launch.extra, path, ("module", "entry", "grid", "block", "shared_mem", "cluster", "pdl",
                                          "cooperative", "carveout", "params", "args", "when"))
        if launch.cooperative and launch.cluster is not None:
            self.fault(key_path(path, "cooperative"), "a cooperative launch takes no 'cluster' (the runtime does not "
                                                      "launch both attributes together)")
        if launch.cooperative and launch.pdl:
            self.fault(key_path(path, "cooperative"), "a cooperative launch takes no 'pdl': its blocks must all be "
                                                      "resident at once, which an overlapping predecessor's blocks "
                                                      "could prevent")
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
        if launch.carveout is not None and (isinstance(launch.carveout, bool) or not isinstance(launch.carveout, int)):
            # a Manifest built in Python (parse_manifest already refuses these with a parse error)
            self.fault(key_path(path, "carveout"), f"carveout is {launch.carveout!r}; it must be an integer percent "
                                                   "in [0, 100]")
        elif launch.carveout is not None and not 0 <= launch.carveout <= 100:
            self.fault(key_path(path, "carveout"), f"carveout is {launch.carveout}; it must be in [0, 100] (percent of "
                                                   "the maximum shared memory)")
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

    def check_carveouts(self) -> None:
        """`carveout` is a property of the function, not of one launch: every launch of one (module, entry) that
        gives it must give the same value (a launch without it does not conflict). Each disagreeing launch is a
        fault at its `carveout`, naming the first launch that set the function's value."""
        first: dict[tuple[str, str], tuple[int, str]] = {}
        for op_name, op in self.m.ops.items():
            for i, launch in enumerate(op.launches):
                if not isinstance(launch, Launch) or launch.carveout is None:
                    continue
                path = key_path(index_path(key_path(key_path("$.ops", op_name), "launches"), i), "carveout")
                key = (launch.module, launch.entry)
                if key not in first:
                    first[key] = (launch.carveout, path)
                elif first[key][0] != launch.carveout:
                    value, where = first[key]
                    self.fault(path, f"carveout {launch.carveout} of entry {launch.entry!r} (module "
                                     f"{launch.module!r}) differs from carveout {value} at {where}; it is a property "
                                     "of the function: give every launch of it the same value, or leave it out")

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
            dpath = index_path(key_path(path, "dims"), j)
            if is_fill(e):
                if j != rank - 1:
                    self.fault(dpath, f"tensor map dimension {j} is 0, an inner dim: only the outermost dim "
                                      f"(dims[{rank - 1}]) may be 0 (a fill dim, spanning the reserved range of "
                                      "the pooled state the call passes); give inner dims >= 1")
                continue  # the outermost: the calls must pass a pooled state (check_fill_targets)
            self.values(e, dpath, "tensor map dimension", lo=1)
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
        for key in ("interleave", "swizzle", "l2_promotion", "oob_fill"):
            value = getattr(t, key)
            if isinstance(value, int) and not 0 <= value <= 0xFFFF_FFFF:  # the driver's enums are 32-bit
                self.fault(key_path(path, key), f"{key} {value}: an enum value of cuTensorMapEncodeTiled, 0..2^32-1")

    def check_fill_targets(self, op: Op, call: Call, path: str, local: set[str]) -> None:
        """A tensor map whose outermost dim is 0 (a fill dim) spans the reserved range of a pooled state, which
        only the runtime sizes (from the caller's capacity): each call of `op` must pass a `paged` or `per_seq`
        state for that map's `arg`. A buffer, a derive source or a `fixed` state is a fault at the call's
        argument (`path` is the call's `args`), once per argument, naming the op, launch and tensor map."""
        seen: set[str] = set()
        if op.name not in self.fill_maps:  # once per op, not per call
            self.fill_maps[op.name] = fill_tensormaps(op, key_path("$.ops", op.name))
        for tpath, launch_index, t, j in self.fill_maps[op.name]:
            ref = call.args.get(t.arg)
            if t.arg in seen or not isinstance(ref, Ref):
                continue  # a missing or non-pointer argument is reported by check_call
            seen.add(t.arg)
            target: Buffer | State | None
            if ref.form == "state":
                target = self.m.states.get(ref.name)
            elif ref.form == "buffer":
                target = self.m.buffers.get(ref.name)
            else:
                target = self.m.buffers.get(ref.name) or self.m.states.get(ref.name)
            if isinstance(target, State) and target.pooled:
                continue
            if isinstance(target, State):
                what = f"a {target.kind} state ({target.bytes} bytes)"
            elif isinstance(target, Buffer):
                what = "a buffer"
            elif ref.name in local:
                what = "a derive source (a staging buffer)"
            else:
                continue  # unknown target: reported by check_ref
            self.fault(key_path(path, t.arg),
                       f"op {op.name!r} launch {launch_index} maps argument {t.arg!r} with a fill dim "
                       f"({tpath}.dims[{j}] is 0), which spans the reserved range of a pooled (paged or per_seq) "
                       f"state; {ref.name!r} is {what}, whose size the manifest knows: pass a pooled state or "
                       "write the dim out")

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
                    if isinstance(w, LiteralWiring) and not I64_MIN <= w.value <= I64_MAX:
                        # a u64 literal past i64 (its own range is checked with the launch's literals)
                        self.fault(wpath, f"GEMM dimension {w.value} is past the signed 64-bit range cuBLASLt takes")
                        continue
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
        group must cover every point. A launch whose box equals the box of the launch just before it continues
        that launch (both apply together, in order): it is not a new member of any group.

        Cost: O(n^2 * k) for a group of n launches over k vars (each pair compared once; coverage kept as the
        sum of the disjoint boxes' sizes, a hole found by `first_hole`), never the product of the cuts."""
        group: list[tuple[int, dict[str, tuple[int, int]]]] = []
        covered = 0  # points of the var box inside the group's boxes, while they are disjoint
        overlapped = False  # an overlap was reported: sizes no longer add up, holes are not looked for

        def close() -> None:
            nonlocal covered, overlapped
            if group and not overlapped:
                hole = first_hole([box for _, box in group], self.domain(group[0][1]))
                if hole is not None:
                    first = index_path(key_path(path, "launches"), group[0][0])
                    idx = (", ".join(str(i) for i, _ in group) if len(group) <= 4
                           else f"{group[0][0]}..{group[-1][0]}")  # a group is a run of consecutive launches
                    self.fault(key_path(first, "when"), f"the 'when' ranges of launches {idx} leave {hole} uncovered; "
                                                        "every var value needs exactly one launch")
            group.clear()
            covered, overlapped = 0, False

        previous: dict[str, tuple[int, int]] | None = None  # the box of launch i - 1 (None: no `when` there)
        for i, launch in enumerate(op.launches):
            if launch.when is None:
                close()
                previous = None
                continue
            box = self.when_box(launch.when)
            if box is None:
                close()
                previous = None
                continue
            if box == previous:
                continue  # continues launch i - 1: one more launch of that alternative
            previous = box
            if group and set(group[0][1]) != set(box):
                close()
            # this launch is compared with the group so far (and the hole search at close costs as much again)
            if not self.afford_when(2 * (len(group) + 1) * len(box), key_path(index_path(key_path(path, "launches"), i),
                                                                             "when")):
                return
            for j, other in group:
                if all(max(box[v][0], other[v][0]) <= min(box[v][1], other[v][1]) for v in box):
                    at = ", ".join(f"{v}=[{max(box[v][0], other[v][0])}, {min(box[v][1], other[v][1])}]" for v in box)
                    self.fault(key_path(index_path(key_path(path, "launches"), i), "when"),
                               f"'when' overlaps launch {j} at {at}; ranges of one group must not overlap")
                    overlapped = True
                    break
            group.append((i, box))  # even when it overlaps: the group still closes once the sizes reach the box
            covered += _points(box)
            if covered >= _points(self.domain(box)):
                group.clear()
                covered, overlapped = 0, False
        close()

    def afford_when(self, work: int, path: str) -> bool:
        """Charge `work` box-var comparisons to the manifest's MAX_WHEN_WORK; False (with one fault, the first
        time) past it: the partition checks of the remaining launches are skipped, the manifest is refused."""
        spent = self.when_work
        self.when_work += work
        if self.when_work <= MAX_WHEN_WORK:
            return True
        if spent <= MAX_WHEN_WORK:
            self.fault(path, f"checking the 'when' partitions needs more than the {MAX_WHEN_WORK} range comparisons "
                             "the verifier makes for one manifest (a group of n launches over k vars costs about "
                             "2 n^2 k): use fewer launches per op or fewer vars per 'when'")
        return False

    def domain(self, box: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        """The var box of the vars `box` names: var -> (min, max)."""
        return {n: (self.m.vars[n].min, self.m.vars[n].max) for n in box}


def _points(box: Mapping[str, tuple[int, int]]) -> int:
    """Integer points of an inclusive box."""
    return math.prod(hi - lo + 1 for lo, hi in box.values())


def first_hole(boxes: list[dict[str, tuple[int, int]]], domain: dict[str, tuple[int, int]]) -> str | None:
    """A description of one sub-box of `domain` that no box covers ("tokens=2", "m=3..7, n=1"), or None when the
    boxes (pairwise disjoint, inside `domain`) cover it.

    Sweep var by var: cut the current var at every box boundary, take the first slab whose boxes (all spanning
    the slab) cover fewer points of the remaining vars than the slab holds, and go on inside it. O(k * n^2) for
    n boxes over k vars."""
    names = sorted(domain)
    region = dict(domain)
    live = boxes
    for k, n in enumerate(names):
        rest = names[k + 1:]
        need = math.prod(region[r][1] - region[r][0] + 1 for r in rest)
        lo, hi = region[n]
        cuts = sorted({lo, hi + 1} | {p for b in live for p in (b[n][0], b[n][1] + 1) if lo <= p <= hi + 1})
        for a, end in zip(cuts, cuts[1:]):
            inside = [b for b in live if b[n][0] <= a and end - 1 <= b[n][1]]
            if sum(math.prod(b[r][1] - b[r][0] + 1 for r in rest) for b in inside) < need:
                region[n], live = (a, end - 1), inside
                break
        else:
            return None
    return ", ".join(f"{n}={a}" if a == b else f"{n}={a}..{b}" for n, (a, b) in ((n, region[n]) for n in names))
