"""What a manifest declares, as short text lines: `kern inspect` prints them, `kern run` logs them at start.

Computed from the verified kern_manifest.Manifest alone (no GPU): vars, states, buffer classes with bytes at
var max, each op's launches (entry + parameter layout + module, or the runtime built-in), weight binds, and per
program its calls and launches (inlined programs expanded) and whether it is captured as a graph.
`runtime_lines` adds what only a loaded runtime knows (its `describe()`): allocated bytes, pages, captured graphs.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping

from kern_manifest import (
    AnyLaunch, Buffer, DerivedSegment, ExternLaunch, InterleaveSegment, Manifest, Op, var_max, var_min,
)


def _count(n: int, one: str, many: str | None = None) -> str:
    """`n` with its noun in the singular for 1 ("1 call", "2 calls")."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _gib(n: int) -> str:
    return f"{n / 2**30:.3f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def _params(params: tuple[tuple[int, int], ...]) -> str:
    return " ".join(f"{o}:{s}" for o, s in params)


def _when_text(launch: AnyLaunch) -> str:
    """` when {'tokens': [1, 16]}` as the launch's JSON `when` reads, "" without one."""
    if launch.when is None:
        return ""
    return f" when { {var: [lo.json, hi.json] for var, (lo, hi) in launch.when.items()} }"


def _bound_tensors(buf: Buffer) -> int:
    """Checkpoint tensors a weight buffer's bind reads (an interleave counts each of its tensors)."""
    return sum(len(s.tensors) if isinstance(s, InterleaveSegment) else 1
               for s in buf.bind or () if not isinstance(s, DerivedSegment))


def manifest_lines(manifest: Manifest) -> list[str]:
    """Human summary of a verified manifest, one fact per line; the digest is the one computed from its content.
    A program's calls and launches count the programs it inlines, expanded as the runtime replays them
    (kern_manifest's `Program.flat_calls`, as `kern manifest check` counts)."""
    vars_ = manifest.vars
    at_max = var_max(vars_)
    lines = [f"manifest {manifest.name} ({manifest.format}), digest {manifest.digest[:12]}"]
    lines.append("vars: " + ", ".join(f"{k} [{v.min}, {v.max}]" for k, v in sorted(vars_.items())))
    states = manifest.states
    kinds = Counter(s.kind for s in states.values())
    per_token = sum(s.bytes_per_token or 0 for s in states.values())
    page_tokens = sorted({s.page_tokens for s in states.values() if s.kind == "paged" and s.page_tokens})
    lines.append(f"states: {len(states)} ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}); "
                 f"paged: {per_token} bytes/token in all, page_tokens {page_tokens}")
    by_kind: dict[str, list[int]] = {}
    for buf in manifest.buffers.values():
        by_kind.setdefault(buf.kind, []).append(buf.nbytes_at_max(vars_))
    lines.append("buffers: " + ", ".join(f"{k} {len(v)} ({_gib(sum(v))})" for k, v in sorted(by_kind.items())))
    lines.append("modules: " + ", ".join(f"{m} {mod.sha256[:12]}" for m, mod in sorted(manifest.modules.items())))
    for name, op in manifest.ops.items():
        for i, launch in enumerate(op.launches):
            if isinstance(launch, ExternLaunch):
                what = f"extern:{launch.extern.removeprefix('extern:')} (runtime built-in)"
            else:
                what = f"{launch.entry} in {launch.module} params [{_params(launch.params)}]"
            lines.append(f"op {name}[{i}]: {what}{_when_text(launch)}")
    weights = [b for b in manifest.buffers.values() if b.kind == "weight"]
    tensors = sum(_bound_tensors(b) for b in weights)
    concat = sum(1 for b in weights if len(b.bind or ()) > 1)
    derived = sum(1 for b in weights if any(isinstance(s, DerivedSegment) for s in b.bind or ()))
    lines.append(f"weights: {len(weights)} buffers ({_gib(sum(b.nbytes_at_max(vars_) for b in weights))}) bound from "
                 f"{tensors} checkpoint tensors; {concat} concatenations, {derived} derived")
    at_min = var_min(vars_)
    for pname, prog in manifest.programs.items():
        calls = prog.flat_calls(manifest)  # inlined programs expanded
        # a graph step at its smallest vars (decode: tokens = 1); a once or derive program at its vars' min, where
        # Runtime.load runs it; any other eager program at its largest
        at = at_min if prog.graph or prog.kind in ("once", "derive") else at_max
        launches = sum(launches_at(manifest.ops[c.op], at) for c in calls)
        where = ", ".join(f"{k}={v}" for k, v in sorted(at.items()))
        graph = f"graph: {launches} launches -> 1 graph launch per step" if prog.graph else "eager"
        counted = f"{_count(len(calls), 'call')}, {_count(launches, 'launch', 'launches')}"
        lines.append(f"program {pname} ({prog.kind}): {counted} at {where}, {graph}")
    return lines


def launches_at(op: Op, values: Mapping[str, int]) -> int:
    """Launches of `op` that run at var `values`: a launch with `when` only where every bound holds (bounds are
    kern_manifest expressions over the vars, a var absent from `values` is not bounded; of a `when` group exactly
    one launch holds)."""

    def holds(launch: AnyLaunch) -> bool:
        return all(var not in values or lo.eval(values) <= values[var] <= hi.eval(values)
                   for var, (lo, hi) in (launch.when or {}).items())

    return sum(1 for launch in op.launches if holds(launch))


def runtime_lines(described: dict[str, Any]) -> list[str]:
    """Lines from `Runtime.describe()`: whatever it reports beyond the manifest, key by key (shape-agnostic)."""
    lines = []
    for key, value in described.items():
        if isinstance(value, dict) and len(value) > 8:
            lines.append(f"runtime {key}: {len(value)} entries")
        elif isinstance(value, list) and len(value) > 8:
            lines.append(f"runtime {key}: {len(value)} items")
        else:
            lines.append(f"runtime {key}: {value}")
    return lines
