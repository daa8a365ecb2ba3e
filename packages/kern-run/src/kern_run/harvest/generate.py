"""The generator: a kern manifest from a mined step, and the pinned cubins laid out beside it.

`build_manifest(mined, name)` (docs/harvest.md "The manifest"):

- `vars`: the token count over the runs' domain;
- `modules`: each cubin a launch runs, pinned by sha256 and named after its first kernel (`<module>-<sha12>.cubin`
  in the kernels directory, the specification's layout);
- `buffers`: every weight a launch reads, bound straight from its checkpoint name (`{"tensor": key, "shape"}`);
  every input and output, with fitted shapes; `harvest.workspace`, the intermediate allocations packed by
  lifetime (workspace.py); `states`: every state tensor (a KV cache) as a zero-filled fixed state;
- `ops`: one per kernel and launch configuration, its `params` the captured `cuFuncGetParamInfo` layout (the
  runtime checks it again at load, and picks the instance by it where a module holds same-named kernels); a
  pointer parameter is an interface argument, an integer that differs between the op's calls too, everything else
  a wiring of the launch (literal, expression in the token count, null bytes or a pack of literal words);
  same-named kernels of different layouts or configurations become ops `name`, `name.2`, ...;
- `programs.decode`: every launch in capture order, `graph: true` (the runtime captures it as one CUDA graph at
  the token count the caller runs, 1 for decode).

`generate(capture_dir, out_dir, name)` reads, mines, builds, verifies with kern_manifest and writes `out_dir`
(manifest.json + kernels/) whole, or raises HarvestRefusal / CaptureFormatError and writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kern_manifest import ManifestError, find_faults, parse_manifest

from .capture_format import FORMAT, read_capture
from .errors import HarvestRefusal, Problem
from .fit import Fit
from .mine import Mined, MinedLaunch, PointerArg, RawArg, mine
from .outdir import write_directory
from .workspace import Lifetime, pack

WORKSPACE = "harvest.workspace"
PROGRAM = "decode"
GENERATOR = "kern harvest generate"
MAX_MODULE_NAME = 160  # <module>-<sha12>.cubin stays inside a file name's 255 bytes
_BAD = re.compile(r"[^A-Za-z0-9_.\-]")


def _clean(name: str) -> str:
    """`name` as a kern manifest name ([A-Za-z_][A-Za-z0-9_.-]*), at most MAX_MODULE_NAME characters."""
    text = _BAD.sub("_", name)[:MAX_MODULE_NAME]
    return text if re.match(r"[A-Za-z_]", text) else f"k_{text}"[:MAX_MODULE_NAME]


def _unique(base: str, taken: set[str]) -> str:
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}.{n}"
    taken.add(name)
    return name


def _expr(fit: Fit, plus: int = 0) -> int | str:
    if isinstance(fit.expr, int):
        return fit.expr + plus
    return fit.expr if plus == 0 else f"{fit.expr} + {plus}"


def _literal(size: int, value: int) -> dict[str, Any]:
    return {"i32" if size == 4 else "i64": value}


def _raw_wiring(data: bytes) -> dict[str, Any]:
    """Null bytes, or a pack of the non-zero 32-bit words (a size that is no multiple of 4 holding non-zero bytes
    is refused by `_check_raw` before this)."""
    if not any(data):
        return {"null": len(data)}
    fields = [{"offset": o, "u32": int.from_bytes(data[o:o + 4], "little")} for o in range(0, len(data), 4)
              if any(data[o:o + 4])]
    return {"pack": {"size": len(data), "fields": fields}}


def _modules(mined: Mined) -> dict[str, str]:
    """sha256 -> module name, named after the first kernel launched from it."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for ml in mined.launches:
        if ml.module not in names:
            names[ml.module] = _unique(_clean(ml.function), taken)
    return names


def _pointer_value(arg: PointerArg, offsets: dict[str, int]) -> Any:
    """A call's value for a pointer argument: a buffer or state name, with a byte offset when not zero."""
    if arg.kind == "workspace":
        return {"buffer": WORKSPACE, "offset": _expr(arg.offset, offsets[arg.target])}
    key = "state" if arg.kind == "state" else "buffer"
    offset = _expr(arg.offset)
    return arg.target if offset == 0 else {key: arg.target, "offset": offset}


