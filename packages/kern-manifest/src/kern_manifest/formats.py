"""The other kern JSON files a manifest path may be given by mistake, recognised by their `format` field.

`kern manifest check manifests/algos/h200.json` would otherwise report a cuBLASLt pins file as a broken manifest
(`missing required key 'name'`). `other_kern_file` names what such a file is instead, for `kern-manifest check`,
`kern manifest check`, `kern inspect` and `kern run`.
"""

from __future__ import annotations

import json
from typing import Any

# format prefix (before the "/<version>") -> what the file is and which tool makes or reads it
OTHER_FORMATS = {
    "kern-cublaslt-pins": "a cuBLASLt algorithm pins file (tools/pick_algos.py writes it, kern manifest build "
                          "--algos reads it)",
    "kern-kernels": "a kernels index (kernels/kernels.json, written by `kern kernels`)",
}


def other_kern_file(document: Any) -> str | None:
    """What `document` (JSON text or bytes, or a decoded JSON value) is when it is another kern file, or None.
    Returns, e.g., "a cuBLASLt algorithm pins file (format 'kern-cublaslt-pins/1', ...), not a manifest". Text that
    does not decode as JSON is None: the manifest reader's own fault is the one to report."""
    if isinstance(document, (str, bytes, bytearray)):
        try:
            document = json.loads(document)
        except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, too deep, too many digits
            return None
    fmt = document.get("format") if isinstance(document, dict) else None
    if not isinstance(fmt, str):
        return None
    what = OTHER_FORMATS.get(fmt.split("/", 1)[0])
    if what is None:
        return None
    kind, _, tools = what.partition(" (")
    return f"{kind} (format {fmt!r}; {tools[:-1]}), not a manifest" if tools else f"{kind}, not a manifest"
