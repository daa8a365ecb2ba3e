"""`verify(manifest)`: every consistency rule of docs/manifest.md, all faults at once, each with the
JSON path of the offending value and what to fix.

Expressions are checked at every corner of the box of the var ranges they read (all min/max
combinations): undeclared vars, divisors <= 0, values outside the signed 64-bit range, sizes below
their floor, and values that do not fit the wiring's encoding are faults.
"""

from __future__ import annotations

import math
import weakref

from .errors import ExprError, Fault, ManifestError, ManifestVerifyError
from .expr import FUNCS, I64_MAX, Expr
from .frozen import index_path, key_path
from .model import (
    BUFFER_KINDS,
    DTYPE_BYTES,
    EXTERNS,
    FORMAT,
    INT_ENCODINGS,
    PLACEMENTS,
    PROGRAM_KINDS,
    STATE_KINDS,
    ArgWiring,
    Buffer,
    Call,
    DerivedSegment,
    ExternLaunch,
    InterleaveSegment,
    Manifest,
    Op,
    PagesOf,
    ProgramCall,
    Ref,
    RowsSegment,
    State,
    TensorSegment,
)
from .verify_base import EXTERN_INT_ROLES, MAX_CORNER_VARS, SHA256, STATE_FIELDS, TOP_KEYS, VAR_NAME
from .verify_ops import OpChecks

MAX_GROUP_SIZE = 1 << 16  # ranks of a topology group: far above any NCCL communicator kern builds
MAX_ERROR_WORDS = 64  # u32 words of one error word buffer: the code and up to 63 words of detail
U32_MAX = (1 << 32) - 1

# Manifests (frozen, so a verdict never goes stale) that passed `verify`, by identity: a caller that checks a
# manifest up front and hands the same object to the runtime pays for one verification, not two.
_VERIFIED: dict[int, weakref.ref[Manifest]] = {}


def verify(manifest: Manifest) -> None:
    """Check a parsed manifest for consistency. Raises `ManifestVerifyError` carrying every fault found
    (each a `Fault(path, message)`); returns None when the manifest is consistent. A `Manifest` object that
    already passed returns at once (manifests are immutable; ~35 ms saved for the Qwen3-4B manifest)."""
    seen = _VERIFIED.get(id(manifest))
    if seen is not None and seen() is manifest:
        return
    faults = find_faults(manifest)
    if faults:
        raise ManifestVerifyError(faults)
    key = id(manifest)

    def forget(ref: weakref.ref[Manifest]) -> None:  # the object is gone: its id may be reused
        if _VERIFIED.get(key) is ref:
            del _VERIFIED[key]

    _VERIFIED[key] = weakref.ref(manifest, forget)


def find_faults(manifest: Manifest) -> list[Fault]:
    """The faults `verify` would raise, as a list (empty for a consistent manifest)."""
    return _Verifier(manifest).run()


