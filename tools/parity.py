#!/usr/bin/env python3
"""Parity of kern against transformers at a real shape (default: Qwen3-4B, seeded random weights).

Steps: make the checkpoint if missing (tools/make_checkpoint.py, skipped when its stamp matches), load
kern (the shape's committed manifest, kernels/), run the cases, close kern, load
`Qwen3ForCausalLM` (bf16, eager attention) on the same checkpoint, run the same cases, compare:

- `decode 0..255`: 256 positions teacher-forced through decode from position 0;
- `prompt 2k`: a 2048-token prompt (2047 through chunked prefill, 512 per chunk) then 32 positions;
- `greedy 64`: free-running greedy tokens of both after a text prompt; first divergence and whether
  the reference's top-2 margin there is within the measured error;
- timings: kern's prefill tokens/s on the 2k prompt and decode ms/token (graph).

Also loads transformers in float32 (the bf16 weights upcast) as the higher-precision reference: kern's
relative logit error against it must stay within max(--rel-tol, 1.5 x bf16 transformers' own error against
it) — the bf16 bound is measured, not assumed (a 36-layer random-weight model amplifies bf16 rounding far
beyond a 4-layer one).

Prints short tables; exits 1 when a check fails (kern's error vs float32 above the bound, or a top-1
difference at a step whose reference margin exceeds twice that step's error).

    python tools/parity.py [--shape qwen3-4b] [--ckpt /tmp/qwen3-4b] [--gpu 0]

`--shape` is any tools/make_checkpoint.py shape. One with a committed manifest (MANIFESTS) tests that manifest; any
other (qwen3-1.7b, qwen3-8b, llama3.2-1b, ...) tests the manifest `kern run --weights` builds from the checkpoint's
config.json (kern_run.auto_manifest: the user cache, batch-invariant prefill pins picked on first use), unless
`--manifest` names one. Ids are drawn below the family's ordinary tokens (Qwen3 151643, Llama 3 128000).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

MANIFESTS = {"qwen3-4b": "qwen3-4b-v2.json", "qwen3-0.6b": "qwen3-0.6b.json", "tiny": "qwen3-tiny.json"}
PROMPT = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"


def verdict(failures: list[str], name: str) -> int:
    """Print each failure as `FAIL <failure>`, then `<name>: ok` or `<name>: N failure(s)`; the exit status (1 when
    anything failed, else 0)."""
    for f in failures:
        print(f"FAIL {f}")
    print(f"{name}: ok" if not failures else f"{name}: {len(failures)} failure(s)")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="kern vs transformers parity at a real Qwen3 shape")
    from tools import make_checkpoint as mc

    parser.add_argument("--shape", choices=sorted(mc.SHAPES), default="qwen3-4b")
    parser.add_argument("--ckpt", type=Path, default=None, help="checkpoint dir (default /tmp/<shape>)")
    parser.add_argument("--manifest", type=Path, default=None,
                        help="manifest to test (default: the shape's, qwen3-4b -> manifests/qwen3-4b-v2.json)")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rel-tol", type=float, default=2e-2)
    parser.add_argument("--positions", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    args = parser.parse_args(argv)

    from kern_run.compare import compare_logits, table, top2_margin
    from kern_run.generate import GenerateOptions, Generator
    from kern_run.errors import RefusalError
    from kern_run.preflight import probe_device, read_manifest
    from kern_run.text import load_codec

    try:
        probe_device(args.gpu)
    except RefusalError as exc:
        print(f"parity: {exc}", file=sys.stderr)
        return 2

    ckpt = args.ckpt or Path("/tmp") / args.shape
    t0 = time.perf_counter()
    try:
        mc.write_checkpoint(ckpt, mc.SHAPES[args.shape], seed=args.seed)
    except FileNotFoundError as exc:
        print(f"parity: {exc}", file=sys.stderr)
        return 2
    print(f"checkpoint {ckpt} ready in {time.perf_counter() - t0:.1f} s", flush=True)
    if args.manifest is not None:
        manifest = args.manifest
    elif args.shape in MANIFESTS:
        manifest = ROOT / "manifests" / MANIFESTS[args.shape]
    else:  # what `kern run --weights CKPT` builds (and caches), printing the line it prints
        from kern_run.auto_manifest import AutoRequest, auto_config

        manifest = auto_config(AutoRequest(weights=ckpt, gpu=args.gpu), err=sys.stdout, command="parity").manifest
    facts = read_manifest(manifest)
    codec = load_codec(ckpt)
    rng = np.random.default_rng(args.seed + 1)
    ordinary = 128000 if args.shape.startswith("llama") else 151643  # ids below the family's special tokens
    ids_decode = rng.integers(0, ordinary, size=args.positions).tolist()
    ids_long = rng.integers(0, ordinary, size=args.prompt_tokens + 32).tolist()
    text_ids = codec.encode(PROMPT)

    # ---- kern
    t0 = time.perf_counter()
    gen = Generator.open(manifest, ROOT / "kernels", ckpt, facts, gpu=args.gpu, capacity_tokens=8192)
    load_s = time.perf_counter() - t0
    nbytes, wsecs = getattr(gen.rt, "weight_load_stats", (0, 0.0))
    kern_decode, kern_decode_argmax = gen.teacher_forced(ids_decode, 0, 512)
    kern_long, kern_long_argmax = gen.teacher_forced(ids_long, args.prompt_tokens, 512)
    timed = gen.generate(ids_long[:args.prompt_tokens], GenerateOptions(128, 512, stop_at_eos=False))
    kern_greedy = gen.generate(text_ids, GenerateOptions(128, 512, stop_at_eos=False)).tokens
    variants = {  # the same 128 greedy tokens whatever the prefill chunking or replay mode
        "chunk 1, graph": gen.generate(text_ids, GenerateOptions(128, 1, stop_at_eos=False)).tokens,
        "chunk 512, eager": gen.generate(text_ids, GenerateOptions(128, 512, eager=True, stop_at_eos=False)).tokens,
    }
    gen.close()
    del gen
    gc.collect()

    # ---- transformers
    from kern_run.reference import HfReference

    t0 = time.perf_counter()
    ref = HfReference(ckpt, gpu=args.gpu)
    ref_load_s = time.perf_counter() - t0
    ref_decode = ref.logits(ids_decode, 0)
    ref_long = ref.logits(ids_long, args.prompt_tokens)
    ref_greedy = ref.greedy(text_ids, 64)
    kern_greedy64 = kern_greedy[:64]
    first = next((i for i, (a, b) in enumerate(zip(kern_greedy64, ref_greedy)) if a != b), None)
    ref_at_div = None
    if first is not None:
        ids = text_ids + ref_greedy[:first]
        ref_at_div = ref.logits(ids, len(ids) - 1)
    ref.close()
    del ref
    gc.collect()

    # ---- transformers in float32 (the same bf16 weights, upcast): the higher-precision reference. bf16
    # transformers' own distance from it is the measured bf16 error bound kern is held to.
    ref32 = HfReference(ckpt, gpu=args.gpu, dtype="float32")
    f32_decode = ref32.logits(ids_decode, 0)
    f32_long = ref32.logits(ids_long, args.prompt_tokens)
    ref32.close()
    del ref32
    gc.collect()

    failures: list[str] = []
    calib = []
    for name, mine, hf16, f32 in (("decode 0..%d" % (args.positions - 1), kern_decode, ref_decode, f32_decode),
                                  ("prompt %d + 32" % args.prompt_tokens, kern_long, ref_long, f32_long)):
        ours, theirs = compare_logits(mine, f32, 0.0), compare_logits(hf16, f32, 0.0)
        bound = max(args.rel_tol, 1.5 * theirs.max_rel)
        bad = ours.mismatches_beyond_error(2.0)
        calib.append((name, f"{ours.max_rel:.2e}", f"{theirs.max_rel:.2e}", f"{bound:.2e}",
                      f"{100 * ours.top1_agreement:.1f}%", f"{100 * theirs.top1_agreement:.1f}%", str(len(bad))))
        if ours.max_rel > bound:
            failures.append(f"{name}: kern's max relative error vs float32 {ours.max_rel:.2e} > bound {bound:.2e} "
                            f"(1.5 x bf16 transformers' own {theirs.max_rel:.2e})")
        if bad:
            failures.append(f"{name}: top-1 differs from float32 beyond kern's error bound at steps {bad[:10]}")
    print(table(calib, ("case (vs float32)", "kern rel", "hf-bf16 rel", "bound", "kern top1", "hf-bf16 top1",
                        "beyond err")))
    rows = []
    for name, mine, theirs, argmax in (("decode 0..%d" % (args.positions - 1), kern_decode, ref_decode, kern_decode_argmax),
                                       ("prompt %d + 32" % args.prompt_tokens, kern_long, ref_long, kern_long_argmax)):
        cmp = compare_logits(mine, theirs, 0.0)
        bad = cmp.mismatches_beyond_error(2.0)
        gpu_vs_host = int(np.sum(argmax != np.argmax(mine, axis=1)))
        rows.append((name, str(len(cmp.steps)), f"{cmp.max_abs:.4f}", f"{cmp.max_rel:.2e}",
                     f"{100 * cmp.top1_agreement:.1f}%", "-" if cmp.first_divergence is None else str(cmp.first_divergence),
                     str(len(bad)), str(gpu_vs_host)))
        if bad:  # kern vs bf16 transformers: informational error size; a top-1 flip must be a near tie
            failures.append(f"{name}: top-1 differs from bf16 transformers beyond the error bound at steps {bad[:10]}")
        if gpu_vs_host:
            failures.append(f"{name}: GPU argmax differs from argmax of kern's logits at {gpu_vs_host} steps")
    print(table(rows, ("case", "steps", "max|err|", "max rel", "top1", "first div", "beyond err", "argmax gpu!=host")))
    if first is None:
        print(f"greedy 64 after a {len(text_ids)}-token text prompt: identical to transformers")
    else:
        margin = top2_margin(ref_at_div[0])
        print(f"greedy 64: first divergence at step {first} (reference top-2 margin there {margin:.4f})")
    for name, tokens in variants.items():
        if tokens != kern_greedy:
            step = next(i for i, (a, b) in enumerate(zip(tokens, kern_greedy)) if a != b)
            failures.append(f"greedy 128, {name}: differs from chunk 512, graph at step {step}")
    if len(kern_greedy) == 128 and not any(f.startswith("greedy 128") for f in failures):
        print("greedy 128: chunk 512 graph, chunk 1 graph and chunk 512 eager give identical tokens")
    t = timed.timings
    print(f"kern: load {load_s:.2f} s (weights {nbytes / 1e9:.2f} GB at {nbytes / 1e9 / max(wsecs, 1e-9):.1f} GB/s); "
          f"prefill {t.prefill_tokens} tokens {t.prefill_tokens_per_s:.0f} tokens/s (incl. first decode); "
          f"decode {t.decode_ms_per_token:.3f} ms/token over {t.decode_steps} steps (graph); "
          f"transformers load {ref_load_s:.1f} s")
    return verdict(failures, "parity")


if __name__ == "__main__":
    sys.exit(main())
