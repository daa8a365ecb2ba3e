#!/usr/bin/env python3
"""Decode benchmark, bs = 1, Qwen3-4B shape: kern against its peers, side by side in one run (GPU machine).

    python3 bench/decode.py --ckpt /tmp/kern-weights/qwen3-4b [--only kern,torch-graph,torch-compile,hf]
                            [--contexts 128,4096] [--steps 256] [--breakdown] [--json out.json]
    python3 bench/decode.py --only kern --variants manifests/qwen3-4b.json,manifests/qwen3-4b-v2.json --breakdown

Peers, each in its own subprocess (GPU memory isolated, a hung compile killed by a timeout):
- `kern`: `Generator.generate` on the manifest (default manifests/qwen3-4b-v2.json): graph decode with inputs
  advanced on the device and `--lookahead` steps queued (the `kern run` path), the same with the
  synchronous loop (lookahead 0), and eager replay. ms/token = median interval between consecutive tokens
  arriving on the host over >= `--steps` steps. Plus, from CUDA events around each graph launch of a
  queued run: GPU busy time per step and GPU idle time between steps; device memory used (cuMemGetInfo).
  `--breakdown`: every launch of one decode step timed alone (eager replay with events between launches,
  the stream held by kern_spin_ns while a batch is enqueued so host latency is excluded), per op.
- `torch-graph`: bench/torch_qwen3.py's step as one CUDA graph (static cache sized to the context + steps).
- `torch-compile`: that step with its decoder layer through torch.compile(mode="max-autotune-no-cudagraphs",
  dynamic=False) - one compiled layer serves all layers (same shapes; compiling the whole 36-layer step did
  not finish in 250 s on the H200) - captured as one CUDA graph; if compiling does not finish within
  `--compile-timeout` seconds, default mode (said in the table).
- `hf`: transformers `generate` (eager, sdpa attention): (t(1 + N tokens) - t(1 token)) / N, N = `--hf-steps`.
- `kern-harvest` (only when named in `--only`, with `--harvest DIR`: what `kern harvest generate` wrote from a
  capture of this checkpoint, docs/harvest.md): "kern (harvested inductor kernels)", torch.compile's own kernels
  replayed by kern_runtime as one CUDA graph per step (kern_run.harvest.replay), the token read back every step; its
  KV cache is the captured one (meta.harvest.source.context positions), so contexts past it are skipped.
- `torch-harvest` (likewise only when named, with `--harvest DIR`): the step that was harvested
  (kern_run.harvest.torch_step) under torch.compile at the captured context, as one torch CUDA graph and without:
  the same step as the replay (compiled again, so autotuned again), the fair peer of `kern-harvest`
  (`torch-compile` above is another step).
Torch peers read the token back every step (`.item()`), as a generation loop that prints tokens does.

`--batch 1,8,32,64 [--contexts 128,2048]`: the batched bench instead (bench/decode_batch.py: kern's step at
seqs = batch against a torch.compile'd batched step, both one CUDA graph, interleaved in one process).

`--tp 1,2,4,8 [--shapes qwen3-8b,qwen3-14b]`: the tensor-parallel bench instead (bench/decode_tp.py: TP = N as
rank processes, one-shot all-reduce against NCCL, the weight floor per rank).

`--variants A.json,B.json`: the kern worker once per manifest (one after another, each in its own
subprocess), rows labelled `kern (...) [A]`, `[B]`, breakdowns per variant; `--manifest` alone times one.

Ratios: against the floor (checkpoint bytes / 4.3 TB/s, 1.87 ms for Qwen3-4B) and the best peer per
context. Prints a table last; writes JSON to `--json`, else to $OUT/bench-decode.json when OUT is set. Exit 1
when no peer produced a measurement (every worker failed: no GPU, no torch; the notes say why).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
HBM_BYTES_PER_S = 4.3e12
PEERS = ("kern", "torch-graph", "torch-compile", "hf")
OPTIONAL_PEERS = ("kern-harvest", "torch-harvest")  # run only when --only names them


# ---------------------------------------------------------------- helpers (every worker)


def _emit(path: str, record: dict[str, Any]) -> None:
    """Append one result as a JSON line (a worker killed later still leaves what it measured)."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)


def _prompt(n: int, seed: int, vocab: int = 151643) -> list[int]:
    import numpy as np

    return np.random.default_rng(seed).integers(0, vocab, size=n).tolist()


