"""Checks made before anything touches the GPU, each failing with one line that says what to fix.

The runtime checks the same facts at load (KernelArtifactError, WeightArtifactError); checking them here
first means the refusal is the same with or without a device, takes milliseconds instead of a weight
load, and is tested on CPU machines. Order in `kern run` (session.prepare): manifest, chunk, kernels,
weights, tokenizer and prompt, then the device probe last (docs/caller.md).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Mapping

from kern_manifest import Buffer, DerivedSegment, InterleaveSegment, Manifest, RowsSegment, TensorSegment, var_max

from .config import Weights, normalize_weights, weights_label
from .errors import ConfigError, InputError, KernelsError, NoDeviceError, WeightsError
from .jsonfile import parse_json, read_text

DEFAULT_CHUNK = 512
MAX_PAGE_IDS = (1 << 31) - 1  # page ids are int32 in the device block tables (kern_pool.sizing.MAX_IDS)


# ---------------------------------------------------------------- device


def probe_device(gpu: int) -> int:
    """Number of CUDA devices; raises NoDeviceError when there is none or `gpu` is out of range."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise NoDeviceError(f"no CUDA: cuda-bindings is not importable ({exc}); kern run needs an NVIDIA GPU") from None
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise NoDeviceError(f"no CUDA device: cuInit returned {err.name}; kern run needs an NVIDIA GPU and driver")
        err, count = driver.cuDeviceGetCount()
    except NoDeviceError:
        raise
    except Exception as exc:  # noqa: BLE001 - no libcuda at all raises from inside cuda-bindings
        raise NoDeviceError(f"no CUDA device: the CUDA driver library cannot be loaded ({type(exc).__name__}); "
                            "kern needs an NVIDIA GPU and driver") from None
    if err != driver.CUresult.CUDA_SUCCESS or count == 0:
        raise NoDeviceError("no CUDA device visible (check CUDA_VISIBLE_DEVICES); kern run needs an NVIDIA GPU")
    if not 0 <= gpu < count:
        raise NoDeviceError(f"--gpu {gpu} but {count} CUDA device(s) are visible: pass --gpu 0..{count - 1}")
    return count


# ---------------------------------------------------------------- manifest


@dataclass(frozen=True)
class ManifestFacts:
    """What the caller needs from a manifest before loading it. `manifest`: the kern_manifest.Manifest that passed
    verification here, the one typed model kern run reads; handed to the runtime (`Runtime.load` takes it), which then
    neither reads nor parses the file again."""

    manifest: Manifest
    tokens_max: int
    page_tokens: int
    pages_per_seq: int
    # meta.caller.prefill_batch_invariant: a token's K/V bits do not depend on the chunk that prefilled it
    # (kern manifest build --algos), so a cached prefix may be resumed at any token
    prefill_batch_invariant: bool = False
    # meta.caller.decode_advance: {"ring": the host-mapped token ring buffer, ...} (frozen JSON) when the decode
    # program advances its own inputs (generate.py's pipelined loop); None: the host writes every step's inputs
    decode_advance: Mapping[str, Any] | None = None
    # meta.caller.decode_batch_invariant: every decode bucket runs the same launches (kern manifest build
    # --batch-invariant), so a row's tokens do not depend on how many rows share its step (docs/caller.md)
    decode_batch_invariant: bool = False

    @property
    def max_context(self) -> int:
        return self.page_tokens * self.pages_per_seq


def check_verifies(source: Any, path: Path) -> Manifest:
    """kern_manifest's parse + verify on the host, so a broken manifest is refused before any GPU work.
    `source`: the manifest file's text (then kern_manifest's JSON rules hold too, as in `kern manifest check`:
    no duplicate keys, no NaN / Infinity) or an already decoded JSON object. Returns the verified
    kern_manifest.Manifest. Raises ConfigError naming the first fault and how many there are."""
    from kern_manifest import ManifestParseError, ManifestVerifyError, parse_manifest, verify

    try:
        parsed = parse_manifest(source)
        verify(parsed)
    except ManifestParseError as exc:
        raise ConfigError(f"manifest {path}: {exc}; regenerate it (kern manifest build)") from None
    except ManifestVerifyError as exc:
        first = exc.faults[0]
        more = f" (+{len(exc.faults) - 1} more: kern-manifest check {path})" if len(exc.faults) > 1 else ""
        raise ConfigError(f"manifest {path} fails verification at {first.path}: {first.message}{more}") from None
    return parsed


