"""The call tables: `load` (once: the rope table, plain or llama3; with the sampler also every row's sampler inputs set greedy),
`prefill` (a chunk of `tokens` tokens; fills the KV cache only, so the last layer stops after writing its K/V),
`decode` (graph: one token per sequence, logits, then the step's end: docs/caller.md "Decode on the device") and,
with the sampler, `top_logprobs` (run after a decode step on request). The decode program ends

    --sampler gpu:     sample -> sample_history_append -> decode_advance_packed (sampling.py)
    --sampler argmax:  argmax into `next_token` -> decode_advance

and either way the last call writes the next step's inputs on the device.

Prefill issues 9 launches per layer (add_rmsnorm, qkv GEMM, qk_norm_rope_kv or rope_kv, attention, o GEMM, add_rmsnorm,
gate_up GEMM, silu_mul, down GEMM). Decode `gemv` (bs = 1) issues 7 per layer, the norms and residual adds folded
into the GEMVs; decode `gemm` keeps the prefill-shaped layer (10 launches, cuBLASLt). Why separate ops rather than
`when` on one op: docs/perf.md.
"""

from __future__ import annotations

from typing import Any

from .attention import decode_attention_fused, rope_kv_op_name
from .builder import call, pages_of
from .entries import DECODE_TICKETS, EARLY_PARTIALS
from .gemm import Projections
from .options import Plan
from .sampling import decode_tail_calls, init_call, top_logprobs_program


def qk_norm_rope_kv_call(plan: Plan, layer: int) -> dict[str, Any]:
    """Layer `layer`'s q/k RMSNorm (families with one) + RoPE + K/V write (prefill and decode alike): `qkv` -> `q`
    and the cache."""
    norms = {"q_norm": f"q_norm.{layer}", "k_norm": f"k_norm.{layer}"} if plan.cfg.family.qk_norm else {}
    return call(rope_kv_op_name(plan), qkv="qkv", **norms, rope="rope", positions="positions", slots="slot_mapping",
                q_out="q", kv=f"kv.{layer}", num_pages=pages_of(layer))


def decode_attention_calls(plan: Plan, layer: int) -> list[dict[str, Any]]:
    """A decode layer's attention after the qkv projection (which writes `qkv`), writing `attn_out`:
    qk_norm_rope_kv / rope_kv (q to `q`, K/V to the cache) and attn_decode (`early` also passes slot_mapping: the
    row its partial kernel reloads after the PDL wait; a fused partial, the DECODE_TICKETS state)."""
    slots = {"slots": "slot_mapping"} if plan.opts.decode_attn in EARLY_PARTIALS else {}
    tickets = {"tickets": DECODE_TICKETS} if decode_attention_fused(plan) else {}
    return [qk_norm_rope_kv_call(plan, layer),
            call("attn_decode", q="q", kv=f"kv.{layer}", block_table="block_table", seq_lens="seq_lens", **slots,
                 **tickets, out="attn_out", num_pages=pages_of(layer))]


def _mlp_calls(plan: Plan, gemms: Projections, layer: int, decode: bool) -> list[dict[str, Any]]:
    """o projection, post-attention norm, gate_up, SiLU-and-mul, down (cuBLASLt-shaped layers)."""
    H, I, q_dim = plan.cfg.hidden, plan.cfg.intermediate, plan.q_dim
    if gemms.decode_skinny(decode):  # the SiLU-mul in the gate_up epilogue
        gate_up = [gemms.call(2 * I, H, decode, a="normed", w=f"w_gate_up.{layer}", c="act", swiglu=True)]
    else:
        gate_up = [gemms.call(2 * I, H, decode, a="normed", w=f"w_gate_up.{layer}", c="gate_up"),
                   call("silu_mul", gate_up="gate_up", out="act")]
    return [
        gemms.call(H, q_dim, decode, a="attn_out", w=f"w_o.{layer}", c="hidden"),
        call("add_rmsnorm", residual="residual", delta="hidden", w=f"ln_post.{layer}", out="normed"),
        *gate_up,
        gemms.call(H, I, decode, a="act", w=f"w_down.{layer}", c="hidden"),
    ]


def layer_calls(plan: Plan, gemms: Projections, layer: int, decode: bool) -> list[dict[str, Any]]:
    """One layer of the prefill program, or of the cuBLASLt decode (`decode`)."""
    H, qkv_dim = plan.cfg.hidden, plan.qkv_dim
    if layer == 0:
        calls = [call("rmsnorm", residual="residual", w="ln_in.0", out="normed")]
    else:
        calls = [call("add_rmsnorm", residual="residual", delta="hidden", w=f"ln_in.{layer}", out="normed")]
    calls.append(gemms.call(qkv_dim, H, decode, a="normed", w=f"w_qkv.{layer}", c="qkv"))
    if decode:
        calls += decode_attention_calls(plan, layer)
    else:
        calls.append(qk_norm_rope_kv_call(plan, layer))
        if layer == plan.cfg.layers - 1:
            return calls  # prefill fills the KV cache only: the last layer's attention output is never read
        calls.append(call("attn_prefill", q="q", kv=f"kv.{layer}", block_table="block_table",
                          cu_seqlens_q="cu_seqlens_q", seq_lens="seq_lens", out="attn_out", num_pages=pages_of(layer)))
    return calls + _mlp_calls(plan, gemms, layer, decode)


