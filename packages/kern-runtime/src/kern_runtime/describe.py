"""`Runtime.describe()`: what a loaded runtime holds, as a JSON-able dict (kern run logs it at start): vars,
states with their allocated bytes, the pool's geometry, buffer classes with bytes at var max, every launch
(entry + parameter layout + module, or the built-in extern), weight binds, per program its calls, launches and
the vars its graph key reads."""

from __future__ import annotations

from typing import Any

from kern_manifest import ExternLaunch, Launch

from .program.records import when_of


def describe(rt: Any) -> dict[str, Any]:
    """`Runtime.describe()`: a JSON-able summary of a loaded runtime for startup logs."""
    spec, maxv = rt.manifest, rt.max_values
    classes: dict[str, dict[str, int]] = {}
    for name, buf in spec.buffers.items():
        entry = classes.setdefault(buf.kind, {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += buf.nbytes_at(maxv)
    launches = []
    for op in spec.ops.values():
        for li, launch in enumerate(op.launches):
            if isinstance(launch, Launch):
                launches.append({"op": op.name, "entry": launch.entry, "module": launch.module,
                                 "params": [list(p) for p in launch.params], "when": _when_json(launch)})
            else:
                launches.append({"op": op.name, "extern": launch.name, "module": "runtime built-in",
                                 "algo": launch.algo.to_json() if launch.algo else None, "when": _when_json(launch)})
    weights = [b for b in spec.buffers.values() if b.kind == "weight"]
    states = {}
    for name, st in spec.states.items():
        states[name] = {"kind": st.kind, "bytes": rt._states[name].nbytes if name in rt._states else 0}
    return {
        "manifest": spec.name, "digest": spec.digest, "gpu": rt.gpu,
        "vars": {n: [v.min, v.max] for n, v in spec.vars.items()},
        "states": states,
        "pool": None if rt.pool is None else {
            "page_tokens": rt.pool.page_tokens, "num_pages": rt.pool.num_pages, "num_slots": rt.pool.num_slots,
            "block_bytes": rt.pool.block_bytes, "scratch_page_id": rt.pool.scratch_page_id},
        "buffers": classes,
        "launches": launches,
        "binds": {"buffers": len(weights), "derived": sum(1 for b in weights if b.derived),
                  "segments": sum(len(b.bind or ()) for b in weights),
                  "bytes": sum(b.nbytes_at(maxv) for b in weights)},
        "weight_load": {"bytes": rt.weight_load_stats[0], "seconds": rt.weight_load_stats[1]},
        "programs": {n: {"kind": p.kind, "graph": p.graph, "calls": p.calls,
                         "launches": len(p.records), "graph_launches": 1 if p.graph else None,
                         "vars_read": sorted(p.reads)} for n, p in
                      (rt.programs.states.items() if rt.programs is not None else ())},
    }


def _when_json(launch: Launch | ExternLaunch) -> dict[str, list[str]] | None:
    when = when_of(launch)
    if not when:
        return None
    return {var: [lo.source, hi.source] for var, lo, hi in when}
