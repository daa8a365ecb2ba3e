"""The Hugging Face transformers reference: the checkpoint's own model class (`AutoModelForCausalLM`: Qwen3ForCausalLM
or LlamaForCausalLM, from config.json `architectures`) on the same checkpoint, teacher-forced.

Imported only by `kern test --against transformers`, the parity tests and tools/parity.py (torch and
transformers are on the GPU machine, not dependencies of kern-run).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np


class HfReference:
    """`AutoModelForCausalLM.from_pretrained(weights, bf16)` on one GPU; logits for given ids, teacher-forced."""

    def __init__(self, weights: "Path | str | Sequence[Path | str]", gpu: int = 0, attn_implementation: str = "eager",
                 dtype: str = "bfloat16") -> None:
        """`weights`: a checkpoint directory (or whatever `from_pretrained` takes), or one .safetensors file or a
        list of them: their tensors as the state dict, the HF config.json beside the first (kern_run.abtest checks
        it is there). `dtype`: "bfloat16" (the checkpoint's own, what kern computes in) or "float32" (the bf16
        weights upcast exactly: the higher-precision reference that calibrates what bf16 error is)."""
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.device = torch.device(f"cuda:{gpu}")
        torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
        kwargs: dict = {"attn_implementation": attn_implementation}
        if isinstance(weights, (str, os.PathLike)) and Path(weights).is_file():
            weights = [weights]  # one .safetensors file: from_pretrained takes directories, not files
        source: str | None = str(weights) if isinstance(weights, (str, os.PathLike)) else None
        if source is None:  # a list of files: config.json beside the first, the files' tensors as the state dict
            from safetensors.torch import load_file
            from transformers import AutoConfig

            files = [str(f) for f in weights]
            state_dict: dict = {}
            for f in files:
                state_dict.update(load_file(f))
            kwargs.update(config=AutoConfig.from_pretrained(str(Path(files[0]).parent)), state_dict=state_dict)
        try:
            model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, **kwargs)
        except TypeError:  # transformers 4.x spells it torch_dtype
            model = AutoModelForCausalLM.from_pretrained(source, torch_dtype=torch_dtype, **kwargs)
        self.model = model.to(self.device).eval()

    def logits(self, ids: list[int], start: int = 0) -> np.ndarray:
        """f32[len(ids) - start, vocab]: row j is the model's (bf16) logits after ids[: start + j + 1]."""
        torch = self.torch
        with torch.inference_mode():
            input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
            keep = len(ids) - start
            try:
                out = self.model(input_ids=input_ids, logits_to_keep=keep, use_cache=False)
            except TypeError:
                out = self.model(input_ids=input_ids, use_cache=False)
            logits = out.logits[0, -keep:, :]  # bf16[keep, vocab]
            return logits.float().cpu().numpy()

    def greedy(self, ids: list[int], steps: int) -> list[int]:
        """`steps` greedy tokens after `ids` (transformers' generate, no sampling, EOS ignored)."""
        torch = self.torch
        with torch.inference_mode():
            input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
            out = self.model.generate(input_ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                                      temperature=None, top_p=None, top_k=None)
            return out[0, len(ids):].tolist()

    def close(self) -> None:
        del self.model
        self.torch.cuda.empty_cache()
