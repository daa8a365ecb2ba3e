"""The caller's inputs and outputs and one layer's workspace (docs/caller.md "Buffers")."""

from __future__ import annotations

from .builder import Builder
from .options import Plan
from .sampling import add_sampling_buffers


def add_io_buffers(b: Builder, plan: Plan) -> None:
    """Inputs token_ids / positions / slot_mapping [tokens] i32, block_table [seqs, pages_per_seq] i32, seq_lens
    [seqs] i32, cu_seqlens_q [seqs + 1] i32; outputs next_token [seqs] i64 and the host-mapped token ring (plain
    token ids with --sampler argmax; token | logprob bits << 32 with the sampler, whose own buffers
    sampling.add_sampling_buffers declares)."""
    b.buffer("token_ids", "input", "i32", ["tokens"])
    b.buffer("positions", "input", "i32", ["tokens"])
    b.buffer("slot_mapping", "input", "i32", ["tokens"])
    b.buffer("block_table", "input", "i32", ["seqs", plan.pages_per_seq])
    b.buffer("seq_lens", "input", "i32", ["seqs"])
    b.buffer("cu_seqlens_q", "input", "i32", ["seqs + 1"])
    b.buffer("next_token", "output", "i64", ["seqs"])
    # written by kern_decode_advance at (position + 1) % ring_len; host-mapped so the caller reads it
    # without a copy once the step's event has completed (docs/caller.md "Decode on the device")
    b.buffer("token_ring", "output", "i64", ["seqs", plan.opts.ring_len], placement="host")
    if plan.opts.sampler == "gpu":
        add_sampling_buffers(b, plan)


def add_workspace(b: Builder, plan: Plan) -> None:
    """One layer's activations, bf16, rows of `tokens` (logits: rows of `seqs`); `residual` is the residual
    stream, `hidden` the o / down projection output (the delta)."""
    H, I = plan.cfg.hidden, plan.cfg.intermediate
    b.buffer("residual", "workspace", "bf16", ["tokens", H])
    b.buffer("hidden", "workspace", "bf16", ["tokens", H])
    b.buffer("normed", "workspace", "bf16", ["tokens", H])
    b.buffer("qkv", "workspace", "bf16", ["tokens", plan.qkv_dim])
    b.buffer("q", "workspace", "bf16", ["tokens", plan.q_dim])
    b.buffer("attn_out", "workspace", "bf16", ["tokens", plan.q_dim])
    b.buffer("gate_up", "workspace", "bf16", ["tokens", 2 * I])
    b.buffer("act", "workspace", "bf16", ["tokens", I])
    b.buffer("logits", "workspace", "bf16", ["seqs", plan.cfg.vocab])
