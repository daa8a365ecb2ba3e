"""A command line that exits quietly when its reader goes away (`kern-manifest check M | head -1`).

Python turns SIGPIPE into `BrokenPipeError` on the next write or flush, and once more when the interpreter
flushes stdout at exit ("Exception ignored ... BrokenPipeError"). `quiet_on_closed_pipe` runs a command's main,
flushes its output inside the guard, and on a closed pipe points stdout and stderr at /dev/null (so the exit flush
has nowhere to fail) and returns `CLOSED_PIPE_EXIT`: the recipe of the Python documentation ("Note on SIGPIPE",
library/signal.html), shared by `kern-manifest` and `kern` (kern-pool keeps its own copy: it imports no other kern
package).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

CLOSED_PIPE_EXIT = 1  # as the Python docs' recipe and click (so typer's `kern`) exit on a closed pipe


def quiet_on_closed_pipe(main: Callable[[], int]) -> int:
    """`main()`'s exit code (a `SystemExit` it raises passes through), its output flushed; `CLOSED_PIPE_EXIT`,
    printing nothing more, when stdout or stderr is a pipe whose reader has closed it."""
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
