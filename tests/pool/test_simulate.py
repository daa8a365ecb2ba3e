"""Trace simulator and CLI: a hand-checked tiny trace, a brute-force reference, a real trace end to end."""

from __future__ import annotations

import json
import math
import random
from collections import OrderedDict
from pathlib import Path

import pytest

from kern_pool.cli import main
from kern_pool.simulate import Request, SimConfig, read_trace, simulate, synth_tokens

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[2]
TRACES = REPO.parent / "shared" / "traces"


def real_trace(name: str) -> Path:
    path = TRACES / name
    if not path.is_file():
        pytest.fail(f"trace {path} missing: CI must provide ../shared/traces next to the repository")
    return path


def test_synth_tokens_share_exactly_the_common_hash_prefix() -> None:
    a = synth_tokens(Request(1100, 0, (7, 8, 9)))
    b = synth_tokens(Request(1030, 0, (7, 8, 10)))
    assert len(a) == 1100 and len(b) == 1030
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert common == 1024


def test_tiny_trace_by_hand() -> None:
    """Worked out in the docstring of each step (3 pages of 512 tokens):
    1 [1,2] miss; 2 [1,2,3] hits 1024 (the 3-page entry replaces the 2-page one it covers);
    3 [1,4] hits 512 but the held hit pins the only entry: the hit is dropped, the entry evicted;
    4 [1,2] hits 512 from request 3's entry; 5 [5] misses and evicts request 3's entry."""
    r = simulate(DATA / "tiny.jsonl", SimConfig(capacity_tokens=1536))
    assert (r.requests, r.input_tokens, r.hit_tokens, r.hit_requests) == (5, 4584, 1536, 2)
    assert (r.evictions, r.dropped_hits, r.peak_pages, r.pool_pages) == (2, 512, 3, 3)
    big = simulate(DATA / "tiny.jsonl", SimConfig(capacity_tokens=math.inf))
    # request 4's whole prompt is cached: it reuses all but its last token
    assert (big.hit_tokens, big.hit_requests, big.evictions) == (1024 + 512 + 1023, 3, 0)


def _reference_unbounded(reqs: list[Request]) -> int:
    """Brute force: best shared token prefix with any earlier request, never the last token."""
    total = 0
    for i, r in enumerate(reqs):
        best = 0
        for q in reqs[:i]:
            k = 0
            while k < min(len(q.hash_ids), len(r.hash_ids)) and q.hash_ids[k] == r.hash_ids[k]:
                k += 1
            best = max(best, min(512 * k, q.input_length, r.input_length))
        total += min(best, r.input_length - 1)
    return total


def _random_trace(seed: int, n: int) -> list[Request]:
    rng = random.Random(seed)
    reqs: list[Request] = []
    next_id = 0
    for _ in range(n):
        if reqs and rng.random() < 0.7:
            base = rng.choice(reqs).hash_ids
            keep = list(base[: rng.randrange(len(base) + 1)])
        else:
            keep = []
        for _ in range(rng.randrange(0, 4)):
            keep.append(next_id)
            next_id += 1
        if not keep:
            keep, next_id = [next_id], next_id + 1
        length = 512 * (len(keep) - 1) + rng.randrange(1, 513)
        reqs.append(Request(length, 1, tuple(keep)))
    return reqs


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_unbounded_capacity_matches_brute_force(seed: int) -> None:
    reqs = _random_trace(seed, 120)
    r = simulate(Path("random.jsonl"), SimConfig(capacity_tokens=math.inf), reqs)
    assert r.hit_tokens == _reference_unbounded(reqs)
    assert r.evictions == 0 and r.refused_busy == r.refused_exceeds == 0


def _helper_baseline(reqs: list[Request], capacity_tokens: float) -> float:
    """The traces README method: block LRU over hash ids, hit = longest resident leading run."""
    cap = math.inf if math.isinf(capacity_tokens) else int(capacity_tokens) // 512
    lru: OrderedDict[int, None] = OrderedDict()
    hit = total = 0
    for r in reqs:
        k = 0
        while k < len(r.hash_ids) and r.hash_ids[k] in lru:
            k += 1
        hit += min(512 * k, r.input_length)
        total += r.input_length
        for h in r.hash_ids:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > cap:
            lru.popitem(last=False)
    return hit / total


