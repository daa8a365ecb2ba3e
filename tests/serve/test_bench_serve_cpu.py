"""bench/serve.py's pure parts on the CPU (arrival schedules, the trace scaling and its shared prefixes,
percentiles, the loopback-only guard, the metrics parser, the table) and its load generator against the fake
engine's server on a loopback port. The numbers mean nothing here."""

from __future__ import annotations

import asyncio
import json
import math
import os
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


# ---------------------------------------------------------------- the concurrency-1 line, the peer's plan, --fake


def test_parse_run_tpot_reads_kern_runs_log_line():
    line = ("kern run: 17 prompt tokens, prefill 16 tokens + first token in 12.3 ms; decode 2.693 ms/token; "
            "128 tokens generated (stop: steps)")
    assert bs.parse_run_tpot("x\n" + line + "\ny") == 2.693
    assert bs.parse_run_tpot("decode 3 ms/token") == 3.0
    assert bs.parse_run_tpot("no decode line here") is None


def test_c1_note_states_the_ratio_against_the_5_percent_target():
    assert bs.c1_note(2.80, 2.70, "kern run (m.json)") == (
        "concurrency 1: kern serve TPOT p50 2.800 ms vs kern run (m.json) 2.700 ms/token: +3.7% (within the 5% target)")
    assert "+10.0% (outside the 5% target)" in bs.c1_note(2.97, 2.70, "kern run")
    assert bs.c1_note(2.8, None, "kern run").endswith("kern run TPOT not measured")


def test_peer_plan_is_the_closed_batch_and_checks_its_config():
    plan = bs.peer_plan(5, 30, 7, 2, "paged|sdpa", '{"use_cuda_graph": true}')
    closed = bs.poisson_requests(5, math.inf, 30, 7, 2)
    assert plan["inputs"] == [list(r.prompt) for r in closed]
    assert plan["generation_config"] == {"max_new_tokens": 7, "min_new_tokens": 7, "do_sample": False,
                                         "eos_token_id": None, "pad_token_id": 0}
    assert plan["cb_config"] == {"use_cuda_graph": True} and plan["attn"] == "paged|sdpa"
    with pytest.raises(ValueError, match=r"--peer-cb-config '\{x': not JSON"):
        bs.peer_plan(1, 1, 1, 0, "sdpa", "{x")
    with pytest.raises(ValueError, match="expected a JSON object"):
        bs.peer_plan(1, 1, 1, 0, "sdpa", "[1]")
    proc = subprocess.run([sys.executable, str(HERE.parents[1] / "bench" / "serve.py"), "--fake", "--peer-cb-config",
                           "[1]"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "expected a JSON object" in proc.stderr  # refused before anything starts


def test_commands_target_loopback_and_the_chosen_manifest(tmp_path):
    args = bs.parser().parse_args(["--ckpt", str(tmp_path / "ckpt"), "--output-tokens", "9", "--gpu", "1"])
    man = tmp_path / "m.json"
    assert args.decode_manifest == "invariant"
    own = bs.server_command(args, None, 8123)  # no --manifest: kern serve --weights builds its own, batch-invariant
    assert "--manifest" not in own and "--no-invariant" not in own and own[own.index("--weights") + 1] == args.ckpt.as_posix()
    fast = bs.parser().parse_args(["--decode-manifest", "fast"])
    assert "--no-invariant" in bs.server_command(fast, None, 8123)
    log = "loading\nkern serve: reused manifest /c/kern/manifests/qwen3-4b-0123.json (from /w/config.json, pins /p.json)\n"
    assert bs.served_manifest(log) == Path("/c/kern/manifests/qwen3-4b-0123.json")
    assert bs.served_manifest(log.replace("reused", "built")) == Path("/c/kern/manifests/qwen3-4b-0123.json")
    assert bs.served_manifest("kern serve: listening\n") is None
    serve = bs.server_command(args, man, 8123)
    assert serve[1:4] == ["-m", "kern_run", "serve"] and serve[serve.index("--host") + 1] == "127.0.0.1"
    assert serve[serve.index("--manifest") + 1] == str(man) and serve[serve.index("--port") + 1] == "8123"
    run = bs.run_command(args, man)
    assert run[1:4] == ["-m", "kern_run", "run"] and "--ignore-eos" in run
    assert run[run.index("--prompt") + 1] == bs.C1_PROMPT and run[run.index("--max-tokens") + 1] == "9"
    assert run[run.index("--manifest") + 1] == str(man) and run[run.index("--gpu") + 1] == "1"
    fake = bs.parser().parse_args(["--fake"])
    assert bs.server_command(fake, None, 1)[1].endswith("bench/serve_fake.py")
    assert bs.run_command(fake, None)[1:3] == [str(HERE.parents[1] / "bench" / "serve_fake.py"), "run"]


def test_prefix_requests_colds_have_their_own_prefixes_and_hits_share_the_last():
    reqs = bs.prefix_requests(24, 3, 5, seed=2, colds=4)
    assert len(reqs) == 7 and all(r.max_tokens == 5 and len(r.prompt) == 40 for r in reqs)
    prefixes = [r.prompt[:24] for r in reqs]
    assert len(set(prefixes[:4])) == 4  # every cold request its own prefix
    assert prefixes[4:] == [prefixes[3]] * 3  # the hits share the last cold one's
    assert len({r.prompt[24:] for r in reqs}) == 7  # and every suffix differs
    assert bs.prefix_requests(24, 3, 5, seed=2) == bs.prefix_requests(24, 3, 5, seed=2, colds=1)


def test_fake_mode_runs_every_scenario_and_plans_the_peer(tmp_path):
    """bench/serve.py --fake end to end on the CPU: every scenario against the fake server (a trace file of our
    own), the concurrency-1 line against the fake kern run, the peer's plan; exact token counts (EOS ignored)."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in _records()) + "\n")
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(HERE.parents[1] / "bench" / "serve.py"), "--fake", "--requests", "4", "--rates",
           "100,inf", "--prompt-tokens", "16", "--output-tokens", "6", "--c1-requests", "2", "--prefix-tokens", "32",
           "--prefix-hits", "2", "--prefix-colds", "3", "--trace", str(trace), "--trace-requests", "4", "--context",
           "512",
           "--time-limit", "30", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "OUT": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    rows = {r["scenario"]: r for r in doc["rows"]}
    reqs, _ = bs.trace_requests(_records(), 512, 60.0, 0)
    want = {"poisson 100/s 16/6": (4, 24), "poisson closed batch (all at once) 16/6": (4, 24),
            "concurrency 1 (text)/6": (2, 12), "prefix cold 32+16 one at a time": (3, 48),
            "prefix hit 32+16 one at a time": (2, 32),
            "mooncake conversation (scaled)": (4, sum(r.max_tokens for r in reqs))}
    assert {k: (r["done"], r["output_tokens"]) for k, r in rows.items()} == want
    assert rows["prefix hit 32+16 one at a time"]["prefix_hit_rate"] > 0
    assert rows["prefix cold 32+16 one at a time"]["prefix_hit_rate"] == 0.0  # three prefixes no request shared
    assert "of the cold p50" in "\n".join(doc["notes"]) and "median of 3 cold requests" in "\n".join(doc["notes"])
    notes = "\n".join(doc["notes"])
    assert "concurrency 1: kern serve TPOT p50 " in notes and " vs the fake kern run " in notes
    assert "peer (planned, not run with --fake): generate_batch (paged|sdpa) of 4 requests, 64 prompt tokens" in notes
    assert "mooncake: 4 requests of trace.jsonl" in notes
    assert "===== kern serve under load" in proc.stdout
