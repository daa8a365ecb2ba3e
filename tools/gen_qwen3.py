#!/usr/bin/env python3
"""Generate the kern manifest of a Qwen3 dense model from its config.json and kernels/kernels.json.

The manifest (docs/manifest.md) is everything model-specific; this generator is where Qwen3 lives:

- vars: `tokens` [1, chunk_max] (rows of a prefill chunk; 1 in decode), `seqs` [1, 1].
- buffers: the caller's inputs (token_ids, positions, slot_mapping, block_table, seq_lens,
  cu_seqlens_q), the workspace of one layer, `logits` and the output `next_token`; per layer the
  weights, with q/k/v and gate/up concatenated in their binds (whole-tensor segments) and o/down/norms
  bound whole; `embed`; `lm_head` only when the embeddings are not tied (tied: the lm_head GEMM reads
  `embed` itself); `rope` (cos|sin table) derived by the `load` once program.
- states: one paged KV state per layer, `[2][page_tokens][Hkv][D]` bf16 per page (docs/kernels.md). The
  attention calls bound the page ids they read with `num_pages = {"pages_of": "kv.<layer>"}` (the pages of
  that state's reserved range, a constant the runtime resolves at load).
- ops: our kernels, each launch's `params` copied from kernels.json (the ABI read from the cubin) and
  checked here against the kernel contract's signature; GEMMs through `extern:cublaslt_bf16_tn`.
- programs: `load` (once: rope table), `prefill` (a chunk of `tokens` tokens; fills the KV cache only,
  so the last layer stops after writing its K/V), `decode` (graph: one token per sequence, logits,
  two-stage argmax into `next_token`, then `kern_decode_advance` writes the next step's inputs and
  the token ring on the device: docs/caller.md "Decode on the device").

Prefill issues 9 launches per layer (add_rmsnorm, qkv GEMM, qk_norm_rope_kv, attention, o GEMM,
add_rmsnorm, gate_up GEMM, silu_mul, down GEMM) with cuBLASLt GEMMs. Decode (`--decode gemv`, the
default, bs = 1) issues 7: the M = 1 GEMVs of kernels-src/gemv.cu fold the RMSNorms into the qkv /
gate_up / lm_head prologues and the residual adds into the o / down epilogues (the residual stream is
updated in place), so decode has its own ops (`decode_gemv_ops`, `decode_gemv_calls`); the launches
whose kernels wait with griddepcontrol.wait before touching a predecessor's output (PDL_ENTRIES) carry
`pdl: true`. `--decode gemm` keeps the prefill-shaped decode (10 launches per layer, cuBLASLt). Why
separate ops rather than `when` on one op: docs/perf.md.

Output is deterministic: same config, kernels.json and options -> the same bytes (sorted keys, fixed
indentation, the digest of docs/manifest.md). The output is verified with kern_manifest when that
package is importable (`--no-verify` skips it).

Errors (exit 1, one line on stderr naming the file, key or option; nothing written): a config.json or
kernels.json that cannot be read or is not UTF-8 JSON; a config value of the wrong JSON type or range
(integers JSON integers >= 1, tie_word_embeddings a boolean, rope_theta and rms_norm_eps finite numbers > 0); a
kernels.json module without a sha256 string, an entry whose params are not [offset, size] integer pairs or do
not match the kernel contract, or no entry for a kernel the options use (an entry they do not use may be
missing); a head_dim the kernels do not cover (kern_attn_prefill: a multiple of 16, at most 128; `--decode-attn wide`: at most 128); an option out of range (--max-context, --chunk-max in
[1, max-context], --decode-split-tokens >= 1 and a multiple of the page size, --sms >= 1, --decode-splits
>= 0, --carveout 0..100 or -1, --gemv-threads-per-sm 32..2048); an --algos pins file that is malformed, was
proven for a smaller M than --chunk-max, or matches none of the model's GEMM shapes; an --out that is a
directory or cannot be written (the manifest goes to a temporary file renamed over --out: never half-written);
a manifest that does not verify.

Usage:
    python tools/gen_qwen3.py --config /tmp/qwen3-4b/config.json --kernels kernels/kernels.json --out manifests/qwen3-4b.json
    python tools/gen_qwen3.py --shape qwen3-4b --kernels kernels/kernels.json --out manifests/qwen3-4b.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atomic_files import write_files  # noqa: F401 - the writer ablate_manifest, gen_qwen3_tp, pick_algos and regen reuse

# kern-manifest is standard library only: importable from the checkout by any python3
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "packages" / "kern-manifest" / "src"))
from kern_manifest import MAX_MANIFEST_BYTES, read_regular_file  # noqa: E402 - bounded reads
from kern_manifest import json_text_fault  # noqa: E402 - why a JSON file is unusable, worded as everywhere in kern

FORMAT = "kern-manifest/1"
GENERATOR = "tools/gen_qwen3.py"
GENERATOR_VERSION = 2

# The kernel contract (docs/kernels.md): entry -> (module, parameter types). "p" is a pointer (8 bytes),
# "i32"/"f32" 4 bytes, "i64" 8 bytes. kernels.json's params (read from the cubin) must match these.
KERNEL_SIGNATURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "kern_embed_gather": ("embed", ("p", "p", "p", "i32", "i32", "i32")),
    "kern_add_rmsnorm": ("norm", ("p", "p", "p", "p", "i32", "i32", "f32")),
    "kern_rope_table": ("rope", ("p", "i32", "i32", "f32")),
    "kern_qk_norm_rope_kv": ("rope", ("p",) * 8 + ("i32",) * 7 + ("f32",)),
    "kern_qk_norm_rope_kv_warp": ("rope", ("p",) * 8 + ("i32",) * 7 + ("f32",)),
    "kern_attn_decode_partial": ("attention", ("p",) * 6 + ("i32",) * 8 + ("f32",)),
    "kern_attn_decode_reduce": ("attention", ("p",) * 4 + ("i32",) * 4),
    "kern_attn_prefill": ("attention", ("p",) * 6 + ("i32",) * 6 + ("f32",)),
    "kern_attn_prefill_r32": ("attention", ("p",) * 6 + ("i32",) * 6 + ("f32",)),
    "kern_attn_prefill_wg": ("attention_wg", ("p",) * 6 + ("i32",) * 6 + ("f32",)),
    "kern_silu_mul": ("act", ("p", "p", "i32", "i32")),
    "kern_argmax_partial": ("argmax", ("p", "i32", "i32", "p", "p", "i32")),
    "kern_argmax_final": ("argmax", ("p", "p", "i32", "p")),
    "kern_gemv_rmsnorm": ("gemv", ("p", "p", "p", "p", "i32", "i32", "f32")),
    "kern_gemv_residual": ("gemv", ("p", "p", "p", "i32", "i32")),
    "kern_gemv_silu_residual": ("gemv", ("p", "p", "p", "i32", "i32")),
    "kern_gemv_rows": ("gemv", ("p", "p", "p", "i32", "i32")),
    "kern_gemv_rows_rmsnorm": ("gemv", ("p", "p", "p", "p", "i32", "i32", "f32")),
    "kern_gemv_rows_residual": ("gemv", ("p", "p", "p", "i32", "i32")),
    "kern_gemv_rmsnorm_swiglu": ("gemv", ("p", "p", "p", "p", "i32", "i32", "f32")),
    "kern_attn_decode_partial_fast": ("attention", ("p",) * 6 + ("i32",) * 8 + ("f32",)),
    "kern_attn_decode_partial_early": ("attention", ("p",) * 7 + ("i32",) * 8 + ("f32",)),
    "kern_attn_decode_partial_wide": ("attention", ("p",) * 7 + ("i32",) * 8 + ("f32",)),
    "kern_decode_advance": ("step", ("p",) * 7 + ("i32",) * 5),
}
# Entries that execute griddepcontrol.wait before reading anything a predecessor writes and before writing
# anything (docs/kernels-gemv.md, docs/kernels.md "Programmatic dependent launch"); only these may carry
# `pdl: true`. tests/run/test_decode_pdl_sass.py checks every pdl launch of the committed manifests against
# the SASS of the committed cubin (ACQBULK present) when cuobjdump is available.
PDL_ENTRIES = frozenset({
    "kern_gemv_rmsnorm", "kern_gemv_residual", "kern_gemv_silu_residual",
    "kern_gemv_rows", "kern_gemv_rows_rmsnorm", "kern_gemv_rows_residual", "kern_gemv_rmsnorm_swiglu",
    "kern_attn_decode_partial", "kern_attn_decode_partial_fast", "kern_attn_decode_reduce", "kern_attn_prefill",
    "kern_qk_norm_rope_kv", "kern_embed_gather", "kern_argmax_partial", "kern_argmax_final",
    "kern_decode_advance", "kern_attn_decode_partial_early", "kern_attn_decode_partial_wide",
    "kern_attn_prefill_r32", "kern_qk_norm_rope_kv_warp", "kern_attn_prefill_wg",
})
# --decode-attn values with kern_attn_decode_partial_early's contract (reads before the PDL wait, slot_mapping
# passed): name -> (entry, threads per block, largest head_dim); docs/kernels.md "Entries".
EARLY_PARTIALS: dict[str, tuple[str, int, int]] = {
    "early": ("kern_attn_decode_partial_early", 128, 256),
    "wide": ("kern_attn_decode_partial_wide", 256, 128),
}
DECODE_ATTN = ("split", *EARLY_PARTIALS)
# --prefill-attn values: name -> (entry, query rows per grid.x step at a GQA group of 4, dynamic shared memory
# bytes, threads per block); docs/kernels.md "Prefill". Every entry computes every row bit for bit alike
# (tests/kernels/test_kernels_gpu.py): r16 / r32 on mma.sync, wg on Hopper wgmma (attention_wg.cu, a producer
# warpgroup and two consumer warpgroups; head_dim 64 or 128 only: PREFILL_WG_HEAD_DIMS). "auto" (the default) is
# wg where the head_dim allows, else r32.
PREFILL_ATTN: dict[str, tuple[str, int, int, int]] = {
    "r16": ("kern_attn_prefill", 16, 0, 128),
    "r32": ("kern_attn_prefill_r32", 32, 105472, 128),
    "wg": ("kern_attn_prefill_wg", 32, 169024, 384),
}


def prefill_rows_per_block(rows_at_group4: int, group: int) -> int:
    """Query rows (tokens) one block of a prefill attention entry covers for a GQA group of `group` q heads per kv
    head: the entries give hpb = group heads to a pass when group divides 4, else 4, and 4 / hpb times the rows
    of a group of 4 (kernels-src/prefill.cuh `pf_block`, which every prefill entry calls). The launch's grid.x is
    cdiv(tokens, this); a larger grid is allowed (its extra blocks exit)."""
    hpb = group if group <= 4 and 4 % group == 0 else 4
    return rows_at_group4 * (4 // hpb)


def rope_warp_heads(head_dim: int) -> int:
    """Heads one 256-thread block of kern_qk_norm_rope_kv_warp covers: head_dim / 8 lanes per head, so 8 warps x
    max(1, 256 / head_dim) (kernels-src/rope.cu)."""
    return 8 * max(1, 256 // head_dim)


# head_dims kern_attn_prefill_wg is compiled for (its O += P V is one wgmma of N = head_dim)
PREFILL_WG_HEAD_DIMS = (64, 128)
TYPE_BYTES = {"p": 8, "i32": 4, "f32": 4, "i64": 8}


class GenError(Exception):
    """The inputs (config.json, kernels.json, options) cannot make a manifest; the message says why."""


# ---------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Qwen3Config:
    """The fields of a Qwen3 config.json the manifest depends on."""

    hidden: int
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    rope_theta: float
    eps: float
    max_position_embeddings: int

    @classmethod
    def from_json(cls, cfg: Any, source: str = "config.json") -> "Qwen3Config":
        """From a config.json object. Raises GenError, naming `source` and the key, for a model this generator does
        not cover or a value of the wrong JSON type or range: integers must be JSON integers >= 1,
        tie_word_embeddings a JSON boolean, rope_theta and rms_norm_eps finite numbers > 0. Absent keys take
        transformers' defaults (head_dim: hidden_size // num_attention_heads, also when null; rope_theta: 1e6 or
        rope_parameters.rope_theta; tie_word_embeddings false; max_position_embeddings 40960)."""
        if not isinstance(cfg, dict):
            raise GenError(f"{source}: a JSON {type(cfg).__name__}, expected a config.json object")
        if cfg.get("model_type") != "qwen3":
            raise GenError(f"{source}: model_type is {cfg.get('model_type')!r}; this generator makes qwen3 manifests")
        if cfg.get("rope_scaling") not in (None, {}):
            raise GenError(f"{source}: rope_scaling {cfg['rope_scaling']!r} is not supported (plain RoPE only)")
        if cfg.get("use_sliding_window"):
            raise GenError(f"{source}: use_sliding_window is true; sliding-window attention is not supported")
        if cfg.get("attention_bias"):
            raise GenError(f"{source}: attention_bias is true; Qwen3 projections without bias only")

        def shown(value: Any) -> str:
            text = repr(value)
            return text if len(text) <= 60 else text[:57] + "..."

        def get(key: str, default: Any) -> Any:
            if key not in cfg:
                if default is _REQUIRED:
                    raise GenError(f"{source} lacks {key!r}")
                return default
            return cfg[key]

        def integer(key: str, default: Any = _REQUIRED) -> int:
            value = get(key, default)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise GenError(f"{source}: {key} = {shown(value)} must be a JSON integer >= 1")
            return value

        def positive(key: str, value: Any) -> float:
            if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
                    or value <= 0):
                raise GenError(f"{source}: {key} = {shown(value)} must be a finite number > 0")
            return float(value)

        hidden, layers = integer("hidden_size"), integer("num_hidden_layers")
        q_heads, kv_heads = integer("num_attention_heads"), integer("num_key_value_heads")
        if cfg.get("head_dim") is None:  # transformers' default
            head_dim = hidden // q_heads
            if head_dim < 1:
                raise GenError(f"{source}: head_dim (hidden_size {hidden} // num_attention_heads {q_heads}) is 0")
        else:
            head_dim = integer("head_dim")
        tied = get("tie_word_embeddings", False)
        if not isinstance(tied, bool):
            raise GenError(f"{source}: tie_word_embeddings = {shown(tied)} must be a JSON boolean (true or false)")
        if "rope_theta" in cfg:
            rope_theta = positive("rope_theta", cfg["rope_theta"])
        else:
            params = cfg.get("rope_parameters") or {}
            if not isinstance(params, dict):
                raise GenError(f"{source}: rope_parameters = {shown(params)} must be a JSON object")
            rope_theta = positive("rope_parameters.rope_theta", params.get("rope_theta", 1e6))
        out = cls(
            hidden=hidden, layers=layers, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim,
            intermediate=integer("intermediate_size"), vocab=integer("vocab_size"), tied=tied, rope_theta=rope_theta,
            eps=positive("rms_norm_eps", get("rms_norm_eps", _REQUIRED)),
            max_position_embeddings=integer("max_position_embeddings", 40960),
        )
        if out.q_heads % out.kv_heads:
            raise GenError(f"{source}: num_attention_heads {out.q_heads} is not a multiple of num_key_value_heads "
                           f"{out.kv_heads}")
        return out


_REQUIRED = object()  # Qwen3Config.from_json: a key without a default


@dataclass(frozen=True)
class GenOptions:
    """Generator options. `max_context` bounds positions (rope rows) and block-table width."""

    name: str
    chunk_max: int = 512  # tokens var max: the largest prefill chunk
    max_context: int = 40960  # positions 0..max_context-1
    page_tokens: int = 16
    # decode attention: MINIMUM context tokens per split (multiple of page_tokens). 64 = one tile of the decode
    # partial at head_dim 128 (4 warps x 8 slots x 2 tokens): a shorter split leaves most of its tile's lanes
    # idle and only adds working blocks; H200 4B ctx 128: 2.693 ms/token against 2.711 with 16 (docs/perf.md)
    split_tokens: int = 64
    argmax_chunks: int = 64  # two-stage argmax: first-stage blocks per row
    seqs_max: int = 1
    decode: str = "gemv"  # decode projections: "gemv" (M = 1 GEMVs, fused norms/residuals) or "gemm" (cuBLASLt)
    # with decode "gemm": the decode program's projections run kern_gemv_rows at tokens = 1 (same call table:
    # separate norms, residual adds and, on tensor-parallel ranks, the all-reduces between them)
    m1_gemv: bool = False
    decode_splits: int = 0  # decode attention splits (launch constant); 0: auto (decode_num_splits)
    sms: int = 132  # multiprocessors of the target GPU (H200): GEMV grids and the auto split count
    pdl: bool = True  # mark launches of PDL_ENTRIES with `pdl: true` (decode program only)
    # also the small kernels (embed, qk_norm_rope_kv, argmax, decode_advance); their ops serve prefill too,
    # where PDL is harmless (they write nothing before the wait and read before it only what no kernel in
    # flight writes: docs/kernels.md "Programmatic dependent launch")
    pdl_small: bool = True
    ring_len: int = 64  # token ring (host-mapped output) entries per sequence
    gemv: str = "v1"  # decode GEMV wiring (--decode gemv): "v1" warp-per-row entries, "v2" rows family + swiglu
    # GEMV grids fill at most this many threads per SM (2048 max; 1024 = all a <= 64-register kernel can hold);
    # less leaves room for the next kernel's blocks to become resident early under PDL
    gemv_threads_per_sm: int = 1024
    # decode attention: "split" (kern_qk_norm_rope_kv, then the partial and reduce launches), "early" (the same
    # with kern_attn_decode_partial_early: block table and first K/V tile read before its PDL wait), "wide" (the
    # early contract on kern_attn_decode_partial_wide: 8 warps x 4 token slots, head_dim <= 128); EARLY_PARTIALS
    # holds the early-contract entries. A fused one-launch entry and an L2 prefetch of later weights measured
    # slower and were removed (docs/perf.md "Decode, fourth session"; their cubins stay in kernels/)
    decode_attn: str = "wide"
    # prefill attention (PREFILL_ATTN): "wg" kern_attn_prefill_wg (Hopper wgmma, warp-specialized: a producer
    # warpgroup, two consumer warpgroups; H200 4B: 1.7-1.8x kern_attn_prefill_r32 on a 2048 chunk after a 6k-14k
    # prefix, docs/perf.md "Prefill, eleventh session"; head_dim 64 or 128), "r32" kern_attn_prefill_r32
    # (mma.sync, two m-tiles per warp), "r16" kern_attn_prefill (one); "auto": wg where the head_dim allows, else r32
    prefill_attn: str = "auto"
    # q/k norm + rope + K/V write at tokens >= 2: "warp" kern_qk_norm_rope_kv_warp (head_dim / 8 lanes per token and
    # head; head_dim a multiple of 64, at most 256, else "block"), "block" kern_qk_norm_rope_kv (one block per token
    # and head, as at tokens = 1, where decode keeps it). Bit for bit the same rows; docs/perf.md "Prefill, ninth
    # session" and "Prefill, twelfth session".
    # "warp" falls back to "block" (and the manifest's meta.caller.prefill_rope says so) at a head_dim the warp
    # entry does not take or with chunk_max 1
    prefill_rope: str = "warp"
    # preferred shared-memory carveout (percent of the maximum) on every kernel launch (manifest `carveout`;
    # None: not written, the driver's choice). 100: every kernel prefers the largest shared-memory split, so
    # kernels overlapping under PDL never want different L1 / shared splits on one SM (our reading of why it
    # helps; not measured directly). H200 4B decode 0.9-1.8% faster (docs/perf.md "Decode, sixth session"); the TP
    # generator inherits it (not measured there)
    carveout: int | None = 100
    # cuBLASLt pins (tools/pick_algos.py): ((n, k, ((attr, value), ...)), ...); a projection whose (n, k) is here
    # gets its own op `gemm_<n>x<k>` with that algorithm for every M (batch-invariant prefill)
    algos: tuple[tuple[int, int, tuple[tuple[str, int], ...]], ...] = ()
    # M = 1 pins for the cuBLASLt decode (--decode gemm): fastest by graph timing, split-K allowed
    decode_algos: tuple[tuple[int, int, tuple[tuple[str, int], ...]], ...] = ()
    algos_source: tuple[tuple[str, Any], ...] = ()  # (device, cublaslt_version, m_max) of the pins file, for meta

    @property
    def pdl_small_launches(self) -> bool:
        """Whether the small kernels (embed, qk_norm_rope_kv, argmax, decode_advance) launch with PDL: only
        when PDL is on at all."""
        return self.pdl and self.pdl_small


def load_algos(path: Path, chunk_max: int) -> tuple[tuple, tuple, tuple]:
    """Read a tools/pick_algos.py pins file: (algos, decode_algos, algos_source) for GenOptions. Raises GenError
    when the file is malformed (naming the list, the (n, k) shape and the key) or its pins were proven for a
    smaller M than `chunk_max`."""
    # kern_runtime.blas.ALGO_KEYS, copied: this generator does not import kern_runtime
    algo_attrs = ("id", "tile", "stages", "split_k", "reduction", "swizzle", "custom", "inner_shape", "cluster_shape")

    def count(value: Any, low: int = 0) -> bool:  # a JSON integer >= low (true/false are not integers here)
        return isinstance(value, int) and not isinstance(value, bool) and value >= low

    def table(doc: dict[str, Any], key: str) -> tuple:
        rows = doc.get(key, [])
        if not isinstance(rows, list):
            raise GenError(f"{path}: {key} is a JSON {type(rows).__name__}, expected a list of pins")
        out: dict[tuple[int, int], tuple] = {}
        for i, p in enumerate(rows):
            if not (isinstance(p, dict) and count(p.get("n"), 1) and count(p.get("k"), 1)):
                raise GenError(f"{path}: {key}[{i}] needs integer \"n\" and \"k\" >= 1, got "
                               f"{json.dumps(p)[:120]}")
            shape = f"{key}[{i}] (n={p['n']}, k={p['k']})"
            if (p["n"], p["k"]) in out:
                raise GenError(f"{path}: {shape} pins the shape {p['n']}x{p['k']} a second time")
            algo = p.get("algo")
            if not isinstance(algo, dict) or "id" not in algo:
                raise GenError(f"{path}: {shape}: \"algo\" must be an object with at least \"id\", got {algo!r}")
            for a, v in algo.items():
                if a not in algo_attrs:
                    raise GenError(f"{path}: {shape}: algo key {a!r} is not a cuBLASLt algo attribute "
                                   f"(known: {', '.join(algo_attrs)})")
                if not count(v):
                    raise GenError(f"{path}: {shape}: algo {a} = {v!r} must be an integer >= 0")
            out[(p["n"], p["k"])] = tuple(sorted(algo.items()))
        return tuple(sorted((n, k, algo) for (n, k), algo in out.items()))

    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:  # not UTF-8, invalid JSON, too deep, past the digit limit
        reason = json_text_fault(exc)
        if reason is None:
            raise
        raise GenError(f"{path}: not a pins file: {reason}") from None
    if not isinstance(doc, dict):
        raise GenError(f"{path}: not a pins file (a JSON {type(doc).__name__}, expected an object)")
    if doc.get("format") != "kern-cublaslt-pins/1":
        raise GenError(f"{path}: format {doc.get('format')!r}, expected 'kern-cublaslt-pins/1'")
    for key, ok in (("device", isinstance(doc.get("device"), str)), ("m_max", count(doc.get("m_max"), 1)),
                    ("cublaslt_version", count(doc.get("cublaslt_version"))), ("pins", "pins" in doc)):
        if not ok:
            raise GenError(f"{path}: not a pins file ({key} = {doc.get(key)!r})")
    if doc["m_max"] < chunk_max:
        raise GenError(f"{path}: pins were checked up to M = {doc['m_max']}, below --chunk-max {chunk_max}")
    algos, decode_algos = table(doc, "pins"), table(doc, "decode_pins")
    if not algos and not decode_algos:
        raise GenError(f"{path}: no pins (pins and decode_pins are empty): rerun tools/pick_algos.py with --shape")
    source = (("device", doc["device"]), ("cublaslt_version", doc["cublaslt_version"]), ("m_max", doc["m_max"]))
    return algos, decode_algos, source


def decode_num_splits(cfg: "Qwen3Config", opts: GenOptions) -> int:
    """Decode attention splits: the given number, else the largest power of two with kv_heads * splits <=
    the SM count (one wave of partial blocks; at least 1, capped at 64 and at the splits the longest context
    can use). The split length itself is derived on the device from seq_lens (docs/kernels.md "Decode
    splits"), so one captured grid serves every context length. Measured on the H200, Qwen3-4B (8 kv heads,
    docs/perf.md): 16 splits 2.886 / 3.280 ms per token at ctx 128 / 4096, against 2.937 / 3.271 with 32
    (the earlier rule, smallest power of two covering the SMs) and 2.857 / 3.491 with 8."""
    cap = -(-opts.max_context // opts.split_tokens)
    if opts.decode_splits:
        return min(opts.decode_splits, cap)
    splits = 1
    while splits * 2 * cfg.kv_heads <= opts.sms and splits < 64:
        splits *= 2
    return max(1, min(splits, cap))


@dataclass(frozen=True)
class KernelAbi:
    """kernels.json: module -> sha256, and entry -> (module, params [[offset, size], ...])."""

    modules: dict[str, str]
    entries: dict[str, tuple[str, list[list[int]]]]
    digest: str
    source: str = "kernels.json"

    @classmethod
    def from_json(cls, raw: Any, source: str = "kernels.json") -> "KernelAbi":
        """Raises GenError naming `source` and the module / entry whose record is malformed (not an object, no
        sha256 string, params not a list of [offset, size] JSON integer pairs) or whose ABI does not match the
        kernel contract."""
        if not isinstance(raw, dict):
            raise GenError(f"{source}: a JSON {type(raw).__name__}, expected a kernels.json object")
        if raw.get("format") != "kern-kernels/1":
            raise GenError(f"{source} format is {raw.get('format')!r}, expected 'kern-kernels/1'")

        def pair(p: Any) -> bool:
            return (isinstance(p, list) and len(p) == 2
                    and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in p))

        raw_modules = raw.get("modules", {})
        if not isinstance(raw_modules, dict):
            raise GenError(f"{source}: modules is a JSON {type(raw_modules).__name__}, expected an object")
        modules: dict[str, str] = {}
        entries: dict[str, tuple[str, list[list[int]]]] = {}
        for mod_name, mod in sorted(raw_modules.items()):
            where = f"{source}: modules.{mod_name}"
            if not isinstance(mod, dict):
                raise GenError(f"{where} is a JSON {type(mod).__name__}, expected an object")
            if not isinstance(mod.get("sha256"), str):
                raise GenError(f"{where}.sha256 is {json.dumps(mod.get('sha256'))[:80]}, expected the cubin's sha256 "
                               "string")
            mod_entries = mod.get("entries", {})
            if not isinstance(mod_entries, dict):
                raise GenError(f"{where}.entries is a JSON {type(mod_entries).__name__}, expected an object")
            modules[mod_name] = mod["sha256"]
            for entry, info in sorted(mod_entries.items()):
                params = info.get("params") if isinstance(info, dict) else None
                if not isinstance(params, list) or not all(pair(p) for p in params):
                    raise GenError(f"{where}.entries.{entry}.params must be a list of [offset, size] integer pairs, "
                                   f"got {json.dumps(params)[:120]}")
                contract_module = KERNEL_SIGNATURES.get(entry, (mod_name,))[0]
                if entry in entries and entries[entry][0] == contract_module:
                    continue  # an entry name in two modules: the contract's module wins
                entries[entry] = (mod_name, [[int(o), int(s)] for o, s in params])
        for entry, (want_module, types) in KERNEL_SIGNATURES.items():
            if entry not in entries:
                continue  # refused when a launch uses it (Builder.launch): options may not need every entry
            params = entries[entry][1]
            sizes = [s for _, s in params]
            want = [TYPE_BYTES[t] for t in types]
            if sizes != want:
                raise GenError(f"{source} entry {entry!r} has param sizes {sizes}, the kernel contract "
                               f"(docs/kernels.md) says {want} for {types}")
        canonical = json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()
        return cls(modules, entries, hashlib.sha256(canonical).hexdigest(), source)


def stub_kernels_json() -> dict[str, Any]:
    """A kernels.json with the contract's ABI (naturally aligned params) and fake hashes, for tests."""
    modules: dict[str, Any] = {}
    for entry, (module, types) in sorted(KERNEL_SIGNATURES.items()):
        params, offset = [], 0
        for t in types:
            size = TYPE_BYTES[t]
            offset = (offset + size - 1) // size * size
            params.append([offset, size])
            offset += size
        mod = modules.setdefault(module, {
            "file": f"{module}-{hashlib.sha256(module.encode()).hexdigest()[:12]}.cubin",
            "sha256": hashlib.sha256(module.encode()).hexdigest(), "source": f"kernels-src/{module}.cu",
            "flags": [], "entries": {},
        })
        mod["entries"][entry] = {"params": params, "registers": 32, "constants": {}}
    return {"format": "kern-kernels/1", "toolchain": "stub", "arch": "sm_90", "modules": modules}


