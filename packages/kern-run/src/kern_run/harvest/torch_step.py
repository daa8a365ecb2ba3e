"""A Qwen3 step in plain torch, written to be harvested (GPU machine only; torch is imported on use).

What makes it harvestable, each a rule of docs/harvest.md "What cannot be harvested":

- the weights are the checkpoint's own tensors under their checkpoint names (no concatenation at load), so every
  weight pointer is a checkpoint name plus an offset and binds straight from the checkpoint;
- every derived table is computed inside the step (the rope angles from `positions`, the causal mask from an
  `arange`), so no tensor lives outside the checkpoint, the states, the inputs and the outputs;
- attention is products, sums and a softmax (no SDPA: its flash / memory-efficient kernels take a struct of
  pointers; no matmul either, whose views and bmm lowering inductor refused for an unbacked token count), and
  inductor's GEMM backend for the projections is its Triton templates (`max_autotune_gemm_backends="TRITON"`):
  cuBLAS kernels take their operands through a struct too;
- the KV cache is one zeroed state per layer and kind, `k_cache.L` / `v_cache.L` bf16 `[kv_heads, context,
  head_dim]`, written at `positions` with `index_copy_` (a kernel, not a host copy);
- the token dimension of the inputs is marked unbacked (`torch._dynamo.mark_unbacked`), so one compiled graph
  (the same kernels) serves every token count, 1 included (a backed size would specialise 1).

`scope` says what one compiled graph covers. `"layer"` (the default) compiles three functions: the prelude
(embedding, rope tables, causal mask), one decoder layer, and the head (final norm, lm_head, argmax). The one
compiled layer serves every layer: its weights and KV states are arguments, so every layer's launches run the same
kernels over other pointers, as bench/torch_qwen3.py's torch.compile peer does. This is for the time it takes:
max-autotune over a whole 36-layer step did not finish compiling in 250 s on the H200, one 4B layer compiles in
about 60 s, and the tiny-en step capture was still autotuning after 140 s. Inside the layer, `torch._check` ties
each argument's token dimension to `positions`' (unbacked sizes of different tensors are otherwise unrelated).
`"step"` compiles the whole step as one graph (inductor may then fuse across layer boundaries).

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
COMPILE_SCOPES = ("layer", "step")  # what one compiled graph covers (module docstring)
# a decoder layer's weights as Qwen3Step.layer takes them, each under "model.layers.<i>."
LAYER_WEIGHTS = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                 "self_attn.v_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
                 "self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
                 "mlp.up_proj.weight", "mlp.down_proj.weight")


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
    formulas). `autotune_tokens`: the token count max-autotune times an unbacked size at
    (`torch._inductor.config.unbacked_symint_fallback`; None keeps inductor's 8192, at which the 4B capture of
    2026-12-03 tuned every GEMM: prefill tiles, 13.1 ms/token at one token)."""

    def __init__(self, checkpoint_dir: str | Path, context: int, mode: str | None = COMPILE_MODE,
                 dynamic: str = "unbacked", device: str = "cuda", scope: str = "layer",
                 autotune_tokens: int | None = None) -> None:
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
        if autotune_tokens is not None:  # the size max-autotune benchmarks an unbacked token count at (else 8192)
            inductor.unbacked_symint_fallback = int(autotune_tokens)
        if scope not in COMPILE_SCOPES:
            raise ValueError(f"scope {scope!r}: expected one of {', '.join(COMPILE_SCOPES)}")
        self.scope = scope

        def compiled(fn: Any) -> Any:
            return fn if mode is None else torch.compile(fn, mode=mode, fullgraph=True)

        self._fn = compiled(self.forward)
        self._prelude, self._layer, self._head = compiled(self.prelude), compiled(self.layer), compiled(self.head)

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

        ids, positions = inputs["token_ids"], inputs["positions"]
        self._mark_tokens(ids, positions)
        with torch.inference_mode():
            if self.scope == "step":
                next_token, logits = self._fn(self._weights, self._states, ids, positions)
            else:
                next_token, logits = self._layered(ids, positions)
        return {"next_token": next_token, "logits": logits}

    def _mark_tokens(self, *tensors: Any) -> None:
        """Dimension 0 (the token count) of each of `tensors`: unbacked, backed dynamic or, for "static", left as
        it is (`dynamic`; the module docstring)."""
        from torch._dynamo.decorators import mark_dynamic, mark_unbacked  # torch 2.11 has no torch._dynamo.mark_unbacked

        mark = {"unbacked": mark_unbacked, "backed": mark_dynamic}.get(self.dynamic)
        if mark is not None:
            for t in tensors:
                mark(t, 0)

    def _layered(self, ids: Any, positions: Any) -> tuple[Any, Any]:
        """The step as the three compiled pieces of scope "layer" (module docstring); each piece's tensors with a
        token dimension get it marked as `step` marks the inputs'."""
        w = self._weights
        residual, cos, sin, visible = self._prelude(w["model.embed_tokens.weight"], ids, positions)
        for i in range(self.config.layers):
            self._mark_tokens(residual, cos, sin, visible)
            residual = self._layer(residual, cos, sin, visible, positions, self._layer_weights(i),
                                   self._states[f"k_cache.{i}"], self._states[f"v_cache.{i}"])
        self._mark_tokens(residual)
        return self._head(residual, w["model.norm.weight"], self._head_weight())

    def _layer_weights(self, i: int) -> tuple[Any, ...]:
        p, w = f"model.layers.{i}.", self._weights
        return tuple(w[p + name] for name in LAYER_WEIGHTS)

    def _head_weight(self) -> Any:
        return self._weights["model.embed_tokens.weight" if self.config.tied else "lm_head.weight"]

    def forward(self, w: dict[str, Any], states: dict[str, Any], token_ids: Any, positions: Any) -> tuple[Any, Any]:
        """The whole step (scope "step"): the prelude, every layer, the head, traced as one graph."""
        residual, cos, sin, visible = self.prelude(w["model.embed_tokens.weight"], token_ids, positions)
        for i in range(self.config.layers):
            residual = self.layer(residual, cos, sin, visible, positions, self._layer_weights(i),
                                  states[f"k_cache.{i}"], states[f"v_cache.{i}"])
        return self.head(residual, w["model.norm.weight"], self._head_weight())

    def prelude(self, embed: Any, token_ids: Any, positions: Any) -> tuple[Any, Any, Any, Any]:
        """token_ids, positions (i64 [T]) -> the embedded rows (bf16 [T, hidden]), the rope cos / sin (bf16
        [T, 1, head_dim]) and the causal mask (bool [T, context])."""
        import torch
        import torch.nn.functional as F

        s = self.config
        D = s.head_dim
        residual = F.embedding(token_ids, embed)  # [T, hidden]
        inv_freq = 1.0 / (s.rope_theta ** (torch.arange(0, D, 2, dtype=torch.int64, device=token_ids.device).float() / D))
        freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(torch.bfloat16)[:, None, :], emb.sin().to(torch.bfloat16)[:, None, :]  # [T, 1, D]
        keys = torch.arange(self.context, device=token_ids.device)
        visible = keys[None, :] <= positions[:, None]  # [T, S]
        return residual, cos, sin, visible

    def layer(self, residual: Any, cos: Any, sin: Any, visible: Any, positions: Any, lw: tuple[Any, ...], kc: Any,
              vc: Any) -> Any:
        """One decoder layer: the residual rows (bf16 [T, hidden]) after it; writes the layer's K / V (bf16
        [kv_heads, context, head_dim]) at `positions`. `lw`: the layer's weights in LAYER_WEIGHTS order."""
        import torch
        import torch.nn.functional as F

        s = self.config
        T, D, G = positions.shape[0], s.head_dim, s.q_heads // s.kv_heads
        for t in (residual, cos, sin, visible):  # one token count (module docstring)
            torch._check(t.shape[0] == T)
        ln1, wq, wk, wv, qn, kn, wo, ln2, wg, wu, wd = lw
        h = _rms(residual, ln1, s.eps)
        q = (h @ wq.t()).view(T, s.q_heads, D)
        k = (h @ wk.t()).view(T, s.kv_heads, D)
        v = (h @ wv.t()).view(T, s.kv_heads, D)
        q = _rope(_rms(q, qn, s.eps), cos, sin)
        k = _rope(_rms(k, kn, s.eps), cos, sin)
        kc.index_copy_(1, positions, k.transpose(0, 1))  # [Hkv, S, D]
        vc.index_copy_(1, positions, v.transpose(0, 1))
        # query head kv*G + g attends with kv head kv. Products and sums, not matmuls: [Hkv, G, T, 1, D] times
        # [Hkv, 1, 1, S, D] summed over D, then [Hkv, G, T, S, 1] times [Hkv, 1, 1, S, D] summed over S (fp32
        # accumulation, as a bf16 matmul's), so no view merges the token dimension with another and no bmm
        # lowering guards on it (torch 2.13's inductor refused both for an unbacked token count, on the CPU)
        qh = q.transpose(0, 1).view(s.kv_heads, G, T, 1, D)
        scores = (qh.float() * kc[:, None, None].float()).sum(-1) * (D ** -0.5)  # [Hkv, G, T, S]
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1).to(torch.bfloat16)
        attn = (probs[..., None].float() * vc[:, None, None].float()).sum(-2).to(torch.bfloat16)  # [Hkv, G, T, D]
        attn = attn.view(s.q_heads, T, D).transpose(0, 1).reshape(T, s.q_heads * D)
        residual = residual + attn @ wo.t()
        h = _rms(residual, ln2, s.eps)
        gate, up = h @ wg.t(), h @ wu.t()
        return residual + (F.silu(gate) * up) @ wd.t()

    def head(self, residual: Any, norm: Any, lm_head: Any) -> tuple[Any, Any]:
        """The final norm and lm_head: (the greedy argmax i64 [T], the logits bf16 [T, vocab])."""
        logits = _rms(residual, norm, self.config.eps) @ lm_head.t()  # [T, vocab]
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
