"""build_manifest: config -> validated options -> buffers, weight binds, ops, programs -> the manifest object
(docs/manifest.md), with its digest. Deterministic: the same config, kernels.json and options give the same
bytes under `dumps`."""

from __future__ import annotations

import dataclasses
from typing import Any

from ...errors import ManifestBuildError
from .abi import KernelAbi
from .attention import add_decode_attention_op, add_prefill_attention_op, add_qk_norm_rope_kv_op
from .binds import add_weights_and_states
from .buffers import add_io_buffers, add_workspace
from .builder import Builder
from .config import Qwen3Config
from .gemm import Projections
from .gemv import add_gemv_v1_ops, add_gemv_v2_ops
from .jsonio import manifest_digest
from .ops import (add_argmax_op, add_decode_advance_op, add_decode_advance_packed_op, add_norm_ops,
                  add_rope_table_op, add_silu_mul_op)
from .options import BuildOptions, Plan, validate
from .programs import build_programs
from .sampling import add_sampling_ops, sampling_meta

FORMAT = "kern-manifest/1"
# meta.generator: the builder's stable name (the committed manifests carry it; tools/gen_qwen3.py is still its
# command-line spelling), and the version of its wiring
GENERATOR = "tools/gen_qwen3.py"
GENERATOR_VERSION = 2


def _add_ops(b: Builder, plan: Plan) -> None:
    """Every op but the projections, which Projections declares as the programs call them."""
    add_rope_table_op(b, plan)
    add_norm_ops(b, plan)
    add_qk_norm_rope_kv_op(b, plan)
    add_prefill_attention_op(b, plan)
    add_decode_attention_op(b, plan)
    add_silu_mul_op(b, plan)
    if plan.opts.sampler == "gpu":
        add_sampling_ops(b, plan)
        add_decode_advance_packed_op(b, plan)
    else:
        add_argmax_op(b, plan)
        add_decode_advance_op(b, plan)
    if plan.opts.decode == "gemv":
        (add_gemv_v2_ops if plan.opts.gemv == "v2" else add_gemv_v1_ops)(b, plan)


def _meta(plan: Plan, config_digest: str, gemms: Projections) -> dict[str, Any]:
    """meta: the builder, the family ("qwen3" or "llama"), the model's fields (with rope_scaling for llama3 RoPE)
    and the caller contract's geometry (docs/caller.md; one contract for both families); `gemms`: which pins the
    batch-invariant decode's projections run on (Projections.unproven, .on_invariant_decode, .on_prefill)."""
    cfg, opts = plan.cfg, plan.opts
    caller = {"contract": "qwen3-chunked-prefill/1", "page_tokens": opts.page_tokens,
              "pages_per_seq": plan.pages_per_seq, "max_context": opts.max_context, "chunk_max": opts.chunk_max,
              "decode": opts.decode, **({"decode_gemv": opts.gemv} if opts.gemv != "v1" else {}),
              "decode_split_tokens": opts.split_tokens, "decode_splits": plan.num_splits,
              "decode_attention": opts.decode_attn,
              **({"decode_attention_batch": opts.decode_attn_batch}
                 if opts.seqs_max > 1 and opts.decode_attn_batch not in ("", opts.decode_attn) else {}),
              "prefill_attention": plan.prefill_attn,
              "prefill_rope": plan.prefill_rope,
              "decode_advance": {"ring": "token_ring", "ring_len": opts.ring_len}}
    # the sampler's buffers and next_token / ring packing; absent with --sampler argmax (plain token ids), which
    # keeps that manifest byte for byte the pre-sampler builder's
    if opts.sampler == "gpu":
        caller["sampling"] = sampling_meta(plan)
    # Every prefill projection pinned: each row of a chunk is computed alike whatever the chunk (the other
    # prefill kernels are row-wise, kern_attn_prefill walks keys in fixed 64-token tiles from position 0), so a
    # caller may resume a cached prefix at any token (kern_run.prefix_cache).
    if plan.prefill_shapes <= {(n, k) for n, k, _ in opts.algos}:
        caller["prefill_batch_invariant"] = True
    # --batch-invariant: every decode call runs the same launches at every row count, so a row's tokens do not
    # depend on its bucket (docs/caller.md "Batch-invariant decode")
    if opts.batch_invariant:
        caller["decode_batch_invariant"] = True
        if gemms.unproven:
            caller["decode_batch_invariant_unproven"] = sorted(gemms.unproven)
        # which decode shapes run an invariant decode pin (split-K allowed) and which their prefill pin; absent
        # when none has an invariant decode pin (the manifests built before those pins, byte for byte)
        if gemms.on_invariant_decode:
            caller["decode_batch_invariant_pins"] = {"invariant_decode": sorted(gemms.on_invariant_decode),
                                                     "prefill": sorted(gemms.on_prefill)}
        if gemms.on_skinny:  # --invariant-proj skinny: the decode shapes on kern_gemm_skinny (absent otherwise)
            caller["decode_batch_invariant_skinny"] = sorted(gemms.on_skinny)
    model = {"hidden": cfg.hidden, "layers": cfg.layers, "q_heads": cfg.q_heads, "kv_heads": cfg.kv_heads,
             "head_dim": cfg.head_dim, "intermediate": cfg.intermediate, "vocab": cfg.vocab, "tied": cfg.tied,
             "rope_theta": cfg.rope_theta, "eps": cfg.eps}
    if cfg.rope_scaling is not None:  # absent for plain RoPE (the Qwen3 manifests stay byte for byte as they were)
        model["rope_scaling"] = {"rope_type": "llama3", **dataclasses.asdict(cfg.rope_scaling)}
    return {
        "generator": GENERATOR, "generator_version": GENERATOR_VERSION, "family": cfg.family.name,
        "config_sha256": config_digest,
        "model": model,
        "caller": caller,
        **({"cublaslt_pins": dict(opts.algos_source)} if opts.algos or opts.invariant_decode_algos else {}),
    }


