"""A Qwen3 step in plain torch, written to be harvested (GPU machine only; torch is imported on use).

What makes it harvestable, each a rule of docs/harvest.md "What cannot be harvested":

- the weights are the checkpoint's own tensors under their checkpoint names (no concatenation at load), so every
  weight pointer is a checkpoint name plus an offset and binds straight from the checkpoint;
- every derived table is computed inside the step (the rope angles from `positions`, the causal mask from an
  `arange`), so no tensor lives outside the checkpoint, the states, the inputs and the outputs;
- attention is matmuls and a softmax (no SDPA: its flash / memory-efficient kernels take a struct of pointers),
  and inductor's GEMM backend is its Triton templates (`max_autotune_gemm_backends="TRITON"`): cuBLAS kernels
  take their operands through a struct too;
- the KV cache is one zeroed state per layer and kind, `k_cache.L` / `v_cache.L` bf16 `[kv_heads, context,
  head_dim]`, written at `positions` with `index_copy_` (a kernel, not a host copy);
- the token dimension of the inputs is marked unbacked (`torch._dynamo.mark_unbacked`), so one compiled graph
  (the same kernels) serves every token count, 1 included (a backed size would specialise 1).

`step(inputs)` maps `token_ids` / `positions` (i64 `[T]`) to `next_token` (i64 `[T]`, the greedy argmax of each
row) and `logits` (bf16 `[T, vocab]`). The formulas are transformers' Qwen3 (RMSNorm in fp32 rounded to bf16
before the weight, neox rope, GQA with `kv_heads` groups), as bench/torch_qwen3.py's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..models.qwen3 import Qwen3Config
from .capture import HarvestStep
from .greedy import feed_greedy

COMPILE_MODE = "max-autotune-no-cudagraphs"


def _rms(x: Any, w: Any, eps: float) -> Any:
    xf = x.float()
    xf = xf * (xf.pow(2).mean(-1, keepdim=True) + eps).rsqrt()
    return w * xf.to(x.dtype)


def _rope(x: Any, cos: Any, sin: Any) -> Any:
    import torch

    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Qwen3Step(HarvestStep):
    """The harvestable Qwen3 step (module docstring) over the checkpoint in `checkpoint_dir`, with a cache of
    `context` positions, compiled with torch.compile(mode=`mode`) unless `mode` is None (eager, for tests of the
    formulas)."""

    def __init__(self, checkpoint_dir: str | Path, context: int, mode: str | None = COMPILE_MODE,
                 dynamic: str = "unbacked", device: str = "cuda") -> None:
        import torch
        import torch._inductor.config as inductor
        from safetensors.torch import load_file

        root = Path(checkpoint_dir)
        self.config = s = Qwen3Config.from_json(json.loads((root / "config.json").read_text()), str(root / "config.json"))
        self.context, self.dynamic, self.device = context, dynamic, device
        tensors: dict[str, Any] = {}
        for shard in sorted(root.glob("*.safetensors")):
            tensors.update(load_file(str(shard), device=device))
        self._weights = {k: v.contiguous() for k, v in sorted(tensors.items())}
        self._states = {}
        for i in range(s.layers):
            for kind in ("k", "v"):
                self._states[f"{kind}_cache.{i}"] = torch.zeros(s.kv_heads, context, s.head_dim, dtype=torch.bfloat16,
                                                                device=device)
        inductor.max_autotune_gemm_backends = "TRITON"
        self._fn = self.forward if mode is None else torch.compile(self.forward, mode=mode, fullgraph=True)

    def weights(self) -> dict[str, Any]:
        return self._weights

    def states(self) -> dict[str, Any]:
        return self._states

    def inputs(self, tokens: int, start: int = 0, ids: list[int] | None = None) -> dict[str, Any]:
        """token_ids (`ids`, or a fixed pattern of ids) and positions `start .. start + tokens - 1`."""
        import torch

        values = ids if ids is not None else [(7 * i + 3) % self.config.vocab for i in range(tokens)]
        return {"token_ids": torch.tensor(values, dtype=torch.int64, device=self.device),
                "positions": torch.arange(start, start + tokens, dtype=torch.int64, device=self.device)}

    def step(self, inputs: dict[str, Any]) -> dict[str, Any]:
        import torch

        from torch._dynamo.decorators import mark_dynamic, mark_unbacked  # torch 2.11 has no torch._dynamo.mark_unbacked

        ids, positions = inputs["token_ids"], inputs["positions"]
        if self.dynamic == "unbacked":
            mark_unbacked(ids, 0)
            mark_unbacked(positions, 0)
        elif self.dynamic == "backed":
            mark_dynamic(ids, 0)
            mark_dynamic(positions, 0)
        with torch.inference_mode():
            next_token, logits = self._fn(self._weights, self._states, ids, positions)
        return {"next_token": next_token, "logits": logits}

    def forward(self, w: dict[str, Any], states: dict[str, Any], token_ids: Any, positions: Any) -> tuple[Any, Any]:
        import torch
        import torch.nn.functional as F

        s = self.config
        T, D, G = token_ids.shape[0], s.head_dim, s.q_heads // s.kv_heads
        residual = F.embedding(token_ids, w["model.embed_tokens.weight"])  # [T, hidden]
        inv_freq = 1.0 / (s.rope_theta ** (torch.arange(0, D, 2, dtype=torch.int64, device=token_ids.device).float() / D))
        freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(torch.bfloat16)[:, None, :], emb.sin().to(torch.bfloat16)[:, None, :]  # [T, 1, D]
        keys = torch.arange(self.context, device=token_ids.device)
        visible = (keys[None, :] <= positions[:, None]).repeat(G, 1)  # [G*T, S]: row g*T + t is token t's
        for i in range(s.layers):
            p = f"model.layers.{i}."
            h = _rms(residual, w[p + "input_layernorm.weight"], s.eps)
            q = (h @ w[p + "self_attn.q_proj.weight"].t()).view(T, s.q_heads, D)
            k = (h @ w[p + "self_attn.k_proj.weight"].t()).view(T, s.kv_heads, D)
            v = (h @ w[p + "self_attn.v_proj.weight"].t()).view(T, s.kv_heads, D)
            q = _rope(_rms(q, w[p + "self_attn.q_norm.weight"], s.eps), cos, sin)
            k = _rope(_rms(k, w[p + "self_attn.k_norm.weight"], s.eps), cos, sin)
            kc, vc = states[f"k_cache.{i}"], states[f"v_cache.{i}"]  # [Hkv, S, D]
            kc.index_copy_(1, positions, k.transpose(0, 1))
            vc.index_copy_(1, positions, v.transpose(0, 1))
            qh = q.transpose(0, 1).reshape(s.kv_heads, G * T, D)  # query head kv*G + g -> [Hkv, G*T, D]
            scores = (qh @ kc.transpose(1, 2)).float() * (D ** -0.5)  # [Hkv, G*T, S]
            probs = scores.masked_fill(~visible, float("-inf")).softmax(-1).to(torch.bfloat16)
            attn = (probs @ vc).reshape(s.q_heads, T, D).transpose(0, 1).reshape(T, s.q_heads * D)
            residual = residual + attn @ w[p + "self_attn.o_proj.weight"].t()
            h = _rms(residual, w[p + "post_attention_layernorm.weight"], s.eps)
            gate, up = h @ w[p + "mlp.gate_proj.weight"].t(), h @ w[p + "mlp.up_proj.weight"].t()
            residual = residual + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].t()
        head = w["model.embed_tokens.weight"] if s.tied else w["lm_head.weight"]
        logits = _rms(residual, w["model.norm.weight"], s.eps) @ head.t()  # [T, vocab]
        return logits.argmax(-1), logits


def reference_greedy(step: Qwen3Step, prompt: list[int], steps: int) -> tuple[list[int], Any]:
    """torch's side of the replay check (greedy.feed_greedy): `prompt` then `steps` greedy tokens through `step`
    (its compiled kernels, states as they are: zero for a fresh step). Returns (the greedy tokens, the logits of
    every step as a float32 numpy array `[len(prompt) + steps - 1, vocab]`)."""
    import torch

    def run(token: int, position: int) -> tuple[int, Any]:
        out = step.step(step.inputs(1, start=position, ids=[token]))
        return int(out["next_token"][0]), out["logits"].float().cpu()

    tokens, rows = feed_greedy(prompt, steps, run)
    return tokens, torch.cat(rows).numpy()