def load_verified(path: Path, hint: str = "") -> Manifest:
    """The verified kern_manifest.Manifest of the manifest file at `path`, parsed from the file's text (so a
    duplicate key is refused as by `kern manifest check`). Raises ConfigError naming the file: unreadable, not a
    regular file or larger than kern_manifest's MAX_MANIFEST_BYTES (64 MiB; read as `kern manifest check` reads
    it), not UTF-8 or not JSON (each message ending in `hint`), or its first parse or verification fault."""
    from kern_manifest import read_manifest_bytes
    from kern_manifest import other_kern_file

    text = read_text(Path(path), "manifest", ConfigError, hint, read=read_manifest_bytes)
    raw = parse_json(text, path, "manifest", ConfigError, hint)  # the JSON refusals name the file and end in `hint`
    other = other_kern_file(raw)
    if other is not None:  # a pins file or kernels.json given for a manifest: say what it is
        raise ConfigError(f"manifest {path} is {other}: pass a manifest (kern-manifest/1, e.g. manifests/*.json)")
    return check_verifies(text, path)


CALLER_BUFFERS = ("token_ids", "positions", "slot_mapping", "seq_lens", "cu_seqlens_q", "next_token")
CALLER_PROGRAMS = ("prefill", "decode")


def read_manifest(path: Path) -> ManifestFacts:
    """Parse and verify the manifest and pull the caller contract's facts. Raises ConfigError."""
    manifest = load_verified(path, "; generate it with kern manifest build")
    try:
        tokens_max = manifest.vars["tokens"].max
        paged = [s for s in manifest.states.values() if s.kind == "paged"]
        page_tokens = int(paged[0].page_tokens or 0) if paged else 16
        pages_per_seq = manifest.buffers["block_table"].shape_at(var_max(manifest.vars))[-1]
        for name in CALLER_BUFFERS:
            manifest.buffers[name]
        for name in CALLER_PROGRAMS:
            manifest.programs[name]
    except (KeyError, IndexError) as exc:
        raise ConfigError(f"manifest {path} does not follow the Qwen3 caller contract (docs/caller.md): "
                          f"missing or malformed {exc}") from None
    caller = caller_meta(manifest, path)
    flags = {key: caller.get(key, False) for key in ("prefill_batch_invariant", "decode_batch_invariant")}
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise ConfigError(f"manifest {path}: $.meta.caller.{key} = {_shown(value)} must be true or false; "
                              "regenerate it (kern manifest build)")
    advance = caller.get("decode_advance")
    if "decode_advance" in caller:
        if not isinstance(advance, Mapping):
            raise ConfigError(f"manifest {path}: $.meta.caller.decode_advance = {_shown(advance)} must be an object "
                              "naming the token ring ({\"ring\": BUFFER, ...}); regenerate it (kern manifest build)")
        ring = advance.get("ring")
        if not isinstance(ring, str) or ring not in manifest.buffers:
            raise ConfigError(f"manifest {path}: $.meta.caller.decode_advance.ring = {_shown(ring)} must name a "
                              "buffer of the manifest (the token ring); regenerate it (kern manifest build)")
    return ManifestFacts(manifest, tokens_max, page_tokens, pages_per_seq, flags["prefill_batch_invariant"], advance,
                         flags["decode_batch_invariant"])


def _shown(value: Any, limit: int = 60) -> str:
    """A (frozen) JSON value as it appears in a message: its JSON text, cut at `limit` characters."""
    text = json.dumps(value, default=dict)  # FrozenMap -> object; tuples are arrays already
    return text if len(text) <= limit else text[:limit - 3] + "..."


