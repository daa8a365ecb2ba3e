"""Where a manifest's decode program takes its sampling inputs and leaves its samples: `meta.caller.sampling`.

A manifest built with the GPU sampler (`kern manifest build --sampler gpu`, docs/caller.md "Sampling") declares

    "sampling": {"sampler": "gpu", "params": "sample_params", "hist_tokens": "hist_tokens",
                 "hist_counts": "hist_counts", "hist_cap": 1024, "packing": "packed", "init": "greedy",
                 "top_logprobs": {"program": "top_logprobs", "n_top": 20, "ids": "top_ids",
                                  "logprobs": "top_logprobs"}}

`params`: input `[seqs, 48 / itemsize]` (u32 [seqs, 12]), `kern_run.sampling.pack_params` rows. `hist_tokens` /
`hist_counts`: inputs i32 `[seqs, hist_cap]`, a row's distinct previous token ids and their counts, to which the
graph appends each step's token. `packing` "packed": `next_token` i64 `[seqs]` holds the token id in bits 0..31
and the f32 logprob's bits in 32..63. `init` "greedy": the load program sets every row greedy. `top_logprobs`
(optional): a program run eagerly after a decode step, writing the `n_top` most probable ids and their logprobs
(-inf outside the kept set, id -1 past the vocabulary). A manifest without the key (`--sampler argmax`)
decodes by argmax, with plain ids in `next_token`, and serves greedy only.

`read_sampling_io` is the one place that reads the block.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from kern_manifest import Manifest, var_max

from .errors import ConfigError
from .preflight import caller_meta
from .sampling import PARAM_ROW_BYTES

PARAM_DTYPES = {"u8": "<u1", "i8": "<i1", "u32": "<u4", "i32": "<i4", "f32": "<f4"}  # the params row as 48 bytes


@dataclass(frozen=True)
class SamplingIO:
    """The decode program's sampling buffers (module docstring). `params_dtype`: the numpy dtype (a `PARAM_DTYPES`
    value) a params row is written as; `hist_cap`: history slots per row; `top_n`: top logprobs the top program
    gives per row (0: no top program)."""

    params: str
    params_dtype: str
    hist_tokens: str
    hist_counts: str
    hist_cap: int
    next_token: str
    top_program: str | None
    top_ids: str | None
    top_logprobs: str | None
    top_n: int


def _shown(value: Any) -> str:
    """A (frozen) JSON value as its JSON text, cut at 60 characters."""
    text = json.dumps(value, default=dict)
    return text if len(text) <= 60 else text[:57] + "..."


def _name(block: Mapping[str, Any], key: str, default: str, path: Path, prefix: str = "") -> str:
    value = block.get(key, default)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"manifest {path}: $.meta.caller.sampling.{prefix}{key} = {_shown(value)} must name a "
                          "buffer or program; regenerate it (kern manifest build)")
    return value


def read_sampling_io(manifest: Manifest, path: Path | str = "<manifest>") -> SamplingIO | None:
    """The sampling buffers of `manifest`'s decode program, or None when `meta.caller.sampling` is absent (argmax
    decode, greedy only). Raises kern_run ConfigError naming the manifest and the key when the block is not an
    object, declares another sampler, packing or init, names a buffer or program the manifest lacks, or a buffer
    has the wrong dtype or shape."""
    path = Path(path)
    caller = caller_meta(manifest, path)
    if "sampling" not in caller:
        return None
    block = caller["sampling"]
    if not isinstance(block, Mapping):
        raise ConfigError(f"manifest {path}: $.meta.caller.sampling = {_shown(block)} must be an object naming the "
                          "sampler's buffers; regenerate it (kern manifest build)")
    for key, want in (("sampler", "gpu"), ("packing", "packed"), ("init", "greedy")):
        if block.get(key, want) != want:
            raise ConfigError(f"manifest {path}: $.meta.caller.sampling.{key} = {_shown(block[key])}: kern-run "
                              f"reads {want!r} only; regenerate it (kern manifest build)")
    at_max = var_max(manifest.vars)
    seqs = at_max.get("seqs", 1)

    def buffer(where: Mapping[str, Any], key: str, default: str, dtypes: tuple[str, ...], rank: int,
               prefix: str = "") -> tuple[str, tuple[int, ...]]:
        name = _name(where, key, default, path, prefix)
        buf = manifest.buffers.get(name)
        if buf is None:
            raise ConfigError(f"manifest {path}: $.meta.caller.sampling.{prefix}{key} names buffer {name!r}, which the "
                              "manifest lacks; regenerate it (kern manifest build)")
        shape = tuple(buf.shape_at(at_max))
        if buf.dtype not in dtypes or len(shape) != rank or shape[0] != seqs:
            raise ConfigError(f"manifest {path}: buffer {name!r} ($.meta.caller.sampling.{prefix}{key}) is {buf.dtype} "
                              f"{list(shape)}, expected {' or '.join(dtypes)} of rank {rank} with {seqs} rows "
                              "(the seqs var max); regenerate it (kern manifest build)")
        return name, shape

    params, pshape = buffer(block, "params", "sample_params", tuple(PARAM_DTYPES), 2)
    pdtype = manifest.buffers[params].dtype
    if pshape[1] * int(PARAM_DTYPES[pdtype][-1]) != PARAM_ROW_BYTES:
        raise ConfigError(f"manifest {path}: buffer {params!r} rows are {pshape[1]} x {pdtype}, expected "
                          f"{PARAM_ROW_BYTES} bytes (kern_run.sampling.pack_params); regenerate it")
    hist_tokens, hshape = buffer(block, "hist_tokens", "hist_tokens", ("i32",), 2)
    hist_counts, cshape = buffer(block, "hist_counts", "hist_counts", ("i32",), 2)
    cap = block.get("hist_cap", hshape[1])
    if isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= hshape[1] or cshape != hshape:
        raise ConfigError(f"manifest {path}: $.meta.caller.sampling.hist_cap = {_shown(cap)} with history buffers "
                          f"{list(hshape)} / {list(cshape)}: expected 1..{hshape[1]} and equal shapes; regenerate it")
    next_token, _ = buffer({}, "next_token", "next_token", ("i64", "u64"), 1)
    top = block.get("top_logprobs")
    if top is None:
        return SamplingIO(params, PARAM_DTYPES[pdtype], hist_tokens, hist_counts, cap, next_token, None, None, None, 0)
    if not isinstance(top, Mapping):
        raise ConfigError(f"manifest {path}: $.meta.caller.sampling.top_logprobs = {_shown(top)} must be an object "
                          "({program, n_top, ids, logprobs}); regenerate it (kern manifest build)")
    program = _name(top, "program", "top_logprobs", path, "top_logprobs.")
    if program not in manifest.programs:
        raise ConfigError(f"manifest {path}: $.meta.caller.sampling.top_logprobs.program names program {program!r}, "
                          "which the manifest lacks; regenerate it (kern manifest build)")
    top_ids, tshape = buffer(top, "ids", "top_ids", ("i32",), 2, "top_logprobs.")
    top_lps, lshape = buffer(top, "logprobs", "top_logprobs", ("f32",), 2, "top_logprobs.")
    n_top = top.get("n_top", tshape[1])
    if tshape != lshape or isinstance(n_top, bool) or not isinstance(n_top, int) or not 1 <= n_top <= tshape[1]:
        raise ConfigError(f"manifest {path}: $.meta.caller.sampling.top_logprobs.n_top = {_shown(n_top)} with "
                          f"buffers {top_ids!r} {list(tshape)} / {top_lps!r} {list(lshape)}: expected 1..{tshape[1]} "
                          "and equal shapes; regenerate it (kern manifest build)")
    return SamplingIO(params, PARAM_DTYPES[pdtype], hist_tokens, hist_counts, cap, next_token, program, top_ids,
                      top_lps, n_top)
