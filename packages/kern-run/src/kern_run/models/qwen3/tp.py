"""Tensor-parallel Qwen3 manifests: one manifest per rank of topology group `tp` (docs/manifest.md "Tensor
parallelism").

Each rank's manifest is build_manifest's manifest of the rank's *shard* (q / kv heads and the MLP width divided by
the group size; hidden size, vocab and everything else unchanged), then:

- binds pick the rank's slice of the full checkpoint tensors: column-parallel `w_qkv` (rows of q, k, v for the
  rank's heads) and `w_gate_up` (rows of gate and up); row-parallel `w_o` and `w_down` (a column range: the inputs
  the rank's heads / MLP slice produce); embedding and norms replicated (Megatron's split of the attention and
  MLP);
- the lm_head (`--tp-lm-head vocab`, the default): vocabulary-parallel. Rank r's `lm_head` buffer [slice, hidden]
  binds the rows [w_r, w_r + slice) of `lm_head.weight` (tied embeddings: of `model.embed_tokens.weight`, whose
  full `embed` buffer stays for the embedding gather), slice = cdiv(vocab, N) rounded up to 8, w_r = min(r slice,
  vocab - slice) (allreduce.VocabSplit: the last rank's window ends at vocab, so a vocab not divisible by N
  leaves the last rank short in the columns it owns and no rank computes a padding row). The decode's lm_head
  (the GEMV `gemv_lm_head` at n = slice, or the cuBLASLt projection at n = slice) writes `lm_logits` [seqs,
  slice], then `allgather` (kern_allgather_bf16, one-shot over peer memory, status in `ar_status`) writes every
  rank's owned columns into the full `logits` [seqs, vocab] on every rank, and the sampler runs on every rank
  as before: each rank's decode_advance feeds its own next step, so every rank must draw the same token (the
  gathered logits are bit-identical across ranks). Prefill computes no logits. `--tp-lm-head replicated`: every
  rank reads the whole lm_head and computes all the logits, as before;
- prefill (and the cuBLASLt decode, `--decode gemm`): after each row-parallel projection (`o` and `down`, output
  `hidden`) an in-place all-reduce of `hidden` over `tp` (count `tokens * hidden`): kern's one-shot all-reduce
  over peer memory for messages up to `allreduce_oneshot_bytes`, `nccl_allreduce_bf16` above (allreduce.py);
- the GEMV decode (`--decode gemv`, the default; one row): the v2 projections with their fused RMSNorm / SwiGLU
  (`gemv_qkv`, `gemv_gate_up_act`, the lm_head) as at TP = 1; the row-parallel o and down on `kern_gemv_rows`
  into `hidden`, each followed by `allreduce_add` (one-shot: residual += the sum of every rank's partial, one
  launch), so a layer is 9 launches against TP = 1's 7, all in the decode's one graph (with
  `--allreduce-oneshot-bytes 0`: an NCCL all-reduce and `add_rmsnorm` instead of each `allreduce_add`, the
  comparison bench/decode.py --tp runs);
- `topology: {"tp": {"size": N}}`, name `<name>-tp<N>` on every rank, `meta.tp = {group, size, rank, shard,
  allreduce, lm_head}` (allreduce: the status buffer the caller zeroes and reads, what goes one-shot; lm_head:
  {"split": "replicated"} or {"split": "vocab", slice, window, columns, status, blocks, capacity, timeout_ns}).

The per-rank manifests differ only in binds and meta, so their *family digest* (`Manifest.family_digest`:
everything but binds, name and meta) is equal: that is what connect compares. The full digests differ.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from ...errors import ManifestBuildError
from .abi import KernelAbi
from .allreduce import (STATUS, OneShot, VocabSplit, add_allgather_op, add_allreduce_ops, allgather_call,
                        allreduce_add_call, allreduce_call, meta, oneshot_plan, vocab_split)
from .builder import Builder, call, ptr
from .config import Qwen3Config
from .gemm import Projections
from .gemv import rmsnorm_gemv_op, rows_launch
from .jsonio import manifest_digest
from .manifest import build_manifest
from .options import BuildOptions, validate

GROUP = "tp"
LM_HEAD_LAYOUTS = ("vocab", "replicated")


def shard_config(cfg: Qwen3Config, tp: int) -> Qwen3Config:
    """The per-rank shape: q heads, kv heads and intermediate divided by `tp`. Raises ManifestBuildError naming
    the config field when it is not divisible."""
    for what, n in (("num_attention_heads", cfg.q_heads), ("num_key_value_heads", cfg.kv_heads),
                    ("intermediate_size", cfg.intermediate)):
        if n % tp:
            raise ManifestBuildError(f"{what} {n} is not divisible by --tp {tp}")
    return dataclasses.replace(cfg, q_heads=cfg.q_heads // tp, kv_heads=cfg.kv_heads // tp,
                               intermediate=cfg.intermediate // tp)


def rank_binds(cfg: Qwen3Config, tp: int, rank: int, layer: int) -> dict[str, list[dict[str, Any]]]:
    """The sharded weight buffers' binds of one layer for `rank` (full-tensor shapes declared)."""
    H, D, I = cfg.hidden, cfg.head_dim, cfg.intermediate
    q, kv, i_ = cfg.q_heads * D // tp, cfg.kv_heads * D // tp, I // tp
    p = f"model.layers.{layer}."
    q_full, kv_full = cfg.q_heads * D, cfg.kv_heads * D

    def rows(name: str, per: int, full: list[int]) -> dict[str, Any]:
        return {"tensor": p + name, "rows": [rank * per, (rank + 1) * per], "shape": full}

    return {
        f"w_qkv.{layer}": [rows("self_attn.q_proj.weight", q, [q_full, H]),
                           rows("self_attn.k_proj.weight", kv, [kv_full, H]),
                           rows("self_attn.v_proj.weight", kv, [kv_full, H])],
        f"w_gate_up.{layer}": [rows("mlp.gate_proj.weight", i_, [I, H]), rows("mlp.up_proj.weight", i_, [I, H])],
        f"w_o.{layer}": [{"tensor": p + "self_attn.o_proj.weight", "cols": [rank * q, (rank + 1) * q],
                          "shape": [H, q_full]}],
        f"w_down.{layer}": [{"tensor": p + "mlp.down_proj.weight", "cols": [rank * i_, (rank + 1) * i_],
                             "shape": [H, I]}],
    }


