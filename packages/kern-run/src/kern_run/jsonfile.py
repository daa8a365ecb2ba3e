"""Reading a JSON file a user handed us, with one refusal per way it can be unreadable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import RefusalError


def read_json(path: Path, what: str, error: type[RefusalError], hint: str = "") -> Any:
    """The parsed JSON of `path`. Raises `error` naming `what` and the file for an unreadable file (OS error),
    non-UTF-8 bytes (with the byte offset) or invalid JSON; `hint` ("; fix it") ends each message."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(f"{what} {path}: {exc.strerror or exc}{hint}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not UTF-8 text (byte {exc.start}){hint}") from None
    except json.JSONDecodeError as exc:
        raise error(f"{what} {path} is not JSON ({exc}){hint}") from None