def _ms(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    if not values:
        return {"median": float("nan"), "mean": float("nan"), "p10": float("nan"), "p90": float("nan")}
    q = lambda f: values[min(len(values) - 1, int(f * len(values)))]  # noqa: E731
    return {"median": statistics.median(values), "mean": statistics.fmean(values), "p10": q(0.1), "p90": q(0.9)}


def _cu():
    from cuda.bindings import driver as cu

    return cu


def _check(result):
    cu = _cu()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA error {err}")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


def checkpoint_bytes(ckpt: Path) -> int:
    return sum(p.stat().st_size for p in Path(ckpt).glob("*.safetensors"))


# ---------------------------------------------------------------- kern


class TimingEvents:
    """CUDA timing events on a stream (cuda.bindings), elapsed in ms."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.cu = _cu()

    def new(self) -> Any:
        return _check(self.cu.cuEventCreate(0))

    def record(self, event: Any) -> None:
        _check(self.cu.cuEventRecord(event, self.stream))

    def sync(self, event: Any) -> None:
        _check(self.cu.cuEventSynchronize(event))

    def ms(self, a: Any, b: Any) -> float:
        return float(_check(self.cu.cuEventElapsedTime(a, b)))

    def destroy(self, events: list[Any]) -> None:
        for e in events:
            self.cu.cuEventDestroy(e)


def _start_sequence(gen: Any, prompt: list[int], extra: int, chunk: int) -> None:
    """A fresh sequence: pages for prompt + extra tokens, prefill, step 0 (inputs from the host), synced."""
    n = len(prompt)
    gen._begin(n + extra)
    if n > 1:
        gen.prefill(prompt[:-1], chunk)
    gen._decode_issue(prompt[-1], n - 1, False)
    gen.rt.synchronize()


def kern_timeline(gen: Any, prompt: list[int], steps: int, lookahead: int, chunk: int) -> dict[str, Any]:
    """Queued graph steps with timing events around each cuGraphLaunch: GPU busy per step, idle between."""
    rt = gen.rt
    _start_sequence(gen, prompt, steps + 2, chunk)
    ev = TimingEvents(rt.stream)
    starts = [ev.new() for _ in range(steps)]
    ends = [ev.new() for _ in range(steps)]
    t0 = time.perf_counter()
    for i in range(steps):
        if i > lookahead:
            ev.sync(ends[i - lookahead - 1])  # keep lookahead + 1 steps in flight, as the caller does
        ev.record(starts[i])
        rt.issue("decode", {"tokens": 1, "seqs": 1})
        ev.record(ends[i])
    ev.sync(ends[-1])
    wall = time.perf_counter() - t0
    busy = [ev.ms(starts[i], ends[i]) for i in range(steps)]
    idle = [ev.ms(ends[i], starts[i + 1]) * 1e3 for i in range(steps - 1)]  # us
    span = ev.ms(starts[0], ends[-1])
    ev.destroy(starts + ends)
    return {"busy_ms": _ms(busy), "idle_us": _ms(idle), "gpu_span_ms_per_step": span / steps,
            "wall_ms_per_step": 1e3 * wall / steps}


def _spin_kernel(rt: Any) -> tuple[Any, Any]:
    """kern_spin_ns from the committed step cubin, loaded into the runtime's context."""
    import hashlib

    cu = _cu()
    meta = json.loads((ROOT / "kernels" / "kernels.json").read_text())["modules"]["step"]
    image = (ROOT / "kernels" / meta["file"]).read_bytes()
    assert hashlib.sha256(image).hexdigest() == meta["sha256"]
    _check(cu.cuCtxSetCurrent(rt.context))
    module = _check(cu.cuModuleLoadData(image))
    return module, _check(cu.cuModuleGetFunction(module, b"kern_spin_ns"))


def kern_breakdown(gen: Any, prompt: list[int], chunk: int, replays: int, batch: int = 24,
                   spin_ns: int = 3_000_000) -> list[dict[str, Any]]:
    """Each launch of one bs = 1 decode step timed alone (`time_launches`), after `prompt` is prefilled."""
    _start_sequence(gen, prompt, replays + 2, chunk)
    return time_launches(gen.rt, {"tokens": 1, "seqs": 1}, replays, batch=batch, spin_ns=spin_ns)


def time_launches(rt: Any, values: dict[str, int], replays: int, before: Any = None, batch: int = 24,
                  spin_ns: int = 3_000_000) -> list[dict[str, Any]]:
    """Each launch of the decode program at vars `values` timed alone: eager replay (`Runtime.run_hooked`) with CUDA
    events between launches, the stream held by kern_spin_ns (`spin_ns` ns) before every `batch` launches so host
    enqueue latency stays out of the events. `before()`, when given, runs before each of the `replays` replays
    (restoring inputs the program advances). Returns one row per launch index: op, what (entry, or the cuBLASLt
    call), median us."""
    import ctypes

    cu = _cu()
    _, spin = _spin_kernel(rt)
    arg = ctypes.c_int64(spin_ns)
    argv = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
    ev = TimingEvents(rt.stream)
    samples: dict[int, list[float]] = {}
    names: dict[int, tuple[str, str]] = {}
    for _ in range(replays):
        marks: list[tuple[int, Any, Any]] = []
        pending: list[Any] = []

        def on_launch(index: int, rec: Any) -> None:
            if pending:  # close the previous launch
                ev.record(pending[-1][2])
            if len(marks) % batch == 0:  # hold the stream while the next batch is enqueued
                _check(cu.cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, rt.stream, ctypes.addressof(argv), 0))
            start, stop = ev.new(), ev.new()
            ev.record(start)
            marks.append((index, start, stop))
            pending.append(marks[-1])
            launch = rec.launch
            names[index] = (rec.op, getattr(launch, "entry", None) or f"cublasLt {launch.name}")

        if before is not None:
            before()
        rt.run_hooked("decode", values, on_launch)
        ev.record(marks[-1][2])
        ev.sync(marks[-1][2])
        for index, start, stop in marks:
            samples.setdefault(index, []).append(ev.ms(start, stop) * 1e3)
        ev.destroy([e for m in marks for e in m[1:]])
    return [{"index": i, "op": names[i][0], "what": names[i][1], "us": statistics.median(v)}
            for i, v in sorted(samples.items())]


