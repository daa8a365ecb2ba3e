"""The decode program's sampler (`--sampler gpu`, the default): per-row sampling in the graph, its buffers, ops,
calls, the `top_logprobs` program and meta.caller.sampling (docs/caller.md "Sampling", docs/kernels.md
"Sampling").

With "gpu" the decode program ends, after the lm_head writes `logits` bf16 [seqs, vocab]:

    sample                 kern_sample_bf16: penalties (in place in `logits`), temperature, top-k, top-p, min-p,
                           a Philox4x32-10 draw keyed by (seed, position) -> sample_token / sample_logprob /
                           sample_stats; grid (cdiv(vocab, 8192), seqs): a row split over blocks of 8192
                           logits, the last block of each row (a ticket in the fixed state `sample_work`)
                           merging them
    sample_history_append  kern_sample_history_append: this step's token into the row's history list
    decode_advance_packed  kern_decode_advance_packed (ops.py): next step's inputs; next_token and the ring entry
                           = token id (bits 0..31) | f32 logprob bits (bits 32..63)

and the `load` program also runs `sample_inputs_init` (kern_sample_inputs_init: every row greedy, history empty).
`top_logprobs` (kind run, no graph) is kern_sample_top_logprobs_bf16 over the step's penalized `logits` and its
`sample_stats`: run after a decode step, before the next one is queued. "argmax" keeps the two-stage argmax and
kern_decode_advance, byte for byte the manifest of the builder before the sampler (no meta.caller.sampling).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import ManifestBuildError
from ...sampling import MAX_TOP_LOGPROBS, PARAM_ROW_BYTES, SAMPLE_THREADS, WORK_BYTES_PER_ROW, sampler_splits
from .builder import Builder, call, ptr

if TYPE_CHECKING:
    from .config import Qwen3Config
    from .options import BuildOptions, Plan

SAMPLERS = ("gpu", "argmax")
HIST_CAP_MAX = 1 << 16  # history slots per row: 2 x 256 KiB per row at most
SAMPLE_MAX_VOCAB = 1 << 20  # kernels-src/sample.cu SAMPLE_MAX_VOCAB: a larger vocabulary writes nothing
PARAM_WORDS = PARAM_ROW_BYTES // 4  # u32 words per row of sample_params (kern_run.sampling.pack_params)
TOP_PROGRAM = "top_logprobs"
INIT_THREADS = 256


def check_sampling_options(cfg: "Qwen3Config", opts: "BuildOptions") -> None:
    """Raises ManifestBuildError naming the option, its flag and its value: a sampler other than "gpu" / "argmax",
    a hist_cap outside [1, 65536], or with "gpu" a vocabulary past the sampler's 2^20."""
    if opts.sampler not in SAMPLERS:
        raise ManifestBuildError(f"sampler (--sampler) {opts.sampler!r}: use 'gpu' (per-row sampling in the graph) "
                                 "or 'argmax' (greedy only, plain token ids)")
    if isinstance(opts.hist_cap, bool) or not isinstance(opts.hist_cap, int) or not 1 <= opts.hist_cap <= HIST_CAP_MAX:
        raise ManifestBuildError(f"hist_cap (--hist-cap) {opts.hist_cap!r}: history slots per row must lie in "
                                 f"[1, {HIST_CAP_MAX}]")
    if opts.sampler == "gpu" and cfg.vocab > SAMPLE_MAX_VOCAB:
        raise ManifestBuildError(f"sampler (--sampler) 'gpu': vocab_size {cfg.vocab} > {SAMPLE_MAX_VOCAB} (the "
                                 "sampler's limit); use --sampler argmax")


def add_sampling_buffers(b: Builder, plan: "Plan") -> None:
    """Inputs sample_params u32 [seqs, 12] (48 bytes a row), hist_tokens / hist_counts i32 [seqs, hist_cap];
    workspace sample_token i32 [seqs], sample_logprob f32 [seqs], sample_stats f32 [seqs, 4] (max l, log Z_kept,
    threshold, 1 / temperature); outputs top_ids i32 [seqs, 20], top_logprobs f32 [seqs, 20]; the fixed state
    sample_work (seqs_max * 69664 bytes, kern_run.sampling.WORK_BYTES_PER_ROW)."""
    cap = plan.opts.hist_cap
    b.buffer("sample_params", "input", "u32", ["seqs", PARAM_WORDS])
    b.buffer("hist_tokens", "input", "i32", ["seqs", cap])
    b.buffer("hist_counts", "input", "i32", ["seqs", cap])
    b.buffer("sample_token", "workspace", "i32", ["seqs"])
    b.buffer("sample_logprob", "workspace", "f32", ["seqs"])
    b.buffer("sample_stats", "workspace", "f32", ["seqs", 4])
    b.buffer("top_ids", "output", "i32", ["seqs", MAX_TOP_LOGPROBS])
    b.buffer("top_logprobs", "output", "f32", ["seqs", MAX_TOP_LOGPROBS])
    # the sampler's per-row work area (its slices' results, candidates and the row's ticket): a fixed state,
    # zeroed at load, which the kernel leaves with every ticket back at zero
    b.states["sample_work"] = {"kind": "fixed", "bytes": plan.opts.seqs_max * WORK_BYTES_PER_ROW}


