"""The manifest builder of the dense decoder families, Qwen3 and Llama 3.x (kern_run.models.family: what differs
between them), from a config.json (docs/manifest.md, docs/caller.md). The package keeps the name of its first family.

The build runs in stages, each its own module:

- `shapes`: the table of known shapes (`SHAPES`, gpt-fast's `ModelArgs.from_name` table: Qwen3 and Llama 3.x) and
  their config.json;
- `config`: `Qwen3Config.from_json` / `from_name`, the config fields validated (refusals name field and value; the
  family from `architectures` / `model_type`);
- `options`: `BuildOptions` (the `kern manifest build` flags) and `validate` -> `Plan` (checked, automatic
  choices made); `pins`: the cuBLASLt pins file;
- `abi`: the kernel contract and `read_kernel_abi(kernels_dir)` (kernels.json);
- `buffers` / `binds`: inputs, outputs, workspace; weight buffers with their checkpoint binds, KV states;
- `ops`, `attention`, `gemv`, `gemm`: the ops and their launches; `programs`: the call tables;
- `manifest`: `build_manifest` puts them together; `tp`: per-rank tensor-parallel manifests;
- `command`: what `kern manifest build` runs (read, build, verify, write whole).

    from pathlib import Path
    from kern_run.models import qwen3
    cfg = qwen3.Qwen3Config.from_name("qwen3-4b")
    manifest = qwen3.build_manifest(cfg, qwen3.read_kernel_abi(Path("kernels")), qwen3.BuildOptions("qwen3-4b"))

Every refusal is a `kern_run.errors.ManifestBuildError`.
"""

from ...errors import ManifestBuildError
from .abi import KERNEL_SIGNATURES, PDL_ENTRIES, TYPE_BYTES, KernelAbi, read_kernel_abi, stub_kernels_json
from .command import BuildRequest, build, build_texts
from .config import Qwen3Config
from .entries import (DECODE_ATTN, EARLY_PARTIALS, PREFILL_ATTN, PREFILL_WG_HEAD_DIMS, prefill_rows_per_block,
                      rope_warp_heads)
from .gemv import rows_launch
from .jsonio import dumps, manifest_digest, read_json_file
from .manifest import GENERATOR, build_manifest
from .options import BuildOptions, Plan, decode_num_splits, prefill_shapes, validate
from .pins import ALGO_ATTRS, INVARIANT_DECODE_M_MAX, invariant_decode_from_doc, load_algos, pins_from_doc
from .shapes import SHAPES, LlamaShape, Qwen3Shape, config_json, config_text
from .tp import build_rank_manifests, rank_binds, rank_path, shard_config

__all__ = [
    "ALGO_ATTRS", "DECODE_ATTN", "INVARIANT_DECODE_M_MAX", "EARLY_PARTIALS", "GENERATOR", "KERNEL_SIGNATURES", "PDL_ENTRIES", "PREFILL_ATTN",
    "PREFILL_WG_HEAD_DIMS", "SHAPES", "TYPE_BYTES", "BuildOptions", "BuildRequest", "KernelAbi", "ManifestBuildError",
    "LlamaShape", "Plan", "Qwen3Config", "Qwen3Shape", "build", "build_manifest", "build_rank_manifests",
    "build_texts", "config_json", "config_text", "decode_num_splits", "dumps", "invariant_decode_from_doc",
    "load_algos", "manifest_digest", "pins_from_doc", "prefill_rows_per_block", "prefill_shapes", "read_json_file",
    "read_kernel_abi", "rank_binds",
    "rank_path", "rope_warp_heads", "rows_launch", "shard_config", "stub_kernels_json", "validate",
]