def breakdown_lines(title: str, summary: list[dict[str, Any]], sum_us: float) -> list[str]:
    """The table of one breakdown (`_summarise_breakdown`'s rows), under `title`."""
    lines = [f"-- per-launch breakdown{title} (eager, events between launches; sum {sum_us / 1e3:.3f} ms):",
             f"   {'op':16s} {'kernel':28s} {'n':>4s} {'us/launch':>10s} {'us/step':>9s} {'share':>6s}"]
    for s in summary:
        lines.append(f"   {s['op']:16s} {s['what'][:28]:28s} {s['launches']:>4d} {s['us_per_launch']:>10.2f} "
                     f"{s['us_per_step']:>9.1f} {100 * s['share']:>5.1f}%")
    return lines


def breakdown_record(launches: list[dict[str, Any]]) -> dict[str, Any]:
    """`time_launches`' rows as a result record's fields: the launches, their summary per op, their sum (us)."""
    return {"launches": launches, "summary": _summarise_breakdown(launches), "sum_us": sum(r["us"] for r in launches)}


def _summarise_breakdown(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        groups.setdefault((r["op"], r["what"]), []).append(r["us"])
    total = sum(r["us"] for r in rows)
    out = [{"op": op, "what": what, "launches": len(v), "us_per_launch": statistics.median(v),
            "us_per_step": sum(v), "share": sum(v) / total if total else 0.0} for (op, what), v in groups.items()]
    return sorted(out, key=lambda r: -r["us_per_step"])


def kern_worker(args: argparse.Namespace, out: str) -> None:
    from kern_run.generate import GenerateOptions, Generator
    from kern_run.preflight import read_manifest

    cu = _cu()
    _check(cu.cuInit(0))
    device = _check(cu.cuDeviceGet(args.gpu))
    context = _check(cu.cuDevicePrimaryCtxRetain(device))
    _check(cu.cuCtxSetCurrent(context))
    free0, total = _check(cu.cuMemGetInfo())
    facts = read_manifest(args.manifest)
    capacity = max(args.contexts) + max(args.steps, args.breakdown_replays) + 64
    t0 = time.perf_counter()
    gen = Generator.open(args.manifest, args.kernels, args.ckpt, facts, gpu=args.gpu, capacity_tokens=capacity)
    load_s = time.perf_counter() - t0
    nbytes, wsecs = getattr(gen.rt, "weight_load_stats", (0, 0.0))
    chunk = min(512, facts.tokens_max)
    gen.generate(_prompt(20, 0), GenerateOptions(4, chunk, stop_at_eos=False))  # capture the decode graph
    gen.generate(_prompt(20, 0), GenerateOptions(2, chunk, eager=True, stop_at_eos=False))
    free1, _ = _check(cu.cuMemGetInfo())
    common = {"manifest": str(args.manifest), "load_s": load_s, "weights_gb_per_s": nbytes / 1e9 / max(wsecs, 1e-9),
              "device_mem_gb": (free0 - free1) / 1e9, "can_pipeline": gen.can_pipeline}
    for ctx in args.contexts:
        prompt = _prompt(ctx, ctx)
        runs = (("kern (graph)", False, args.lookahead), ("kern (graph, sync loop)", False, 0),
                ("kern (eager)", True, args.lookahead))
        for label, eager, lookahead in runs:
            r = gen.generate(prompt, GenerateOptions(args.steps + 1, chunk, eager=eager, stop_at_eos=False,
                                                     lookahead=lookahead))
            gaps = [1e3 * (b - a) for a, b in zip(r.timings.token_s, r.timings.token_s[1:])]
            rec = {"peer": label, "ctx": ctx, "ms_per_token": _ms(gaps)["median"], "stats": _ms(gaps),
                   "steps": len(gaps), "ttft_ms": 1e3 * r.timings.prefill_s, "pipelined": r.timings.pipelined,
                   "lookahead": lookahead, **common}
            if label == "kern (graph)":
                rec["timeline"] = kern_timeline(gen, prompt, args.steps, args.lookahead, chunk)
            _emit(out, rec)
        if args.breakdown:
            rows = kern_breakdown(gen, prompt, chunk, args.breakdown_replays)
            _emit(out, {"peer": "kern breakdown", "ctx": ctx, **breakdown_record(rows)})
    gen.close()


# ---------------------------------------------------------------- torch peers


def _resize_cache(model: Any, size: int) -> None:
    """Give the static-cache model a KV cache of `size` positions (the step attends over all of them)."""
    model.resize_cache(size)


def torch_worker(args: argparse.Namespace, out: str, mode: str | None, label: str) -> None:
    import torch

    from bench.torch_qwen3 import GraphedStep, TorchQwen3

    round64 = lambda n: -(-n // 64) * 64  # noqa: E731
    torch.cuda.set_device(args.gpu)
    free0, _ = torch.cuda.mem_get_info()
    t0 = time.perf_counter()
    model = TorchQwen3(args.ckpt, max_context=round64(max(args.contexts) + args.steps + 8))
    load_s = time.perf_counter() - t0
    for ctx in args.contexts:
        _resize_cache(model, round64(ctx + args.steps + 8))
        step = model.decode_step
        if mode is not None:  # one compiled layer serves all 36 (same shapes): minutes less than the whole step
            torch._dynamo.reset()
            model.layer_fn = torch.compile(model.layer, mode=mode, dynamic=False)
        t0 = time.perf_counter()
        with torch.inference_mode():
            graphed = GraphedStep(step)
        build_s = time.perf_counter() - t0
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        wall, gpu = [], []
        with torch.inference_mode():
            token = torch.tensor([1], dtype=torch.int64, device="cuda")
            pos = torch.tensor([ctx], dtype=torch.int64, device="cuda")
            for i in range(args.steps + 8):
                t = time.perf_counter()
                e0.record()
                nxt = graphed(token, pos)
                e1.record()
                _ = int(nxt.item())  # the token on the host (synchronises)
                if i >= 8:
                    wall.append(1e3 * (time.perf_counter() - t))
                    gpu.append(e0.elapsed_time(e1))
                token = nxt.clone()
                pos += 1
        free1, _ = torch.cuda.mem_get_info()
        _emit(out, {"peer": label, "ctx": ctx, "ms_per_token": _ms(wall)["median"], "stats": _ms(wall),
                    "gpu_ms": _ms(gpu)["median"], "steps": len(wall), "build_s": build_s, "load_s": load_s,
                    "mode": mode, "device_mem_gb": (free0 - free1) / 1e9})
        del graphed


def hf_worker(args: argparse.Namespace, out: str) -> None:
    import torch

    from kern_run.reference import HfReference

    t0 = time.perf_counter()
    ref = HfReference(Path(args.ckpt), gpu=args.gpu, attn_implementation="sdpa")
    load_s = time.perf_counter() - t0
    model = ref.model

    def timed(ids: Any, new: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, temperature=None, top_p=None,
                       top_k=None)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    with torch.inference_mode():
        for ctx in args.contexts:
            ids = torch.tensor([_prompt(ctx, ctx)], dtype=torch.long, device=f"cuda:{args.gpu}")
            timed(ids, 2)  # warm-up
            one = min(timed(ids, 1) for _ in range(2))
            many = timed(ids, 1 + args.hf_steps)
            _emit(out, {"peer": "transformers generate (eager)", "ctx": ctx,
                        "ms_per_token": 1e3 * (many - one) / args.hf_steps, "steps": args.hf_steps,
                        "ttft_ms": 1e3 * one, "load_s": load_s})


def _token_loop(step: Callable[[int, int], int], ctx: int, steps: int, warmup: int = 8) -> list[float]:
    """ms of each of `steps` greedy steps `token = step(token, position)` from position `ctx` (inputs written,
    the step run, the token read back), after `warmup` untimed ones."""
    token, wall = 1, []
    for i in range(steps + warmup):
        t = time.perf_counter()
        token = step(token, ctx + i)
        if i >= warmup:
            wall.append(1e3 * (time.perf_counter() - t))
    return wall


def harvest_worker(args: argparse.Namespace, out: str) -> None:
    """kern replaying torch.compile's harvested kernels (kern_run.harvest.replay.HarvestedStep), ms/token as the
    torch peers measure it: inputs written, the decode graph issued, next_token read back, every step."""
    import numpy as np

    from kern_run.harvest.replay import HarvestedStep

    t0 = time.perf_counter()
    step = HarvestedStep(args.harvest, args.ckpt, gpu=args.gpu)
    load_s = time.perf_counter() - t0
    context = int(step.rt.manifest.meta["harvest"]["source"]["context"])
    for ctx in args.contexts:
        if ctx + args.steps + 8 > context:
            _emit(out, {"peer": "kern (harvested inductor kernels)", "ctx": ctx, "skipped": f"captured context {context}"})
            continue
        wall = _token_loop(lambda token, position: int(step.step(np.array([token]), np.array([position]),
                                                                 read=("next_token",))["next_token"][0]),
                           ctx, args.steps)
        _emit(out, {"peer": "kern (harvested inductor kernels)", "ctx": ctx, "ms_per_token": _ms(wall)["median"],
                    "stats": _ms(wall), "steps": len(wall), "load_s": load_s, "harvest": str(args.harvest)})
    step.close()


def harvest_torch_worker(args: argparse.Namespace, out: str) -> None:
    """The step kern harvests (kern_run.harvest.torch_step.Qwen3Step: the checkpoint's own tensors, attention as
    products over the whole cache, Triton GEMM templates, an unbacked token count, compiled per layer with
    max-autotune-no-cudagraphs), built as the capture's meta says (context, scope, dynamic, autotune hint),
    captured as one torch CUDA graph over static inputs, timed as the replay is: inputs written, the graph
    replayed, next_token read back, every step. The same step, not the same cubins: its compile here autotunes
    again, so a kernel may get another config than the captured one. Also the step without the graph (the
    compiled functions called from Python)."""
    import torch

    from kern_run.harvest.torch_step import Qwen3Step

    meta = json.loads((args.harvest / "manifest.json").read_text())["meta"]["harvest"]["source"]
    context, scope, hint = int(meta["context"]), meta.get("scope", "layer"), meta.get("autotune_tokens")
    torch.cuda.set_device(args.gpu)
    t0 = time.perf_counter()
    step = Qwen3Step(args.ckpt, context, scope=scope, autotune_tokens=hint,  # compiled as the capture was
                     dynamic=meta.get("dynamic", "unbacked"), device=f"cuda:{args.gpu}")
    static = step.inputs(1)
    for _ in range(3):  # compile, autotune, warm
        step.step(static)
    torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    label = f"torch.compile of the harvested step ({scope} scope{f', GEMMs tuned at {hint} rows' if hint else ''})"
    for ctx in args.contexts:
        if ctx + args.steps + 8 > context:
            _emit(out, {"peer": label, "ctx": ctx, "skipped": f"captured context {context}"})
            continue
        graph, outputs = torch.cuda.CUDAGraph(), None
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step.step(static)
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(graph):
                outputs = step.step(static)
        except Exception as exc:  # noqa: BLE001 - reported, the ungraphed row still runs
            graph = None
            _emit(out, {"peer": label + ", one CUDA graph", "ctx": ctx, "skipped": f"capture failed: {exc}"[:300]})
        for graphed in ([True] if graph is not None else []) + [False]:
            def one(token: int, position: int, graphed: bool = graphed) -> int:
                static["token_ids"].fill_(token)
                static["positions"].fill_(position)
                if graphed:
                    graph.replay()
                    return int(outputs["next_token"][0].item())
                return int(step.step(static)["next_token"][0].item())

            wall = _token_loop(one, ctx, args.steps)
            _emit(out, {"peer": label + (", one CUDA graph" if graphed else ", no graph"), "ctx": ctx,
                        "ms_per_token": _ms(wall)["median"], "stats": _ms(wall), "steps": len(wall),
                        "load_s": load_s})


# ---------------------------------------------------------------- orchestration and table


def _run_worker(argv: list[str], timeout: float, out: str, script: Path | None = None) -> tuple[list[dict[str, Any]], str]:
    """Run `script` (default: this file) as a worker; returns (its results, status)."""
    cmd = [sys.executable, str(script or Path(__file__).resolve()), *argv, "--worker-out", out]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, timeout=max(timeout, 1), capture_output=True, text=True)
        status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()[-600:]}"
    except subprocess.TimeoutExpired:
        status = f"timed out after {timeout:.0f} s"
    print(f"# worker {argv[1]}: {status} ({time.perf_counter() - t0:.0f} s)", flush=True)
    results = []
    if os.path.exists(out):
        results = [json.loads(line) for line in Path(out).read_text().splitlines() if line.strip()]
    return results, status


