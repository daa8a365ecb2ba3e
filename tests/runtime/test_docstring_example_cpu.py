"""The example in kern_runtime's docstring runs as written (issue 24: it issued `decode` without `seqs`, which
the manifest refuses), and a missing CUDA driver library is a kern error, not cuda.pathfinder's exception.

The example runs from the repository root against the fake driver (fake_cuda.py): the committed tiny
checkpoint (models/qwen3-tiny-en), its manifest and the committed cubins, with cuBLASLt stubbed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from fake_cuda import FakeDriver, fake_cuda  # noqa: F401 - the fixture

import kern_runtime
from kern_runtime import ApiError, Capacity, CudaError, KernError, Runtime

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "manifests" / "qwen3-tiny-en.json"


def docstring_example() -> str:
    """The indented code block at the top of kern_runtime's docstring, dedented."""
    doc = kern_runtime.__doc__ or ""
    lines = doc.split("\n\n")[1].splitlines()
    assert all(line.startswith("    ") for line in lines), lines
    return "\n".join(line[4:] for line in lines)


class StubBlas:
    """cuBLASLt stand-in: the fake driver runs no GEMM."""

    def __init__(self, workspace: int) -> None:
        self.matmuls = 0

    def plan(self, *args: object) -> None:
        pass

    def matmul(self, *args: object) -> None:
        self.matmuls += 1

    def close(self) -> None:
        pass


def entry_layouts() -> dict[str, tuple[tuple[int, int], ...]]:
    """Kernel entry -> parameter layout, as the committed manifest declares them (what the fake's modules show)."""
    raw = json.loads(MANIFEST.read_text())
    out: dict[str, tuple[tuple[int, int], ...]] = {}
    for op in raw["ops"].values():
        for launch in op["launches"]:
            if "entry" in launch:
                out[launch["entry"]] = tuple((o, s) for o, s in launch["params"])
    return out


def test_the_docstring_example_runs_as_written(fake_cuda: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    import kern_runtime.runtime

    monkeypatch.setattr(kern_runtime.runtime, "Blas", StubBlas)
    fake_cuda.entries = entry_layouts()
    monkeypatch.chdir(ROOT)
    code = docstring_example()
    assert 'rt.issue("decode", {"tokens": 1, "seqs": 1})' in code
    scope: dict[str, object] = {}
    exec(compile(code, "kern_runtime.__doc__", "exec"), scope)  # noqa: S102 - the documented example itself
    packed, token = scope["packed"], scope["token"]
    assert isinstance(packed, np.ndarray) and packed.dtype == np.int64 and packed.shape == (1,)  # next_token: i64[seqs]
    assert token == int(packed[0]) & 0xFFFFFFFF
    assert fake_cuda.called("cuGraphLaunch") == 1  # decode is a graph program: one capture, one launch
    assert scope["rt"]._closed  # the `with` closed it


def test_decode_without_seqs_is_refused_naming_the_var(fake_cuda: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the old example did: the manifest's decode reads seqs, so leaving it out is an ApiError."""
    import kern_runtime.runtime

    monkeypatch.setattr(kern_runtime.runtime, "Blas", StubBlas)
    fake_cuda.entries = entry_layouts()
    tensors = kern_runtime.SafetensorsTensors.open(str(ROOT / "models" / "qwen3-tiny-en"))
    with Runtime.load(MANIFEST, ROOT / "kernels", tensors, capacity=Capacity(tokens=4096, seqs=1)) as rt:
        with pytest.raises(ApiError, match=re.escape("program 'decode' reads var 'seqs': pass it (range [1, 64])")):
            rt.issue("decode", {"tokens": 1})


def test_a_missing_driver_library_is_a_cuda_error_with_kern_runs_line(fake_cuda: FakeDriver,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    """cuda-bindings loads libcuda on the first call and raises cuda.pathfinder's DynamicLibNotFoundError when it
    cannot: Runtime.load turns it into CudaError (a KernError) with the one line `kern run` prints."""
    pathfinder = pytest.importorskip("cuda.pathfinder")
    from kern_run.preflight import NoDeviceError, probe_device

    def no_library(flags: int) -> tuple:
        raise pathfinder.DynamicLibNotFoundError('"cuda" is an NVIDIA driver library and can only be found via '
                                                 "system search.")

    fake_cuda.cuInit = no_library
    manifest = {"format": "kern-manifest/1", "name": "t", "vars": {}, "modules": {}, "buffers": {}, "ops": {},
                "programs": {}}
    with pytest.raises(CudaError) as info:
        Runtime.load(manifest, tmp_path, None)
    assert isinstance(info.value, KernError)
    line = ("no CUDA device: the CUDA driver library cannot be loaded (DynamicLibNotFoundError); kern needs an "
            "NVIDIA GPU and driver")
    assert str(info.value) == line
    with pytest.raises(NoDeviceError) as run_info:
        probe_device(0)
    assert str(run_info.value) == line  # the same line `kern run` prints


@pytest.mark.gpu
def test_the_docstring_example_runs_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same block on a real device: the token is an id of the tiny model's vocabulary."""
    monkeypatch.chdir(ROOT)
    scope: dict[str, object] = {}
    exec(compile(docstring_example(), "kern_runtime.__doc__", "exec"), scope)  # noqa: S102
    vocab = json.loads(MANIFEST.read_text())["buffers"]["embed"]["shape"][0]  # 8192 rows of the embedding
    token = scope["token"]
    assert isinstance(token, int) and token == int(scope["packed"][0]) & 0xFFFFFFFF
    assert 0 <= token < vocab
