"""Qwen3Config: the fields of a Qwen3 or Llama 3 dense config.json the manifest depends on, validated as
transformers' `configuration_qwen3.py` / `configuration_llama.py` would read them (the family: kern_run.models.family);
every refusal names the source, the config field and its value."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...errors import ManifestBuildError
from ..family import QWEN3, Family, Llama3Scaling, family_of, rope_scaling_of, shown as _shown
from .shapes import SHAPES, config_json

_REQUIRED = object()  # a config key without a default

# The keys that decide the weight shapes (hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
# intermediate_size, vocab_size) are required: transformers' defaults (an 8B-like model) would only hide a mistake.
# The optional keys take the family's transformers defaults (Family: head_dim, rope_theta, rms_norm_eps,
# max_position_embeddings; tie_word_embeddings false).

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


def _refuse_unsupported(cfg: dict[str, Any], family: Family, source: str) -> None:
    """The config.json features the builder does not cover: sliding-window attention (use_sliding_window true; for
    Llama, whose transformers class has none, any sliding_window set), a bias flag of the family (attention_bias;
    Llama's mlp_bias) true, an activation other than silu, a checkpoint dtype other than bfloat16. The
    architecture and the rope type: family_of and rope_scaling_of."""
    if cfg.get("use_sliding_window"):
        raise ManifestBuildError(f"{source}: use_sliding_window is true; sliding-window attention is not supported")
    if family is not QWEN3 and cfg.get("sliding_window") is not None:
        raise ManifestBuildError(f"{source}: sliding_window = {_shown(cfg['sliding_window'])}; sliding-window "
                                 "attention is not supported")
    for key in family.bias_keys:
        if cfg.get(key):
            raise ManifestBuildError(f"{source}: {key} is true; {family.label} projections without bias only")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ManifestBuildError(f"{source}: hidden_act = {_shown(cfg['hidden_act'])} is not supported (the MLP "
                                 "kernels compute SiLU)")
    for key in ("torch_dtype", "dtype"):  # transformers < 4.56 writes torch_dtype, later ones dtype
        if cfg.get(key, "bfloat16") != "bfloat16":
            raise ManifestBuildError(f"{source}: {key} = {_shown(cfg[key])} is not supported (kern's kernels and "
                                     "weight binds are bfloat16)")


def _head_dim(f: _Fields, family: Family, hidden: int, q_heads: int) -> int:
    """transformers' Qwen3Config: head_dim 128 when absent, null refused (its modeling code would fail);
    LlamaConfig: absent or null is hidden_size // num_attention_heads."""
    if family.head_dim is None:
        if f.raw.get("head_dim") is None:
            if hidden < q_heads:
                raise ManifestBuildError(f"{f.source}: head_dim absent and hidden_size {hidden} // "
                                         f"num_attention_heads {q_heads} is 0")
            return hidden // q_heads
        return f.integer("head_dim")
    if "head_dim" in f.raw and f.raw["head_dim"] is None:
        raise ManifestBuildError(f"{f.source}: head_dim is null; expected a JSON integer (transformers' "
                                 f"{family.label}Config default, when the key is absent, is {family.head_dim})")
    return f.integer("head_dim", family.head_dim)


def _kv_heads(f: _Fields, q_heads: int) -> int:
    """transformers' Qwen3Config: a null num_key_value_heads means num_attention_heads (absent is refused: its
    default of 32 decides the shapes)."""
    if "num_key_value_heads" in f.raw and f.raw["num_key_value_heads"] is None:
        return q_heads
    return f.integer("num_key_value_heads")


def _rope_theta(f: _Fields, family: Family) -> float:
    if "rope_theta" in f.raw:
        return f.positive("rope_theta", f.raw["rope_theta"])
    params = f.raw.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ManifestBuildError(f"{f.source}: rope_parameters = {_shown(params)} must be a JSON object")
    return f.positive("rope_parameters.rope_theta", params.get("rope_theta", family.rope_theta))


@dataclass(frozen=True)
class Qwen3Config:
    """The fields of a Qwen3 or Llama 3 dense config.json the manifest depends on (element counts; rope_theta and
    eps floats). `family`: which one (its q/k norm, bias flags, defaults); `rope_scaling`: the llama3 frequency
    remap, None for plain RoPE. The class keeps the builder's name; it covers both families."""

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
    family: Family = QWEN3
    rope_scaling: Llama3Scaling | None = None

    @classmethod
    def from_json(cls, cfg: Any, source: str = "config.json") -> "Qwen3Config":
        """From a config.json object. Raises ManifestBuildError, naming `source` and the key, for a model this
        builder does not cover (family.family_of: the architecture; family.rope_scaling_of: the rope type;
        _refuse_unsupported: sliding window, bias, activation, dtype) or a value of the wrong JSON type or range:
        integers must be JSON integers >= 1, tie_word_embeddings a JSON boolean, rope_theta and rms_norm_eps finite
        numbers > 0, each size at most BOUNDS. Absent optional keys take the family's transformers defaults
        (Qwen3: head_dim 128, max_position_embeddings 32768; Llama: head_dim hidden_size // num_attention_heads,
        max_position_embeddings 2048; both rope_theta rope_parameters.rope_theta, else 10000.0, rms_norm_eps 1e-6,
        tie_word_embeddings false); a null num_key_value_heads is num_attention_heads; a null head_dim (Qwen3), or
        an absent shape key (hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
        intermediate_size, vocab_size), is refused."""
        if not isinstance(cfg, dict):
            raise ManifestBuildError(f"{source}: a JSON {type(cfg).__name__}, expected a config.json object")
        family = family_of(cfg, source)
        rope_scaling = rope_scaling_of(cfg, family, source)
        _refuse_unsupported(cfg, family, source)
        f = _Fields(cfg, source)
        hidden, layers = f.integer("hidden_size"), f.integer("num_hidden_layers")
        q_heads = f.integer("num_attention_heads")
        kv_heads, head_dim = _kv_heads(f, q_heads), _head_dim(f, family, hidden, q_heads)
        tied = f.get("tie_word_embeddings", False)
        if not isinstance(tied, bool):
            raise ManifestBuildError(f"{source}: tie_word_embeddings = {_shown(tied)} must be a JSON boolean (true or "
                                     "false)")
        rope_theta = _rope_theta(f, family)
        out = cls(hidden=hidden, layers=layers, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim,
                  intermediate=f.integer("intermediate_size"), vocab=f.integer("vocab_size"), tied=tied,
                  rope_theta=rope_theta, eps=f.positive("rms_norm_eps", f.get("rms_norm_eps", family.rms_norm_eps)),
                  max_position_embeddings=f.integer("max_position_embeddings", family.max_position_embeddings),
                  family=family, rope_scaling=rope_scaling)
        if out.q_heads % out.kv_heads:
            raise ManifestBuildError(f"{source}: num_attention_heads {out.q_heads} is not a multiple of "
                                     f"num_key_value_heads {out.kv_heads}")
        return out

    @classmethod
    def from_name(cls, name: str) -> "Qwen3Config":
        """A shape of the known-shapes table (shapes.SHAPES: qwen3-0.6b, -1.7b, -4b, -8b, -14b, -32b, tiny,
        llama3.2-1b, llama3.2-3b, llama3.1-8b). Raises ManifestBuildError naming `name` and the known ones."""
        if name not in SHAPES:
            raise ManifestBuildError(f"--shape {name!r}: not a known shape (known: {', '.join(SHAPES)})")
        return cls.from_json(config_json(SHAPES[name]), f"--shape {name}")
