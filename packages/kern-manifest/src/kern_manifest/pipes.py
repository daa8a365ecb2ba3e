"""A command line that exits quietly when its reader goes away (`kern-manifest check M | head -1`).

Python turns SIGPIPE into `BrokenPipeError` on the next write or flush, and once more when the interpreter
flushes stdout at exit ("Exception ignored ... BrokenPipeError"). `quiet_on_closed_pipe` runs a command's main,
flushes its output inside the guard, and on a closed pipe points stdout and stderr at /dev/null (so the exit flush
has nowhere to fail) and returns `CLOSED_PIPE_EXIT`: the recipe of the Python documentation ("Note on SIGPIPE",
library/signal.html), shared by `kern-manifest` and `kern` (kern-pool keeps its own copy: it imports no other kern
package). A standard stream whose file descriptor is closed (`kern-manifest check M >&-`: Python then sets
`sys.stdout` to None) is a reader that has gone too: it is replaced by `ClosedStream`, whose writes raise the
same `BrokenPipeError`, so the command ends the same way instead of with an AttributeError traceback.
"""

from __future__ import annotations

import errno
import io
import os
import sys
from collections.abc import Callable

CLOSED_PIPE_EXIT = 1  # as the Python docs' recipe and click (so typer's `kern`) exit on a closed pipe


class ClosedStream(io.TextIOBase):
    """Stands in for `sys.stdout` / `sys.stderr` when the descriptor is closed (`>&-`; Python sets the stream to
    None): writing text raises `BrokenPipeError` (errno EPIPE, as a pipe whose reader has gone), flushing does
    nothing, and it has no file descriptor."""

    encoding = "utf-8"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            raise BrokenPipeError(errno.EPIPE, "the standard stream's file descriptor is closed")
        return 0


def _open_streams() -> None:
    """Replace a standard stream that is None (its descriptor closed) by a `ClosedStream`."""
    if sys.stdout is None:
        sys.stdout = ClosedStream()
    if sys.stderr is None:
        sys.stderr = ClosedStream()


def quiet_on_closed_pipe(main: Callable[[], int]) -> int:
    """`main()`'s exit code (a `SystemExit` it raises passes through), its output flushed; `CLOSED_PIPE_EXIT`,
    printing nothing more, when stdout or stderr is a pipe whose reader has closed it, or a closed descriptor
    that the command writes to."""
    _open_streams()
    try:
        try:
            return main()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            try:
                os.dup2(devnull, stream.fileno())
            except (AttributeError, OSError, ValueError):  # not a file descriptor (a test's capture buffer)
                pass
        os.close(devnull)
        return CLOSED_PIPE_EXIT
