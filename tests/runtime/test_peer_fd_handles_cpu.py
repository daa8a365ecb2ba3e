"""Export handles as POSIX file descriptors (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), over the fake driver.

The fake refuses fabric blocks (as the H200s here do), so an export buffer's block is created with the POSIX fd
handle type and backed by a memfd (fake_cuda.py). Checked: the fallback order (fabric -> fd -> local) and its
warnings; `offer()` stays local, `offer(portable=True)` exports descriptors only for what a peer table maps; the
wire form carries descriptor indices and `Offer.from_bytes(data, fds)` restores them; `connect` imports a peer's
descriptor and writes the peer table; an import names the same memfd the exporter made (its bytes are shared).
Across processes: fd_rank_worker.py, the same through kern_run's rendezvous (SCM_RIGHTS).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from fake_cuda import FABRIC, POSIX_FD, VMM_BASE, FakeDriver, fake_cuda  # noqa: F401 - the fixture
from runtime_helpers import base_manifest

from kern_runtime import ApiError, Runtime
from kern_runtime.multigpu.peers import Offer

WORKER = Path(__file__).with_name("fd_rank_worker.py")


def peer_manifest(size: int = 2) -> dict:
    """Group tp of `size`: `ar` (u64[4096], export), its peer table `ar_peers`, and `spare` (export, no table)."""
    return base_manifest(
        topology={"tp": {"size": size}},
        buffers={
            "x": {"kind": "input", "dtype": "f32", "shape": ["tokens", 4]},
            "ar": {"kind": "workspace", "dtype": "u64", "shape": [4096], "export": True},
            "spare": {"kind": "workspace", "dtype": "u64", "shape": [16], "export": True},
            "ar_peers": {"kind": "workspace", "dtype": "u64", "shape": [size], "peers": {"of": "ar", "group": "tp"}},
        })


def load(rank: int, size: int = 2) -> Runtime:
    return Runtime.load(peer_manifest(size), Path(__file__).parent, None, ranks={"tp": rank})


def test_blocks_fall_back_from_fabric_to_posix_fd(fake_cuda: FakeDriver) -> None:
    with pytest.warns(RuntimeWarning, match="fabric handle failed.*using POSIX file descriptor handles"):
        rt = load(0)
    with rt:
        alloc = rt._buffers["ar"]
        (_, nbytes, block), = alloc.blocks
        assert (alloc.fabric, alloc.posix_fd, nbytes) == (False, True, 2 << 20)
        assert block.handle_type == POSIX_FD and block.memfd >= 0
        # one refused fabric attempt, then fd blocks for ar and spare (no second fabric attempt)
        kinds = [args[1].requestedHandleTypes for name, args in fake_cuda.calls if name == "cuMemCreate"]
        assert kinds == [FABRIC, POSIX_FD, POSIX_FD]
        local = rt.offer()
        assert {h.kind for h in local.handles.values()} == {"local"} and local.fds() == []
        with pytest.raises(ApiError, match="local handle.*offer\\(portable=True\\)"):
            local.to_bytes()


def test_portable_offer_exports_only_mapped_memory_as_descriptors(fake_cuda: FakeDriver) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rt = load(1)
    with rt:
        offer = rt.offer(portable=True)
        assert set(offer.handles) == {"ar"}  # `spare` has no peer table: no descriptor made for it
        (fd,) = offer.fds()
        (_, _, block), = rt._buffers["ar"].blocks
        assert os.fstat(fd).st_ino == os.fstat(block.memfd).st_ino and fd != block.memfd
        wire = offer.to_bytes()
        body = json.loads(wire.split(b"\n", 1)[1])
        assert body["handles"]["ar"]["kind"] == "fd" and body["handles"]["ar"]["blocks"] == [[0, 2 << 20, 0]]
        dup = os.dup(fd)
        back = Offer.from_bytes(wire, [dup])
        assert back.handles["ar"].blocks[0].handle == dup and back.ranks == {"tp": 1}
        with pytest.raises(ApiError, match="names file descriptor 0; 0 travelled with the offer"):
            Offer.from_bytes(wire)
        offer.close_fds()
        back.close_fds()
        back.close_fds()  # idempotent
        with pytest.raises(OSError):
            os.fstat(fd)


def test_connect_imports_the_peers_descriptor_and_fills_the_table(fake_cuda: FakeDriver) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rt0, rt1 = load(0), load(1)
    try:
        offers = [rt0.offer(portable=True), rt1.offer(portable=True)]
        wires = [(o.to_bytes(), [os.dup(fd) for fd in o.fds()]) for o in offers]  # what another process receives
        for o in offers:
            o.close_fds()
        pattern = b"rank0 wrote this"
        (_, _, block0), = rt0._buffers["ar"].blocks
        FakeDriver.block_memory(block0)[: len(pattern)] = pattern
        received = [Offer.from_bytes(data, fds) for data, fds in wires]
        imports_before = [b for b in fake_cuda.live_blocks.values() if getattr(b, "imported", False)]
        rt1.connect({"tp": received})
        for o in received:
            o.close_fds()  # the importer's: imported blocks hold their own reference
        imported = [b for b in fake_cuda.live_blocks.values() if getattr(b, "imported", False)]
        (new,) = [b for b in imported if b not in imports_before]
        assert os.fstat(new.memfd).st_ino == os.fstat(block0.memfd).st_ino
        assert bytes(FakeDriver.block_memory(new)[: len(pattern)]) == pattern
        table = rt1.read_buffer("ar_peers").view(np.uint64)
        assert int(table[1]) == rt1.address_of("ar") and int(table[0]) >= VMM_BASE
        assert int(table[0]) != rt0.address_of("ar")  # rank 0's block mapped at an address of rank 1's own
        assert rt1.peers_ready
    finally:
        rt0.close()
        rt1.close()
    assert not any(getattr(b, "imported", False) for b in fake_cuda.live_blocks.values())  # released at close


def test_no_posix_fd_env_leaves_local_handles(fake_cuda: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERN_NO_FABRIC", "1")
    monkeypatch.setenv("KERN_NO_POSIX_FD", "1")
    with load(0) as rt:
        assert not rt._buffers["ar"].posix_fd
        with pytest.raises(ApiError, match="without a shareable handle type"):
            rt.offer(portable=True)


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_in_processes_share_blocks_through_descriptors(tmp_path: Path, world: int) -> None:
    """fd_rank_worker.py: every rank process loads the peer manifest over its own fake driver, writes its rank into
    its export block, swaps portable offers through exchange_fds, connects, and reports what its imports read."""
    from kern_run.tp_rendezvous import spawn_ranks

    spawn_ranks(world, [sys.executable, str(WORKER), str(tmp_path), "20"], timeout_s=60)
    for r in range(world):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert sorted(got["imports"]) == sorted(f"written by rank {p}" for p in range(world) if p != r), r
        assert got["table_self"] == got["own_address"] and got["ready"] is True
        assert got["open_fds_after"] == got["open_fds_before"], "descriptors leaked"
