"""`kern-pool simulate` does bounded work on hostile traces (issue 29, a fuzz pass): a 2 MB line used to end in a
MemoryError in synth_tokens (its hash ids expand to 150 M tokens), and a sparse 2 GB trace without newlines was
read whole as one line. Each is now one typed refusal, in well under a second."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from kern_pool.cli import main
from kern_pool.simulate import (
    MAX_REQUEST_TOKENS,
    MAX_TRACE_LINE_BYTES,
    TRACE_BLOCK_TOKENS,
    Request,
    TraceError,
    read_trace,
    synth_tokens,
)


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    start = time.perf_counter()
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert time.perf_counter() - start < 2
    return err.strip()


def test_the_bounds() -> None:
    assert (MAX_TRACE_LINE_BYTES, MAX_REQUEST_TOKENS) == (2**20, 2**22)


def test_a_line_whose_hash_ids_expand_past_the_bound(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ids = list(range(100_000))  # 0.7 MB of JSON, 51.2 M tokens
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"input_length": 512 * len(ids), "output_length": 1, "hash_ids": ids}) + "\n")
    assert _refused(capsys, ["simulate", str(trace)]) == (
        f"kern-pool: {trace}:1: input_length 51200000 is past the 4194304 tokens a replayed request may have (its "
        "tokens are synthesized, 8 bytes each)")
    with pytest.raises(TraceError, match=r"a request of 51200000 tokens \(100000 hash ids\): past the 4194304"):
        synth_tokens(Request(512 * len(ids), 1, tuple(ids)))  # a Request built by hand: refused before expanding
    largest = Request(MAX_REQUEST_TOKENS, 0, tuple(range(MAX_REQUEST_TOKENS // TRACE_BLOCK_TOKENS)))
    assert len(synth_tokens(largest)) == MAX_REQUEST_TOKENS


def test_a_long_line_or_a_sparse_file_is_refused_at_its_first_mib(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    two_mb = tmp_path / "long.jsonl"
    two_mb.write_text(json.dumps({"input_length": 512, "hash_ids": [1], "pad": "x" * 2_000_000}) + "\n")
    sparse = tmp_path / "sparse.jsonl"
    with sparse.open("wb") as f:
        f.truncate(2 * 2**30)
    for trace in (two_mb, sparse):
        assert _refused(capsys, ["simulate", str(trace)]) == (
            f"kern-pool: {trace}:1: a line longer than 1048576 bytes; a Mooncake request line is a few KiB")


def test_read_trace_refuses_a_fifo_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "t.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match=r"not a regular file \(a FIFO\); a trace is a JSONL file"):
        read_trace(fifo)
