"""Launch records: a program's calls compiled, once, into what replay needs.

For each call of a program and each launch of the call's op, `compile_program` builds a record:

- `KernelRecord`: the resolved CUfunction, a `ParamBlock` with every constant parameter already
  staged, and the list of parameters that depend on vars (`dynamic`), re-encoded by `patch(values)`
  only when the var values change. Grid, block, shared memory and cluster dims are expressions
  evaluated by `patch` as well.
- `ExternRecord`: a built-in op (cuBLASLt GEMM, NCCL collective) with its arguments resolved to
  integers (pointers and sizes) by `patch`.

Pointers resolve as `base(target) + call offset + wiring offset` where targets are buffers, states
and derive sources (`AddressBook`); a `{"pages_of": state}` int argument resolves to the page count
of the state's reserved range (`AddressBook.pages`), a constant staged once like a literal. A pack's
tensor map with a fill dim (outermost dim 0, over a pooled state) is encoded with that dim resolved to
the whole outermost rows in the state's reserved range (`AddressBook.reserve`), also once.
Records read kern_manifest's model directly (`Launch`, `ExternLaunch`, `Call`); what a record needs beyond
it (the JSON path of its launch, a `when` as triples, the pinned algorithm as a mapping) is computed once
when it is compiled. Everything here is pure Python over integers: the CPU tests build records against
fake addresses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from kern_manifest import (
    ArgWiring,
    Call,
    Expr,
    ExprWiring,
    ExternLaunch,
    Launch,
    LiteralWiring,
    Manifest,
    NullWiring,
    Op,
    PackLiteralField,
    PackPointerField,
    PackTensorMapField,
    PackWiring,
    PagesOf,
    RankWiring,
    Ref,
    ScratchWiring,
    Wiring,
    encoding_size,
)

from ..cuda.tensormaps import fill_dim, resolve_fill
from ..errors import ApiError, ManifestError
from .params import INT_RANGES, ParamBlock, encode_pointer, encode_scalar

Values = Mapping[str, int]
When = tuple[tuple[str, Expr, Expr], ...]
"""A launch's `when` as `(var, lo, hi)` triples, sorted by var (empty: always active)."""
ValueFn = Callable[[Values], Any]
TensorMapEncoder = Callable[[int, Mapping[str, Any], Values], bytes]
"""(global address, the tensormap field's JSON, var values) -> 128 bytes of a CUtensorMap."""

EXTERN_ARITY: dict[str, tuple[int, int]] = {
    "cublaslt_bf16_tn": (6, 8), "cublaslt_bf16_tn_acc": (6, 8), "cublas_bf16_tn_f32": (6, 7),
    "cublaslt_fp8_tn": (8, 9), "cublaslt_fp8_tn_f32": (8, 9),
}
NCCL_EXTERNS = frozenset(
    f"nccl_{coll}_{dt}" for coll in ("allreduce", "allgather", "reducescatter", "alltoall") for dt in ("f32", "bf16")
)


@dataclass(frozen=True)
class AddressBook:
    """Where names live. `targets`: buffer / state / derive-source name -> base address;
    `scratch`: (op, scratch name) -> address; `ranks`: topology group -> this process's index;
    `pages`: paged state -> pages in its reserved virtual range (`PoolLayout.reserved_pages`);
    `reserve`: pooled (paged or per-seq) state -> bytes of its reserved virtual range
    (`PoolLayout.reserve_bytes`), what a tensor map's fill dim spans."""

    targets: Mapping[str, int]
    scratch: Mapping[tuple[str, str], int] = field(default_factory=dict)
    ranks: Mapping[str, int] = field(default_factory=dict)
    pages: Mapping[str, int] = field(default_factory=dict)
    reserve: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Resolved:
    """A wiring resolved in its call: `fn(values)` gives the value; `reads` the vars it needs.
    `kind`: ptr (int address) | int | float | bytes."""

    kind: str
    fn: ValueFn
    reads: frozenset[str]

    @property
    def constant(self) -> bool:
        return not self.reads


def _const(kind: str, value: Any) -> Resolved:
    return Resolved(kind, lambda v: value, frozenset())