def caller_meta(manifest: Manifest, path: Path) -> Mapping[str, Any]:
    """The manifest's `meta.caller` object (docs/caller.md), {} when `meta` or `meta.caller` is absent. The manifest
    has passed kern_manifest's parser, so `meta` is an object (free-form inside, frozen JSON), but what kern run
    reads from it must have the contract's shape: raises ConfigError naming the file and the JSON path when
    `meta.caller` is present and not an object."""
    meta = manifest.meta if manifest.meta is not None else {}
    if "caller" not in meta:
        return {}
    caller = meta["caller"]
    if not isinstance(caller, Mapping):
        raise ConfigError(f"manifest {path}: $.meta.caller = {_shown(caller)} must be an object (the caller "
                          "contract's geometry and flags, docs/caller.md); regenerate it (kern manifest build)")
    return caller


def resolve_chunk(requested: int | None, facts: ManifestFacts) -> int:
    """Prefill chunk length: default 512 clamped to the tokens var max; an explicit larger one is refused."""
    if requested is None:
        return min(DEFAULT_CHUNK, facts.tokens_max)
    if requested < 1:
        raise InputError(f"--chunk {requested} must be >= 1")
    if requested > facts.tokens_max:
        raise InputError(f"chunk {requested} (--chunk, else the kern.toml target's `chunk`) exceeds the manifest's "
                         f"tokens var max {facts.tokens_max}: pass --chunk <= {facts.tokens_max} (or regenerate the "
                         f"manifest with --chunk-max)")
    return requested


# ---------------------------------------------------------------- kernels


def check_kernels(facts: ManifestFacts, kernels_dir: Path) -> None:
    """Every pinned module is `<kernels_dir>/<module>-<sha12>.cubin` with that sha256. Raises KernelsError."""
    if not kernels_dir.is_dir():
        raise KernelsError(f"kernels directory {kernels_dir} does not exist: run `kern kernels` "
                           "(tools/build_kernels.py) or pass --kernels")
    for module in sorted(facts.manifest.modules.values(), key=lambda m: m.name):
        sha = module.sha256
        path = kernels_dir / module.cubin_filename
        if not path.is_file():
            raise KernelsError(f"kernels directory {kernels_dir} lacks {path.name} (module {module.name!r} pinned at "
                               f"sha256 {sha[:12]}...): run `kern kernels` or pass the --kernels it was built into")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != sha:
            raise KernelsError(f"{path} has sha256 {digest[:12]}..., the manifest pins {sha[:12]}...: "
                               "rebuild kernels or regenerate the manifest")


# ---------------------------------------------------------------- weights


def read_safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (kern dtype, shape) from one .safetensors file's header. Raises WeightsError.

    kern_runtime's reader: the header is capped at 100 MiB, every entry needs a known dtype, a shape and
    data offsets that agree with it and end inside the file (a truncated shard is refused here)."""
    from kern_runtime import WeightArtifactError
    from kern_runtime import read_safetensors_header as read_header

    try:
        entries = read_header(path)
    except WeightArtifactError as exc:
        said = "not a safetensors file" in str(exc) or "not safetensors data" in str(exc)  # say it once
        verdict = "" if said else ": not a usable safetensors file"
        raise WeightsError(f"weights {exc}{verdict} (remake the checkpoint)") from None
    return {name: (meta.dtype, meta.shape) for name, (meta, _offset, _nbytes) in entries.items()}


def _index_shards(index: Path) -> list[str]:
    """kern_runtime's reading of model.safetensors.index.json, its refusal as a WeightsError."""
    from kern_runtime import WeightArtifactError, index_shards

    try:
        return index_shards(index)
    except WeightArtifactError as exc:
        raise WeightsError(f"weights index {exc}") from None


class CheckpointTensors(dict):  # dict[str, tuple[str, tuple[int, ...]]]
    """name -> (dtype, shape) of a checkpoint, plus `found_in`: name -> the .safetensors file holding it."""

    found_in: dict[str, Path]


