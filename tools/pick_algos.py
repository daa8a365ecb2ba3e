"""Pick one batch-invariant cuBLASLt algorithm per prefill GEMM shape, by timing on this GPU: a pins file for
`kern manifest build --algos` (the committed manifests/algos/*.json).

The search is kern_runtime.gemm_pins (its docstring: why batch invariance, the candidates, the proof that rows
computed at M = 1, 2, 3, 4, 7, 8, 16, 17, 32, 64, 100, 511, m_max - 1 equal the M = m_max rows bit for bit, the timing).
`kern run --weights DIR` runs the same search in-process on first use of a shape (kern_run.pins_cache); this
tool picks for several shapes, configs and tensor-parallel degrees at once, and with --decode adds the fastest
M = 1 pins (`decode_pins`, split-K allowed, the lm_head shape included), and with --lm-head each config's lm_head
shape (vocab x hidden) among the proven pins (what `kern manifest build --batch-invariant` decodes the lm_head with;
without it, on a decode pin without split-K, listed as unproven), and with --invariant-decode the batch-invariant
decode pins (`invariant_decode_pins`: split-K allowed but never the in-place reduction, proven row-invariant over
M = 1 .. 64, fastest by the sum of the graph times at M = 1, 8, 64; the lm_head shape included), which
`--batch-invariant` manifests run at every decode bucket instead of the prefill pins. Writes JSON (`--out`, default stdout;
format kern_runtime.gemm_pins.document).

Host-side refusals (exit 2, one line on stderr, before the device is touched): an unknown --shape, a --config
that cannot be read, is not UTF-8 JSON or holds a value the builder (kern_run.models.qwen3) refuses (named by
key), a --tp below 1 or not dividing every shape's q / kv heads and MLP width, an --m-max below 1, a malformed
--keep-pins file, no shape to pick. Then no CUDA device, or --keep-pins --decode / --invariant-decode stamped by another device or
cuBLASLt; a shape with no invariant candidate, or the device failing (exit 2, naming it).

Run on the GPU machine (needs a CUDA device, cuda-bindings and nvmath-python):

    python tools/pick_algos.py --shape qwen3-4b --shape qwen3-0.6b --shape tiny \
        --config models/qwen3-tiny-en/config.json --tp 1 --tp 2 --m-max 2048 --out manifests/algos/h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def gemm_shapes(cfg: Any, tp: int) -> list[tuple[int, int]]:
    """(n, k) of the four prefill projections of one rank (kern_run.models.qwen3.prefill_shapes of the rank's
    shard_config: column-parallel qkv / gate_up n / tp, row-parallel o / down k / tp), sorted."""
    from kern_run.models import qwen3 as gq

    return sorted(gq.prefill_shapes(gq.shard_config(cfg, tp) if tp > 1 else cfg))


def main(argv: list[str] | None = None) -> int:
    from kern_run.files import write_files
    from kern_run.models import qwen3 as gq

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", default=[], help="a known shape of kern_run.models.qwen3 (repeatable)")
    ap.add_argument("--config", action="append", default=[], help="a Hugging Face config.json (repeatable)")
    ap.add_argument("--tp", action="append", type=int, default=[], help="tensor-parallel degrees (default 1)")
    ap.add_argument("--m-max", type=int, default=2048, help="largest M (tokens var max) the pins must serve")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--out", type=Path, help="JSON output (default stdout)")
    ap.add_argument("--keep-pins", type=Path, help="take the prefill pins (and m_max) from this pins file instead of "
                                                   "picking them again (with --decode: add decode pins to it; "
                                                   "with --lm-head: add the lm_head pins it lacks)")
    ap.add_argument("--lm-head", action="store_true",
                    help="also pin each config's lm_head shape (vocab x hidden), proven like the prefill pins "
                         "(what --batch-invariant manifests decode the lm_head with)")
    ap.add_argument("--decode", action="store_true",
                    help="also pick the fastest M = 1 configuration per shape (split-K allowed) for cuBLASLt decode "
                         "(`decode_pins`; the lm_head shape included)")
    ap.add_argument("--invariant-decode", action="store_true",
                    help="also pick the batch-invariant decode pins per shape (split-K allowed, proven over M = 1 .. 64; "
                         "`invariant_decode_pins`, the lm_head shape included); with --keep-pins the kept file's "
                         "rows of other shapes stay")
    args = ap.parse_args(argv)

    def refuse(msg: str) -> int:
        print(f"pick_algos: {msg}", file=sys.stderr)
        return 2

    # everything the host can check comes before the device
    unknown = [s for s in args.shape if s not in gq.SHAPES]
    if unknown:
        return refuse(f"--shape {unknown[0]!r} is not a known shape ({', '.join(sorted(gq.SHAPES))})")
    configs = [gq.Qwen3Config.from_name(s) for s in args.shape]
    labels = [f"--shape {s}" for s in args.shape]
    for c in args.config:
        try:  # ManifestBuildError names the file and the key (Qwen3Config.from_json checks types and ranges)
            configs.append(gq.Qwen3Config.from_json(gq.read_json_file(Path(c))[0], c))
        except gq.ManifestBuildError as exc:
            return refuse(f"--config {exc}")
        labels.append(f"--config {c}")
    if not configs and (args.decode or args.lm_head or args.invariant_decode or not args.keep_pins):
        return refuse("no shapes to pick: pass --shape or --config")
    for tp in args.tp:  # gemm_shapes divides by tp as kern_run.models.qwen3.shard_config does: exactly
        if tp < 1:
            return refuse(f"--tp {tp}: a tensor-parallel degree is >= 1")
        for label, cfg in zip(labels, configs):
            for what, n in (("num_attention_heads", cfg.q_heads), ("num_key_value_heads", cfg.kv_heads),
                            ("intermediate_size", cfg.intermediate)):
                if n % tp:
                    return refuse(f"--tp {tp}: {what} {n} of {label} is not divisible by it")
    if args.m_max < 1:
        return refuse(f"--m-max {args.m_max}: the largest M must be >= 1")
    kept = None
    if args.keep_pins:
        try:  # the builder must accept the file we write: its format, stamp and every pin checked as it will be
            gq.load_algos(args.keep_pins, 1)
            kept = json.loads(args.keep_pins.read_text(encoding="utf-8"))
        except (OSError, gq.ManifestBuildError) as exc:
            return refuse(f"--keep-pins: {exc}")

    from kern_run.errors import RefusalError
    from kern_run.preflight import probe_device

    try:
        probe_device(args.gpu)
    except RefusalError as exc:
        return refuse(str(exc))

    from kern_runtime import KernError
    from kern_runtime.gemm_pins import PinPicker, pins_document, pins_text

    shapes = sorted({s for cfg in configs for tp in (args.tp or [1]) for s in gemm_shapes(cfg, tp)})

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        with PinPicker(args.gpu) as picker:
            name, version = picker.device, picker.cublaslt_version
            if (kept is not None and (args.decode or args.lm_head or args.invariant_decode)
                    and (name, version) != (kept["device"], kept["cublaslt_version"])):
                return refuse(f"--keep-pins {args.keep_pins} was picked on {kept['device']} with cuBLASLt "
                              f"{kept['cublaslt_version']}, this is {name} with cuBLASLt {version}: pins picked "
                              "here would not match its stamp; drop --keep-pins to pick every pin on this device")
            lm_heads = {(cfg.vocab, cfg.hidden) for cfg in configs}
            pins, to_pick = [], set(shapes)
            if kept is not None:
                pins, args.m_max, to_pick = list(kept["pins"]), int(kept["m_max"]), set()  # kept as they are
            for n, k in sorted(to_pick | (lm_heads if args.lm_head else set())):
                if any((p["n"], p["k"]) == (n, k) for p in pins):
                    continue
                log(f"n={n} k={k}")
                pins.append(picker.prefill(n, k, args.m_max, log))  # after the kept ones, in (n, k) order
            decode_pins = [picker.decode(n, k, log) for n, k in sorted(set(shapes) | lm_heads)] if args.decode else []
            invariant_pins = []
            prefill = {(p["n"], p["k"]): p["algo"] for p in pins}  # each shape's fallback candidate, where pinned
            for n, k in sorted(set(shapes) | lm_heads) if args.invariant_decode else []:
                log(f"n={n} k={k} (invariant decode)")
                invariant_pins.append(picker.invariant_decode(n, k, log, prefill.get((n, k))))
    except KernError as exc:  # PinSearchError: no invariant candidate for a shape; the device failing
        return refuse(str(exc))
    stamp = kept if kept is not None else {"device": name, "cublaslt_version": version}  # the kept pins' device
    keep_decode = kept.get("decode_pins") if kept is not None else None  # nothing of the kept file is dropped
    keep_invariant = kept.get("invariant_decode_pins") if kept is not None else None
    if args.invariant_decode:  # the shapes asked picked anew, the kept rows of other shapes kept
        picked = {(p["n"], p["k"]) for p in invariant_pins}
        keep_invariant = sorted([*(p for p in keep_invariant or [] if (p["n"], p["k"]) not in picked), *invariant_pins],
                                key=lambda p: (p["n"], p["k"]))
    doc = pins_document(stamp["device"], stamp["cublaslt_version"], args.m_max, pins,
                        decode_pins if args.decode else keep_decode, keep_invariant)
    text = pins_text(doc)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_files({args.out: text})  # through a temporary file: never a half-written pins file
    else:
        sys.stdout.write(text)
    log(f"{'n':>7} {'k':>6} {'pinned us@512':>13} {'heur us@512':>11} {'pinned us@max':>13} {'heur us@max':>11} heur-inv")
    for p in [p for p in pins if "us_max" in p and (kept is None or p not in kept["pins"])]:
        log(f"{p['n']:>7} {p['k']:>6} {p.get('us_512', 0):>13.1f} {p.get('heuristic_us_512', 0):>11.1f} "
            f"{p['us_max']:>13.1f} {p['heuristic_us_max']:>11.1f} {p['heuristic_invariant']}")
    if decode_pins:
        log(f"{'n':>7} {'k':>6} {'M=1 pinned us':>13} {'M=1 heur us':>11}  (graph-timed)")
        for p in decode_pins:
            log(f"{p['n']:>7} {p['k']:>6} {p['us_1']:>13.2f} {p['heuristic_us_1']:>11.2f}")
    if invariant_pins:
        log(f"{'n':>7} {'k':>6} {'inv us@1':>9} {'inv us@8':>9} {'inv us@64':>9} split_k  (graph-timed)")
        for p in invariant_pins:
            log(f"{p['n']:>7} {p['k']:>6} {p['us_1']:>9.2f} {p['us_8']:>9.2f} {p['us_64']:>9.2f} "
                f"{p['algo'].get('split_k', 1)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
