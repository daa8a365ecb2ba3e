#!/usr/bin/env python3
"""Tensor-parallel Qwen3 manifests: one manifest per rank of topology group `tp` (docs/manifest.md
"Tensor parallelism").

Each rank's manifest is tools/gen_qwen3.py's manifest of the rank's *shard* (q / kv heads and the MLP
width divided by the group size; hidden size, vocab and everything else unchanged; decode through
the cuBLASLt path, `--decode gemm`), then:

- binds pick the rank's slice of the full checkpoint tensors:
  column-parallel `w_qkv` (rows of q, k, v for the rank's heads) and `w_gate_up` (rows of gate and up);
  row-parallel `w_o` and `w_down` (a column range: the inputs the rank's heads / MLP slice produce);
  embedding, norms and the tied lm_head replicated;
- after each row-parallel GEMM (`o` and `down`, output `hidden`) an in-place `nccl_allreduce_bf16` of
  `hidden` over `tp` (count `tokens * hidden`), so every rank continues with the full sum;
- `topology: {"tp": {"size": N}}`, name `<name>-tp<N>` on every rank, `meta.tp = {size, rank}`.

The per-rank manifests differ only in binds and meta, so their *family digest*
(`Manifest.family_digest`: everything but binds, name and meta) is equal: that is what connect compares.
The full digests differ.

Usage:
    python tools/gen_qwen3_tp.py --shape qwen3-4b --tp 2 --out-dir manifests     # qwen3-4b-tp2-r{0,1}.json
    python tools/gen_qwen3_tp.py --config DIR/config.json --name qwen3-tiny-en --tp 2 --out-dir manifests

Options: --config / --shape, --kernels, --out-dir, --name, --tp (>= 2, dividing the q / kv heads and the MLP
width), --chunk-max, --max-context (>= 1), --algos (pins of tools/pick_algos.py --tp N), --m1-gemv (the decode
projections on kern_gemv_rows instead of cuBLASLt at M = 1). Errors (exit 1, one
line on stderr): tools/gen_qwen3.py's (the config, kernels.json, options and pins file, named), a --tp the
shape cannot be split by, an --out-dir that is not a directory or cannot be written, a rank's manifest that does
not verify. Every rank is generated and verified before any file is written, and the files are renamed into
place together from temporary files, so an error leaves no rank's file half-written or newer than the others'.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_qwen3 as g  # noqa: E402  (the single-GPU generator: its wiring, its kernels contract)

GROUP = "tp"


def shard_config(cfg: g.Qwen3Config, tp: int) -> g.Qwen3Config:
    """The per-rank shape: q heads, kv heads and intermediate divided by `tp`. Raises GenError when not divisible."""
    for what, n in (("num_attention_heads", cfg.q_heads), ("num_key_value_heads", cfg.kv_heads),
                    ("intermediate_size", cfg.intermediate)):
        if n % tp:
            raise g.GenError(f"{what} {n} is not divisible by --tp {tp}")
    return dataclasses.replace(cfg, q_heads=cfg.q_heads // tp, kv_heads=cfg.kv_heads // tp,
                               intermediate=cfg.intermediate // tp)


def rank_binds(cfg: g.Qwen3Config, tp: int, rank: int, layer: int) -> dict[str, list[dict[str, Any]]]:
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
    cuBLASLt `gemm*` op or, with --m1-gemv, a `gemv_m1_*` op)."""
    out = []
    for c in calls:
        out.append(c)
        if c.get("op", "").startswith(("gemm", "gemv_m1")) and c["args"].get("c") == "hidden":
            out.append({"op": "allreduce", "args": {"x": "hidden", "count": f"{c['args']['m']} * {hidden}"}})
    return out


