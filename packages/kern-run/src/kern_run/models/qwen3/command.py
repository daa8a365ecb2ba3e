"""What `kern manifest build` does: read the config (a config.json or a known shape) and the kernel ABI, build the
manifest (or one per tensor-parallel rank), verify each with kern_manifest, and write them whole.

`BuildRequest` holds the command's flags; `build_texts` makes and verifies every file's text before anything is
written; `write_outputs` renames them into place together. Refusals are ManifestBuildError, one line naming the
file, config field or flag.
"""

from __future__ import annotations

import dataclasses
import json
import errno
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kern_manifest import ManifestError, parse_manifest, verify

from ...errors import ManifestBuildError
from ...naming import model_name
from ...files import write_files
from .abi import read_kernel_abi
from .config import Qwen3Config
from .jsonio import dumps, read_json_file, sha256_text
from .manifest import build_manifest
from .options import BuildOptions
from .pins import invariant_decode_from_doc, pins_from_doc
from .shapes import SHAPES, config_text
from .tp import build_rank_manifests, rank_path


@dataclass(frozen=True)
class BuildRequest:
    """The flags of one `kern manifest build`. Exactly one of `config` (a config.json path) and `shape` (a key of
    shapes.SHAPES). `kernels`: a kernels directory (or its kernels.json). `options`: further BuildOptions fields
    (chunk_max, decode, gemv, ...; `decode` None: "gemv", at every tp)."""

    out: Path
    config: Path | None = None
    shape: str | None = None
    kernels: Path = Path("kernels")
    name: str | None = None
    max_context: int | None = None
    tp: int = 1
    algos: Path | None = None
    verify: bool = True
    options: dict[str, Any] = field(default_factory=dict)


def load_config(req: BuildRequest) -> tuple[Qwen3Config, str]:
    """(the config, the sha256 of its config.json text). Raises ManifestBuildError for neither or both of
    --config / --shape, an unreadable config.json, an unknown shape, or a config Qwen3Config refuses."""
    if (req.config is None) == (req.shape is None):
        raise ManifestBuildError("give exactly one of --config CONFIG.JSON and --shape "
                                 f"({'|'.join(SHAPES)})")
    if req.config is not None:
        raw, text = read_json_file(req.config)
        return Qwen3Config.from_json(raw, str(req.config)), sha256_text(text)
    cfg = Qwen3Config.from_name(req.shape)
    return cfg, sha256_text(config_text(SHAPES[req.shape]))


def default_name(req: BuildRequest) -> str:
    """--name, else the shape, else naming.model_name of the config path (links not followed)."""
    return req.name or req.shape or model_name(req.config)


def default_max_context(req: BuildRequest, cfg: Qwen3Config) -> int:
    """--max-context, else 4096 for the tiny shape, else min(40960, max_position_embeddings). Raises
    ManifestBuildError for a value below 1."""
    if req.max_context is None:
        return 4096 if req.shape == "tiny" else min(40960, cfg.max_position_embeddings)
    if req.max_context < 1:
        raise ManifestBuildError(f"--max-context {req.max_context}: positions per sequence must be >= 1")
    return req.max_context


def build_options(req: BuildRequest, cfg: Qwen3Config) -> BuildOptions:
    """The BuildOptions of the request (the pins file read; `decode` None: "gemm" with batch_invariant, else
    "gemv"). Raises ManifestBuildError for a pins file load_algos refuses, or a malformed invariant_decode_pins
    row."""
    fields = dict(req.options)
    if fields.get("decode") is None:
        fields["decode"] = "gemm" if fields.get("batch_invariant") else "gemv"
    opts = BuildOptions(default_name(req), max_context=default_max_context(req, cfg), **fields)
    if req.algos is None:
        return opts
    doc = read_json_file(req.algos, "not a pins file: ")[0]  # as load_algos reads it, once for both tables
    algos, decode_algos, source = pins_from_doc(req.algos, doc, opts.chunk_max)
    invariant_decode = invariant_decode_from_doc(req.algos, doc)
    return dataclasses.replace(opts, algos=algos, decode_algos=decode_algos, algos_source=source,
                               invariant_decode_algos=invariant_decode)


def verify_manifest_text(text: str, what: str) -> None:
    """Parse and verify with kern_manifest. Raises ManifestBuildError `{what} does not verify: {fault}`."""
    try:
        verify(parse_manifest(text))
    except ManifestError as exc:
        raise ManifestBuildError(f"{what} does not verify: {exc}") from None


def _check_out(out: Path) -> None:
    if out.is_dir():
        raise ManifestBuildError(f"--out {out} is a directory")
    if out.parent.exists() and not out.parent.is_dir():
        raise ManifestBuildError(f"--out {out}: {os.strerror(errno.ENOTDIR)}")


def build_texts(req: BuildRequest) -> dict[Path, str]:
    """Every output file's text (--out, or each rank's file with --tp N), all built and verified (unless
    req.verify is false) before any is written. Raises ManifestBuildError."""
    cfg, digest = load_config(req)
    abi = read_kernel_abi(req.kernels)
    opts = build_options(req, cfg)
    if req.tp == 1:
        manifests = {req.out: (build_manifest(cfg, abi, opts, digest), "the generated manifest")}
    else:
        ranks = build_rank_manifests(cfg, abi, opts, req.tp, digest)
        manifests = {rank_path(req.out, req.tp, r): (m, f"rank {r}'s manifest") for r, m in enumerate(ranks)}
    _check_out(req.out)
    texts = {}
    for path, (manifest, what) in manifests.items():
        texts[path] = dumps(manifest)
        if req.verify:
            verify_manifest_text(texts[path], what)
    return texts


def write_outputs(texts: dict[Path, str]) -> None:
    """Write every text whole, renamed into place together (parent directories created). Raises
    ManifestBuildError naming the file that cannot be written."""
    try:
        for path in texts:
            path.parent.mkdir(parents=True, exist_ok=True)
        write_files(texts)
    except OSError as exc:
        raise ManifestBuildError(f"--out {exc.filename or next(iter(texts))}: {exc.strerror or exc}") from None


def summary_line(path: Path, text: str, verified: bool) -> str:
    """`wrote PATH (N bytes, digest D12, decode K calls, verified)` of one written manifest."""
    manifest = json.loads(text)
    return (f"wrote {path} ({len(text)} bytes, digest {manifest['digest'][:12]}, decode "
            f"{len(manifest['programs']['decode']['calls'])} calls, {'verified' if verified else 'not verified'})")


def build(req: BuildRequest) -> list[str]:
    """Build, verify and write; returns one summary line per file written. Raises ManifestBuildError."""
    texts = build_texts(req)
    write_outputs(texts)
    return [summary_line(path, text, req.verify) for path, text in texts.items()]
