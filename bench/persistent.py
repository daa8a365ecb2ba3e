#!/usr/bin/env python3
"""The persistent decode against today's v2 decode at several Qwen3 shapes in one run (issue 28's bench; on the GPU
machine, docs/persistent.md).

    python3 bench/persistent.py [--shapes qwen3-1.7b,qwen3-4b,qwen3-8b] [--contexts 128,4096] [--steps 48]
        [--variants split,fused] [--weights DIR] [--budget SECONDS] [--json PATH]

Per shape: the seeded checkpoint `--weights/<shape>` (tools/make_checkpoint.py makes the missing ones first, in
parallel), today's decode (`kern manifest build --config <ckpt>/config.json --gemv v2`) and one persistent manifest
per variant (tools/gen_persistent.py with the variant's options, VARIANTS), all built here into a temporary
directory (a 4B persistent manifest is 1.3 MB: built where it runs, not carried), then `bench/decode.py --only kern
--variants v2,<variants>` on that checkpoint: each manifest in its own worker, one after another, medians of
`--steps` graph steps. One table last: ms/token per variant, x floor (weights + KV at 4.3 TB/s), x v2, and issue
28's ctx-128 target. JSON (every shape's bench/decode.py summary and the table rows) to `--json`, else
$OUT/bench-persistent.json when OUT is set.

Exit 0 when every shape produced a v2 and a persistent measurement, 1 otherwise (the notes say why), 2 with one line
on stderr for an unknown shape or variant, or a --contexts / --steps that is not a positive integer list.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.decode import HBM_BYTES_PER_S  # the floor rate: 4.3 TB/s

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ("qwen3-1.7b", "qwen3-4b", "qwen3-8b")
# gen_persistent options of each variant (its defaults: the split attention, the row split where it streams fewer
# steps, a 4-stage ring, the ring's copies evict-first in L2, no table-ahead prefetch)
VARIANTS: dict[str, list[str]] = {
    "split": [],
    "fused": ["--attn", "fused"],
    "split-rowsplit": ["--row-split", "always"],
    "fused-rowsplit": ["--attn", "fused", "--row-split", "always"],
    "split-noevict": ["--no-evict-first"],
    "fused-noevict": ["--attn", "fused", "--no-evict-first"],
    "split-ahead": ["--table-ahead"],
}
GRAPH_PEER = "kern (graph)"  # bench/decode.py's label of the pipelined graph replay
TARGETS_MS = {"qwen3-4b": 2.00, "qwen3-1.7b": 0.88, "qwen3-8b": 3.95}  # issue 28, bs = 1, ctx 128


class BenchArgsError(ValueError):
    """An option the bench refuses before it starts (named in one line)."""


def _int_list(name: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise BenchArgsError(f"{name} {text!r}: a comma list of positive integers") from None
    if not values or min(values) < 1:
        raise BenchArgsError(f"{name} {text!r}: a comma list of positive integers")
    return values


def parse(argv: list[str]) -> argparse.Namespace:
    """The options, checked (BenchArgsError naming the bad one)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--contexts", default="128,4096")
    p.add_argument("--steps", default="48")
    p.add_argument("--variants", default="split,fused", help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--weights", type=Path, default=Path(os.environ.get("KERN_WEIGHTS", "/tmp/kern-weights")))
    p.add_argument("--budget", type=float, default=540.0,
                   help="seconds for everything (checkpoints included): 540 fits a 10-minute device call")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    args.shapes = [s for s in args.shapes.split(",") if s]
    bad = [s for s in args.shapes if s not in SHAPES]
    if bad or not args.shapes:
        raise BenchArgsError(f"--shapes {','.join(bad) or '(none)'}: known shapes are {', '.join(SHAPES)}")
    args.variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad or not args.variants:
        raise BenchArgsError(f"--variants {','.join(bad) or '(none)'}: known variants are {', '.join(VARIANTS)}")
    args.contexts = _int_list("--contexts", args.contexts)
    args.steps = _int_list("--steps", args.steps)[0]
    return args


def _run(cmd: list[str], notes: list[str], what: str, timeout: float) -> bool:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout, 1.0), check=False)
    except subprocess.TimeoutExpired:
        notes.append(f"{what}: still running after {timeout:.0f} s")
        return False
    if done.returncode != 0:
        notes.append(f"{what}: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}")
        return False
    return True


def _graph_row(r: dict[str, Any]) -> bool:
    """bench/decode.py's pipelined graph replay (peer "kern (graph) [<variant>]"), the mode the table compares;
    not its sync loop or eager rows, which the same summary holds per manifest and context."""
    return str(r.get("peer", "")).split(" [")[0] == GRAPH_PEER


