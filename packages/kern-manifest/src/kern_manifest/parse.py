"""JSON -> `Manifest`: checks JSON types and expression syntax only (`ManifestParseError`, first error,
with its path). Names, references, sizes and everything else cross-cutting are `verify()`'s job."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from .errors import ManifestParseError
from .expr import Expr
from .frozen import FrozenMap, freeze, index_path, key_path
from .jsontext import json_text_fault, json_value_bound
from .model import (
    ALGO_KEYS,
    Algo,
    ArgWiring,
    Buffer,
    BufferInit,
    Call,
    DerivedSegment,
    ErrorWord,
    ExprWiring,
    ExternLaunch,
    FLOAT_ENCODINGS,
    INT_ENCODINGS,
    InterleaveSegment,
    Launch,
    LiteralWiring,
    Manifest,
    Module,
    NullWiring,
    Op,
    OpArg,
    PeersOf,
    PackLiteralField,
    PackPointerField,
    PackTensorMapField,
    PackWiring,
    PagesOf,
    Program,
    ProgramCall,
    RankGroup,
    RankWiring,
    Ref,
    RowsSegment,
    ScratchWiring,
    Segment,
    State,
    TensorMap,
    TensorSegment,
    Topology,
    Var,
    Wiring,
)

_TYPE_NAMES = {"int": "an integer", "str": "a string", "bool": "a boolean", "number": "a number",
               "object": "an object", "array": "an array", "expr": "an integer or an expression string"}
_LITERAL_KEYS = (*INT_ENCODINGS, *FLOAT_ENCODINGS)


# Checked in this order: bool before int (a bool is an int in Python).
_JSON_TYPES = ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
               (list, "an array"), (dict, "an object"))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    for python_type, name in _JSON_TYPES:
        if isinstance(value, python_type):
            return name
    return type(value).__name__


def _check(value: Any, kind: str, path: str) -> Any:
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "str": isinstance(value, str),
        "bool": isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        "expr": isinstance(value, (int, str)) and not isinstance(value, bool),
    }[kind]
    if not ok:
        raise ManifestParseError(path, f"expected {_TYPE_NAMES[kind]}, got {_json_type(value)}")
    if isinstance(value, str):
        _unicode_text(value, path)
    if kind == "number" and not _finite_float(value):
        shown = f"an integer of {value.bit_length()} bits" if isinstance(value, int) else repr(value)
        raise ManifestParseError(path, f"expected a finite number (one a double holds), got {shown}")
    for key in value if kind == "object" else ():
        if not isinstance(key, str):
            raise ManifestParseError(path, f"object keys must be strings, got {key!r}")
        _unicode_text(key, path)
    return value


def _unicode_text(text: str, path: str) -> None:
    """Refuse a string UTF-8 cannot encode: a lone surrogate, which JSON's \\uD800 escapes decode to and which
    no output (the CLI's summary, `to_json` written as UTF-8) can carry."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ManifestParseError(path, f"a string holds a lone surrogate (U+{ord(text[exc.start]):04X} at index "
                                       f"{exc.start}): not Unicode text") from None