def _plus(base: int, *offsets: Expr | None) -> Resolved:
    exprs = [o for o in offsets if o is not None]
    reads = frozenset().union(*(e.vars for e in exprs)) if exprs else frozenset()
    if not reads:
        total = base + sum(e.eval({}) for e in exprs)
        return _const("ptr", total)
    return Resolved("ptr", lambda v: base + sum(e.eval(v) for e in exprs), reads)


def _expr_value(expr: Expr, kind: str = "int") -> Resolved:
    if not expr.vars:
        return _const(kind, expr.eval({}))
    return Resolved(kind, expr.eval, expr.vars)


def launch_path(op: str, index: int) -> str:
    """JSON path of launch `index` of op `op` (`ops.OP.launches[i]`), the place every load error names."""
    return f"ops.{op}.launches[{index}]"


def when_of(launch: Launch | ExternLaunch) -> When:
    """`launch.when` as sorted `(var, lo, hi)` triples (empty when it has none)."""
    return tuple((var, lo, hi) for var, (lo, hi) in sorted((launch.when or {}).items()))


@dataclass(frozen=True)
class CallSite:
    """A call where a program runs it: the call, its JSON path, its op."""

    call: Call
    path: str
    op: Op


def resolve_pointer_arg(name: str, site: CallSite, book: AddressBook, offset: Expr | None) -> Resolved:
    """Pointer interface argument `name` of the call plus wiring `offset`. Raises ManifestError."""
    arg = site.call.args.get(name)
    if not isinstance(arg, Ref):
        raise ManifestError(f"{site.path}.args.{name}: op {site.op.name!r} wires it as a pointer, but the call gives "
                            f"{arg!r}")
    base = book.targets.get(arg.name)
    if base is None:
        raise ManifestError(f"{site.path}.args.{name}: {arg.name!r} is not a buffer, state or source")
    return _plus(base, arg.offset, offset)


def resolve_wiring(wiring: Wiring, site: CallSite, book: AddressBook, encoder: TensorMapEncoder | None,
                   path: str) -> Resolved:
    """Resolve one launch wiring in the call. Raises ManifestError for a wiring that cannot apply."""
    op = site.op
    if isinstance(wiring, ArgWiring):
        spec = op.arg(wiring.arg)
        if spec is not None and spec.kind == "ptr":
            return resolve_pointer_arg(wiring.arg, site, book, wiring.offset)
        arg = site.call.args.get(wiring.arg) if spec is not None else None
        if isinstance(arg, PagesOf):
            return _pages_value(arg, wiring, book, path)
        if not isinstance(arg, Expr):
            raise ManifestError(f"{path}: op {op.name!r} has no argument {wiring.arg!r}")
        return _expr_value(arg)
    if isinstance(wiring, ScratchWiring):
        address = book.scratch.get((op.name, wiring.scratch))
        if address is None:
            raise ManifestError(f"{path}: op {op.name!r} declares no scratch {wiring.scratch!r}")
        return _plus(address, wiring.offset)
    if isinstance(wiring, LiteralWiring):
        return _const("float" if wiring.type in ("f32", "f64") else "int", wiring.value)
    if isinstance(wiring, ExprWiring):
        return _expr_value(wiring.expr)
    if isinstance(wiring, RankWiring):
        if wiring.rank not in book.ranks:
            raise ApiError(f"{path}: rank in group {wiring.rank!r} is unknown: pass ranks={{{wiring.rank!r}: i}} to load")
        return _const("int", book.ranks[wiring.rank])
    if isinstance(wiring, NullWiring):
        return _const("bytes", bytes(wiring.nbytes))
    if isinstance(wiring, PackWiring):
        return _resolve_pack(wiring, site, book, encoder, path)
    raise AssertionError(f"unhandled wiring {wiring!r}")  # a bug in kern


def _pages_value(arg: PagesOf, wiring: ArgWiring, book: AddressBook, path: str) -> Resolved:
    """The page count of `arg.state`'s reserved range, a constant. Raises ManifestError when the state
    has no pages in this runtime (not a pooled paged state) and ApiError when the count does not fit the
    wiring's type (the capacity the caller loaded with is too large for the kernel's parameter)."""
    pages = book.pages.get(arg.state)
    if pages is None:
        raise ManifestError(f"{path}: pages_of {arg.state!r}: not a paged state of this runtime's pool "
                            f"(paged: {', '.join(sorted(book.pages)) or 'none'})")
    if wiring.type is not None:
        lo, hi = INT_RANGES[wiring.type]
        if not lo <= pages <= hi:
            raise ApiError(f"{path}: pages_of {arg.state!r} is {pages} pages, which does not fit {wiring.type} "
                           f"(at most {hi}); load with a smaller capacity")
    return _const("int", pages)


