"""Reading a file a user handed us (JSON or text), bounded, with one refusal per way it can be unreadable.

Every side file kern run reads goes through `read_text`, hence kern_manifest.read_regular_file: a regular file
(a directory, a device such as /dev/zero or a FIFO is refused before it is read) of at most a stated size
(docs/caller.md, "Files kern run reads"): MAX_CONFIG_BYTES for checkpoint configs and kern.toml,
MAX_TOKENIZER_BYTES for tokenizer.json, MAX_PROMPTS_BYTES for a --prompts file; a manifest is read by
kern_manifest.read_manifest_bytes (64 MiB).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any, Callable

from kern_manifest import json_text_fault, read_regular_file

from .errors import RefusalError

MAX_CONFIG_BYTES = 16 * 2**20  # config.json, generation_config.json, kern.toml (a few KiB in practice)
MAX_TOKENIZER_BYTES = 256 * 2**20  # tokenizer.json (Qwen3's is 11 MiB)
MAX_PROMPTS_BYTES = 64 * 2**20  # a --prompts file


def bounded(limit: int) -> Callable[[Path], bytes]:
    """A reader of a regular file of at most `limit` bytes (kern_manifest.read_regular_file), for `read_text`."""
    return partial(read_regular_file, limit=limit)


def read_text(path: Path, what: str, error: type[RefusalError], hint: str = "",
              read: Callable[[Path], bytes] = bounded(MAX_CONFIG_BYTES)) -> str:
    """The UTF-8 text of `path`. Raises `error` naming `what` and the file for an unreadable file (OS error:
    also a file that is not regular or is past the reader's limit) or non-UTF-8 bytes
    (kern_manifest.json_text_fault's reason: the byte and its offset); `hint` ("; fix it") ends each message.
    `read`: how to read the file's bytes: `bounded(limit)` (default MAX_CONFIG_BYTES), or for a manifest
    kern_manifest.read_manifest_bytes."""
    try:
        return read(Path(path)).decode("utf-8")
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


def read_json(path: Path, what: str, error: type[RefusalError], hint: str = "", limit: int = MAX_CONFIG_BYTES) -> Any:
    """The parsed JSON of `path` (a regular file of at most `limit` bytes). Raises `error` naming `what` and the
    file for an unreadable, non-regular or too large file, non-UTF-8 bytes (with the byte and its offset) or
    invalid JSON; `hint` ("; fix it") ends each message."""
    return parse_json(read_text(path, what, error, hint, bounded(limit)), path, what, error, hint)
