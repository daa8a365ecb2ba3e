"""Writing outputs whole: every file of a set goes to a temporary file beside its target and is renamed over it only
when all are written, so no kern command or tool leaves a half-written or truncated output. Standard library only;
used by `kern manifest build` and the tools (build_kernels, make_checkpoint, pick_algos, regen_manifests, ...)."""

from __future__ import annotations

import os
from pathlib import Path


def write_files(texts: dict[Path, str | bytes]) -> None:
    """Write every file whole: each text goes to a temporary file beside its target (created with the target's
    permissions), and only when all are written are they renamed over the targets; a failure removes the
    temporary files and leaves the targets as they were. Parent directories are not created. Raises OSError
    naming the target."""
    temps: dict[Path, Path] = {}
    try:
        for path, text in texts.items():
            if path.is_dir():
                raise IsADirectoryError(21, os.strerror(21), str(path))
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            try:
                with open(tmp, "wb") as f:
                    temps[path] = tmp
                    f.write(text.encode() if isinstance(text, str) else text)
                if path.exists():
                    os.chmod(tmp, path.stat().st_mode & 0o7777)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, str(path)) from None
        for path, tmp in temps.items():
            try:
                os.replace(tmp, path)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, str(path)) from None
    finally:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