def table(summaries: dict[str, dict[str, Any]], variants: list[str], contexts: list[int]) -> tuple[list[dict], str]:
    """(rows, text) from each shape's bench/decode.py summary (results rows carry `variant` = the manifest's stem:
    "v2" or a variant name; `ms_per_token` per `ctx`; only the pipelined graph rows count, `_graph_row`). A row per
    (shape, ctx): the floor (the checkpoint's weights plus ctx tokens of K/V, at 4.3 TB/s), each manifest's
    ms/token, the best persistent variant against v2, and issue 28's target at ctx 128."""
    rows: list[dict[str, Any]] = []
    for shape, summary in summaries.items():
        kv_per_token = summary.get("kv_bytes_per_token", 0)
        for ctx in contexts:
            floor = summary["floor_ms_weights"] + 1e3 * ctx * kv_per_token / HBM_BYTES_PER_S
            ms = {r["variant"]: r["ms_per_token"] for r in summary["results"]
                  if r.get("ctx") == ctx and "ms_per_token" in r and r.get("variant") and _graph_row(r)}
            persistent = {v: ms[v] for v in variants if v in ms}
            best = min(persistent, key=persistent.get) if persistent else None
            rows.append({"shape": shape, "ctx": ctx, "floor_ms": floor, "ms": ms, "best": best,
                         "best_vs_v2": persistent[best] / ms["v2"] if best and "v2" in ms else None,
                         "target_ms": TARGETS_MS.get(shape) if ctx == 128 else None})
    names = ["v2", *variants]
    head = f"{'shape':<11}{'ctx':>6} {'floor':>7} " + " ".join(f"{n:>15}" for n in names) + \
        f" {'best / v2':>10} {'target':>7}"
    title = ("===== persistent decode against v2, bs = 1 (median ms/token, x floor; floor = weights + KV at "
             "4.3 TB/s)")
    lines = ["", title, head, "-" * len(head)]
    for r in rows:
        cells = []
        for n in names:
            v = r["ms"].get(n)
            cells.append(f"{v:>8.3f} ({v / r['floor_ms']:.2f})" if v is not None else f"{'-':>15}")
        ratio = f"{r['best_vs_v2']:>10.3f}" if r["best_vs_v2"] is not None else f"{'-':>10}"
        target = f"{r['target_ms']:>7.2f}" if r["target_ms"] is not None else f"{'':>7}"
        lines.append(f"{r['shape']:<11}{r['ctx']:>6} {r['floor_ms']:>7.3f} " + " ".join(cells) + f" {ratio} {target}")
    return rows, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from kern_run.models.qwen3 import ManifestBuildError
    from kern_run.models.qwen3.jsonio import read_json_file

    from bench.decode_batch import kv_bytes_per_token

    try:
        args = parse(sys.argv[1:] if argv is None else list(argv))
    except BenchArgsError as exc:
        print(f"bench/persistent.py: {exc}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    notes: list[str] = []
    py = sys.executable
    makers = {}
    for shape in args.shapes:  # the missing checkpoints, in parallel (make_checkpoint skips a matching one)
        ckpt = args.weights / shape
        if not (ckpt / "config.json").is_file():
            makers[shape] = subprocess.Popen([py, str(ROOT / "tools" / "make_checkpoint.py"), "--shape", shape,
                                              "--out", str(ckpt)], stdout=subprocess.DEVNULL,
                                             stderr=subprocess.PIPE, text=True)
    for shape, proc in makers.items():
        _, err = proc.communicate()
        if proc.returncode != 0:
            notes.append(f"{shape}: make_checkpoint exit {proc.returncode}: {err.strip()[-300:]}")
    summaries: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="kern-bench-persistent-") as tmp_dir:
        tmp = Path(tmp_dir)
        for shape in args.shapes:
            ckpt = args.weights / shape
            if not (ckpt / "config.json").is_file():
                continue
            remaining = args.budget - (time.perf_counter() - start)
            if remaining < 30:
                notes.append(f"{shape}: skipped, the {args.budget:.0f} s budget is spent")
                continue
            d = tmp / shape
            d.mkdir()
            config = ckpt / "config.json"
            try:  # refused in one note (a FIFO, a directory, past 64 MiB, not JSON), as the builders refuse it
                kv_per_token = kv_bytes_per_token(read_json_file(config)[0])
            except (ManifestBuildError, KeyError, TypeError, AttributeError) as exc:
                notes.append(f"{shape}: {config}: {exc}")
                continue
            manifests = [d / "v2.json"]
            if not _run([py, str(ROOT / "tools" / "gen_qwen3.py"), "--config", str(config), "--gemv", "v2",
                         "--out", str(manifests[0])], notes, f"{shape} v2 manifest", 120):
                continue
            for v in args.variants:
                out = d / f"{v}.json"
                if _run([py, str(ROOT / "tools" / "gen_persistent.py"), "--config", str(config), "--out", str(out),
                         *VARIANTS[v]], notes, f"{shape} {v} manifest", 120):
                    manifests.append(out)
            bench_json = d / "bench.json"
            remaining = args.budget - (time.perf_counter() - start)
            _run([py, str(ROOT / "bench" / "decode.py"), "--only", "kern", "--ckpt", str(ckpt),
                  "--contexts", ",".join(map(str, args.contexts)), "--steps", str(args.steps),
                  "--budget", str(max(remaining - 10, 20)), "--variants", ",".join(map(str, manifests)),
                  "--json", str(bench_json)], notes, f"{shape} bench/decode.py", remaining)
            if bench_json.is_file():
                summary = json.loads(bench_json.read_text())  # bench/decode.py's, written in our temp directory
                summary["kv_bytes_per_token"] = kv_per_token
                summaries[shape] = summary
                notes += [f"{shape}: {n}" for n in summary.get("notes", [])]
    rows, text = table(summaries, args.variants, args.contexts)
    out = {"shapes": args.shapes, "variants": {v: VARIANTS[v] for v in args.variants}, "contexts": args.contexts,
           "rows": rows, "summaries": summaries, "notes": notes, "seconds": time.perf_counter() - start}
    path = args.json or (Path(os.environ["OUT"]) / "bench-persistent.json" if os.environ.get("OUT") else None)
    if path is not None:
        path.write_text(json.dumps(out, indent=1))
    print(text + "".join(f"\nnote: {n}" for n in notes))
    ok = all(any(r["ms"].get("v2") and r["best"] for r in rows if r["shape"] == s) for s in args.shapes)
    if not ok:
        print("bench/persistent.py: a shape has no v2 or no persistent measurement (see the notes)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
