#!/usr/bin/env python3
"""Generate the SPMD peer-barrier manifest (kernels-src/peer_barrier.cu): one manifest for every rank.

    topology   world: {size: N}
    buffers    flags   u64[N] workspace, export   (member m writes slot r of rank r's flags)
               peers   u64[N] workspace, peers of flags in world (filled at connect)
               epoch   u64[1] workspace          (barriers passed; advanced on the device)
               status  i32[2] output             ({0 passed | 1 timeout, lowest missing member | -1})
    programs   barrier  one barrier (eager)
               burst    `burst` barriers, captured as one CUDA graph

Usage: python tools/gen_peer_barrier.py --size 2 --out /tmp/peer-barrier-2.json [--burst 100] [--timeout-ms 1000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ENTRY = "kern_peer_barrier"
PARAM_SIZES = [8, 4, 4, 8, 8, 8]  # peers, rank, size, epoch, status, timeout_ns


def build_manifest(size: int, kernels: dict[str, Any], burst: int = 100, timeout_ns: int = 1_000_000_000) -> dict[str, Any]:
    """The manifest object (with digest). Raises ValueError when kernels.json lacks the barrier."""
    if not 1 <= size <= 32:
        raise ValueError(f"group size {size} must lie in [1, 32] (one thread per member)")
    module = kernels.get("modules", {}).get("peer_barrier")
    if module is None or ENTRY not in module.get("entries", {}):
        raise ValueError("kernels.json has no peer_barrier module: python tools/build_kernels.py --modules peer_barrier")
    params = module["entries"][ENTRY]["params"]
    if [s for _, s in params] != PARAM_SIZES:
        raise ValueError(f"{ENTRY} params {params} do not match the contract sizes {PARAM_SIZES}")
    barrier_call = {"op": "barrier", "args": {"peers": "peers", "epoch": "epoch", "status": "status"}}
    manifest: dict[str, Any] = {
        "format": "kern-manifest/1",
        "name": f"peer-barrier-{size}",
        "meta": {"generator": "tools/gen_peer_barrier.py", "timeout_ns": timeout_ns, "burst": burst},
        "vars": {"tokens": {"min": 1, "max": 1}},
        "modules": {"peer_barrier": module["sha256"]},
        "topology": {"world": {"size": size}},
        "buffers": {
            "flags": {"kind": "workspace", "dtype": "u64", "shape": [size], "export": True},
            "peers": {"kind": "workspace", "dtype": "u64", "shape": [size], "peers": {"of": "flags", "group": "world"}},
            "epoch": {"kind": "workspace", "dtype": "u64", "shape": [1]},
            "status": {"kind": "output", "dtype": "i32", "shape": [2]},
        },
        "ops": {
            "barrier": {
                "args": [{"name": "peers", "kind": "ptr"}, {"name": "epoch", "kind": "ptr"},
                         {"name": "status", "kind": "ptr"}],
                "launches": [{
                    "module": "peer_barrier", "entry": ENTRY, "grid": [1, 1, 1], "block": [32, 1, 1],
                    "params": params,
                    "args": [{"arg": "peers"}, {"rank": "world", "type": "i32"}, {"i32": size}, {"arg": "epoch"},
                             {"arg": "status"}, {"i64": timeout_ns}],
                }],
            },
        },
        "programs": {
            "barrier": {"calls": [barrier_call]},
            "burst": {"graph": True, "calls": [barrier_call] * burst},
        },
    }
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    manifest["digest"] = hashlib.sha256(body.encode()).hexdigest()
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2)
    parser.add_argument("--kernels", type=Path, default=REPO / "kernels" / "kernels.json")
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--timeout-ms", type=int, default=1000)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        manifest = build_manifest(args.size, json.loads(args.kernels.read_text()), args.burst, args.timeout_ms * 1_000_000)
    except (ValueError, OSError) as exc:
        print(f"gen_peer_barrier: {exc}", file=sys.stderr)
        return 1
    args.out.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"gen_peer_barrier: wrote {args.out} (world of {args.size}, burst {args.burst})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
