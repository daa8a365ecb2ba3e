"""Weight-load bandwidth from the page cache: SafetensorsTensors + the runtime's pread loader.

    python3 bench/load.py [--gib 4] [--dir /tmp/kern-load-bench] [--threads 16] [--gpu 0]
                          [--layout mixed|cols] [--staging-mib 8] [--repeat 3]

Creates (once) a sharded bf16 checkpoint of about `--gib` GiB in HF layout (index json + shards),
reads every shard once to warm the page cache, then times `Runtime.load` of a manifest whose weight
buffers bind every tensor. `--layout mixed` (default): half the buffers interleave two tensors in
64-row blocks (like gate_up), half concatenate them. `--layout cols`: every buffer takes the left half
of each tensor's columns (a tensor-parallel rank's row-parallel slice, TP=2: whole rows are read, half
of each is copied with one 2-D copy per staging-sized piece). Prints GB/s (bytes moved into device
buffers / seconds of the weight-load phase) and where the workers' time went. Target: >= 10 GB/s.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
from pathlib import Path

import numpy as np

ROWS, COLS = 4096, 2560  # one tensor: 4096 x 2560 bf16 = 20 MiB (a Qwen3-4B-sized row band)
TENSOR_BYTES = ROWS * COLS * 2
TENSORS_PER_SHARD = 48  # ~0.94 GiB shards


def make_checkpoint(root: Path, gib: float) -> list[str]:
    """Write the checkpoint if missing; return the tensor names. Deterministic content."""
    n_tensors = max(2, int(gib * (1 << 30) // TENSOR_BYTES) // 2 * 2)
    names = [f"layers.{i // 2}.{'gate' if i % 2 == 0 else 'up'}.weight" for i in range(n_tensors)]
    index = root / "model.safetensors.index.json"
    if index.is_file():
        return names
    root.mkdir(parents=True, exist_ok=True)
    shards = [names[i:i + TENSORS_PER_SHARD] for i in range(0, len(names), TENSORS_PER_SHARD)]
    weight_map = {}
    rng = np.random.default_rng(0)
    block = rng.integers(0, 2**16, (ROWS, COLS), dtype=np.uint16).tobytes()
    for s, shard in enumerate(shards):
        file = f"model-{s + 1:05d}-of-{len(shards):05d}.safetensors"
        header = {n: {"dtype": "BF16", "shape": [ROWS, COLS], "data_offsets": [j * TENSOR_BYTES, (j + 1) * TENSOR_BYTES]}
                  for j, n in enumerate(shard)}
        text = json.dumps(header).encode()
        text += b" " * (-(8 + len(text)) % 8)
        with open(root / f"{file}.tmp", "wb") as fh:
            fh.write(struct.pack("<Q", len(text)) + text)
            for _ in shard:
                fh.write(block)
        os.replace(root / f"{file}.tmp", root / file)
        weight_map.update({n: file for n in shard})
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return names


def warm(root: Path) -> int:
    total = 0
    for path in sorted(root.glob("*.safetensors")):
        with open(path, "rb", buffering=0) as fh:
            while chunk := fh.read(64 << 20):
                total += len(chunk)
    return total


def manifest(names: list[str], layout: str = "mixed") -> dict:
    buffers = {}
    for i in range(0, len(names), 2):
        layer = i // 2
        cols = COLS
        if layout == "cols":  # rank 0 of TP=2: the left half of every row
            cols = COLS // 2
            bind = [{"tensor": names[i], "cols": [0, cols]}, {"tensor": names[i + 1], "cols": [0, cols]}]
        elif layer % 2 == 0:  # gate_up as an interleave of 64-row blocks
            bind = [{"interleave": [names[i], names[i + 1]], "rows": 64}]
        else:  # plain concatenation
            bind = [{"tensor": names[i]}, {"tensor": names[i + 1]}]
        buffers[f"w.{layer}"] = {"kind": "weight", "dtype": "bf16", "shape": [2 * ROWS, cols], "bind": bind}
    return {"format": "kern-manifest/1", "name": "load-bench", "vars": {"tokens": {"min": 1, "max": 1}},
            "modules": {}, "buffers": buffers, "ops": {}, "programs": {"noop": {"calls": []}}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/kern-load-bench"))
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layout", choices=("mixed", "cols"), default="mixed")
    parser.add_argument("--staging-mib", type=float, default=None,
                        help="bytes of each of a worker's two pinned staging buffers (default: the loader's)")
    args = parser.parse_args()

    from kern_runtime import STAGING_BYTES, Runtime, SafetensorsTensors

    staging_bytes = int(args.staging_mib * (1 << 20)) if args.staging_mib is not None else STAGING_BYTES
    staging_mib = staging_bytes / (1 << 20)
    names = make_checkpoint(args.dir, args.gib)
    t0 = time.perf_counter()
    warmed = warm(args.dir)
    print(f"page cache warm: {warmed / 1e9:.2f} GB read in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
    tensors = SafetensorsTensors.open(args.dir)
    m = manifest(names, args.layout)
    best = 0.0
    for r in range(args.repeat):
        rt = Runtime.load(m, args.dir, tensors, gpu=args.gpu, threads=args.threads, staging_bytes=staging_bytes)
        nbytes, seconds = rt.weight_load_stats
        timings = rt.weight_load_timings
        rt.close()
        gbps = nbytes / seconds / 1e9
        best = max(best, gbps)
        spent = ", ".join(f"{k} {timings.get(k, 0.0):.2f}" for k in ("staging_alloc", "read", "wait", "issue", "drain",
                                                                     "staging_free"))
        print(f"run {r}: {nbytes / 1e9:.2f} GB in {seconds * 1e3:.0f} ms = {gbps:.1f} GB/s "
              f"({args.layout}, {args.threads} threads, 2 x {staging_mib:g} MiB pinned staging each); "
              f"worker seconds (sum over threads): {spent}")
    print(f"best: {best:.1f} GB/s (target >= 10 GB/s) {'PASS' if best >= 10 else 'BELOW TARGET'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
