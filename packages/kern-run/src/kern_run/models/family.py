"""The dense decoder families the manifest builder (kern_run.models.qwen3) covers, as data: what a Qwen3 and a Llama
3 checkpoint differ in, and which family a config.json names.

Both are the same pre-norm decoder (RMSNorm, GQA attention with neox RoPE, SwiGLU MLP, optional tied lm_head) under
the same Hugging Face tensor names; they differ in

- the per-head q / k RMSNorm before RoPE (Qwen3's `self_attn.q_norm` / `k_norm`; Llama has none),
- the RoPE frequencies (Qwen3: plain; Llama 3.1 / 3.2: `rope_type` "llama3", `Llama3Scaling`),
- the bias flags that must be false (`attention_bias`; Llama also `mlp_bias`),
- transformers' defaults for the keys a config.json may omit (`configuration_qwen3.py`, `configuration_llama.py`).

`family_of(cfg, source)` picks the family from `architectures` (else `model_type`) or refuses in one line naming the
field and its value; every refusal is a `ManifestBuildError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ManifestBuildError


def shown(value: Any) -> str:
    """repr(value), cut to 60 characters (a refusal names the value, not a whole JSON object)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class Family:
    """One decoder family. `name` is meta.family; `architecture` / `model_type` are the config.json values;
    `defaults` transformers' config defaults of the optional keys (head_dim None: hidden_size //
    num_attention_heads)."""

    name: str
    label: str  # in refusals: "Qwen3", "Llama"
    architecture: str
    model_type: str
    qk_norm: bool  # per-head RMSNorm of q and k before RoPE (layer tensors self_attn.q_norm / k_norm)
    llama3_rope: bool  # whether rope_type "llama3" is taken (else plain RoPE only)
    bias_keys: tuple[str, ...]  # config keys that must be false (no bias kernels)
    head_dim: int | None
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int

    def layer_tensors(self, layer: int) -> dict[str, tuple[str, ...]]:
        """Buffer name -> the checkpoint tensors bound into it, in order (q/k/v and gate/up concatenated), of
        layer `layer`: ln_in, w_qkv, q_norm and k_norm (qk_norm families only), w_o, ln_post, w_gate_up, w_down."""
        p = f"model.layers.{layer}."
        out = {f"ln_in.{layer}": (p + "input_layernorm.weight",),
               f"w_qkv.{layer}": tuple(p + f"self_attn.{x}_proj.weight" for x in "qkv")}
        if self.qk_norm:
            out[f"q_norm.{layer}"] = (p + "self_attn.q_norm.weight",)
            out[f"k_norm.{layer}"] = (p + "self_attn.k_norm.weight",)
        out[f"w_o.{layer}"] = (p + "self_attn.o_proj.weight",)
        out[f"ln_post.{layer}"] = (p + "post_attention_layernorm.weight",)
        out[f"w_gate_up.{layer}"] = (p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
        out[f"w_down.{layer}"] = (p + "mlp.down_proj.weight",)
        return out


QWEN3 = Family("qwen3", "Qwen3", "Qwen3ForCausalLM", "qwen3", qk_norm=True, llama3_rope=False,
               bias_keys=("attention_bias",), head_dim=128, rope_theta=10000.0, rms_norm_eps=1e-6,
               max_position_embeddings=32768)
LLAMA = Family("llama", "Llama", "LlamaForCausalLM", "llama", qk_norm=False, llama3_rope=True,
               bias_keys=("attention_bias", "mlp_bias"), head_dim=None, rope_theta=10000.0, rms_norm_eps=1e-6,
               max_position_embeddings=2048)
FAMILIES = {f.architecture: f for f in (QWEN3, LLAMA)}

# architectures refused with a reason of their own; any other one is "not supported"
_REFUSED = {
    "Qwen3MoeForCausalLM": "not supported: mixture-of-experts layers have no kernels (dense Qwen3 only)",
    "MixtralForCausalLM": "not supported: mixture-of-experts layers have no kernels (dense models only)",
    "Qwen2ForCausalLM": "not supported: Qwen2 / Qwen2.5 have qkv bias and no q/k norm (Qwen3 dense only)",
    "MllamaForConditionalGeneration": "not supported: vision layers have no kernels (text-only Llama 3 only)",
}


def family_of(cfg: dict[str, Any], source: str) -> Family:
    """The family of a config.json object: `architectures` (when present) exactly one of FAMILIES' architectures,
    `model_type` that family's. Without `architectures` the `model_type` decides. Raises ManifestBuildError
    naming `source`, the field and its value."""
    archs = cfg.get("architectures")
    if archs is None:
        by_type = {f.model_type: f for f in FAMILIES.values()}
        family = by_type.get(cfg.get("model_type"))
        if family is None:
            raise ManifestBuildError(f"{source}: model_type is {cfg.get('model_type')!r}; kern builds "
                                     f"{' and '.join(repr(t) for t in by_type)} manifests")
        return family
    if not (isinstance(archs, list) and len(archs) == 1 and archs[0] in FAMILIES):
        named = next((a for a in archs if isinstance(a, str) and a in _REFUSED), None) if isinstance(archs, list) \
            else None
        why = _REFUSED[named] if named else f"not supported (kern builds {' and '.join(FAMILIES)} manifests)"
        raise ManifestBuildError(f"{source}: architectures = {shown(archs)} is {why}")
    family = FAMILIES[archs[0]]
    if cfg.get("model_type") != family.model_type:
        raise ManifestBuildError(f"{source}: model_type is {cfg.get('model_type')!r}; {family.architecture} has "
                                 f"model_type {family.model_type!r}")
    return family


@dataclass(frozen=True)
class Llama3Scaling:
    """rope_type "llama3" (transformers' `_compute_llama3_parameters`): the default inverse frequencies f remapped
    by wavelength 2 pi / f: kept below original_max_position_embeddings / high_freq_factor tokens, divided by
    `factor` above original_max_position_embeddings / low_freq_factor, interpolated between. Attention factor 1."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _number(block: dict[str, Any], where: str, key: str) -> float:
    value = block.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise ManifestBuildError(f"{where}.{key} = {shown(value)} must be a finite number > 0")
    return float(value)


def _llama3(block: dict[str, Any], where: str) -> Llama3Scaling:
    missing = [k for k in _LLAMA3_KEYS if k not in block]
    if missing:
        raise ManifestBuildError(f"{where} lacks {missing[0]!r} (rope_type 'llama3' needs {', '.join(_LLAMA3_KEYS)})")
    factor, low, high = (_number(block, where, k) for k in _LLAMA3_KEYS[:3])
    orig = block["original_max_position_embeddings"]
    if isinstance(orig, bool) or not isinstance(orig, int) or not 1 <= orig <= 1 << 24:
        raise ManifestBuildError(f"{where}.original_max_position_embeddings = {shown(orig)} must be a JSON integer "
                                 "in [1, 2^24]")
    if not high > low:
        raise ManifestBuildError(f"{where}.high_freq_factor = {shown(block['high_freq_factor'])} must exceed "
                                 f"low_freq_factor = {shown(block['low_freq_factor'])}")
    return Llama3Scaling(factor, low, high, orig)


def rope_type(block: Any) -> Any:
    """transformers' reading of a rope_scaling / rope_parameters object: its `rope_type`, else the older `type`,
    else "default"."""
    return block.get("rope_type", block.get("type", "default"))


def rope_scaling_of(cfg: dict[str, Any], family: Family, source: str) -> Llama3Scaling | None:
    """The RoPE frequencies a config asks for: None (plain: rope_scaling null, {} or rope_type "default") or the
    llama3 remap (families with llama3_rope). `rope_parameters` (transformers >= 4.57 spelling, which also holds
    rope_theta) is read when rope_scaling is null. Raises ManifestBuildError, one line naming the field and value,
    for any other rope type, a block that is not an object, or llama3 fields missing or out of range."""
    for key in ("rope_scaling", "rope_parameters"):
        block = cfg.get(key)
        if block in (None, {}):
            continue
        if not isinstance(block, dict):
            raise ManifestBuildError(f"{source}: {key} = {shown(block)} must be a JSON object")
        kind = rope_type(block)
        if kind == "default":
            return None
        if kind == "llama3" and family.llama3_rope:
            return _llama3(block, f"{source}: {key}")
        taken = "llama3 or plain RoPE" if family.llama3_rope else "plain RoPE"
        field = f"{key}.rope_type" if "rope_type" in block or "type" not in block else f"{key}.type"
        raise ManifestBuildError(f"{source}: {field} = {shown(kind)} is not supported ({taken} only)")
    return None
