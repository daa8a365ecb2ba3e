"""Writing a directory whole: every file goes into a temporary directory beside the target, which is renamed to
the target only when all are written. A failure removes the temporary directory; the target never exists half
written (the capture directory of `kern harvest capture`, the output of `kern harvest generate`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath


def write_directory(target: Path, files: dict[str, bytes]) -> None:
    """Create directory `target` holding `files` (relative POSIX path -> bytes; subdirectories are made). Raises
    FileExistsError when `target` exists (as anything, a dangling link included: nothing is replaced),
    OSError naming the path for a failing write, ValueError for a path that is absolute or leaves the
    directory (`..`). The parent directory must exist."""
    target = Path(target)
    for rel in files:
        parts = PurePosixPath(rel).parts
        if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
            raise ValueError(f"{rel!r}: not a relative path inside the directory")
    if os.path.lexists(target):
        raise FileExistsError(17, "exists; refusing to replace it (remove it or give another --out)", str(target))
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        for rel, data in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        os.rename(tmp, target)  # fails (and leaves the target alone) when it appeared meanwhile as a non-empty dir
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(target)) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