def weight_list_files(weights: Any) -> list[Path]:
    """The files of `weights`. One path (a `Path` or `str`, or a list of one: a directory or a file) is
    returned as `[path]` unchecked. A list of several (the same path twice counts once) must hold only
    .safetensors files that exist, a directory being allowed only as the one weights path: raises WeightsError
    naming the entry at fault."""
    if isinstance(weights, (str, os.PathLike)):
        return [Path(weights)]
    if not len(weights):
        raise WeightsError("--weights: an empty list of paths: give a checkpoint directory or .safetensors files")
    unique = normalize_weights(weights)
    if isinstance(unique, Path):
        return [unique]
    count = len(unique)
    for i, path in enumerate(unique, 1):
        where = f"weights list entry {i} of {count} ({path})"
        if not path.exists():
            raise WeightsError(f"{where} does not exist: fix the path or drop it from the list")
        if path.is_dir():
            raise WeightsError(f"{where} is a directory: a directory is only allowed alone (one --weights, or a "
                               "kern.toml `weights` string); in a list, name its .safetensors files")
        if path.suffix.lower() != ".safetensors":
            raise WeightsError(f"{where} is not a .safetensors file: a weights list holds only .safetensors "
                               "files (pass a checkpoint directory alone)")
        if not path.is_file():
            raise WeightsError(f"{where} is not a regular file: fix the path or drop it from the list")
    return list(unique)


def checkpoint_files(weights: Path) -> list[Path]:
    """The .safetensors files of one weights path: the file itself, or a directory's index shards (else its
    *.safetensors). Raises WeightsError."""
    if weights.is_file():
        return [weights]
    if weights.exists() and not weights.is_dir():
        raise WeightsError(f"weights {weights} is neither a regular file nor a directory (a device, pipe or "
                           "socket): pass a checkpoint directory or a .safetensors file")
    if not weights.is_dir():
        raise WeightsError(f"weights {weights} do not exist: make them with `python tools/make_checkpoint.py "
                           f"--shape <shape> --out {weights}`, or point --weights at an existing checkpoint")
    index = weights / "model.safetensors.index.json"
    if index.is_file():
        names = _index_shards(index)
        files = [weights / n for n in names]
        for name, path in zip(names, files):
            if not path.is_file():
                raise WeightsError(f"weights index {index} names shard {name!r}, which is not in {weights}")
    else:
        files = sorted(weights.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"weights directory {weights} holds no .safetensors files: make one with "
                           "tools/make_checkpoint.py, or point --weights at a checkpoint")
    return files


def checkpoint_tensors(weights: Weights | str) -> CheckpointTensors:
    """name -> (dtype, shape) of a checkpoint: a dir (with or without the index json), a .safetensors file, or
    a list of .safetensors files (weight_list_files' rules; every file's header read). `found_in` names each
    tensor's file. Raises WeightsError naming the file at fault."""
    files = weight_list_files(weights)
    listed = len(files) > 1
    if not listed:
        weights = files[0]
        files = checkpoint_files(weights)
    tensors = CheckpointTensors()
    found_in: dict[str, Path] = {}
    for path in files:
        for name, info in read_safetensors_header(path).items():
            if name in tensors:
                if listed:
                    raise WeightsError(f"tensor {name!r} appears in two --weights files: {found_in[name]} and "
                                       f"{path}: a tensor must be in one file only (drop one, or remake the "
                                       "checkpoint)")
                first, second = (p.relative_to(weights) if weights.is_dir() else p for p in (found_in[name], path))
                raise WeightsError(f"tensor {name!r} appears in two shards of {weights}: {first} and {second}: "
                                   "remake the checkpoint")
            tensors[name] = info
            found_in[name] = path
    tensors.found_in = found_in
    return tensors


