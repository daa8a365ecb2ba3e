"""A manifest of two kern kernels, built in Python: gather embedding rows, then take each row's argmax.

    uv run python examples/custom_manifest.py            # the installed cubins (kern_run.kernels_dir())
    uv run python examples/custom_manifest.py --kernels kernels --tokens 5

For token ids `ids` (i32[tokens]) and a weight `table` (bf16[vocab, hidden]) the program `pick` computes
`next_token[t] = argmax(table[ids[t], :])` (i64[tokens]) on the GPU, and the script checks it against numpy.
Exit status 0 when they agree, 1 when they do not, 2 on a bad argument (one line on stderr).

The wiring follows the kernel ABI in kernels/kernels.json (`modules.<name>.entries.<entry>.params`: one
[offset, size] pair per C parameter) and the C signatures in kernels-src/embed.cu and argmax.cu.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NoReturn

import numpy as np
from kern_manifest import ManifestError, parse_manifest, verify
from kern_runtime import Capacity, HostTensors, KernError, Runtime

VOCAB, HIDDEN = 64, 256  # small, so the weight's bf16 values can be exact distinct integers
CHUNKS = 4  # argmax splits each row into CHUNKS chunks of HIDDEN // CHUNKS elements
MAX_TOKENS = 64


def build_manifest(kernels: dict) -> dict:
    """The manifest as a plain dict (docs/manifest.md); `kernels` is kernels/kernels.json, read for the pins."""
    sha = {name: kernels["modules"][name]["sha256"] for name in ("embed", "argmax")}
    abi = {entry: module["entries"][entry]["params"]
           for module in (kernels["modules"]["embed"], kernels["modules"]["argmax"]) for entry in module["entries"]}
    return {
        "format": "kern-manifest/1",
        "name": "embed-argmax",
        "vars": {"tokens": {"min": 1, "max": MAX_TOKENS}},  # given at run time: run("pick", {"tokens": n})
        "modules": sha,  # the runtime loads <name>-<sha12>.cubin and checks its sha256
        "buffers": {
            "table": {"kind": "weight", "dtype": "bf16", "shape": [VOCAB, HIDDEN],
                      "bind": [{"tensor": "table"}]},  # filled from the Tensors passed to Runtime.load
            "token_ids": {"kind": "input", "dtype": "i32", "shape": ["tokens"]},  # write_input
            "rows": {"kind": "workspace", "dtype": "bf16", "shape": ["tokens", HIDDEN]},  # device only
            "next_token": {"kind": "output", "dtype": "i64", "shape": ["tokens"]},  # read_output
        },
        "ops": {
            "embed": {
                "args": [{"name": "table", "kind": "ptr"}, {"name": "ids", "kind": "ptr"},
                         {"name": "out", "kind": "ptr"}],
                "launches": [{
                    "module": "embed", "entry": "kern_embed_gather",
                    "params": abi["kern_embed_gather"],  # [[0,8],[8,8],[16,8],[24,4],[28,4],[32,4]]
                    "grid": ["tokens", 1, 1], "block": [256, 1, 1],  # one block per token (embed.cu)
                    "args": [
                        {"arg": "table"},                     # const bf16* table   [vocab, hidden]
                        {"arg": "ids"},                       # const i32*  token_ids [n_tokens]
                        {"arg": "out"},                       # bf16*       out     [n_tokens, hidden]
                        {"expr": "tokens", "type": "i32"},    # i32 n_tokens
                        {"i32": HIDDEN},                      # i32 hidden
                        {"i32": VOCAB},                       # i32 vocab (ids outside [0, vocab) give zeros)
                    ],
                }],
            },
            "argmax": {
                "args": [{"name": "logits", "kind": "ptr"}, {"name": "out", "kind": "ptr"}],
                # per-call device scratch, in bytes: CHUNKS partial (value, index) pairs per row
                "scratch": {"part_val": f"tokens * {4 * CHUNKS}", "part_idx": f"tokens * {4 * CHUNKS}"},
                "launches": [
                    {"module": "argmax", "entry": "kern_argmax_partial",
                     "params": abi["kern_argmax_partial"],  # [[0,8],[8,4],[12,4],[16,8],[24,8],[32,4]]
                     "grid": [CHUNKS, "tokens", 1], "block": [256, 1, 1],  # (num_chunks, rows)
                     "args": [
                         {"arg": "logits"},            # const bf16* logits [rows, n]
                         {"i32": HIDDEN},              # i32 n
                         {"i32": HIDDEN // CHUNKS},    # i32 chunk
                         {"scratch": "part_val"},      # f32* part_val [rows, num_chunks]
                         {"scratch": "part_idx"},      # i32* part_idx [rows, num_chunks]
                         {"i32": CHUNKS},              # i32 num_chunks
                     ]},
                    {"module": "argmax", "entry": "kern_argmax_final",
                     "params": abi["kern_argmax_final"],  # [[0,8],[8,8],[16,4],[24,8]]
                     "grid": ["tokens", 1, 1], "block": [256, 1, 1],  # one block per row
                     "args": [
                         {"scratch": "part_val"},      # const f32* part_val
                         {"scratch": "part_idx"},      # const i32* part_idx
                         {"i32": CHUNKS},              # i32 num_chunks
                         {"arg": "out"},               # i64* out [rows]
                     ]},
                ],
            },
        },
        "programs": {  # a program is an ordered call table: each call binds an op's args to buffers
            "pick": {"kind": "run", "calls": [
                {"op": "embed", "args": {"table": "table", "ids": "token_ids", "out": "rows"}},
                {"op": "argmax", "args": {"logits": "rows", "out": "next_token"}},
            ]},
        },
    }


def make_table(seed: int) -> np.ndarray:
    """f32[VOCAB, HIDDEN]: each row a permutation of -128..127, exact in bf16, so every argmax is unique."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(HIDDEN) - HIDDEN // 2 for _ in range(VOCAB)]).astype(np.float32)


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """uint16 bits of f32 values that bf16 holds exactly (HostTensors takes bf16 as uint16 bits)."""
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # a bad argument: one line on stderr, exit status 2 (no usage block)
        self.exit(2, f"{self.prog}: {message}\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog=Path(__file__).name, description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", type=Path, default=None,
                        help="directory of kernels.json and the cubins (default: kern_run.kernels_dir())")
    parser.add_argument("--tokens", type=int, default=8, help=f"how many token ids to look up (1..{MAX_TOKENS})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weight and the ids")
    parser.add_argument("--gpu", type=int, default=0, help="CUDA device ordinal")
    args = parser.parse_args(argv)
    if not 1 <= args.tokens <= MAX_TOKENS:
        parser.error(f"--tokens {args.tokens}: expected 1..{MAX_TOKENS}")
    return args


