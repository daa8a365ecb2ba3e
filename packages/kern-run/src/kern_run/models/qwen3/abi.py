"""The kernel contract the Qwen3 builder wires against, and kernels.json: the ABI the build read from the cubins.

`KERNEL_SIGNATURES` is the contract of docs/kernels.md (entry -> module, parameter types); `read_kernel_abi(dir)`
reads `<dir>/kernels.json` (written by tools/build_kernels.py) and checks every entry's params against it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import ManifestBuildError
from .jsonio import read_json_file

# The kernel contract (docs/kernels.md): entry -> (module, parameter types). "p" is a pointer (8 bytes),
# "i32"/"f32" 4 bytes, "i64" 8 bytes. kernels.json's params (read from the cubin) must match these.
KERNEL_SIGNATURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "kern_embed_gather": ("embed", ("p", "p", "p", "i32", "i32", "i32")),
    "kern_add_rmsnorm": ("norm", ("p", "p", "p", "p", "i32", "i32", "f32")),
    "kern_rope_table": ("rope", ("p", "i32", "i32", "f32")),
    "kern_rope_table_llama3": ("rope", ("p", "i32", "i32") + ("f32",) * 5),
    "kern_qk_norm_rope_kv": ("rope", ("p",) * 8 + ("i32",) * 7 + ("f32",)),
    "kern_qk_norm_rope_kv_warp": ("rope", ("p",) * 8 + ("i32",) * 7 + ("f32",)),
    "kern_attn_decode_partial": ("attention", ("p",) * 6 + ("i32",) * 8 + ("f32",)),
    "kern_attn_decode_reduce": ("attention", ("p",) * 4 + ("i32",) * 4),
    "kern_attn_prefill": ("attention", ("p",) * 6 + ("i32",) * 6 + ("f32",)),
    "kern_attn_prefill_r32": ("attention", ("p",) * 6 + ("i32",) * 6 + ("f32",)),
    "kern_attn_prefill_wg": ("attention_wg", ("p",) * 6 + ("i32",) * 6 + ("f32",)),
    "kern_silu_mul": ("act", ("p", "p", "i32", "i32")),
    "kern_argmax_partial": ("argmax", ("p", "i32", "i32", "p", "p", "i32")),
    "kern_argmax_final": ("argmax", ("p", "p", "i32", "p")),
    "kern_gemv_rmsnorm": ("gemv", ("p", "p", "p", "p", "i32", "i32", "f32")),
    "kern_gemv_residual": ("gemv", ("p", "p", "p", "i32", "i32")),
    "kern_gemv_silu_residual": ("gemv", ("p", "p", "p", "i32", "i32")),
    "kern_gemv_rows": ("gemv", ("p", "p", "p", "i32", "i32")),
    "kern_gemv_rows_rmsnorm": ("gemv", ("p", "p", "p", "p", "i32", "i32", "f32")),
    "kern_gemv_rows_residual": ("gemv", ("p", "p", "p", "i32", "i32")),
    "kern_gemv_rmsnorm_swiglu": ("gemv", ("p", "p", "p", "p", "i32", "i32", "f32")),
    "kern_attn_decode_partial_fast": ("attention", ("p",) * 6 + ("i32",) * 8 + ("f32",)),
    "kern_attn_decode_partial_early": ("attention", ("p",) * 7 + ("i32",) * 8 + ("f32",)),
    "kern_attn_decode_partial_wide": ("attention", ("p",) * 7 + ("i32",) * 8 + ("f32",)),
    "kern_attn_decode_partial_stream": ("attention_decode", ("p",) * 7 + ("i32",) * 8 + ("f32",)),
    "kern_attn_decode_partial_gqa": ("attention_decode", ("p",) * 7 + ("i32",) * 8 + ("f32",)),
    "kern_attn_decode_gqa_fused": ("attention_decode", ("p",) * 9 + ("i32",) * 8 + ("f32",)),
    "kern_decode_advance": ("step", ("p",) * 7 + ("i32",) * 5),
    "kern_decode_advance_packed": ("step", ("p",) * 9 + ("i32",) * 5),
    "kern_sample_inputs_init": ("step", ("p",) * 3 + ("i32",) * 2),
    "kern_sample_bf16": ("sample", ("p",) * 5 + ("i32",) * 2 + ("p",) * 4),
    "kern_sample_top_logprobs_bf16": ("sample", ("p", "p", "i32", "i32", "p", "p")),
    "kern_sample_history_append": ("sample", ("p",) * 3 + ("i32",) * 2),
    # small-M MMA projections (kernels-src/gemv_mma.cu, docs/kernels-gemv.md "Small-M MMA entries"): m, n, k
    **{f"kern_mma_{kind}_m{tile}": ("gemv_mma", ("p",) * (3 if kind == "residual" else 4) + ("i32",) * 3
                                    + (() if kind == "residual" else ("f32",)))
       for kind in ("rmsnorm", "residual", "rmsnorm_swiglu") for tile in (8, 16, 32, 64)},
    # multi-row rows family (kernels-src/gemv.cu, docs/kernels-gemv.md "Multi-row rows entries"): the M = 1
    # signature, then m
    **{f"kern_gemv_rows_rmsnorm_m{t}": ("gemv", ("p", "p", "p", "p", "i32", "i32", "f32", "i32")) for t in (2, 4, 8)},
    **{f"kern_gemv_rmsnorm_swiglu_m{t}": ("gemv", ("p", "p", "p", "p", "i32", "i32", "f32", "i32")) for t in (2, 4, 8)},
    **{f"kern_gemv_rows_residual_m{t}": ("gemv", ("p", "p", "p", "i32", "i32", "i32")) for t in (2, 4, 8)},
    # multi-row v1 RMSNorm GEMV (the lm_head's; docs/kernels-gemv.md "Multi-row rows entries"): the M = 1 signature,
    # then m
    **{f"kern_gemv_rmsnorm_m{t}": ("gemv", ("p", "p", "p", "p", "i32", "i32", "f32", "i32")) for t in (2, 4, 8)},
    # one-shot all-reduce over peer memory (kernels-src/allreduce.cu, docs/runtime.md "One-shot all-reduce"): peers,
    # rank, size, x, out (or residual), count, capacity, blocks, status, timeout_ns
    **{e: ("allreduce", ("p", "i32", "i32", "p", "p", "i32", "i32", "i32", "p", "i64"))
       for e in ("kern_allreduce_bf16", "kern_allreduce_add_bf16")},
    # one-shot all-gather (the vocabulary-parallel logits): peers, rank, size, x, out, rows, vocab, slice, capacity,
    # blocks, status, timeout_ns
    "kern_allgather_bf16": ("allreduce", ("p", "i32", "i32", "p", "p", "i32", "i32", "i32", "i32", "i32", "p", "i64")),
    # the skinny wgmma GEMM of the batch-invariant decode (kernels-src/gemm_skinny.cu, docs/kernels.md "Skinny GEMM"):
    # a, w, c, ws, tickets, m, n, k, swiglu
    **{f"kern_gemm_skinny_n{bn}": ("gemm_skinny", ("p",) * 5 + ("i32",) * 4) for bn in (128, 256)},
}
# Entries that execute griddepcontrol.wait before reading anything a predecessor writes and before writing
# anything (docs/kernels-gemv.md, docs/kernels.md "Programmatic dependent launch"); only these may carry
# `pdl: true`. tests/run/test_decode_pdl_sass.py checks every pdl launch of the committed manifests against
# the SASS of the committed cubin (ACQBULK present) when cuobjdump is available.
PDL_ENTRIES = frozenset({
    "kern_gemv_rmsnorm", "kern_gemv_residual", "kern_gemv_silu_residual",
    "kern_gemv_rows", "kern_gemv_rows_rmsnorm", "kern_gemv_rows_residual", "kern_gemv_rmsnorm_swiglu",
    "kern_attn_decode_partial", "kern_attn_decode_partial_fast", "kern_attn_decode_reduce", "kern_attn_prefill",
    "kern_qk_norm_rope_kv", "kern_embed_gather", "kern_argmax_partial", "kern_argmax_final",
    "kern_decode_advance", "kern_attn_decode_partial_early", "kern_attn_decode_partial_wide",
    "kern_attn_prefill_r32", "kern_qk_norm_rope_kv_warp", "kern_attn_prefill_wg",
    "kern_decode_advance_packed", "kern_sample_inputs_init", "kern_sample_bf16", "kern_sample_top_logprobs_bf16",
    "kern_sample_history_append",
    *(f"kern_mma_{kind}_m{tile}" for kind in ("rmsnorm", "residual", "rmsnorm_swiglu") for tile in (8, 16, 32, 64)),
    "kern_attn_decode_partial_stream", "kern_attn_decode_partial_gqa", "kern_attn_decode_gqa_fused",
    *(f"kern_gemv_{kind}_m{t}" for kind in ("rows_rmsnorm", "rmsnorm_swiglu", "rows_residual", "rmsnorm")
      for t in (2, 4, 8)),
    "kern_allreduce_bf16", "kern_allreduce_add_bf16", "kern_allgather_bf16",
    "kern_gemm_skinny_n128", "kern_gemm_skinny_n256",  # weight copies before the wait: no kernel writes weights
    "kern_add_rmsnorm", "kern_silu_mul",
})
TYPE_BYTES = {"p": 8, "i32": 4, "f32": 4, "i64": 8}


def _is_pair(p: Any) -> bool:
    """An [offset, size] pair of JSON integers >= 0."""
    return (isinstance(p, list) and len(p) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in p))


def _module_entries(where: str, mod: Any) -> dict[str, list[list[int]]]:
    """One kernels.json module record's entries: entry -> params. Raises naming `where` (the module's path)."""
    if not isinstance(mod, dict):
        raise ManifestBuildError(f"{where} is a JSON {type(mod).__name__}, expected an object")
    if not isinstance(mod.get("sha256"), str):
        raise ManifestBuildError(f"{where}.sha256 is {json.dumps(mod.get('sha256'))[:80]}, expected the cubin's "
                                 "sha256 string")
    mod_entries = mod.get("entries", {})
    if not isinstance(mod_entries, dict):
        raise ManifestBuildError(f"{where}.entries is a JSON {type(mod_entries).__name__}, expected an object")
    out = {}
    for entry, info in sorted(mod_entries.items()):
        params = info.get("params") if isinstance(info, dict) else None
        if not isinstance(params, list) or not all(_is_pair(p) for p in params):
            raise ManifestBuildError(f"{where}.entries.{entry}.params must be a list of [offset, size] integer "
                                     f"pairs, got {json.dumps(params)[:120]}")
        out[entry] = [[int(o), int(s)] for o, s in params]
    return out


def _check_contract(entries: dict[str, tuple[str, list[list[int]]]], source: str) -> None:
    """Every contract entry present in kernels.json has the contract's param sizes; absent ones are refused only
    when a launch uses them (Builder.launch): options may not need every entry."""
    for entry, (_, types) in KERNEL_SIGNATURES.items():
        if entry not in entries:
            continue
        sizes = [s for _, s in entries[entry][1]]
        want = [TYPE_BYTES[t] for t in types]
        if sizes != want:
            raise ManifestBuildError(f"{source} entry {entry!r} has param sizes {sizes}, the kernel contract "
                                     f"(docs/kernels.md) says {want} for {types}")


@dataclass(frozen=True)
class KernelAbi:
    """kernels.json: module -> sha256, and entry -> (module, params [[offset_bytes, size_bytes], ...])."""

    modules: dict[str, str]
    entries: dict[str, tuple[str, list[list[int]]]]
    digest: str
    source: str = "kernels.json"

    @classmethod
    def from_json(cls, raw: Any, source: str = "kernels.json") -> "KernelAbi":
        """Raises ManifestBuildError naming `source` and the module / entry whose record is malformed (not an
        object, no sha256 string, params not a list of [offset, size] JSON integer pairs) or whose ABI does not
        match the kernel contract. An entry name in two modules: the contract's module wins."""
        if not isinstance(raw, dict):
            raise ManifestBuildError(f"{source}: a JSON {type(raw).__name__}, expected a kernels.json object")
        if raw.get("format") != "kern-kernels/1":
            raise ManifestBuildError(f"{source} format is {raw.get('format')!r}, expected 'kern-kernels/1'")
        raw_modules = raw.get("modules", {})
        if not isinstance(raw_modules, dict):
            raise ManifestBuildError(f"{source}: modules is a JSON {type(raw_modules).__name__}, expected an object")
        modules: dict[str, str] = {}
        entries: dict[str, tuple[str, list[list[int]]]] = {}
        for mod_name, mod in sorted(raw_modules.items()):
            for entry, params in _module_entries(f"{source}: modules.{mod_name}", mod).items():
                contract_module = KERNEL_SIGNATURES.get(entry, (mod_name,))[0]
                if not (entry in entries and entries[entry][0] == contract_module):
                    entries[entry] = (mod_name, params)
            modules[mod_name] = mod["sha256"]
        _check_contract(entries, source)
        canonical = json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()
        return cls(modules, entries, hashlib.sha256(canonical).hexdigest(), source)


