"""Reading the builder's JSON inputs (config.json, kernels.json, pins files) and writing its outputs whole."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from kern_manifest import MAX_MANIFEST_BYTES, json_text_fault, read_regular_file

from ...errors import ManifestBuildError


def read_json_file(path: Path, what: str = "") -> tuple[Any, str]:
    """(the parsed JSON, the text) of a file. Raises ManifestBuildError naming the file when it cannot be read, is
    not a regular file of at most 64 MiB (kern_manifest.read_regular_file), is not UTF-8 or is not (usable) JSON:
    `{path}: {what}{kern_manifest.json_text_fault's reason}` (`what`, e.g. "not a pins file: ", goes before the
    reason)."""
    try:
        text = read_regular_file(path, MAX_MANIFEST_BYTES, "expected a JSON file", "a JSON file").decode("utf-8")
        return json.loads(text), text
    except OSError as exc:
        raise ManifestBuildError(f"{path}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # not UTF-8, invalid JSON, too deep, past the digit limit
        reason = json_text_fault(exc)
        if reason is None:
            raise
        raise ManifestBuildError(f"{path}: {what}{reason}") from None


def sha256_text(text: str) -> str:
    """sha256 hex digest of `text`'s UTF-8 bytes (meta.config_sha256)."""
    return hashlib.sha256(text.encode()).hexdigest()


def manifest_digest(manifest: dict[str, Any]) -> str:
    """docs/manifest.md "Digest": sha256 of the canonical JSON without the digest key."""
    body = {k: v for k, v in manifest.items() if k != "digest"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def dumps(manifest: dict[str, Any]) -> str:
    """The committed text form: sorted keys, one-space indent, trailing newline (deterministic)."""
    return json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=True) + "\n"
