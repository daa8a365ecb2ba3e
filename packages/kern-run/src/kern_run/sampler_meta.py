"""The caller's view of a manifest's sampler (`SamplerFacts`) and the checks of requested settings against it.

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

`sampling_io.read_sampling_io` reads and checks the block (for `kern run` and kern serve alike); `read_sampler`
turns its result into the `SamplerFacts` the batched caller takes (or None).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .errors import SamplingError
from .sampling import SamplingParams
from .sampling_io import read_sampling_io


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
    """The sampler of a verified kern_manifest.Manifest, None when `meta.caller.sampling` is absent: the caller's view
    of `sampling_io.read_sampling_io`, which reads and checks the block (the one reader, shared with kern serve).
    Raises ConfigError naming the file and the JSON path for a malformed block."""
    io = read_sampling_io(manifest, path)
    if io is None:
        return None
    top = (TopLogprobs(io.top_program, io.top_ids, io.top_logprobs, io.top_n)
           if io.top_program is not None and io.top_ids is not None and io.top_logprobs is not None else None)
    return SamplerFacts(io.params, io.hist_tokens, io.hist_counts, io.hist_cap, top)