def check_weights(facts: ManifestFacts, tensors: dict[str, tuple[str, tuple[int, ...]]], weights: Weights) -> None:
    """Every weight buffer's bind against the checkpoint's tensor list, as the runtime will load it: each bound
    tensor exists with the buffer's dtype, then kern_runtime's own `plan_bind` (trailing dims, `rows` and `cols`
    ranges inside the tensor, interleave blocks, dim 0 covered exactly) at the vars' max. Raises WeightsError
    naming the tensor and the buffer (and, for a list of files, the file holding the tensor at fault)."""
    from kern_runtime import TensorMeta, WeightArtifactError, plan_bind

    manifest = facts.manifest
    at_max = var_max(manifest.vars)
    metas = {name: TensorMeta(dtype, tuple(shape)) for name, (dtype, shape) in tensors.items()}
    listed = not isinstance(weights, (str, os.PathLike))
    found_in: dict[str, Path] = tensors.found_in if listed and isinstance(tensors, CheckpointTensors) else {}
    label = weights_label(weights) if listed else str(weights)

    def in_file(*tnames: str) -> str:  # " (in FILE)" for a list of files; "" for one path, as before lists
        files = list(dict.fromkeys(str(found_in[t]) for t in tnames if t in found_in))
        return f" (in {', '.join(files)})" if files else ""

    for bname, buf in sorted(manifest.buffers.items()):
        if buf.kind != "weight" or buf.bind is None or any(isinstance(s, DerivedSegment) for s in buf.bind):
            continue
        for tname in bound_tensors(buf):
            if tname not in metas:
                raise WeightsError(f"checkpoint {label} has no tensor {tname!r} (bound into buffer {bname!r}): "
                                   "the checkpoint does not match the manifest")
            if metas[tname].dtype != buf.dtype:
                raise WeightsError(f"tensor {tname!r}{in_file(tname)} is {metas[tname].dtype}, buffer {bname!r} "
                                   f"wants {buf.dtype}: convert the checkpoint or regenerate the manifest")
        try:
            plan_bind(buf, metas, at_max)
        except WeightArtifactError as exc:
            shape = list(buf.shape_at(at_max))
            raise WeightsError(f"checkpoint {label}: {exc} (buffer {bname!r} has shape {shape})"
                               f"{in_file(*bound_tensors(buf))}: wrong model for this manifest") from None


def bound_tensors(buffer: Buffer) -> list[str]:
    """The checkpoint tensors a weight buffer's bind reads, in bind order (none for a derived buffer)."""
    names: list[str] = []
    for seg in buffer.bind or ():
        if isinstance(seg, InterleaveSegment):
            names.extend(seg.tensors)
        elif isinstance(seg, (TensorSegment, RowsSegment)):
            names.append(seg.tensor)
    return names


def check_capacity(capacity_tokens: int, capacity_from: str | None, facts: ManifestFacts,
                   one_sequence: bool = True) -> None:
    """A KV capacity given explicitly (`capacity_from`: the flag or kern.toml key; None: the default, not checked
    here) must hold at most one sequence's context when one sequence uses the pool (`one_sequence`; several
    `--prompts` also keep cached prefixes in it), and its pages must have int32 ids. Raises InputError naming
    both numbers."""
    if capacity_from is None:
        return
    pages = -(-capacity_tokens // facts.page_tokens)
    if pages >= MAX_PAGE_IDS:
        raise InputError(f"{capacity_from} {capacity_tokens} tokens is {pages} pages of {facts.page_tokens}, more "
                         f"than the {MAX_PAGE_IDS - 1} page ids the device block tables hold (int32)")
    if one_sequence and capacity_tokens > facts.max_context:
        raise InputError(f"{capacity_from} {capacity_tokens} is more than the manifest's max context "
                         f"({facts.max_context} tokens), which is all one sequence can use: pass --capacity <= "
                         f"{facts.max_context}")


def check_prompt(prompt_tokens: int, capacity_tokens: int, facts: ManifestFacts) -> None:
    """The prompt must fit the KV capacity and the manifest's context. Raises InputError, whose hint is one the
    user can follow: raising --capacity only while it is below the max context."""
    if prompt_tokens > facts.max_context:
        also = f" and --capacity ({capacity_tokens})" if capacity_tokens < prompt_tokens else ""
        raise InputError(f"the prompt is {prompt_tokens} tokens, more than the manifest's max context "
                         f"({facts.max_context} tokens){also}: shorten it, or use a manifest generated with a larger "
                         "--max-context (kern manifest build)")
    if prompt_tokens > capacity_tokens:
        raise InputError(f"the prompt is {prompt_tokens} tokens, more than --capacity ({capacity_tokens} tokens): "
                         f"shorten it or raise --capacity (<= {facts.max_context})")
