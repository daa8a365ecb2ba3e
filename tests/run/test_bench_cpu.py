"""bench/decode.py and bench/prefill.py logic on the CPU: the kern workers over a fake runtime and a fake CUDA
driver (events with made-up times), the peers' orchestration and the tables. Catches breakage of the bench
code before a GPU run; the numbers mean nothing here."""

from __future__ import annotations

import itertools
import os
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]

from bench import decode as bench_decode
from bench import prefill as bench_prefill
from test_caller_pipeline import AdvancingFakeRuntime


class FakeDriver:
    """The few cuda.bindings.driver calls the benches make; event times advance by 1 ms per record."""

    CUresult = SimpleNamespace(CUDA_SUCCESS=0)

    def __init__(self) -> None:
        self.clock = itertools.count()
        self.times: dict[int, float] = {}
        self.ids = itertools.count(1)
        self.launches = 0

    def cuInit(self, flags): return (0,)
    def cuDeviceGet(self, i): return (0, i)
    def cuDevicePrimaryCtxRetain(self, d): return (0, "ctx")
    def cuCtxSetCurrent(self, c): return (0,)
    def cuMemGetInfo(self): return (0, 100 << 30, 140 << 30)
    def cuEventCreate(self, flags): return (0, next(self.ids))
    def cuEventDestroy(self, e): return (0,)
    def cuEventRecord(self, e, stream):
        self.times[e] = float(next(self.clock))
        return (0,)
    def cuEventSynchronize(self, e): return (0,)
    def cuEventElapsedTime(self, a, b): return (0, self.times[b] - self.times[a])
    def cuModuleLoadData(self, image): return (0, "module")
    def cuModuleGetFunction(self, module, name): return (0, name)
    def cuLaunchKernel(self, *args):
        self.launches += 1
        return (0,)


