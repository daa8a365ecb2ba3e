"""Reading a manifest file: a regular file of at most `MAX_MANIFEST_BYTES`, never a device or a FIFO.

A directory, a device such as /dev/zero, a FIFO or a file larger than the limit is refused before it is read
(an `OSError` like any unreadable file), instead of being read without limit. `load_manifest`, `kern-manifest
check` and kern run's preflight all read through `read_manifest_bytes`.
"""

from __future__ import annotations

import errno
import os
import stat

MAX_MANIFEST_BYTES = 64 * 2**20  # the largest manifest file read (kern-manifest check, kern run / inspect)


def read_manifest_bytes(path: str | os.PathLike[str], limit: int = MAX_MANIFEST_BYTES) -> bytes:
    """The bytes of the manifest file `path`. Raises OSError for a file that cannot be read, and OSError (errno
    EINVAL or EFBIG, `strerror` saying why) for one that is not a regular file or holds more than `limit` bytes:
    checked before reading (a device or FIFO is never opened) and again while reading (a file that grew)."""
    st = os.stat(path)
    data = b""
    if _file_kind(st.st_mode) is None and st.st_size <= limit:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if _file_kind(st.st_mode) is None:
                data = f.read(limit + 1)
    kind = _file_kind(st.st_mode)
    if kind is not None:
        raise OSError(errno.EINVAL, f"not a regular file ({kind}); a manifest is a JSON file")
    if st.st_size > limit or len(data) > limit:
        size = max(st.st_size, len(data))
        raise OSError(errno.EFBIG, f"too large ({format_bytes(size)}{'+' if len(data) > limit else ''}; a manifest "
                                   f"file may hold at most {format_bytes(limit)})")
    return data


def _file_kind(mode: int) -> str | None:
    """None for a regular file, else what it is ("a directory", "a character device", ...)."""
    if stat.S_ISREG(mode):
        return None
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


def format_bytes(n: int) -> str:
    """`n` bytes as a short human figure ("1.5 MiB")."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
