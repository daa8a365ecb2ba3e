"""Greedy decoding driven by hand through kern_runtime's public API, with prefix reuse.

    uv run python examples/decode_loop.py --prompt "The capital of France is" --steps 16

The committed tiny model (models/qwen3-tiny-en, manifests/qwen3-tiny-en.json) generates twice:

1. a fresh `lease` for the prompt and the new tokens; `prefill` writes the prompt's K/V (all tokens but the
   last); a `checkpoint` keeps that prefix; `decode` then runs one token at a time;
2. `lease_from(checkpoint)` starts a second sequence on the same prefix pages: no prefill at all, and its
   tokens must equal the first run's.

`retire` ends each lease (keeping its tokens as a checkpoint, closed here). The block table (page ids of
the sequence) and the slot mapping (the KV slot of each position: page_id * page_tokens + offset) are what
the manifest's attention reads; both are written here explicitly. Prints the token ids and the text; `kern
run --prompt P --steps N --ignore-eos` prints the same text. Exit status 0, 1 when the two runs differ or
kern refuses, 2 on a bad argument (one line on stderr).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

import numpy as np
from kern_pool import PoolError
from kern_runtime import Capacity, DeviceLease, KernError, Runtime, SafetensorsTensors

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "qwen3-tiny-en"
MANIFEST = ROOT / "manifests" / "qwen3-tiny-en.json"


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # a bad argument: one line on stderr, exit status 2 (no usage block)
        self.exit(2, f"{self.prog}: {message}\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog=Path(__file__).name, description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", default="The capital of France is", help="text to continue")
    parser.add_argument("--steps", type=int, default=16, help="tokens to generate (1..512)")
    parser.add_argument("--kernels", type=Path, default=None,
                        help="directory of the cubins (default: kern_run.kernels_dir())")
    parser.add_argument("--gpu", type=int, default=0, help="CUDA device ordinal")
    args = parser.parse_args(argv)
    if not 1 <= args.steps <= 512:
        parser.error(f"--steps {args.steps}: expected 1..512")
    return args


def encode(text: str) -> list[int]:
    from tokenizers import (
        Tokenizer,  # the checkpoint's tokenizer.json (tokenizers comes with kern-run)
    )
    return list(Tokenizer.from_file(str(MODEL / "tokenizer.json")).encode(text, add_special_tokens=False).ids)


def decode_text(ids: list[int]) -> str:
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(MODEL / "tokenizer.json")).decode(ids, skip_special_tokens=False)


def slot_mapping(page_ids: np.ndarray, page_tokens: int, start: int, stop: int) -> np.ndarray:
    """i32[stop - start]: the KV slot of each position, page_ids[p // page_tokens] * page_tokens + p % page_tokens."""
    pos = np.arange(start, stop)
    return (page_ids[pos // page_tokens].astype(np.int64) * page_tokens + pos % page_tokens).astype(np.int32)


class Sequence:
    """One sequence of the tiny model: its lease, its block-table row, and the inputs its programs read."""

    def __init__(self, rt: Runtime, lease: DeviceLease) -> None:
        self.rt, self.lease = rt, lease
        width = rt.manifest.buffers["block_table"].shape_at({"seqs": 1})[1]  # i32[seqs, pages_per_seq]
        table = rt.block_table([lease], width=width)  # i32[1, width]: page ids, then the scratch page
        rt.write_input("block_table", table)
        self.pages = table[0]
        self.page_tokens = rt.page_tokens  # 16 for this manifest (states.kv.*.page_tokens)

    def prefill(self, ids: list[int], chunk: int = 512) -> None:
        """K/V of positions 0..len(ids)-1, in chunks of at most `chunk` tokens (the manifest's tokens var: 1..512)."""
        for start in range(0, len(ids), chunk):
            piece = np.asarray(ids[start:start + chunk], np.int32)                    # i32[tokens]
            stop = start + len(piece)
            self.rt.write_input("token_ids", piece)
            self.rt.write_input("positions", np.arange(start, stop, dtype=np.int32))  # i32[tokens]
            self.rt.write_input("slot_mapping", slot_mapping(self.pages, self.page_tokens, start, stop))
            self.rt.write_input("seq_lens", np.asarray([stop], np.int32))            # i32[seqs]: K/V after it
            self.rt.write_input("cu_seqlens_q", np.asarray([0, len(piece)], np.int32))  # i32[seqs + 1]
            self.rt.issue("prefill", {"tokens": len(piece), "seqs": 1})

    def step(self, token: int, position: int) -> int:
        """Run `token` at `position` through `decode`; the greedy next token (argmax on the GPU)."""
        self.rt.write_input("token_ids", np.asarray([token], np.int32))
        self.rt.write_input("positions", np.asarray([position], np.int32))
        self.rt.write_input("slot_mapping", slot_mapping(self.pages, self.page_tokens, position, position + 1))
        self.rt.write_input("seq_lens", np.asarray([position + 1], np.int32))
        self.rt.issue("decode", {"tokens": 1, "seqs": 1})  # a CUDA graph, captured on the first call
        # i64[seqs]; synchronises. Bits 0..31: the token id (the sampler's manifests put the logprob's f32 bits in
        # bits 32..63; an argmax manifest's entry is the id alone)
        return int(self.rt.read_output("next_token", 1)[0]) & 0xFFFFFFFF

    def generate(self, last: int, position: int, steps: int) -> list[int]:
        tokens, token = [], last
        for i in range(steps):
            token = self.step(token, position + i)
            tokens.append(token)
        return tokens


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.kernels is None:
        from kern_run import kernels_dir
        args.kernels = kernels_dir()
    prompt = encode(args.prompt)
    if not prompt:
        print("decode_loop.py: --prompt '': expected text with at least one token", file=sys.stderr)
        return 2
    n, total = len(prompt), len(prompt) + args.steps
    try:
        tensors = SafetensorsTensors.open(str(MODEL))
        with Runtime.load(MANIFEST, args.kernels, tensors, gpu=args.gpu, capacity=Capacity(tokens=4096, seqs=1)) as rt:
            # 1. fresh sequence: prefill, checkpoint the prefix, decode
            first = Sequence(rt, rt.lease(total))
            if n > 1:
                first.prefill(prompt[:-1])
            prefix = rt.checkpoint(first.lease, n - 1)        # positions 0..n-2, shared with `first`
            tokens = first.generate(prompt[-1], n - 1, args.steps)
            kept = rt.retire(first.lease, total - 1)           # the last token's K/V was never written
            kept.close()                                       # (a server would insert it into a kern_pool Prefix)
            # 2. the same prompt again, resumed from the checkpoint: no prefill
            again = Sequence(rt, rt.lease_from(prefix, total))  # shares the prefix's pages; room for `total`
            resumed = again.generate(prompt[-1], n - 1, args.steps)
            rt.retire(again.lease, total - 1).close()
            prefix.close()                                     # its pages return to the pool
    except (KernError, PoolError) as exc:  # a refusal of the runtime, or of its page pool (Busy, ExceedsPool, ...)
        print(f"decode_loop.py: {exc}", file=sys.stderr)
        return 1
    print(f"prompt ids {prompt}")
    print(f"tokens     {tokens}")
    print(f"text       {decode_text(tokens)!r}")
    if resumed != tokens:
        print(f"decode_loop.py: the run resumed from the checkpoint gave {resumed}", file=sys.stderr)
        return 1
    print(f"resumed from the checkpoint ({n - 1} tokens): the same {args.steps} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
