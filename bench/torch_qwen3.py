"""Qwen3 in plain torch, for the peers of the decode and prefill benchmarks.

A gpt-fast style bs=1 model: one static KV cache of ``max_context`` tokens, a fixed-shape decode step
(every tensor shape independent of the position, so the step can be captured into one CUDA graph),
and a prefill that runs a whole prompt at once. Weights come from a Hugging Face Qwen3 checkpoint
directory through safetensors; the qkv and gate/up projections are concatenated at load, as kern
does with binds, so the peer does the same number of GEMMs.

Three peers are built from it (``bench/decode.py``): the eager step captured as one CUDA graph, the
step compiled by ``torch.compile(mode="max-autotune-no-cudagraphs")`` and captured as one CUDA graph,
and transformers' own eager ``generate`` (not in this file).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from kern_run.models.qwen3 import Qwen3Config


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # transformers' Qwen3RMSNorm: fp32 statistics, rounded to the input dtype before the weight
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, H, D]; cos/sin: [T, 1, D] (neox layout: halves rotated)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class TorchQwen3:
    """Plain-torch Qwen3 with a static bs=1 KV cache.

    ``k_cache``/``v_cache``: bf16 ``[layers, max_context, kv_heads, head_dim]``.
    """

    def __init__(self, checkpoint_dir: Path, max_context: int, device: str = "cuda") -> None:
        checkpoint_dir = Path(checkpoint_dir)
        config = checkpoint_dir / "config.json"
        self.shape = s = Qwen3Config.from_json(json.loads(config.read_text()), str(config))
        self.max_context = max_context
        tensors: dict[str, torch.Tensor] = {}
        for shard in sorted(checkpoint_dir.glob("*.safetensors")):
            tensors.update(load_file(str(shard), device=device))
        self.embed = tensors["model.embed_tokens.weight"]
        self.lm_head = self.embed if s.tied else tensors["lm_head.weight"]
        self.final_norm = tensors["model.norm.weight"]
        self.layers = []
        for i in range(s.layers):
            p = f"model.layers.{i}."
            self.layers.append({
                "ln1": tensors[p + "input_layernorm.weight"],
                "ln2": tensors[p + "post_attention_layernorm.weight"],
                "qkv": torch.cat([tensors[p + f"self_attn.{n}_proj.weight"] for n in "qkv"], 0),
                "o": tensors[p + "self_attn.o_proj.weight"],
                "qn": tensors[p + "self_attn.q_norm.weight"],
                "kn": tensors[p + "self_attn.k_norm.weight"],
                "gate_up": torch.cat([tensors[p + "mlp.gate_proj.weight"], tensors[p + "mlp.up_proj.weight"]], 0),
                "down": tensors[p + "mlp.down_proj.weight"],
            })
        del tensors
        inv_freq = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.int64, device=device).float() / s.head_dim))
        freqs = torch.arange(max_context, device=device).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(torch.bfloat16)  # [max_context, D]
        self.sin = emb.sin().to(torch.bfloat16)
        self.k_cache = torch.zeros(s.layers, max_context, s.kv_heads, s.head_dim, dtype=torch.bfloat16, device=device)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.positions_all = torch.arange(max_context, device=device)
        self.layer_fn = self.layer  # torch.compile(self.layer) for the compiled peer (bench/decode.py)

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, last_only: bool = True) -> torch.Tensor:
        """Run ``T`` tokens at ``positions`` (i64 ``[T]``), writing their K/V; returns logits ``[T or 1, vocab]``.

        Attention covers the whole static cache with a causal mask by position, so shapes do not depend
        on the position (capturable)."""
        s = self.shape
        T = token_ids.shape[0]
        x = F.embedding(token_ids, self.embed)  # [T, hidden]
        residual = x
        cos = self.cos[positions][:, None, :]  # [T, 1, D]
        sin = self.sin[positions][:, None, :]
        # mask[t, j] = key j visible to query t  -> [1, T, max_context]
        mask = (self.positions_all[None, :] <= positions[:, None])[None]
        for i, w in enumerate(self.layers):
            residual = self.layer_fn(residual, w["ln1"], w["qkv"], w["qn"], w["kn"], w["o"], w["ln2"], w["gate_up"],
                                     w["down"], self.k_cache[i], self.v_cache[i], cos, sin, mask, positions)
        h = _rms(residual[-1:] if last_only else residual, self.final_norm, s.eps)
        return h @ self.lm_head.t()

    def layer(self, residual: torch.Tensor, ln1: torch.Tensor, w_qkv: torch.Tensor, qn: torch.Tensor, kn: torch.Tensor,
              w_o: torch.Tensor, ln2: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
              k_cache: torch.Tensor, v_cache: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
              positions: torch.Tensor) -> torch.Tensor:
        """One decoder layer on ``residual`` ``[T, hidden]``, writing K/V of ``positions`` into this layer's
        ``k_cache``/``v_cache`` ``[max_context, kv_heads, D]``; returns the new residual. Every layer has the same
        shapes, so ``torch.compile`` of this function compiles once and serves all of them (``layer_fn``)."""
        s = self.shape
        T = residual.shape[0]
        groups = s.q_heads // s.kv_heads
        h = _rms(residual, ln1, s.eps)
        qkv = h @ w_qkv.t()  # [T, (Hq + 2 Hkv) D]
        q, k, v = qkv.split([s.q_heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], -1)
        q = _rope(_rms(q.view(T, s.q_heads, s.head_dim), qn, s.eps), cos, sin)
        k = _rope(_rms(k.view(T, s.kv_heads, s.head_dim), kn, s.eps), cos, sin)
        k_cache.index_copy_(0, positions, k)
        v_cache.index_copy_(0, positions, v.view(T, s.kv_heads, s.head_dim))
        kc = k_cache.transpose(0, 1).repeat_interleave(groups, 0)  # [Hq, max_context, D]
        vc = v_cache.transpose(0, 1).repeat_interleave(groups, 0)
        attn = F.scaled_dot_product_attention(q.transpose(0, 1), kc, vc, attn_mask=mask)  # [Hq, T, D]
        attn = attn.transpose(0, 1).reshape(T, s.q_heads * s.head_dim)
        residual = residual + attn @ w_o.t()
        h = _rms(residual, ln2, s.eps)
        gu = h @ w_gate_up.t()
        g, u = gu.chunk(2, -1)
        return residual + (F.silu(g) * u) @ w_down.t()

    def decode_step(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """One greedy step: ``token``/``position`` i64 ``[1]`` -> next token i64 ``[1]``."""
        return self.forward(token, position).argmax(-1)


class GraphedStep:
    """A decode step (eager or compiled) captured into one CUDA graph with static input/output tensors."""

    def __init__(self, step, device: str = "cuda", warmup: int = 3) -> None:
        self.token = torch.zeros(1, dtype=torch.int64, device=device)
        self.position = torch.zeros(1, dtype=torch.int64, device=device)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                self.out = step(self.token, self.position)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = step(self.token, self.position)

    def __call__(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        self.token.copy_(token)
        self.position.copy_(position)
        self.graph.replay()
        return self.out
