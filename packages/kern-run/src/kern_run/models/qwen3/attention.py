"""The attention ops: q/k RMSNorm (Qwen3; none for Llama) + RoPE + paged K/V write, chunked-prefill attention, split-K decode attention.

`num_pages` (int) is the page-id bound of the attention kernels and the slot bound of the K/V writes, passed as
{"pages_of": "kv.<layer>"} (the pages of that state's reserved range, resolved by the runtime at load;
docs/manifest.md "Programs").
"""

from __future__ import annotations

from typing import Any

from .builder import Builder, int_arg, ptr, tokens_i32
from .entries import (DECODE_TICKETS, EARLY_PARTIALS, FUSED_PARTIALS, PREFILL_ATTN, prefill_rows_per_block,
                      rope_warp_heads)
from .options import Plan

_NUM_PAGES = {"arg": "num_pages", "type": "i32"}


def rope_kv_op_name(plan: Plan) -> str:
    """The op of the q/k rope + K/V write: `qk_norm_rope_kv` (the family has a q/k norm) or `rope_kv` (Llama)."""
    return "qk_norm_rope_kv" if plan.cfg.family.qk_norm else "rope_kv"


def add_qk_norm_rope_kv_op(b: Builder, plan: Plan) -> None:
    """`qk_norm_rope_kv` (q_norm / k_norm args) or, for a family without a q/k norm, `rope_kv` (the kernels' norm
    weights wired null: no norm): qkv [tokens, q + 2 kv] -> q_out [tokens, q] and the K/V cache. One token (decode,
    and 1-token chunks): the block entry (a block of head_dim threads per token and head); longer chunks, when
    plan.prefill_rope is "warp": the warp entry (same results). `--batch-invariant`: plan.prefill_rope's entry at
    every token count (one launch, no `when`)."""
    cfg, opts = plan.cfg, plan.opts
    Hq, Hkv, D = cfg.q_heads, cfg.kv_heads, cfg.head_dim
    norms: list[dict[str, Any]] = ([{"arg": "q_norm"}, {"arg": "k_norm"}] if cfg.family.qk_norm
                                   else [{"null": 8}, {"null": 8}])
    args = [{"arg": "qkv"}, *norms, {"arg": "rope"}, {"arg": "positions"},
            {"arg": "slots"}, {"arg": "q_out"}, {"arg": "kv"}, tokens_i32(), {"i32": Hq}, {"i32": Hkv},
            {"i32": D}, {"i32": opts.page_tokens}, {"i32": opts.max_context}, dict(_NUM_PAGES), {"f32": cfg.eps}]
    pdl = opts.pdl_small_launches
    launches = [b.launch("kern_qk_norm_rope_kv", ["tokens", Hq + Hkv, 1], [D, 1, 1], args, pdl=pdl)]
    if plan.prefill_rope == "warp":
        warp = b.launch("kern_qk_norm_rope_kv_warp", ["tokens", -(-(Hq + Hkv) // rope_warp_heads(D)), 1],
                        [256, 1, 1], args, pdl=pdl)
        if opts.batch_invariant:
            launches = [warp]
        else:
            launches[0]["when"] = {"tokens": [1, 1]}
            warp["when"] = {"tokens": [2, opts.chunk_max]}
            launches.append(warp)
    norm_args = [ptr("q_norm"), ptr("k_norm")] if cfg.family.qk_norm else []
    b.op(rope_kv_op_name(plan),
         [ptr("qkv"), *norm_args, ptr("rope"), ptr("positions"), ptr("slots"),
          ptr("q_out"), ptr("kv"), int_arg("num_pages")], launches)


def add_prefill_attention_op(b: Builder, plan: Plan) -> None:
    """`attn_prefill`: causal attention of a chunk's q rows over the paged cache, the plan's PREFILL_ATTN entry;
    grid (cdiv(tokens, rows per block), kv_heads, seqs)."""
    cfg, opts = plan.cfg, plan.opts
    Hq, Hkv, D = cfg.q_heads, cfg.kv_heads, cfg.head_dim
    entry, rows, smem, threads = PREFILL_ATTN[plan.prefill_attn]
    b.op("attn_prefill",
         [ptr("q"), ptr("kv"), ptr("block_table"), ptr("cu_seqlens_q"), ptr("seq_lens"), ptr("out"),
          int_arg("num_pages")],
         [b.launch(entry, [f"cdiv(tokens, {prefill_rows_per_block(rows, Hq // Hkv)})", Hkv, "seqs"],
                   [threads, 1, 1],
                   [{"arg": "q"}, {"arg": "kv"}, {"arg": "block_table"}, {"arg": "cu_seqlens_q"}, {"arg": "seq_lens"},
                    {"arg": "out"}, {"i32": Hq}, {"i32": Hkv}, {"i32": D}, {"i32": opts.page_tokens},
                    {"i32": plan.pages_per_seq}, dict(_NUM_PAGES), {"f32": 1.0 / (D ** 0.5)}], shared_mem=smem)])


def _decode_partial(plan: Plan) -> tuple[str, int, bool]:
    """(entry, threads per block, early contract) of the decode attention's partial launch."""
    attn = plan.opts.decode_attn
    if attn in EARLY_PARTIALS:
        entry, threads, _ = EARLY_PARTIALS[attn]
        return entry, threads, True
    return ("kern_attn_decode_partial_fast" if plan.opts.gemv == "v2" else "kern_attn_decode_partial"), 128, False


def decode_attention_fused(plan: Plan) -> bool:
    """Whether the plan's decode partials merge their own splits (FUSED_PARTIALS; validate() refuses a fused batch
    entry beside a non-fused decode_attn, so decode_attn decides): the attn_decode op then has no reduce launch
    and takes the DECODE_TICKETS state as its `tickets` argument."""
    return plan.opts.decode_attn in FUSED_PARTIALS


def add_decode_attention_op(b: Builder, plan: Plan) -> None:
    """`attn_decode`: one query row per sequence, split-K over the context: a partial launch of grid (kv_heads,
    num_splits, seqs) into scratch part_out (f32 [seqs, q_heads, splits, head_dim]) / part_ml (f32 max and sum),
    then a reduce launch. The early contract also passes slot_mapping (reloaded after the PDL wait). A fused
    partial (FUSED_PARTIALS; validate() refuses one beside a non-fused entry) has no reduce after it, and takes
    `tickets` (the DECODE_TICKETS state, declared here) and `out`."""
    cfg, opts = plan.cfg, plan.opts
    Hq, Hkv, D, splits = cfg.q_heads, cfg.kv_heads, cfg.head_dim, plan.num_splits
    partial, threads, early = _decode_partial(plan)
    slots: list[dict[str, Any]] = [{"arg": "slots"}] if early else []
    fused = decode_attention_fused(plan)

    def partial_launch(attn: str, entry: str, block: int) -> dict[str, Any]:
        merge = [{"arg": "tickets"}, {"arg": "out"}] if attn in FUSED_PARTIALS else []
        return b.launch(entry, [Hkv, splits, "seqs"], [block, 1, 1],
                        [{"arg": "q"}, {"arg": "kv"}, {"arg": "block_table"}, {"arg": "seq_lens"}, *slots,
                         {"scratch": "part_out"}, {"scratch": "part_ml"}, *merge, {"i32": Hq}, {"i32": Hkv},
                         {"i32": D}, {"i32": opts.page_tokens}, {"i32": plan.pages_per_seq}, dict(_NUM_PAGES),
                         {"i32": opts.split_tokens}, {"i32": splits}, {"f32": 1.0 / (D ** 0.5)}], pdl=opts.pdl)

    reduce = b.launch("kern_attn_decode_reduce", [Hq, "seqs", 1], [D, 1, 1],
                      [{"scratch": "part_out"}, {"scratch": "part_ml"}, {"arg": "seq_lens"}, {"arg": "out"},
                       {"i32": Hq}, {"i32": D}, {"i32": opts.split_tokens}, {"i32": splits}], pdl=opts.pdl)
    launches = [partial_launch(opts.decode_attn, partial, threads)]
    reduces = [] if fused else [reduce]
    batch = opts.decode_attn_batch
    if opts.seqs_max > 1 and batch and batch != opts.decode_attn:
        # steps of 2.. rows: the batch entry (same contract, same split rule, so a row's splits depend only on
        # its own context); one row keeps opts.decode_attn
        entry, block, _ = EARLY_PARTIALS[batch]
        one, many = {"seqs": [1, 1]}, {"seqs": [2, opts.seqs_max]}
        launches = [{**launches[0], "when": one}, {**partial_launch(batch, entry, block), "when": many}]
    if fused:
        b.states[DECODE_TICKETS] = {"kind": "fixed", "bytes": opts.seqs_max * Hkv * 4}
    b.op("attn_decode",
         [ptr("q"), ptr("kv"), ptr("block_table"), ptr("seq_lens"), *([ptr("slots")] if early else []),
          *([ptr("tickets")] if fused else []), ptr("out"), int_arg("num_pages")],
         [*launches, *reduces],
         scratch={"part_out": f"seqs * {Hq * splits * D * 4}", "part_ml": f"seqs * {Hq * splits * 2 * 4}"})
