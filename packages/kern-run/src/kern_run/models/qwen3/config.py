"""Qwen3Config: the fields of a Qwen3 config.json the manifest depends on, validated as transformers'
`configuration_qwen3.py` would read them; every refusal names the source, the config field and its value."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...errors import ManifestBuildError
from .shapes import SHAPES, config_json

_REQUIRED = object()  # a config key without a default

# transformers' Qwen3Config defaults (configuration_qwen3.py) of the keys a config.json may leave out; the keys
# that decide the weight shapes (hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
# intermediate_size, vocab_size) are required instead: their defaults (an 8B-like model) would only hide a mistake.
DEFAULTS = {
    "head_dim": 128,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
}

# The largest value of each size field: far above any Qwen3 checkpoint, and small enough that the manifest stays
# within kern_manifest's limits (MAX_PROGRAM_CALLS expansion steps per program: decode launches a handful of
# kernels per layer) and is built in seconds. Checked before anything is built (docs/manifest.md).
BOUNDS = {
    "num_hidden_layers": 1024,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "head_dim": 1024,
    "hidden_size": 1 << 16,
    "intermediate_size": 1 << 18,
    "vocab_size": 1 << 22,
    "max_position_embeddings": 1 << 24,
}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class _Fields:
    """One config.json object and how refusals name it."""

    raw: dict[str, Any]
    source: str

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        if key not in self.raw:
            if default is _REQUIRED:
                raise ManifestBuildError(f"{self.source} lacks {key!r}")
            return default
        return self.raw[key]

    def integer(self, key: str, default: Any = _REQUIRED) -> int:
        """A JSON integer >= 1 and at most BOUNDS[key]."""
        value = self.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ManifestBuildError(f"{self.source}: {key} = {_shown(value)} must be a JSON integer >= 1")
        if value > BOUNDS[key]:
            raise ManifestBuildError(f"{self.source}: {key} = {_shown(value)} is above {BOUNDS[key]} (the largest "
                                     "this builder accepts)")
        return value

    def positive(self, key: str, value: Any) -> float:
        """A finite JSON number > 0."""
        if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
                or value <= 0):
            raise ManifestBuildError(f"{self.source}: {key} = {_shown(value)} must be a finite number > 0")
        return float(value)


ARCHITECTURE = "Qwen3ForCausalLM"
# architectures refused with a reason of their own; any other one is "not supported"
_NOT_YET = {
    "LlamaForCausalLM": "not yet supported (Llama 3 needs a rope without q/k norm and head_dim 64 kernels)",
    "Qwen3MoeForCausalLM": "not supported: mixture-of-experts layers have no kernels (dense Qwen3 only)",
    "Qwen2ForCausalLM": "not supported: Qwen2 / Qwen2.5 have qkv bias and no q/k norm (Qwen3 dense only)",
}


def _refuse_architecture(cfg: dict[str, Any], source: str) -> None:
    """`architectures` (when present) must be exactly [Qwen3ForCausalLM], and `model_type` qwen3."""
    archs = cfg.get("architectures", [ARCHITECTURE])
    if archs != [ARCHITECTURE]:
        named = next((a for a in archs if a in _NOT_YET), None) if isinstance(archs, list) else None
        why = _NOT_YET[named] if named else f"not supported (kern builds {ARCHITECTURE} manifests)"
        raise ManifestBuildError(f"{source}: architectures = {_shown(archs)} is {why}")
    if cfg.get("model_type") != "qwen3":
        raise ManifestBuildError(f"{source}: model_type is {cfg.get('model_type')!r}; this generator makes qwen3 "
                                 "manifests")


def _plain_rope(scaling: Any) -> bool:
    """Whether a rope_scaling object is plain RoPE as transformers reads it: its `rope_type` (else the older
    `type`) is "default"."""
    return isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "default"


def _refuse_unsupported(cfg: dict[str, Any], source: str) -> None:
    """The config.json features this builder does not cover: another architecture, rope scaling (rope_scaling
    other than null, {} or a "default" rope_type / type, or rope_parameters with a rope_type other than "default"), sliding-window attention, attention
    bias, an activation other than silu, a checkpoint dtype other than bfloat16."""
    _refuse_architecture(cfg, source)
    scaling = cfg.get("rope_scaling")
    if scaling not in (None, {}) and not _plain_rope(scaling):
        raise ManifestBuildError(f"{source}: rope_scaling {cfg['rope_scaling']!r} is not supported (plain RoPE only)")
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and params.get("rope_type", "default") != "default":
        raise ManifestBuildError(f"{source}: rope_parameters.rope_type = {params['rope_type']!r} is not supported "
                                 "(plain RoPE only)")
    if cfg.get("use_sliding_window"):
        raise ManifestBuildError(f"{source}: use_sliding_window is true; sliding-window attention is not supported")
    if cfg.get("attention_bias"):
        raise ManifestBuildError(f"{source}: attention_bias is true; Qwen3 projections without bias only")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ManifestBuildError(f"{source}: hidden_act = {_shown(cfg['hidden_act'])} is not supported (the MLP "
                                 "kernels compute SiLU)")
    for key in ("torch_dtype", "dtype"):  # transformers < 4.56 writes torch_dtype, later ones dtype
        if cfg.get(key, "bfloat16") != "bfloat16":
            raise ManifestBuildError(f"{source}: {key} = {_shown(cfg[key])} is not supported (kern's kernels and "
                                     "weight binds are bfloat16)")


def _head_dim(f: _Fields) -> int:
    """transformers' Qwen3Config: head_dim 128 when absent; null is not an integer (its modeling code would fail)."""
    if "head_dim" in f.raw and f.raw["head_dim"] is None:
        raise ManifestBuildError(f"{f.source}: head_dim is null; expected a JSON integer (transformers' Qwen3Config "
                                 "default, when the key is absent, is 128)")
    return f.integer("head_dim", 128)


