"""The one place kern-run reads a manifest's sampler: `meta.caller.sampling` and the packed decode outputs.

A manifest built with the GPU sampler (`kern manifest build --sampler gpu`) ends its decode program with
kern_sample_bf16 and declares in `meta.caller.sampling` (docs/caller.md "Sampling"):

    {"sampler": "gpu", "params": "sample_params", "hist_tokens": "hist_tokens", "hist_counts": "hist_counts",
     "hist_cap": 1024, "packing": "packed", "init": "greedy",
     "top_logprobs": {"program": "top_logprobs", "n_top": 20, "ids": "top_ids", "logprobs": "top_logprobs"}}

`params` is an input u32 [seqs, 12] (`sampling.pack_params`, 48 bytes a row); `hist_tokens` / `hist_counts`
inputs i32 [seqs, hist_cap] (`sampling.pack_history`); with "packed", `next_token` i64 [seqs] and every token
ring entry hold the token id in bits 0..31 and the f32 logprob's bit pattern in bits 32..63
(`sampling.unpack_packed`). `top_logprobs`
names an eager program that writes `ids` i32 [seqs, n_top] / `logprobs` f32 [seqs, n_top] for the last decode
step. A manifest without `meta.caller.sampling` (the argmax builder) decodes greedily: plain token ids, no
sampler inputs; `SamplerFacts.check` refuses any other setting for it.

Everything else in kern-run takes a `SamplerFacts` (or None); adapting to another shape of the meta block is a
change to `read_sampler` alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from kern_manifest import var_max

from .errors import ConfigError, SamplingError
from .sampling import MAX_TOP_LOGPROBS, PARAM_ROW_BYTES, SamplingParams


@dataclass(frozen=True)
class TopLogprobs:
    """The eager program writing the last decode step's n_top best tokens per row (`ids` i32 [seqs, n_top],
    `logprobs` f32 [seqs, n_top])."""

    program: str
    ids: str
    logprobs: str
    n_top: int


@dataclass(frozen=True)
class SamplerFacts:
    """A manifest's GPU sampler: its per-row input buffers, the history capacity, the top-logprobs program."""

    params: str
    hist_tokens: str
    hist_counts: str
    hist_cap: int
    top_logprobs: TopLogprobs | None = None

    def check(self, params: SamplingParams, where: str) -> None:
        """Raises SamplingError (naming `where`) for top logprobs beyond what the manifest's program writes."""
        top = self.top_logprobs
        if params.top_logprobs and (top is None or params.top_logprobs > top.n_top):
            have = f"at most {top.n_top}" if top is not None else "none (no top_logprobs program)"
            raise SamplingError(f"{where}: top_logprobs = {params.top_logprobs} but this manifest writes {have}")


def check_greedy_only(params: SamplingParams, where: str) -> None:
    """For a manifest without a sampler (argmax decode): raises SamplingError naming the first setting it cannot
    honour (a temperature, a filter, a penalty, logprobs) and `where` it came from."""
    checks = (
        ("temperature", params.temperature != 0.0, "0"), ("top_k", params.top_k != 0, "0"),
        ("top_p", params.top_p != 1.0, "1"), ("min_p", params.min_p != 0.0, "0"),
        ("repetition_penalty", params.repetition_penalty != 1.0, "1"),
        ("presence_penalty", params.presence_penalty != 0.0, "0"),
        ("frequency_penalty", params.frequency_penalty != 0.0, "0"),
        ("logprobs", params.logprobs or params.top_logprobs > 0, "off"),
    )
    values = {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
              "min_p": params.min_p, "repetition_penalty": params.repetition_penalty,
              "presence_penalty": params.presence_penalty, "frequency_penalty": params.frequency_penalty,
              "logprobs": "on"}
    for field, bad, neutral in checks:
        if bad:
            value = values[field]
            raise SamplingError(f"{where}: {field} = {value!r} needs the GPU sampler, and this manifest decodes "
                                f"greedily (argmax; no meta.caller.sampling): leave {field} at {neutral}, or build "
                                "the manifest with the sampler (kern manifest build --sampler gpu)")


