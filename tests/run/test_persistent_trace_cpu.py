"""bench/persistent_trace.py's pure part: the per-phase analysis of a trace (hop, work, segment per class) and
the --twice split, on synthetic stamps whose answers are known."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.persistent_trace import CLASSES, analyse, twice
from kern_run.models.qwen3.config import Qwen3Config
from kern_run.models.qwen3.persistent.schedule import build_schedule

CONFIGS = Path(__file__).parents[2] / "tests" / "data" / "configs"


@pytest.fixture(scope="module")
def sched():
    cfg = Qwen3Config.from_json(json.loads((CONFIGS / "Qwen3-1.7B.json").read_text()))
    return build_schedule(cfg, 16)


def stamps(sched, times) -> np.ndarray:
    """Trace words (3 a queue entry, queue by queue) from times(instruction index) -> (t0, t1, t2) in ns."""
    words = []
    for queue in sched.table.queues:
        for index in queue:
            words += [t & 0xFFFFFFFF for t in times(index)]
    return np.array(words, dtype=np.uint32)


def test_phases_in_series_give_their_hops_and_works(sched) -> None:
    # phase p (the p-th (layer, class) group in table order) runs in [10 us p + 2 us, 10 us p + 9 us]: every
    # instruction waits 1 us after its prologue, works 7 us, so a phase's segment is 10 us and its hop 3 us
    order = {}
    for ins in sched.table.instrs:
        order.setdefault((ins.layer, ins.op.name), len(order))
    base = 2**32 - 50_000  # the stamps wrap past 2^32 ns in the middle of the step

    def times(i):
        ins = sched.table.instrs[i]
        p = order[(ins.layer, ins.op.name)]
        return base + 10_000 * p + 1_000, base + 10_000 * p + 2_000, base + 10_000 * p + 9_000

    out = analyse(sched, stamps(sched, times))
    assert out["per_class_us"]["ATTN"]["segment"] is None  # the split attention's table: no ATTN phase
    for c in (c for c in CLASSES if c != "ATTN"):
        r = out["per_class_us"][c]
        assert r["segment"] == pytest.approx(10.0) and r["hop"] == pytest.approx(3.0)
        assert r["work_critical"] == pytest.approx(7.0) and r["work_max"] == pytest.approx(7.0)
        assert r["wait_median"] == pytest.approx(1.0)
    assert out["layer_us_median"] == pytest.approx(70.0)  # 7 phases of 10 us
    assert out["layers"] == 28


def test_the_slowest_instruction_ends_its_phase(sched) -> None:
    # in every QKV phase the instruction with the highest index works 5 us longer: QKV's critical work is 12 us,
    # its median 7, and the next phase (ROPE) starts its hop from that later end
    order = {}
    last_qkv = {}
    for i, ins in enumerate(sched.table.instrs):
        order.setdefault((ins.layer, ins.op.name), len(order))
        if ins.op.name == "QKV":
            last_qkv[ins.layer] = i

    def times(i):
        ins = sched.table.instrs[i]
        p = order[(ins.layer, ins.op.name)]
        extra = 5_000 if last_qkv.get(ins.layer) == i else 0
        return 20_000 * p, 20_000 * p + 1_000, 20_000 * p + 8_000 + extra

    r = analyse(sched, stamps(sched, times))["per_class_us"]
    assert r["QKV"]["work_critical"] == pytest.approx(12.0) and r["QKV"]["work_median"] == pytest.approx(7.0)
    assert r["ROPE"]["hop"] == pytest.approx(20.0 + 1.0 - 13.0)
    assert r["ROPE"]["segment"] == pytest.approx(20.0 - 5.0)


def test_twice_splits_the_first_run_from_the_second(sched) -> None:
    def times(i):  # t0 (here: the first run's end) 3 us after t1, t2 1.5 us after that
        return 100_000 + 10 * i + 3_000, 100_000 + 10 * i, 100_000 + 10 * i + 4_500

    got = twice(sched, stamps(sched, times))
    assert set(got) == {"ROPE", "ATTN_PARTIAL", "ATTN_REDUCE"}
    for first, second in got.values():
        assert first == pytest.approx(3.0) and second == pytest.approx(1.5)


def test_bad_inputs_are_refused_in_one_line_before_the_probe_compiles(tmp_path: Path, capsys, monkeypatch) -> None:
    import os

    from bench import persistent_trace

    def no_compile(*_args):
        raise AssertionError("the probe build started before the inputs were checked")

    monkeypatch.setattr(persistent_trace, "trace_kernels", no_compile)

    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    cases = [(["--config", str(fifo)], "not a regular file"), (["--config", str(tmp_path)], "not a regular file"),
             (["--stages", "9"], "ring stages 9: the kernel takes 2..8"),
             (["--counter-stride", "0"], "counter_stride 0: 1..64 words"),
             (["--twice", "--attn", "fused"], "--attn fused has none of them")]
    for extra, words in cases:
        assert persistent_trace.main(["--ckpt", str(tmp_path), *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("persistent_trace: ") and words in err and err.count("\n") == 1, err