def _table(results: list[dict[str, Any]], contexts: list[int], floor_ms: float, kv_bytes_per_token: int,
           notes: list[str]) -> str:
    lines = []
    perf = [r for r in results if "ms_per_token" in r]
    peers = list(dict.fromkeys(r["peer"] for r in perf))
    best_peer: dict[int, float | None] = {}  # None: no peer ran at that context (--only kern): "-" in the column
    for ctx in contexts:
        vals = [r["ms_per_token"] for r in perf if r["ctx"] == ctx and not r["peer"].startswith("kern")]
        best_peer[ctx] = min(vals) if vals else None
    floors = {ctx: floor_ms + 1e3 * ctx * kv_bytes_per_token / HBM_BYTES_PER_S for ctx in contexts}
    head = f"{'peer':40s}" + "".join(f" | ctx {c:>5d}: ms/tok  x floor  x best peer" for c in contexts)
    lines += ["", "===== decode, bs=1 (median ms/token; floor = weights" + " + KV read) / 4.3 TB/s: "
              + ", ".join(f"ctx {c}: {floors[c]:.2f} ms" for c in contexts), head, "-" * len(head)]
    for peer in peers:
        row = f"{peer:40s}"
        for ctx in contexts:
            r = next((r for r in perf if r["peer"] == peer and r["ctx"] == ctx), None)
            if r is None:
                row += f" | {'-':>18s} {'':7s} {'':12s}"
                continue
            ms, best = r["ms_per_token"], best_peer[ctx]
            vs_peer = f"{ms / best:>12.2f}" if best else f"{'-':>12s}"
            row += f" | {ms:>18.3f} {ms / floors[ctx]:>7.2f} {vs_peer}"
        lines.append(row)
    for r in perf:
        tl = r.get("timeline")
        if tl:
            lines.append(f"{r['peer']} ctx {r['ctx']}: GPU busy {tl['busy_ms']['median']:.3f} ms/step, idle between "
                         f"steps median {tl['idle_us']['median']:.1f} us (p90 {tl['idle_us']['p90']:.1f}), GPU span "
                         f"{tl['gpu_span_ms_per_step']:.3f} ms/step, TTFT {r['ttft_ms']:.1f} ms, device memory "
                         f"{r['device_mem_gb']:.2f} GB, pipelined={r['pipelined']}")
    for r in results:
        if r.get("peer") == "kern breakdown":
            variant = f" [{r['variant']}]" if r.get("variant") else ""
            lines += breakdown_lines(f"{variant}, ctx {r['ctx']}", r["summary"], r["sum_us"])
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


