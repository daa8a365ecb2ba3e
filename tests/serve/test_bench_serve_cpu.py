"""bench/serve.py's pure parts on the CPU (arrival schedules, the trace scaling and its shared prefixes,
percentiles, the loopback-only guard, the metrics parser, the table) and its load generator against the fake
engine's server on a loopback port. The numbers mean nothing here."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bench import serve as bs

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://127.3.4.5:1", "http://localhost:9",
                                 "http://[::1]:80"])
def test_loopback_urls_pass(url):
    assert bs.check_loopback(url) == url


@pytest.mark.parametrize("url, needle", [
    ("http://10.0.0.1:8000", "not a loopback address"), ("http://192.168.1.2", "not a loopback address"),
    ("http://8.8.8.8", "not a loopback address"), ("http://example.com:80", "must be a loopback address"),
    ("http://0.0.0.0:80", "not a loopback address"), ("/v1/completions", "no host"),
])
def test_other_urls_are_refused(url, needle):
    with pytest.raises(ValueError, match=needle):
        bs.check_loopback(url)


def test_poisson_arrivals():
    times = bs.poisson_arrivals(20_000, 50.0, seed=1)
    gaps = np.diff(times)
    assert times[0] == 0 and (gaps >= 0).all()
    assert abs(gaps.mean() - 1 / 50) < 0.02 * (1 / 50)  # mean 1/rate within 2% (20k draws: sd ~0.7%)
    assert abs(gaps.std() - 1 / 50) < 0.03 * (1 / 50)  # exponential: sd = mean
    assert bs.poisson_arrivals(5, 50.0, 1) == times[:5]  # the seed fixes the schedule
    assert bs.poisson_arrivals(5, 50.0, 2) != times[:5]
    assert bs.poisson_arrivals(3, math.inf, 0) == [0.0, 0.0, 0.0]
    for n, rate in ((-1, 1.0), (3, 0.0), (3, -2.0)):
        with pytest.raises(ValueError):
            bs.poisson_arrivals(n, rate, 0)


def test_poisson_requests_have_distinct_prompts_of_the_asked_lengths():
    reqs = bs.poisson_requests(8, 4.0, 100, 16, seed=3)
    assert [len(r.prompt) for r in reqs] == [100] * 8 and {r.max_tokens for r in reqs} == {16}
    assert len({r.prompt[:8] for r in reqs}) == 8
    assert all(bs.TOKEN_ID_LOW <= t < bs.TOKEN_ID_HIGH for r in reqs for t in r.prompt)


@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 99, 100])
def test_percentile_matches_numpy(q):
    values = list(np.random.default_rng(q).exponential(3.0, size=37))
    assert bs.percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)
    assert bs.percentile([4.0], q) == 4.0
    assert math.isnan(bs.percentile([], q))


def _records():
    return [
        {"timestamp": 0, "input_length": 1200, "output_length": 300, "hash_ids": [0, 1, 2]},
        {"timestamp": 500, "input_length": 1100, "output_length": 100, "hash_ids": [0, 1, 3]},
        {"timestamp": 2000, "input_length": 700, "output_length": 50, "hash_ids": [0, 4]},
        {"timestamp": 4000, "input_length": 3000, "output_length": 1000, "hash_ids": [5, 6, 7, 8, 9, 10]},
    ]


def test_trace_scaling_keeps_shared_prefixes_and_fits_the_context():
    recs = _records()
    reqs, scale = bs.trace_requests(recs, context=1001, seconds=2.0, seed=0)
    assert scale == pytest.approx(1000 / 4000)
    block = round(512 * scale)  # 128
    assert [len(r.prompt) for r in reqs] == [round(n * scale) for n in (1200, 1100, 700, 3000)]
    assert [r.max_tokens for r in reqs] == [round(n * scale) for n in (300, 100, 50, 1000)]
    assert all(len(r.prompt) + r.max_tokens - 1 <= 1000 for r in reqs)
    # hash ids [0, 1] shared by the first two: their first 2 scaled blocks are equal, the third is not
    assert reqs[0].prompt[:2 * block] == reqs[1].prompt[:2 * block]
    assert reqs[0].prompt[2 * block:2 * block + 8] != reqs[1].prompt[2 * block:2 * block + 8]
    assert reqs[2].prompt[:block] == reqs[0].prompt[:block] and reqs[2].prompt[block:] != reqs[0].prompt[block:175]
    assert reqs[3].prompt[:block] != reqs[0].prompt[:block]
    # arrivals compressed so the last one lands at `seconds`
    assert [r.at for r in reqs] == pytest.approx([0.0, 0.25, 1.0, 2.0])
    assert bs.trace_requests(recs, 10_000, 100.0)[1] == 1.0  # fits: not scaled up, not stretched in time
    assert [r.at for r in bs.trace_requests(recs, 10_000, 100.0)[0]] == pytest.approx([0, 0.5, 2.0, 4.0])


def test_read_trace(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _records()) + "\n")
    assert bs.read_trace(path, 2) == _records()[:2]
    bad = dict(_records()[0], hash_ids=[0])
    path.write_text(json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match="t.jsonl:1: not a Mooncake trace record"):
        bs.read_trace(path, 5)


def test_the_committed_trace_window_if_present():
    path = bs.default_trace()
    if not path.is_file():
        pytest.skip(f"{path} not here")
    recs = bs.read_trace(path, 200)
    reqs, scale = bs.trace_requests(recs, 8192, 60.0)
    assert len(reqs) == 200 and 0 < scale <= 1
    assert all(len(r.prompt) + r.max_tokens - 1 <= 8191 for r in reqs)
    block = round(512 * scale)
    shared = sum(r.prompt[:block] == reqs[0].prompt[:block] for r in reqs)
    assert shared == 200  # every conversation request starts with block 0 (the trace's README)


def test_parse_metrics_and_summarize():
    text = ("# HELP x\nkern_prefix_lookup_tokens_total 100.0\nkern_prefix_reused_tokens_total 40.0\n"
            'kern_requests_total{finish="stop"} 3.0\nkern_parks_total 2.0\nkern_decode_rows_sum 90.0\n'
            "kern_decode_rows_count 3.0\n")
    after = bs.parse_metrics(text)
    assert after["kern_prefix_lookup_tokens_total"] == 100.0 and "kern_requests_total" not in after
    before = {"kern_prefix_lookup_tokens_total": 20.0, "kern_prefix_reused_tokens_total": 0.0}
    outs = [bs.Outcome(sent=0.0, first=0.1, last=1.1, tokens=11), bs.Outcome(sent=0.5, first=0.7, last=2.7, tokens=21),
            bs.Outcome(sent=0.6, error="HTTP 500")]
    row = bs.summarize("s", outs, before, after)
    assert (row["requests"], row["done"], row["failed"], row["output_tokens"]) == (3, 2, 1, 32)
    assert row["output_tok_s"] == pytest.approx(32 / 2.7)
    assert row["ttft_ms_p50"] == pytest.approx(statistics.median([100.0, 200.0]))
    assert row["tpot_ms_p50"] == pytest.approx(100.0)  # 1.0 s / 10 and 2.0 s / 20
    assert row["prefix_hit_rate"] == pytest.approx(40 / 80) and row["parks"] == 2.0
    assert row["mean_decode_rows"] == 30.0 and row["errors"] == ["HTTP 500"]
    text = bs.table([row], ["a note"])
    assert "s " in text and "note: a note" in text and text.splitlines()[-2].split()[0] == "s"


def test_the_load_generator_against_the_fake_server(tmp_path):
    import httpx

    port = bs.free_port()
    proc = subprocess.Popen([sys.executable, str(HERE / "fake_server.py"), str(port)], cwd=HERE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "the fake server did not start"
            time.sleep(0.1)
        reqs = bs.poisson_requests(6, 200.0, 5, 4, seed=1)
        reqs = [bs.BenchRequest(r.at, tuple(t % 800 for t in r.prompt), r.max_tokens) for r in reqs]  # its vocab
        row = bs.run_scenario(base, "tiny", "fake", reqs, time_limit=20)
        assert (row["requests"], row["done"], row["output_tokens"]) == (6, 6, 24), row
        assert row["ttft_ms_p50"] > 0 and row["tpot_ms_p50"] > 0 and row["output_tok_s"] > 0
        shared = [bs.BenchRequest(0.0, tuple(t % 800 for t in r.prompt), r.max_tokens)
                  for r in bs.prefix_requests(20, 2, 3, seed=0)]
        assert shared[0].prompt[:20] == shared[2].prompt[:20] and shared[0].prompt[20:] != shared[1].prompt[20:]
        outs = asyncio.run(bs.run_one_at_a_time(base, "tiny", shared, time_limit=20))
        assert [o.tokens for o in outs] == [3, 3, 3] and all(a.last <= b.sent for a, b in zip(outs, outs[1:]))
        long = [bs.BenchRequest(0.0, (1, 2, 3), 200)]  # 200 steps of 10 ms: cut by a 0.5 s limit
        cut = bs.run_scenario(base, "tiny", "cut", long, time_limit=0.5)
        assert cut["failed"] == 1 and "time limit" in cut["errors"][0]
    finally:
        proc.terminate()
        proc.wait(10)
