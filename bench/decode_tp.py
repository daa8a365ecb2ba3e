#!/usr/bin/env python3
"""Tensor-parallel decode, bs = 1: TP = 1 against TP = 2, 4, 8 (one process per GPU, as `kern run --tp N`), the
one-shot all-reduce against NCCL, with each configuration's weight floor per rank. Reached as
`bench/decode.py --tp 1,2,4,8`.

    python3 bench/decode.py --tp 1,2,4,8 [--shapes qwen3-8b,qwen3-14b] [--ctx 128] [--steps 256] [--json out.json]

Per shape (checkpoint `$KERN_WEIGHTS/<shape>`, else --weights-dir/<shape>, made with tools/make_checkpoint.py when
missing) the manifests are built into a temporary directory: TP = 1 `kern manifest build --gemv v2` (the wiring the
TP ranks use), TP = N `--tp N` (one-shot all-reduce: `allreduce_add` after the row-parallel GEMVs) and TP = N
`--tp N --allreduce-oneshot-bytes 0` (NCCL all-reduce + add_rmsnorm), both with the vocabulary-parallel lm_head
(each rank's slice of the logits, then the one-shot all-gather), and `--tp N --tp-lm-head replicated` (one-shot
all-reduce, every rank reading the whole lm_head: what the vocabulary split saves). Each runs a `--ctx`-token
prompt then `--steps` greedy decode steps through the pipelined loop (the `kern run` path); ms/token = the median
interval between tokens arriving on rank 0's host. Floor per rank = the bytes of rank 0's weight buffers / 4.3 TB/s
(the replicated embedding and the rank's lm_head included: a lower bound of what a rank reads per step). Needs
max(--tp) GPUs; TP degrees above the visible count are skipped with a note. The issue's targets: 8B TP=2 <= 0.60 x TP=1, 14B
TP=4 <= 0.35 x TP=1 (docs/perf.md "Tensor parallelism, one process per GPU").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HBM_BYTES_PER_S = 4.3e12


def weight_bytes(manifest: dict[str, Any]) -> int:
    """Bytes of a manifest's checkpoint-bound weight buffers (their shapes have no vars)."""
    sizes = {"bf16": 2, "f32": 4, "f16": 2, "i32": 4}
    total = 0
    for buf in manifest["buffers"].values():
        bind = buf.get("bind") or []
        if buf["kind"] == "weight" and bind and not any("derived" in seg for seg in bind):
            total += math.prod(int(d) for d in buf["shape"]) * sizes[buf["dtype"]]
    return total


def ms_per_token(token_s: list[float]) -> float:
    gaps = [1e3 * (b - a) for a, b in zip(token_s, token_s[1:])]
    return statistics.median(gaps) if gaps else float("nan")


def _build(args: list[str]) -> None:
    from tools.gen_qwen3 import main

    if main(args) != 0:
        raise SystemExit(f"bench/decode_tp.py: kern manifest build {' '.join(args)} failed")


def _prompt(n: int, seed: int = 0) -> list[int]:
    import numpy as np

    return np.random.default_rng(seed).integers(0, 151643, size=n).tolist()


def tp1_worker(args: argparse.Namespace) -> int:
    """TP = 1 in this process (its own subprocess): warm-up, then the timed generation; one JSON line on stdout."""
    from kern_run.generate import GenerateOptions, Generator
    from kern_run.preflight import read_manifest

    facts = read_manifest(args.manifest)
    gen = Generator.open(args.manifest, args.kernels, args.ckpt, facts, gpu=0, capacity_tokens=args.ctx + args.steps + 64)
    chunk = min(512, facts.tokens_max)
    gen.generate(_prompt(20), GenerateOptions(4, chunk, stop_at_eos=False))
    r = gen.generate(_prompt(args.ctx, 1), GenerateOptions(args.steps + 1, chunk, stop_at_eos=False))
    print(json.dumps({"ms_per_token": ms_per_token(r.timings.token_s), "weights": list(gen.rt.weight_load_stats)}))
    gen.close()
    return 0


def run_tp(manifest: Path, ckpt: Path, kernels: Path, tp: int, ctx: int, steps: int, work: Path) -> dict[str, Any]:
    from kern_run.config import RunConfig
    from kern_run.tp_procs import run_jobs

    cfg = RunConfig(manifest, kernels, ckpt, gpu=0, capacity_tokens=ctx + steps + 64)
    jobs = [{"kind": "generate", "name": "warm", "prompt_ids": _prompt(20), "steps": 4},
            {"kind": "generate", "name": "run", "prompt_ids": _prompt(ctx, 1), "steps": steps + 1, "lookahead": 4}]
    out = run_jobs(cfg, tp, jobs, work, log_level="warning")
    return {"ms_per_token": ms_per_token(out["jobs"]["run"]["token_s"]), "weights": out["weights"]}


