"""One rank process of tests/multigpu/test_allreduce_gpu.py and bench/allreduce.py, started by `spawn_ranks`.

    python allreduce_rank_worker.py check MANIFEST KERNELS OUT SIZES
    python allreduce_rank_worker.py absent MANIFEST KERNELS OUT COUNT

Loads the all-reduce manifest (tools/gen_allreduce.py) on GPU KERN_TP_RANK with ranks {"tp": rank}, zeroes the
status word, joins the group with kern_run.tp_procs.join_group (portable offers: fabric handles, else POSIX file
descriptors over the rendezvous socket; NCCL joined) and then:

- check: for every size n of SIZES (comma list), writes x = inputs(rank, n) and residual = residual(rank, n),
  runs `sum` and `add`, then x = inputs(rank + 100, n) through the captured burst `sum_g` (20 calls) and `nccl`,
  and saves what each produced to OUT/rank<r>.npz (keys sum_<n>, add_<n>, sum_g_<n>, nccl_<n>) with the status
  word;
- absent: rank 0 runs `sum` of COUNT elements while rank 1 (joined, then idle) never does; rank 0 writes
  OUT/rank0.json with the status word and the seconds the call took; rank 1 waits for that file, then exits.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np


def inputs(rank: int, n: int) -> np.ndarray:
    """bf16 bits uint16[n]: rank `rank`'s partial of an n-element message (seeded, normal values)."""
    from tools.reference_kernels import bf16_bits

    return bf16_bits(np.random.default_rng(1000 * rank + n).standard_normal(n).astype(np.float32))


def residual(rank: int, n: int) -> np.ndarray:
    """bf16 bits uint16[n]: the residual every rank holds before `add` (the same on every rank)."""
    from tools.reference_kernels import bf16_bits

    return bf16_bits(np.random.default_rng(77 + n).standard_normal(n).astype(np.float32) * 4)


def main(argv: list[str]) -> int:
    from kern_run.tp_procs import join_group
    from kern_run.tp_rendezvous import rank_env
    from kern_runtime import Runtime

    mode, manifest, kernels, out = argv[0], argv[1], argv[2], Path(argv[3])
    me = rank_env()
    rt = Runtime.load(manifest, kernels, None, gpu=me.rank, ranks={"tp": me.rank})
    status = rt.host_array("ar_status")
    status[:] = 0
    join_group(rt, me, 120.0)
    if mode == "absent":
        if me.rank == 0:
            t0 = time.perf_counter()
            rt.run("sum", {"n": int(argv[4])})
            rt.synchronize()
            (out / "rank0.json").write_text(json.dumps({"status": status.tolist(), "seconds": time.perf_counter() - t0}))
        else:
            while not (out / "rank0.json").exists():
                time.sleep(0.05)
        rt.close()
        return 0
    saved: dict[str, np.ndarray] = {}
    for n in [int(s) for s in argv[4].split(",")]:
        rt.write_input("x", inputs(me.rank, n))
        rt.write_input("residual", residual(me.rank, n))
        rt.run("sum", {"n": n})
        saved[f"sum_{n}"] = rt.read_output("out", n).copy()
        rt.run("add", {"n": n})
        saved[f"add_{n}"] = rt.read_buffer("residual", n).copy()
        rt.write_input("x", inputs(me.rank + 100, n))  # the graph's result differs from what `sum` left in out
        rt.issue("sum_g", {"n": n})
        saved[f"sum_g_{n}"] = rt.read_output("out", n).copy()
        rt.run("nccl", {"n": n})
        saved[f"nccl_{n}"] = rt.read_output("out", n).copy()
    saved["status"] = status.copy()
    np.savez(out / f"rank{me.rank}.npz", **saved)
    rt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