def _kv_heads(f: _Fields, q_heads: int) -> int:
    """transformers' Qwen3Config: a null num_key_value_heads means num_attention_heads (absent is refused: its
    default of 32 decides the shapes)."""
    if "num_key_value_heads" in f.raw and f.raw["num_key_value_heads"] is None:
        return q_heads
    return f.integer("num_key_value_heads")


def _rope_theta(f: _Fields) -> float:
    if "rope_theta" in f.raw:
        return f.positive("rope_theta", f.raw["rope_theta"])
    params = f.raw.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ManifestBuildError(f"{f.source}: rope_parameters = {_shown(params)} must be a JSON object")
    return f.positive("rope_parameters.rope_theta", params.get("rope_theta", DEFAULTS["rope_theta"]))


@dataclass(frozen=True)
class Qwen3Config:
    """The fields of a Qwen3 config.json the manifest depends on (element counts; rope_theta and eps floats)."""

    hidden: int
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    rope_theta: float
    eps: float
    max_position_embeddings: int

    @classmethod
    def from_json(cls, cfg: Any, source: str = "config.json") -> "Qwen3Config":
        """From a config.json object. Raises ManifestBuildError, naming `source` and the key, for a model this
        builder does not cover or a value of the wrong JSON type or range: integers must be JSON integers >= 1,
        tie_word_embeddings a JSON boolean, rope_theta and rms_norm_eps finite numbers > 0, each size at most
        BOUNDS. Absent optional keys take transformers' Qwen3Config defaults (DEFAULTS: head_dim 128; rope_theta
        rope_parameters.rope_theta, else 10000.0; rms_norm_eps 1e-6; max_position_embeddings 32768;
        tie_word_embeddings false); a null num_key_value_heads is num_attention_heads; a null head_dim, or an
        absent shape key (hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
        intermediate_size, vocab_size), is refused."""
        if not isinstance(cfg, dict):
            raise ManifestBuildError(f"{source}: a JSON {type(cfg).__name__}, expected a config.json object")
        _refuse_unsupported(cfg, source)
        f = _Fields(cfg, source)
        hidden, layers = f.integer("hidden_size"), f.integer("num_hidden_layers")
        q_heads = f.integer("num_attention_heads")
        kv_heads, head_dim = _kv_heads(f, q_heads), _head_dim(f)
        tied = f.get("tie_word_embeddings", DEFAULTS["tie_word_embeddings"])
        if not isinstance(tied, bool):
            raise ManifestBuildError(f"{source}: tie_word_embeddings = {_shown(tied)} must be a JSON boolean (true or "
                                     "false)")
        rope_theta = _rope_theta(f)
        out = cls(hidden=hidden, layers=layers, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim,
                  intermediate=f.integer("intermediate_size"), vocab=f.integer("vocab_size"), tied=tied,
                  rope_theta=rope_theta, eps=f.positive("rms_norm_eps", f.get("rms_norm_eps", DEFAULTS["rms_norm_eps"])),
                  max_position_embeddings=f.integer("max_position_embeddings", DEFAULTS["max_position_embeddings"]))
        if out.q_heads % out.kv_heads:
            raise ManifestBuildError(f"{source}: num_attention_heads {out.q_heads} is not a multiple of "
                                     f"num_key_value_heads {out.kv_heads}")
        return out

    @classmethod
    def from_name(cls, name: str) -> "Qwen3Config":
        """A shape of the known-shapes table (shapes.SHAPES: qwen3-0.6b, -1.7b, -4b, -8b, -14b, -32b, tiny). Raises
        ManifestBuildError naming `name` and the known ones."""
        if name not in SHAPES:
            raise ManifestBuildError(f"--shape {name!r}: not a known Qwen3 shape (known: {', '.join(SHAPES)})")
        return cls.from_json(config_json(SHAPES[name]), f"--shape {name}")
