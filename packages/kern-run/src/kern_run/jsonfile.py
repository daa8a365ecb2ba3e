"""Reading a JSON file a user handed us, with one refusal per way it can be unreadable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import RefusalError


def read_text(path: Path, what: str, error: type[RefusalError], hint: str = "") -> str:
    """The UTF-8 text of `path`. Raises `error` naming `what` and the file for an unreadable file (OS error)
    or non-UTF-8 bytes (with the byte offset); `hint` ("; fix it") ends each message."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{what} {path}: {exc.strerror or exc}{hint}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not UTF-8 text (byte {exc.start}){hint}") from None


def parse_json(text: str, path: Path, what: str, error: type[RefusalError], hint: str = "") -> Any:
    """The parsed JSON `text` read from `path`. Raises `error` naming `what` and the file for invalid JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{what} {path} is not JSON ({exc}){hint}") from None


def read_json(path: Path, what: str, error: type[RefusalError], hint: str = "") -> Any:
    """The parsed JSON of `path`. Raises `error` naming `what` and the file for an unreadable file (OS error),
    non-UTF-8 bytes (with the byte offset) or invalid JSON; `hint` ("; fix it") ends each message."""
    return parse_json(read_text(path, what, error, hint), path, what, error, hint)
