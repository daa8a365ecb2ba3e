"""Targets from kern.toml, overridden by flags, resolved into one frozen `RunConfig`.

kern.toml (found through `--config`, `$KERN_TOML`, or the current directory and its parents):

    default = "tiny-en"
    [targets.qwen3-4b]
    manifest = "manifests/qwen3-4b-v2.json"  # paths relative to kern.toml's directory
    kernels = "kernels"
    weights = "weights/qwen3-4b"           # a checkpoint directory or one .safetensors file, or a list of
                                            # .safetensors files: weights = ["a.safetensors", "b.safetensors"]
    gpu = 0
    capacity = 4096                         # KV capacity in tokens (pages for this many tokens)
    chunk = 512                             # prefill chunk in tokens (<= the manifest's tokens var max)
    serve_manifest = "manifests/qwen3-4b-inv.json"  # optional: what `kern serve` runs (batch-invariant decode)
    [targets.qwen3-4b.sampling]             # optional sampling defaults (kern_run.sampling.SamplingParams fields)
    temperature = 0.8                       # flags (--temperature ...) override them; none: greedy
    repetition_penalty = 1.1
    seed = 0

A flag given on the command line overrides the target's field (`--weights`, repeatable, replaces all of the
target's weights); a target may be absent when flags give manifest, kernels and weights.

Weights are one path (a directory, or one .safetensors file) or several .safetensors files: `RunConfig.weights`
is a `Path` for one, a tuple of at least two `Path`s for several (`normalize_weights`: the same path twice
counts once, and a list of one is that one path). What a list may hold is checked with the checkpoint
(preflight.weight_list_files): files only, each a .safetensors file that exists.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, Union

from kern_manifest import json_text_fault, read_regular_file

from .errors import ConfigError
from .jsonfile import MAX_CONFIG_BYTES

TOML_NAME = "kern.toml"
TARGET_KEYS = frozenset({"manifest", "kernels", "weights", "gpu", "capacity", "chunk", "sampling", "serve_manifest"})
# [targets.NAME.sampling]: SamplingParams fields a target may default (logprobs are a per-run request, not a default)
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty", "seed")
PATH_KEYS = frozenset({"manifest", "kernels", "weights", "serve_manifest"})
TOP_KEYS = frozenset({"default", "targets"})
DEFAULT_CAPACITY_TOKENS = 4096

# one path (a checkpoint directory or one .safetensors file), or several .safetensors files (two or more)
Weights = Union[Path, tuple[Path, ...]]


def normalize_weights(value: "str | os.PathLike[str] | Sequence[str | os.PathLike[str]]") -> Weights:
    """`Weights` from one path or a sequence of paths: two entries naming the same file (`os.path.realpath`:
    symlinks and `..` resolved through the filesystem, relative to the current directory) count once, as first
    written and in the order first given; one left is that path alone (a directory allowed), several a tuple
    (files only: preflight checks them). Raises ConfigError for an empty path in a list."""
    if isinstance(value, (str, os.PathLike)):
        return Path(value)
    unique: dict[str, Path] = {}
    entries = list(value)
    for i, entry in enumerate(entries):
        if not os.fspath(entry):
            raise ConfigError(f"weights: entry {i + 1} of {len(entries)} is an empty path")
        unique.setdefault(os.path.realpath(os.fspath(entry)), Path(entry))
    paths = tuple(unique.values())
    if not paths:
        raise ConfigError("weights: an empty list of paths: give a checkpoint directory or .safetensors files")
    return paths[0] if len(paths) == 1 else paths


def weights_label(weights: Weights) -> str:
    """`weights` as messages name it: the path, or `[a, b, ...]` for several files."""
    return str(weights) if isinstance(weights, Path) else "[" + ", ".join(str(p) for p in weights) + "]"


def runtime_weights(weights: "Weights | str | Sequence[str | os.PathLike[str]]") -> "str | list[str]":
    """The argument of kern_runtime's `SafetensorsTensors.open`: the one path as a string (a directory or a
    file, as before lists existed), or the list of file paths."""
    if isinstance(weights, (str, os.PathLike)):
        return str(weights)
    return [str(p) for p in weights]


@dataclass(frozen=True)
class RunConfig:
    """Everything one `kern run` needs. `chunk` None: the default (512, clamped to the tokens var max)."""

    manifest: Path
    kernels: Path
    weights: Weights  # one Path (directory or file), or a tuple of two or more .safetensors file Paths
    gpu: int = 0
    capacity_tokens: int = DEFAULT_CAPACITY_TOKENS
    chunk: int | None = None
    target: str | None = None
    # where capacity_tokens was given ("--capacity", "kern.toml target 'x' capacity"); None: the default
    capacity_from: str | None = None
    # the target's [targets.NAME.sampling] defaults, checked ((field, value), ... in SAMPLING_KEYS order); flags
    # override them field by field (cli.py); empty: greedy
    sampling: tuple[tuple[str, Any], ...] = ()
    # the target's `serve_manifest`: what `kern serve` runs instead of `manifest` (a batch-invariant decode,
    # docs/serve.md "Which manifest"); None: none, or --manifest given (a flag names the manifest for every command)
    serve_manifest: Path | None = None


def find_toml(explicit: Path | None = None, start: Path | None = None) -> Path | None:
    """The kern.toml to use: `explicit`, else $KERN_TOML, else the first in `start` (cwd) or a parent."""
    if explicit is not None:
        _check_toml_file(explicit, f"--config {explicit}")
        return explicit
    env = os.environ.get("KERN_TOML")
    if env:
        _check_toml_file(Path(env), f"KERN_TOML={env}")
        return Path(env)
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / TOML_NAME).is_file():
            return d / TOML_NAME
    return None


def _check_toml_file(path: Path, where: str) -> None:
    """Raises ConfigError when `path` is not a regular file: a directory, something else that is no file, or
    nothing at all, each said as such."""
    if path.is_file():
        return
    if path.is_dir():
        raise ConfigError(f"{where} is a directory: pass the kern.toml file (e.g. {path / TOML_NAME})")
    if path.exists():
        raise ConfigError(f"{where} is not a regular file (a device, pipe or socket): pass a kern.toml file")
    raise ConfigError(f"{where}: no such file")


def load_targets(path: Path) -> tuple[str | None, dict[str, dict[str, Any]]]:
    """(default target name, {name: fields with paths made absolute}). Raises ConfigError."""
    try:
        raw = tomllib.loads(read_regular_file(path, MAX_CONFIG_BYTES, "kern.toml is a TOML file").decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is {json_text_fault(exc)}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path} is not usable TOML: it is nested too deeply") from None
    unknown_top = set(raw) - TOP_KEYS
    if unknown_top:
        raise ConfigError(f"{path}: unknown top-level keys {sorted(unknown_top)} (known: {sorted(TOP_KEYS)})")
    if not isinstance(raw.get("targets", {}), dict):
        raise ConfigError(f"{path}: targets = {raw['targets']!r} must be a table of [targets.NAME] tables")
    base = path.resolve().parent
    targets: dict[str, dict[str, Any]] = {}
    for name, fields in (raw.get("targets") or {}).items():
        if not isinstance(fields, dict):
            raise ConfigError(f"{path}: [targets.{name}] must be a table")
        unknown = set(fields) - TARGET_KEYS
        if unknown:
            raise ConfigError(f"{path}: [targets.{name}] has unknown keys {sorted(unknown)} (known: {sorted(TARGET_KEYS)})")
        for key, value in fields.items():
            if key == "sampling":
                continue  # checked below
            if key == "weights" and isinstance(value, list):  # several .safetensors files
                if not value:
                    raise ConfigError(f"{path}: [targets.{name}] weights = [] must name at least one path (a "
                                      "checkpoint directory, or .safetensors files)")
                for i, entry in enumerate(value):
                    if not isinstance(entry, str):
                        raise ConfigError(f"{path}: [targets.{name}] weights = {value!r}: entry {i + 1} ({entry!r}) "
                                          "must be a path string")
                    if not entry:
                        raise ConfigError(f"{path}: [targets.{name}] weights = {value!r}: entry {i + 1} is an empty "
                                          "path")
                    if "\0" in entry:
                        raise ConfigError(f"{path}: [targets.{name}] weights = {value!r}: entry {i + 1} ({entry!r}) "
                                          "contains a NUL character: not a usable path")
                continue
            if key in PATH_KEYS and not isinstance(value, str):
                more = " or a list of .safetensors path strings" if key == "weights" else ""
                raise ConfigError(f"{path}: [targets.{name}] {key} = {value!r} must be a path string{more}")
            if key in PATH_KEYS and "\0" in value:  # no OS path holds one (open / resolve raise ValueError)
                raise ConfigError(f"{path}: [targets.{name}] {key} = {value!r} contains a NUL character: "
                                  "not a usable path")
            low = 0 if key == "gpu" else 1
            if key not in PATH_KEYS and (not isinstance(value, int) or isinstance(value, bool) or value < low):
                raise ConfigError(f"{path}: [targets.{name}] {key} = {value!r} must be an integer >= {low}")
        out = dict(fields)
        if "sampling" in out:
            out["sampling"] = _sampling_table(path, name, out["sampling"])
        for key in ("manifest", "kernels", "weights", "serve_manifest"):
            if key in out:
                if isinstance(out[key], list):  # relative to the file, as written (symlinks kept: normalize_weights
                    # folds entries naming one file, and side files are looked up beside the path as written)
                    out[key] = normalize_weights([Path(e) if Path(e).is_absolute() else base / e for e in out[key]])
                elif key == "weights":  # relative to the file, symlinks kept (a snapshot file's side files
                    # are beside the link, as for a list)
                    value = str(out[key])
                    out[key] = Path(value) if Path(value).is_absolute() else base / value
                else:
                    value = str(out[key])
                    out[key] = (base / value).resolve() if not Path(value).is_absolute() else Path(value)
        targets[name] = out
    default = raw.get("default")
    if default is not None and not isinstance(default, str):
        raise ConfigError(f"{path}: default = {default!r} must be a target name string (have {sorted(targets)})")
    if default is not None and default not in targets:
        raise ConfigError(f"{path}: default = {default!r} names no [targets.*] table (have {sorted(targets)})")
    return default, targets


def _sampling_table(path: Path, target: str, table: Any) -> tuple[tuple[str, Any], ...]:
    """A target's `[targets.NAME.sampling]` table, checked: a table of SAMPLING_KEYS whose values SamplingParams
    accepts (kern_run.sampling: temperature >= 0, top_p in (0, 1], ...). Raises ConfigError naming the file, the
    target and the key."""
    from .errors import SamplingError
    from .sampling import SamplingParams

    where = f"{path}: [targets.{target}.sampling]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table of sampling defaults (keys {', '.join(SAMPLING_KEYS)}), not "
                          f"{table!r}")
    unknown = set(table) - set(SAMPLING_KEYS)
    if unknown:
        raise ConfigError(f"{where} has unknown keys {sorted(unknown)} (known: {list(SAMPLING_KEYS)})")
    try:
        SamplingParams(**table)
    except SamplingError as exc:
        raise ConfigError(f"{where} {exc}") from None
    return tuple((k, table[k]) for k in SAMPLING_KEYS if k in table)


def check_numbers(fields: dict[str, Any]) -> None:
    """gpu (an integer >= 0), capacity and chunk (integers >= 1) of a target or the flags; None or absent: not
    given. Raises ConfigError naming the key and its value."""
    for key in ("gpu", "capacity", "chunk"):
        if key in fields and fields[key] is not None and (not isinstance(fields[key], int) or isinstance(fields[key], bool)
                                                          or fields[key] < (0 if key == "gpu" else 1)):
            raise ConfigError(f"{key} = {fields[key]!r} must be an integer >= {0 if key == 'gpu' else 1}")


def resolve_config(toml_path: Path | None, target: str | None, overrides: dict[str, Any]) -> RunConfig:
    """Merge the target (explicit `target`, else the file's default) with flag `overrides` (None = not given).

    Raises ConfigError naming the missing field or unknown target.
    """
    fields: dict[str, Any] = {}
    chosen = None
    capacity_from = None
    if toml_path is not None:
        default, targets = load_targets(toml_path)
        chosen = target or default
        if chosen is not None:
            if chosen not in targets:
                raise ConfigError(f"target {chosen!r} is not in {toml_path} (have {sorted(targets)})")
            fields.update(targets[chosen])
            if "capacity" in targets[chosen]:
                capacity_from = f"kern.toml target {chosen!r} capacity"
    elif target is not None:
        raise ConfigError(f"--target {target}: no kern.toml found (pass --config or run from the repository)")
    for key, value in overrides.items():
        if key == "weights" and isinstance(value, (list, tuple)) and not value:
            continue  # a repeatable flag not given
        if value is not None:
            if key == "weights":
                fields[key] = normalize_weights(value)
            else:
                if key == "capacity":
                    capacity_from = "--capacity"
                fields[key] = Path(value) if key in ("manifest", "kernels") else value
    missing = [k for k in ("manifest", "kernels", "weights") if k not in fields]
    if missing:
        where = f"target {chosen!r} in {toml_path}" if chosen else "no kern.toml target"
        raise ConfigError(f"{where} gives no {', '.join(missing)}: pass --{' --'.join(missing)}")
    check_numbers(fields)
    return RunConfig(
        manifest=Path(fields["manifest"]), kernels=Path(fields["kernels"]),
        weights=normalize_weights(fields["weights"]),
        gpu=int(fields.get("gpu", 0)), capacity_tokens=int(fields.get("capacity", DEFAULT_CAPACITY_TOKENS)),
        chunk=fields.get("chunk"), target=chosen, capacity_from=capacity_from,
        sampling=tuple(fields.get("sampling", ())),
        serve_manifest=None if overrides.get("manifest") is not None else fields.get("serve_manifest"),
    )
