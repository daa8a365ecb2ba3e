#!/usr/bin/env python3
"""Peer barrier gate on N GPUs of one host (one process, one Runtime per GPU, connect_local).

    python3 bench/peer_barrier.py [--gpus 2] [--iters 200] [--bursts 20] [--burst 100] [--drop R]

Reports
- eager: `run("barrier")` on every rank then synchronize every rank, microseconds per barrier;
- captured: the `burst` program (`--burst` barriers in one CUDA graph) on every rank, microseconds
  per barrier;
- with `--drop R`: rank R never runs the barrier; every other rank must report a timeout naming R
  within 2 s (the manifest's timeout is 1 s) instead of hanging. Exit status 1 if not.

The manifest comes from tools/gen_peer_barrier.py (SPMD: the same for every rank).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
os.environ["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast (the barrier uses no NCCL anyway)


def _timed_rounds(rts: list, group, step: Callable[[Any], None], rounds: int, *, sync_each: bool) -> float:
    """Seconds for `rounds` rounds of `step(rt)` on every rank's runtime, after one warm-up round and a group
    synchronize; the group synchronizes after each round (`sync_each`) or once after the last."""
    for rt in rts:
        step(rt)
    group.synchronize()
    t0 = time.perf_counter()
    for _ in range(rounds):
        for rt in rts:
            step(rt)
        if sync_each:
            group.synchronize()
    if not sync_each:
        group.synchronize()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--bursts", type=int, default=20)
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--timeout-ms", type=int, default=1000)
    parser.add_argument("--drop", type=int, default=None, help="rank that never arrives (timeout check)")
    parser.add_argument("--kernels", type=Path, default=REPO / "kernels")
    args = parser.parse_args(argv)

    from tools.gen_peer_barrier import build_manifest
    from kern_runtime import Runtime
    from kern_runtime import connect_local

    manifest = build_manifest(args.gpus, json.loads((args.kernels / "kernels.json").read_text()), args.burst,
                              args.timeout_ms * 1_000_000)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(manifest, f)
        path = f.name
    rts = [Runtime.load(path, args.kernels, None, gpu=g, ranks={"world": g}) for g in range(args.gpus)]
    group = connect_local(rts)
    result: dict[str, object] = {"gpus": args.gpus, "handles": sorted({h.kind for rt in rts for h in rt.export_handles().values()})}
    ok = True
    try:
        if args.drop is None:
            eager_s = _timed_rounds(rts, group, lambda rt: rt.run("barrier"), args.iters, sync_each=True)
            eager_us = 1e6 * eager_s / args.iters
            burst_s = _timed_rounds(rts, group, lambda rt: rt.issue("burst"), args.bursts, sync_each=False)
            burst_us = 1e6 * burst_s / (args.bursts * args.burst)
            status = [rt.read_output("status").tolist() for rt in rts]
            ok = all(s == [0, -1] for s in status)
            result.update(eager_run_sync_us=round(eager_us, 2), captured_burst_us_per_barrier=round(burst_us, 3),
                          status=status)
            print(f"peer barrier, {args.gpus} GPUs ({'/'.join(result['handles'])} handles): eager run+sync "
                  f"{eager_us:.1f} us/barrier, captured burst {burst_us:.2f} us/barrier; status {status}")
        else:
            present = [rt for g, rt in enumerate(rts) if g != args.drop]
            t0 = time.perf_counter()
            for rt in present:
                rt.run("barrier")
            for rt in present:
                rt.synchronize()
            waited = time.perf_counter() - t0
            status = {g: rts[g].read_output("status").tolist() for g in range(args.gpus) if g != args.drop}
            ok = waited < 2.0 and all(s == [1, args.drop] for s in status.values())
            for g, s in status.items():
                what = f"timeout waiting for rank {s[1]}" if s[0] == 1 else "passed (unexpected)"
                print(f"rank {g}: {what} after {waited:.2f} s")
            result.update(drop=args.drop, waited_s=round(waited, 3), status=status)
        result["ok"] = ok
        print(json.dumps(result))
    finally:
        group.close()
        os.unlink(path)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