class BenchRuntime(AdvancingFakeRuntime):
    stream = "stream"
    context = "ctx"
    pool = None

    def synchronize(self) -> None:
        pass

    def run_hooked(self, program, values, on_launch) -> None:
        for i, (op, what) in enumerate([("embed", "kern_embed_gather"), ("gemv_qkv", "kern_gemv_rmsnorm"),
                                        ("gemv_qkv", "kern_gemv_rmsnorm"), ("decode_advance", "kern_decode_advance")]):
            on_launch(i, SimpleNamespace(op=op, launch=SimpleNamespace(entry=what)))
        self.issue(program, values)

    def close(self) -> None:
        pass


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch, tiny_manifest: Path):
    from kern_run.generate import Generator

    drv = FakeDriver()
    monkeypatch.setattr(bench_decode, "_cu", lambda: drv)

    def fake_open(cls, manifest, kernels, weights, facts, gpu=0, capacity_tokens=4096, **kw):
        rt = BenchRuntime(num_pages=capacity_tokens // 16 + 2, max_pos=facts.max_context)
        return cls(rt, facts, steps=rt)  # as Generator.open: the runtime's DeviceSteps

    monkeypatch.setattr(Generator, "open", classmethod(fake_open))
    return drv


def _args(tiny_manifest: Path, **kw):
    ns = dict(manifest=tiny_manifest, kernels=ROOT / "kernels", ckpt=Path("/nonexistent"), gpu=0, contexts=[20, 40],
              steps=30, lookahead=3, breakdown=True, breakdown_replays=3, prompts=[20, 60], chunks=[16, 64],
              repeats=2)
    ns.update(kw)
    return SimpleNamespace(**ns)


def test_kern_decode_worker(fakes: FakeDriver, tiny_manifest: Path, tmp_path: Path) -> None:
    out = tmp_path / "kern.jsonl"
    bench_decode.kern_worker(_args(tiny_manifest), str(out))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    perf = [r for r in rows if "ms_per_token" in r]
    assert {(r["peer"], r["ctx"]) for r in perf} == {(p, c) for c in (20, 40) for p in (
        "kern (graph)", "kern (graph, sync loop)", "kern (eager)")}
    assert all(r["steps"] == 30 for r in perf)
    graph = next(r for r in perf if r["peer"] == "kern (graph)")
    assert graph["pipelined"] and graph["timeline"]["busy_ms"]["median"] == 1.0  # one record between start/end
    assert not next(r for r in perf if r["peer"] == "kern (graph, sync loop)")["pipelined"]
    bd = next(r for r in rows if r["peer"] == "kern breakdown")
    assert [s["op"] for s in bd["summary"]][0] == "gemv_qkv" and bd["summary"][0]["launches"] == 2
    assert fakes.launches >= 3  # the spin gate ran once per replay
    table = bench_decode._table(rows, [20, 40], 1.87, 147456, [])
    assert "kern (graph)" in table and "per-launch breakdown, ctx 20" in table
    assert "nan" not in table  # kern alone: the "x best peer" column says "-"
    graph_row = next(line for line in table.splitlines() if line.startswith("kern (graph) "))
    assert graph_row.split("|")[1].split()[-1] == "-"
    with_peer = bench_decode._table([*rows, {"peer": "torch-graph", "ctx": 20, "ms_per_token": 2.0}], [20, 40], 1.87,
                                    147456, [])
    graph_row = next(line for line in with_peer.splitlines() if line.startswith("kern (graph) "))
    assert float(graph_row.split("|")[1].split()[-1]) == round(graph["ms_per_token"] / 2.0, 2)


def test_kern_prefill_worker(fakes: FakeDriver, tiny_manifest: Path, tmp_path: Path) -> None:
    out = tmp_path / "kern.jsonl"
    bench_prefill.kern_worker(_args(tiny_manifest), str(out))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {(r["peer"], r["n"]) for r in rows} == {(f"kern (chunk {c})", n) for c in (16, 64) for n in (20, 60)}
    assert all(r["tokens_per_s"] > 0 for r in rows)
    assert "kern (chunk 16)" in bench_prefill._table(rows, [20, 60], [])


def test_orchestration_collects_partial_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "w.jsonl"
    out.write_text(json.dumps({"peer": "x", "ctx": 1, "ms_per_token": 1.0}) + "\n")
    script = tmp_path / "w.py"
    script.write_text("import sys, time\ntime.sleep(30)\n")
    got, status = bench_decode._run_worker(["--worker", "x"], 1, str(out), script=script)
    assert status.startswith("timed out") and got == [{"peer": "x", "ctx": 1, "ms_per_token": 1.0}]
    np.testing.assert_allclose(bench_decode._ms([3.0, 1.0, 2.0])["median"], 2.0)


def test_decode_variants_run_kern_once_per_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """--variants: one kern worker per manifest, rows and breakdowns labelled by the manifest's stem."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 36}))
    seen: list[str] = []

    def fake_worker(argv, timeout, out, script=None):
        manifest = argv[argv.index("--manifest") + 1]
        seen.append(manifest)
        ms = 3.0 if "v2" not in manifest else 2.5
        rows = [{"peer": "kern (graph)", "ctx": 128, "ms_per_token": ms},
                {"peer": "kern breakdown", "ctx": 128, "sum_us": 10.0,
                 "summary": [{"op": "gemv_qkv", "what": "k", "launches": 1, "us_per_launch": 10.0,
                              "us_per_step": 10.0, "share": 1.0}]}]
        return rows, "ok"

    monkeypatch.setattr(bench_decode, "_run_worker", fake_worker)
    monkeypatch.setattr(bench_decode, "checkpoint_bytes", lambda path: 8_050_000_000)
    assert bench_decode.main(["--ckpt", str(ckpt), "--only", "kern", "--contexts", "128", "--json",
                              str(tmp_path / "o.json"), "--variants", "m/qwen3-4b.json,m/qwen3-4b-v2.json"]) == 0
    assert seen == ["m/qwen3-4b.json", "m/qwen3-4b-v2.json"]
    table = capsys.readouterr().out
    assert "kern (graph) [qwen3-4b]" in table and "kern (graph) [qwen3-4b-v2]" in table
    assert "per-launch breakdown [qwen3-4b-v2], ctx 128" in table


def test_profile_step_timeline_advances_sum_to_the_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """bench/profile_step.py --graph's summary: per op the start lag and the advance of the step's end; the
    advances of a step add up to its GPU time, an overlapped kernel's lag is negative."""
    from bench import profile_step

    ops = [("gemv_qkv", "kern_a"), ("rope", "kern_b"), ("gemv_o", "kern_c")]
    # two steps; within a step: a [0, 10), b [8, 12) (overlaps a by 2), c [13, 20) (1 us gap)
    kern = []
    for base in (0.0, 100.0):
        kern += [(base + 0.0, 10.0, "kern_a"), (base + 8.0, 4.0, "kern_b"), (base + 13.0, 7.0, "kern_c")]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur} for ts, dur, name in reversed(kern)
    ] + [{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "ts": 50.0, "dur": 1.0}]}))
    loaded = profile_step.load_chrome_trace(trace)
    assert loaded == sorted(kern)
    profile_step.timeline(loaded, ops)
    out = capsys.readouterr().out
    # second step starts after the first's end (20): a's lag 80, the step's GPU time 100 (from 20 to 120)
    assert "GPU time per step median 100.0 us" in out
    rows = {ln.split()[0]: [float(v) for v in ln.split()[1:]] for ln in out.splitlines()
            if ln.split() and ln.split()[0] in ("gemv_qkv", "rope", "gemv_o")}
    assert rows["rope"] == [1, 4.0, -2.0, 2.0, 2.0]  # n, dur, lag, advance, advance per step
    assert rows["gemv_o"] == [1, 7.0, 1.0, 8.0, 8.0]
    with pytest.raises(SystemExit, match="kernel 1 is kern_c"):
        profile_step.timeline([kern[0], kern[2], kern[1]], ops)