def _resolve_pack(pack: PackWiring, site: CallSite, book: AddressBook, encoder: TensorMapEncoder | None,
                  path: str) -> Resolved:
    parts: list[tuple[int, str, Any]] = []  # (offset, how, payload)
    reads: set[str] = set()
    for i, f in enumerate(pack.fields):
        fpath = f"{path}.pack.fields[{i}]"
        if isinstance(f, PackTensorMapField):
            tm = f.tensormap.to_json()  # the encoder's input (tensormaps.py reads the JSON form)
            ptr = resolve_pointer_arg(f.tensormap.arg, site, book, f.tensormap.offset)
            reads |= ptr.reads | f.tensormap.vars_read()
            if encoder is None:
                raise ManifestError(f"{fpath}: tensormap fields need a CUDA device to encode")
            if f.offset + 128 > pack.size:
                raise ManifestError(f"{fpath}: a 128-byte tensormap at offset {f.offset} overflows the {pack.size}-byte pack")
            parts.append((f.offset, "tensormap", (ptr, tm, _fill_range(tm, site, book, fpath))))
        elif isinstance(f, PackPointerField):
            ptr = resolve_pointer_arg(f.arg, site, book, None)
            reads |= ptr.reads
            parts.append((f.offset, "ptr", ptr))
        else:
            assert isinstance(f, PackLiteralField)
            parts.append((f.offset, f.type, f.value))

    def build(values: Values) -> bytes:
        out = bytearray(pack.size)
        for offset, how, payload in parts:
            if how == "tensormap":
                ptr, tm, fill = payload
                address = ptr.fn(values)
                if fill is not None:  # the fill dim: whole rows from the map's address to the range's end
                    state, end, where = fill
                    tm = resolve_fill(tm, end - address, values, where, repr(state))
                data = encoder(address, tm, values)  # type: ignore[misc]
            elif how == "ptr":
                data = encode_pointer(payload.fn(values))
            else:
                data = encode_scalar(how, payload)
            if offset + len(data) > pack.size:
                raise ManifestError(f"{path}: pack field at offset {offset} ({len(data)} bytes) overflows {pack.size} bytes")
            out[offset : offset + len(data)] = data
        return bytes(out)

    frozen_reads = frozenset(reads)
    if not frozen_reads:
        data = build({})
        return _const("bytes", data)
    return Resolved("bytes", build, frozen_reads)


def _fill_range(tm: Mapping[str, Any], site: CallSite, book: AddressBook, fpath: str) -> tuple[str, int, str] | None:
    """For a tensor map with a fill dim: (the pooled state its `arg` names, the end address of the state's reserved
    range, the dim's path); None without a fill dim. Raises ManifestError when the call passes anything but a
    pooled state of this runtime (the verifier refuses buffers and fixed states first)."""
    k = fill_dim(tm)
    if k is None:
        return None
    where = f"{fpath}.tensormap.dims[{k}]"
    arg = site.call.args.get(tm["arg"])
    target = arg.name if isinstance(arg, Ref) else None
    reserve = book.reserve.get(target) if target is not None else None
    base = book.targets.get(target) if target is not None else None
    if reserve is None or base is None:
        raise ManifestError(f"{where}: a fill dim (0) spans the reserved range of a pooled state, but {site.path}.args."
                            f"{tm['arg']} passes {target!r}, not a pooled state of this runtime (pooled: "
                            f"{', '.join(sorted(book.reserve)) or 'none'})")
    return target, base + reserve, where