class _Verifier(OpChecks):
    def __init__(self, m: Manifest) -> None:
        super().__init__(m)
        self._int_arg_facts: dict[tuple[str, str], tuple[int | None, int | None, str, tuple[tuple[str, bool], ...]]] = {}
        self._launch_offsets: dict[tuple[str, str], list[Expr]] = {}

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
            if not 1 <= group.size <= MAX_GROUP_SIZE:
                self.fault(key_path(path, "size"), f"group size is {group.size}; it must be 1..{MAX_GROUP_SIZE} "
                                                   "(GPUs, one rank each)")
        for name, buf in m.buffers.items():
            self.check_buffer(buf, key_path("$.buffers", name))
        self.check_states()
        for name, op in m.ops.items():
            self.check_op(op, key_path("$.ops", name))
        self.check_carveouts()
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
        self.unknown(buf.extra, path, ("kind", "dtype", "shape", "placement", "export", "bind", "peers",
                                       "zero_each_run", "error", "init"))
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
        if buf.peers is not None:
            self.check_peers(buf, path)
        if buf.zero_each_run:
            self.check_zero_each_run(buf, path)
        if buf.error is not None:
            self.check_error_word(buf, path)
        if buf.init is not None:
            self.check_init(buf, path, dims_ok)

    def check_init(self, buf: Buffer, path: str, dims_ok: bool) -> None:
        """`init`: the whole contents of a constant-shape device workspace buffer, strict base64 of exactly its
        byte size; not with `zero_each_run` or `error` (which define the contents otherwise)."""
        ipath = key_path(path, "init")
        self.unknown(buf.init.extra, ipath, ("base64",))
        if buf.kind != "workspace":
            self.fault(ipath, f"only workspace buffers take 'init' (this one is {buf.kind!r})")
        if buf.placement != "device":
            self.fault(ipath, "an initialised buffer lives on the device (placement 'device')")
        if buf.zero_each_run or buf.error is not None or buf.export or buf.peers is not None:
            self.fault(ipath, "'init' does not go with zero_each_run, error, export or peers")
        if any(d.vars for d in buf.shape):
            self.fault(key_path(path, "shape"), "an initialised buffer's shape is constant (no vars)")
            return
        try:
            data = buf.init.data()
        except ManifestError as exc:
            self.fault(key_path(ipath, "base64"), str(exc).removeprefix("init.base64 ") + "; write RFC 4648 base64 "
                                                  "with padding")
            return
        if dims_ok and buf.dtype in DTYPE_BYTES and len(data) != buf.nbytes_at({}):
            self.fault(key_path(ipath, "base64"), f"decodes to {len(data)} bytes; the buffer holds {buf.nbytes_at({})}")

    def check_zero_each_run(self, buf: Buffer, path: str) -> None:
        """`zero_each_run`: a program-internal device buffer (counters, flags) the runtime zeroes at the start of
        every run of a program that passes it; an error word is never zeroed (a fault would be lost)."""
        zpath = key_path(path, "zero_each_run")
        if buf.kind not in ("workspace", "scratch"):
            self.fault(zpath, f"only workspace and scratch buffers are zeroed each run (this one is {buf.kind!r}: "
                              "its contents belong to the caller or the checkpoint)")
        if buf.placement != "device":
            self.fault(zpath, "a buffer zeroed each run lives on the device (placement 'device')")
        if buf.export or buf.peers is not None:
            self.fault(zpath, "an export buffer or peer table is not zeroed each run (peers read it)")
        if buf.error is not None:
            self.fault(zpath, "an error word is not zeroed each run: a fault written by one run would be wiped by "
                              "the next before the host reads it; the runtime clears it when it reports it")

    def check_error_word(self, buf: Buffer, path: str) -> None:
        """`error`: u32[n] (n constant, 1..MAX_ERROR_WORDS) workspace in pinned host memory; `codes` maps decimal
        codes 1..2^32-1 to non-empty descriptions."""
        epath = key_path(path, "error")
        self.unknown(buf.error.extra, epath, ("codes",))
        for key, ok, message in (
            ("kind", buf.kind == "workspace",
             f"an error word is a 'workspace' buffer (kernels write it, the runtime reads it), not {buf.kind!r}"),
            ("dtype", buf.dtype == "u32", f"an error word holds u32 codes, not {buf.dtype!r}"),
            ("placement", buf.placement == "host",
             "an error word lives in pinned host memory (placement 'host'), so the host reads it after a step with "
             "no copy"),
        ):
            if not ok:
                self.fault(key_path(path, key), message)
        if buf.peers is not None or buf.export:
            self.fault(epath, "an error word is neither an export buffer nor a peer table")
        if any(d.vars for d in buf.shape):
            self.fault(key_path(path, "shape"), "an error word's shape is constant (no vars)")
        else:
            try:
                count = math.prod(d.eval({}) for d in buf.shape)
            except ExprError:
                count = None  # reported at the dimension
            if count is not None and not 1 <= count <= MAX_ERROR_WORDS:
                self.fault(key_path(path, "shape"), f"an error word has {count} u32 words; give 1..{MAX_ERROR_WORDS} "
                                                    "(word 0 the code, the rest detail)")
        cpath = key_path(epath, "codes")
        for code, meaning in (buf.error.codes or {}).items():
            kpath = key_path(cpath, code)
            if not (code.isascii() and code.isdigit()) or code != str(int(code)) or not 1 <= int(code) <= U32_MAX:
                self.fault(kpath, f"code {code!r} must be a decimal integer 1..{U32_MAX} without leading zeros "
                                  "(0 means no fault)")
            if not isinstance(meaning, str) or not meaning.strip():
                self.fault(kpath, "give each code a non-empty description")

    def check_peers(self, buf: Buffer, path: str) -> None:
        """A peer table: workspace u64[group size] on the device, of an export buffer or a state."""
        m, ppath = self.m, key_path(path, "peers")
        self.unknown(buf.peers.extra, ppath, ("of", "group"))
        group = m.topology.groups.get(buf.peers.group)
        if group is None:
            self.fault(key_path(ppath, "group"), f"unknown topology group {buf.peers.group!r}; declare it under "
                                                 "'topology'")
        target = m.buffers.get(buf.peers.of)
        if target is None and buf.peers.of not in m.states:
            self.fault(key_path(ppath, "of"), f"{buf.peers.of!r} is neither a buffer nor a state")
        elif target is not None and not target.export:
            self.fault(key_path(ppath, "of"), f"buffer {buf.peers.of!r} is not 'export': true; peers can only map "
                                              "export buffers and states")
        elif target is not None and target.peers is not None:
            self.fault(key_path(ppath, "of"), f"{buf.peers.of!r} is itself a peer table")
        if buf.kind != "workspace":
            self.fault(key_path(path, "kind"), f"a peer table is a 'workspace' buffer (the runtime fills it at "
                                               f"connect), not {buf.kind!r}")
        if buf.dtype != "u64":
            self.fault(key_path(path, "dtype"), f"a peer table holds u64 addresses, not {buf.dtype!r}")
        if buf.placement != "device":
            self.fault(key_path(path, "placement"), "a peer table lives on the device")
        if group is not None:
            if len(buf.shape) != 1 or buf.shape[0].vars or buf.shape[0].eval({}) != group.size:
                self.fault(key_path(path, "shape"), f"a peer table of group {group.name!r} has shape [{group.size}] "
                                                    "(one address per member)")

    def check_bind(self, buf: Buffer, path: str, dims_ok: bool) -> None:
        bpath = key_path(path, "bind")
        if not buf.bind:
            self.fault(bpath, "bind is empty; list the segments that fill the buffer")
            return
        for i, seg in enumerate(buf.bind):
            spath = index_path(bpath, i)
            known = {TensorSegment: ("tensor", "shape", "cols"), RowsSegment: ("tensor", "rows", "shape", "cols"),
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
            cols = getattr(seg, "cols", None)
            if cols is not None:
                cpath = key_path(spath, "cols")
                if len(shape) != 2:
                    self.fault(cpath, f"a column range needs a 2-D buffer, this one has {len(shape)} dimension(s)")
                    return
                if not 0 <= cols[0] < cols[1]:
                    self.fault(cpath, f"column range [{cols[0]}, {cols[1]}) must satisfy 0 <= start < stop")
                    return
                if cols[1] - cols[0] != shape[1]:
                    self.fault(cpath, f"column range [{cols[0]}, {cols[1]}) is {cols[1] - cols[0]} columns wide, the "
                                      f"buffer's rows are {shape[1]}")
                    return
                if seg.shape is not None:
                    if len(seg.shape) != 2 or any(d < 1 for d in seg.shape):
                        self.fault(key_path(spath, "shape"), f"tensor shape {list(seg.shape)} must have 2 dimensions, "
                                                             "each >= 1")
                        return
                    if cols[1] > seg.shape[1]:
                        self.fault(cpath, f"column range ends at {cols[1]} but the tensor has {seg.shape[1]} columns")
                        return
                if isinstance(seg, RowsSegment) and seg.shape is not None and seg.stop > seg.shape[0]:
                    self.fault(key_path(spath, "rows"), f"row range ends at {seg.stop} but the tensor has "
                                                        f"{seg.shape[0]} rows")
                    return
                if isinstance(seg, RowsSegment) and not 0 <= seg.start < seg.stop:
                    self.fault(key_path(spath, "rows"), f"row range [{seg.start}, {seg.stop}) must satisfy "
                                                        "0 <= start < stop")
                    return
            elif seg.shape is not None:
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
        for name, message in m.program_size_faults:
            self.fault(key_path(key_path("$.programs", name), "calls") if name else "$.programs", message)

    def check_cycles(self) -> set[str]:
        """Fault every cycle of `{"program": ...}` references once; returns the programs on cycles."""
        m = self.m
        on_cycle: set[str] = set()
        reported: set[frozenset[str]] = set()

        color: dict[str, int] = {}  # absent: unvisited, 1: on the DFS stack, 2: done

        def walk(root: str) -> None:
            # depth-first with an explicit stack (a chain of inlined programs may be longer than Python's
            # recursion limit): frames of (program, index of its next call), `path` the programs on the stack
            color[root] = 1
            frames: list[list[str | int]] = [[root, 0]]
            path = [root]
            while frames:
                frame = frames[-1]
                name, i = str(frame[0]), int(frame[1])
                calls = m.programs[name].calls
                if i == len(calls):
                    color[name] = 2
                    frames.pop()
                    path.pop()
                    continue
                frame[1] = i + 1
                call = calls[i]
                if not isinstance(call, ProgramCall) or call.program not in m.programs:
                    continue
                state = color.get(call.program)
                if state == 1:
                    cycle = path[path.index(call.program):]
                    on_cycle.update(cycle)
                    if frozenset(cycle) not in reported:
                        reported.add(frozenset(cycle))
                        cpath = key_path(index_path(key_path(key_path("$.programs", name), "calls"), i), "program")
                        self.fault(cpath, f"program cycle {' -> '.join([*cycle, call.program])}; inlining must end")
                elif state is None:
                    color[call.program] = 1
                    frames.append([call.program, 0])
                    path.append(call.program)

        for name in m.programs:
            if name not in color:
                walk(name)
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
                if not isinstance(value, Ref):
                    self.fault(vpath, f"{arg.name!r} is a ptr argument; pass a buffer or state name")
                    continue
                self.check_ref(op, arg.name, value, vpath, local)
            elif arg.kind == "int":
                if isinstance(value, PagesOf):
                    self.check_pages_of(value, vpath)
                elif not isinstance(value, Expr):
                    self.fault(vpath, f"{arg.name!r} is an int argument; pass an expression or "
                                      "{\"pages_of\": state}")
                else:
                    self.check_int_arg(op, arg.name, value, vpath)
        self.check_fill_targets(op, call, apath, local)

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
        key = (op.name, arg)
        if key not in self._launch_offsets:  # once per (op, argument), distinct offsets only
            self._launch_offsets[key] = list(dict.fromkeys(
                w.offset for launch in op.launches for w in launch.args
                if isinstance(w, ArgWiring) and w.arg == arg and w.offset is not None))
        launch_offsets = self._launch_offsets[key]
        for e, epath in offsets:
            if self.values(e, epath, "byte offset", lo=0, hi=nbytes, hint=" (the target's byte size)") is None:
                return
            for extra in launch_offsets:
                both = e.vars | extra.vars
                if nbytes is None or not all(v in m.vars for v in both) or len(both) > MAX_CORNER_VARS:
                    continue
                if not self.afford((e, extra), epath, "call offset"):
                    return
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

    def check_pages_of(self, value: PagesOf, path: str) -> None:
        """`{"pages_of": state}`: `state` must be a declared paged state. Its value (the pages of the
        state's reserved range) exists only at load, so its fit in the wiring's encoding is the runtime's
        check."""
        self.unknown(value.extra, path, ("pages_of",))
        spath = key_path(path, "pages_of")
        state = self.m.states.get(value.state)
        if state is None:
            paged = [n for n, s in self.m.states.items() if s.kind == "paged"]
            self.fault(spath, f"unknown state {value.state!r}; pages_of names a paged state (declared: "
                              f"{', '.join(paged) or 'none'})")
        elif state.kind != "paged":
            self.fault(spath, f"state {value.state!r} is {state.kind}, not paged; pages_of counts the pages of a "
                              "paged state's reserved range")

    def check_int_arg(self, op: Op, arg: str, e: Expr, path: str) -> None:
        lo, hi, hint, roles = self.int_arg_facts(op, arg)
        if self.values(e, path, "int argument", lo=lo, hi=hi, hint=hint) is None:
            return
        for role, fp8_k in roles:
            self.values(e, path, role, lo=1)
            if fp8_k:
                for _, value in self.values(e, path, "k") or ():
                    if value % 16:
                        self.fault(path, f"fp8 GEMMs need k % 16 == 0; k is {value}")
                        break

    def int_arg_facts(self, op: Op, arg: str) -> tuple[int | None, int | None, str, tuple[tuple[str, bool], ...]]:
        """What every call's `int` argument `arg` of `op` must satisfy, computed once per (op, argument) and not
        per call (an op of many launches called many times would otherwise cost calls x launches): the bounds
        of the encodings it is wired as, their hint, and the distinct GEMM-dimension roles it plays (the role's
        wording, whether it is an fp8 GEMM's k)."""
        key = (op.name, arg)
        facts = self._int_arg_facts.get(key)
        if facts is not None:
            return facts
        encodings = {w.type for launch in op.launches for w in launch.args
                     if isinstance(w, ArgWiring) and w.arg == arg and w.type in INT_ENCODINGS}
        lo, hi = None, None
        if encodings:
            lo = max(INT_ENCODINGS[t][1] for t in encodings)
            hi = min(INT_ENCODINGS[t][2] for t in encodings)
        hint = f" to fit {', '.join(sorted(encodings))}" if encodings else ""
        roles: dict[tuple[str, bool], None] = {}
        for launch in op.launches:
            if not isinstance(launch, ExternLaunch) or launch.name not in EXTERN_INT_ROLES:
                continue
            required, _ = EXTERNS[launch.name]
            for j, w in enumerate(launch.args[:len(required)]):
                if isinstance(w, ArgWiring) and w.arg == arg and j in EXTERN_INT_ROLES[launch.name]:
                    fp8_k = launch.name.startswith("cublaslt_fp8") and j == len(required) - 1
                    roles[(f"GEMM dimension (argument {j} of {launch.name})", fp8_k)] = None
        facts = (lo, hi, hint, tuple(roles))
        self._int_arg_facts[key] = facts
        return facts
