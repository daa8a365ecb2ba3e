"""Stop strings (kern_run.stop_text): the output is the text read until a stop string completes, cut before the
earliest stop string in it, and nothing is emitted that could still be the start of one (hypothesis over random
texts, stops and splits; reference: str.find over the text read so far, piece by piece)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kern_run.errors import InputError
from kern_run.stop_text import StopText, TokenText, check_stops

ALPHABET = "ab\n"  # few letters: stop strings occur, and overlap
texts = st.text(alphabet=ALPHABET, max_size=40)
stop_lists = st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=4), min_size=1, max_size=3)


def reference(pieces: list[str], stops: list[str]) -> tuple[str, bool]:
    """The stream read piece by piece until some stop string occurs in what was read; cut before the earliest
    occurrence of any stop string then (str.find over the whole text read)."""
    read = ""
    for piece in pieces:
        read += piece
        hits = [i for i in (read.find(s) for s in stops) if i >= 0]
        if hits:
            return read[:min(hits)], True
    return read, False


def longest_held(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string (brute force)."""
    return max((k for s in stops for k in range(1, len(s)) if k <= len(text) and text.endswith(s[:k])), default=0)


@settings(max_examples=400, deadline=None)
@given(texts, stop_lists, st.lists(st.integers(0, 40), max_size=12))
def test_output_is_the_text_before_the_first_stop(text: str, stops: list[str], cuts: list[int]) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    want, want_stop = reference(pieces, stops)
    m = StopText(stops)
    out, consumed, stopped = "", "", False
    for piece in pieces:
        emit, stopped = m.push(piece)
        out += emit
        consumed += piece
        assert want.startswith(out)  # nothing emitted is ever taken back
        if stopped:
            break
        # held back: exactly the longest suffix that could still start a stop string
        assert len(consumed) - len(out) == longest_held(consumed, stops)
    if not stopped:
        emit, stopped = m.push("", final=True)
        out += emit
    assert (out, stopped) == (want, want_stop)
    assert m.push("more") == ("", True) if stopped else True


def test_a_stop_across_a_token_boundary_is_held_then_cut() -> None:
    m = StopText(["\n\n", "END"])
    assert m.push("one\n") == ("one", False)  # "\n" might start "\n\n"
    assert m.push("two E") == ("\ntwo ", False)
    assert m.push("N") == ("", False)
    assert m.push("Dtail") == ("", True)
    m = StopText(["abc"])
    assert m.push("xab") == ("x", False) and m.push("x") == ("abx", False) and m.push("", final=True) == ("", False)


def test_empty_stop_strings_are_refused() -> None:
    assert check_stops(["a", "\n"]) == ("a", "\n")
    with pytest.raises(InputError, match="--stop '': a stop string must be non-empty"):
        check_stops(["a", ""])


def test_token_text_over_a_byte_tokenizer(tiny_ckpt: Path) -> None:
    """One token per byte (the test tokenizer): a multi-byte character is never split, a stop string spanning
    several tokens is cut before."""
    from kern_run.text import load_codec

    codec = load_codec(tiny_ckpt)
    ids = codec.encode("héllo wörld, bye")
    t = TokenText(codec, ["ö", "bye"])
    out = ""
    for token in ids:
        piece, stopped = t.push(token)
        out += piece
        if stopped:
            break
    assert stopped and out == "héllo w"
    t = TokenText(codec, ["zz"])
    assert "".join(t.push(tok)[0] for tok in ids) + t.finish() == "héllo wörld, bye"


def test_a_stop_completing_first_wins_over_a_longer_one_starting_earlier() -> None:
    """Generation ends when the first stop string completes: 'aba' starting earlier never gets its last 'a'."""
    m = StopText(["b", "aba"])
    assert m.push("ab") == ("a", True)
    assert StopText(["b", "aba"]).push("aba") == ("", True)  # both complete in one piece: the earliest start
