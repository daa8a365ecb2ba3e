#!/usr/bin/env python3
"""Decode steps under a profiler (GPU machine): per kernel, its own time and DRAM traffic (Nsight Compute), or
its place on the critical path of a graph step (CUPTI trace).

    ncu --profile-from-start off --clock-control none --cache-control none --csv --page raw \\
        --metrics "$(python3 bench/profile_step.py --metrics)" --log-file $OUT/ncu.csv \\
        python3 bench/profile_step.py --ckpt /tmp/kern-weights/qwen3-4b [--manifest M] [--ctx 128]
    python3 bench/profile_step.py --summarize $OUT/ncu.csv      # the table, per op, last

    python3 bench/profile_step.py --graph --steps 20 --trace $OUT/trace.json [--manifest M] [--ctx 128]

The run: a prompt of `--ctx` random tokens is prefilled and `--warm` eager decode steps run; one more step,
run hooked, writes the program's launches in order (op, entry) to `--ops-out` (what `--summarize` and the
timeline name the kernels by).

Without `--graph` the profiler range (cuProfilerStart/Stop) covers `--steps` eager decode steps for ncu, which
replays each kernel alone (no PDL overlap, no launch gap), so a kernel's `gpu__time_duration` is what it costs
with the GPU to itself; the sum over a step against the graph step time of bench/decode.py is what the kernel
boundaries cost. `--cache-control none`: L2 is not flushed between kernels, as in a real step (weights
stream, activations hit L2). `--clock-control none`: clocks left as the machine runs them.

`--graph`: the decode CUDA graph is captured, then `--steps` replays (PDL overlaps and all) are traced by
CUPTI through torch.profiler (every kernel node of a replay gets its own start and end; the machine has no
Nsight Systems), the chrome trace is written to `--trace`, and the trace is summarised at once: per op of the
decode program, the median over the steps of the kernel's duration, its start lag (start minus the end of
everything before it: negative = it overlapped its predecessor) and its advance (how far it moved the end of
the step), whose sum over a step is the step's GPU time, so the advance is what the op costs the step.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.decode import _check, _cu, _prompt, _start_sequence

ROOT = Path(__file__).resolve().parents[1]
METRICS = (
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__grid_size",
    "launch__block_size",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic",
)


def run(args: argparse.Namespace) -> None:
    from kern_run.generate import GenerateOptions, Generator
    from kern_run.preflight import read_manifest

    cu = _cu()
    _check(cu.cuInit(0))
    context = _check(cu.cuDevicePrimaryCtxRetain(_check(cu.cuDeviceGet(0))))
    _check(cu.cuCtxSetCurrent(context))
    facts = read_manifest(args.manifest)
    gen = Generator.open(args.manifest, args.kernels, args.ckpt, facts, capacity_tokens=args.ctx + 64)
    chunk = min(512, facts.tokens_max)
    gen.generate(_prompt(20, 0), GenerateOptions(2, chunk, eager=True, stop_at_eos=False))
    _start_sequence(gen, _prompt(args.ctx, args.ctx), args.warm + args.steps + 5, chunk)
    for _ in range(args.warm):
        gen.rt.issue("decode", {"tokens": 1, "seqs": 1}, eager=True)
    gen.rt.synchronize()
    ops = program_launches(gen.rt, "decode", {"tokens": 1, "seqs": 1})  # one more warm step, naming the launches
    named = [(op, entry) for op, entry in ops if entry]  # what --summarize pairs with ncu's kernel rows
    Path(args.ops_out).write_text("\n".join(f"{op}\t{entry}" for op, entry in named) + "\n")
    if args.graph:
        for _ in range(3):  # capture the graph outside the traced range
            gen.rt.issue("decode", {"tokens": 1, "seqs": 1})
        gen.rt.synchronize()
        import torch
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                gen.rt.issue("decode", {"tokens": 1, "seqs": 1})
            gen.rt.synchronize()
            torch.cuda.synchronize()
        prof.export_chrome_trace(str(args.trace))
        gen.close()
        timeline(load_chrome_trace(args.trace), ops)
        return
    _check(cu.cuProfilerStart())
    for _ in range(args.steps):
        gen.rt.issue("decode", {"tokens": 1, "seqs": 1}, eager=True)
    gen.rt.synchronize()
    _check(cu.cuProfilerStop())
    print(f"profile_step: {args.steps} step(s) of {len(ops)} launches profiled; ops -> {args.ops_out}")
    gen.close()


def program_launches(rt: Any, program: str, vars: dict[str, int]) -> list[tuple[str, str | None]]:
    """The launches of one eager run of `program` at `vars` (run_hooked, then synchronised), in order: (op, kernel
    entry; None for a library call: cuBLASLt, NCCL), what `timeline` names a trace's kernels by."""
    ops: list[tuple[str, str | None]] = []
    rt.run_hooked(program, vars, lambda index, rec: ops.append((rec.op, getattr(rec.launch, "entry", None))))
    rt.synchronize()
    return ops


