"""Park / wake bandwidth of the runtime's host tier against a raw pinned copy of the same bytes.

    python3 bench/park_wake.py [--gib 1 4 8] [--states 36] [--bytes-per-token 4096] [--repeat 3]

A manifest with `--states` paged states (default: the qwen3-4b shape, 36 states x 4096 B/token, 16-token
pages = 2.25 MiB per page of all states) and no kernels; capacity for the largest size. Per size: one
lease of that many bytes of pages, retired, parked (`room` + `park`, copies on the transfer stream,
`settle` until landed), woken (`wake` + `awake`), best of `--repeat`. Issue latency = time for the
`park` / `wake` call to return. Raw = one `cuMemcpyDtoHAsync` / `cuMemcpyHtoDAsync` of the same bytes
between a cuMemAlloc buffer and the same pinned allocation. Target: park and wake >= 80% of raw.
Prints GB/s (1e9 bytes/s) and microseconds; run on the GPU machine (`tools/device-session.sh bench-park`).
"""

from __future__ import annotations

import argparse
import sys
import time

from kern_runtime import Capacity, Runtime
from kern_runtime.cuda import call


def manifest(states: int, bytes_per_token: int) -> dict:
    return {
        "format": "kern-manifest/1", "name": "park-wake-bench",
        "vars": {"tokens": {"min": 1, "max": 1}},
        "modules": {},
        "buffers": {"x": {"kind": "input", "dtype": "i32", "shape": ["tokens"]}},
        "states": {f"kv.{i}": {"kind": "paged", "bytes_per_token": bytes_per_token, "page_tokens": 16}
                   for i in range(states)},
        "ops": {},
        "programs": {"step": {"calls": []}},
    }


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, nargs="+", default=[1, 4, 8])
    ap.add_argument("--states", type=int, default=36)
    ap.add_argument("--bytes-per-token", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    per_token = args.states * args.bytes_per_token
    page_bytes = 16 * per_token
    max_pages = max(int(g * (1 << 30)) // page_bytes for g in args.gib)
    rt = Runtime.load(manifest(args.states, args.bytes_per_token), ".", None,
                      capacity=Capacity(tokens=(max_pages + 1) * 16, seqs=1))
    t_host = timed(lambda: rt.reserve_host(pages=max_pages))
    host = rt.host_memory
    nbytes_max = max_pages * page_bytes
    dev = int(call("cuMemAlloc", nbytes_max))
    stream = call("cuStreamCreate", 1)
    print(f"{args.states} paged states x {args.bytes_per_token} B/token; page (all states) {page_bytes / 2**20:.2f} MiB; "
          f"pinned {nbytes_max / 2**30:.2f} GiB in {t_host:.2f} s (NUMA node {host.numa_node})")
    print(f"{'GiB':>6} {'pages':>6} | {'raw d2h':>8} {'park':>8} {'%':>5} {'issue us':>9} | "
          f"{'raw h2d':>8} {'wake':>8} {'%':>5} {'issue us':>9}")
    worst = 1.0
    for gib in args.gib:
        pages = int(gib * (1 << 30)) // page_bytes
        nbytes = pages * page_bytes
        tokens = pages * 16

        def raw(direction: str) -> float:
            def go() -> None:
                if direction == "d2h":
                    call("cuMemcpyDtoHAsync", host.address, dev, nbytes, stream)
                else:
                    call("cuMemcpyHtoDAsync", dev, host.address, nbytes, stream)
                call("cuStreamSynchronize", stream)
            return min(timed(go) for _ in range(args.repeat))

        park_s, wake_s, park_issue, wake_issue = [], [], [], []
        for _ in range(args.repeat):
            cp = rt.retire(rt.lease(tokens), tokens)
            room = rt.room(cp)
            rt.synchronize()
            t0 = time.perf_counter()
            parked = rt.park(room)
            t1 = time.perf_counter()
            rt.settle()
            t2 = time.perf_counter()
            park_issue.append(t1 - t0)
            park_s.append(t2 - t0)
            t0 = time.perf_counter()
            waking = rt.wake(parked, tokens, tokens)
            t1 = time.perf_counter()
            waking.wait()
            t2 = time.perf_counter()
            lease = rt.awake(waking)
            assert lease is not None
            wake_issue.append(t1 - t0)
            wake_s.append(t2 - t0)
            lease.close()
            parked.close()
        r_d2h, r_h2d = raw("d2h"), raw("h2d")
        gbs = lambda s: nbytes / s / 1e9  # noqa: E731
        p, w = gbs(min(park_s)), gbs(min(wake_s))
        worst = min(worst, p / gbs(r_d2h), w / gbs(r_h2d))
        print(f"{gib:6.1f} {pages:6d} | {gbs(r_d2h):8.1f} {p:8.1f} {100 * p / gbs(r_d2h):5.0f} "
              f"{1e6 * min(park_issue):9.0f} | {gbs(r_h2d):8.1f} {w:8.1f} {100 * w / gbs(r_h2d):5.0f} "
              f"{1e6 * min(wake_issue):9.0f}")
    call("cuMemFree", dev)
    call("cuStreamDestroy", stream)
    rt.close()
    print(f"worst park/wake vs raw: {100 * worst:.0f}% (target >= 80%)")
    return 0 if worst >= 0.8 else 1


if __name__ == "__main__":
    sys.exit(main())
