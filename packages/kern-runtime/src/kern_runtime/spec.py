"""The runtime's view of a manifest: frozen dataclasses built from the kern-manifest/1 JSON.

The runtime reads the JSON contract of docs/manifest.md (after kern_manifest has verified it) into
the small structures below, with every expression compiled once. This module is the only place that
knows the JSON spelling; everything after it works on these dataclasses. Facts the verifier owns
(names resolve, binds tile, `when` ranges partition) are trusted here; what would still be a
generator bug surfaces as `ManifestError` with the JSON path.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from kern_manifest import Expr

from .dtypes import item_bytes
from .errors import ManifestError

INT_TYPES: dict[str, int] = {"i32": 4, "u32": 4, "i64": 8, "u64": 8}
LITERAL_TYPES: dict[str, int] = {"i32": 4, "u32": 4, "i64": 8, "u64": 8, "f32": 4, "f64": 8}


@dataclass(frozen=True)
class VarSpec:
    name: str
    min: int
    max: int


# ---------------------------------------------------------------- buffers and binds


@dataclass(frozen=True)
class TensorSegment:
    """Rows `[rows[0], rows[1])` of checkpoint tensor `tensor` (rows None: the whole tensor)."""

    tensor: str
    rows: tuple[int, int] | None = None
    shape: tuple[int, ...] | None = None  # the tensor's shape as the manifest declares it
    cols: tuple[int, int] | None = None  # column range of a 2-D tensor (tensor-parallel slices)


@dataclass(frozen=True)
class InterleaveSegment:
    """Blocks of `rows_each` rows taken from each of `tensors` in turn until they are exhausted."""

    tensors: tuple[str, ...]
    rows_each: int


@dataclass(frozen=True)
class DerivedSegment:
    """The whole buffer is filled by a `once` or `derive` program."""


Segment = TensorSegment | InterleaveSegment | DerivedSegment


@dataclass(frozen=True)
class BufferSpec:
    """A buffer. `shape` is a tuple of expressions; the allocation is at every var's max."""

    name: str
    kind: str  # input | output | workspace | weight | scratch
    dtype: str
    shape: tuple[Expr, ...]
    placement: str = "device"  # device | host
    export: bool = False
    bind: tuple[Segment, ...] | None = None
    peers: tuple[str, str] | None = None  # (of, group): this buffer is the peer table of `of` in `group`

    def shape_at(self, values: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(dim.eval(values) for dim in self.shape)

    def nbytes_at(self, values: Mapping[str, int]) -> int:
        return math.prod(self.shape_at(values)) * item_bytes(self.dtype)

    @property
    def derived(self) -> bool:
        return self.bind is not None and any(isinstance(s, DerivedSegment) for s in self.bind)


@dataclass(frozen=True)
class StateSpec:
    """A state. `kind` fixed (nbytes), paged (bytes_per_token, page_tokens) or per_seq (bytes_per_seq)."""

    name: str
    kind: str
    nbytes: int = 0
    bytes_per_token: int = 0
    page_tokens: int = 0
    bytes_per_seq: int = 0

    @property
    def pooled(self) -> bool:
        return self.kind in ("paged", "per_seq")


# ---------------------------------------------------------------- wirings


@dataclass(frozen=True)
class ArgWiring:
    """Forward interface argument `arg`: a pointer (+ byte `offset`) or an int encoded as `type`."""

    arg: str
    offset: Expr | None = None
    type: str | None = None


@dataclass(frozen=True)
class ScratchWiring:
    """Pointer to this op's scratch `scratch` plus byte `offset` (within the scratch size)."""

    scratch: str
    offset: Expr | None = None


@dataclass(frozen=True)
class LiteralWiring:
    type: str  # i32 u32 i64 u64 f32 f64
    value: int | float


@dataclass(frozen=True)
class ExprWiring:
    expr: Expr
    type: str


@dataclass(frozen=True)
class RankWiring:
    group: str
    type: str


@dataclass(frozen=True)
class NullWiring:
    nbytes: int


@dataclass(frozen=True)
class PackField:
    """One field of a pack: at byte `offset`, either a tensormap dict, a pointer arg or a literal."""

    offset: int
    kind: str  # tensormap | arg | literal
    arg: str | None = None
    type: str | None = None
    value: int | float | Expr | None = None
    tensormap: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class PackWiring:
    nbytes: int
    fields: tuple[PackField, ...]


Wiring = ArgWiring | ScratchWiring | LiteralWiring | ExprWiring | RankWiring | NullWiring | PackWiring


def wiring_bytes(wiring: Wiring) -> int | None:
    """Byte size a wiring occupies in the parameter block (None: an ArgWiring whose size depends on
    the interface argument kind: 8 for ptr, the type's size for int)."""
    if isinstance(wiring, ArgWiring):
        return INT_TYPES[wiring.type] if wiring.type else 8
    if isinstance(wiring, ScratchWiring):
        return 8
    if isinstance(wiring, LiteralWiring):
        return LITERAL_TYPES[wiring.type]
    if isinstance(wiring, (ExprWiring, RankWiring)):
        return INT_TYPES[wiring.type]
    if isinstance(wiring, NullWiring):
        return wiring.nbytes
    return wiring.nbytes


# ---------------------------------------------------------------- ops and programs


@dataclass(frozen=True)
class KernelLaunch:
    module: str
    entry: str
    grid: tuple[Expr, Expr, Expr]
    block: tuple[Expr, Expr, Expr]
    shared_mem: Expr
    params: tuple[tuple[int, int], ...]
    args: tuple[Wiring, ...]
    cluster: tuple[Expr, Expr, Expr] | None = None
    pdl: bool = False
    carveout: int | None = None  # preferred shared-memory carveout, percent 0..100 (a property of the function)
    when: tuple[tuple[str, Expr, Expr], ...] = ()
    path: str = ""


@dataclass(frozen=True)
class ExternLaunch:
    extern: str  # e.g. "cublaslt_bf16_tn" (the "extern:" prefix removed)
    args: tuple[Wiring, ...]
    algo: Mapping[str, int] | None = None
    when: tuple[tuple[str, Expr, Expr], ...] = ()
    path: str = ""


Launch = KernelLaunch | ExternLaunch


@dataclass(frozen=True)
class OpSpec:
    name: str
    args: tuple[tuple[str, str], ...]  # (name, kind ptr|int)
    scratch: tuple[tuple[str, Expr], ...]
    launches: tuple[Launch, ...]

    def arg_kind(self, name: str) -> str | None:
        for arg_name, kind in self.args:
            if arg_name == name:
                return kind
        return None


@dataclass(frozen=True)
class PtrArg:
    """A call's pointer argument: buffer, state or derive source `target`, plus byte `offset`."""

    target: str
    offset: Expr | None = None


@dataclass(frozen=True)
class IntArg:
    expr: Expr


@dataclass(frozen=True)
class PagesArg:
    """A call's `{"pages_of": state}` int argument: the page count of paged state `state`'s reserved
    range, a constant the records resolve once at load (`AddressBook.pages`)."""

    state: str


CallArg = PtrArg | IntArg | PagesArg


@dataclass(frozen=True)
class CallSpec:
    op: str
    args: Mapping[str, CallArg]
    path: str = ""


@dataclass(frozen=True)
class ProgramSpec:
    name: str
    kind: str  # run | once | derive
    graph: bool
    calls: tuple[CallSpec, ...]  # inlined programs flattened
    sources: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Spec:
    """The whole manifest as the runtime uses it."""

    name: str
    vars: Mapping[str, VarSpec]
    modules: Mapping[str, str]  # module -> sha256 hex
    buffers: Mapping[str, BufferSpec]
    states: Mapping[str, StateSpec]
    ops: Mapping[str, OpSpec]
    programs: Mapping[str, ProgramSpec]
    topology: Mapping[str, int]
    digest: str
    raw: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @property
    def family_digest(self) -> str:
        """kern_manifest's `Manifest.family_digest`: what every rank of a group must agree on."""
        from kern_manifest import family_digest_of

        return family_digest_of(self.raw)

    @property
    def max_values(self) -> dict[str, int]:
        return {name: var.max for name, var in self.vars.items()}

    @property
    def min_values(self) -> dict[str, int]:
        return {name: var.min for name, var in self.vars.items()}


# ---------------------------------------------------------------- parsing


def manifest_digest(raw: Mapping[str, Any]) -> str:
    """sha256 of the canonical form (docs/manifest.md "Digest")."""
    body = {k: v for k, v in raw.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _expr(value: Any, path: str) -> Expr:
    """kern_manifest's expression (raises kern_manifest.ManifestParseError on bad syntax)."""
    return value if isinstance(value, Expr) else Expr(value, "$." + path)


def _triple(value: Any, path: str) -> tuple[Expr, Expr, Expr]:
    if not isinstance(value, list) or len(value) != 3:
        raise ManifestError(f"{path}: expected 3 expressions, got {value!r}")
    return tuple(_expr(v, f"{path}[{i}]") for i, v in enumerate(value))  # type: ignore[return-value]


def _segment(seg: Mapping[str, Any], path: str) -> Segment:
    if seg.get("derived"):
        return DerivedSegment()
    if "interleave" in seg:
        return InterleaveSegment(tuple(seg["interleave"]), int(seg["rows"]))
    if "tensor" in seg:
        rows = seg.get("rows")
        shape = tuple(int(d) for d in seg["shape"]) if seg.get("shape") is not None else None
        cols = seg.get("cols")
        return TensorSegment(seg["tensor"], (int(rows[0]), int(rows[1])) if rows is not None else None, shape,
                             (int(cols[0]), int(cols[1])) if cols is not None else None)
    raise ManifestError(f"{path}: unknown bind segment {dict(seg)!r}")


def _wiring(w: Mapping[str, Any], path: str) -> Wiring:
    if "arg" in w:
        offset = _expr(w["offset"], f"{path}.offset") if "offset" in w else None
        wtype = w.get("type")
        if wtype is not None and wtype not in INT_TYPES:
            raise ManifestError(f"{path}.type: {wtype!r} is not one of {sorted(INT_TYPES)}")
        return ArgWiring(w["arg"], offset, wtype)
    if "scratch" in w:
        offset = _expr(w["offset"], f"{path}.offset") if "offset" in w else None
        return ScratchWiring(w["scratch"], offset)
    if "expr" in w:
        return ExprWiring(_expr(w["expr"], f"{path}.expr"), w.get("type", "i32"))
    if "rank" in w:
        return RankWiring(w["rank"], w.get("type", "i32"))
    if "null" in w:
        return NullWiring(int(w["null"]))
    if "pack" in w:
        pack = w["pack"]
        fields = []
        for i, f in enumerate(pack.get("fields", [])):
            fpath = f"{path}.pack.fields[{i}]"
            if "tensormap" in f:
                fields.append(PackField(int(f["offset"]), "tensormap", tensormap=f["tensormap"]))
            elif "arg" in f:
                fields.append(PackField(int(f["offset"]), "arg", arg=f["arg"]))
            else:
                lit = [k for k in LITERAL_TYPES if k in f]
                if len(lit) != 1:
                    raise ManifestError(f"{fpath}: expected tensormap, arg or one literal, got {dict(f)!r}")
                value = f[lit[0]]
                # An integer literal stays a Python int, encoded per its type when the pack is built (a
                # u64 above 2**63 - 1 is valid; an Expr would refuse it as outside the signed range).
                if lit[0] not in ("f32", "f64") and type(value) is not int:
                    value = _expr(value, f"{fpath}.{lit[0]}")
                fields.append(PackField(int(f["offset"]), "literal", type=lit[0], value=value))
        return PackWiring(int(pack["size"]), tuple(fields))
    lit = [k for k in LITERAL_TYPES if k in w]
    if len(lit) == 1:
        return LiteralWiring(lit[0], w[lit[0]])
    raise ManifestError(f"{path}: unknown wiring {dict(w)!r}")


def _when(when: Mapping[str, Any] | None, path: str) -> tuple[tuple[str, Expr, Expr], ...]:
    if not when:
        return ()
    out = []
    for var, rng in sorted(when.items()):
        if not isinstance(rng, list) or len(rng) != 2:
            raise ManifestError(f"{path}.{var}: expected [lo, hi], got {rng!r}")
        out.append((var, _expr(rng[0], f"{path}.{var}[0]"), _expr(rng[1], f"{path}.{var}[1]")))
    return tuple(out)


def _launch(launch: Mapping[str, Any], path: str) -> Launch:
    args = tuple(_wiring(w, f"{path}.args[{i}]") for i, w in enumerate(launch.get("args", [])))
    when = _when(launch.get("when"), f"{path}.when")
    if "extern" in launch:
        name = str(launch["extern"]).removeprefix("extern:")
        algo = launch.get("algo")
        return ExternLaunch(name, args, dict(algo) if algo is not None else None, when, path)
    params = tuple((int(o), int(s)) for o, s in launch["params"])
    cluster = launch.get("cluster")
    carveout = launch.get("carveout")
    if carveout is not None and (type(carveout) is not int or not 0 <= carveout <= 100):
        raise ManifestError(f"{path}.carveout: expected an integer percent in [0, 100], got {carveout!r}")
    return KernelLaunch(
        module=launch["module"], entry=launch["entry"],
        grid=_triple(launch["grid"], f"{path}.grid"), block=_triple(launch["block"], f"{path}.block"),
        shared_mem=_expr(launch.get("shared_mem", 0), f"{path}.shared_mem"),
        params=params, args=args,
        cluster=_triple(cluster, f"{path}.cluster") if cluster is not None else None,
        pdl=bool(launch.get("pdl", False)), carveout=carveout, when=when, path=path,
    )


def _call_args(op: OpSpec, args: Mapping[str, Any], path: str) -> dict[str, CallArg]:
    out: dict[str, CallArg] = {}
    for name, kind in op.args:
        if name not in args:
            raise ManifestError(f"{path}.args: missing argument {name!r} of op {op.name!r}")
        value = args[name]
        if kind == "ptr":
            if isinstance(value, str):
                out[name] = PtrArg(value)
            elif isinstance(value, Mapping):
                target = value.get("buffer", value.get("state"))
                offset = value.get("offset")
                out[name] = PtrArg(target, _expr(offset, f"{path}.args.{name}.offset") if offset is not None else None)
            else:
                raise ManifestError(f"{path}.args.{name}: expected a buffer/state name or {{buffer, offset}}")
        elif isinstance(value, Mapping):
            if set(value) != {"pages_of"} or not isinstance(value["pages_of"], str):
                raise ManifestError(f"{path}.args.{name}: expected an expression or {{\"pages_of\": state}}, "
                                    f"got {dict(value)!r}")
            out[name] = PagesArg(value["pages_of"])
        else:
            out[name] = IntArg(_expr(value, f"{path}.args.{name}"))
    return out


def _flatten(name: str, raw_programs: Mapping[str, Any], ops: Mapping[str, OpSpec], stack: tuple[str, ...]) -> list[CallSpec]:
    """The op calls of program `name`, inlined programs expanded with an explicit stack (a verified manifest's
    chain of inlined programs may be longer than Python's recursion limit; its expansion is at most
    kern_manifest's MAX_PROGRAM_CALLS)."""
    calls: list[CallSpec] = []
    frames = [(name, iter(enumerate(raw_programs[name].get("calls", []))))]
    names = [*stack, name]
    while frames:
        current, items = frames[-1]
        i, call = next(items, (None, None))
        if call is None:
            frames.pop()
            names.pop()
            continue
        if "program" in call:
            if call["program"] in names:
                raise ManifestError(f"programs.{call['program']}: inline cycle {' -> '.join((*names, call['program']))}")
            frames.append((call["program"], iter(enumerate(raw_programs[call["program"]].get("calls", [])))))
            names.append(call["program"])
            continue
        path = f"programs.{current}.calls[{i}]"
        op = ops.get(call["op"])
        if op is None:
            raise ManifestError(f"{path}.op: unknown op {call['op']!r}")
        calls.append(CallSpec(op.name, _call_args(op, call.get("args", {}), path), path))
    return calls


def spec_from_json(raw: Mapping[str, Any]) -> Spec:
    """Build the runtime's `Spec` from a verified kern-manifest/1 JSON object.

    Raises ManifestError (with the JSON path) for a shape the verifier should have rejected.
    """
    try:
        vars_ = {n: VarSpec(n, int(v["min"]), int(v["max"])) for n, v in raw["vars"].items()}
        buffers = {}
        for name, b in raw["buffers"].items():
            path = f"buffers.{name}"
            bind = None
            if "bind" in b:
                bind = tuple(_segment(s, f"{path}.bind[{i}]") for i, s in enumerate(b["bind"]))
            buffers[name] = BufferSpec(
                name, b["kind"], b["dtype"], tuple(_expr(d, f"{path}.shape[{i}]") for i, d in enumerate(b["shape"])),
                b.get("placement", "device"), bool(b.get("export", False)), bind,
                (b["peers"]["of"], b["peers"]["group"]) if b.get("peers") is not None else None,
            )
        states = {}
        for name, s in raw.get("states", {}).items():
            kind = s["kind"]
            states[name] = StateSpec(
                name, kind, nbytes=int(s.get("bytes", 0)), bytes_per_token=int(s.get("bytes_per_token", 0)),
                page_tokens=int(s.get("page_tokens", 0)), bytes_per_seq=int(s.get("bytes_per_seq", 0)),
            )
        ops = {}
        for name, o in raw["ops"].items():
            path = f"ops.{name}"
            args = tuple((a["name"], a.get("kind", "ptr")) for a in o.get("args", []))
            scratch = tuple((k, _expr(v, f"{path}.scratch.{k}")) for k, v in o.get("scratch", {}).items())
            launches = tuple(_launch(l, f"{path}.launches[{i}]") for i, l in enumerate(o.get("launches", [])))
            ops[name] = OpSpec(name, args, scratch, launches)
        raw_programs = raw["programs"]
        programs = {}
        for name, p in raw_programs.items():
            programs[name] = ProgramSpec(
                name, p.get("kind", "run"), bool(p.get("graph", False)),
                tuple(_flatten(name, raw_programs, ops, ())), dict(p.get("sources", {})),
            )
        topology = {g: int(t["size"]) for g, t in raw.get("topology", {}).items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"manifest does not have the kern-manifest/1 shape: {type(exc).__name__}: {exc}") from exc
    return Spec(
        name=str(raw.get("name", "")), vars=vars_, modules=dict(raw["modules"]), buffers=buffers,
        states=states, ops=ops, programs=programs, topology=topology, digest=manifest_digest(raw), raw=raw,
    )