def test_profile_step_timeline_counts_a_library_call_as_one_op(capsys: pytest.CaptureFixture[str]) -> None:
    """A launch without an entry (cuBLASLt: a GEMM and its split-K reduction) is every kernel up to the next named
    launch's: one op spanning them; a trace that starts mid-step is cut to the first step's first launch, a
    trailing part step dropped; two adjacent library calls are refused (their kernels cannot be told apart)."""
    from bench import profile_step

    ops = [("embed", "kern_embed"), ("gemm_qkv", None), ("rope", "kern_rope")]
    kern = [(-5.0, 2.0, "kern_rope")]  # the end of an earlier step: dropped
    for base in (0.0, 100.0):
        kern += [(base, 2.0, "kern_embed"), (base + 3.0, 10.0, "sm90_gemm"), (base + 12.0, 4.0, "splitk_reduce"),
                 (base + 16.0, 5.0, "kern_rope")]
    kern += [(200.0, 2.0, "kern_embed"), (203.0, 10.0, "sm90_gemm")]  # a part step: dropped
    got = profile_step.timeline(kern, ops)
    assert got["step_us"] == 100.0  # the second step: from the first's end (21) to 121
    rows = {o["op"]: o for o in got["ops"]}
    assert rows["gemm_qkv"]["n"] == 1 and rows["gemm_qkv"]["dur_us"] == 13.0  # 3 .. 16, both kernels
    assert rows["gemm_qkv"]["lag_us"] == 1.0 and rows["gemm_qkv"]["adv_us"] == 14.0
    assert sum(o["adv_us_per_step"] for o in got["ops"]) == pytest.approx((21.0 + 100.0) / 2)
    assert "2 graph step(s) of 3 launches" in capsys.readouterr().out
    two = [("embed", "kern_embed"), ("attn", "kern_partial"), ("attn", "kern_reduce")]
    pair = [(0.0, 2.0, "kern_embed"), (2.0, 6.0, "kern_partial"), (7.0, 3.0, "kern_reduce")]
    split = {o["op"]: o["dur_us"] for o in profile_step.timeline(pair + [(t + 20.0, d, k) for t, d, k in pair], two)["ops"]}
    assert split == {"embed": 2.0, "attn:kern_partial": 6.0, "attn:kern_reduce": 3.0}  # a row per kernel of one op
    with pytest.raises(SystemExit, match="both run library kernels"):
        profile_step.timeline(kern, [("embed", "kern_embed"), ("a", None), ("b", None)])
    with pytest.raises(SystemExit, match="no whole step"):
        profile_step.timeline(kern[:3], ops)


