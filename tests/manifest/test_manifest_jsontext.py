"""kern_manifest.json_text_fault: the one wording of why json.loads (or UTF-8 decoding) refused a text, shared by
the manifest parser, kern-run's file readers, the safetensors reader and the tools. One test per case."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any, Callable

import pytest

import kern_manifest
from kern_manifest import json_text_fault


def _raised(call: Callable[[], Any]) -> BaseException:
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - the exception itself is the test's input
        return exc
    raise AssertionError("expected an exception")


@pytest.fixture
def digit_limit() -> Iterator[int]:
    """A known, low integer digit limit (Python's minimum) for the test, restored after it."""
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        yield 640
    finally:
        sys.set_int_max_str_digits(before)


def test_exported_from_the_package() -> None:
    assert kern_manifest.json_text_fault is json_text_fault and "json_text_fault" in kern_manifest.__all__


@pytest.mark.parametrize(("text", "reason"), [
    ("", "not JSON (Expecting value at line 1 column 1)"),
    ('{"a": 1,\n  ]', "not JSON (Expecting property name enclosed in double quotes at line 2 column 3)"),
    ("[1] x", "not JSON (Extra data at line 1 column 5)"),
])
def test_invalid_json_gives_the_message_line_and_column(text: str, reason: str) -> None:
    exc = _raised(lambda: json.loads(text))
    assert isinstance(exc, json.JSONDecodeError)
    assert json_text_fault(exc) == reason


def test_bytes_that_are_not_utf8_give_the_byte_and_its_offset() -> None:
    exc = _raised(lambda: b'{"a": "\xff\xfe"}'.decode("utf-8"))
    assert json_text_fault(exc) == "not UTF-8 text (byte 0xff at offset 7)"
    truncated = _raised(lambda: b'"caf\xc3'.decode("utf-8"))  # a sequence cut short: its lead byte
    assert json_text_fault(truncated) == "not UTF-8 text (byte 0xc3 at offset 4)"
    from_loads = _raised(lambda: json.loads(b'["\x80"]'))  # json.loads(bytes) decodes as UTF-8 too
    assert json_text_fault(from_loads) == "not UTF-8 text (byte 0x80 at offset 2)"


def test_bytes_json_loads_took_for_utf32_name_that_encoding() -> None:
    exc = _raised(lambda: json.loads(b"\x00\x00\x00{\xff"))  # leading zero bytes: json.loads guesses UTF-32-BE
    assert isinstance(exc, UnicodeDecodeError) and exc.encoding == "utf-32-be"
    assert json_text_fault(exc) == "not UTF-32-BE text (byte 0xff at offset 4)"


def test_nesting_past_the_recursion_limit() -> None:
    exc = _raised(lambda: json.loads("[" * 100_000 + "]" * 100_000))
    assert isinstance(exc, RecursionError)
    assert json_text_fault(exc) == "not usable JSON (nested too deeply)"


def test_an_integer_literal_past_the_digit_limit_names_the_current_limit(digit_limit: int) -> None:
    exc = _raised(lambda: json.loads('{"n": ' + "7" * (digit_limit + 1) + "}"))
    assert type(exc) is ValueError
    assert json_text_fault(exc) == f"not usable JSON (an integer literal has more than {digit_limit} digits)"


@pytest.mark.parametrize("exc", [
    _raised(lambda: json.loads(None)),  # TypeError: a caller's bug, not the text's
    KeyError("weight_map"),
    ValueError("a ValueError from a caller's object_pairs_hook"),
    UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"),
    MemoryError(),
    KeyboardInterrupt(),
], ids=["TypeError", "KeyError", "ValueError", "UnicodeEncodeError", "MemoryError", "KeyboardInterrupt"])
def test_an_exception_not_about_the_input_is_none(exc: BaseException) -> None:
    assert json_text_fault(exc) is None
