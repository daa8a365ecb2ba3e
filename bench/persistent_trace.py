#!/usr/bin/env python3
"""Where a persistent decode step's time goes, instruction by instruction (GPU machine; issue 28's "what each
instruction class costs").

    python3 bench/persistent_trace.py --ckpt /tmp/kern-weights/qwen3-4b [--config tests/data/configs/Qwen3-4B.json]
                                      [--context 128] [--stages N] [--l2-prefetch] [--fences] [--counter-stride N]
                                      [--json out.json]

Builds kernels-src/persistent_decode.cu with -DPD_TRACE (a probe build, never committed: the kernel then writes,
per queue entry, %globaltimer before its ring prologue, after its counter wait and after its work into the
`logits` buffer instead of the logits), loads the persistent manifest of the config against it, prefills a random
prompt of --context tokens, runs --steps eager decode steps and reads the last step's trace.

Per instruction: `wait` (after the prologue until the counter is seen), `work` (the execution). Per phase (a layer's
instructions of one class): its end (the last instruction's end) and, for the instruction that ends it (the
CRITICAL one), its `hop` (from the previous phase's end to its own start: counter latency, or a block still busy
with an earlier instruction) and its work. A layer's time is the sum of its phases' segments (previous end to this
end); the table gives medians over the middle layers, us. Needs nvcc and a GPU; the logits buffer must hold
3 u32 per instruction (it does for the Qwen3 shapes: 12 bytes x ~22k instructions < 2 x vocab bytes).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ("QKV", "ROPE", "ATTN_PARTIAL", "ATTN_REDUCE", "ATTN", "O_PROJ", "GATE_UP", "DOWN")  # ATTN: --attn fused


def trace_kernels(out: Path, twice: bool = False) -> Path:
    """A kernels directory: the committed one with persistent_decode replaced by its -DPD_TRACE build (and
    -DPD_TWICE: ROPE, ATTN_PARTIAL and ATTN_REDUCE run twice, trace[0] their first run's end)."""
    from tools import build_kernels

    kdir = out / "kernels"
    shutil.copytree(ROOT / "kernels", kdir)
    (out / "probe").mkdir()
    probe = build_kernels.compile_probe("persistent_decode", ["PD_TRACE", *(["PD_TWICE"] if twice else [])],
                                        out / "probe")
    sha = build_kernels.sha256_file(probe)
    cubin = kdir / f"persistent_decode-{sha[:12]}.cubin"  # the runtime's naming: module-<sha256 prefix>.cubin
    shutil.move(probe, cubin)
    meta = json.loads((kdir / "kernels.json").read_text())
    entry = meta["modules"]["persistent_decode"]
    entry["file"], entry["sha256"] = cubin.name, sha
    (kdir / "kernels.json").write_text(json.dumps(meta))
    return kdir


def analyse(sched, words) -> dict:
    """Per-class medians (us) from the trace words (3 per queue entry) and the schedule."""
    from kern_run.models.qwen3.persistent.isa import Op

    table = sched.table
    t = {}
    e = 0
    for queue in table.queues:
        for index in queue:
            t[index] = tuple(int(w) for w in words[3 * e: 3 * e + 3])
            e += 1
    base = min(v[0] for v in t.values())
    rel = {i: tuple(((x - base) & 0xFFFFFFFF) / 1e3 for x in v) for i, v in t.items()}  # us
    phases: dict[tuple[int, str], list[int]] = {}
    for i, ins in enumerate(table.instrs):
        phases.setdefault((ins.layer, ins.op.name), []).append(i)
    layers = sorted({ins.layer for ins in table.instrs if ins.op in (Op.QKV,)})
    mid = layers[1:-1] or layers
    rows = {c: {"segment": [], "hop": [], "work_critical": [], "work_median": [], "work_max": [], "wait_median": []}
            for c in CLASSES}
    layer_times = []
    prev_end = None
    for layer in layers:
        start_of_layer = prev_end
        for c in CLASSES:
            idx = phases.get((layer, c), [])
            if not idx:
                continue
            end = max(rel[i][2] for i in idx)
            crit = max(idx, key=lambda i: rel[i][2])
            works = [rel[i][2] - rel[i][1] for i in idx]
            waits = [rel[i][1] - rel[i][0] for i in idx]
            if prev_end is not None and layer in mid:
                r = rows[c]
                r["segment"].append(end - prev_end)
                r["hop"].append(rel[crit][1] - prev_end)
                r["work_critical"].append(rel[crit][2] - rel[crit][1])
                r["work_median"].append(statistics.median(works))
                r["work_max"].append(max(works))
                r["wait_median"].append(statistics.median(waits))
            prev_end = end
        if start_of_layer is not None and layer in mid:
            layer_times.append(prev_end - start_of_layer)
    med = {c: {k: (statistics.median(v) if v else None) for k, v in r.items()} for c, r in rows.items()}
    step = max(v[2] for v in rel.values())
    return {"per_class_us": med, "layer_us_median": statistics.median(layer_times) if layer_times else None,
            "step_us": step, "layers": len(layers)}


def twice(sched, words) -> dict:
    """--twice: per class, median first-run and second-run us (trace[0] is the first run's end)."""
    table = sched.table
    first: dict[str, list[float]] = {}
    second: dict[str, list[float]] = {}
    e = 0
    for queue in table.queues:
        for index in queue:
            t0, t1, t2 = (int(w) for w in words[3 * e: 3 * e + 3])
            e += 1
            name = table.instrs[index].op.name
            if name in ("ROPE", "ATTN_PARTIAL", "ATTN_REDUCE"):
                first.setdefault(name, []).append(((t0 - t1) & 0xFFFFFFFF) / 1e3)
                second.setdefault(name, []).append(((t2 - t0) & 0xFFFFFFFF) / 1e3)
    return {c: (statistics.median(first[c]), statistics.median(second[c])) for c in first}


def main(argv: list[str] | None = None) -> int:
    from kern_run.models.qwen3.persistent.schedule import ATTN_MODES, ROW_SPLITS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", type=Path, required=True)
    p.add_argument("--config", type=Path, default=ROOT / "tests" / "data" / "configs" / "Qwen3-4B.json")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--stages", type=int, default=None)
    p.add_argument("--sms", type=int, default=132)
    p.add_argument("--l2-prefetch", action="store_true")
    p.add_argument("--counter-stride", type=int, default=1)
    p.add_argument("--fences", action="store_true")
    p.add_argument("--evict-first", action=argparse.BooleanOptionalAction, default=True,
                   help="the ring's copies evict-first in L2 (gen_persistent --[no-]evict-first)")
    p.add_argument("--attn", choices=ATTN_MODES, default="split", help="the attention (gen_persistent --attn)")
    p.add_argument("--row-split", choices=ROW_SPLITS, default="auto",
                   help="O_PROJ / DOWN's row split (gen_persistent --row-split)")
    p.add_argument("--twice", action="store_true",
                   help="ROPE / ATTN_PARTIAL / ATTN_REDUCE run twice: cold vs warm (not ATTN: its ticket is drawn once)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    import numpy as np

    from kern_run.errors import RefusalError
    from kern_run.generate import GenerateOptions, Generator
    from kern_run.models.qwen3.abi import read_kernel_abi
    from kern_run.models.qwen3.config import Qwen3Config
    from kern_run.models.qwen3.jsonio import dumps, read_json_file
    from kern_run.models.qwen3.options import BuildOptions
    from kern_run.models.qwen3.persistent.manifest import build_persistent_manifest
    from kern_run.preflight import read_manifest

    from bench.decode import write_json

    def build(kernels: Path):
        cfg = Qwen3Config.from_json(read_json_file(args.config)[0], str(args.config))
        return cfg, *build_persistent_manifest(cfg, read_kernel_abi(kernels), BuildOptions(name="ptrace"),
                                               num_queues=args.sms, stages=args.stages, l2_prefetch=args.l2_prefetch,
                                               counter_stride=args.counter_stride, fences=args.fences,
                                               attn=args.attn, row_split=args.row_split,
                                               evict_first=args.evict_first)

    if args.twice and args.attn == "fused":
        print("persistent_trace: --twice runs ROPE, ATTN_PARTIAL and ATTN_REDUCE twice; --attn fused has none of them "
              "(ATTN's ticket is drawn once a step)", file=sys.stderr)
        return 2
    try:  # the config and the options against the committed kernels first: refused before the probe compiles
        cfg, _, sched = build(ROOT / "kernels")
    except (RefusalError, ValueError) as exc:
        print(f"persistent_trace: {exc}", file=sys.stderr)
        return 2
    n = len(sched.table.instrs)
    if 12 * n > 2 * cfg.vocab:
        print(f"persistent_trace: {n} instructions need {12 * n} bytes; logits hold {2 * cfg.vocab}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="kern-ptrace-") as tmp_dir:
        tmp = Path(tmp_dir)
        kdir = trace_kernels(tmp, args.twice)
        _, manifest, sched = build(kdir)
        mpath = tmp / "ptrace.json"
        mpath.write_text(dumps(manifest))
        facts = read_manifest(mpath)
        gen = Generator.open(mpath, kdir, args.ckpt, facts, capacity_tokens=args.context + args.steps + 64)
        prompt = np.random.default_rng(0).integers(0, 151643, size=args.context).tolist()
        gen.generate(prompt, GenerateOptions(args.steps, min(512, facts.tokens_max), eager=True, stop_at_eos=False))
        words = gen.rt.read_buffer("logits").reshape(-1).view(np.uint32)[: 3 * n]
        gen.close()
    out = analyse(sched, words)
    if args.twice:
        out["twice_us"] = twice(sched, words)
    out.update({"config": str(args.config), "context": args.context, "stages": manifest["meta"]["persistent"]["ring_stages"]})
    print(f"\n===== persistent decode trace, {args.config.stem}, ctx {args.context}, {out['stages']}-stage ring: step "
          f"{out['step_us']:.1f} us, layer (median) {out['layer_us_median']:.1f} us; per phase, us, median over layers")
    print(f"{'class':<14}| {'segment':>8} {'hop':>7} {'work crit':>10} {'work med':>9} {'work max':>9} {'wait med':>9}")
    for c in CLASSES:
        r = out["per_class_us"][c]
        if r["segment"] is None:
            continue
        print(f"{c:<14}| {r['segment']:8.2f} {r['hop']:7.2f} {r['work_critical']:10.2f} {r['work_median']:9.2f} "
              f"{r['work_max']:9.2f} {r['wait_median']:9.2f}")
    if args.twice:
        print("run twice (us, median over instructions): class | first run | second run")
        for c, (first, second) in out["twice_us"].items():
            print(f"  {c:<14}| {first:8.2f} | {second:8.2f}")
    write_json(args.json, "persistent-trace.json", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
