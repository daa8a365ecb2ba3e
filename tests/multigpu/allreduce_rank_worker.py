"""One rank process of tests/multigpu/test_allreduce_gpu.py and bench/allreduce.py, started by `spawn_ranks`.

    python allreduce_rank_worker.py check MANIFEST KERNELS OUT SIZES
    python allreduce_rank_worker.py absent MANIFEST KERNELS OUT COUNT [PROGRAM]
    python allreduce_rank_worker.py gather MANIFEST KERNELS OUT ROWS

Loads the all-reduce manifest (tools/gen_allreduce.py) on GPU KERN_TP_RANK with ranks {"tp": rank}, zeroes the
status word, joins the group with kern_run.tp_procs.join_group (portable offers: fabric handles, else POSIX file
descriptors over the rendezvous socket; NCCL joined) and then:

- check: for every size n of SIZES (comma list), writes x = inputs(rank, n) and residual = residual(rank, n),
  runs `sum` and `add`, then x = inputs(rank + 100, n) through the captured burst `sum_g` (20 calls) and `nccl`,
  and saves what each produced to OUT/rank<r>.npz (keys sum_<n>, add_<n>, sum_g_<n>, nccl_<n>) with the status
  word;
- absent: rank 0 runs `sum` of COUNT elements (PROGRAM `gather`: the all-gather of COUNT rows) while rank 1
  (joined, then idle) never does; rank 0 writes OUT/rank0.json with the status word and the seconds the call
  took; rank 1 waits for that file, then exits;
- gather (a manifest with --gather-vocab): for every row count r of ROWS (comma list), writes gx =
  gather_inputs(rank, r * slice), runs `gather`, then gx = gather_inputs(rank + 100, ...) through the captured
  burst `gather_g`, and saves gout's r x vocab elements of each to OUT/rank<r>.npz (keys gather_<r>,
  gather_g_<r>) with the status word.
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


def gather_inputs(rank: int, n: int) -> np.ndarray:
    """bf16 bits uint16[n]: rank `rank`'s logits slice of n = rows x slice elements (seeded, normal values)."""
    from tools.reference_kernels import bf16_bits

    return bf16_bits(np.random.default_rng(5000 + 1000 * rank + n).standard_normal(n).astype(np.float32))


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
        program = argv[5] if len(argv) > 5 else "sum"
        if me.rank == 0:
            t0 = time.perf_counter()
            rt.run(program, {"rows" if program == "gather" else "n": int(argv[4])})
            rt.synchronize()
            (out / "rank0.json").write_text(json.dumps({"status": status.tolist(), "seconds": time.perf_counter() - t0}))
        else:
            while not (out / "rank0.json").exists():
                time.sleep(0.05)
        rt.close()
        return 0
    saved: dict[str, np.ndarray] = {}
    if mode == "gather":
        lm = rt.manifest.meta["tp"]["lm_head"]
        for rows in [int(s) for s in argv[4].split(",")]:
            for key, seed in ((f"gather_{rows}", me.rank), (f"gather_g_{rows}", me.rank + 100)):
                rt.write_input("gx", gather_inputs(seed, rows * lm["slice"]))
                if key.startswith("gather_g"):
                    rt.issue("gather_g", {"rows": rows})
                else:
                    rt.run("gather", {"rows": rows})
                saved[key] = rt.read_output("gout", rows * lm["vocab"]).copy()
        saved["status"] = status.copy()
        np.savez(out / f"rank{me.rank}.npz", **saved)
        rt.close()
        return 0
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