def kernels_json_path(kernels: Path) -> Path:
    """The kernels.json of a kernels directory; a path to a .json file is taken as the file itself."""
    return kernels if kernels.suffix == ".json" else kernels / "kernels.json"


def read_kernel_abi(kernels: Path) -> KernelAbi:
    """The ABI of kernels directory `kernels` (its kernels.json; a path to a kernels.json file is accepted too).
    Raises ManifestBuildError naming the file when it cannot be read, is not UTF-8 JSON, or its records are
    malformed or disagree with the kernel contract."""
    path = kernels_json_path(kernels)
    return KernelAbi.from_json(read_json_file(path)[0], str(path))


def stub_kernels_json() -> dict[str, Any]:
    """A kernels.json with the contract's ABI (naturally aligned params) and fake hashes, for tests."""
    modules: dict[str, Any] = {}
    for entry, (module, types) in sorted(KERNEL_SIGNATURES.items()):
        params, offset = [], 0
        for t in types:
            size = TYPE_BYTES[t]
            offset = (offset + size - 1) // size * size
            params.append([offset, size])
            offset += size
        mod = modules.setdefault(module, {
            "file": f"{module}-{hashlib.sha256(module.encode()).hexdigest()[:12]}.cubin",
            "sha256": hashlib.sha256(module.encode()).hexdigest(), "source": f"kernels-src/{module}.cu",
            "flags": [], "entries": {},
        })
        mod["entries"][entry] = {"params": params, "registers": 32, "constants": {}}
    return {"format": "kern-kernels/1", "toolchain": "stub", "arch": "sm_90", "modules": modules}
