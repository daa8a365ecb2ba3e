"""Running a harvested manifest: the caller side of `kern harvest generate`'s output (GPU tests, bench/decode.py).

The harvested step's contract is the captured step's: inputs `token_ids` and `positions` (i64 `[tokens]`),
outputs `next_token` (i64 `[tokens]`) and `logits` (bf16 `[tokens, vocab]`), the KV cache in fixed states that
start zeroed. `HarvestedStep.step(ids, positions)` writes the inputs, issues the `decode` program (one CUDA graph
per token count) and reads the outputs back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .generate import PROGRAM
from .greedy import feed_greedy


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 raw bits (uint16, as kern_runtime reads them) as float32 values (the top half of a float32)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


class HarvestedStep:
    """A harvested manifest loaded with kern_runtime: `Runtime.load(out/manifest.json, out/kernels, checkpoint)`.
    `out_dir`: what `kern harvest generate` wrote; `checkpoint`: the model's checkpoint directory (or files).
    Raises what `Runtime.load` raises (KernelArtifactError for a cubin that does not match, WeightArtifactError
    for a checkpoint that does not fit the binds, ...)."""

    def __init__(self, out_dir: str | Path, checkpoint: Any, gpu: int = 0) -> None:
        from kern_runtime import Runtime, SafetensorsTensors

        out = Path(out_dir)
        self.rt = Runtime.load(out / "manifest.json", out / "kernels", SafetensorsTensors.open(checkpoint), gpu=gpu)
        self.outputs = [n for n, b in self.rt.manifest.buffers.items() if b.kind == "output"]

    def step(self, token_ids: np.ndarray, positions: np.ndarray, eager: bool = False,
             read: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
        """One step over `len(token_ids)` tokens (i64 arrays of equal length); returns the outputs named in `read`
        (default: every output; bf16 as raw uint16 bits). Raises ApiError for a token count outside the manifest's
        var range or an output `read` names that the manifest lacks."""
        ids = np.ascontiguousarray(token_ids, dtype=np.int64)
        pos = np.ascontiguousarray(positions, dtype=np.int64)
        self.rt.write_input("token_ids", ids)
        self.rt.write_input("positions", pos)
        self.rt.issue(PROGRAM, {"tokens": len(ids)}, eager=eager)
        return {name: self.rt.read_output(name, len(ids)) for name in (self.outputs if read is None else read)}

    def greedy(self, prompt: list[int], steps: int, eager: bool = False) -> tuple[list[int], np.ndarray]:
        """Feed `prompt` one token a step (positions 0..), then `steps` greedy tokens (greedy.feed_greedy). Returns
        (those tokens, the logits of every step as float32 `[len(prompt) + steps - 1, vocab]`), as
        torch_step.reference_greedy does."""
        def run(token: int, position: int) -> tuple[int, np.ndarray]:
            result = self.step(np.array([token]), np.array([position]), eager)
            return int(result["next_token"][0]), bf16_to_f32(result["logits"])

        tokens, rows = feed_greedy(prompt, steps, run)
        return tokens, np.concatenate(rows)

    def close(self) -> None:
        self.rt.close()

    def __enter__(self) -> "HarvestedStep":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
