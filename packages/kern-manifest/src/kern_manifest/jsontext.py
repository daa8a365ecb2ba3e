"""Why `json.loads` (or the UTF-8 decoding before it) refused a text, in one wording for every reader of a JSON
file in kern: the manifest parser, kern-run's file readers, the safetensors header reader and the tools.

Standard library only.
"""

from __future__ import annotations

import json
import re
import sys

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_UTF8 = frozenset({"utf-8", "utf8", "utf-8-sig", "utf_8", "utf_8_sig"})


def json_text_fault(exc: BaseException) -> str | None:
    """The reason, one short clause starting with "not", why the text given to `json.loads` (str or bytes) or
    to `bytes.decode("utf-8")` is unusable, for an exception either raised; None for any other exception (a bug
    or a resource limit, not the input's fault: the caller re-raises it). Callers put their own subject before
    it (`f"{path}: {reason}"`, `f"{what} is {reason}"`). The cases:

    - `json.JSONDecodeError` (invalid JSON): "not JSON (Expecting value at line 1 column 16)", with the
      decoder's message and the 1-based line and column of the fault.
    - `UnicodeDecodeError` (bytes that are not UTF-8): "not UTF-8 text (byte 0xff at offset 7)", the first
      offending byte and its 0-based offset in the bytes. For bytes `json.loads` took for UTF-16 or UTF-32 (it
      guesses from the zero bytes) the encoding is named instead: "not UTF-16-LE text (...)".
    - `RecursionError` (arrays or objects nested past Python's recursion limit): "not usable JSON (nested too
      deeply)".
    - `ValueError` from converting an integer literal with more digits than `sys.get_int_max_str_digits()`:
      "not usable JSON (an integer literal has more than 4300 digits)", naming the current limit.
    """
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if isinstance(exc, UnicodeDecodeError):
        encoding = "UTF-8" if exc.encoding.lower() in _UTF8 else exc.encoding.upper()
        if exc.start < len(exc.object):
            return f"not {encoding} text (byte {exc.object[exc.start]:#04x} at offset {exc.start})"
        return f"not {encoding} text (offset {exc.start})"
    if isinstance(exc, RecursionError):
        return "not usable JSON (nested too deeply)"
    if type(exc) is ValueError and "integer string conversion" in str(exc):
        return f"not usable JSON (an integer literal has more than {sys.get_int_max_str_digits()} digits)"
    return None


def json_value_bound(text: str) -> int:
    """An upper bound on the JSON values (objects, arrays, scalars, at any depth) that `json.loads(text)` builds,
    computed without building them: one more than the commas, `[` and `{` outside strings (every value but the
    first of a container follows a comma). Costs a scan of the text (C speed: a count of the three characters,
    and only when that count is large, a second count with the strings taken out)."""
    rough = text.count(",") + text.count("[") + text.count("{") + 1
    if rough <= 1 << 16:
        return rough
    bare = _STRING.sub("", text)
    return bare.count(",") + bare.count("[") + bare.count("{") + 1
