"""`kern-pool simulate` on hostile traces and options: one stderr line naming the file (and line) or the
option, exit 2, never a traceback or an all-zero table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kern_pool.cli import main
from kern_pool.simulate import TraceError, read_trace

GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}\n'


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> None:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own refusal of an option
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize("text", ["", "\n  \n\n"])
def test_empty_trace_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(text)
    _refused(capsys, ["simulate", str(trace)], f"no requests in {trace}")
    _refused(capsys, ["simulate", str(trace), "--sweep"], f"no requests in {trace}")
    with pytest.raises(TraceError, match="no requests"):
        read_trace(trace)


def test_non_utf8_trace_names_line_and_byte(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(GOOD.encode() + b'{"x": "\xff"}\n')
    _refused(capsys, ["simulate", str(trace)], f"{trace}:2: not UTF-8", f"byte {len(GOOD) + 7}")


@pytest.mark.parametrize("line, needle", [
    ('{"input_length": true, "hash_ids": [1]}', "input_length must be a positive integer, got True"),
    ('{"input_length": 600, "output_length": false, "hash_ids": [1, 2]}', "output_length must be an integer"),
    ('{"input_length": 600, "hash_ids": [1, true]}', "hash_ids must be a list of integers"),
])
def test_json_booleans_are_not_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str,
                                      needle: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(line + "\n")
    _refused(capsys, ["simulate", str(trace)], f"{trace}:1: {needle}")


@pytest.mark.parametrize("line, needle", [
    ('{"input_length": 600, "hash_ids": [1, -2]}', "hash_ids must be a list of integers >= 0"),
    ('{"input_length": 600, "output_length": 1, "hash_ids": [-1, 2]}', "hash_ids must be a list of integers >= 0"),
])
def test_negative_hash_ids_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str,
                                       needle: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(GOOD + line + "\n")
    _refused(capsys, ["simulate", str(trace)], f"{trace}:2: {needle}")
    with pytest.raises(TraceError, match=f":2: {needle}"):
        read_trace(trace)


@pytest.mark.parametrize("option, needle", [
    (["--capacity", "1.5"], "whole number"),
    (["--capacity", "3000000.5"], "whole number"),
    (["--capacity", "100"], "--capacity 100 tokens holds no page of --page-tokens 512"),
    (["--host-tokens", "100"], "--host-tokens 100 holds no page"),
    (["--sweep", "--capacity", "5e6"], "--capacity with --sweep"),
])
def test_options_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], option: list[str], needle: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(GOOD)
    _refused(capsys, ["simulate", str(trace), *option], needle)


def test_whole_capacities_still_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(GOOD)
    for capacity in ("3e6", "1024", "inf"):
        assert main(["simulate", str(trace), "--capacity", capacity, "--json"]) == 0
    assert main(["simulate", str(trace), "--host-tokens", "512"]) == 0
    capsys.readouterr()


def test_an_integer_over_the_digit_limit_is_refused_with_its_line(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(GOOD + '{"input_length": 1' + "0" * 5000 + ', "hash_ids": [1]}\n')
    _refused(capsys, ["simulate", str(trace)],
             f"kern-pool: {trace}:2: not a request (a number too long: an integer of more than 4300 digits)\n")


def test_a_key_given_twice_is_refused_with_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """json keeps the last of two equal keys: this line replayed 5 tokens where its first input_length says 600."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(GOOD + '{"input_length": 600, "hash_ids": [1, 2], "input_length": 5}\n')
    _refused(capsys, ["simulate", str(trace)], f"{trace}:2: duplicate key 'input_length'")
    with pytest.raises(TraceError, match=":2: duplicate key"):
        read_trace(trace)


def test_a_trace_that_is_not_a_regular_file(capsys: pytest.CaptureFixture[str]) -> None:
    _refused(capsys, ["simulate", "/dev/null"], "trace /dev/null is not a regular file")


@pytest.mark.parametrize("argv, needle", [
    (["--capacity", "1e9", "--page-tokens", "1"], "--capacity 1e+09 tokens at --page-tokens 1 is 1000000000 pages"),
    (["--host-tokens", "1e9", "--page-tokens", "16"], "--host-tokens 1e+09 tokens at --page-tokens 16"),
    (["--sweep", "--page-tokens", "4"], "the sweep's largest capacity, 5e+07 tokens at --page-tokens 4"),
])
def test_pools_of_too_many_pages_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                             needle: str) -> None:
    """MAX_TOKENS bounds tokens; at a page of a few tokens that is still 1e9 page ids in Python lists."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(GOOD)
    _refused(capsys, ["simulate", str(trace), *argv], needle, "over the 4194304 a replay allocates")


def test_capacity_inf_is_bounded_by_the_traces_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """'inf' sizes the pool to the trace's whole input: 3 requests of 1.5e6 tokens (2930 blocks of 512) at 1-token
    pages is 4.5e6 pages, over 2^22."""
    trace = tmp_path / "t.jsonl"
    line = json.dumps({"timestamp": 0, "input_length": 1_500_000, "output_length": 1, "hash_ids": list(range(2930))})
    trace.write_text((line + "\n") * 3)
    _refused(capsys, ["simulate", str(trace), "--capacity", "inf", "--page-tokens", "1"],
             "capacity inf (the trace's tokens): 4.5e+06 tokens at 1 tokens per page is 4500001 pages")
