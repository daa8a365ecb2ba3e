"""examples/pool_simulation.py: its counts agree with kern_pool's own trace replay (kern_pool.simulate) on the
tiny trace, its synthetic run is deterministic, and a bad argument is one line with exit status 2."""

from __future__ import annotations

import runpy
from collections.abc import Callable
from pathlib import Path

import pytest
from kern_pool.simulate import SimConfig, simulate

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "pool" / "data" / "tiny.jsonl"


def example_main() -> Callable[[list[str]], int]:
    return runpy.run_path(str(ROOT / "examples" / "pool_simulation.py"), run_name="example")["main"]


@pytest.mark.parametrize(("capacity", "host"), [(2048, 2048), (2048, 0), (4096, 0)])
def test_the_example_counts_what_kern_pools_replay_counts(capacity: int, host: int,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert example_main()(["--trace", str(TINY), "--capacity", str(capacity), "--host", str(host)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    want = simulate(TINY, SimConfig(capacity, host))
    assert want.refused_busy == want.refused_exceeds == want.dropped_hits == 0  # the cases both count alike
    rate = want.hit_tokens / want.input_tokens
    assert last == (f"5 requests, {want.input_tokens} prompt tokens, {want.hit_tokens} reused: hit rate {rate:.1%}; "
                    f"evictions {want.evictions}, parks {want.parks}, wakes {want.wakes}, refused 0")


def test_the_tiny_trace_line_by_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert example_main()(["--trace", str(TINY), "--capacity", "2048", "--host", "2048"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "request   1:   1024 tokens  fresh reused      0  pool pages held 2/4",
        "request   2:   1536 tokens  hit   reused   1024  pool pages held 3/4",
        "request   3:    700 tokens  hit   reused    512  pool pages held 4/4",
        "request   4:   1024 tokens  hit   reused   1023  pool pages held 3/4",
        "request   5:    300 tokens  fresh reused      0  pool pages held 4/4",
        "5 requests, 4584 prompt tokens, 2559 reused: hit rate 55.8%; evictions 1, parks 1, wakes 0, refused 0",
    ]


def test_synthetic_requests_park_and_wake(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--synthetic", "20", "--capacity", "3072", "--host", "8192", "--seed", "1"]
    assert example_main()(argv) == 0
    first = capsys.readouterr().out
    assert first.splitlines()[-1] == ("20 requests, 31971 prompt tokens, 15879 reused: hit rate 49.7%; "
                                      "evictions 16, parks 7, wakes 4, refused 0")
    assert example_main()(argv) == 0
    assert capsys.readouterr().out == first


@pytest.mark.parametrize(("argv", "line"), [
    (["--capacity", "100"], "pool_simulation.py: --capacity 100: expected an integer >= 512\n"),
    (["--synthetic", "0"], "pool_simulation.py: --synthetic 0: expected an integer >= 1\n"),
    (["--host", "-1"], "pool_simulation.py: --host -1: expected an integer >= 0\n"),
])
def test_a_bad_argument_is_one_line(argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        example_main()(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err == line


def test_a_bad_trace_line_names_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"input_length": 10, "hash_ids": [1]}\n{"hash_ids": [1]}\n')
    assert example_main()(["--trace", str(trace)]) == 2
    want = f"pool_simulation.py: --trace {trace}: {trace}:2: not a request (KeyError('input_length'))\n"
    assert capsys.readouterr().err == want


def test_an_unknown_flag_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        example_main()(["--bogus"])
    assert info.value.code == 2
    assert capsys.readouterr().err == "pool_simulation.py: unrecognized arguments: --bogus\n"