def add_target_args(p: argparse.ArgumentParser, manifest: str) -> None:
    """--ckpt (the qwen3-4b checkpoint under $KERN_WEIGHTS) and --manifest (manifests/`manifest`), shared by the
    benches."""
    p.add_argument("--ckpt", type=Path, default=Path(os.environ.get("KERN_WEIGHTS", "/tmp/kern-weights")) / "qwen3-4b")
    p.add_argument("--manifest", type=Path, default=ROOT / "manifests" / manifest)


def add_peer_args(p: argparse.ArgumentParser, peers: tuple[str, ...], only_help: str | None = None) -> None:
    """--kernels, --gpu and --only (a comma list of `peers`, all by default), shared by the benches."""
    p.add_argument("--kernels", type=Path, default=ROOT / "kernels")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--only", default=",".join(peers), help=only_help)


def write_json(requested: str | Path | None, name: str, summary: dict[str, Any], notes: list[str] | None = None) -> None:
    """Write `summary` (indented JSON) to `requested` (a directory: to `name` in it), else to $OUT/`name` when OUT
    is set, else nowhere; with `notes`, append `JSON: <path>` to them. A path that cannot be written (no such
    directory, no permission, an existing FIFO or device) is reported on stderr instead of a traceback or a
    blocked open: the tables are already printed."""
    target = Path(requested) if requested else (Path(os.environ["OUT"]) / name if os.environ.get("OUT") else None)
    if target is None:
        return
    if target.is_dir():
        target = target / name
    if target.exists() and not target.is_file():  # a FIFO or a device would block or swallow the write
        print(f"could not write the JSON to {target}: not a regular file", file=sys.stderr)
        return
    try:
        target.write_text(json.dumps(summary, indent=1))
    except OSError as exc:
        print(f"could not write the JSON to {target}: {exc.strerror or exc}", file=sys.stderr)
        return
    if notes is not None:
        notes.append(f"JSON: {target}")


