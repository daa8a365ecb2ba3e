"""Writing outputs whole: every file of a set goes to a temporary file beside its target and is renamed over it only
when all are written, so no kern command or tool leaves a half-written or truncated output. Standard library only;
used by `kern manifest build` and the tools (build_kernels, make_checkpoint, pick_algos, regen_manifests, ...)."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class NotRegularFileError(OSError):
    """An existing target is not a regular file (a symbolic link, a device, a FIFO, a socket): renaming over it
    would replace the link or the device node, so it is refused. `filename` is the target, `strerror` says what
    it is."""


_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"))


def check_target(path: Path) -> None:
    """Refuse a target that exists and is not a regular file: IsADirectoryError for a directory,
    NotRegularFileError for a symbolic link (never followed) or a device, FIFO or socket. A missing target
    passes."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    if stat.S_ISLNK(mode):
        raise NotRegularFileError(0, "is a symbolic link; refusing to replace it (give the link's target)",
                                  str(path))
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(21, os.strerror(21), str(path))
    for test, what in _KINDS:
        if test(mode):
            raise NotRegularFileError(0, f"is {what}, not a regular file; refusing to replace it", str(path))


def write_files(texts: dict[Path, str | bytes]) -> None:
    """Write every file whole: each text goes to a temporary file beside its target (created with the target's
    permissions), and only when all are written are they renamed over the targets; a failure removes the
    temporary files and leaves the targets as they were. Parent directories are not created. Every existing
    target must be a regular file (check_target): a symbolic link, device, FIFO or socket is refused before
    anything is written. Raises OSError naming the target (NotRegularFileError for those)."""
    for path in texts:
        check_target(path)
    temps: dict[Path, Path] = {}
    try:
        for path, text in texts.items():
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
