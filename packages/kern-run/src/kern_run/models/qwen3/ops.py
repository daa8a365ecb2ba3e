"""The row-wise ops every program shares: rope table, embedding, RMSNorms, SiLU-and-mul, two-stage argmax, and the
device-side decode step (`decode_advance` after the argmax, `decode_advance_packed` after the sampler). Launch
geometry per docs/kernels.md and docs/kernels-step.md."""

from __future__ import annotations

from typing import Any

from .builder import Builder, ptr, tokens_i32
from .options import Plan


def add_rope_table_op(b: Builder, plan: Plan) -> None:
    """`rope_table(table)`: f32 [max_context, head_dim] cos | sin, one block of head_dim / 2 threads per row:
    kern_rope_table (plain RoPE), or kern_rope_table_llama3 with the config's llama3 rope_scaling (factor,
    low_freq_factor, high_freq_factor, original_max_position_embeddings as launch constants)."""
    max_pos, D, scaling = plan.opts.max_context, plan.cfg.head_dim, plan.cfg.rope_scaling
    args: list[dict[str, Any]] = [{"arg": "table"}, {"i32": max_pos}, {"i32": D}, {"f32": plan.cfg.rope_theta}]
    if scaling is not None:
        args += [{"f32": scaling.factor}, {"f32": scaling.low_freq_factor}, {"f32": scaling.high_freq_factor},
                 {"f32": float(scaling.original_max_position_embeddings)}]
    entry = "kern_rope_table" if scaling is None else "kern_rope_table_llama3"
    b.op("rope_table", [ptr("table")], [b.launch(entry, [max_pos, 1, 1], [D // 2, 1, 1], args)])


def add_norm_ops(b: Builder, plan: Plan) -> None:
    """`embed(table, ids, out)`; `rmsnorm(residual, w, out)`; `add_rmsnorm(residual, delta, w, out)` (residual +=
    delta in place, then out = RMSNorm(residual) * w): one block of 256 threads per token row."""
    H, V, eps = plan.cfg.hidden, plan.cfg.vocab, plan.cfg.eps
    b.op("embed", [ptr("table"), ptr("ids"), ptr("out")], [b.launch(
        "kern_embed_gather", ["tokens", 1, 1], [256, 1, 1],
        [{"arg": "table"}, {"arg": "ids"}, {"arg": "out"}, tokens_i32(), {"i32": H}, {"i32": V}],
        pdl=plan.opts.pdl_small_launches)])
    b.op("rmsnorm", [ptr("residual"), ptr("w"), ptr("out")], [b.launch(
        "kern_add_rmsnorm", ["tokens", 1, 1], [256, 1, 1],
        [{"arg": "residual"}, {"null": 8}, {"arg": "w"}, {"arg": "out"}, tokens_i32(), {"i32": H}, {"f32": eps}],
        pdl=plan.opts.pdl_small_launches)])
    b.op("add_rmsnorm", [ptr("residual"), ptr("delta"), ptr("w"), ptr("out")], [b.launch(
        "kern_add_rmsnorm", ["tokens", 1, 1], [256, 1, 1],
        [{"arg": "residual"}, {"arg": "delta"}, {"arg": "w"}, {"arg": "out"}, tokens_i32(), {"i32": H},
         {"f32": eps}], pdl=plan.opts.pdl_small_launches)])


def add_silu_mul_op(b: Builder, plan: Plan) -> None:
    """`silu_mul(gate_up, out)`: out[t, i] = silu(gate[t, i]) * up[t, i] over [tokens, intermediate]."""
    I = plan.cfg.intermediate
    b.op("silu_mul", [ptr("gate_up"), ptr("out")], [b.launch(
        "kern_silu_mul", ["tokens", -(-I // 1024), 1], [256, 1, 1],
        [{"arg": "gate_up"}, {"arg": "out"}, tokens_i32(), {"i32": I}], pdl=plan.opts.pdl_small_launches)])


def add_argmax_op(b: Builder, plan: Plan) -> None:
    """`argmax(logits, out)`: two stages, `argmax_chunks` first-stage blocks per row (ties -> smallest index);
    scratch part_val / part_idx of seqs * argmax_chunks * 4 bytes each."""
    chunks, V, pdl = plan.opts.argmax_chunks, plan.cfg.vocab, plan.opts.pdl_small_launches
    b.op("argmax", [ptr("logits"), ptr("out")],
         [b.launch("kern_argmax_partial", [chunks, "seqs", 1], [256, 1, 1],
                   [{"arg": "logits"}, {"i32": V}, {"i32": -(-V // chunks)}, {"scratch": "part_val"},
                    {"scratch": "part_idx"}, {"i32": chunks}], pdl=pdl),
          b.launch("kern_argmax_final", ["seqs", 1, 1], [256, 1, 1],
                   [{"scratch": "part_val"}, {"scratch": "part_idx"}, {"i32": chunks}, {"arg": "out"}], pdl=pdl)],
         scratch={"part_val": f"seqs * {chunks * 4}", "part_idx": f"seqs * {chunks * 4}"})


def _advance_tail(plan: Plan) -> list[dict[str, Any]]:
    """kern_decode_advance(_packed)'s launch constants after the pointers."""
    opts = plan.opts
    return [{"expr": "seqs", "type": "i32"}, {"i32": opts.page_tokens}, {"i32": plan.pages_per_seq},
            {"i32": opts.max_context}, {"i32": opts.ring_len}]


def add_decode_advance_op(b: Builder, plan: Plan) -> None:
    """`decode_advance`: kern_decode_advance (kernels-src/step.cu, docs/kernels-step.md), one block of 32
    threads looping over the sequences; writes the next step's token_ids / positions / seq_lens /
    slot_mapping and the token ring from next_token and the block table."""
    names = ("next_token", "token_ids", "positions", "seq_lens", "slot_mapping", "block_table", "ring")
    b.op("decode_advance", [ptr(n) for n in names],
         [b.launch("kern_decode_advance", [1, 1, 1], [32, 1, 1],
                   [{"arg": n} for n in names] + _advance_tail(plan), pdl=plan.opts.pdl_small_launches)])


def add_decode_advance_packed_op(b: Builder, plan: Plan) -> None:
    """`decode_advance_packed`: kern_decode_advance_packed (the sampler's step end), one block of 32 threads
    looping over the sequences; the token from `token` (i32), its logprob from `logprob` (f32); writes
    next_token and the ring entry as token (bits 0..31) | logprob bits (bits 32..63), and the next step's
    token_ids / positions / seq_lens / slot_mapping as decode_advance does."""
    names = ("token", "logprob", "next_token", "token_ids", "positions", "seq_lens", "slot_mapping", "block_table",
             "ring")
    b.op("decode_advance_packed", [ptr(n) for n in names],
         [b.launch("kern_decode_advance_packed", [1, 1, 1], [32, 1, 1],
                   [{"arg": n} for n in names] + _advance_tail(plan), pdl=plan.opts.pdl_small_launches)])