def bench_shape(shape: str, ckpt: Path, kernels: Path, tps: list[int], gpus: int, ctx: int, steps: int,
                notes: list[str]) -> list[dict[str, Any]]:
    if not (ckpt / "config.json").is_file():
        print(f"# {ckpt} missing: making it (tools/make_checkpoint.py --shape {shape})", flush=True)
        subprocess.run([sys.executable, str(REPO / "tools" / "make_checkpoint.py"), "--shape", shape, "--out",
                        str(ckpt)], check=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"kern-bench-tp-{shape}-"))
    rows: list[dict[str, Any]] = []
    base = ["--shape", shape, "--kernels", str(kernels), "--max-context", str(max(4096, ctx + steps + 64))]
    for tp in tps:
        if tp > gpus:
            notes.append(f"{shape} TP={tp}: skipped, {gpus} GPU(s) visible")
            continue
        if tp == 1:
            m = tmp / f"{shape}.json"
            _build([*base, "--gemv", "v2", "--out", str(m)])
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker-tp1", "--manifest", str(m),
                                   "--ckpt", str(ckpt), "--kernels", str(kernels), "--ctx", str(ctx), "--steps",
                                   str(steps)], capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                notes.append(f"{shape} TP=1: {proc.stderr.strip()[-300:]}")
                continue
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            floor = weight_bytes(json.loads(m.read_text())) / HBM_BYTES_PER_S * 1e3
            rows.append({"shape": shape, "tp": 1, "variant": "-", "floor_ms": floor, **got})
            continue
        for variant, tag, extra in VARIANTS:
            m = tmp / f"{shape}-{tag}.json"
            _build([*base, "--tp", str(tp), *extra, "--out", str(m)])
            rank0 = json.loads(m.with_name(f"{m.stem}-tp{tp}-r0.json").read_text())
            floor = weight_bytes(rank0) / HBM_BYTES_PER_S * 1e3
            try:
                got = run_tp(m, ckpt, kernels, tp, ctx, steps, tmp / f"out-{tp}-{variant}")
            except Exception as exc:  # noqa: BLE001 - one failed configuration is a note, the others still run
                notes.append(f"{shape} TP={tp} {variant}: {exc}"[:400])
                continue
            rows.append({"shape": shape, "tp": tp, "variant": variant, "floor_ms": floor, **got})
    return rows


# TP = N configurations: (table label, file tag, `kern manifest build` flags); the lm_head is vocabulary-parallel
# (`--tp-lm-head vocab`, the default) but in the last, which keeps every rank reading the whole lm_head
VARIANTS = (("one-shot", "oneshot", []), ("NCCL", "nccl", ["--allreduce-oneshot-bytes", "0"]),
            ("one-shot, lm_head replicated", "oneshot-repl", ["--tp-lm-head", "replicated"]))


def table(rows: list[dict[str, Any]], notes: list[str]) -> str:
    lines = ["| shape | TP | all-reduce | ms/token | vs TP=1 | floor per rank ms | % of floor |",
             "|---|---|---|---|---|---|---|"]
    one = {r["shape"]: r["ms_per_token"] for r in rows if r["tp"] == 1}
    for r in rows:
        ratio = f"{r['ms_per_token'] / one[r['shape']]:.2f}x" if r["shape"] in one else "-"
        lines.append(f"| {r['shape']} | {r['tp']} | {r['variant']} | {r['ms_per_token']:.3f} | {ratio} | "
                     f"{r['floor_ms']:.3f} | {100 * r['floor_ms'] / r['ms_per_token']:.0f}% |")
    return "\n".join(lines + [f"note: {n}" for n in notes])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", default="1,2,4,8")
    p.add_argument("--shapes", default="qwen3-8b,qwen3-14b")
    p.add_argument("--weights-dir", type=Path, default=Path(os.environ.get("KERN_WEIGHTS", "/tmp/kern-weights")))
    p.add_argument("--kernels", type=Path, default=REPO / "kernels")
    p.add_argument("--ctx", type=int, default=128)
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--worker-tp1", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--manifest", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--ckpt", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker_tp1:
        return tp1_worker(args)
    from kern_run.preflight import probe_device

    gpus = probe_device(0)
    tps = [int(t) for t in args.tp.split(",") if t]
    notes: list[str] = []
    rows: list[dict[str, Any]] = []
    for shape in [s for s in args.shapes.split(",") if s]:
        rows += bench_shape(shape, args.weights_dir / shape, args.kernels, tps, gpus, args.ctx, args.steps, notes)
    dest = args.json or (Path(os.environ["OUT"]) / "bench-decode-tp.json" if os.environ.get("OUT") else None)
    if dest is not None:
        dest.write_text(json.dumps({"rows": rows, "notes": notes, "ctx": args.ctx, "steps": args.steps}, indent=1))
    print(table(rows, notes))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
