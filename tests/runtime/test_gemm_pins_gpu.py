"""kern_runtime.gemm_pins on the GPU: a picked prefill pin is batch-invariant on data it was not picked on, and
tools/pick_algos.py (now a wrapper over it) writes a pins file the builder takes.

Run on the H200:  KERN_REQUIRE_GPU=1 python3 -m pytest tests/runtime/test_gemm_pins_gpu.py -q
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def test_a_picked_pin_proves_invariant_again_on_other_data() -> None:
    from kern_runtime.gemm_pins import DeviceBench, PinPicker, is_invariant

    with PinPicker(0) as picker:
        row = picker.prefill(1024, 256, 600)
        assert row["algo"]["split_k"] <= 1 and row["algo"].get("reduction", 0) == 0
        assert row["us_max"] > 0 and row["candidates"] >= 1
        bench = DeviceBench(picker.blas, 1024, 256, 600, seed=12345)  # not the seed it was picked with
        try:
            assert is_invariant(bench, row["algo"])
        finally:
            bench.close()


def test_pick_algos_writes_a_pins_file_the_builder_takes(tmp_path: Path) -> None:
    from kern_run.models import qwen3
    from kern_runtime.gemm_pins import PinPicker
    from tools import pick_algos

    out = tmp_path / "pins.json"
    assert pick_algos.main(["--shape", "tiny", "--decode", "--m-max", "1024", "--out", str(out)]) == 0
    algos, decode, source = qwen3.load_algos(out, 1024)
    cfg = qwen3.Qwen3Config.from_name("tiny")
    assert {(n, k) for n, k, _ in algos} == qwen3.prefill_shapes(cfg)
    assert {(n, k) for n, k, _ in decode} == qwen3.prefill_shapes(cfg) | {(cfg.vocab, cfg.hidden)}
    with PinPicker(0) as picker:
        assert dict(source) == {"device": picker.device, "cublaslt_version": picker.cublaslt_version, "m_max": 1024}