def _finite_float(value: int | float) -> bool:
    """Whether a JSON number is a finite double (an integer too large for one is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


# Free-form values (`meta`, unknown keys) may nest this deep; deeper is refused rather than left to Python's
# recursion limit.
MAX_FREE_DEPTH = 128
# JSON values (objects, arrays, scalars) one manifest may hold, counted before decoding (jsontext.json_value_bound):
# the Qwen3-4B manifest holds 9,108; 60 MiB of empty objects would otherwise decode into 21 M dicts (4 GB, minutes).
MAX_MANIFEST_VALUES = 1 << 20


def _plain_json(value: Any, path: str, depth: int = 0) -> None:
    """Reject values JSON cannot carry (NaN, infinities, tuples, ...) inside free-form `meta`, and nesting
    deeper than MAX_FREE_DEPTH."""
    if depth > MAX_FREE_DEPTH and isinstance(value, (dict, list)):
        raise ManifestParseError(path, f"nested deeper than {MAX_FREE_DEPTH} levels")
    if isinstance(value, dict):
        for k, v in _check(value, "object", path).items():
            _plain_json(v, key_path(path, k), depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _plain_json(v, index_path(path, i), depth + 1)
    elif isinstance(value, float):
        _check(value, "number", path)
    elif isinstance(value, str):
        _unicode_text(value, path)
    elif value is not None and not isinstance(value, (str, int, bool)):
        raise ManifestParseError(path, f"not a JSON value: {type(value).__name__}")


class _Obj:
    """A JSON object being read: typed access by key; unread keys become `extra`."""

    def __init__(self, value: Any, path: str) -> None:
        self.value: dict[str, Any] = _check(value, "object", path)
        self.path = path
        self.read: set[str] = set()

    def at(self, key: str) -> str:
        return key_path(self.path, key)

    def has(self, key: str) -> bool:
        return key in self.value

    def req(self, key: str, kind: str) -> Any:
        if key not in self.value:
            raise ManifestParseError(self.path, f"missing required key {key!r}")
        self.read.add(key)
        return _check(self.value[key], kind, self.at(key))

    def opt(self, key: str, kind: str, default: Any = None) -> Any:
        if key not in self.value:
            return default
        return self.req(key, kind)

    def expr(self, key: str) -> Expr:
        return Expr(self.req(key, "expr"), self.at(key))

    def opt_expr(self, key: str) -> Expr | None:
        return self.expr(key) if key in self.value else None

    def exprs(self, key: str) -> tuple[Expr, ...]:
        items = self.req(key, "array")
        return tuple(Expr(_check(v, "expr", index_path(self.at(key), i)), index_path(self.at(key), i))
                     for i, v in enumerate(items))

    def ints(self, key: str) -> tuple[int, ...]:
        items = self.req(key, "array")
        return tuple(_check(v, "int", index_path(self.at(key), i)) for i, v in enumerate(items))

    def extra(self) -> FrozenMap[str, Any]:
        rest = {k: v for k, v in self.value.items() if k not in self.read}
        for k, v in rest.items():
            _plain_json(v, self.at(k))
        return freeze(rest)

    def explicit(self) -> frozenset[str]:
        return frozenset(self.read)


def _named(value: Any, path: str) -> list[tuple[str, Any, str]]:
    return [(name, item, key_path(path, name)) for name, item in _check(value, "object", path).items()]


def _loads(text: str | bytes) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise ManifestParseError("$", f"duplicate key {key!r} in one JSON object")
            out[key] = value
        return out

    def constant(name: str) -> Any:
        raise ManifestParseError("$", f"{name} is not valid JSON")

    try:
        if not isinstance(text, str):  # JSON is UTF-8 (RFC 8259 section 8.1): no guessing UTF-16 or UTF-32
            text = bytes(text).decode("utf-8")
        values = json_value_bound(text)
        if values > MAX_MANIFEST_VALUES:
            raise ManifestParseError("$", f"holds up to {values} JSON values (counted from its commas and brackets); "
                                          f"a manifest may hold at most {MAX_MANIFEST_VALUES}")
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except (ValueError, RecursionError) as exc:  # invalid JSON or UTF-8, too deep, past the digit limit
        reason = json_text_fault(exc)
        if reason is None:
            raise
        if type(exc) is ValueError:  # an integer literal past Python's digit limit
            reason += "; no manifest number needs more than 20 digits"
        raise ManifestParseError("$", reason) from None


def parse_manifest(text_or_obj: str | bytes | Mapping[str, Any]) -> Manifest:
    """Parse a manifest from JSON text or an already-decoded JSON object. Checks JSON types and
    expression syntax only; call `verify()` (or use `load_manifest`) for consistency.
    Raises `ManifestParseError` (with `.path`) at the first malformed value."""
    raw = _loads(text_or_obj) if isinstance(text_or_obj, (str, bytes, bytearray)) else text_or_obj
    if isinstance(raw, Mapping) and not isinstance(raw, dict):
        raw = dict(raw)
    top = _Obj(raw, "$")
    fmt = top.req("format", "str")
    name = top.req("name", "str")
    meta = None
    if top.has("meta"):
        meta = top.value["meta"]
        top.read.add("meta")
        _check(meta, "object", top.at("meta"))
        _plain_json(meta, top.at("meta"))
        meta = freeze(meta)
    vars_ = FrozenMap({n: _var(n, v, p) for n, v, p in _named(top.req("vars", "object"), top.at("vars"))})
    modules = FrozenMap({n: Module(name=n, sha256=_check(v, "str", p))
                         for n, v, p in _named(top.req("modules", "object"), top.at("modules"))})
    buffers = FrozenMap({n: _buffer(n, v, p) for n, v, p in _named(top.req("buffers", "object"), top.at("buffers"))})
    states = FrozenMap({n: _state(n, v, p)
                        for n, v, p in _named(top.opt("states", "object", {}), top.at("states"))})
    ops = FrozenMap({n: _op(n, v, p) for n, v, p in _named(top.req("ops", "object"), top.at("ops"))})
    programs = FrozenMap({n: _program(n, v, p, ops)
                          for n, v, p in _named(top.req("programs", "object"), top.at("programs"))})
    groups = {}
    for n, v, p in _named(top.opt("topology", "object", {}), top.at("topology")):
        g = _Obj(v, p)
        groups[n] = RankGroup(name=n, size=g.req("size", "int"), extra=g.extra())
    digest = top.opt("digest", "str")
    explicit = top.explicit()
    return Manifest(format=fmt, name=name, meta=meta, vars=vars_, modules=modules, buffers=buffers, states=states,
                    ops=ops, programs=programs, topology=Topology(groups=FrozenMap(groups)), declared_digest=digest,
                    extra=top.extra(), explicit=explicit)


def _var(name: str, value: Any, path: str) -> Var:
    o = _Obj(value, path)
    return Var(name=name, min=o.req("min", "int"), max=o.req("max", "int"), extra=o.extra())


def _buffer(name: str, value: Any, path: str) -> Buffer:
    o = _Obj(value, path)
    kind = o.req("kind", "str")
    dtype = o.req("dtype", "str")
    shape = o.exprs("shape")
    placement = o.opt("placement", "str", "device")
    export = o.opt("export", "bool", False)
    bind = None
    if o.has("bind"):
        items = o.req("bind", "array")
        bind = tuple(_segment(v, index_path(o.at("bind"), i)) for i, v in enumerate(items))
    peers = None
    if o.has("peers"):
        po = _Obj(o.req("peers", "object"), o.at("peers"))
        peers = PeersOf(of=po.req("of", "str"), group=po.req("group", "str"), extra=po.extra())
    zero_each_run = o.opt("zero_each_run", "bool", False)
    error = None
    if o.has("error"):
        eo = _Obj(o.req("error", "object"), o.at("error"))
        codes = None
        if eo.has("codes"):
            codes = FrozenMap({c: _check(v, "str", p) for c, v, p in _named(eo.req("codes", "object"), eo.at("codes"))})
        error = ErrorWord(codes=codes, extra=eo.extra())
    init = None
    if o.has("init"):
        io = _Obj(o.req("init", "object"), o.at("init"))
        init = BufferInit(base64=io.req("base64", "str"), extra=io.extra())
    return Buffer(name=name, kind=kind, dtype=dtype, shape=shape, placement=placement, export=export, bind=bind,
                  peers=peers, zero_each_run=zero_each_run, error=error, init=init, extra=o.extra(),
                  explicit=o.explicit())


def _segment(value: Any, path: str) -> Segment:
    o = _Obj(value, path)
    kinds = [k for k in ("tensor", "interleave", "derived") if o.has(k)]
    if len(kinds) != 1:
        raise ManifestParseError(path, "a bind segment has exactly one of the keys 'tensor', 'interleave', "
                                       f"'derived' (found {kinds or 'none'})")
    shape = o.ints("shape") if o.has("shape") else None
    if kinds[0] == "derived":
        return DerivedSegment(derived=o.req("derived", "bool"), extra=o.extra())
    if kinds[0] == "interleave":
        tensors = tuple(_check(t, "str", index_path(o.at("interleave"), i))
                        for i, t in enumerate(o.req("interleave", "array")))
        return InterleaveSegment(tensors=tensors, rows=o.req("rows", "int"), shape=shape, extra=o.extra())
    tensor = o.req("tensor", "str")
    cols = None
    if o.has("cols"):
        cols = o.ints("cols")
        if len(cols) != 2:
            raise ManifestParseError(o.at("cols"), f"expected [start, stop], got {len(cols)} values")
    if not o.has("rows"):
        return TensorSegment(tensor=tensor, shape=shape, cols=cols, extra=o.extra())
    rows = o.ints("rows")
    if len(rows) != 2:
        raise ManifestParseError(o.at("rows"), f"expected [start, stop], got {len(rows)} values")
    return RowsSegment(tensor=tensor, start=rows[0], stop=rows[1], shape=shape, cols=cols, extra=o.extra())


def _state(name: str, value: Any, path: str) -> State:
    o = _Obj(value, path)
    fields = {k: o.opt(k, "int") for k in ("bytes", "bytes_per_token", "page_tokens", "bytes_per_seq")}
    return State(name=name, kind=o.req("kind", "str"), **fields, extra=o.extra())


def _op(name: str, value: Any, path: str) -> Op:
    o = _Obj(value, path)
    args = []
    for i, a in enumerate(o.req("args", "array")):
        ao = _Obj(a, index_path(o.at("args"), i))
        args.append(OpArg(name=ao.req("name", "str"), kind=ao.req("kind", "str"), extra=ao.extra()))
    scratch = FrozenMap()
    if o.has("scratch"):
        scratch = FrozenMap({n: Expr(_check(v, "expr", p), p) for n, v, p in _named(o.req("scratch", "object"),
                                                                                      o.at("scratch"))})
    launches = tuple(_launch(v, index_path(o.at("launches"), i)) for i, v in enumerate(o.req("launches", "array")))
    return Op(name=name, args=tuple(args), scratch=scratch, launches=launches, extra=o.extra(), explicit=o.explicit())


def _when(o: _Obj) -> FrozenMap[str, tuple[Expr, Expr]] | None:
    if not o.has("when"):
        return None
    out = {}
    for var, bounds, p in _named(o.req("when", "object"), o.at("when")):
        _check(bounds, "array", p)
        if len(bounds) != 2:
            raise ManifestParseError(p, f"expected [lo, hi], got {len(bounds)} values")
        out[var] = (Expr(_check(bounds[0], "expr", p + "[0]"), p + "[0]"),
                    Expr(_check(bounds[1], "expr", p + "[1]"), p + "[1]"))
    return FrozenMap(out)


def _launch(value: Any, path: str) -> Launch | ExternLaunch:
    o = _Obj(value, path)
    args = tuple(_wiring(v, index_path(o.at("args"), i)) for i, v in enumerate(o.req("args", "array")))
    if o.has("extern"):
        extern = o.req("extern", "str")
        algo = None
        if o.has("algo"):
            ao = _Obj(o.req("algo", "object"), o.at("algo"))
            algo = Algo(id=ao.req("id", "int"), **{k: ao.opt(k, "int") for k in ALGO_KEYS[1:]}, extra=ao.extra())
        return ExternLaunch(extern=extern, args=args, algo=algo, when=_when(o), extra=o.extra())
    module = o.req("module", "str")
    entry = o.req("entry", "str")
    grid = o.exprs("grid")
    block = o.exprs("block")
    shared_mem = o.expr("shared_mem") if o.has("shared_mem") else Expr(0)
    cluster = o.exprs("cluster") if o.has("cluster") else None
    pdl = o.opt("pdl", "bool", False)
    cooperative = o.opt("cooperative", "bool", False)
    carveout = o.opt("carveout", "int")
    params = []
    for i, p in enumerate(o.req("params", "array")):
        pp = index_path(o.at("params"), i)
        _check(p, "array", pp)
        if len(p) != 2:
            raise ManifestParseError(pp, f"expected [offset, size] in bytes, got {len(p)} values")
        params.append((_check(p[0], "int", pp + "[0]"), _check(p[1], "int", pp + "[1]")))
    return Launch(module=module, entry=entry, grid=grid, block=block, shared_mem=shared_mem, cluster=cluster, pdl=pdl,
                  cooperative=cooperative, carveout=carveout, params=tuple(params), args=args, when=_when(o), extra=o.extra(),
                  explicit=o.explicit())


def _literal(o: _Obj, key: str) -> int | float:
    return o.req(key, "int" if key in INT_ENCODINGS else "number")


def _wiring(value: Any, path: str) -> Wiring:
    o = _Obj(value, path)
    kinds = [k for k in ("arg", "scratch", "expr", "rank", "null", "pack", *_LITERAL_KEYS) if o.has(k)]
    if len(kinds) != 1:
        raise ManifestParseError(path, "a wiring has exactly one of the keys arg, scratch, expr, rank, null, pack, "
                                       f"i32, u32, i64, u64, f32, f64 (found {kinds or 'none'})")
    kind = kinds[0]
    if kind == "arg":
        return ArgWiring(arg=o.req("arg", "str"), offset=o.opt_expr("offset"), type=o.opt("type", "str"),
                         extra=o.extra())
    if kind == "scratch":
        return ScratchWiring(scratch=o.req("scratch", "str"), offset=o.opt_expr("offset"), extra=o.extra())
    if kind == "expr":
        return ExprWiring(expr=o.expr("expr"), type=o.opt("type", "str"), extra=o.extra())
    if kind == "rank":
        return RankWiring(rank=o.req("rank", "str"), type=o.opt("type", "str"), extra=o.extra())
    if kind == "null":
        return NullWiring(nbytes=o.req("null", "int"), extra=o.extra())
    if kind == "pack":
        po = _Obj(o.req("pack", "object"), o.at("pack"))
        size = po.req("size", "int")
        fields = tuple(_pack_field(v, index_path(po.at("fields"), i)) for i, v in enumerate(po.req("fields", "array")))
        return PackWiring(size=size, fields=fields, extra=o.extra(), pack_extra=po.extra())
    return LiteralWiring(type=kind, value=_literal(o, kind), extra=o.extra())


def _pack_field(value: Any, path: str):  # -> PackField
    o = _Obj(value, path)
    offset = o.req("offset", "int")
    kinds = [k for k in ("tensormap", "arg", *_LITERAL_KEYS) if o.has(k)]
    if len(kinds) != 1:
        raise ManifestParseError(path, "a pack field has 'offset' and exactly one of tensormap, arg, i32, u32, i64, "
                                       f"u64, f32, f64 (found {kinds or 'none'})")
    kind = kinds[0]
    if kind == "arg":
        return PackPointerField(offset=offset, arg=o.req("arg", "str"), extra=o.extra())
    if kind != "tensormap":
        return PackLiteralField(offset=offset, type=kind, value=_literal(o, kind), extra=o.extra())
    t = _Obj(o.req("tensormap", "object"), o.at("tensormap"))
    enums = {}
    for key in ("interleave", "swizzle", "l2_promotion", "oob_fill"):
        if t.has(key):
            v = t.req(key, "expr")  # a string or an integer, passed through
            enums[key] = v
    tm = TensorMap(arg=t.req("arg", "str"), dtype=t.req("dtype", "str"), dims=t.exprs("dims"), strides=t.exprs("strides"),
                   box=t.ints("box"), offset=t.opt_expr("offset"),
                   elem_strides=t.ints("elem_strides") if t.has("elem_strides") else None, **enums, extra=t.extra())
    return PackTensorMapField(offset=offset, tensormap=tm, extra=o.extra())


def _call_arg(value: Any, path: str, kind: str | None) -> Ref | Expr | PagesOf:
    """A call argument: for a known `ptr` arg a buffer/state reference, for a known `int` arg an
    expression or `{"pages_of": state}`; for an unknown arg (a verify fault) whatever the JSON shape
    suggests. A `pages_of` object given to a `ptr` arg parses as `PagesOf` so the verifier names it."""
    if isinstance(value, dict) and "pages_of" in value and not any(k in value for k in ("buffer", "state")):
        o = _Obj(value, path)
        return PagesOf(state=o.req("pages_of", "str"), extra=o.extra())
    if kind == "int" and isinstance(value, dict):
        raise ManifestParseError(path, "an int argument is an integer, an expression string or "
                                       f"{{\"pages_of\": state}}; found an object with keys {sorted(value)}")
    if kind == "int" or (kind is None and isinstance(value, int) and not isinstance(value, bool)):
        return Expr(_check(value, "expr", path), path)
    if isinstance(value, str):
        return Ref(name=value)
    o = _Obj(value, path)
    forms = [k for k in ("buffer", "state") if o.has(k)]
    if len(forms) != 1:
        raise ManifestParseError(path, "a ptr argument is a buffer or state name, or an object with exactly one of "
                                       f"'buffer', 'state' (and optionally 'offset'); found {forms or 'neither'}")
    return Ref(name=o.req(forms[0], "str"), offset=o.opt_expr("offset"), form=forms[0], extra=o.extra())


def _program(name: str, value: Any, path: str, ops: Mapping[str, Op]) -> Program:
    o = _Obj(value, path)
    kind = o.opt("kind", "str", "run")
    graph = o.opt("graph", "bool", False)
    sources = None
    if o.has("sources"):
        sources = FrozenMap({n: _check(v, "str", p) for n, v, p in _named(o.req("sources", "object"), o.at("sources"))})
    calls: list[Call | ProgramCall] = []
    for i, c in enumerate(o.req("calls", "array")):
        cp = index_path(o.at("calls"), i)
        co = _Obj(c, cp)
        if co.has("program") and not co.has("op"):
            calls.append(ProgramCall(program=co.req("program", "str"), extra=co.extra()))
            continue
        op_name = co.req("op", "str")
        op = ops.get(op_name)
        args = {}
        for arg_name, v, ap in _named(co.req("args", "object"), co.at("args")):
            op_arg = op.arg(arg_name) if op is not None else None
            kind_of = op_arg.kind if op_arg is not None and op_arg.kind in ("ptr", "int") else None
            args[arg_name] = _call_arg(v, ap, kind_of)
        calls.append(Call(op=op_name, args=FrozenMap(args), extra=co.extra()))
    return Program(name=name, kind=kind, graph=graph, sources=sources, calls=tuple(calls), extra=o.extra(),
                   explicit=o.explicit())