def exit_code(results: list[dict[str, Any]], key: str, script: str) -> int:
    """0 when some result row has `key` (a measurement), else 1 after saying so on stderr."""
    if not any(key in r for r in results):
        print(f"{script}: no peer produced a measurement (see the notes above)", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--batch" or a.startswith("--batch=") for a in argv):  # the batched bench: bench/decode_batch.py
        from bench import decode_batch

        return decode_batch.main(argv)
    if any(a == "--tp" or a.startswith("--tp=") for a in argv):  # tensor parallel: bench/decode_tp.py
        from bench import decode_tp

        return decode_tp.main(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_target_args(p, "qwen3-4b-v2.json")
    p.add_argument("--variants", default="", help="comma list of manifests: the kern worker once per manifest, "
                   "rows labelled [manifest stem] (replaces --manifest for kern)")
    add_peer_args(p, PEERS, only_help=f"comma list of {', '.join(PEERS + OPTIONAL_PEERS)} (default: all but "
                  f"{', '.join(OPTIONAL_PEERS)})")
    p.add_argument("--contexts", default="128,4096")
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("--lookahead", type=int, default=4)
    p.add_argument("--hf-steps", type=int, default=32)
    p.add_argument("--breakdown", action="store_true", help="kern: time every launch of one decode step")
    p.add_argument("--breakdown-replays", type=int, default=12)
    p.add_argument("--compile-timeout", type=float, default=170.0, help="seconds for the max-autotune worker")
    p.add_argument("--budget", type=float, default=340.0, help="seconds for all workers together")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--harvest", type=Path, default=None, help="kern-harvest: the directory kern harvest generate wrote")
    p.add_argument("--worker", choices=["kern", "torch-graph", "torch-compile", "hf", "kern-harvest", "torch-harvest"],
                   help=argparse.SUPPRESS)
    p.add_argument("--compile-mode", default="max-autotune-no-cudagraphs", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.contexts = [int(c) for c in str(args.contexts).split(",") if c]
    named = {s for s in args.only.split(",") if s} & set(OPTIONAL_PEERS)  # the harvest peers
    if named and (args.harvest is None or not (args.harvest / "manifest.json").is_file()):
        p.error(f"--only {','.join(sorted(named))} needs --harvest DIR (what kern harvest generate wrote: "
                f"DIR/manifest.json); got {args.harvest}")

    if args.worker:
        out = args.worker_out
        if args.worker == "kern":
            kern_worker(args, out)
        elif args.worker == "torch-graph":
            torch_worker(args, out, None, "torch step, one CUDA graph")
        elif args.worker == "torch-compile":
            label = f"torch.compile({args.compile_mode}), one CUDA graph"
            torch_worker(args, out, args.compile_mode, label)
        elif args.worker == "kern-harvest":
            harvest_worker(args, out)
        elif args.worker == "torch-harvest":
            harvest_torch_worker(args, out)
        else:
            hf_worker(args, out)
        return 0

    if not (args.ckpt / "config.json").is_file():
        print(f"# {args.ckpt} missing: making it (tools/make_checkpoint.py --shape qwen3-4b)", flush=True)
        subprocess.run([sys.executable, str(ROOT / "tools" / "make_checkpoint.py"), "--shape", "qwen3-4b",
                        "--out", str(args.ckpt)], check=True)
    only = [s for s in args.only.split(",") if s]
    base = ["--ckpt", str(args.ckpt), "--manifest", str(args.manifest), "--kernels", str(args.kernels), "--gpu",
            str(args.gpu), "--contexts", ",".join(map(str, args.contexts)), "--steps", str(args.steps),
            "--lookahead", str(args.lookahead), "--hf-steps", str(args.hf_steps), "--breakdown-replays",
            str(args.breakdown_replays)] + (["--breakdown"] if args.breakdown else []) + \
        (["--harvest", str(args.harvest)] if args.harvest else [])
    start = time.perf_counter()
    remaining = lambda: args.budget - (time.perf_counter() - start)  # noqa: E731
    results: list[dict[str, Any]] = []
    notes: list[str] = []
    tmp = tempfile.mkdtemp(prefix="kern-bench-decode-")
    variants = [Path(v) for v in args.variants.split(",") if v]
    for peer in [p for p in PEERS + OPTIONAL_PEERS if p in only]:
        out = os.path.join(tmp, f"{peer}.jsonl")
        if remaining() < 20:
            notes.append(f"{peer}: skipped, the {args.budget:.0f} s budget is spent")
            continue
        if peer == "kern" and variants:
            for i, manifest in enumerate(variants):
                tag = manifest.stem
                if remaining() < 20:
                    notes.append(f"kern [{tag}]: skipped, the {args.budget:.0f} s budget is spent")
                    continue
                vbase = list(base)
                vbase[vbase.index("--manifest") + 1] = str(manifest)
                vout = os.path.join(tmp, f"kern-{i}.jsonl")
                got, status = _run_worker(["--worker", "kern", *vbase], remaining(), vout)
                if status != "ok":
                    notes.append(f"kern [{tag}]: {status[:300]}")
                for r in got:
                    r["variant"] = tag
                    if r.get("peer", "").startswith("kern") and r["peer"] != "kern breakdown":
                        r["peer"] = f"{r['peer']} [{tag}]"
                results += got
            continue
        if peer == "torch-compile":
            got, status = _run_worker(["--worker", peer, *base], min(args.compile_timeout, remaining()), out)
            if status != "ok" and not got:
                notes.append(f"torch.compile max-autotune-no-cudagraphs: {status}; default mode instead")
                out = os.path.join(tmp, f"{peer}-default.jsonl")
                got, status = _run_worker(["--worker", peer, *base, "--compile-mode", "default"],
                                          min(180.0, remaining()), out)
        else:
            got, status = _run_worker(["--worker", peer, *base], remaining(), out)
        if status != "ok":
            notes.append(f"{peer}: {status[:300]}")
        results += got

    from bench.decode_batch import kv_bytes_per_token as kv_of

    kv_bytes_per_token = kv_of(json.loads((args.ckpt / "config.json").read_text()))
    wbytes = checkpoint_bytes(args.ckpt)
    floor_ms = 1e3 * wbytes / HBM_BYTES_PER_S
    summary = {"floor_ms_weights": floor_ms, "checkpoint_bytes": wbytes, "contexts": args.contexts,
               "results": results, "notes": notes, "seconds": time.perf_counter() - start}
    write_json(args.json, "bench-decode.json", summary, notes)
    print(_table(results, args.contexts, floor_ms, kv_bytes_per_token, notes))
    return exit_code(results, "ms_per_token", "bench/decode.py")


if __name__ == "__main__":
    sys.exit(main())
