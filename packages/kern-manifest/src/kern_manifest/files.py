"""Reading a file a user named, bounded: a regular file of at most a stated size, never a device or a FIFO.

A directory, a device such as /dev/zero, a FIFO or a file larger than the limit is refused before it is read
(an `OSError` like any unreadable file), instead of being read without limit or blocking forever on a FIFO.
`read_regular_file` is the one reader for every side file of kern (kern-run's prompts, checkpoint configs and
tokenizer.json, the runtime's weight index and manifest); `read_manifest_bytes` is it for a manifest
(`load_manifest`, `kern-manifest check`, kern run's preflight, the runtime's `load_spec`). kern-pool, which
depends on nothing, has its own copy for traces (kern_pool.files).
"""

from __future__ import annotations

import errno
import os
import stat

MAX_MANIFEST_BYTES = 64 * 2**20  # the largest manifest file read (kern-manifest check, kern run / inspect)


def read_manifest_bytes(path: str | os.PathLike[str], limit: int = MAX_MANIFEST_BYTES) -> bytes:
    """The bytes of the manifest file `path` (`read_regular_file` with a manifest's limit and wording)."""
    return read_regular_file(path, limit, "a manifest is a JSON file", "a manifest file")


def read_regular_file(path: str | os.PathLike[str], limit: int, expected: str = "expected a regular file",
                      noun: str = "the file") -> bytes:
    """The bytes of the regular file `path`, at most `limit` bytes. Raises OSError for a file that cannot be
    read, and OSError (errno EINVAL or EFBIG, `strerror` saying why) for one that is not a regular file ("not a
    regular file (a FIFO); EXPECTED") or holds more than `limit` bytes ("too large (1.0 GiB; NOUN may hold at
    most 64.0 MiB)"): checked before reading (a device or FIFO is never opened) and again while reading (a file
    that grew)."""
    st = os.stat(path)
    data = b""
    if _file_kind(st.st_mode) is None and st.st_size <= limit:
        # O_NONBLOCK: a FIFO swapped in after the stat opens at once instead of waiting for a writer
        with open(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as f:
            st = os.fstat(f.fileno())
            if _file_kind(st.st_mode) is None:
                data = f.read(limit + 1)
    kind = _file_kind(st.st_mode)
    if kind is not None:
        raise OSError(errno.EINVAL, f"not a regular file ({kind}); {expected}")
    if st.st_size > limit or len(data) > limit:
        size = max(st.st_size, len(data))
        raise OSError(errno.EFBIG, f"too large ({format_bytes(size)}{'+' if len(data) > limit else ''}; {noun} "
                                   f"may hold at most {format_bytes(limit)})")
    return data


def file_kind(path: str | os.PathLike[str]) -> str | None:
    """None for a regular file (links followed), else what it is ("a directory", "a FIFO", ...). Raises OSError
    when it cannot be stat'ed."""
    return _file_kind(os.stat(path).st_mode)


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