# ---------------------------------------------------------------- building blocks


def _ptr(name: str) -> dict[str, str]:
    return {"name": name, "kind": "ptr"}


def _int(name: str) -> dict[str, str]:
    return {"name": name, "kind": "int"}


def _wiring_types(args: list[dict[str, Any]]) -> list[str]:
    """The contract type of each wiring (pointer wirings forward ptr args / scratch / null)."""
    out = []
    for w in args:
        if "scratch" in w or "null" in w or ("arg" in w and "type" not in w):
            out.append("p")
        elif "f32" in w:
            out.append("f32")
        elif "i32" in w or w.get("type") == "i32":
            out.append("i32")
        elif "i64" in w or w.get("type") == "i64":
            out.append("i64")
        else:
            raise AssertionError(f"wiring {w} has no contract type")  # a bug in this generator
    return out


class Builder:
    """Accumulates modules, buffers, states, ops and program calls into one manifest object."""

    def __init__(self, abi: KernelAbi, carveout: int | None = None) -> None:
        self.abi = abi
        self.carveout = carveout  # `carveout` of every kernel launch (None: not written)
        self.used_modules: set[str] = set()
        self.buffers: dict[str, Any] = {}
        self.states: dict[str, Any] = {}
        self.ops: dict[str, Any] = {}

    def launch(self, entry: str, grid: list[Any], block: list[Any], args: list[dict[str, Any]],
               shared_mem: Any = 0, pdl: bool = False) -> dict[str, Any]:
        """A kernel launch of `entry`, its params from kernels.json; checks the wiring against the contract.
        `pdl`: launch with programmatic dependent launch (only entries of PDL_ENTRIES)."""
        if entry not in self.abi.entries:
            raise GenError(f"{self.abi.source} has no entry {entry!r} (expected in module "
                           f"{KERNEL_SIGNATURES[entry][0]!r}), which these options use; rebuild with "
                           "tools/build_kernels.py")
        module, params = self.abi.entries[entry]
        types = KERNEL_SIGNATURES[entry][1]
        got = _wiring_types(args)
        assert got == list(types), f"{entry}: wiring types {got} != contract {types}"  # a bug in this generator
        assert not pdl or entry in PDL_ENTRIES, f"{entry} does not wait for its predecessor: never pdl"
        self.used_modules.add(module)
        out = {"module": module, "entry": entry, "grid": grid, "block": block, "shared_mem": shared_mem,
               "params": params, "args": args}
        if pdl:
            out["pdl"] = True
        if self.carveout is not None:
            out["carveout"] = self.carveout
        return out

    def op(self, name: str, args: list[dict[str, str]], launches: list[dict[str, Any]],
           scratch: dict[str, Any] | None = None) -> None:
        op: dict[str, Any] = {"args": args, "launches": launches}
        if scratch:
            op["scratch"] = scratch
        self.ops[name] = op

    def buffer(self, name: str, kind: str, dtype: str, shape: list[Any], bind: list[dict[str, Any]] | None = None,
               placement: str | None = None) -> None:
        buf: dict[str, Any] = {"kind": kind, "dtype": dtype, "shape": shape}
        if bind is not None:
            buf["bind"] = bind
        if placement is not None:
            buf["placement"] = placement
        self.buffers[name] = buf