def _check_pins_used(b: Builder, plan: Plan) -> None:
    """A pins file none of whose pins this model uses is a mistake (another model's, or another TP degree's): its
    stamp would land in meta.cublaslt_pins with nothing of it applied."""
    opts = plan.opts
    if not (opts.algos or opts.decode_algos or opts.invariant_decode_algos) or any(
            op.startswith("gemm_") for op in b.ops):
        return
    shapes = set(plan.prefill_shapes)
    pinned = {(n, k) for n, k, _ in opts.algos}
    if opts.decode == "gemm":
        shapes.add((plan.cfg.vocab, plan.cfg.hidden))
        pinned |= {(n, k) for n, k, _ in (*opts.decode_algos, *opts.invariant_decode_algos)}
    have = (f"they pin {', '.join(f'{n}x{k}' for n, k in sorted(pinned))}" if pinned else
            "the file has decode pins only (--decode gemm uses them)")
    raise ManifestBuildError(f"the cuBLASLt pins (--algos) match none of this model's GEMM shapes "
                             f"({', '.join(f'{n}x{k}' for n, k in sorted(shapes))}); {have}: pick pins for this model "
                             "with tools/pick_algos.py")


def build_manifest(cfg: Qwen3Config, abi: KernelAbi, opts: BuildOptions, config_digest: str = "") -> dict[str, Any]:
    """The Qwen3 manifest object (JSON-ready dict, with its digest) of `cfg` wired against `abi`.
    `config_digest`: the sha256 of the config.json text, recorded in meta.config_sha256. Raises
    ManifestBuildError for options out of range or inconsistent with the config, a kernel entry kernels.json
    lacks, or pins that match none of the model's GEMM shapes."""
    plan = validate(cfg, opts)
    b = Builder(abi, opts.carveout)
    add_io_buffers(b, plan)
    add_workspace(b, plan)
    add_weights_and_states(b, plan)
    _add_ops(b, plan)
    gemms = Projections(b, plan)
    programs = build_programs(plan, gemms)
    manifest: dict[str, Any] = {
        "format": FORMAT, "name": opts.name, "meta": _meta(plan, config_digest, gemms),
        "vars": {"tokens": {"min": 1, "max": opts.chunk_max}, "seqs": {"min": 1, "max": opts.seqs_max}},
        "modules": {m: abi.modules[m] for m in sorted(b.used_modules)},
        "buffers": b.buffers, "states": b.states, "ops": b.ops, "programs": programs,
    }
    _check_pins_used(b, plan)
    manifest["digest"] = manifest_digest(manifest)
    return manifest
