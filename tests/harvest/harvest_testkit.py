"""A synthetic capture for the harvest's CPU tests: a made-up four-kernel step over real kern cubins.

The cubins are kernels/embed, norm and argmax (their layouts are the real ones: cuFuncGetParamInfo's, as
kernels/kernels.json records them), so the miner's cubin check runs against real ELF files. The step at T tokens
(hidden 64, vocab 256), in event order:

    alloc #0 (T*128 B)   launch 0 kern_embed_gather(embed, token_ids, #0, T, 64, 256)           grid [T, 1, 1]
                         launch 1 kern_add_rmsnorm(#0, kv.0 + 256, norm, logits, T, 64, eps)   grid [T, 1, 1]
    free #0
    alloc #1, #2 (T*16)  launch 2 kern_argmax_partial(logits + (T-1)*128, 64, 16, #1, #2, 4)  grid [4, T, 1]
                         launch 3 kern_argmax_final(#1, #2, 4, next_token)                       grid [T, 1, 1]
    alloc #3 (T*64 B)    launch 4 kern_embed_gather(embed + 128, positions, #3, T, 32, 256)    grid [T, 1, 1]
    free #1 .. #3

so every pointer class (weight with an offset, state, input, output, workspace), a pointer offset and scalars
fitted in T, a kernel called twice with different literals, and allocations whose lifetimes allow sharing. Its
inputs and outputs are the harvested Qwen3 step's (token_ids, positions -> next_token, logits), so
kern_run.harvest.replay drives its manifest too.
"""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path

from kern_run.harvest.capture_format import Alloc, Api, Capture, Free, Launch, Run, Tensor, pack_params

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"
HIDDEN, VOCAB, EPS_BITS = 64, 256, struct.unpack("<I", struct.pack("<f", 1e-6))[0]
WEIGHTS = 0x7F00_0000_0000
STATE = 0x7F00_1000_0000
INPUTS = 0x7F00_2000_0000
OUTPUTS = 0x7F00_3000_0000
ALLOCS = 0x7F00_4000_0000


def kernel(module: str, entry: str) -> tuple[str, bytes, tuple[tuple[int, int], ...]]:
    """(sha256, cubin bytes, param layout) of a committed kern kernel."""
    index = json.loads((KERNELS / "kernels.json").read_text())["modules"][module]
    layout = tuple(tuple(p) for p in index["entries"][entry]["params"])
    return index["sha256"], (KERNELS / index["file"]).read_bytes(), layout  # type: ignore[return-value]


EMBED = kernel("embed", "kern_embed_gather")
NORM = kernel("norm", "kern_add_rmsnorm")
PARTIAL = kernel("argmax", "kern_argmax_partial")
FINAL = kernel("argmax", "kern_argmax_final")
CUBINS = {k[0]: k[1] for k in (EMBED, NORM, PARTIAL)}


def u64(v: int) -> bytes:
    return v.to_bytes(8, "little")


def i32(v: int) -> bytes:
    return v.to_bytes(4, "little", signed=True)


def launch(k: tuple, entry: str, grid: tuple[int, int, int], values: list[bytes]) -> Launch:
    sha, _, layout = k
    return Launch(entry, sha, grid, (256, 1, 1), 0, layout, pack_params(layout, values))


def tensors(run: int, tokens: int) -> tuple[Tensor, ...]:
    return (Tensor("model.embed_tokens.weight", "weight", WEIGHTS, VOCAB * HIDDEN * 2, "bf16", (VOCAB, HIDDEN)),
            Tensor("model.norm.weight", "weight", WEIGHTS + 0x100000, HIDDEN * 2, "bf16", (HIDDEN,)),
            Tensor("kv.0", "state", STATE, 16 * HIDDEN * 2, "bf16", (16, HIDDEN)),
            Tensor("token_ids", "input", INPUTS + run * 0x100000, tokens * 8, "i64", (tokens,)),
            Tensor("positions", "input", INPUTS + run * 0x100000 + 0x1000, tokens * 8, "i64", (tokens,)),
            Tensor("next_token", "output", OUTPUTS + run * 0x100000, tokens * 8, "i64", (tokens,)),
            Tensor("logits", "output", OUTPUTS + run * 0x100000 + 0x1000, tokens * HIDDEN * 2, "bf16", (tokens, HIDDEN)))


def alloc_address(run: int, k: int) -> int:
    return ALLOCS + run * 0x1000000 + k * 0x10000


def step(run: int, tokens: int) -> Run:
    """The synthetic step (module docstring) as run `run` at `tokens` tokens."""
    a = [alloc_address(run, k) for k in range(4)]
    ids, out = INPUTS + run * 0x100000, OUTPUTS + run * 0x100000
    positions, logits = ids + 0x1000, out + 0x1000
    t = tokens
    events = [
        Alloc(a[0], t * 128),
        launch(EMBED, "kern_embed_gather", (t, 1, 1), [u64(WEIGHTS), u64(ids), u64(a[0]), i32(t), i32(64), i32(256)]),
        launch(NORM, "kern_add_rmsnorm", (t, 1, 1), [u64(a[0]), u64(STATE + 256), u64(WEIGHTS + 0x100000), u64(logits),
                                                     i32(t), i32(64), EPS_BITS.to_bytes(4, "little")]),
        Free(a[0]),
        Alloc(a[1], t * 16), Alloc(a[2], t * 16),
        launch(PARTIAL, "kern_argmax_partial", (4, t, 1), [u64(logits + (t - 1) * 128), i32(64), i32(16), u64(a[1]),
                                                           u64(a[2]), i32(4)]),
        launch(FINAL, "kern_argmax_final", (t, 1, 1), [u64(a[1]), u64(a[2]), i32(4), u64(out)]),
        Alloc(a[3], t * 64),
        launch(EMBED, "kern_embed_gather", (t, 1, 1), [u64(WEIGHTS + 128), u64(positions), u64(a[3]), i32(t), i32(32),
                                                       i32(256)]),
        Free(a[1]), Free(a[2]), Free(a[3]),
    ]
    return Run(tokens, tuple(events), tensors(run, tokens))


def synthetic_capture(tokens: tuple[int, ...] = (1, 2)) -> Capture:
    return Capture(runs=tuple(step(r, t) for r, t in enumerate(tokens)), cubins=dict(CUBINS),
                   source={"model": "synthetic", "context": 64, "note": "tests/harvest/harvest_testkit.py"})


def with_event(capture: Capture, run: int, index: int, event: object) -> Capture:
    """`capture` with event `index` of run `run` replaced by `event` (None: removed)."""
    events = list(capture.runs[run].events)
    if event is None:
        del events[index]
    else:
        events[index] = event
    runs = list(capture.runs)
    runs[run] = replace(runs[run], events=tuple(events))
    return replace(capture, runs=tuple(runs))


def launch_event_index(capture: Capture, run: int, launch: int) -> int:
    """The index in run `run`'s events of its launch number `launch`."""
    return [i for i, e in enumerate(capture.runs[run].events) if isinstance(e, Launch)][launch]


def with_param(capture: Capture, run: int, launch: int, param: int, value: bytes) -> Capture:
    """`capture` with parameter `param` of launch `launch` in run `run` set to `value`."""
    at = launch_event_index(capture, run, launch)
    e = capture.runs[run].events[at]
    values = [e.param(j) for j in range(len(e.params))]
    values[param] = value
    return with_event(capture, run, at, replace(e, data=pack_params(e.params, values)))


__all__ = ["Api", "synthetic_capture", "with_event", "with_param", "launch_event_index", "step", "alloc_address"]