def with_allreduces(calls: list[dict[str, Any]], hidden: int, plan: OneShot | None) -> list[dict[str, Any]]:
    """Insert an allreduce of `hidden` after every projection that writes it (the row-parallel o and down: a
    cuBLASLt `gemm*` op or, with m1_gemv, a `gemv_m1_*` op)."""
    out = []
    for c in calls:
        out.append(c)
        if c.get("op", "").startswith(("gemm", "gemv_m1")) and c["args"].get("c") == "hidden":
            out.append(allreduce_call("hidden", f"{c['args']['m']} * {hidden}", plan))
    return out


def _rows_op(b: Builder, opts: BuildOptions, n: int, k: int) -> str:
    """`gemv_rows_<n>x<k>(w, a, c)`: c = W a at M = 1 on kern_gemv_rows (the row-parallel projections' partials)."""
    name = f"gemv_rows_{n}x{k}"
    if name not in b.ops:
        launch = rows_launch(b, "kern_gemv_rows", -(-n // 4), k,
                             [{"arg": "w"}, {"arg": "a"}, {"arg": "c"}, {"i32": n}, {"i32": k}], opts)
        b.op(name, [ptr("w"), ptr("a"), ptr("c")], [launch])
    return name


def tp_gemv_decode(calls: list[dict[str, Any]], b: Builder, opts: BuildOptions, shard: Qwen3Config, hidden: int,
                   layers: int, plan: OneShot | None) -> list[dict[str, Any]]:
    """The GEMV decode's call table with the row-parallel projections split: `gemv_o` (residual += W_o attn_out) and
    `gemv_down_act` (residual += W_down act) become a kern_gemv_rows partial into `hidden` and `allreduce_add`
    (one-shot); with no one-shot `plan`, an NCCL `allreduce` of `hidden` and `add_rmsnorm` (residual += hidden;
    `normed`, which the GEMV decode never reads, gets the next norm's output)."""
    inputs = {"gemv_o": ("attn_out", shard.q_heads * shard.head_dim), "gemv_down_act": ("act", shard.intermediate)}
    out = []
    for c in calls:
        if c.get("op") not in inputs:
            out.append(c)
            continue
        x, k = inputs[c["op"]]
        assert c["args"]["x"] == x and c["args"]["residual"] == "residual", c  # a bug in this builder
        out.append(call(_rows_op(b, opts, hidden, k), w=c["args"]["w"], a=x, c="hidden"))
        if plan is not None:
            out.append(allreduce_add_call("hidden", "residual", f"seqs * {hidden}"))
            continue
        layer = int(c["args"]["w"].rsplit(".", 1)[1])
        after = (f"ln_post.{layer}" if c["op"] == "gemv_o" else
                 f"ln_in.{layer + 1}" if layer + 1 < layers else "final_norm")
        out.append(allreduce_call("hidden", f"seqs * {hidden}", None))
        out.append(call("add_rmsnorm", residual="residual", delta="hidden", w=after, out="normed"))
    return out


def lm_head_bind(cfg: Qwen3Config, split: VocabSplit, rank: int) -> list[dict[str, Any]]:
    """Rank `rank`'s `lm_head` bind: the rows of its window of the checkpoint's lm_head (tied: the embedding)."""
    w = split.window(rank)
    tensor = "model.embed_tokens.weight" if cfg.tied else "lm_head.weight"
    return [{"tensor": tensor, "rows": [w, w + split.slice], "shape": [cfg.vocab, cfg.hidden]}]


def vocab_parallel_lm_head(base: dict[str, Any], b: Builder, cfg: Qwen3Config, shard: Qwen3Config,
                           shard_opts: BuildOptions, tp: int) -> dict[str, Any]:
    """Rewrite the decode's lm_head of the shared manifest `base` to the rank's vocabulary slice and the all-gather
    of the logits (the module docstring); meta.tp.lm_head less the rank's window and columns. Raises
    ManifestBuildError (vocab_split) for a vocabulary too small to give every rank a column."""
    split = vocab_split(cfg.vocab, tp)
    V, H, n = cfg.vocab, cfg.hidden, split.slice
    base["buffers"]["lm_head"] = {"kind": "weight", "dtype": "bf16", "shape": [n, H],
                                  "bind": lm_head_bind(cfg, split, 0)}
    b.buffer("lm_logits", "workspace", "bf16", ["seqs", n])
    plan = add_allgather_op(b, GROUP, split, shard_opts.seqs_max, shard_opts.allreduce_timeout_ms, shard_opts.pdl)
    prog = base["programs"]["decode"]
    calls, old_ops = [], set()
    for c in prog["calls"]:
        if c["args"].get("y") == "logits" and c["op"] == "gemv_lm_head":  # the GEMV decode
            calls.append({**c, "args": {**c["args"], "w": "lm_head", "y": "lm_logits"}})
        elif c["args"].get("c") == "logits":  # the cuBLASLt decode (or --m1-gemv)
            old_ops.add(c["op"])
            op = Projections(b, validate(shard, shard_opts)).op(n, H, decode=True)
            calls.append(call(op, a=c["args"]["a"], w="lm_head", c="lm_logits", m="seqs", n=n, k=H))
        else:
            calls.append(c)
            continue
        calls.append(allgather_call("lm_logits", "logits", "seqs"))
    assert sum(c["op"] == "allgather" for c in calls) == 1, "no lm_head call into logits"  # a bug in this builder
    prog["calls"] = calls
    if "gemv_lm_head" in base["ops"]:  # the same launch at n = slice
        rmsnorm_gemv_op(b, "gemv_lm_head", n, H, shard_opts, ({"f32": cfg.eps},))
    used = {c["op"] for p in base["programs"].values() for c in p["calls"]}
    for op in old_ops - used - set(b.ops):  # a pinned (V, hidden) decode op nothing calls any more
        del base["ops"][op]
    return {"split": "vocab", "slice": n, "status": STATUS, "blocks": plan.blocks, "capacity": plan.capacity,
            "timeout_ns": plan.timeout_ns}


def _shared_manifest(cfg: Qwen3Config, abi: KernelAbi, opts: BuildOptions, tp: int,
                     config_digest: str) -> dict[str, Any]:
    """Everything the ranks share: the shard's manifest with the topology, the all-reduces and the full model."""
    gemv = opts.decode == "gemv"
    if gemv and opts.seqs_max > 1:
        raise ManifestBuildError(f"--tp {tp} with seqs_max (--seqs-max) {opts.seqs_max}: the tensor-parallel GEMV "
                                 "decode computes one row; use --decode gemm for batched tensor-parallel decode")
    shard = shard_config(cfg, tp)
    shard_opts = dataclasses.replace(opts, name=f"{opts.name}-tp{tp}", gemv="v2" if gemv else opts.gemv)
    base = build_manifest(shard, abi, shard_opts, config_digest)
    base.pop("digest", None)
    base["topology"] = {GROUP: {"size": tp}}
    b = Builder(abi, opts.carveout)
    plan, oneshot_tokens = oneshot_plan(GROUP, tp, cfg.hidden, opts.chunk_max, opts.allreduce_oneshot_bytes,
                                        opts.allreduce_blocks, opts.allreduce_timeout_ms)
    add_allreduce_ops(b, plan, GROUP, oneshot_tokens, opts.chunk_max, with_add=gemv, pdl=opts.pdl)
    for name, prog in base["programs"].items():
        if prog.get("kind", "run") != "run":
            continue
        if gemv and name == "decode":
            prog["calls"] = tp_gemv_decode(prog["calls"], b, shard_opts, shard, cfg.hidden, cfg.layers, plan)
        else:
            prog["calls"] = with_allreduces(prog["calls"], cfg.hidden, plan)
    if gemv:  # replaced by the row-parallel GEMVs and allreduce_add
        for op in ("gemv_o", "gemv_down_act"):
            del base["ops"][op]
    lm_head = {"split": "replicated"}
    if opts.tp_lm_head == "vocab":
        lm_head = vocab_parallel_lm_head(base, b, cfg, shard, shard_opts, tp)
    base["ops"].update(b.ops)
    base["buffers"].update(b.buffers)
    base["modules"] = {m: abi.modules[m] for m in sorted(set(base["modules"]) | b.used_modules)}
    base["meta"]["model"] = {**base["meta"]["model"], "q_heads": cfg.q_heads, "kv_heads": cfg.kv_heads,
                             "intermediate": cfg.intermediate}
    base["meta"]["tp_allreduce"] = meta(plan, oneshot_tokens, opts.allreduce_oneshot_bytes)
    base["meta"]["tp_lm_head"] = lm_head
    return base


def build_rank_manifests(cfg: Qwen3Config, abi: KernelAbi, opts: BuildOptions, tp: int,
                         config_digest: str = "") -> list[dict[str, Any]]:
    """One manifest per rank (with digests), rank order: the GEMV decode (`opts.decode` "gemv", bs = 1, the v2
    projections whatever `opts.gemv`) or the cuBLASLt one ("gemm"). Raises ManifestBuildError for a `tp` below 2
    or one the shape cannot be split by, the GEMV decode with seqs_max > 1, an all-reduce option out of range,
    `batch_invariant` (not built for ranks), a `tp_lm_head` other than "vocab" / "replicated", a vocabulary too
    small to split, and build_manifest's refusals."""
    if tp < 2:
        raise ManifestBuildError(f"--tp {tp}: tensor parallelism needs at least 2 ranks (tp 1 is a plain build)")
    if opts.tp_lm_head not in LM_HEAD_LAYOUTS:
        raise ManifestBuildError(f"tp_lm_head (--tp-lm-head) {opts.tp_lm_head!r}: one of {', '.join(LM_HEAD_LAYOUTS)}")
    if opts.batch_invariant:
        raise ManifestBuildError(f"--batch-invariant with --tp {tp}: the all-reduce's summation order depends on "
                                 "its element count (tokens x hidden), so tensor-parallel ranks are not built "
                                 "batch-invariant; use --tp 1")
    base = _shared_manifest(cfg, abi, opts, tp, config_digest)
    shard = shard_config(cfg, tp)
    out = []
    for rank in range(tp):
        m = copy.deepcopy(base)
        m["meta"]["tp"] = {"group": GROUP, "size": tp, "rank": rank,
                           "shard": {"q_heads": shard.q_heads, "kv_heads": shard.kv_heads,
                                     "intermediate": shard.intermediate},
                           "allreduce": m["meta"].pop("tp_allreduce"), "lm_head": m["meta"].pop("tp_lm_head")}
        for layer in range(cfg.layers):
            for buf, bind in rank_binds(cfg, tp, rank, layer).items():
                m["buffers"][buf]["bind"] = bind
        if opts.tp_lm_head == "vocab":
            split = vocab_split(cfg.vocab, tp)
            m["buffers"]["lm_head"]["bind"] = lm_head_bind(cfg, split, rank)
            m["meta"]["tp"]["lm_head"].update(window=[split.window(rank), split.window(rank) + split.slice],
                                              columns=list(split.owned(rank)))
        m["digest"] = manifest_digest(m)
        out.append(m)
    return out


def rank_path(out: Path, tp: int, rank: int) -> Path:
    """Rank `rank`'s file beside the TP=1 manifest path `out`: `<stem>-tp<N>-r<rank>.json` (what `kern run --tp
    N --manifest out` looks for)."""
    return out.with_name(f"{out.stem}-tp{tp}-r{rank}.json")