@pytest.mark.parametrize("bench", ["decode", "prefill"])
def test_exit_status_says_whether_any_peer_measured(bench: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Every worker failed (no GPU, no torch): the table and the notes print, the exit status is 1 with one line
    saying so; one peer's measurement is enough for 0."""
    module = bench_decode if bench == "decode" else bench_prefill
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 36}))
    monkeypatch.setattr(bench_decode, "checkpoint_bytes", lambda path: 8_050_000_000)
    measured: set[str] = set()

    def fake_worker(argv, timeout, out, script=None):
        peer = argv[argv.index("--worker") + 1]
        if peer not in measured:
            return [], "exit 1: NoDeviceError: no CUDA device"
        row = {"ctx": 128, "ms_per_token": 3.0} if bench == "decode" else {"n": 512, "ttft_ms": 10.0,
                                                                           "tokens_per_s": 51200.0}
        return [{"peer": peer, **row}], "ok"

    monkeypatch.setattr(module, "_run_worker", fake_worker)
    sizes = ["--contexts", "128"] if bench == "decode" else ["--prompts", "512"]
    peers = ["kern", "hf"]
    argv = ["--ckpt", str(ckpt), "--only", ",".join(peers), *sizes, "--json", str(tmp_path / "o.json")]
    assert module.main(argv) == 1
    captured = capsys.readouterr()
    assert captured.err == f"bench/{bench}.py: no peer produced a measurement (see the notes above)\n"
    assert all(f"note: {p}: exit 1: NoDeviceError: no CUDA device" in captured.out for p in peers)
    assert json.loads((tmp_path / "o.json").read_text())["results"] == []
    measured.add("hf")
    assert module.main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "note: kern: exit 1" in captured.out and "note: hf:" not in captured.out


# ---------------------------------------------------------------- bench/prefill_profile.py

from bench import prefill_profile as bench_profile  # noqa: E402


@pytest.mark.parametrize(("name", "cls"), [
    ("kern_attn_prefill_r32", "attention"), ("kern_attn_prefill", "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >(Flash_fwd_params)", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "attention"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "gemm"),
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT", "gemm"), ("void cutlass::Kernel2<cutlass_80_tensorop>(Params)", "gemm"),
    ("kern_add_rmsnorm", "other"), ("kern_qk_norm_rope_kv", "other"),
    ("void at::native::elementwise_kernel<128, 2>(int, Functor)", "other"),
])
def test_prefill_profile_classes(name: str, cls: str) -> None:
    assert bench_profile.kernel_class(name) == cls


def test_prefill_profile_sums_classes_and_span(tmp_path: Path) -> None:
    out = str(tmp_path / "kern.jsonl")
    kernels = [(100.0, 500.0, "kern_attn_prefill_r32"), (700.0, 1000.0, "nvjet_tst_x"), (1800.0, 200.0, "kern_silu_mul"),
               (2000.0, 500.0, "kern_attn_prefill_r32")]
    bench_profile._emit_profile(out, "kern (chunk 2048)", kernels)
    (record,) = [json.loads(line) for line in Path(out).read_text().splitlines()]
    assert record["classes"] == {"attention": [1.0, 2], "gemm": [1.0, 1], "other": [0.2, 1]}
    assert record["span_ms"] == pytest.approx(2.4)
    assert record["top"][0] == ["kern_attn_prefill_r32", 1.0, 2]
    table = bench_profile._table([record], 8192)
    assert "kern (chunk 2048)" in table and "      1.0 (    2)" in table and "     2.4" in table
    with pytest.raises(SystemExit, match="no kernel"):
        bench_profile._emit_profile(out, "hf", [])


def test_write_json_to_a_file_a_directory_and_an_unwritable_path(tmp_path, monkeypatch, capsys) -> None:
    """bench/decode.py write_json (every bench's JSON): a file path, a directory (the default name in it), $OUT
    when no path is given, and a path in a missing directory reported on stderr, not raised (the tables are
    printed before it)."""
    write_json = bench_decode.write_json
    notes: list[str] = []
    write_json(tmp_path / "a.json", "default.json", {"x": 1}, notes)
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": 1} and notes == [f"JSON: {tmp_path / 'a.json'}"]
    write_json(tmp_path, "default.json", {"x": 2})
    assert json.loads((tmp_path / "default.json").read_text()) == {"x": 2}
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("OUT", str(out))
    write_json(None, "b.json", {"x": 3})
    assert json.loads((out / "b.json").read_text()) == {"x": 3}
    notes = []
    write_json(tmp_path / "missing" / "c.json", "c.json", {"x": 4}, notes)
    assert notes == [] and "could not write the JSON to" in capsys.readouterr().err
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    write_json(fifo, "d.json", {"x": 5}, notes)  # refused at once: opening it would wait for a reader
    assert notes == [] and "not a regular file" in capsys.readouterr().err
