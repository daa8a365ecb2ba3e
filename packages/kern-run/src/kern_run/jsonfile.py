"""Reading a JSON file a user handed us, with one refusal per way it can be unreadable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from kern_manifest import json_text_fault

from .errors import RefusalError


def read_text(path: Path, what: str, error: type[RefusalError], hint: str = "",
              read: Callable[[Path], bytes] | None = None) -> str:
    """The UTF-8 text of `path`. Raises `error` naming `what` and the file for an unreadable file (OS error)
    or non-UTF-8 bytes (kern_manifest.json_text_fault's reason: the byte and its offset); `hint` ("; fix it")
    ends each message. `read`: how to read the file's bytes when not plainly (a manifest:
    kern_manifest.read_manifest_bytes, which refuses a file that is not regular or is too large with an
    OSError)."""
    try:
        if read is not None:
            return read(Path(path)).decode("utf-8")
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{what} {path}: {exc.strerror or exc}{hint}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is {json_text_fault(exc)}{hint}") from None


def parse_json(text: str, path: Path, what: str, error: type[RefusalError], hint: str = "") -> Any:
    """The parsed JSON `text` read from `path`. Raises `error` naming `what` and the file for invalid JSON,
    nesting too deep to decode or an integer literal with more digits than Python converts (the reason is
    kern_manifest.json_text_fault's)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        reason = json_text_fault(exc)
        if reason is None:
            raise
        raise error(f"{what} {path} is {reason}{hint}") from None


def read_json(path: Path, what: str, error: type[RefusalError], hint: str = "") -> Any:
    """The parsed JSON of `path`. Raises `error` naming `what` and the file for an unreadable file (OS error),
    non-UTF-8 bytes (with the byte and its offset) or invalid JSON; `hint` ("; fix it") ends each message."""
    return parse_json(read_text(path, what, error, hint), path, what, error, hint)