@pytest.mark.parametrize(("name", "capacity", "tolerance"), [
    ("mooncake_conversation_trace.jsonl", math.inf, 0.001),
    ("mooncake_conversation_trace.jsonl", 1e6, 0.01),
    ("mooncake_synthetic_trace.jsonl", 2e6, 0.01),
])
def test_real_trace_end_to_end_against_the_helper_method(name: str, capacity: float, tolerance: float) -> None:
    path = real_trace(name)
    reqs = read_trace(path, limit=500)
    assert len(reqs) == 500
    r = simulate(path, SimConfig(capacity_tokens=capacity), reqs)
    assert r.requests == 500 and r.refused_busy == 0
    assert abs(r.hit_rate - _helper_baseline(reqs, capacity)) <= tolerance
    assert 0 < r.hit_rate < 1


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(DATA / "tiny.jsonl"), "--capacity", "1536", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hit_tokens"] == 1536 and out["evictions"] == 2 and out["hit_rate"] == round(1536 / 4584, 6)


def test_cli_table_and_host_tier(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(DATA / "tiny.jsonl"), "--capacity", "1536", "--host-tokens", "4096"]) == 0
    out = capsys.readouterr().out
    assert "hit_tok" in out and "parks" in out
    r = simulate(DATA / "tiny.jsonl", SimConfig(capacity_tokens=1536, host_tokens=4096))
    assert r.parks >= 1 and r.hit_tokens >= 1536


def test_cli_sweep_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(DATA / "tiny.jsonl"), "--sweep", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["capacity_tokens"] for row in rows][-1] == "inf"
    rates = [row["hit_rate"] for row in rows]
    assert rates == sorted(rates)


def test_cli_png_needs_matplotlib_or_writes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "curve.png"
    rc = main(["simulate", str(DATA / "tiny.jsonl"), "--sweep", "--png", str(png)])
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert rc == 3 and "pip install 'kern-pool[plot]'" in capsys.readouterr().err
    else:
        assert rc == 0 and png.stat().st_size > 0


def test_cli_missing_trace(tmp_path: Path) -> None:
    assert main(["simulate", str(tmp_path / "nope.jsonl")]) == 2


def test_cli_refuses_bad_traces_and_options(tmp_path, capsys) -> None:
    """Bad input is one line naming the file:line or the option, exit 2; never a traceback or a silent answer."""
    from kern_pool.cli import main

    cases = {
        '{"timestamp": 0, "input_length": -100, "hash_ids": [1]}\n': "t.jsonl:1: input_length must be a positive",
        '{"timestamp": 0, "input_length": 600, "hash_ids": [1, 2]}\nnot json\n': "t.jsonl:2: not JSON",
        '{"timestamp": 0, "input_length": 600}\n': "t.jsonl:1: missing field 'hash_ids'",
        '{"timestamp": 0, "input_length": 600, "hash_ids": [1]}\n': "1 hash_ids for input_length 600",
    }
    trace = tmp_path / "t.jsonl"
    for text, needle in cases.items():
        trace.write_text(text)
        assert main(["simulate", str(trace)]) == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err, err
    trace.write_text('{"timestamp": 0, "input_length": 600, "hash_ids": [1, 2]}\n')
    for option in (["--capacity", "nan"], ["--capacity", "1e30"], ["--page-tokens", "0"], ["--limit", "0"],
                   ["--host-tokens", "-512"]):
        try:
            main(["simulate", str(trace), *option])
        except SystemExit as e:  # argparse: exit 2 with the option named
            assert e.code == 2
        else:
            raise AssertionError(f"{option} accepted")
        assert option[0] in capsys.readouterr().err
    assert main(["simulate", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert main(["simulate", str(trace), "--limit", "1", "--host-tokens", "3e6"]) == 0
