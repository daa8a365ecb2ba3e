"""Stop strings over streamed text: the output never holds a stop string, nor a piece of one that was later cut.

`StopText(stops).push(piece)` takes the next piece of detokenized text (kern_run.text.StreamDecoder gives whole
characters) and returns `(emit, stopped)`: the text that can be written now and whether a stop string has
matched. Text that could still be the start of a stop string (the longest suffix of what is held that is a
prefix of some stop string) is held back; when a stop string completes, the text read so far is cut before
the earliest occurrence of any stop string in it and the rest is dropped (generation ends there: nothing after
that piece is read). So the concatenated output is exactly what `reference` in tests/run/test_stop_text.py
gives, whatever the piece boundaries: never a stop string, never text that is later cut, and all of the text
after `push(..., final=True)` when none matched. `TokenText` chains a StreamDecoder to it: token ids in, text
out.
"""

from __future__ import annotations

from typing import Any, Sequence

from .errors import InputError
from .text import StreamDecoder


def check_stops(stops: Sequence[str], where: str = "--stop") -> tuple[str, ...]:
    """`stops` as a tuple; raises InputError naming `where` for an empty stop string (it would match at once)."""
    for s in stops:
        if not isinstance(s, str) or s == "":
            raise InputError(f"{where} {s!r}: a stop string must be non-empty text")
    return tuple(stops)


class StopText:
    """Hold-back and trim of stop strings over a stream of text pieces (module docstring)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = check_stops(stops)
        self._held = ""  # text read but not emitted: a possible start of a stop string
        self.stopped = False

    def _held_back(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best

    def push(self, piece: str, final: bool = False) -> tuple[str, bool]:
        """(text to emit now, stopped). After a stop nothing more is emitted. `final`: the stream ends here,
        so nothing is held back."""
        if self.stopped:
            return "", True
        text = self._held + piece
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self._held = ""
            return text[:min(hits)], True
        keep = 0 if final else self._held_back(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep], False


class TokenText:
    """Token ids -> emitted text for one row: incremental detokenization (whole UTF-8 characters), then stop
    strings. `push(token)` -> (emit, stopped); `finish()` -> the rest (the decoder's tail, what was held back)."""

    def __init__(self, codec: Any, stops: Sequence[str] = ()) -> None:
        self._decoder = StreamDecoder(codec)
        self._stops = StopText(stops)

    def push(self, token: int) -> tuple[str, bool]:
        return self._stops.push(self._decoder.push(token))

    def finish(self) -> str:
        return self._stops.push(self._decoder.flush(), final=True)[0]
