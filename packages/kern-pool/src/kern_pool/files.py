"""Opening a file a user named, bounded: a regular file of at most a stated size, never a device or a FIFO.

kern-pool depends on nothing, so this is its own copy of kern_manifest.files' rule (the other packages read
through `kern_manifest.read_regular_file`): a directory, a device such as /dev/zero, a FIFO or a file larger
than the limit is refused before it is read, as an `OSError` like any unreadable file.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def open_regular(path: str | os.PathLike[str], limit: int, expected: str) -> BinaryIO:
    """`path` opened for binary reading. Raises OSError for a file that cannot be opened, and OSError (errno
    EINVAL or EFBIG, `strerror` saying why, `filename` the path, so that its message names the file as the
    open's own errors do) for one that is not a regular file ("not a regular file (a FIFO); EXPECTED") or is
    larger than `limit` bytes. A FIFO is never waited on (opened non-blocking, then refused)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a file")
            raise OSError(errno.EINVAL, f"not a regular file ({kind}); {expected}", os.fspath(path))
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"too large ({st.st_size} bytes; at most {limit} are read)", os.fspath(path))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
