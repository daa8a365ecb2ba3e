"""Weight buffers and their binds from the Hugging Face checkpoint's tensor names, and the per-layer KV states.

q/k/v and gate/up are concatenated in their binds (whole-tensor segments); o, down and the norms are bound whole;
`lm_head` exists only when the embeddings are not tied (tied: the lm_head projection reads `embed` itself);
`rope` (cos | sin, f32 [max_context, head_dim]) is derived by the `load` once program.
"""

from __future__ import annotations

from .builder import Builder
from .options import Plan


def add_global_weights(b: Builder, plan: Plan) -> None:
    """embed [vocab, hidden], lm_head (untied only), final_norm [hidden] (bf16), rope (derived, f32)."""
    cfg = plan.cfg
    H, V = cfg.hidden, cfg.vocab
    b.buffer("embed", "weight", "bf16", [V, H], [{"tensor": "model.embed_tokens.weight"}])
    if not cfg.tied:
        b.buffer("lm_head", "weight", "bf16", [V, H], [{"tensor": "lm_head.weight"}])
    b.buffer("final_norm", "weight", "bf16", [H], [{"tensor": "model.norm.weight"}])
    b.buffer("rope", "weight", "f32", [plan.opts.max_context, cfg.head_dim], [{"derived": True}])


def add_layer_weights(b: Builder, plan: Plan, layer: int) -> None:
    """Layer `layer`'s bf16 weights: ln_in, w_qkv [q + 2 kv, hidden], q_norm / k_norm [head_dim], w_o
    [hidden, q], ln_post, w_gate_up [2 intermediate, hidden], w_down [hidden, intermediate]."""
    H, D, I = plan.cfg.hidden, plan.cfg.head_dim, plan.cfg.intermediate
    p = f"model.layers.{layer}."
    b.buffer(f"ln_in.{layer}", "weight", "bf16", [H], [{"tensor": p + "input_layernorm.weight"}])
    b.buffer(f"w_qkv.{layer}", "weight", "bf16", [plan.qkv_dim, H], [
        {"tensor": p + "self_attn.q_proj.weight"}, {"tensor": p + "self_attn.k_proj.weight"},
        {"tensor": p + "self_attn.v_proj.weight"}])
    b.buffer(f"q_norm.{layer}", "weight", "bf16", [D], [{"tensor": p + "self_attn.q_norm.weight"}])
    b.buffer(f"k_norm.{layer}", "weight", "bf16", [D], [{"tensor": p + "self_attn.k_norm.weight"}])
    b.buffer(f"w_o.{layer}", "weight", "bf16", [H, plan.q_dim], [{"tensor": p + "self_attn.o_proj.weight"}])
    b.buffer(f"ln_post.{layer}", "weight", "bf16", [H], [{"tensor": p + "post_attention_layernorm.weight"}])
    b.buffer(f"w_gate_up.{layer}", "weight", "bf16", [2 * I, H], [
        {"tensor": p + "mlp.gate_proj.weight"}, {"tensor": p + "mlp.up_proj.weight"}])
    b.buffer(f"w_down.{layer}", "weight", "bf16", [H, I], [{"tensor": p + "mlp.down_proj.weight"}])


def add_weights_and_states(b: Builder, plan: Plan) -> None:
    """Every weight buffer, and per layer one paged KV state of `[2][page_tokens][kv_heads][head_dim]` bf16 per
    page (docs/kernels.md): 2 * kv_dim * 2 bytes per token."""
    add_global_weights(b, plan)
    for layer in range(plan.cfg.layers):
        add_layer_weights(b, plan, layer)
        b.states[f"kv.{layer}"] = {"kind": "paged", "bytes_per_token": 2 * plan.kv_dim * 2,
                                   "page_tokens": plan.opts.page_tokens}