def _float(text: str) -> float:
    return float(text.replace(",", "")) if text not in ("", "n/a") else float("nan")


def summarize(csv_path: Path, ops_path: Path | None) -> None:
    """ncu's raw CSV (one row per kernel, after a units row) -> a table per op of the decode program."""
    lines = [ln for ln in csv_path.read_text().splitlines() if ln.startswith('"')]
    rows = list(csv.DictReader(lines))
    units = rows[0] if rows and rows[0].get("ID", "") == "" else {}
    rows = [r for r in rows if r.get("ID", "") != ""]
    ops = [ln.split("\t") for ln in ops_path.read_text().splitlines()] if ops_path and ops_path.exists() else []
    scale = {"ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "nsecond": 1e-3}
    t_scale = scale.get(units.get("gpu__time_duration.sum", "ns"), 1e-3)
    b_scale = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(units.get("dram__bytes_read.sum", "byte"), 1.0)
    groups: dict[tuple[str, str], list[dict[str, float]]] = {}
    for i, r in enumerate(rows):
        op = ops[i % len(ops)][0] if ops else "?"
        name = r.get("Kernel Name", "?").split("(")[0]
        groups.setdefault((op, name), []).append({
            "us": _float(r["gpu__time_duration.sum"]) * t_scale,
            "mb": (_float(r["dram__bytes_read.sum"]) + _float(r["dram__bytes_write.sum"])) * b_scale / 1e6,
            "dram_pct": _float(r["dram__throughput.avg.pct_of_peak_sustained_elapsed"]),
            "occ": _float(r["sm__warps_active.avg.pct_of_peak_sustained_active"]),
            "grid": _float(r["launch__grid_size"]), "block": _float(r["launch__block_size"]),
            "regs": _float(r["launch__registers_per_thread"]),
        })
    steps = max(1, len(rows) // max(1, len(ops))) if ops else 1
    total = sum(x["us"] for g in groups.values() for x in g) / steps
    print(f"\n{len(rows)} kernels, {steps} step(s): kernel time {total:.1f} us per step (no launch gaps)")
    print(f"{'op':<18} {'kernel':<32} {'n':>4} {'us med':>7} {'us/step':>8} {'MB':>6} {'GB/s':>6} {'dram%':>6} "
          f"{'occ%':>5} {'grid':>5} {'blk':>4} {'regs':>4}")
    for (op, name), xs in sorted(groups.items(), key=lambda kv: -sum(x["us"] for x in kv[1])):
        med = statistics.median(x["us"] for x in xs)
        mb = statistics.median(x["mb"] for x in xs)
        print(f"{op:<18} {name[:32]:<32} {len(xs) // steps:>4} {med:>7.2f} {sum(x['us'] for x in xs) / steps:>8.1f} "
              f"{mb:>6.1f} {mb / med * 1e3:>6.0f} {statistics.median(x['dram_pct'] for x in xs):>6.1f} "
              f"{statistics.median(x['occ'] for x in xs):>5.1f} {xs[0]['grid']:>5.0f} {xs[0]['block']:>4.0f} "
              f"{xs[0]['regs']:>4.0f}")


def load_chrome_trace(path: Path) -> list[tuple[float, float, str]]:
    """(start us, duration us, kernel name) of every kernel event of a torch.profiler chrome trace, by start."""
    import json

    events = json.loads(Path(path).read_text()).get("traceEvents", [])
    kern = [(float(e["ts"]), float(e["dur"]), e["name"].split("(")[0]) for e in events
            if e.get("ph") == "X" and e.get("cat") == "kernel"]
    return sorted(kern)


def _op_spans(kern: list[tuple[float, float, str]], ops: list[tuple[str, str | None]]
              ) -> list[list[tuple[str, float, float]]]:
    """The kernels of whole steps grouped by the program's launches: per step, per launch, (op, start, end) in us.
    A launch with an entry is one kernel of that name; one without (cuBLASLt, NCCL: entry None) is every kernel up
    to the next named launch's. Kernels before the first launch's and after the last whole step are dropped.
    Raises SystemExit when a kernel is not the one the program launches there, two unnamed launches are adjacent
    (their kernels cannot be told apart), or the trace holds no whole step."""
    n = len(ops)
    if n == 0 or ops[0][1] is None:
        raise SystemExit("timeline: the program's first launch must be a named kernel (it marks each step)")
    for j in range(n):
        if ops[j][1] is None and ops[(j + 1) % n][1] is None:
            raise SystemExit(f"timeline: launches {j} and {(j + 1) % n} ({ops[j][0]}, {ops[(j + 1) % n][0]}) "
                             "both run library kernels: their kernels cannot be told apart")
    i = next((k for k, (_, _, name) in enumerate(kern) if name == ops[0][1]), len(kern))
    steps: list[list[tuple[str, float, float]]] = []
    while i < len(kern):
        spans: list[tuple[str, float, float]] = []
        for j, (op, entry) in enumerate(ops):
            if i >= len(kern):
                return _whole(steps, n)
            start, dur, name = kern[i]
            if entry is not None:
                if name != entry:
                    raise SystemExit(f"timeline: kernel {i} is {name}, the program's launch {j} is {entry}")
                spans.append((op, start, start + dur))
                i += 1
                continue
            stop = ops[(j + 1) % n][1]
            end_ = start + dur
            i += 1
            while i < len(kern) and kern[i][2] != stop:
                end_ = max(end_, kern[i][0] + kern[i][1])
                i += 1
            spans.append((op, start, end_))
        steps.append(spans)
    return _whole(steps, n)


def _whole(steps: list[list[tuple[str, float, float]]], n: int) -> list[list[tuple[str, float, float]]]:
    if not steps:
        raise SystemExit(f"timeline: the trace holds no whole step of the program's {n} launches")
    return steps


def timeline(kern: list[tuple[float, float, str]], ops: list[tuple[str, str | None]], title: str = "") -> dict:
    """Kernels of `--graph` steps (start, duration in us, by start) -> per op: duration, start lag, advance (us),
    printed under `title` and returned as {"step_us": median GPU us per step, "ops": [{op, n, dur_us, lag_us,
    adv_us, adv_us_per_step}], largest advance first}. `ops`: the program's launches in order, (op, kernel entry;
    None for a library call, whose kernels all count as that op). Raises SystemExit as _op_spans does."""
    n = len(ops)
    entries: dict[str, set[str | None]] = {}
    for op, entry in ops:
        entries.setdefault(op, set()).add(entry)
    # an op of several kernels (the decode attention's partial and reduce) gets a row per kernel: "op:entry"
    ops = [(op if len(entries[op]) == 1 else f"{op}:{entry or 'library'}", entry) for op, entry in ops]
    spans = _op_spans(kern, ops)
    per: dict[str, dict[str, list[float]]] = {}
    step_us = []
    prev_end = spans[0][0][1]
    for part in spans:
        step_start = prev_end
        for op, start, end in part:
            d = per.setdefault(op, {"dur": [], "lag": [], "adv": []})
            d["dur"].append(end - start)
            d["lag"].append(start - prev_end)
            d["adv"].append(max(end, prev_end) - prev_end)
            prev_end = max(end, prev_end)
        step_us.append(prev_end - step_start)
    steps = len(spans)
    med = statistics.median
    step_med = med(step_us[1:] or step_us)
    print(f"\n{steps} graph step(s) of {n} launches{title}: GPU time per step median {step_med:.1f} us "
          f"(first step excluded: its lag is from before the range)")
    print(f"{'op':<18} {'n':>3} {'dur us':>7} {'lag us':>7} {'adv us':>7} {'adv us/step':>11}")
    rows_out = []
    for op, d in per.items():  # an op launched k times per step has k * steps samples
        adv_step = sum(d["adv"]) / steps
        rows_out.append((adv_step, op, len(d["dur"]) // steps, med(d["dur"]), med(d["lag"]), med(d["adv"])))
    table = []
    for adv_step, op, k, dur, lag, adv in sorted(rows_out, reverse=True):
        print(f"{op:<18} {k:>3} {dur:>7.2f} {lag:>7.2f} {adv:>7.2f} {adv_step:>11.1f}")
        table.append({"op": op, "n": k, "dur_us": dur, "lag_us": lag, "adv_us": adv, "adv_us_per_step": adv_step})
    return {"step_us": step_med, "ops": table}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", type=Path, default=Path("/tmp/kern-weights/qwen3-4b"))
    p.add_argument("--manifest", type=Path, default=ROOT / "manifests" / "qwen3-4b-v2.json")
    p.add_argument("--kernels", type=Path, default=ROOT / "kernels")
    p.add_argument("--ctx", type=int, default=128, help="context tokens before the profiled step")
    p.add_argument("--warm", type=int, default=3)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--ops-out", default="/tmp/profile_step.ops", help="the decode program's launches, in order")
    p.add_argument("--metrics", action="store_true", help="print the ncu metric list and exit")
    p.add_argument("--summarize", type=Path, help="print the per-op table of an ncu --csv --page raw log")
    p.add_argument("--graph", action="store_true",
                   help="trace graph replays with torch.profiler (CUPTI) and print the per-op timeline table")
    p.add_argument("--trace", type=Path, default=Path("/tmp/profile_step_trace.json"), help="--graph: the chrome trace")
    args = p.parse_args()
    if args.metrics:
        print(",".join(METRICS))
        return 0
    if args.summarize:
        summarize(args.summarize, Path(args.ops_out))
        return 0
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
