"""What a manifest declares, as short text lines: `kern inspect` prints them, `kern run` logs them at start.

Computed from the manifest JSON alone (no GPU): vars, states, buffer classes with bytes at var max, each
op's launches (entry + parameter layout + module, or the runtime built-in), weight binds, and per
program its calls and launches (inlined programs expanded) and whether it is captured as a graph.
`runtime_lines` adds what only a loaded runtime knows (its `describe()`): allocated bytes, pages, captured graphs.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from kern_manifest import DTYPE_BYTES


def eval_at_max(dim: Any, var_max: dict[str, int]) -> int:
    """A shape dim (int or expression string) at the vars' max, via kern_manifest's parser when present."""
    if isinstance(dim, int):
        return dim
    try:
        from kern_manifest import parse_expr

        return int(parse_expr(dim).eval(var_max))
    except Exception:  # noqa: BLE001 - fall back to a plain lookup
        return int(var_max.get(str(dim).strip(), 0))


def buffer_bytes(buf: dict[str, Any], var_max: dict[str, int]) -> int:
    return math.prod(eval_at_max(d, var_max) for d in buf["shape"]) * DTYPE_BYTES.get(buf["dtype"], 1)


def _gib(n: int) -> str:
    return f"{n / 2**30:.3f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def _params(params: list[list[int]]) -> str:
    return " ".join(f"{o}:{s}" for o, s in params)


def manifest_lines(raw: dict[str, Any], parsed: Any = None) -> list[str]:
    """Human summary of a manifest, one fact per line. `parsed`: the kern_manifest.Manifest of `raw` (parsed
    here when not given); a program's calls and launches count the programs it inlines, expanded as the runtime
    replays them (kern_manifest's `Program.flat_calls`, as `kern manifest check` counts)."""
    if parsed is None:
        from kern_manifest import parse_manifest

        parsed = parse_manifest(raw)
    var_max = {k: int(v["max"]) for k, v in raw.get("vars", {}).items()}
    lines = [f"manifest {raw.get('name', '?')} ({raw.get('format', '?')}), digest {str(raw.get('digest', '-'))[:12]}"]
    lines.append("vars: " + ", ".join(f"{k} [{v['min']}, {v['max']}]" for k, v in sorted(raw.get("vars", {}).items())))
    states = raw.get("states", {})
    kinds = Counter(s["kind"] for s in states.values())
    per_token = sum(int(s.get("bytes_per_token", 0)) for s in states.values())
    page_tokens = sorted({int(s["page_tokens"]) for s in states.values() if s.get("kind") == "paged"})
    lines.append(f"states: {len(states)} ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}); "
                 f"paged: {per_token} bytes/token in all, page_tokens {page_tokens}")
    by_kind: dict[str, list[int]] = {}
    for buf in raw.get("buffers", {}).values():
        by_kind.setdefault(buf["kind"], []).append(buffer_bytes(buf, var_max))
    lines.append("buffers: " + ", ".join(f"{k} {len(v)} ({_gib(sum(v))})" for k, v in sorted(by_kind.items())))
    lines.append(f"modules: " + ", ".join(f"{m} {sha[:12]}" for m, sha in sorted(raw.get("modules", {}).items())))
    for name, op in raw.get("ops", {}).items():
        for i, launch in enumerate(op.get("launches", [])):
            if "extern" in launch:
                what = f"extern:{str(launch['extern']).removeprefix('extern:')} (runtime built-in)"
            else:
                what = f"{launch['entry']} in {launch['module']} params [{_params(launch['params'])}]"
            when = f" when {launch['when']}" if "when" in launch else ""
            lines.append(f"op {name}[{i}]: {what}{when}")
    weights = [b for b in raw.get("buffers", {}).values() if b["kind"] == "weight"]
    tensors = sum(len(s.get("interleave", [s.get("tensor")])) for b in weights for s in b.get("bind", []) if not s.get("derived"))
    concat = sum(1 for b in weights if len(b.get("bind", [])) > 1)
    derived = sum(1 for b in weights if any(s.get("derived") for s in b.get("bind", [])))
    lines.append(f"weights: {len(weights)} buffers ({_gib(sum(buffer_bytes(b, var_max) for b in weights))}) bound from "
                 f"{tensors} checkpoint tensors; {concat} concatenations, {derived} derived")
    ops = raw.get("ops", {})
    var_min = {k: int(v["min"]) for k, v in raw.get("vars", {}).items()}
    for pname, prog in raw.get("programs", {}).items():
        calls = parsed.programs[pname].flat_calls(parsed)  # inlined programs expanded
        at = var_min if prog.get("graph") else var_max  # a graph step at its smallest vars (decode: tokens = 1)
        launches = sum(launches_at(ops.get(c.op, {}), at) for c in calls)
        where = ", ".join(f"{k}={v}" for k, v in sorted(at.items()))
        kind = prog.get("kind", "run")
        graph = f"graph: {launches} launches -> 1 graph launch per step" if prog.get("graph") else "eager"
        lines.append(f"program {pname} ({kind}): {len(calls)} calls, {launches} launches at {where}, {graph}")
    return lines


def launches_at(op: dict[str, Any], values: dict[str, int]) -> int:
    """Launches of `op` that run at var `values`: a launch with `when` only where every bound holds
    (bounds are kern_manifest expressions over the vars; of a `when` group exactly one launch holds)."""
    from kern_manifest import parse_expr

    def holds(when: dict[str, Any]) -> bool:
        return all(var not in values or parse_expr(lo).eval(values) <= values[var] <= parse_expr(hi).eval(values)
                   for var, (lo, hi) in when.items())

    return sum(1 for launch in op.get("launches", []) if holds(launch.get("when") or {}))


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
