#!/usr/bin/env python3
"""Prefill benchmark, bs = 1, Qwen3-4B shape: time to first token and prompt tokens/s (GPU machine).

    python3 bench/prefill.py --ckpt /tmp/kern-weights/qwen3-4b [--prompts 512,2048,8192] [--chunks 512,2048]
                             [--only kern,torch,hf] [--repeats 3] [--json out.json]

- `kern`: `Generator.generate(prompt, 1 token)` on manifests/qwen3-4b-c2048.json (tokens var max 2048):
  the first n-1 prompt tokens through the eager `prefill` program in chunks of `--chunks`, the last one
  through the decode graph; TTFT = issue of the first chunk -> first token on the host.
- `torch`: bench/torch_qwen3.py's whole-prompt forward (one pass, static cache sized to the prompt) + argmax.
- `hf`: transformers `Qwen3ForCausalLM` forward over the whole prompt (sdpa, logits of the last row) + argmax.
Median of `--repeats` runs after one warm-up per configuration. Target (docs/perf.md): >= 20k tokens/s on the
2k-token prompt. Each peer in its own subprocess; prints a table last; JSON to `--json` or $OUT/bench-prefill.json.
Exit 1 when no peer produced a measurement (every worker failed: no GPU, no torch; the notes say why).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.decode import _emit, _prompt, _resize_cache, _run_worker, add_peer_args, add_target_args, exit_code, write_json

ROOT = Path(__file__).resolve().parents[1]

PEERS = ("kern", "torch", "hf")
TARGET_TOKENS_PER_S = 20_000


def _median_s(fn, repeats: int) -> float:
    fn()  # warm-up (cuBLASLt plans for new shapes, allocator)
    return statistics.median(fn() for _ in range(repeats))


def kern_worker(args: argparse.Namespace, out: str) -> None:
    from kern_run.generate import GenerateOptions, Generator
    from kern_run.preflight import read_manifest

    facts = read_manifest(args.manifest)
    gen = Generator.open(args.manifest, args.kernels, args.ckpt, facts, gpu=args.gpu,
                         capacity_tokens=max(args.prompts) + 64)
    gen.generate(_prompt(8, 0), GenerateOptions(2, 8, stop_at_eos=False))  # decode graph captured
    for n in args.prompts:
        prompt = _prompt(n, n)
        for chunk in args.chunks:
            if chunk > facts.tokens_max:
                _emit(out, {"peer": f"kern (chunk {chunk})", "n": n, "skipped": f"tokens max {facts.tokens_max}"})
                continue

            def once() -> float:
                r = gen.generate(prompt, GenerateOptions(1, chunk, stop_at_eos=False, lookahead=0))
                return r.timings.prefill_s

            s = _median_s(once, args.repeats)
            _emit(out, {"peer": f"kern (chunk {chunk})", "n": n, "ttft_ms": 1e3 * s, "tokens_per_s": n / s})
    gen.close()


def torch_worker(args: argparse.Namespace, out: str) -> None:
    import torch
    from bench.torch_qwen3 import TorchQwen3

    torch.cuda.set_device(args.gpu)
    round64 = lambda v: -(-v // 64) * 64  # noqa: E731
    model = TorchQwen3(args.ckpt, max_context=round64(max(args.prompts) + 8))
    with torch.inference_mode():
        for n in args.prompts:
            _resize_cache(model, round64(n + 8))
            ids = torch.tensor(_prompt(n, n), dtype=torch.int64, device="cuda")
            pos = torch.arange(n, device="cuda")

            def once() -> float:
                torch.cuda.synchronize()
                t = time.perf_counter()
                int(model.forward(ids, pos).argmax(-1).item())
                return time.perf_counter() - t

            s = _median_s(once, args.repeats)
            _emit(out, {"peer": "torch whole-prompt forward", "n": n, "ttft_ms": 1e3 * s, "tokens_per_s": n / s})


def hf_worker(args: argparse.Namespace, out: str) -> None:
    import torch
    from kern_run.reference import HfReference

    ref = HfReference(Path(args.ckpt), gpu=args.gpu, attn_implementation="sdpa")
    with torch.inference_mode():
        for n in args.prompts:
            ids = torch.tensor([_prompt(n, n)], dtype=torch.long, device=f"cuda:{args.gpu}")

            def once() -> float:
                torch.cuda.synchronize()
                t = time.perf_counter()
                try:
                    logits = ref.model(input_ids=ids, logits_to_keep=1, use_cache=False).logits
                except TypeError:
                    logits = ref.model(input_ids=ids, use_cache=False).logits
                int(logits[0, -1].argmax().item())
                return time.perf_counter() - t

            s = _median_s(once, args.repeats)
            _emit(out, {"peer": "transformers forward (sdpa)", "n": n, "ttft_ms": 1e3 * s, "tokens_per_s": n / s})


def _table(results: list[dict[str, Any]], prompts: list[int], notes: list[str]) -> str:
    rows = [r for r in results if "ttft_ms" in r]
    peers = list(dict.fromkeys(r["peer"] for r in rows))
    head = f"{'peer':30s}" + "".join(f" | n={n:>5d}: TTFT ms   tok/s" for n in prompts)
    lines = ["", f"===== prefill, bs=1 (median; target >= {TARGET_TOKENS_PER_S} tok/s at n=2048)", head, "-" * len(head)]
    for peer in peers:
        line = f"{peer:30s}"
        for n in prompts:
            r = next((r for r in rows if r["peer"] == peer and r["n"] == n), None)
            line += f" | {'-':>18s}" if r is None else f" | {r['ttft_ms']:>10.1f} {r['tokens_per_s']:>9.0f}"
        lines.append(line)
    best = max((r["tokens_per_s"] for r in rows if r["peer"].startswith("kern") and r["n"] == 2048), default=None)
    if best is not None:
        verdict = "meets" if best >= TARGET_TOKENS_PER_S else "misses"
        lines.append(f"kern at n=2048: {best:.0f} tok/s ({verdict} the {TARGET_TOKENS_PER_S} tok/s bar)")
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_target_args(p, "qwen3-4b-c2048.json")
    add_peer_args(p, PEERS)
    p.add_argument("--prompts", default="512,2048,8192")
    p.add_argument("--chunks", default="512,2048")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--budget", type=float, default=170.0, help="seconds for all workers together")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--worker", choices=PEERS, help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.prompts = [int(v) for v in str(args.prompts).split(",") if v]
    args.chunks = [int(v) for v in str(args.chunks).split(",") if v]
    if args.worker:
        {"kern": kern_worker, "torch": torch_worker, "hf": hf_worker}[args.worker](args, args.worker_out)
        return 0
    if not (args.ckpt / "config.json").is_file():
        import subprocess

        subprocess.run([sys.executable, str(ROOT / "tools" / "make_checkpoint.py"), "--shape", "qwen3-4b",
                        "--out", str(args.ckpt)], check=True)
    base = ["--ckpt", str(args.ckpt), "--manifest", str(args.manifest), "--kernels", str(args.kernels), "--gpu",
            str(args.gpu), "--prompts", ",".join(map(str, args.prompts)), "--chunks", ",".join(map(str, args.chunks)),
            "--repeats", str(args.repeats)]
    start, results, notes = time.perf_counter(), [], []
    tmp = tempfile.mkdtemp(prefix="kern-bench-prefill-")
    for peer in [q for q in PEERS if q in args.only.split(",")]:
        left = args.budget - (time.perf_counter() - start)
        if left < 15:
            notes.append(f"{peer}: skipped, the {args.budget:.0f} s budget is spent")
            continue
        got, status = _run_worker(["--worker", peer, *base], left, os.path.join(tmp, f"{peer}.jsonl"),
                                  script=Path(__file__).resolve())
        if status != "ok":
            notes.append(f"{peer}: {status[:300]}")
        results += got
    write_json(args.json, "bench-prefill.json", {"results": results, "notes": notes,
                                                 "seconds": time.perf_counter() - start}, notes)
    print(_table(results, args.prompts, notes))
    return exit_code(results, "ttft_ms", "bench/prefill.py")


if __name__ == "__main__":
    sys.exit(main())