def check_params(sampler: SamplerFacts | None, params: SamplingParams, where: str) -> None:
    """Raises SamplingError (naming `where`) for settings a manifest with `sampler` (None: argmax) cannot run."""
    if sampler is None:
        check_greedy_only(params, where)
    else:
        sampler.check(params, where)


def read_sampler(manifest: Any, path: Any) -> SamplerFacts | None:
    """The sampler of a verified kern_manifest.Manifest from its `meta.caller.sampling`, None when absent.
    Raises ConfigError naming the file and the JSON path when the block is not an object, names a buffer or
    program the manifest lacks, or its buffers have other shapes than the contract's."""
    meta = manifest.meta if manifest.meta is not None else {}
    caller = meta.get("caller") if isinstance(meta, Mapping) else None
    if not isinstance(caller, Mapping) or "sampling" not in caller:
        return None
    block = caller["sampling"]
    where = f"manifest {path}: $.meta.caller.sampling"

    def fault(what: str) -> ConfigError:
        return ConfigError(f"{where}{what}; regenerate it (kern manifest build)")

    if not isinstance(block, Mapping):
        raise fault(" must be an object (the sampler's buffers, docs/caller.md \"Sampling\")")
    if block.get("packing", "packed") != "packed":
        raise fault(f".packing = {block.get('packing')!r}: this caller reads \"packed\" entries only")
    names = {}
    for key in ("params", "hist_tokens", "hist_counts"):
        name = block.get(key)
        if not isinstance(name, str) or name not in manifest.buffers or manifest.buffers[name].kind != "input":
            raise fault(f".{key} = {name!r} must name an input buffer of the manifest")
        names[key] = name
    at_max = var_max(manifest.vars)
    rows = at_max.get("seqs", 1)
    shapes = {key: list(manifest.buffers[name].shape_at(at_max)) for key, name in names.items()}
    cap = block.get("hist_cap")
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise fault(f".hist_cap = {cap!r} must be an integer >= 1")
    if shapes["params"] != [rows, PARAM_ROW_BYTES // 4]:
        raise fault(f".params: buffer {names['params']} is {shapes['params']} at var max, the contract's "
                    f"[seqs, {PARAM_ROW_BYTES // 4}] is [{rows}, {PARAM_ROW_BYTES // 4}]")
    for key in ("hist_tokens", "hist_counts"):
        if shapes[key] != [rows, cap]:
            raise fault(f".{key}: buffer {names[key]} is {shapes[key]} at var max, the contract's [seqs, hist_cap] "
                        f"is [{rows}, {cap}]")
    top = None
    spec = block.get("top_logprobs")
    if spec is not None:
        if not isinstance(spec, Mapping):
            raise fault(".top_logprobs must be an object")
        program, ids, lps, n_top = (spec.get(k) for k in ("program", "ids", "logprobs", "n_top"))
        if not isinstance(program, str) or program not in manifest.programs:
            raise fault(f".top_logprobs.program = {program!r} must name a program of the manifest")
        for key, name in (("ids", ids), ("logprobs", lps)):
            if not isinstance(name, str) or name not in manifest.buffers or manifest.buffers[name].kind != "output":
                raise fault(f".top_logprobs.{key} = {name!r} must name an output buffer of the manifest")
        if isinstance(n_top, bool) or not isinstance(n_top, int) or not 1 <= n_top <= MAX_TOP_LOGPROBS:
            raise fault(f".top_logprobs.n_top = {n_top!r} must be an integer in [1, {MAX_TOP_LOGPROBS}]")
        top = TopLogprobs(program, ids, lps, n_top)
    return SamplerFacts(names["params"], names["hist_tokens"], names["hist_counts"], cap, top)