def encode_for_param(resolved: Resolved, wiring: Wiring, size: int, path: str) -> Callable[[Values], bytes]:
    """A function giving the parameter bytes of `resolved` for a `size`-byte kernel parameter."""
    if resolved.kind == "ptr":
        if size != 8:
            raise ManifestError(f"{path}: a pointer wiring fills 8 bytes, the kernel parameter has {size}")
        return lambda v: encode_pointer(resolved.fn(v))
    if resolved.kind == "bytes":
        def raw(v: Values) -> bytes:
            data = resolved.fn(v)
            if len(data) != size:
                raise ManifestError(f"{path}: wiring gives {len(data)} bytes, the kernel parameter has {size}")
            return data
        return raw
    type_name = getattr(wiring, "type", None)
    if isinstance(wiring, (ExprWiring, RankWiring)) and type_name is None:
        type_name = "i32"  # docs/manifest.md: an expr / rank wiring without a type is an i32
    if type_name is None:
        type_name = {4: "i32", 8: "i64"}.get(size)
        if resolved.kind == "float":
            type_name = {4: "f32", 8: "f64"}.get(size)
        if type_name is None:
            raise ManifestError(f"{path}: cannot encode a scalar into a {size}-byte parameter")
    if encoding_size(type_name) != size:
        raise ManifestError(f"{path}: {type_name} is {encoding_size(type_name)} bytes, the kernel parameter has {size}")
    return lambda v: encode_scalar(type_name, resolved.fn(v))


# ---------------------------------------------------------------- records


def _when_reads(when: When) -> frozenset[str]:
    out: set[str] = set()
    for var, lo, hi in when:
        out |= {var} | lo.vars | hi.vars
    return frozenset(out)


def when_holds(when: When, values: Values) -> bool:
    """True when every `(var, lo, hi)` of `when` has `lo <= values[var] <= hi`."""
    return all(lo.eval(values) <= values[var] <= hi.eval(values) for var, lo, hi in when)


def args_at_range_ends(rec: "ExternRecord", min_values: Values, max_values: Values) -> Iterator[tuple[int, ...]]:
    """An extern record's integer arguments at the low and the high end of the var ranges, each var its `when`
    names clamped into that interval first; an end where the `when` still does not hold is skipped. The load-time
    checks of pinned cuBLASLt algorithms and NCCL extents run on these, so no run reaches an unchecked end."""
    for base in (min_values, max_values):
        values = dict(base)
        for var, lo, hi in rec.when:
            values[var] = min(max(values[var], lo.eval(values)), hi.eval(values))
        if when_holds(rec.when, values):
            yield tuple(int(r.fn(values)) for r in rec.resolved)


def _dims(exprs: tuple[Expr, ...] | None, values: Values) -> tuple[int, ...] | None:
    return None if exprs is None else tuple(e.eval(values) for e in exprs)


@dataclass
class KernelRecord:
    """One kernel launch of one call. After `patch(values)`: `active`, `grid`, `block`,
    `shared_mem_bytes`, `cluster` hold the launch configuration and `params` the staged block.
    `path` is the launch's JSON path, `when` its var sub-range as triples (`when_of`)."""

    call_index: int
    op: str
    launch: Launch
    function: Any  # CUfunction (an int handle in CPU tests)
    params: ParamBlock
    dynamic: list[tuple[int, Callable[[Values], bytes]]]
    reads: frozenset[str]
    path: str = ""
    when: When = ()
    active: bool = True
    grid: tuple[int, ...] = (1, 1, 1)
    block: tuple[int, ...] = (1, 1, 1)
    shared_mem_bytes: int = 0
    cluster: tuple[int, ...] | None = None
    residency: Any = None  # cuda.occupancy.CoResidency of a cooperative launch (set at load), else None

    def patch(self, values: Values) -> None:
        """Re-evaluate what depends on vars. Raises ApiError for a non-positive grid/block dim, CoResidencyError for
        a cooperative launch whose grid no longer fits the device at once."""
        launch = self.launch
        self.active = when_holds(self.when, values)
        if not self.active:
            return
        self.grid = _dims(launch.grid, values)  # type: ignore[assignment]
        self.block = _dims(launch.block, values)  # type: ignore[assignment]
        self.shared_mem_bytes = launch.shared_mem.eval(values)
        self.cluster = _dims(launch.cluster, values)
        for dim in (*self.grid, *self.block):
            if dim <= 0:
                raise ApiError(f"{self.path}: grid {self.grid} / block {self.block} has a non-positive dim at {dict(values)}")
        if self.residency is not None:
            self.residency.check(self.function, self.path, self.grid, self.block, self.shared_mem_bytes)
        for index, fn in self.dynamic:
            self.params.write(index, fn(values))


