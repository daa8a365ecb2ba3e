#!/usr/bin/env python3
"""Where one prefill's GPU time goes, kern against transformers (GPU machine): kernel time by class, from CUPTI.

    python3 bench/prefill_profile.py --ckpt /tmp/kern-weights/qwen3-4b [--n 8192] [--chunk 2048] [--only kern,hf]

Each peer runs in its own subprocess: one warm-up pass, then one prefill of an n-token prompt under
torch.profiler (CUPTI records every kernel with its start and duration, kern's raw cuLaunchKernel launches
included). `kern`: `Generator.generate(prompt, 1 token)` at `--chunk` on manifests/qwen3-4b-c2048.json (the
eager prefill program, then the decode graph for the first token), as bench/prefill.py times it; `hf`:
transformers `Qwen3ForCausalLM` forward over the whole prompt (sdpa, last row's logits), as bench/prefill.py.

Kernels are put in classes by name: `attention` (kern_attn_prefill*, flash / fmha / sdpa / attention
kernels), `gemm` (cuBLAS / cuBLASLt / CUTLASS: gemm, xmma, nvjet, cutlass in the name), `other`. Prints per peer
and class the kernel milliseconds and launch count, the span (first kernel start to last kernel end) and
the top kernels by time, so a misclassified name shows. JSON lines to `--json` or $OUT/prefill-profile.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.decode import _emit, _prompt, _run_worker, add_peer_args, add_target_args, write_json

ROOT = Path(__file__).resolve().parents[1]

PEERS = ("kern", "hf")
CLASSES = ("attention", "gemm", "other")


def kernel_class(name: str) -> str:
    """The class of a kernel by its (demangled) name; see the module docstring."""
    low = name.lower()
    if "attn" in low or "flash" in low or "fmha" in low or "attention" in low or "sdpa" in low:
        return "attention"
    if "gemm" in low or "xmma" in low or "nvjet" in low or "cutlass" in low:
        return "gemm"
    return "other"


def _profiled(run) -> list[tuple[float, float, str]]:
    """(start us, duration us, name) of every kernel `run()` launched, by start."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    prof.export_chrome_trace(path)
    events = json.loads(Path(path).read_text()).get("traceEvents", [])
    os.unlink(path)
    return sorted((float(e["ts"]), float(e["dur"]), str(e["name"])) for e in events
                  if e.get("ph") == "X" and e.get("cat") == "kernel")


def _emit_profile(out: str, peer: str, kernels: list[tuple[float, float, str]]) -> None:
    if not kernels:
        raise SystemExit(f"{peer}: the profiler recorded no kernel")
    by_class: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for _, dur, name in kernels:
        for table, key in ((by_class, kernel_class(name)), (by_name, name.split("(")[0][:90])):
            table[key][0] += dur / 1e3
            table[key][1] += 1
    span = (kernels[-1][0] + kernels[-1][1] - kernels[0][0]) / 1e3
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:10]
    _emit(out, {"peer": peer, "span_ms": span, "classes": {c: by_class[c] for c in CLASSES},
                "top": [[name, ms, int(n)] for name, (ms, n) in top]})


def kern_worker(args: argparse.Namespace, out: str) -> None:
    from kern_run.generate import GenerateOptions, Generator
    from kern_run.preflight import read_manifest

    facts = read_manifest(args.manifest)
    if args.chunk > facts.tokens_max:
        raise SystemExit(f"--chunk {args.chunk} > the manifest's tokens max {facts.tokens_max}")
    gen = Generator.open(args.manifest, args.kernels, args.ckpt, facts, gpu=args.gpu, capacity_tokens=args.n + 64)
    prompt = _prompt(args.n, args.n)
    opts = GenerateOptions(1, args.chunk, stop_at_eos=False, lookahead=0)
    gen.generate(prompt, opts)  # warm-up: decode graph captured, cuBLASLt plans made
    _emit_profile(out, f"kern (chunk {args.chunk})", _profiled(lambda: gen.generate(prompt, opts)))
    gen.close()


def hf_worker(args: argparse.Namespace, out: str) -> None:
    import torch
    from kern_run.reference import HfReference

    ref = HfReference(Path(args.ckpt), gpu=args.gpu, attn_implementation="sdpa")
    ids = torch.tensor([_prompt(args.n, args.n)], dtype=torch.long, device=f"cuda:{args.gpu}")

    def once() -> None:
        with torch.inference_mode():
            try:
                logits = ref.model(input_ids=ids, logits_to_keep=1, use_cache=False).logits
            except TypeError:
                logits = ref.model(input_ids=ids, use_cache=False).logits
            int(logits[0, -1].argmax().item())

    once()
    _emit_profile(out, "transformers forward (sdpa)", _profiled(once))


def _table(results: list[dict[str, Any]], n: int) -> str:
    lines = ["", f"===== prefill of {n} tokens: kernel ms by class (count), span = first kernel start to last end"]
    head = f"{'peer':30s}" + "".join(f" | {c:>18s}" for c in CLASSES) + f" | {'sum':>8s} | {'span':>8s}"
    lines += [head, "-" * len(head)]
    for r in results:
        cls = r["classes"]
        line = f"{r['peer']:30s}" + "".join(f" | {cls[c][0]:9.1f} ({int(cls[c][1]):>5d})" for c in CLASSES)
        lines.append(line + f" | {sum(v[0] for v in cls.values()):8.1f} | {r['span_ms']:8.1f}")
    for r in results:
        lines.append(f"top kernels, {r['peer']}:")
        lines += [f"  {ms:9.2f} ms {count:>5d} x  {name}" for name, ms, count in r["top"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_target_args(p, "qwen3-4b-c2048.json")
    add_peer_args(p, PEERS)
    p.add_argument("--n", type=int, default=8192, help="prompt tokens")
    p.add_argument("--chunk", type=int, default=2048, help="kern's prefill chunk")
    p.add_argument("--timeout", type=float, default=150.0, help="seconds per worker")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--worker", choices=PEERS, help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.n < 2 or args.chunk < 1:
        p.error("--n >= 2 and --chunk >= 1")
    if args.worker:
        {"kern": kern_worker, "hf": hf_worker}[args.worker](args, args.worker_out)
        return 0
    base = ["--ckpt", str(args.ckpt), "--manifest", str(args.manifest), "--kernels", str(args.kernels),
            "--gpu", str(args.gpu), "--n", str(args.n), "--chunk", str(args.chunk)]
    tmp = tempfile.mkdtemp(prefix="kern-prefill-profile-")
    results, notes = [], []
    for peer in [q for q in PEERS if q in args.only.split(",")]:
        got, status = _run_worker(["--worker", peer, *base], args.timeout, os.path.join(tmp, f"{peer}.jsonl"),
                                  script=Path(__file__).resolve())
        results += got
        if status != "ok":
            notes.append(f"{peer}: {status[:300]}")
    write_json(args.json, "prefill-profile.json", {"results": results, "notes": notes})
    print(_table(results, args.n) + "".join(f"\nnote: {n}" for n in notes))
    return 0 if results else 1


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    print(f"# {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    sys.exit(rc)