def _gemv_mlp_calls(layer: int, gemv: str) -> list[dict[str, Any]]:
    """`gemv_gate_up` + `gemv_down` (SiLU*mul in the down prologue, v1) or `gemv_gate_up_act` + `gemv_down_act`
    (SwiGLU in the gate_up epilogue, writing `act`, v2)."""
    if gemv == "v2":
        return [call("gemv_gate_up_act", w=f"w_gate_up.{layer}", residual="residual", norm_w=f"ln_post.{layer}",
                     y="act"),
                call("gemv_down_act", w=f"w_down.{layer}", x="act", residual="residual")]
    return [call("gemv_gate_up", w=f"w_gate_up.{layer}", residual="residual", norm_w=f"ln_post.{layer}", y="gate_up"),
            call("gemv_down", w=f"w_down.{layer}", gate_up="gate_up", residual="residual")]


def decode_gemv_calls(plan: Plan) -> list[dict[str, Any]]:
    """The GEMV decode call table after the embedding (which writes `residual`): per layer qkv, the attention
    (decode_attention_calls), o, then the MLP, then the lm_head GEMV with the final norm folded in (into
    `logits`). The tied embedding matrix is read in place as lm_head (no copy)."""
    calls: list[dict[str, Any]] = []
    for layer in range(plan.cfg.layers):
        calls += [
            call("gemv_qkv", w=f"w_qkv.{layer}", residual="residual", norm_w=f"ln_in.{layer}", y="qkv"),
            *decode_attention_calls(plan, layer),
            call("gemv_o", w=f"w_o.{layer}", x="attn_out", residual="residual"),
            *_gemv_mlp_calls(layer, plan.opts.gemv),
        ]
    return calls + [
        call("gemv_lm_head", w="embed" if plan.cfg.tied else "lm_head", residual="residual", norm_w="final_norm",
             y="logits"),
    ]


def _decode_gemm_calls(plan: Plan, gemms: Projections) -> list[dict[str, Any]]:
    """The cuBLASLt decode call table after the embedding; lm_head with m = seqs (one row per sequence) into
    `logits`."""
    H, V = plan.cfg.hidden, plan.cfg.vocab
    calls = [c for layer in range(plan.cfg.layers) for c in layer_calls(plan, gemms, layer, decode=True)]
    return calls + [
        call("add_rmsnorm", residual="residual", delta="hidden", w="final_norm", out="normed"),
        call(gemms.op(V, H, True), a="normed", w="embed" if plan.cfg.tied else "lm_head", c="logits", m="seqs", n=V,
             k=H),
    ]


def decode_advance_call() -> dict[str, Any]:
    """The last decode call of --sampler argmax: the next step's inputs and the token ring from `next_token`."""
    return call("decode_advance", next_token="next_token", token_ids="token_ids", positions="positions",
                seq_lens="seq_lens", slot_mapping="slot_mapping", block_table="block_table", ring="token_ring")


def decode_tail(plan: Plan) -> list[dict[str, Any]]:
    """The decode program's calls after the lm_head: the sampler's three (sampling.decode_tail_calls), or the
    argmax into `next_token` and decode_advance."""
    if plan.opts.sampler == "gpu":
        return decode_tail_calls()
    return [call("argmax", logits="logits", out="next_token"), decode_advance_call()]


def build_programs(plan: Plan, gemms: Projections) -> dict[str, Any]:
    """The `load`, `prefill` and `decode` programs, and `top_logprobs` with the sampler (the GEMV decode's ops
    must already be declared)."""
    embed = call("embed", table="embed", ids="token_ids", out="residual")
    prefill = [embed] + [c for layer in range(plan.cfg.layers) for c in layer_calls(plan, gemms, layer, decode=False)]
    body = decode_gemv_calls(plan) if plan.opts.decode == "gemv" else _decode_gemm_calls(plan, gemms)
    gpu = plan.opts.sampler == "gpu"
    programs = {
        "load": {"kind": "once", "calls": [call("rope_table", table="rope"), *([init_call()] if gpu else [])]},
        "prefill": {"kind": "run", "calls": prefill},
        "decode": {"kind": "run", "graph": True, "calls": [embed, *body, *decode_tail(plan)]},
    }
    if gpu:
        programs["top_logprobs"] = top_logprobs_program()
    return programs
