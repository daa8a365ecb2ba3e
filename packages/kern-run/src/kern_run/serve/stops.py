"""Stop strings over the detokenized text: held back while they might still match, never split in the output.

The text is produced by `kern_run.text.StreamDecoder` (whole UTF-8 characters only). A piece that could be the
start of a stop string is held back until it either completes one (the text ends before it, the request
stops) or cannot any more; so a stop string never appears in the output, also when it spans tokens.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..text import StreamDecoder


class StopMatcher:
    """`push(token_id, eos)` -> (text to emit now, stopped); `flush()` -> (the rest, stopped) at the end.

    `codec`: has `decode(ids) -> str`. `stops`: the request's stop strings (none: text flows as decoded). An EOS
    token (`eos` True) adds no text."""

    def __init__(self, codec: Any, stops: Sequence[str]) -> None:
        self._decoder = StreamDecoder(codec)
        self._stops = tuple(stops)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._buf = ""

    def push(self, token_id: int, eos: bool = False) -> tuple[str, bool]:
        if eos:
            return "", False
        self._buf += self._decoder.push(token_id)
        return self._scan(final=False)

    def flush(self) -> tuple[str, bool]:
        self._buf += self._decoder.flush()
        return self._scan(final=True)

    def _scan(self, final: bool) -> tuple[str, bool]:
        found = [i for i in (self._buf.find(s) for s in self._stops) if i >= 0]
        if found:
            out, self._buf = self._buf[:min(found)], ""
            return out, True
        keep = 0 if final else self._hold
        n = len(self._buf) - keep
        if n <= 0:
            return "", False
        out, self._buf = self._buf[:n], self._buf[n:]
        return out, False