def build_rank_manifests(cfg: g.Qwen3Config, abi: g.KernelAbi, opts: g.GenOptions, tp: int,
                         config_digest: str = "") -> list[dict[str, Any]]:
    """One manifest per rank (with digests). Raises GenError."""
    if tp < 2:
        raise g.GenError(f"--tp {tp}: tensor parallelism needs at least 2 ranks (tp 1 is tools/gen_qwen3.py)")
    shard = shard_config(cfg, tp)
    fields = {f.name for f in dataclasses.fields(opts)}
    extra = {"decode": "gemm"} if "decode" in fields else {}  # the cuBLASLt decode: separate `hidden` deltas
    base = g.build_manifest(shard, abi, dataclasses.replace(opts, name=f"{opts.name}-tp{tp}", **extra), config_digest)
    base.pop("digest", None)
    base["topology"] = {GROUP: {"size": tp}}
    base["ops"]["allreduce"] = allreduce_op()
    for name, prog in base["programs"].items():
        if prog.get("kind", "run") == "run":
            prog["calls"] = with_allreduces(prog["calls"], cfg.hidden)
    model = base["meta"].get("model", {})
    base["meta"]["model"] = {**model, "q_heads": cfg.q_heads, "kv_heads": cfg.kv_heads, "intermediate": cfg.intermediate}
    out = []
    for rank in range(tp):
        m = copy.deepcopy(base)
        m["meta"]["tp"] = {"group": GROUP, "size": tp, "rank": rank,
                           "shard": {"q_heads": shard.q_heads, "kv_heads": shard.kv_heads,
                                     "intermediate": shard.intermediate}}
        for layer in range(cfg.layers):
            for buf, bind in rank_binds(cfg, tp, rank, layer).items():
                m["buffers"][buf]["bind"] = bind
        m["digest"] = g.manifest_digest(m)
        out.append(m)
    return out


def rank_path(out_dir: Path, name: str, tp: int, rank: int) -> Path:
    """`<out_dir>/<name>-tp<N>-r<rank>.json` (what `kern run --tp N` looks for beside the TP=1 manifest)."""
    return out_dir / f"{name}-tp{tp}-r{rank}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", type=Path, help="a Qwen3 config.json")
    src.add_argument("--shape", choices=["qwen3-4b", "qwen3-0.6b", "tiny"], help="a make_checkpoint.py shape")
    parser.add_argument("--kernels", type=Path, default=Path("kernels/kernels.json"))
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--name", help="base name (default: the shape or the config's directory)")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--chunk-max", type=int, default=512)
    parser.add_argument("--max-context", type=int, default=None)
    parser.add_argument("--algos", type=Path, help="cuBLASLt pins of tools/pick_algos.py (run with --tp N)")
    parser.add_argument("--m1-gemv", action="store_true",
                        help="the decode projections run kern_gemv_rows (M = 1) instead of cuBLASLt (gen_qwen3.py)")
    parser.add_argument("--prefill-attn", choices=[*g.PREFILL_ATTN, "auto"], default=g.GenOptions.prefill_attn,
                        help="prefill attention entry (gen_qwen3.py --prefill-attn; default %(default)s)")
    parser.add_argument("--prefill-rope", choices=["warp", "block"], default=g.GenOptions.prefill_rope,
                        help="q/k norm + rope entry for chunks of 2+ tokens (gen_qwen3.py; default %(default)s)")
    args = parser.parse_args(argv)
    try:
        raw_cfg, cfg_digest = g.config_from_args(args)
        cfg = g.Qwen3Config.from_json(raw_cfg, g.config_source(args))
        abi = g.KernelAbi.from_json(g.read_json_file(args.kernels)[0], str(args.kernels))
        name = args.name or args.shape or Path(args.config).resolve().parent.name
        max_context = g.default_max_context(args, cfg)
        algos, decode_algos, algos_source = g.load_algos(args.algos, args.chunk_max) if args.algos else ((), (), ())
        opts = g.GenOptions(name, args.chunk_max, max_context, algos=algos, decode_algos=decode_algos,
                            algos_source=algos_source, m1_gemv=args.m1_gemv, prefill_attn=args.prefill_attn,
                            prefill_rope=args.prefill_rope)
        manifests = build_rank_manifests(cfg, abi, opts, args.tp, cfg_digest)
        if args.out_dir.exists() and not args.out_dir.is_dir():
            raise g.GenError(f"--out-dir {args.out_dir} exists and is not a directory")
    except (g.GenError, OSError) as exc:
        print(f"gen_qwen3_tp: {exc}", file=sys.stderr)
        return 1
    texts = {}
    for rank, m in enumerate(manifests):  # every rank verified before any is written
        text = g.dumps(m)
        try:
            g.verify_with_kern_manifest(text)
        except Exception as exc:  # noqa: BLE001 - kern_manifest names the JSON path
            print(f"gen_qwen3_tp: rank {rank}'s manifest does not verify: {exc}", file=sys.stderr)
            return 1
        texts[rank_path(args.out_dir, name, args.tp, rank)] = text
    try:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        g.write_files(texts)  # all ranks or none
    except OSError as exc:
        print(f"gen_qwen3_tp: {exc.filename or args.out_dir}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    for (path, _), m in zip(texts.items(), manifests):
        print(f"gen_qwen3_tp: wrote {path} (digest {m['digest'][:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
