"""`Runtime.run_range` over the fake driver (fake_cuda.py): only the calls of [start, stop) are launched,
every launch of each, in program order; the ranges of a split add up to `run`; every refusal launches
nothing. The spec (runtime.md) lists run / run_range / capture / time_* for programs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from fake_cuda import FakeDriver, fake_cuda  # noqa: F401 - the fixture
from runtime_helpers import base_manifest, scale_op

from kern_runtime import ApiError, Runtime

LAYOUT = ((0, 8), (8, 8), (16, 4), (20, 4))  # scale_op's params
PAYLOAD = b"\x7fELF fake toy for run_range"


def op(*entries: str, when: list | None = None) -> dict:
    """An op whose launches are `scale_op` launches of `entries` (each with `when[i]` when given)."""
    launches = []
    for i, entry in enumerate(entries):
        launch = scale_op(entry=entry)["launches"][0]
        if when is not None and when[i] is not None:
            launch["when"] = {"tokens": when[i]}
        launches.append(launch)
    return {"args": scale_op()["args"], "launches": launches}


def call(name: str) -> dict:
    return {"op": name, "args": {"x": "x", "y": "y", "n": "tokens"}}


# call index: 0      1      2       3      4      5
CALLS = ["one", "two", "cond", "one", "three", "two"]
# launches per call at tokens=1 / at tokens>=2 ("cond": a when-pair and an unconditional tail)
PER_CALL = {1: [1, 2, 2, 1, 3, 2], 8: [1, 2, 2, 1, 3, 2]}


def range_manifest() -> dict:
    ops = {
        "one": op("k_one"),
        "two": op("k_two_a", "k_two_b"),
        "three": op("k_three_a", "k_three_b", "k_three_c"),
        "cond": op("k_small", "k_big", "k_tail", when=[[1, 1], [2, 64], None]),
    }
    m = base_manifest(ops=ops, programs={"step": {"calls": [call(c) for c in CALLS]},
                                         "empty": {"calls": []}})
    m["modules"] = {"toy": hashlib.sha256(PAYLOAD).hexdigest()}
    return m


@pytest.fixture
def rt(fake_cuda: FakeDriver, tmp_path: Path):
    digest = hashlib.sha256(PAYLOAD).hexdigest()
    (tmp_path / f"toy-{digest[:12]}.cubin").write_bytes(PAYLOAD)
    fake_cuda.entries = {e: LAYOUT for e in ("k_one", "k_two_a", "k_two_b", "k_three_a", "k_three_b",
                                             "k_three_c", "k_small", "k_big", "k_tail")}
    with Runtime.load(range_manifest(), tmp_path, None) as runtime:
        yield runtime


def launches(fake: FakeDriver, since: int) -> list[tuple[str, int, int]]:
    """(entry, grid x, parameter block address) of each cuLaunchKernel after call number `since`."""
    return [(args[0].entry, int(args[1]), int(args[9]))
            for name, args in fake.calls[since:] if name == "cuLaunchKernel"]


def expected(rt: Runtime, start: int, stop: int, tokens: int) -> list[tuple[str, int, int]]:
    grid = -(-tokens * 4 // 128)
    return [(rec.launch.entry, grid, rec.params.address) for rec in rt.records("step")
            if start <= rec.call_index < stop and rec.active]


@pytest.mark.parametrize("tokens", [1, 8])
def test_run_range_launches_whole_calls_in_order(rt: Runtime, fake_cuda: FakeDriver, tokens: int) -> None:
    n = len(CALLS)
    mark = len(fake_cuda.calls)
    rt.run("step", {"tokens": tokens})
    whole = launches(fake_cuda, mark)
    assert len(whole) == sum(PER_CALL[tokens])
    assert whole == expected(rt, 0, n, tokens)
    for start in range(n + 1):
        for stop in range(start, n + 1):
            mark = len(fake_cuda.calls)
            rt.run_range("step", {"tokens": tokens}, start, stop)
            got = launches(fake_cuda, mark)
            assert len(got) == sum(PER_CALL[tokens][start:stop]), (start, stop)
            assert got == expected(rt, start, stop, tokens), (start, stop)
    for k in range(n + 1):  # [0, k) then [k, n) launches exactly what run does, in the same order
        mark = len(fake_cuda.calls)
        rt.run_range("step", {"tokens": tokens}, 0, k)
        rt.run_range("step", {"tokens": tokens}, k, n)
        assert launches(fake_cuda, mark) == whole, k


def test_run_range_follows_when(rt: Runtime, fake_cuda: FakeDriver) -> None:
    """Call 2 ("cond"): k_small at tokens=1, k_big above, k_tail always; a range holding only it."""
    for tokens, entries in ((1, ["k_small", "k_tail"]), (2, ["k_big", "k_tail"]), (64, ["k_big", "k_tail"])):
        mark = len(fake_cuda.calls)
        rt.run_range("step", {"tokens": tokens}, 2, 3)
        assert [e for e, _, _ in launches(fake_cuda, mark)] == entries


def test_run_range_does_not_synchronise_like_run(rt: Runtime, fake_cuda: FakeDriver) -> None:
    mark = len(fake_cuda.calls)
    rt.run("step", {"tokens": 1})
    run_calls = {name for name, _ in fake_cuda.calls[mark:]}
    mark = len(fake_cuda.calls)
    rt.run_range("step", {"tokens": 1}, 0, len(CALLS))
    assert {name for name, _ in fake_cuda.calls[mark:]} == run_calls
    assert "cuStreamSynchronize" not in run_calls


def test_empty_range_and_empty_program(rt: Runtime, fake_cuda: FakeDriver) -> None:
    mark = len(fake_cuda.calls)
    for k in range(len(CALLS) + 1):
        rt.run_range("step", {"tokens": 3}, k, k)
    rt.run_range("empty", None, 0, 0)
    assert launches(fake_cuda, mark) == []
    with pytest.raises(ApiError, match=r"stop 1 is past the program's 0 call\(s\)"):
        rt.run_range("empty", None, 0, 1)


@pytest.mark.parametrize("program, vars, start, stop, message", [
    ("nope", {"tokens": 1}, 0, 1, r"unknown program 'nope'"),
    (None, {"tokens": 1}, 0, 1, r"unknown program None"),
    ("step", {"tokens": 1}, True, 2, r"start must be an integer, got True"),
    ("step", {"tokens": 1}, 0, False, r"stop must be an integer, got False"),
    ("step", {"tokens": 1}, 0.0, 2, r"start must be an integer"),
    ("step", {"tokens": 1}, 0, "2", r"stop must be an integer"),
    ("step", {"tokens": 1}, None, 2, r"start must be an integer"),
    ("step", {"tokens": 1}, -1, 2, r"start -1 is negative"),
    ("step", {"tokens": 1}, 0, 7, r"stop 7 is past the program's 6 call\(s\)"),
    ("step", {"tokens": 1}, 4, 3, r"start 4 is after stop 3"),
    ("step", {"tokens": 1}, 7, 7, r"stop 7 is past"),
    ("step", {"tokens": 0}, 0, 2, r"tokens"),
    ("step", {"tokens": 65}, 0, 2, r"tokens"),
    ("step", {"tokens": True}, 0, 2, r"tokens"),
    ("step", {"bogus": 1, "tokens": 1}, 0, 2, r"bogus"),
    ("step", [("tokens", 1)], 0, 2, r"mapping"),
])
def test_run_range_refusals_launch_nothing(rt: Runtime, fake_cuda: FakeDriver, program, vars, start, stop,
                                           message) -> None:
    mark = len(fake_cuda.calls)
    with pytest.raises(ApiError, match=message):
        rt.run_range(program, vars, start, stop)
    assert launches(fake_cuda, mark) == []


def test_run_range_accepts_numpy_integers(rt: Runtime, fake_cuda: FakeDriver) -> None:
    mark = len(fake_cuda.calls)
    rt.run_range("step", {"tokens": np.int32(1)}, np.int64(1), np.int16(2))
    assert launches(fake_cuda, mark) == expected(rt, 1, 2, 1)


def test_run_range_on_closed_runtime(rt: Runtime, fake_cuda: FakeDriver) -> None:
    rt.close()
    mark = len(fake_cuda.calls)
    with pytest.raises(ApiError, match="closed"):
        rt.run_range("step", {"tokens": 1}, 0, 1)
    assert launches(fake_cuda, mark) == []


def test_run_range_refused_before_peer_tables_filled(rt: Runtime, fake_cuda: FakeDriver) -> None:
    """The readiness check of `run` (multigpu/connect.py `Peers.require_ready`) guards run_range too."""
    rt.peers.peer_tables["peers"] = ("y", "world")  # as if the manifest had a peer table not yet filled
    mark = len(fake_cuda.calls)
    for runner in (lambda: rt.run("step", {"tokens": 1}), lambda: rt.run_range("step", {"tokens": 1}, 0, 1)):
        with pytest.raises(ApiError, match=r"peer table\(s\) not filled yet"):
            runner()
    assert launches(fake_cuda, mark) == []
    rt.peers.peers_filled.add("peers")
    rt.run_range("step", {"tokens": 1}, 0, 1)
    assert len(launches(fake_cuda, mark)) == 1