def _static(arg: Any) -> Any:
    """A launch wiring that does not depend on the call, or None for a pointer."""
    if isinstance(arg, PointerArg):
        return None
    if isinstance(arg, RawArg):
        return _raw_wiring(arg.data)
    value = arg.value
    if value.is_literal:
        return {"null": 8} if arg.size == 8 and value.expr == 0 else _literal(arg.size, value.expr)
    return {"expr": value.expr, "type": "i32" if arg.size == 4 else "i64"}


def _group_key(ml: MinedLaunch, module: str) -> str:
    shape = [module, ml.function, [list(p) for p in ml.params], [f.expr for f in ml.grid], [f.expr for f in ml.block],
             ml.shared_mem.expr, [type(a).__name__ for a in ml.args],
             [_static(a) for a in ml.args if isinstance(a, RawArg)]]
    return json.dumps(shape, sort_keys=True)


def _ops(mined: Mined, modules: dict[str, str], offsets: dict[str, int]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(ops, decode calls): launches grouped by kernel and configuration (module docstring)."""
    groups: dict[str, list[MinedLaunch]] = {}
    for ml in mined.launches:
        groups.setdefault(_group_key(ml, modules[ml.module]), []).append(ml)
    op_of: dict[int, tuple[str, list[int]]] = {}  # launch index -> (op name, params passed as int arguments)
    ops: dict[str, Any] = {}
    taken: set[str] = set()
    for members in groups.values():
        first = members[0]
        name = _unique(_clean(first.function), taken)
        args, wirings, varying = [], [], []
        for j, arg in enumerate(first.args):
            statics = {json.dumps(_static(m.args[j]), sort_keys=True) for m in members}
            if isinstance(arg, PointerArg):
                args.append({"name": f"p{j}", "kind": "ptr"})
                wirings.append({"arg": f"p{j}"})
            elif len(statics) > 1:  # a scalar whose value differs between the op's calls
                args.append({"name": f"s{j}", "kind": "int"})
                wirings.append({"arg": f"s{j}", "type": "i32" if arg.size == 4 else "i64"})
                varying.append(j)
            else:
                wirings.append(_static(arg))
        launch = {"module": modules[first.module], "entry": first.function, "grid": [_expr(f) for f in first.grid],
                  "block": [_expr(f) for f in first.block], "shared_mem": _expr(first.shared_mem),
                  "params": [list(p) for p in first.params], "args": wirings}
        ops[name] = {"args": args, "launches": [launch]}
        for m in members:
            op_of[m.index] = (name, varying)
    calls = []
    for ml in mined.launches:
        name, varying = op_of[ml.index]
        values: dict[str, Any] = {}
        for j, arg in enumerate(ml.args):
            if isinstance(arg, PointerArg):
                values[f"p{j}"] = _pointer_value(arg, offsets)
            elif j in varying:
                values[f"s{j}"] = _expr(arg.value)  # type: ignore[union-attr]
        calls.append({"op": name, "args": values})
    return ops, calls


def _check_raw(mined: Mined) -> list[Problem]:
    return [Problem(f"launch {ml.index} param {j}", f"{len(a.data)} bytes holding {a.data.hex()}: no wiring writes "
                                                    f"bytes that are not whole 32-bit words")
            for ml in mined.launches for j, a in enumerate(ml.args)
            if isinstance(a, RawArg) and any(a.data) and len(a.data) % 4]


def build_manifest(mined: Mined, name: str) -> dict[str, Any]:
    """The manifest (a JSON object, with its digest) for `mined` (module docstring). Raises HarvestRefusal for
    raw parameter bytes no wiring can express and for a manifest kern_manifest rejects (each fault's path)."""
    problems = _check_raw(mined)
    if problems:
        raise HarvestRefusal(problems)
    lifetimes = [Lifetime(f"#{a.ordinal}", a.nbytes_max, a.first, a.last) for a in mined.allocations]
    offsets, arena = pack(lifetimes)
    modules = _modules(mined)
    buffers: dict[str, Any] = {}
    states: dict[str, Any] = {}
    for t in mined.tensors.values():
        shape = [_expr(d) for d in t.shape]
        if t.kind == "state":
            states[t.name] = {"kind": "fixed", "bytes": max(t.nbytes_max, 1)}
        elif t.kind == "weight":
            buffers[t.name] = {"kind": "weight", "dtype": t.dtype, "shape": shape,
                               "bind": [{"tensor": t.name, "shape": shape}]}
        else:
            buffers[t.name] = {"kind": t.kind, "dtype": t.dtype, "shape": shape}
    if mined.allocations:
        buffers[WORKSPACE] = {"kind": "workspace", "dtype": "u8", "shape": [arena]}
    ops, calls = _ops(mined, modules, offsets)
    lo, hi = mined.domain
    manifest: dict[str, Any] = {
        "format": "kern-manifest/1",
        "name": name,
        "meta": {"generator": GENERATOR, "harvest": {
            "capture_format": FORMAT, "runs_tokens": list(mined.tokens), "source": mined.source,
            "exact_on_domain": set(range(lo, hi + 1)) <= set(mined.tokens),
            "workspace": {"bytes": arena, "allocations": len(mined.allocations)}}},
        "vars": {mined.var: {"min": lo, "max": hi}},
        "modules": {modules[sha]: sha for sha in modules},
        "buffers": buffers,
        "ops": ops,
        "programs": {PROGRAM: {"graph": True, "calls": calls}},
    }
    if states:
        manifest["states"] = states
    _verify(manifest)
    manifest["digest"] = digest_of(manifest)
    return manifest


def digest_of(manifest: dict[str, Any]) -> str:
    """docs/manifest.md "Digest": sha256 of the canonical JSON without `digest`."""
    body = {k: v for k, v in manifest.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()).hexdigest()


def _verify(manifest: dict[str, Any]) -> None:
    try:
        faults = find_faults(parse_manifest(manifest))
    except ManifestError as exc:
        raise HarvestRefusal([Problem("manifest", str(exc))]) from None
    if faults:
        raise HarvestRefusal([Problem(f"manifest {f.path}", f.message) for f in faults])


def output_files(manifest: dict[str, Any], cubins: dict[str, bytes]) -> dict[str, bytes]:
    """manifest.json and kernels/<module>-<sha12>.cubin for every module the manifest pins."""
    files = {"manifest.json": (json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=True) + "\n").encode()}
    for module, sha in manifest["modules"].items():
        files[f"kernels/{module}-{sha[:12]}.cubin"] = cubins[sha]
    return files


def generate(capture_dir: str | Path, out_dir: str | Path, name: str | None = None) -> tuple[dict[str, Any], Mined]:
    """Read the capture, mine it, build and verify the manifest, and write `out_dir` (manifest.json, kernels/)
    whole. Returns (manifest, mined). Raises CaptureFormatError, HarvestRefusal (with every problem; also for no
    run at 1 token: the decode program would be a prediction, not a capture) and OSError (FileExistsError for an
    existing `out_dir`); nothing is written then."""
    out = Path(out_dir)
    if out.exists() or out.is_symlink():
        raise FileExistsError(17, "exists; refusing to replace it (remove it or give another --out)", str(out))
    mined = mine(read_capture(capture_dir))
    if 1 not in mined.tokens:
        raise HarvestRefusal([Problem("meta.json runs", f"no run at 1 token (runs at {list(mined.tokens)}): the decode "
                                                        f"program runs at 1")])
    manifest = build_manifest(mined, name or str(mined.source.get("model") or "harvested"))
    write_directory(out, output_files(manifest, mined.cubins))
    return manifest, mined


def summary_lines(manifest: dict[str, Any]) -> Iterable[str]:
    """A few lines about a generated manifest (for `kern harvest generate`)."""
    calls = manifest["programs"][PROGRAM]["calls"]
    kinds: dict[str, int] = {}
    for b in manifest["buffers"].values():
        kinds[b["kind"]] = kinds.get(b["kind"], 0) + 1
    yield (f"{manifest['name']}: {len(manifest['modules'])} module(s), {len(manifest['ops'])} op(s), {len(calls)} "
           f"call(s) in {PROGRAM} (graph), digest {manifest['digest'][:12]}")
    yield "buffers: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + \
          f"; states: {len(manifest.get('states', {}))}"