def kernels_path(given: Path | None) -> Path:
    if given is not None:
        return given
    from kern_run import (
        kernels_dir,  # kern-run finds the cubins it ships (or the checkout's kernels/)
    )
    return kernels_dir()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    kernels = kernels_path(args.kernels)
    try:
        abi = json.loads((kernels / "kernels.json").read_text())
    except (OSError, ValueError) as exc:
        print(f"custom_manifest.py: --kernels {kernels}: cannot read kernels.json ({exc})", file=sys.stderr)
        return 2
    raw = build_manifest(abi)
    try:
        spec = parse_manifest(raw)  # the same checks `kern-manifest check` makes
        verify(spec)
    except ManifestError as exc:
        print(f"custom_manifest.py: the manifest is refused: {exc}", file=sys.stderr)
        return 1

    table = make_table(args.seed)
    ids = np.random.default_rng(args.seed + 1).integers(0, VOCAB, args.tokens).astype(np.int32)
    weights = HostTensors({"table": ("bf16", bf16_bits(table))})
    try:
        with Runtime.load(spec, kernels, weights, gpu=args.gpu, capacity=Capacity(tokens=MAX_TOKENS, seqs=1)) as rt:
            rt.write_input("token_ids", ids)               # i32[tokens]
            rt.run("pick", {"tokens": args.tokens})         # every var the program reads
            got = rt.read_output("next_token", rows=args.tokens)  # i64[tokens]; synchronises
    except KernError as exc:
        print(f"custom_manifest.py: {exc}", file=sys.stderr)
        return 1
    want = table[ids].argmax(axis=1)
    print(f"ids        {ids.tolist()}")
    print(f"next_token {got.tolist()}")
    if not np.array_equal(got, want):
        print(f"custom_manifest.py: numpy says {want.tolist()}", file=sys.stderr)
        return 1
    print("matches numpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
