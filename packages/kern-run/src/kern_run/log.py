"""structlog to stderr: level from --log-level, else $KERN_LOG, else info. stdout stays for generated text."""

from __future__ import annotations

import logging
import os
import sys

import structlog

LEVELS = ("debug", "info", "warning", "error")


def resolve_level(flag: str | None) -> str:
    """The effective level name: the flag, else $KERN_LOG, else "info".

    Raises typer.BadParameter (a usage error, exit 2) for a name not in LEVELS."""
    import typer

    level = (flag or os.environ.get("KERN_LOG") or "info").lower()
    if level not in LEVELS:
        source = "--log-level" if flag else "$KERN_LOG"
        raise typer.BadParameter(f"{source} {level!r} is not one of {', '.join(LEVELS)}")
    return level


def setup_logging(level: str) -> structlog.stdlib.BoundLogger:
    """Configure structlog once for this process (the CLI entry point) and return the `kern` logger."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False),
            structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    return structlog.get_logger("kern")
