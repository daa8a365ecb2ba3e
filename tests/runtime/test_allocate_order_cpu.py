"""Runtime._allocate sizes the pool from the memory left after everything else (spec, state memory K1b).

With `Capacity(tokens=None)` the pool takes what cuMemGetInfo reports free after the buffers, op scratch,
fixed states, the cuBLASLt workspace and the input staging are allocated, less HEADROOM (1 GiB). So
cuMemGetInfo comes after every other allocation of `_allocate`, and the pool's blocks (cuMemCreate) after it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fake_cuda import FakeDriver, fake_cuda  # noqa: F401 - the fixture
from kern_pool.sizing import HEADROOM_BYTES
from kern_runtime import Capacity, Runtime
from kern_runtime.cuda.blas import WORKSPACE_BYTES
from runtime_helpers import base_manifest

MiB = 1 << 20


class StubBlas:
    """Stands in for the cuBLASLt handle (no cuBLASLt on a CPU host); the workspace is the runtime's."""

    def __init__(self, workspace_address: int) -> None:
        self.workspace = workspace_address

    def close(self) -> None:
        pass


def gemm_pool_manifest() -> dict:
    """A paged state of 4 MiB pages (2 MiB blocks), a fixed state, op scratch and one cuBLASLt GEMM."""
    gemm = {"args": [{"name": "a", "kind": "ptr"}, {"name": "w", "kind": "ptr"}, {"name": "c", "kind": "ptr"}],
            "scratch": {"tmp": "tokens * 64"},
            "launches": [{"extern": "cublaslt_bf16_tn", "args": [
                {"arg": "a"}, {"arg": "w"}, {"arg": "c"}, {"expr": "tokens", "type": "i32"},
                {"i32": 32}, {"i32": 16}]}]}
    return base_manifest(
        buffers={"a": {"kind": "input", "dtype": "bf16", "shape": ["tokens", 16]},
                 "w": {"kind": "input", "dtype": "bf16", "shape": [32, 16]},
                 "c": {"kind": "output", "dtype": "bf16", "shape": ["tokens", 32]}},
        states={"kv": {"kind": "paged", "bytes_per_token": 256 * 1024, "page_tokens": 16},
                "fx": {"kind": "fixed", "bytes": 4096}},
        ops={"g": gemm},
        programs={"step": {"calls": [{"op": "g", "args": {"a": "a", "w": "w", "c": "c"}}]}})


@pytest.fixture
def stub_blas(monkeypatch: pytest.MonkeyPatch) -> None:
    import kern_runtime.runtime

    monkeypatch.setattr(kern_runtime.runtime, "Blas", StubBlas)


def names(fake: FakeDriver) -> list[str]:
    return [name for name, _ in fake.calls]


def test_free_memory_is_read_after_every_other_allocation(fake_cuda: FakeDriver, stub_blas: None,
                                                          tmp_path: Path) -> None:
    with Runtime.load(gemm_pool_manifest(), tmp_path, None, capacity=Capacity(tokens=None, seqs=1)) as rt:
        assert rt.pool is not None
    calls = names(fake_cuda)
    assert calls.count("cuMemGetInfo") == 1
    info = calls.index("cuMemGetInfo")
    workspace = [i for i, (name, args) in enumerate(fake_cuda.calls)
                 if name == "cuMemAlloc" and args == (WORKSPACE_BYTES,)]
    assert len(workspace) == 1 and workspace[0] < info  # the 32 MiB workspace is not taken from the headroom
    # every device and pinned allocation of the load precedes the reading; the pool's blocks follow it
    allocs = [i for i, name in enumerate(calls) if name in ("cuMemAlloc", "cuMemHostAlloc")]
    assert allocs and max(allocs) < info
    creates = [i for i, name in enumerate(calls) if name == "cuMemCreate"]
    assert creates and min(creates) > info


def test_pool_fits_in_what_is_left_after_the_workspace(fake_cuda: FakeDriver, stub_blas: None,
                                                       monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A fake device whose free memory shrinks with each cuMemAlloc: the pool never takes the headroom."""
    start = HEADROOM_BYTES + 100 * MiB + WORKSPACE_BYTES + 64 * MiB  # 64 MiB more than the buffers need
    allocated: list[int] = []

    def mem_alloc(self: FakeDriver, nbytes: int) -> tuple:
        allocated.append(int(nbytes))
        return (0, self._alloc(nbytes))

    def mem_get_info(self: FakeDriver) -> tuple:
        return (0, start - sum(allocated), 2 * start)

    monkeypatch.setattr(FakeDriver, "_cuMemAlloc", mem_alloc)
    monkeypatch.setattr(FakeDriver, "_cuMemGetInfo", mem_get_info)
    with Runtime.load(gemm_pool_manifest(), tmp_path, None, capacity=Capacity(tokens=None, seqs=1)) as rt:
        assert rt.pool is not None
        assert WORKSPACE_BYTES in allocated
        free_after_all = start - sum(allocated)
        pool_bytes = rt.pool.layout.num_blocks * rt.pool.block_bytes
        assert rt.pool.block_bytes == 2 * MiB
        assert pool_bytes <= free_after_all - HEADROOM_BYTES
        # and it takes all of it, 4 MiB page by page: less than one page is left over
        assert free_after_all - HEADROOM_BYTES - pool_bytes < 4 * MiB
        assert rt.num_pages == pool_bytes // (4 * MiB)


def test_qwen3_4b_shape_at_40_gib_free_loads(fake_cuda: FakeDriver, tmp_path: Path) -> None:
    """The audit's case end to end: 36 KV states (64 KiB pages, 64 MiB blocks) and 40 GiB free used to be refused
    ("the pool needs 43486543872 bytes"); now the pool is 612 blocks = 38.25 GiB, within 40 GiB less 1 GiB."""
    states: dict[str, Any] = {f"kv.{i}": {"kind": "paged", "bytes_per_token": 4096, "page_tokens": 16}
                              for i in range(36)}
    fake_cuda.free_bytes = 40 << 30
    with Runtime.load(base_manifest(states=states), tmp_path, None, capacity=Capacity(tokens=None, seqs=1)) as rt:
        assert rt.pool is not None
        assert rt.pool.layout.num_blocks == 612
        assert rt.pool.layout.num_blocks * rt.pool.block_bytes <= (40 << 30) - HEADROOM_BYTES
        assert rt.num_pages == 17 * 1024