def _call(op: str, **args: Any) -> dict[str, Any]:
    return {"op": op, "args": args}


def pages_of(layer: int) -> dict[str, str]:
    """The page-id bound of layer `layer`'s attention: the pages of its KV state's reserved range."""
    return {"pages_of": f"kv.{layer}"}


# ---------------------------------------------------------------- the manifest


def build_manifest(cfg: Qwen3Config, abi: KernelAbi, opts: GenOptions, config_digest: str = "") -> dict[str, Any]:
    """The Qwen3 manifest object (with its digest). Raises GenError for inconsistent options."""
    if opts.max_context > cfg.max_position_embeddings:
        raise GenError(f"max_context (--max-context) {opts.max_context} exceeds max_position_embeddings "
                       f"{cfg.max_position_embeddings}")
    if opts.split_tokens < 1:
        raise GenError(f"split_tokens (--decode-split-tokens) {opts.split_tokens}: the minimum context tokens per decode "
                       "split must be >= 1")
    if opts.split_tokens % opts.page_tokens:
        raise GenError(f"split_tokens (--decode-split-tokens) {opts.split_tokens} is not a multiple of page_tokens "
                       f"{opts.page_tokens}")
    if not 1 <= opts.chunk_max <= opts.max_context:
        raise GenError(f"chunk_max (--chunk-max) {opts.chunk_max} must lie in [1, max_context {opts.max_context}]")
    H, D, Hq, Hkv, I, V = cfg.hidden, cfg.head_dim, cfg.q_heads, cfg.kv_heads, cfg.intermediate, cfg.vocab
    q_dim, kv_dim = Hq * D, Hkv * D
    qkv_dim = q_dim + 2 * kv_dim
    max_pos = opts.max_context
    page_tokens = opts.page_tokens
    pages_per_seq = -(-opts.max_context // page_tokens)
    if opts.decode not in ("gemv", "gemm"):
        raise GenError(f"decode (--decode) {opts.decode!r}: use 'gemv' (M = 1 GEMVs) or 'gemm' (cuBLASLt)")
    if opts.m1_gemv and opts.decode != "gemm":
        raise GenError("--m1-gemv is an option of --decode gemm (the gemv decode has its own fused GEMVs)")
    if opts.gemv not in ("v1", "v2"):
        raise GenError(f"gemv (--gemv) {opts.gemv!r}: use 'v1' or 'v2'")
    if opts.gemv == "v2" and opts.decode != "gemv":
        raise GenError("--gemv v2 is a wiring of --decode gemv")
    if not 32 <= opts.gemv_threads_per_sm <= 2048:
        raise GenError(f"gemv_threads_per_sm (--gemv-threads-per-sm) {opts.gemv_threads_per_sm}: use 32..2048 (threads an "
                       "SM holds)")
    if opts.prefill_rope not in ("warp", "block"):
        raise GenError(f"prefill_rope (--prefill-rope) {opts.prefill_rope!r}: use 'warp' or 'block'")
    if opts.prefill_attn not in (*PREFILL_ATTN, "auto"):
        raise GenError(f"prefill_attn (--prefill-attn) {opts.prefill_attn!r}: use 'auto' or one of "
                       f"{', '.join(map(repr, PREFILL_ATTN))}")
    if opts.prefill_attn == "wg" and cfg.head_dim not in PREFILL_WG_HEAD_DIMS:
        raise GenError(f"prefill_attn (--prefill-attn) 'wg': head_dim {cfg.head_dim} is not one of {PREFILL_WG_HEAD_DIMS} "
                       "(kern_attn_prefill_wg's compiled widths); use 'r32' or 'auto'")
    if opts.decode_attn not in DECODE_ATTN:
        raise GenError(f"decode_attn (--decode-attn) {opts.decode_attn!r}: use one of {', '.join(map(repr, DECODE_ATTN))}")
    if cfg.head_dim > 256:  # DEC_MAX_D of kernels-src/attention.cu: every decode partial entry writes nothing past it
        raise GenError(f"decode_attn {opts.decode_attn!r}: head_dim {cfg.head_dim} > 256 (the decode partial's limit)")
    if opts.decode_attn in EARLY_PARTIALS and cfg.head_dim > EARLY_PARTIALS[opts.decode_attn][2]:
        entry, _, max_d = EARLY_PARTIALS[opts.decode_attn]
        raise GenError(f"decode_attn {opts.decode_attn!r}: head_dim {cfg.head_dim} > {max_d} ({entry}'s limit)")
    if cfg.head_dim % 16 or cfg.head_dim > 128:  # PF_MAX_D; the mma.sync tiles (docs/kernels.md "Attention limits")
        raise GenError(f"head_dim {cfg.head_dim}: kern_attn_prefill needs a multiple of 16 and at most 128")
    if opts.sms < 1:
        raise GenError(f"sms (--sms) {opts.sms}: the target GPU's multiprocessor count must be >= 1")
    if opts.decode_splits < 0:
        raise GenError(f"decode_splits (--decode-splits) {opts.decode_splits}: use >= 1, or 0 for the automatic count")
    if opts.carveout is not None and not 0 <= opts.carveout <= 100:
        raise GenError(f"carveout (--carveout) {opts.carveout}: a percent of the maximum shared memory, 0..100 (None: write "
                       "none; the CLI's --carveout -1)")
    if opts.decode == "gemv" and opts.seqs_max != 1:
        raise GenError(f"decode (--decode) 'gemv' computes one row (bs = 1) but seqs_max is {opts.seqs_max}: use --decode gemm")
    num_splits = decode_num_splits(cfg, opts)
    prefill_attn = opts.prefill_attn
    if prefill_attn == "auto":
        prefill_attn = "wg" if cfg.head_dim in PREFILL_WG_HEAD_DIMS else "r32"
    argmax_chunk = -(-V // opts.argmax_chunks)
    scale = 1.0 / (D ** 0.5)
    b = Builder(abi, opts.carveout)

    # ---- buffers: caller inputs and outputs
    b.buffer("token_ids", "input", "i32", ["tokens"])
    b.buffer("positions", "input", "i32", ["tokens"])
    b.buffer("slot_mapping", "input", "i32", ["tokens"])
    b.buffer("block_table", "input", "i32", ["seqs", pages_per_seq])
    b.buffer("seq_lens", "input", "i32", ["seqs"])
    b.buffer("cu_seqlens_q", "input", "i32", ["seqs + 1"])
    b.buffer("next_token", "output", "i64", ["seqs"])
    # written by kern_decode_advance at (position + 1) % ring_len; host-mapped so the caller reads it
    # without a copy once the step's event has completed (docs/caller.md "Decode on the device")
    b.buffer("token_ring", "output", "i64", ["seqs", opts.ring_len], placement="host")
    # ---- workspace (one layer's activations; `residual` is the residual stream)
    b.buffer("residual", "workspace", "bf16", ["tokens", H])
    b.buffer("hidden", "workspace", "bf16", ["tokens", H])  # o / down projection output (the delta)
    b.buffer("normed", "workspace", "bf16", ["tokens", H])
    b.buffer("qkv", "workspace", "bf16", ["tokens", qkv_dim])
    b.buffer("q", "workspace", "bf16", ["tokens", q_dim])
    b.buffer("attn_out", "workspace", "bf16", ["tokens", q_dim])
    b.buffer("gate_up", "workspace", "bf16", ["tokens", 2 * I])
    b.buffer("act", "workspace", "bf16", ["tokens", I])
    b.buffer("logits", "workspace", "bf16", ["seqs", V])
    # ---- weights
    b.buffer("embed", "weight", "bf16", [V, H], [{"tensor": "model.embed_tokens.weight"}])
    if not cfg.tied:
        b.buffer("lm_head", "weight", "bf16", [V, H], [{"tensor": "lm_head.weight"}])
    b.buffer("final_norm", "weight", "bf16", [H], [{"tensor": "model.norm.weight"}])
    b.buffer("rope", "weight", "f32", [max_pos, D], [{"derived": True}])
    for layer in range(cfg.layers):
        p = f"model.layers.{layer}."
        b.buffer(f"ln_in.{layer}", "weight", "bf16", [H], [{"tensor": p + "input_layernorm.weight"}])
        b.buffer(f"w_qkv.{layer}", "weight", "bf16", [qkv_dim, H], [
            {"tensor": p + "self_attn.q_proj.weight"}, {"tensor": p + "self_attn.k_proj.weight"},
            {"tensor": p + "self_attn.v_proj.weight"}])
        b.buffer(f"q_norm.{layer}", "weight", "bf16", [D], [{"tensor": p + "self_attn.q_norm.weight"}])
        b.buffer(f"k_norm.{layer}", "weight", "bf16", [D], [{"tensor": p + "self_attn.k_norm.weight"}])
        b.buffer(f"w_o.{layer}", "weight", "bf16", [H, q_dim], [{"tensor": p + "self_attn.o_proj.weight"}])
        b.buffer(f"ln_post.{layer}", "weight", "bf16", [H], [{"tensor": p + "post_attention_layernorm.weight"}])
        b.buffer(f"w_gate_up.{layer}", "weight", "bf16", [2 * I, H], [
            {"tensor": p + "mlp.gate_proj.weight"}, {"tensor": p + "mlp.up_proj.weight"}])
        b.buffer(f"w_down.{layer}", "weight", "bf16", [H, I], [{"tensor": p + "mlp.down_proj.weight"}])
        b.states[f"kv.{layer}"] = {"kind": "paged", "bytes_per_token": 2 * kv_dim * 2, "page_tokens": page_tokens}

    # ---- ops
    tokens_i32 = {"expr": "tokens", "type": "i32"}
    pdl_small = opts.pdl_small_launches
    b.op("rope_table", [_ptr("table")], [b.launch(
        "kern_rope_table", [max_pos, 1, 1], [D // 2, 1, 1],
        [{"arg": "table"}, {"i32": max_pos}, {"i32": D}, {"f32": cfg.rope_theta}])])
    b.op("embed", [_ptr("table"), _ptr("ids"), _ptr("out")], [b.launch(
        "kern_embed_gather", ["tokens", 1, 1], [256, 1, 1],
        [{"arg": "table"}, {"arg": "ids"}, {"arg": "out"}, tokens_i32, {"i32": H}, {"i32": V}], pdl=pdl_small)])
    b.op("rmsnorm", [_ptr("residual"), _ptr("w"), _ptr("out")], [b.launch(
        "kern_add_rmsnorm", ["tokens", 1, 1], [256, 1, 1],
        [{"arg": "residual"}, {"null": 8}, {"arg": "w"}, {"arg": "out"}, tokens_i32, {"i32": H}, {"f32": cfg.eps}])])
    b.op("add_rmsnorm", [_ptr("residual"), _ptr("delta"), _ptr("w"), _ptr("out")], [b.launch(
        "kern_add_rmsnorm", ["tokens", 1, 1], [256, 1, 1],
        [{"arg": "residual"}, {"arg": "delta"}, {"arg": "w"}, {"arg": "out"}, tokens_i32, {"i32": H},
         {"f32": cfg.eps}])])
    # `num_pages` (int): the page-id bound of the attention kernels and the slot bound of the K/V writes, passed
    # as {"pages_of": "kv.<layer>"} (the pages of that state's reserved range, resolved by the runtime at load;
    # docs/manifest.md "Programs")
    num_pages_i32 = {"arg": "num_pages", "type": "i32"}
    rope_args = [{"arg": "qkv"}, {"arg": "q_norm"}, {"arg": "k_norm"}, {"arg": "rope"}, {"arg": "positions"},
                 {"arg": "slots"}, {"arg": "q_out"}, {"arg": "kv"}, tokens_i32, {"i32": Hq}, {"i32": Hkv},
                 {"i32": D}, {"i32": page_tokens}, {"i32": max_pos}, num_pages_i32, {"f32": cfg.eps}]
    rope_block = b.launch("kern_qk_norm_rope_kv", ["tokens", Hq + Hkv, 1], [D, 1, 1], rope_args, pdl=pdl_small)
    if opts.prefill_rope == "warp" and D % 64 == 0 and D <= 256 and opts.chunk_max > 1:
        # one token (decode, and 1-token chunks): the block entry; longer chunks: the warp entry (same results)
        rope_warp = b.launch("kern_qk_norm_rope_kv_warp", ["tokens", -(-(Hq + Hkv) // rope_warp_heads(D)), 1],
                             [256, 1, 1], rope_args, pdl=pdl_small)
        rope_block["when"] = {"tokens": [1, 1]}
        rope_warp["when"] = {"tokens": [2, opts.chunk_max]}
        rope_launches = [rope_block, rope_warp]
        prefill_rope = "warp"
    else:  # --prefill-rope block, a head_dim the warp entry does not take, or no chunk of 2 tokens
        rope_launches = [rope_block]
        prefill_rope = "block"
    b.op("qk_norm_rope_kv",
         [_ptr("qkv"), _ptr("q_norm"), _ptr("k_norm"), _ptr("rope"), _ptr("positions"), _ptr("slots"),
          _ptr("q_out"), _ptr("kv"), _int("num_pages")], rope_launches)
    prefill_entry, prefill_rows, prefill_smem, prefill_threads = PREFILL_ATTN[prefill_attn]
    b.op("attn_prefill",
         [_ptr("q"), _ptr("kv"), _ptr("block_table"), _ptr("cu_seqlens_q"), _ptr("seq_lens"), _ptr("out"),
          _int("num_pages")],
         [b.launch(prefill_entry, [f"cdiv(tokens, {prefill_rows_per_block(prefill_rows, Hq // Hkv)})", Hkv, "seqs"],
                   [prefill_threads, 1, 1],
                   [{"arg": "q"}, {"arg": "kv"}, {"arg": "block_table"}, {"arg": "cu_seqlens_q"}, {"arg": "seq_lens"},
                    {"arg": "out"}, {"i32": Hq}, {"i32": Hkv}, {"i32": D}, {"i32": page_tokens},
                    {"i32": pages_per_seq}, num_pages_i32, {"f32": scale}], shared_mem=prefill_smem)])
    early = opts.decode_attn in EARLY_PARTIALS  # the early entry's contract, on 4 or 8 warps
    partial, partial_threads, _ = EARLY_PARTIALS.get(opts.decode_attn) or (
        "kern_attn_decode_partial_fast" if opts.gemv == "v2" else "kern_attn_decode_partial", 128, 256)
    slots = [_ptr("slots")] if early else []
    b.op("attn_decode",
         [_ptr("q"), _ptr("kv"), _ptr("block_table"), _ptr("seq_lens"), *slots, _ptr("out"), _int("num_pages")],
         [b.launch(partial, [Hkv, num_splits, "seqs"], [partial_threads, 1, 1],
                   [{"arg": "q"}, {"arg": "kv"}, {"arg": "block_table"}, {"arg": "seq_lens"},
                    *([{"arg": "slots"}] if early else []),
                    {"scratch": "part_out"}, {"scratch": "part_ml"}, {"i32": Hq}, {"i32": Hkv}, {"i32": D},
                    {"i32": page_tokens}, {"i32": pages_per_seq}, num_pages_i32, {"i32": opts.split_tokens},
                    {"i32": num_splits}, {"f32": scale}], pdl=opts.pdl),
          b.launch("kern_attn_decode_reduce", [Hq, "seqs", 1], [D, 1, 1],
                   [{"scratch": "part_out"}, {"scratch": "part_ml"}, {"arg": "seq_lens"}, {"arg": "out"},
                    {"i32": Hq}, {"i32": D}, {"i32": opts.split_tokens}, {"i32": num_splits}], pdl=opts.pdl)],
         scratch={"part_out": f"seqs * {Hq * num_splits * D * 4}", "part_ml": f"seqs * {Hq * num_splits * 2 * 4}"})
    b.op("silu_mul", [_ptr("gate_up"), _ptr("out")], [b.launch(
        "kern_silu_mul", ["tokens", -(-I // 1024), 1], [256, 1, 1],
        [{"arg": "gate_up"}, {"arg": "out"}, tokens_i32, {"i32": I}])])
    pins = {(n, k): dict(algo) for n, k, algo in opts.algos}
    decode_pins = {(n, k): dict(algo) for n, k, algo in opts.decode_algos}

    def gemm_op(n: int, k: int, decode: bool = False) -> str:
        """The op of an (n, k) projection. Prefill: `gemm_<n>x<k>` with the pinned batch-invariant algorithm for
        every M (tools/pick_algos.py; what lets a cached prefix resume at any token). Decode (M = 1, nothing
        cached from it): `gemm_m1_<n>x<k>` with the fastest M = 1 algorithm (split-K allowed) when the pins
        file has one - a prefill pin (no split-K) is 1.9x slower there (measured: 4B `--decode gemm` 6.98 vs
        3.66 ms/token). Otherwise `gemm`: cuBLASLt's heuristic per M."""
        if decode and opts.m1_gemv:
            return gemv_m1_op(n, k)
        table, prefix = (decode_pins, "gemm_m1") if decode else (pins, "gemm")
        name = f"{prefix}_{n}x{k}" if (n, k) in table else "gemm"
        if name not in b.ops:
            def launch(**extra: Any) -> dict[str, Any]:
                return {"extern": "cublaslt_bf16_tn",
                        "args": [{"arg": "a"}, {"arg": "w"}, {"arg": "c"}, {"arg": "m", "type": "i64"},
                                 {"arg": "n", "type": "i64"}, {"arg": "k", "type": "i64"}], **extra}

            if (n, k) not in table:
                launches = [launch()]
            elif not decode:
                launches = [launch(algo=table[(n, k)])]
            else:  # the decode program runs at tokens = 1 only; the rest of the tokens range stays on the heuristic,
                # so the M = 1 pin (split-K: workspace grows with M) is checked at load where it is used
                launches = [launch(when={"tokens": [1, 1]}, algo=table[(n, k)])]
                if opts.chunk_max > 1:
                    launches.append(launch(when={"tokens": [2, opts.chunk_max]}))
            b.op(name, [_ptr("a"), _ptr("w"), _ptr("c"), _int("m"), _int("n"), _int("k")], launches)
        return name

    def gemv_m1_op(n: int, k: int) -> str:
        """`--m1-gemv`: the decode projection (n, k) as `gemv_m1_<n>x<k>`, kern_gemv_rows at tokens = 1 (c = W a,
        docs/kernels-gemv.md "Rows entries") and cuBLASLt's heuristic for the rest of the tokens range (never
        used by the decode program, which runs at tokens = 1)."""
        name = f"gemv_m1_{n}x{k}"
        if name not in b.ops:
            gemv = _rows_launch(b, "kern_gemv_rows", -(-n // 4), k,
                                [{"arg": "w"}, {"arg": "a"}, {"arg": "c"}, {"i32": n}, {"i32": k}], opts)
            launches = [{**gemv, "when": {"tokens": [1, 1]}}]
            if opts.chunk_max > 1:
                launches.append({"extern": "cublaslt_bf16_tn", "when": {"tokens": [2, opts.chunk_max]},
                                 "args": [{"arg": "a"}, {"arg": "w"}, {"arg": "c"}, {"arg": "m", "type": "i64"},
                                          {"arg": "n", "type": "i64"}, {"arg": "k", "type": "i64"}]})
            b.op(name, [_ptr("a"), _ptr("w"), _ptr("c"), _int("m"), _int("n"), _int("k")], launches)
        return name

    b.op("argmax", [_ptr("logits"), _ptr("out")],
         [b.launch("kern_argmax_partial", [opts.argmax_chunks, "seqs", 1], [256, 1, 1],
                   [{"arg": "logits"}, {"i32": V}, {"i32": argmax_chunk}, {"scratch": "part_val"},
                    {"scratch": "part_idx"}, {"i32": opts.argmax_chunks}], pdl=pdl_small),
          b.launch("kern_argmax_final", ["seqs", 1, 1], [256, 1, 1],
                   [{"scratch": "part_val"}, {"scratch": "part_idx"}, {"i32": opts.argmax_chunks}, {"arg": "out"}],
                   pdl=pdl_small)],
         scratch={"part_val": f"seqs * {opts.argmax_chunks * 4}", "part_idx": f"seqs * {opts.argmax_chunks * 4}"})

    # ---- programs
    def layer_calls(layer: int, decode: bool) -> list[dict[str, Any]]:
        calls = []
        if layer == 0:
            calls.append(_call("rmsnorm", residual="residual", w="ln_in.0", out="normed"))
        else:
            calls.append(_call("add_rmsnorm", residual="residual", delta="hidden", w=f"ln_in.{layer}", out="normed"))
        calls.append(_call(gemm_op(qkv_dim, H, decode), a="normed", w=f"w_qkv.{layer}", c="qkv", m="tokens", n=qkv_dim, k=H))
        if decode:
            calls += decode_attention_calls(layer, opts.decode_attn)
        else:
            calls.append(qk_norm_rope_kv_call(layer))
            if layer == cfg.layers - 1:
                return calls  # prefill fills the KV cache only: the last layer's attention output is never read
            calls.append(_call("attn_prefill", q="q", kv=f"kv.{layer}", block_table="block_table",
                               cu_seqlens_q="cu_seqlens_q", seq_lens="seq_lens", out="attn_out",
                               num_pages=pages_of(layer)))
        calls += [
            _call(gemm_op(H, q_dim, decode), a="attn_out", w=f"w_o.{layer}", c="hidden", m="tokens", n=H, k=q_dim),
            _call("add_rmsnorm", residual="residual", delta="hidden", w=f"ln_post.{layer}", out="normed"),
            _call(gemm_op(2 * I, H, decode), a="normed", w=f"w_gate_up.{layer}", c="gate_up", m="tokens", n=2 * I, k=H),
            _call("silu_mul", gate_up="gate_up", out="act"),
            _call(gemm_op(H, I, decode), a="act", w=f"w_down.{layer}", c="hidden", m="tokens", n=H, k=I),
        ]
        return calls

    embed_call = _call("embed", table="embed", ids="token_ids", out="residual")
    prefill = [embed_call] + [c for layer in range(cfg.layers) for c in layer_calls(layer, decode=False)]
    decode_advance_op(b, opts, pages_per_seq)
    if opts.decode == "gemv":
        if opts.gemv == "v2":
            decode_gemv_v2_ops(b, cfg, opts)
            decode = [embed_call] + decode_gemv_calls(cfg, "v2", opts.decode_attn)
        else:
            decode_gemv_ops(b, cfg, opts)
            decode = [embed_call] + decode_gemv_calls(cfg, "v1", opts.decode_attn)
    else:
        decode = [embed_call] + [c for layer in range(cfg.layers) for c in layer_calls(layer, decode=True)]
        decode += [
            _call("add_rmsnorm", residual="residual", delta="hidden", w="final_norm", out="normed"),
            # lm_head: the tied embedding matrix is read in place (no copy); m = seqs (one row per sequence)
            _call(gemm_op(V, H, True), a="normed", w="embed" if cfg.tied else "lm_head", c="logits", m="seqs", n=V, k=H),
            _call("argmax", logits="logits", out="next_token"),
        ]
    decode.append(decode_advance_call())
    programs = {
        "load": {"kind": "once", "calls": [_call("rope_table", table="rope")]},
        "prefill": {"kind": "run", "calls": prefill},
        "decode": {"kind": "run", "graph": True, "calls": decode},
    }

    manifest: dict[str, Any] = {
        "format": FORMAT,
        "name": opts.name,
        "meta": {
            "generator": GENERATOR, "generator_version": GENERATOR_VERSION, "family": "qwen3",
            "config_sha256": config_digest,
            "model": {"hidden": H, "layers": cfg.layers, "q_heads": Hq, "kv_heads": Hkv, "head_dim": D,
                      "intermediate": I, "vocab": V, "tied": cfg.tied, "rope_theta": cfg.rope_theta, "eps": cfg.eps},
            "caller": {"contract": "qwen3-chunked-prefill/1", "page_tokens": page_tokens,
                       "pages_per_seq": pages_per_seq, "max_context": opts.max_context, "chunk_max": opts.chunk_max,
                       "decode": opts.decode, **({"decode_gemv": opts.gemv} if opts.gemv != "v1" else {}),
                       "decode_split_tokens": opts.split_tokens, "decode_splits": num_splits,
                       "decode_attention": opts.decode_attn,
                       "prefill_attention": prefill_attn, "prefill_rope": prefill_rope,
                       "decode_advance": {"ring": "token_ring", "ring_len": opts.ring_len}},
            **({"cublaslt_pins": dict(opts.algos_source)} if opts.algos else {}),
        },
        "vars": {"tokens": {"min": 1, "max": opts.chunk_max}, "seqs": {"min": 1, "max": opts.seqs_max}},
        "modules": {m: abi.modules[m] for m in sorted(b.used_modules)},
        "buffers": b.buffers,
        "states": b.states,
        "ops": b.ops,
        "programs": programs,
    }
    # A pins file none of whose pins this model uses is a mistake (another model's, or another TP degree's): its
    # stamp would land in meta.cublaslt_pins with nothing of it applied.
    if (opts.algos or opts.decode_algos) and not any(op.startswith("gemm_") for op in b.ops):
        shapes = {(qkv_dim, H), (H, q_dim), (2 * I, H), (H, I)}
        pinned = {(n, k) for n, k, _ in opts.algos}
        if opts.decode == "gemm":
            shapes.add((V, H))
            pinned |= {(n, k) for n, k, _ in opts.decode_algos}
        have = (f"they pin {', '.join(f'{n}x{k}' for n, k in sorted(pinned))}" if pinned else
                "the file has decode pins only (--decode gemm uses them)")
        raise GenError(f"the cuBLASLt pins (--algos) match none of this model's GEMM shapes "
                       f"({', '.join(f'{n}x{k}' for n, k in sorted(shapes))}); {have}: pick pins for this model with "
                       "tools/pick_algos.py")
    # Every prefill projection pinned: each row of a chunk is computed alike whatever the chunk (the other
    # prefill kernels are row-wise, kern_attn_prefill walks keys in fixed 64-token tiles from position 0), so a
    # caller may resume a cached prefix at any token (kern_run.prefix_cache).
    if {(qkv_dim, H), (H, q_dim), (2 * I, H), (H, I)} <= set(pins):
        manifest["meta"]["caller"]["prefill_batch_invariant"] = True
    manifest["digest"] = manifest_digest(manifest)
    return manifest


# ---------------------------------------------------------------- decode: M = 1 GEMVs and the device-side step


def _gemv_launch(b: Builder, entry: str, n: int, k: int, args: list[dict[str, Any]], opts: GenOptions,
                 tail: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """One kern_gemv_* launch (docs/kernels-gemv.md "Launch"): block 512, grid min(n, 2 * SMs), dynamic shared
    memory 16 * cdiv(k, 8) bytes (x staged as bf16). Raises GenError off the fast path's preconditions."""
    if k % 8:
        raise GenError(f"{entry}: k = {k} is not a multiple of 8 (the GEMV's vector path needs it); use --decode gemm")
    per_sm = max(1, opts.gemv_threads_per_sm // 512)
    return b.launch(entry, [min(n, per_sm * opts.sms), 1, 1], [512, 1, 1], args + [{"i32": n}, {"i32": k}, *tail],
                    shared_mem=16 * -(-k // 8), pdl=opts.pdl)


def decode_gemv_ops(b: Builder, cfg: Qwen3Config, opts: GenOptions) -> None:
    """The decode projections as M = 1 GEMV ops, one op per shape (n and k are launch constants):
    `gemv_qkv` / `gemv_gate_up` / `gemv_lm_head`: RMSNorm(residual) prologue -> y;
    `gemv_o`: residual += W x; `gemv_down`: residual += W (silu(gate) * up). Outputs never alias inputs."""
    H, Hq, D, I, V = cfg.hidden, cfg.q_heads, cfg.head_dim, cfg.intermediate, cfg.vocab
    norm_args = [_ptr("w"), _ptr("residual"), _ptr("norm_w"), _ptr("y")]
    norm_wiring = [{"arg": "w"}, {"arg": "residual"}, {"arg": "norm_w"}, {"arg": "y"}]
    for name, n in (("gemv_qkv", (Hq + 2 * cfg.kv_heads) * D), ("gemv_gate_up", 2 * I), ("gemv_lm_head", V)):
        b.op(name, norm_args, [_gemv_launch(b, "kern_gemv_rmsnorm", n, H, norm_wiring, opts, ({"f32": cfg.eps},))])
    b.op("gemv_o", [_ptr("w"), _ptr("x"), _ptr("residual")], [_gemv_launch(
        b, "kern_gemv_residual", H, Hq * D, [{"arg": "w"}, {"arg": "x"}, {"arg": "residual"}], opts)])
    b.op("gemv_down", [_ptr("w"), _ptr("gate_up"), _ptr("residual")], [_gemv_launch(
        b, "kern_gemv_silu_residual", H, I, [{"arg": "w"}, {"arg": "gate_up"}, {"arg": "residual"}], opts)])


def qk_norm_rope_kv_call(layer: int) -> dict[str, Any]:
    """Layer `layer`'s q/k RMSNorm + RoPE + K/V write (prefill and decode alike): `qkv` -> `q` and the cache."""
    return _call("qk_norm_rope_kv", qkv="qkv", q_norm=f"q_norm.{layer}", k_norm=f"k_norm.{layer}", rope="rope",
                 positions="positions", slots="slot_mapping", q_out="q", kv=f"kv.{layer}", num_pages=pages_of(layer))


def decode_attention_calls(layer: int, attn: str) -> list[dict[str, Any]]:
    """A decode layer's attention after the qkv projection (which writes `qkv`), writing `attn_out`:
    qk_norm_rope_kv (q to `q`, K/V to the cache) and attn_decode (`early` also passes slot_mapping: the row its
    partial kernel reloads after the PDL wait)."""
    slots = {"slots": "slot_mapping"} if attn in EARLY_PARTIALS else {}
    return [qk_norm_rope_kv_call(layer),
            _call("attn_decode", q="q", kv=f"kv.{layer}", block_table="block_table", seq_lens="seq_lens", **slots,
                  out="attn_out", num_pages=pages_of(layer))]


def decode_gemv_calls(cfg: Qwen3Config, gemv: str = "v1", attn: str = "split") -> list[dict[str, Any]]:
    """The decode call table after the embedding (which writes `residual`): per layer qkv, the attention
    (decode_attention_calls), o, then the MLP, then the lm_head GEMV with the final norm folded in and the
    two-stage argmax.
    The MLP is `gemv_gate_up` + `gemv_down` (SiLU*mul in the down prologue, v1) or `gemv_gate_up_act` +
    `gemv_down_act` (SwiGLU in the gate_up epilogue, writing `act`, v2)."""
    calls: list[dict[str, Any]] = []
    for layer in range(cfg.layers):
        if gemv == "v2":
            mlp = [_call("gemv_gate_up_act", w=f"w_gate_up.{layer}", residual="residual",
                         norm_w=f"ln_post.{layer}", y="act"),
                   _call("gemv_down_act", w=f"w_down.{layer}", x="act", residual="residual")]
        else:
            mlp = [_call("gemv_gate_up", w=f"w_gate_up.{layer}", residual="residual", norm_w=f"ln_post.{layer}",
                         y="gate_up"),
                   _call("gemv_down", w=f"w_down.{layer}", gate_up="gate_up", residual="residual")]
        calls += [
            _call("gemv_qkv", w=f"w_qkv.{layer}", residual="residual", norm_w=f"ln_in.{layer}", y="qkv"),
            *decode_attention_calls(layer, attn),
            _call("gemv_o", w=f"w_o.{layer}", x="attn_out", residual="residual"),
            *mlp,
        ]
    calls += [
        # lm_head: the tied embedding matrix is read in place (no copy)
        _call("gemv_lm_head", w="embed" if cfg.tied else "lm_head", residual="residual", norm_w="final_norm",
              y="logits"),
        _call("argmax", logits="logits", out="next_token"),
    ]
    return calls


def _rows_launch(b: Builder, entry: str, n_groups: int, k: int, args: list[dict[str, Any]], opts: GenOptions,
                 tail: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """One rows-family launch (docs/kernels-gemv.md "Rows entries"; 4 W rows per group, 2 chunk steps of 16
    bytes per batch): block = whole warps covering ceil(k / 8) chunks in as few batches as 512 threads allow
    (k = 2560: 160, 4096: 256, 9728: 320), grid = min(groups, resident blocks per SM * SMs) (at <= 64
    registers a SM holds 1024 threads), dynamic shared memory 16 * ceil(k / 8). `n_groups` is the entry's
    group count (rows / 4; swiglu: outputs / 2)."""
    if k % 8:
        raise GenError(f"{entry}: k = {k} is not a multiple of 8 (the GEMV's vector path needs it); use --gemv v1")
    k8 = -(-k // 8)
    batches = -(-k8 // (2 * 512))
    block = min(1024, max(32, -(-(-(-k8 // (2 * batches))) // 32) * 32))
    grid = min(n_groups, max(1, opts.gemv_threads_per_sm // block) * opts.sms)
    return b.launch(entry, [grid, 1, 1], [block, 1, 1], args + [*tail], shared_mem=16 * k8, pdl=opts.pdl)


def decode_gemv_v2_ops(b: Builder, cfg: Qwen3Config, opts: GenOptions) -> None:
    """`--gemv v2`: the decode projections on the rows family and the SwiGLU epilogue (docs/perf.md):
    `gemv_qkv`: kern_gemv_rows_rmsnorm; `gemv_gate_up_act`: kern_gemv_rmsnorm_swiglu (RMSNorm prologue, gate
    and up rows of one output in one block, writes act = bf16(silu(gate)) * up); `gemv_o` / `gemv_down_act`:
    kern_gemv_rows_residual (residual += W x, x = attn_out / act); `gemv_lm_head`: kern_gemv_rmsnorm as in v1
    (already at the bandwidth floor)."""
    H, Hq, D, I, V = cfg.hidden, cfg.q_heads, cfg.head_dim, cfg.intermediate, cfg.vocab
    norm_args = [_ptr("w"), _ptr("residual"), _ptr("norm_w"), _ptr("y")]
    norm_wiring = [{"arg": "w"}, {"arg": "residual"}, {"arg": "norm_w"}, {"arg": "y"}]
    eps = ({"f32": cfg.eps},)
    qkv_n = (Hq + 2 * cfg.kv_heads) * D
    b.op("gemv_qkv", norm_args, [_rows_launch(b, "kern_gemv_rows_rmsnorm", -(-qkv_n // 4), H,
                                              norm_wiring + [{"i32": qkv_n}, {"i32": H}], opts, eps)])
    b.op("gemv_gate_up_act", norm_args, [_rows_launch(b, "kern_gemv_rmsnorm_swiglu", -(-I // 2), H,
                                                      norm_wiring + [{"i32": I}, {"i32": H}], opts, eps)])
    b.op("gemv_lm_head", norm_args, [_gemv_launch(b, "kern_gemv_rmsnorm", V, H, norm_wiring, opts, eps)])
    res_args = [_ptr("w"), _ptr("x"), _ptr("residual")]
    res_wiring = [{"arg": "w"}, {"arg": "x"}, {"arg": "residual"}]
    b.op("gemv_o", res_args, [_rows_launch(b, "kern_gemv_rows_residual", -(-H // 4), Hq * D,
                                           res_wiring + [{"i32": H}, {"i32": Hq * D}], opts)])
    b.op("gemv_down_act", res_args, [_rows_launch(b, "kern_gemv_rows_residual", -(-H // 4), I,
                                                  res_wiring + [{"i32": H}, {"i32": I}], opts)])


def decode_advance_op(b: Builder, opts: GenOptions, pages_per_seq: int) -> None:
    """`decode_advance`: kern_decode_advance (kernels-src/step.cu, docs/kernels-step.md), one block of 32
    threads looping over the sequences; writes the next step's token_ids / positions / seq_lens /
    slot_mapping and the token ring from next_token and the block table."""
    b.op("decode_advance",
         [_ptr("next_token"), _ptr("token_ids"), _ptr("positions"), _ptr("seq_lens"), _ptr("slot_mapping"),
          _ptr("block_table"), _ptr("ring")],
         [b.launch("kern_decode_advance", [1, 1, 1], [32, 1, 1],
                   [{"arg": "next_token"}, {"arg": "token_ids"}, {"arg": "positions"}, {"arg": "seq_lens"},
                    {"arg": "slot_mapping"}, {"arg": "block_table"}, {"arg": "ring"},
                    {"expr": "seqs", "type": "i32"}, {"i32": opts.page_tokens}, {"i32": pages_per_seq},
                    {"i32": opts.max_context}, {"i32": opts.ring_len}], pdl=opts.pdl_small_launches)])


def decode_advance_call() -> dict[str, Any]:
    return _call("decode_advance", next_token="next_token", token_ids="token_ids", positions="positions",
                 seq_lens="seq_lens", slot_mapping="slot_mapping", block_table="block_table", ring="token_ring")


def manifest_digest(manifest: dict[str, Any]) -> str:
    """docs/manifest.md "Digest": sha256 of the canonical JSON without the digest key."""
    body = {k: v for k, v in manifest.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()).hexdigest()


def dumps(manifest: dict[str, Any]) -> str:
    """The committed text form: sorted keys, one-space indent, trailing newline (deterministic)."""
    return json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def verify_with_kern_manifest(text: str) -> str:
    """Verify with kern_manifest if it offers a verifier; returns a note. Raises its errors on faults."""
    try:
        import kern_manifest
    except ImportError:
        return "kern_manifest not importable: not verified"
    parse = getattr(kern_manifest, "parse_manifest", None)
    verify = getattr(kern_manifest, "verify", None)
    if parse is None or verify is None:
        return "kern_manifest has no parse_manifest/verify yet: not verified"
    verify(parse(text))
    return "verified with kern_manifest"


def read_json_file(path: Path) -> tuple[Any, str]:
    """(the parsed JSON, the text) of a file. Raises GenError naming the file when it cannot be read, is not a
    regular file of at most 64 MiB (kern_manifest.read_regular_file), is not UTF-8 or is not (usable) JSON:
    `{path}: {kern_manifest.json_text_fault's reason}`."""
    try:
        text = read_regular_file(path, MAX_MANIFEST_BYTES, "expected a JSON file", "a JSON file").decode("utf-8")
        return json.loads(text), text
    except OSError as exc:
        raise GenError(f"{path}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # not UTF-8, invalid JSON, too deep, past the digit limit
        reason = json_text_fault(exc)
        if reason is None:
            raise
        raise GenError(f"{path}: {reason}") from None


def config_from_args(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The config.json object of --config or --shape and the sha256 of its text. Raises GenError (--config)."""
    if args.config:
        cfg, text = read_json_file(Path(args.config))
        return cfg, hashlib.sha256(text.encode()).hexdigest()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from make_checkpoint import SHAPES, config_json

    cfg = config_json(SHAPES[args.shape])
    text = json.dumps(cfg, indent=2, sort_keys=True) + "\n"  # what make_checkpoint writes
    return cfg, hashlib.sha256(text.encode()).hexdigest()


def config_source(args: argparse.Namespace) -> str:
    """How Qwen3Config.from_json's errors name the config: the --config path or the --shape."""
    return str(args.config) if args.config else f"--shape {args.shape}"


def default_max_context(args: argparse.Namespace, cfg: Qwen3Config) -> int:
    """--max-context, else 4096 for the tiny shape, else min(40960, max_position_embeddings). Raises GenError for
    a value below 1."""
    if args.max_context is None:
        return 4096 if args.shape == "tiny" else min(40960, cfg.max_position_embeddings)
    if args.max_context < 1:
        raise GenError(f"--max-context {args.max_context}: positions per sequence must be >= 1")
    return args.max_context


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate a Qwen3 kern manifest.")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", type=Path, help="a Qwen3 config.json")
    src.add_argument("--shape", choices=["qwen3-4b", "qwen3-0.6b", "tiny"], help="a make_checkpoint.py shape")
    parser.add_argument("--kernels", type=Path, default=Path("kernels/kernels.json"), help="kernels.json (the ABI)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--name", help="manifest name (default: the shape, or the config's directory name)")
    parser.add_argument("--chunk-max", type=int, default=512, help="tokens var max (largest prefill chunk)")
    parser.add_argument("--max-context", type=int, default=None, help="positions per sequence (default 40960; tiny 4096)")
    parser.add_argument("--decode", choices=["gemv", "gemm"], default="gemv",
                        help="decode projections: M = 1 GEMVs with fused norms/residuals (default) or cuBLASLt")
    parser.add_argument("--m1-gemv", action="store_true",
                        help="with --decode gemm: the decode projections run kern_gemv_rows (M = 1) instead of cuBLASLt")
    parser.add_argument("--gemv", choices=["v1", "v2"], default="v1",
                        help="decode GEMV wiring (--decode gemv): v1 warp-per-row entries (default); v2 rows family, "
                             "SwiGLU epilogue on gate_up (and kern_attn_decode_partial_fast with --decode-attn split)")
    parser.add_argument("--decode-attn", choices=list(DECODE_ATTN), default="wide",
                        help="decode attention: qk_norm_rope_kv + partial + reduce launches with the partial's reads "
                             "before its PDL wait on 8 warps of 4 token slots (wide, default; head_dim <= 128), the "
                             "same on 4 warps of 8 (early), or with the fast or plain partial (split)")
    parser.add_argument("--prefill-attn", choices=[*PREFILL_ATTN, "auto"], default=GenOptions.prefill_attn,
                        help="prefill attention: kern_attn_prefill_wg on Hopper wgmma (wg; head_dim 64 or 128), "
                             "kern_attn_prefill_r32 (r32) or kern_attn_prefill (r16) on mma.sync; identical rows; "
                             "auto: wg where the head_dim allows, else r32 (default %(default)s)")
    parser.add_argument("--prefill-rope", choices=["warp", "block"], default=GenOptions.prefill_rope,
                        help="q/k norm + rope + K/V write for chunks of 2 or more tokens: head_dim / 8 lanes (warp) "
                             "or one block (block) per token and head; identical rows (default %(default)s)")
    parser.add_argument("--carveout", type=int, default=GenOptions.carveout,
                        help="preferred shared-memory carveout (percent, 0..100) on every kernel launch (default "
                             "%(default)s; -1: none, the driver's choice)")
    parser.add_argument("--decode-splits", type=int, default=0, help="decode attention splits (default: auto)")
    parser.add_argument("--decode-split-tokens", type=int, default=GenOptions.split_tokens,
                        help="decode attention: minimum context tokens per split (a multiple of the page size)")
    parser.add_argument("--sms", type=int, default=132, help="SM count of the target GPU (default 132: H200)")
    parser.add_argument("--gemv-threads-per-sm", type=int, default=1024,
                        help="decode GEMV grids fill at most this many threads per SM (default 1024)")
    parser.add_argument("--no-pdl", action="store_true", help="no programmatic dependent launch in decode")
    parser.add_argument("--no-pdl-small", action="store_true",
                        help="PDL on the GEMVs and decode attention only, not on embed / qk_norm_rope_kv / argmax / "
                             "decode_advance")
    parser.add_argument("--algos", type=Path, help="cuBLASLt pins of tools/pick_algos.py: batch-invariant prefill "
                                                   "GEMMs (chunk 1 and chunk 512 compute every row alike)")
    parser.add_argument("--no-verify", action="store_true", help="skip verification with kern_manifest")
    args = parser.parse_args(argv)
    try:
        raw_cfg, cfg_digest = config_from_args(args)
        cfg = Qwen3Config.from_json(raw_cfg, config_source(args))
        abi = KernelAbi.from_json(read_json_file(args.kernels)[0], str(args.kernels))
        name = args.name or args.shape or Path(args.config).resolve().parent.name
        max_context = default_max_context(args, cfg)
        algos, decode_algos, algos_source = load_algos(args.algos, args.chunk_max) if args.algos else ((), (), ())
        opts = GenOptions(name, args.chunk_max, max_context, decode=args.decode, m1_gemv=args.m1_gemv,
                          decode_splits=args.decode_splits,
                          split_tokens=args.decode_split_tokens,
                          sms=args.sms, pdl=not args.no_pdl, pdl_small=not args.no_pdl_small, gemv=args.gemv,
                          gemv_threads_per_sm=args.gemv_threads_per_sm, decode_attn=args.decode_attn,
                          prefill_attn=args.prefill_attn, prefill_rope=args.prefill_rope,
                          carveout=None if args.carveout == -1 else args.carveout,
                          algos=algos, decode_algos=decode_algos,
                          algos_source=algos_source)
        manifest = build_manifest(cfg, abi, opts, cfg_digest)
        if args.out.is_dir():
            raise GenError(f"--out {args.out} is a directory")
    except (GenError, OSError) as exc:
        print(f"gen_qwen3: {exc}", file=sys.stderr)
        return 1
    text = dumps(manifest)
    note = "not verified (--no-verify)"
    if not args.no_verify:
        try:
            note = verify_with_kern_manifest(text)
        except Exception as exc:  # noqa: BLE001 - kern_manifest's errors name the JSON path; print them whole
            print(f"gen_qwen3: the generated manifest does not verify: {exc}", file=sys.stderr)
            return 1
    try:
        if args.out.parent.exists() and not args.out.parent.is_dir():
            raise NotADirectoryError(20, os.strerror(20), str(args.out.parent))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_files({args.out: text})
    except OSError as exc:
        print(f"gen_qwen3: --out {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    n_decode = sum(1 for _ in manifest["programs"]["decode"]["calls"])
    print(f"gen_qwen3: wrote {args.out} ({len(text)} bytes, digest {manifest['digest'][:12]}, "
          f"decode {n_decode} calls, {note})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
