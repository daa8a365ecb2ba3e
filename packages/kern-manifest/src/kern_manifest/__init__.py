"""kern-manifest: the kern manifest format (docs/manifest.md) as typed, frozen dataclasses, a safe
integer-expression language, and a verifier that reports every fault with its JSON path.

Standard library only.

    from kern_manifest import load_manifest
    m = load_manifest("manifests/qwen3-4b.json")      # parse + verify
    m.buffers["hidden"].nbytes_at_max(m.vars)
    m.programs["decode"].vars_read(m)                 # the graph capture key
"""

from __future__ import annotations

import os

from .errors import ExprError, Fault, ManifestError, ManifestParseError, ManifestVerifyError
from .expr import Expr, parse_expr
from .frozen import FrozenMap, canonical_json
from .model import (
    DTYPE_BYTES,
    EXTERNS,
    FORMAT,
    Algo,
    AnyLaunch,
    ArgWiring,
    Buffer,
    BufferInit,
    Call,
    CallArg,
    DerivedSegment,
    ErrorWord,
    ExprWiring,
    ExternLaunch,
    IntValue,
    InterleaveSegment,
    Launch,
    LiteralWiring,
    Manifest,
    Module,
    NullWiring,
    Op,
    OpArg,
    PackField,
    PackLiteralField,
    PackPointerField,
    PackTensorMapField,
    PackWiring,
    PagesOf,
    PeersOf,
    Program,
    ProgramCall,
    RankGroup,
    RankWiring,
    Ref,
    RowsSegment,
    ScratchWiring,
    Segment,
    State,
    TensorMap,
    TensorSegment,
    Topology,
    Var,
    Wiring,
    family_digest_of,
    dtype_size,
    encoding_size,
    var_max,
    var_min,
)
from .files import MAX_MANIFEST_BYTES, file_kind, read_manifest_bytes, read_regular_file
from .formats import other_kern_file
from .jsontext import json_text_fault
from .parse import parse_manifest
from .pipes import quiet_on_closed_pipe
from .verify import find_faults, verify


def load_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read (`read_manifest_bytes`: a regular file of at most MAX_MANIFEST_BYTES), parse and verify the manifest
    at `path`. Raises `ManifestParseError` (not JSON, wrong JSON types; also an unreadable, non-regular or
    too large file, with path `$`) or `ManifestVerifyError` (all faults)."""
    try:
        text = read_manifest_bytes(path)
    except OSError as exc:
        raise ManifestParseError("$", f"cannot read manifest {os.fspath(path)!r}: {exc.strerror or exc}") from None
    manifest = parse_manifest(text)
    verify(manifest)
    return manifest


__version__ = "0.1.0"  # the one source of the version: [tool.hatch.version] reads it, the kern pins must equal it
__all__ = [
    "__version__",
    "DTYPE_BYTES", "EXTERNS", "FORMAT", "MAX_MANIFEST_BYTES", "file_kind", "read_manifest_bytes", "read_regular_file",
    "Algo", "AnyLaunch", "ArgWiring", "Buffer", "BufferInit", "Call", "CallArg",
    "DerivedSegment", "ErrorWord", "Expr", "ExprError", "ExprWiring", "ExternLaunch", "Fault", "FrozenMap", "IntValue",
    "InterleaveSegment", "Launch", "LiteralWiring", "Manifest", "ManifestError", "ManifestParseError",
    "ManifestVerifyError", "Module", "NullWiring", "Op", "OpArg", "PackField", "PackLiteralField", "PackPointerField",
    "PackTensorMapField", "PackWiring", "PagesOf", "PeersOf", "Program", "ProgramCall", "RankGroup", "RankWiring",
    "Ref", "RowsSegment", "ScratchWiring", "Segment", "State", "TensorMap", "TensorSegment", "Topology", "Var",
    "Wiring", "canonical_json", "dtype_size", "encoding_size", "family_digest_of", "find_faults", "json_text_fault",
    "load_manifest", "other_kern_file", "parse_expr", "parse_manifest", "quiet_on_closed_pipe", "var_max",
    "var_min", "verify",
]
