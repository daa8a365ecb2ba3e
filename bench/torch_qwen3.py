"""Qwen3 in plain torch, for the peers of the decode and prefill benchmarks.

A gpt-fast style bs=1 model: one static KV cache of ``max_context`` tokens, a fixed-shape decode step
(every tensor shape independent of the position, so the step can be captured into one CUDA graph),
and a prefill that runs a whole prompt at once. Weights come from a Hugging Face Qwen3 checkpoint
directory through safetensors; the qkv and gate/up projections are concatenated at load, as kern
does with binds, so the peer does the same number of GEMMs.

Three peers are built from it (``bench/decode.py``): the eager step captured as one CUDA graph, the
step compiled by ``torch.compile(mode="max-autotune-no-cudagraphs")`` and captured as one CUDA graph,
and transformers' own eager ``generate`` (not in this file).

The batched step (``bench/decode_batch.py``): ``decode_step_batch`` takes ``B`` rows, one token each at its
own position, over a dense (not paged) per-row cache ``kb`` / ``vb`` bf16 ``[layers, B, kv_heads, S, head_dim]``
(``set_batch_cache``); each row attends over all ``S`` cache positions with a mask ``key <= position``, as two
batched matmuls per layer with the query heads viewed as ``[kv_heads, group]`` (GQA without repeating K/V).
``batch_layer_fn`` is the layer it calls (``torch.compile(batch_layer)`` for the compiled peer).
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
        self.kb: torch.Tensor | None = None  # the batched step's cache (set_batch_cache)
        self.vb: torch.Tensor | None = None
        self.batch_layer_fn = self.batch_layer  # torch.compile(self.batch_layer) for the compiled batched peer

    def resize_cache(self, size: int) -> None:
        """A fresh zeroed bs=1 cache of ``size`` positions (``forward`` attends over all of them, masked).
        ``size`` must not exceed ``max_context`` (the rope tables)."""
        if not 1 <= size <= self.max_context:
            raise ValueError(f"cache size {size} outside [1, max_context {self.max_context}]")
        s = self.shape
        device = self.k_cache.device
        self.k_cache = torch.zeros(s.layers, size, s.kv_heads, s.head_dim, dtype=torch.bfloat16, device=device)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.positions_all = torch.arange(size, device=device)

    def set_batch_cache(self, batch: int, size: int) -> None:
        """A fresh zeroed batched cache: ``kb`` / ``vb`` bf16 ``[layers, batch, kv_heads, size, head_dim]`` (row
        ``r`` of the batch is ``kb[:, r]``), plus the index tensors the batched step writes K/V with. ``size``
        (positions per row) must not exceed ``max_context``. Raises ValueError for a bad ``batch`` or ``size``."""
        if batch < 1 or not 1 <= size <= self.max_context:
            raise ValueError(f"batch {batch} must be >= 1 and size {size} inside [1, max_context {self.max_context}]")
        s = self.shape
        device = self.k_cache.device
        self.kb = self.vb = None  # free the old cache first
        self.kb = torch.zeros(s.layers, batch, s.kv_heads, size, s.head_dim, dtype=torch.bfloat16, device=device)
        self.vb = torch.zeros_like(self.kb)
        self.batch_keys = torch.arange(size, device=device)  # [S]
        self.batch_rows = torch.arange(batch, device=device)[:, None]  # [B, 1]
        self.batch_heads = torch.arange(s.kv_heads, device=device)[None, :]  # [1, Hkv]

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

    # ---------------------------------------------------------------- batched decode (bench/decode_batch.py)

    def forward_batch(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One decode step of ``B`` rows: row ``r`` runs token ``token_ids[r]`` at ``positions[r]`` (i64 ``[B]``,
        ``B`` = the batch of ``set_batch_cache``), writes its K/V into its own cache row at that position and
        attends over its positions ``0..positions[r]``. Returns logits bf16 ``[B, vocab]``. Every shape depends
        only on ``B`` and the cache size, so the step is capturable."""
        s = self.shape
        assert self.kb is not None and self.vb is not None, "set_batch_cache first"
        x = F.embedding(token_ids, self.embed)  # [B, hidden]
        cos = self.cos[positions][:, None, :]  # [B, 1, D]
        sin = self.sin[positions][:, None, :]
        mask = (self.batch_keys[None, :] <= positions[:, None])[:, None, None, :]  # [B, 1, 1, S]
        residual = x
        for i, w in enumerate(self.layers):
            residual = self.batch_layer_fn(residual, w["ln1"], w["qkv"], w["qn"], w["kn"], w["o"], w["ln2"],
                                           w["gate_up"], w["down"], self.kb[i], self.vb[i], cos, sin, mask, positions,
                                           self.batch_rows, self.batch_heads)
        return _rms(residual, self.final_norm, s.eps) @ self.lm_head.t()

    def batch_layer(self, residual: torch.Tensor, ln1: torch.Tensor, w_qkv: torch.Tensor, qn: torch.Tensor,
                    kn: torch.Tensor, w_o: torch.Tensor, ln2: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                    k_cache: torch.Tensor, v_cache: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    mask: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """One decoder layer on ``residual`` ``[B, hidden]`` (one token per row), writing row ``r``'s K/V at
        ``positions[r]`` of ``k_cache`` / ``v_cache`` ``[B, kv_heads, S, D]``; ``mask`` bool ``[B, 1, 1, S]``,
        ``rows`` ``[B, 1]`` and ``heads`` ``[1, kv_heads]`` index tensors. Returns the new residual. One
        shape for every layer, so ``torch.compile`` of it compiles once per (B, S)."""
        s = self.shape
        B = residual.shape[0]
        groups = s.q_heads // s.kv_heads
        h = _rms(residual, ln1, s.eps)
        qkv = h @ w_qkv.t()  # [B, (Hq + 2 Hkv) D]
        q, k, v = qkv.split([s.q_heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], -1)
        q = _rope(_rms(q.view(B, s.q_heads, s.head_dim), qn, s.eps), cos, sin)  # [B, Hq, D]
        k = _rope(_rms(k.view(B, s.kv_heads, s.head_dim), kn, s.eps), cos, sin)  # [B, Hkv, D]
        where = (rows, heads, positions[:, None])  # -> [B, Hkv] cache entries, D each
        k_cache.index_put_(where, k)
        v_cache.index_put_(where, v.view(B, s.kv_heads, s.head_dim))
        # query head h reads kv head h // groups (transformers' repeat_kv), so q viewed [B, Hkv, groups, D]
        qg = q.view(B, s.kv_heads, groups, s.head_dim)
        scores = torch.matmul(qg, k_cache.transpose(-1, -2)).float() * (s.head_dim ** -0.5)  # [B, Hkv, G, S]
        probs = scores.masked_fill(~mask, float("-inf")).softmax(-1).to(torch.bfloat16)
        attn = torch.matmul(probs, v_cache).reshape(B, s.q_heads * s.head_dim)  # [B, Hkv, G, D] -> [B, Hq D]
        residual = residual + attn @ w_o.t()
        h = _rms(residual, ln2, s.eps)
        g, u = (h @ w_gate_up.t()).chunk(2, -1)
        return residual + (F.silu(g) * u) @ w_down.t()

    def decode_step_batch(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One greedy batched step: i64 ``[B]`` tokens and positions -> next tokens i64 ``[B]``."""
        return self.forward_batch(token_ids, positions).argmax(-1)


class GraphedStep:
    """A decode step (eager or compiled) captured into one CUDA graph with static input/output tensors:
    ``token`` / ``position`` i64 ``[rows]`` (1 for ``decode_step``, the batch for ``decode_step_batch``)."""

    def __init__(self, step, device: str = "cuda", warmup: int = 3, rows: int = 1) -> None:
        self.token = torch.zeros(rows, dtype=torch.int64, device=device)
        self.position = torch.zeros(rows, dtype=torch.int64, device=device)
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
