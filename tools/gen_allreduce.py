#!/usr/bin/env python3
"""Generate the all-reduce manifest (kernels-src/allreduce.cu against NCCL): one manifest for every rank of group
`tp`, for tests/multigpu/test_allreduce_gpu.py and bench/allreduce.py.

    vars       n: elements of a message, 8 .. --max-elements (the one-shot kernel takes multiples of 8)
    topology   tp: {size: N}
    buffers    x bf16[max] input, out bf16[max] output, residual bf16[max] input (read back with read_buffer),
               ar / ar_peers / ar_status as in the Qwen3 TP manifests (kern_run.models.qwen3.allreduce)
    programs   sum, add, nccl            one call of n elements (eager): out = sum of x; residual += sum of x;
                                         out = NCCL's all-reduce of x
               sum_g, add_g, nccl_g      `--burst` calls captured as one CUDA graph
    with --gather-vocab V (the vocabulary-parallel lm_head's all-gather, kern_allgather_bf16):
    vars       rows: 1 .. --gather-rows
    buffers    gx bf16[rows_max * slice] input (this rank's logits slice), gout bf16[rows_max * V] output,
               ag / ag_peers (kern_run.models.qwen3.allreduce.add_allgather_op; slice = cdiv(V, size) to 8)
    programs   gather (eager), gather_g (`--burst` calls as one graph): gout [rows, V] from every rank's gx

Usage: python tools/gen_allreduce.py --size 2 --out /tmp/allreduce-2.json [--max-elements 33554432] [--burst 20]
       [--blocks 8] [--timeout-ms 1000] [--gather-vocab 151936 --gather-rows 4]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kern_run.errors import ManifestBuildError
from kern_run.models.qwen3.abi import KernelAbi, read_kernel_abi
from kern_run.models.qwen3.allreduce import (ADD_ENTRY, PEERS, STATUS, SUM_ENTRY, OneShot, add_allgather_op,
                                             add_buffers, allgather_call, oneshot_launch, vocab_split)
from kern_run.models.qwen3.builder import Builder, int_arg, ptr
from kern_run.models.qwen3.jsonio import manifest_digest

REPO = Path(__file__).resolve().parent.parent
GROUP = "tp"


def build_manifest(size: int, abi: KernelAbi, max_elements: int = 32 * 2**20, burst: int = 20, blocks: int = 8,
                   timeout_ns: int = 1_000_000_000, gather_vocab: int = 0, gather_rows: int = 4) -> dict[str, Any]:
    """The manifest object (with digest); with `gather_vocab` also the all-gather's programs. Raises
    ManifestBuildError for a size outside 2..32, a max_elements not a positive multiple of 8, a vocabulary
    vocab_split refuses, gather_rows < 1, or a kernels.json without the entries."""
    if not 2 <= size <= 32:
        raise ManifestBuildError(f"group size {size} must lie in [2, 32]")
    if max_elements < 8 or max_elements % 8:
        raise ManifestBuildError(f"--max-elements {max_elements}: a positive multiple of 8")
    b = Builder(abi)
    plan = OneShot(GROUP, size, max_elements, blocks, timeout_ns)
    add_buffers(b, plan)
    for name, kind in (("x", "input"), ("out", "output"), ("residual", "input")):
        b.buffer(name, kind, "bf16", [max_elements])
    tail = [int_arg("count"), ptr("peers"), ptr("status")]
    b.op("sum", [ptr("x"), ptr("out"), *tail], [oneshot_launch(b, plan, SUM_ENTRY, "out", False)])
    b.op("add", [ptr("x"), ptr("residual"), *tail], [oneshot_launch(b, plan, ADD_ENTRY, "residual", False)])
    b.op("nccl", [ptr("x"), ptr("out"), int_arg("count")], [{
        "extern": "nccl_allreduce_bf16",
        "args": [{"arg": "x"}, {"arg": "out"}, {"arg": "count", "type": "i64"}, {"rank": GROUP}]}])
    one = {"count": "n", "peers": PEERS, "status": STATUS}
    calls = {"sum": {"op": "sum", "args": {"x": "x", "out": "out", **one}},
             "add": {"op": "add", "args": {"x": "x", "residual": "residual", **one}},
             "nccl": {"op": "nccl", "args": {"x": "x", "out": "out", "count": "n"}}}
    vars_ = {"n": {"min": 8, "max": max_elements}}
    meta: dict[str, Any] = {}
    if gather_vocab:
        if gather_rows < 1:
            raise ManifestBuildError(f"--gather-rows {gather_rows}: at least 1")
        split = vocab_split(gather_vocab, size)
        plan = add_allgather_op(b, GROUP, split, gather_rows, max(1, timeout_ns // 1_000_000), False)
        b.buffer("gx", "input", "bf16", [gather_rows * split.slice])
        b.buffer("gout", "output", "bf16", [gather_rows * gather_vocab])
        calls["gather"] = allgather_call("gx", "gout", "rows")
        vars_["rows"] = {"min": 1, "max": gather_rows}
        meta = {"vocab": gather_vocab, "slice": split.slice, "rows": gather_rows, "capacity": plan.capacity,
                "blocks": plan.blocks}
    programs: dict[str, Any] = {}
    for name, c in calls.items():
        programs[name] = {"calls": [c]}
        programs[f"{name}_g"] = {"graph": True, "calls": [c] * burst}
    manifest: dict[str, Any] = {
        "format": "kern-manifest/1", "name": f"allreduce-{size}",
        "meta": {"generator": "tools/gen_allreduce.py", "burst": burst,
                 "tp": {"group": GROUP, "size": size, "allreduce": {"status": STATUS, "blocks": blocks,
                                                                      "capacity": max_elements,
                                                                      "timeout_ns": timeout_ns},
                        **({"lm_head": {"split": "vocab", "status": STATUS, **meta}} if meta else {})}},
        "vars": vars_,
        "modules": {m: abi.modules[m] for m in sorted(b.used_modules)},
        "topology": {GROUP: {"size": size}},
        "buffers": b.buffers, "ops": b.ops, "programs": programs,
    }
    manifest["digest"] = manifest_digest(manifest)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2)
    parser.add_argument("--kernels", type=Path, default=REPO / "kernels")
    parser.add_argument("--max-elements", type=int, default=32 * 2**20, help="bf16 elements of the largest message")
    parser.add_argument("--burst", type=int, default=20)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--timeout-ms", type=int, default=1000)
    parser.add_argument("--gather-vocab", type=int, default=0, help="also the all-gather of a vocabulary this wide")
    parser.add_argument("--gather-rows", type=int, default=4, help="rows of the largest all-gather")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        manifest = build_manifest(args.size, read_kernel_abi(args.kernels), args.max_elements, args.burst,
                                  args.blocks, args.timeout_ms * 1_000_000, args.gather_vocab, args.gather_rows)
    except ManifestBuildError as exc:
        print(f"gen_allreduce: {exc}", file=sys.stderr)
        return 1
    args.out.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"gen_allreduce: wrote {args.out} (group of {args.size}, up to {args.max_elements} elements)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
