"""The committed capture of tiny-en (tests/data/harvest/tiny-en, written by the GPU test
tests/harvest/test_harvest_gpu.py::test_tiny_en_capture_mines_and_generates): read, mined and generated on the CPU,
every weight bound to a tensor of models/qwen3-tiny-en with its dtype and shape, and the manifest loaded by
Runtime.load over the fake driver with the real checkpoint. Until a GPU session has produced it, it is absent and
this module skips (the synthetic capture of the other tests covers the same logic)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kern_run.harvest.capture_format import read_capture
from kern_run.harvest.generate import generate
from kern_run.harvest.mine import mine
from tests.runtime.fake_cuda import FakeDriver, fake_cuda  # noqa: F401 - the fixture

ROOT = Path(__file__).resolve().parents[2]
CAPTURE = ROOT / "tests" / "data" / "harvest" / "tiny-en"
CHECKPOINT = ROOT / "models" / "qwen3-tiny-en"

pytestmark = pytest.mark.skipif(not (CAPTURE / "meta.json").is_file(),
                                reason="tests/data/harvest/tiny-en not captured yet (tests/harvest/test_harvest_gpu.py)")


def test_mines_with_every_weight_a_checkpoint_tensor() -> None:
    from kern_runtime import SafetensorsTensors

    mined = mine(read_capture(CAPTURE))
    assert mined.tokens == (1, 2)
    checkpoint = SafetensorsTensors.open(CHECKPOINT)
    weights = [t for t in mined.tensors.values() if t.kind == "weight"]
    assert weights
    for t in weights:
        meta = checkpoint.meta(t.name)
        assert meta is not None, t.name
        assert (meta.dtype, tuple(meta.shape)) == (t.dtype, tuple(d.expr for d in t.shape)), t.name


def test_generates_and_loads_with_the_real_checkpoint(fake_cuda: FakeDriver, tmp_path: Path) -> None:
    from kern_runtime import Runtime, SafetensorsTensors

    manifest, mined = generate(CAPTURE, tmp_path / "out")
    fake_cuda.entries = {ml.function: ml.params for ml in mined.launches}
    with Runtime.load(tmp_path / "out" / "manifest.json", tmp_path / "out" / "kernels",
                      SafetensorsTensors.open(CHECKPOINT)) as rt:
        rt.issue("decode", {"tokens": 1})
        assert fake_cuda.called("cuGraphLaunch") == 1
        assert len(rt.records("decode")) == len(manifest["programs"]["decode"]["calls"])
