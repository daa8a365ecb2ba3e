"""Manifests for the multi-GPU tests (CPU and GPU)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall")
DTYPES = ("f32", "bf16")


def _digest(m: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()).hexdigest()


def nccl_manifest(size: int = 2, count: int = 1024) -> dict[str, Any]:
    """Every NCCL extern: op `<coll>_<dt>(send, recv)` with count `count` per rank; programs
    `<coll>_<dt>` (eager) and `<coll>_<dt>_g` (graph). Buffers send_<dt> (input) / recv_<dt> (output)
    of count * size elements."""
    buffers, ops, programs = {}, {}, {}
    for dt in DTYPES:
        buffers[f"send_{dt}"] = {"kind": "input", "dtype": dt, "shape": [count * size]}
        buffers[f"recv_{dt}"] = {"kind": "output", "dtype": dt, "shape": [count * size]}
        for coll in COLLECTIVES:
            name = f"{coll}_{dt}"
            ops[name] = {"args": [{"name": "send", "kind": "ptr"}, {"name": "recv", "kind": "ptr"}],
                         "launches": [{"extern": f"nccl_{coll}_{dt}",
                                       "args": [{"arg": "send"}, {"arg": "recv"}, {"i64": count}, {"rank": "tp"}]}]}
            call = {"op": name, "args": {"send": f"send_{dt}", "recv": f"recv_{dt}"}}
            programs[name] = {"calls": [call]}
            programs[f"{name}_g"] = {"graph": True, "calls": [call]}
    m = {"format": "kern-manifest/1", "name": "nccl-externs", "vars": {"tokens": {"min": 1, "max": 1}},
         "modules": {}, "topology": {"tp": {"size": size}}, "buffers": buffers, "ops": ops, "programs": programs}
    m["digest"] = _digest(m)
    return m


def barrier_manifest(size: int = 2, timeout_ns: int = 1_000_000_000, burst: int = 10) -> dict[str, Any]:
    from tools.gen_peer_barrier import build_manifest

    return build_manifest(size, json.loads((REPO / "kernels" / "kernels.json").read_text()), burst, timeout_ns)


def reference(coll: str, sends: list, count: int):
    """Per-rank expected recv (numpy float64) of `coll` given every rank's send (float64 arrays)."""
    import numpy as np

    n = len(sends)
    if coll == "allreduce":
        total = sum(s[:count] for s in sends)
        return [total.copy() for _ in range(n)]
    if coll == "allgather":
        full = np.concatenate([s[:count] for s in sends])
        return [full.copy() for _ in range(n)]
    if coll == "reducescatter":
        total = sum(sends)
        return [total[r * count:(r + 1) * count] for r in range(n)]
    # alltoall: rank r's block p lands in rank p's block r
    return [np.concatenate([sends[p][r * count:(r + 1) * count] for p in range(n)]) for r in range(n)]
