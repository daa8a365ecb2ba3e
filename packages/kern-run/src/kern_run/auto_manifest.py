"""`kern run --weights DIR` without --manifest / --target: the manifest built from DIR/config.json in-process
(kern_run.models.qwen3) and cached, so a later run reuses it (docs/caller.md "Your own checkpoint").

The cache file is `user_cache_dir("kern")/manifests/<name>-<key16>.json`, the key a sha256 over the config.json
text, kernels.json, the build options, the pins file's text and kern-run's version: any change (pins picked
anew included) builds a new manifest. Everything here runs before anything loads: the config refusals
(Qwen3Config.from_json: the field and its value), the tie check against the checkpoint's tensor names, the pins
lookup, or their picking on first use on this GPU (kern_run.pins_cache.ensure_pins).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TextIO

from . import __version__
from .config import DEFAULT_CAPACITY_TOKENS, RunConfig, Weights, normalize_weights, weights_label
from .errors import ConfigError, ManifestBuildError
from .models.qwen3 import BuildRequest, Qwen3Config, build_texts, read_json_file
from .models.qwen3.abi import kernels_json_path
from .models.qwen3.command import build_options, write_outputs
from .models.qwen3.options import validate
from .naming import model_name
from .package_data import kernels_dir
from .pins_cache import InvariantPicker, Picker, cache_root, ensure_pins

DEFAULT_CHUNK_MAX = 512  # `kern manifest build`'s --chunk-max default


@dataclass(frozen=True)
class AutoRequest:
    """The `kern run` flags that decide the manifest. `weights`: one path or several .safetensors files (config.json
    beside the first); `kernels` None: kern_run.kernels_dir(); `pins` False: --no-pins; `chunk`: --chunk (a chunk
    maximum of at least 512 tokens is built, more when --chunk asks for more). `seqs_max`: decode rows per step
    (1: the bs = 1 manifest `kern run` decodes with; more, as `kern serve` builds: `--seqs-max N --gemv v2`);
    `batch_invariant`: the same decode arithmetic at every row count (`--batch-invariant`; needs the pins, and
    then pins the lm_head shape too)."""

    weights: Weights
    kernels: Path | None = None
    gpu: int = 0
    capacity: int | None = None
    chunk: int | None = None
    pins: bool = True
    seqs_max: int = 1
    batch_invariant: bool = False


def config_path(weights: Weights) -> Path:
    """config.json beside the checkpoint: in the directory, or beside the (first) .safetensors file."""
    first = weights if isinstance(weights, Path) else weights[0]
    return first / "config.json" if first.is_dir() else first.parent / "config.json"


def check_tie(cfg: Qwen3Config, weights: Weights, source: str) -> None:
    """tie_word_embeddings against the checkpoint: a tied config with an lm_head.weight tensor, or an untied one
    without, is refused (one line naming the field, its value and the checkpoint). Raises WeightsError for an
    unreadable checkpoint (preflight.checkpoint_tensors), ManifestBuildError for a mismatch."""
    from .preflight import checkpoint_tensors

    has_head = "lm_head.weight" in checkpoint_tensors(weights)
    if cfg.tied and has_head:
        raise ManifestBuildError(f"{source}: tie_word_embeddings = true, but the checkpoint {weights_label(weights)} "
                                 "holds lm_head.weight (an untied checkpoint): the config and the weights disagree")
    if not cfg.tied and not has_head:
        raise ManifestBuildError(f"{source}: tie_word_embeddings = false, but the checkpoint "
                                 f"{weights_label(weights)} has no lm_head.weight (a tied checkpoint): the config "
                                 "and the weights disagree")


def cache_key(config_text: str, kernels_json: bytes, options: dict, pins_text: str | None) -> str:
    """sha256 (hex) over what decides the manifest: the config.json text, kernels.json, the options, the pins
    file's text (None: --no-pins) and kern-run's version (the builder's)."""
    doc = {"config": hashlib.sha256(config_text.encode()).hexdigest(),
           "kernels": hashlib.sha256(kernels_json).hexdigest(), "options": options,
           "pins": None if pins_text is None else hashlib.sha256(pins_text.encode()).hexdigest(),
           "kern_run": __version__}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def auto_config(req: AutoRequest, err: TextIO | None = None, stamp: Callable[[int], tuple[str, int]] | None = None,
                command: str = "run", pick: Picker | None = None,
                pick_invariant: InvariantPicker | None = None) -> RunConfig:
    """The RunConfig of `req`, its manifest built (or found in the cache). Prints one line on `err` (stderr):
    `kern COMMAND: built manifest PATH (...)` or `kern COMMAND: reused manifest PATH (...)`, after the pins
    progress line when the pins are picked now. `stamp`: (GPU name, cuBLASLt version) of a device ordinal, `pick` /
    `pick_invariant`: the pin searches (pins_cache.ensure_pins's; tests pass their own; a batch-invariant request
    also needs an invariant decode pin per decode projection shape). Raises ConfigError (a --weights path that
    does not exist, no config.json), ManifestBuildError (the config or options refused, tie mismatch),
    WeightsError, RefusalError / NoDeviceError / kern_runtime.KernError (pins)."""
    err = err if err is not None else sys.stderr
    weights = normalize_weights(req.weights)
    for path in [weights] if isinstance(weights, Path) else weights:
        if not os.path.lexists(path):
            raise ConfigError(f"--weights {path}: no such file or directory (give a checkpoint directory, its "
                              ".safetensors files, or a hub id ORG/NAME in the local Hugging Face cache)")
    config = config_path(weights)
    if not config.is_file():
        raise ConfigError(f"--weights {weights_label(weights)}: no config.json at {config}: a Hugging Face "
                          "checkpoint directory has one (or pass --manifest / --target)")
    raw, text = read_json_file(config)
    cfg = Qwen3Config.from_json(raw, str(config))
    check_tie(cfg, weights, str(config))
    kernels = req.kernels if req.kernels is not None else kernels_dir()
    chunk_max = max(DEFAULT_CHUNK_MAX, req.chunk or 0)
    name = model_name(config)
    options: dict = {"chunk_max": chunk_max}
    if req.batch_invariant:  # the cuBLASLt decode on the proven pins at every row count (as regen_manifests' -inv)
        if not req.pins:
            raise ConfigError("a batch-invariant decode runs every projection on a proven cuBLASLt pin: --no-pins "
                              "cannot build one (add --no-invariant, or drop --no-pins)")
        options.update(seqs_max=req.seqs_max, batch_invariant=True)
    elif req.seqs_max > 1:  # the batched decode: v2 GEMVs at one row, small-M projections from two (builder rules)
        options.update(seqs_max=req.seqs_max, gemv="v2")
    # the builder's own options of this request (its decode and max_context defaults), before the pins exist
    build = BuildRequest(out=Path(), config=config, kernels=kernels, name=name, options=options)
    plan = validate(cfg, build_options(build, cfg))
    # the invariant decode's lm_head runs on a pin proven like a prefill pin (tools/pick_algos.py --lm-head)
    shapes = plan.prefill_shapes | ({(cfg.vocab, cfg.hidden)} if req.batch_invariant else set())
    pins = None
    if req.pins:
        pins = ensure_pins(shapes, req.gpu, chunk_max, stamp, pick, err, command,
                           invariant_decode=shapes if req.batch_invariant else frozenset(),
                           pick_invariant=pick_invariant)
    try:
        kernels_bytes = kernels_json_path(kernels).read_bytes()
    except OSError as exc:
        raise ManifestBuildError(f"--kernels {kernels}: {kernels_json_path(kernels)}: {exc.strerror or exc}") from None
    key = cache_key(text, kernels_bytes, {**options, "name": name}, None if pins is None else pins.read_text())
    out = cache_root() / "manifests" / f"{name}-{key[:16]}.json"
    what = f"from {config}, pins {pins}" if pins else f"from {config}, --no-pins: prefill not batch-invariant"
    if req.seqs_max > 1:
        what += f", {req.seqs_max} decode rows" + (", batch-invariant decode" if req.batch_invariant else "")
    if out.is_file():
        print(f"kern {command}: reused manifest {out} ({what})", file=err)
    else:
        texts = build_texts(dataclasses.replace(build, out=out, algos=pins))
        write_outputs(texts)
        print(f"kern {command}: built manifest {out} ({what})", file=err)
    return RunConfig(manifest=out, kernels=kernels, weights=weights, gpu=req.gpu,
                     capacity_tokens=req.capacity or DEFAULT_CAPACITY_TOKENS, chunk=req.chunk,
                     capacity_from="--capacity" if req.capacity else None)