@dataclass
class ExternRecord:
    """One built-in launch of one call: `args` (after `patch`) are the integer argument values. `name` is the
    extern without its `extern:` prefix, `algo` the pinned cuBLASLt algorithm as its JSON mapping (None: the
    heuristic's first choice), `path` and `when` as in `KernelRecord`."""

    call_index: int
    op: str
    launch: ExternLaunch
    resolved: tuple[Resolved, ...]
    reads: frozenset[str]
    path: str = ""
    when: When = ()
    name: str = ""
    algo: Mapping[str, int] | None = None
    active: bool = True
    args: tuple[int, ...] = ()

    def patch(self, values: Values) -> None:
        self.active = when_holds(self.when, values)
        if self.active:
            self.args = tuple(int(r.fn(values)) for r in self.resolved)


Record = KernelRecord | ExternRecord
FunctionLookup = Callable[[str, int], Any]
"""(op name, launch index) -> CUfunction resolved at load."""


def call_sites(manifest: Manifest, program: str) -> list[CallSite]:
    """The calls `program` runs, in order, inlined programs expanded (`Program.located_calls`)."""
    return [CallSite(call, path, manifest.ops[call.op])
            for path, call in manifest.programs[program].located_calls(manifest)]


def compile_call(call_index: int, site: CallSite, book: AddressBook, functions: FunctionLookup,
                 encoder: TensorMapEncoder | None = None) -> list[Record]:
    """Records for every launch of the call at `site`. Raises ManifestError / ApiError for wiring faults."""
    op = site.op
    records: list[Record] = []
    for li, launch in enumerate(op.launches):
        path = launch_path(op.name, li)
        when = when_of(launch)
        if isinstance(launch, ExternLaunch):
            name = launch.name
            lo, hi = EXTERN_ARITY.get(name, (4, 4))
            if name not in EXTERN_ARITY and name not in NCCL_EXTERNS:
                raise ManifestError(f"{path}: unknown extern {name!r}")
            if not lo <= len(launch.args) <= hi:
                raise ManifestError(f"{path}: extern {name} takes {lo}..{hi} args, got {len(launch.args)}")
            resolved = tuple(resolve_wiring(w, site, book, None, f"{path}.args[{i}]") for i, w in enumerate(launch.args))
            reads = frozenset().union(*(r.reads for r in resolved), _when_reads(when))
            algo = launch.algo.to_json() if launch.algo is not None else None
            records.append(ExternRecord(call_index, op.name, launch, resolved, reads, path, when, name, algo))
            continue
        if len(launch.args) != len(launch.params):
            raise ManifestError(f"{path}: {len(launch.args)} args wire {len(launch.params)} params")
        block = ParamBlock([size for _, size in launch.params])
        dynamic: list[tuple[int, Callable[[Values], bytes]]] = []
        reads: set[str] = set(_when_reads(when))
        for expr in (*launch.grid, *launch.block, launch.shared_mem, *(launch.cluster or ())):
            reads |= expr.vars
        for pi, (wiring, (_, size)) in enumerate(zip(launch.args, launch.params)):
            wpath = f"{path}.args[{pi}]"
            resolved = resolve_wiring(wiring, site, book, encoder, wpath)
            encode = encode_for_param(resolved, wiring, size, wpath)
            if resolved.constant:
                block.write(pi, encode({}))
            else:
                dynamic.append((pi, encode))
                reads |= resolved.reads
        records.append(KernelRecord(call_index, op.name, launch, functions(op.name, li), block, dynamic,
                                    frozenset(reads), path, when))
    return records


def compile_program(manifest: Manifest, program: str, book: AddressBook, functions: FunctionLookup,
                    encoder: TensorMapEncoder | None = None) -> tuple[list[Record], int]:
    """(every record of `program` in call order, its number of calls). Raises like `compile_call`."""
    sites = call_sites(manifest, program)
    records: list[Record] = []
    for index, site in enumerate(sites):
        records.extend(compile_call(index, site, book, functions, encoder))
    return records, len(sites)


def program_reads(records: list[Record]) -> frozenset[str]:
    """The vars a program's launches read (the graph key's vars)."""
    return frozenset().union(*(r.reads for r in records)) if records else frozenset()
