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
    """Layer `layer`'s bf16 weights, bound to the family's tensors (family.Family.layer_tensors): ln_in, w_qkv
    [q + 2 kv, hidden], q_norm / k_norm [head_dim] (families with a q/k norm), w_o [hidden, q], ln_post, w_gate_up
    [2 intermediate, hidden], w_down [hidden, intermediate]."""
    H, D, I = plan.cfg.hidden, plan.cfg.head_dim, plan.cfg.intermediate
    shapes = {"ln_in": [H], "w_qkv": [plan.qkv_dim, H], "q_norm": [D], "k_norm": [D], "w_o": [H, plan.q_dim],
              "ln_post": [H], "w_gate_up": [2 * I, H], "w_down": [H, I]}
    for name, tensors in plan.cfg.family.layer_tensors(layer).items():
        b.buffer(name, "weight", "bf16", shapes[name.split(".")[0]], [{"tensor": t} for t in tensors])


def add_weights_and_states(b: Builder, plan: Plan) -> None:
    """Every weight buffer, and per layer one paged KV state of `[2][page_tokens][kv_heads][head_dim]` bf16 per
    page (docs/kernels.md): 2 * kv_dim * 2 bytes per token."""
    add_global_weights(b, plan)
    for layer in range(plan.cfg.layers):
        add_layer_weights(b, plan, layer)
        b.states[f"kv.{layer}"] = {"kind": "paged", "bytes_per_token": 2 * plan.kv_dim * 2,
                                   "page_tokens": plan.opts.page_tokens}
