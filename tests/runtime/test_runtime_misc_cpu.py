"""Errors, pooled-state sizing, tensor-map argument evaluation, import hygiene."""

from __future__ import annotations

import subprocess
import sys

import kern_manifest
import pytest
from runtime_helpers import base_manifest

from kern_runtime import (
    KERN_ERRORS, ApiError, BlasError, CallError, Capacity, DriverError, KernError, ManifestParseError,
    ManifestVerifyError, plan_pool,
)
from kern_runtime.errors import CudaError
from kern_runtime.runtime import load_spec
from runtime_helpers import state_of
from kern_runtime.cuda.tensormaps import tiled_args

MiB = 1 << 20


def test_import_does_not_load_cuda() -> None:
    code = "import sys, kern_runtime; print(any(m.startswith(('cuda', 'nvmath', 'cupy')) for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_error_hierarchy() -> None:
    assert issubclass(ManifestParseError, KernError) and issubclass(ManifestParseError, kern_manifest.ManifestParseError)
    assert issubclass(ManifestVerifyError, kern_manifest.ManifestVerifyError)
    assert issubclass(DriverError, CudaError) and issubclass(BlasError, CudaError)
    assert kern_manifest.ManifestError in KERN_ERRORS and KernError in KERN_ERRORS
    err = DriverError("cuMemAlloc", "CUDA_ERROR_OUT_OF_MEMORY", 2, "out of memory")
    assert str(err) == "cuMemAlloc failed with CUDA_ERROR_OUT_OF_MEMORY (2): out of memory"
    call = CallError("decode", 7, "rmsnorm", err)
    assert call.program == "decode" and call.call_index == 7 and call.op == "rmsnorm" and call.cause is err
    assert str(call) == "program 'decode' call #7 (op 'rmsnorm'): DriverError: " + str(err)


def test_manifest_errors_are_runtime_errors_too() -> None:
    with pytest.raises(ManifestParseError) as info:
        load_spec("{not json")
    assert isinstance(info.value, kern_manifest.ManifestParseError) and isinstance(info.value, KernError)
    bad = base_manifest(buffers={"x": {"kind": "input", "dtype": "f33", "shape": [1]}})
    with pytest.raises(KernError):
        load_spec(bad)


def test_plan_pool_pages_slots_and_blocks() -> None:
    states = {
        "kv.0": state_of("kv.0", "paged", bytes_per_token=4096, page_tokens=16),
        "kv.1": state_of("kv.1", "paged", bytes_per_token=4096, page_tokens=16),
        "conv": state_of("conv", "per_seq", bytes_per_seq=65536),
    }
    pool = plan_pool(states, Capacity(tokens=4100, seqs=3), 2 * MiB)
    # kern_pool: 4100 tokens -> 256 whole pages + the scratch page, then every page the whole-block arena holds
    assert pool.page_tokens == 16 and pool.scratch_page_id == 0
    assert pool.num_pages == 64 * MiB // (16 * 4096) == 1024
    assert pool.num_slots >= 3 + 2
    assert pool.block_bytes == 64 * MiB  # smallest object (64 KiB) is under two granularities -> the cap
    assert pool.mapped_bytes["kv.0"] == 64 * MiB  # 257 pages x 64 KiB = 16.06 MiB -> one block
    assert pool.mapped_bytes["conv"] == 64 * MiB
    assert pool.reserve_bytes >= sum(pool.mapped_bytes.values())


def test_plan_pool_fills_free_memory_and_refuses_nothing() -> None:
    states = {"kv": state_of("kv", "paged", bytes_per_token=256 * 1024, page_tokens=16)}  # 4 MiB pages
    pool = plan_pool(states, Capacity(tokens=None, seqs=1), 2 * MiB, free_bytes=(1 << 30) + 400 * MiB)
    assert pool.block_bytes == 2 * MiB
    assert pool.num_pages * 4 * MiB <= 400 * MiB + 4 * MiB
    with pytest.raises(ApiError):
        plan_pool(states, Capacity(tokens=None, seqs=1), 2 * MiB, free_bytes=1 << 30)
    assert plan_pool({}, Capacity(tokens=16, seqs=1), 2 * MiB) is None


def test_tiled_args() -> None:
    tm = {"arg": "x", "dtype": "bf16", "dims": [128, "tokens"], "strides": [256], "box": [64, 16], "swizzle": "128B"}
    a = tiled_args(tm, {"tokens": 40})
    assert a.dims == (128, 40) and a.strides == (256,) and a.elem_strides == (1, 1) and a.enums == {"swizzle": "128B"}
    with pytest.raises(KernError, match="multiples of 16"):
        tiled_args(dict(tm, strides=[250]), {"tokens": 1})


def test_ledger_frees_last_first_and_keeps_going_after_a_failure() -> None:
    from kern_runtime.cuda.memory import Allocation, Ledger

    freed: list[str] = []

    def alloc(label: str, fail: bool = False) -> Allocation:
        def undo() -> None:
            freed.append(label)
            if fail:
                raise RuntimeError(f"{label} failed to free")
        return Allocation(label, 0, 0, undo=[undo])

    ledger = Ledger()
    a, b = ledger.adopt(alloc("a")), ledger.adopt(alloc("b", fail=True))
    ledger.on_close("stream", lambda: freed.append("stream"))
    kept = ledger.adopt(alloc("kept"))
    ledger.detach(kept)
    with pytest.raises(RuntimeError, match="b failed to free"):
        ledger.close()
    assert freed == ["stream", "b", "a"]
    kept.free()
    kept.free()  # idempotent
    assert freed == ["stream", "b", "a", "kept"]
    del a, b
