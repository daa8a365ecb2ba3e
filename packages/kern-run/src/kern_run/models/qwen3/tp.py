"""Tensor-parallel Qwen3 manifests: one manifest per rank of topology group `tp` (docs/manifest.md "Tensor
parallelism").

Each rank's manifest is build_manifest's manifest of the rank's *shard* (q / kv heads and the MLP width divided by
the group size; hidden size, vocab and everything else unchanged; decode through the cuBLASLt path, `decode
"gemm"`), then:

- binds pick the rank's slice of the full checkpoint tensors: column-parallel `w_qkv` (rows of q, k, v for the
  rank's heads) and `w_gate_up` (rows of gate and up); row-parallel `w_o` and `w_down` (a column range: the inputs
  the rank's heads / MLP slice produce); embedding, norms and the tied lm_head replicated;
- after each row-parallel projection (`o` and `down`, output `hidden`) an in-place `nccl_allreduce_bf16` of
  `hidden` over `tp` (count `tokens * hidden`), so every rank continues with the full sum;
- `topology: {"tp": {"size": N}}`, name `<name>-tp<N>` on every rank, `meta.tp = {group, size, rank, shard}`.

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
from .config import Qwen3Config
from .jsonio import manifest_digest
from .manifest import build_manifest
from .options import BuildOptions

GROUP = "tp"


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


def allreduce_op() -> dict[str, Any]:
    """`allreduce(x, count)`: in-place bf16 sum of `count` elements of x over group `tp`."""
    return {"args": [{"name": "x", "kind": "ptr"}, {"name": "count", "kind": "int"}],
            "launches": [{"extern": "nccl_allreduce_bf16",
                          "args": [{"arg": "x"}, {"arg": "x"}, {"arg": "count", "type": "i64"}, {"rank": GROUP}]}]}


def with_allreduces(calls: list[dict[str, Any]], hidden: int) -> list[dict[str, Any]]:
    """Insert an allreduce of `hidden` after every projection that writes it (the row-parallel o and down: a
    cuBLASLt `gemm*` op or, with m1_gemv, a `gemv_m1_*` op)."""
    out = []
    for c in calls:
        out.append(c)
        if c.get("op", "").startswith(("gemm", "gemv_m1")) and c["args"].get("c") == "hidden":
            out.append({"op": "allreduce", "args": {"x": "hidden", "count": f"{c['args']['m']} * {hidden}"}})
    return out


def _shared_manifest(cfg: Qwen3Config, abi: KernelAbi, opts: BuildOptions, tp: int,
                     config_digest: str) -> dict[str, Any]:
    """Everything the ranks share: the shard's manifest with the topology, the allreduces and the full model."""
    base = build_manifest(shard_config(cfg, tp), abi,
                          dataclasses.replace(opts, name=f"{opts.name}-tp{tp}", decode="gemm"), config_digest)
    base.pop("digest", None)
    base["topology"] = {GROUP: {"size": tp}}
    base["ops"]["allreduce"] = allreduce_op()
    for prog in base["programs"].values():
        if prog.get("kind", "run") == "run":
            prog["calls"] = with_allreduces(prog["calls"], cfg.hidden)
    base["meta"]["model"] = {**base["meta"]["model"], "q_heads": cfg.q_heads, "kv_heads": cfg.kv_heads,
                             "intermediate": cfg.intermediate}
    return base


def build_rank_manifests(cfg: Qwen3Config, abi: KernelAbi, opts: BuildOptions, tp: int,
                         config_digest: str = "") -> list[dict[str, Any]]:
    """One manifest per rank (with digests), rank order. The decode is always the cuBLASLt one (`opts.decode`
    is replaced by "gemm"). Raises ManifestBuildError for a `tp` below 2 or one the shape cannot be split by,
    `batch_invariant` (not built for ranks), and build_manifest's refusals."""
    if tp < 2:
        raise ManifestBuildError(f"--tp {tp}: tensor parallelism needs at least 2 ranks (tp 1 is a plain build)")
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
                                     "intermediate": shard.intermediate}}
        for layer in range(cfg.layers):
            for buf, bind in rank_binds(cfg, tp, rank, layer).items():
                m["buffers"][buf]["bind"] = bind
        m["digest"] = manifest_digest(m)
        out.append(m)
    return out


def rank_path(out: Path, tp: int, rank: int) -> Path:
    """Rank `rank`'s file beside the TP=1 manifest path `out`: `<stem>-tp<N>-r<rank>.json` (what `kern run --tp
    N --manifest out` looks for)."""
    return out.with_name(f"{out.stem}-tp{tp}-r{rank}.json")