def add_sampling_ops(b: Builder, plan: "Plan") -> None:
    """`sample`, `sample_history_append` (decode), `top_logprobs` (its own program), `sample_inputs_init` (load).
    kern_sample_bf16 runs grid (cdiv(vocab, 8192), seqs, 1), block 512 (one block per 8192 logits of a row, the
    grid's x fixed by the vocabulary alone, so a row's result never depends on the batch); top logprobs one block
    of 1024 threads per row, the history append 32; the init strides over seqs_max rows."""
    V, cap, opts = plan.cfg.vocab, plan.opts.hist_cap, plan.opts
    pdl = opts.pdl_small_launches
    b.op("sample",
         [ptr("logits"), ptr("params"), ptr("positions"), ptr("hist_tokens"), ptr("hist_counts"), ptr("token"),
          ptr("logprob"), ptr("stats"), ptr("work")],
         [b.launch("kern_sample_bf16", [sampler_splits(V), "seqs", 1], [SAMPLE_THREADS, 1, 1],
                   [{"arg": "logits"}, {"arg": "params"}, {"arg": "positions"}, {"arg": "hist_tokens"},
                    {"arg": "hist_counts"}, {"i32": cap}, {"i32": V}, {"arg": "token"}, {"arg": "logprob"},
                    {"arg": "stats"}, {"arg": "work"}], pdl=pdl)])
    b.op("sample_history_append", [ptr("hist_tokens"), ptr("hist_counts"), ptr("tokens")],
         [b.launch("kern_sample_history_append", ["seqs", 1, 1], [32, 1, 1],
                   [{"arg": "hist_tokens"}, {"arg": "hist_counts"}, {"arg": "tokens"}, {"i32": cap}, {"i32": V}],
                   pdl=pdl)])
    b.op("top_logprobs", [ptr("logits"), ptr("stats"), ptr("ids"), ptr("logprobs")],
         [b.launch("kern_sample_top_logprobs_bf16", ["seqs", 1, 1], [1024, 1, 1],
                   [{"arg": "logits"}, {"arg": "stats"}, {"i32": V}, {"i32": MAX_TOP_LOGPROBS}, {"arg": "ids"},
                    {"arg": "logprobs"}])])
    rows = opts.seqs_max
    b.op("sample_inputs_init", [ptr("params"), ptr("hist_tokens"), ptr("hist_counts")],
         [b.launch("kern_sample_inputs_init", [rows, 1, 1], [INIT_THREADS, 1, 1],
                   [{"arg": "params"}, {"arg": "hist_tokens"}, {"arg": "hist_counts"}, {"i32": rows},
                    {"i32": cap}])])


def init_call() -> dict[str, Any]:
    """The `load` program's call: every row's sampler inputs greedy / empty (seqs_max rows, whatever the vars)."""
    return call("sample_inputs_init", params="sample_params", hist_tokens="hist_tokens", hist_counts="hist_counts")


def decode_tail_calls() -> list[dict[str, Any]]:
    """The decode program's calls after the lm_head (which writes `logits`): sample, history append, advance."""
    return [
        call("sample", logits="logits", params="sample_params", positions="positions", hist_tokens="hist_tokens",
             hist_counts="hist_counts", token="sample_token", logprob="sample_logprob", stats="sample_stats",
             work="sample_work"),
        call("sample_history_append", hist_tokens="hist_tokens", hist_counts="hist_counts", tokens="sample_token"),
        call("decode_advance_packed", token="sample_token", logprob="sample_logprob", next_token="next_token",
             token_ids="token_ids", positions="positions", seq_lens="seq_lens", slot_mapping="slot_mapping",
             block_table="block_table", ring="token_ring"),
    ]


def top_logprobs_program() -> dict[str, Any]:
    """The `top_logprobs` program (kind run, no graph): the n_top best tokens of each row of the last decode
    step's logits and their logprobs under the distribution that step sampled from."""
    return {"kind": "run", "calls": [call("top_logprobs", logits="logits", stats="sample_stats", ids="top_ids",
                                          logprobs="top_logprobs")]}


def sampling_meta(plan: "Plan") -> dict[str, Any]:
    """meta.caller.sampling of a "gpu" manifest (docs/caller.md "Sampling"): everything a caller needs."""
    return {
        "sampler": "gpu",
        "params": "sample_params",
        "hist_tokens": "hist_tokens",
        "hist_counts": "hist_counts",
        "hist_cap": plan.opts.hist_cap,
        "packing": "packed",
        "init": "greedy",
        "top_logprobs": {"program": TOP_PROGRAM, "n_top": MAX_TOP_LOGPROBS, "ids": "top_ids",
                         "logprobs": "top_logprobs"},
    }
