"""The runtime's pool on a GPU: leases, checkpoints, forks, remaps and the host tier, byte for byte.

Manifest (written here): two paged states `pa`, `pb` (256 KiB per token, 16-token pages = 4 MiB) and
one per-seq state `ss` (4 MiB per slot), so blocks are 2 MiB and an object spans two blocks;
kernels from tests/runtime/kernels/pool.cu: `write` stores a per-position byte pattern, `check`
counts mismatching bytes through the block table. Capacity(tokens=128, seqs=2): pages 0..8 (0 is
scratch), slots 0..3 (0 is scratch).

Run on the H200:  KERN_REQUIRE_GPU=1 python3 -m pytest tests/runtime/test_pool_gpu.py -q
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from runtime_helpers import KERNELS_DIR

from kern_pool import Busy, ExceedsPool, Misuse, Parked, Remapping
from kern_runtime import Capacity, DeviceLease, Runtime
from kern_runtime.cuda.driver import call

pytestmark = pytest.mark.gpu

BPT = 256 * 1024  # bytes per token of pa / pb
BPS = 4 * 1024 * 1024  # bytes per slot of ss
PT = 16  # page tokens
WIDTH = 8  # block-table width (pages per sequence)
PAGE = PT * BPT


def _manifest(pin: str) -> dict:
    ptr = lambda n: {"name": n, "kind": "ptr"}  # noqa: E731
    write = {
        "args": [ptr(n) for n in ("a", "b", "s", "slots", "pos", "rows", "lens", "seq_slots", "salt")]
        + [{"name": "n", "kind": "int"}],
        "launches": [{"module": "pool", "entry": "kern_pool_write", "grid": ["tokens", 1, 1], "block": [256, 1, 1],
                      "params": [[8 * i, 8] for i in range(9)] + [[72, 4], [76, 4], [80, 4]],
                      "args": [{"arg": n} for n in ("a", "b", "s", "slots", "pos", "rows", "lens", "seq_slots", "salt")]
                      + [{"arg": "n", "type": "i32"}, {"i32": BPT}, {"i32": BPS}]}],
    }
    check = {
        "args": [ptr(n) for n in ("a", "b", "s", "table", "lens", "seq_slots", "salt", "out")],
        "launches": [
            {"module": "pool", "entry": "kern_pool_zero_i32", "grid": [1, 1, 1], "block": [64, 1, 1],
             "params": [[0, 8], [8, 4]], "args": [{"arg": "out"}, {"expr": "seqs", "type": "i32"}]},
            {"module": "pool", "entry": "kern_pool_check", "grid": ["seqs", 32, 1], "block": [256, 1, 1],
             "params": [[8 * i, 8] for i in range(8)] + [[64, 4], [68, 4], [72, 4], [76, 4]],
             "args": [{"arg": n} for n in ("a", "b", "s", "table", "lens", "seq_slots", "salt", "out")]
             + [{"i32": WIDTH}, {"i32": PT}, {"i32": BPT}, {"i32": BPS}]},
        ],
    }
    i32 = lambda *shape: {"kind": "input", "dtype": "i32", "shape": list(shape)}  # noqa: E731
    return {
        "format": "kern-manifest/1", "name": "pool-test",
        "vars": {"tokens": {"min": 1, "max": 64}, "seqs": {"min": 1, "max": 4}},
        "modules": {"pool": pin},
        "buffers": {
            "slot_mapping": i32("tokens"), "positions": i32("tokens"), "token_rows": i32("tokens"),
            "seq_lens": i32("seqs"), "seq_slots": i32("seqs"), "salt": i32(1), "block_table": i32("seqs", WIDTH),
            "mismatches": {"kind": "output", "dtype": "i32", "shape": ["seqs"]},
        },
        "states": {
            "pa": {"kind": "paged", "bytes_per_token": BPT, "page_tokens": PT},
            "pb": {"kind": "paged", "bytes_per_token": BPT, "page_tokens": PT},
            "ss": {"kind": "per_seq", "bytes_per_seq": BPS},
        },
        "ops": {"write": write, "check": check},
        "programs": {
            "write": {"graph": True, "calls": [{"op": "write", "args": {
                "a": "pa", "b": "pb", "s": "ss", "slots": "slot_mapping", "pos": "positions", "rows": "token_rows",
                "lens": "seq_lens", "seq_slots": "seq_slots", "salt": "salt", "n": "tokens"}}]},
            "check": {"calls": [{"op": "check", "args": {
                "a": "pa", "b": "pb", "s": "ss", "table": "block_table", "lens": "seq_lens", "seq_slots": "seq_slots",
                "salt": "salt", "out": "mismatches"}}]},
        },
    }


@pytest.fixture(scope="module")
def kdir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("poolk")
    data = (KERNELS_DIR / "pool.cubin").read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    shutil.copyfile(KERNELS_DIR / "pool.cubin", out / f"pool-{digest[:12]}.cubin")
    return out, digest


@pytest.fixture
def rt(kdir: tuple[Path, str]) -> Iterator[Runtime]:
    path, pin = kdir
    with Runtime.load(_manifest(pin), path, None, capacity=Capacity(tokens=128, seqs=2)) as r:
        yield r


# ---------------------------------------------------------------- helpers


def pattern(tag: int, pos: int, nbytes: int, salt: int) -> np.ndarray:
    j = np.arange(nbytes, dtype=np.int64)
    return ((pos * 131 + j * 7 + (j >> 8) * 13 + tag * 29 + salt * 17) & 0xFF).astype(np.uint8)


_PAGE_CACHE: dict[tuple[int, int, int], np.ndarray] = {}


def page_pattern(tag: int, first_pos: int, salt: int) -> np.ndarray:
    """u8[PAGE]: a full page of state `tag` whose token 0 is position `first_pos`."""
    key = (tag, first_pos, salt)
    if key not in _PAGE_CACHE:
        _PAGE_CACHE[key] = np.concatenate([pattern(tag, first_pos + t, BPT, salt) for t in range(PT)])
    return _PAGE_CACHE[key]


def read_device(address: int, nbytes: int) -> np.ndarray:
    out = np.empty(nbytes, np.uint8)
    call("cuMemcpyDtoH", out.ctypes.data, address, nbytes)
    return out


def page_bytes(rt: Runtime, state: str, page_id: int) -> np.ndarray:
    rt.synchronize()
    return read_device(rt.state_object_address(state, page_id), PAGE)


def slot_bytes(rt: Runtime, slot_id: int) -> np.ndarray:
    rt.synchronize()
    return read_device(rt.state_object_address("ss", slot_id), BPS)


def token_bytes(rt: Runtime, state: str, lease: DeviceLease, pos: int) -> np.ndarray:
    page = lease.page_ids()[pos // PT]
    return page_bytes(rt, state, page)[(pos % PT) * BPT:(pos % PT + 1) * BPT]


def write(rt: Runtime, rows: list[tuple[DeviceLease | None, int, int]], salt: int, *, tokens: int | None = None) -> None:
    """Write positions [start, stop) of each row's lease with `salt`; None rows and tokens past the live
    ones are padding (scratch page slot 0, scratch per-seq slot). `tokens` fixes the launch size."""
    slots, pos, trows = [], [], []
    lens = np.ones(4, np.int32)
    seq_slots = np.zeros(4, np.int32)
    for r, (lease, start, stop) in enumerate(rows):
        if lease is None:
            continue
        slots.append(lease.slots(start, stop))
        pos.append(np.arange(start, stop, dtype=np.int32))
        trows.append(np.full(stop - start, r, np.int32))
        lens[r] = stop
        seq_slots[r] = lease.seq_slot_id
    n_live = sum(len(p) for p in pos)
    n = tokens or n_live
    pad = n - n_live
    assert pad >= 0
    pad_row = next((r for r, (lease, _, _) in enumerate(rows) if lease is None), len(rows))
    rt.write_input("slot_mapping", np.concatenate(slots + [np.zeros(pad, np.int32)]))
    rt.write_input("positions", np.concatenate(pos + [np.zeros(pad, np.int32)]))
    rt.write_input("token_rows", np.concatenate(trows + [np.full(pad, min(pad_row, 3), np.int32)]))
    rt.write_input("seq_lens", lens)
    rt.write_input("seq_slots", seq_slots)
    rt.write_input("salt", np.asarray([salt], np.int32))
    rt.issue("write", {"tokens": n})


def mismatches(rt: Runtime, rows: list[tuple[DeviceLease, int]], salt: int) -> list[int]:
    """Bytes of each (lease, length) row that differ from the pattern, counted on the GPU."""
    rt.write_input("block_table", rt.block_table([lease for lease, _ in rows], WIDTH))
    rt.write_input("seq_lens", np.asarray([n for _, n in rows], np.int32))
    rt.write_input("seq_slots", np.asarray([lease.seq_slot_id for lease, _ in rows], np.int32))
    rt.write_input("salt", np.asarray([salt], np.int32))
    rt.run("check", {"seqs": len(rows)})
    return rt.read_output("mismatches", rows=len(rows)).tolist()


def assert_tokens(rt: Runtime, lease: DeviceLease, start: int, stop: int, salt: int) -> None:
    for p in range(start, stop):
        for tag, state in ((0, "pa"), (1, "pb")):
            got = token_bytes(rt, state, lease, p)
            assert np.array_equal(got, pattern(tag, p, BPT, salt)), f"{state} position {p} differs"


def host_page(rt: Runtime, tag: int, host_page_id: int) -> np.ndarray:
    """Host page of paged state `tag` (state-major host layout: region per state)."""
    pages = rt.host_tier.num_pages
    off = tag * pages * PAGE + host_page_id * PAGE
    return rt.host_memory.view()[off:off + PAGE]


# ---------------------------------------------------------------- tests


def test_checkpoint_fork_lease_from_retire_byte_for_byte(rt: Runtime) -> None:
    parent = rt.lease(48)
    write(rt, [(parent, 0, 40)], salt=1)
    assert mismatches(rt, [(parent, 40)], 1) == [0]
    cp_mid = rt.checkpoint(parent, 40)  # mid-page: page 2 shared, the slot copied
    assert np.array_equal(slot_bytes(rt, cp_mid.seq_slot_id), pattern(2, 39, BPS, 1))
    child = rt.lease_from(cp_mid, 64)  # page 2 copied for the child
    assert child.page_ids()[:2] == parent.page_ids()[:2] and child.page_ids()[2] != parent.page_ids()[2]
    assert_tokens(rt, child, 32, 40, salt=1)
    assert np.array_equal(slot_bytes(rt, child.seq_slot_id), pattern(2, 39, BPS, 1))
    before = page_bytes(rt, "pa", parent.page_ids()[2])
    write(rt, [(child, 40, 64)], salt=1)
    assert mismatches(rt, [(child, 64)], 1) == [0]
    assert np.array_equal(page_bytes(rt, "pa", parent.page_ids()[2]), before)  # the checkpoint's page never changes
    child.close()
    # At the parent's current position (its slot holds position 39's state: a fork below 40 is Misuse):
    # pages 0, 1 shared, page 2 (mid-page) copied for the child, the slot copied.
    with pytest.raises(Misuse, match="reached 40"):
        rt.fork(parent, 32, 48)
    fork = rt.fork(parent, 40, 48)
    assert fork.page_ids()[:2] == parent.page_ids()[:2] and fork.page_ids()[2] != parent.page_ids()[2]
    assert_tokens(rt, fork, 32, 40, salt=1)
    assert np.array_equal(slot_bytes(rt, fork.seq_slot_id), pattern(2, 39, BPS, 1))
    write(rt, [(fork, 40, 48)], salt=1)
    assert mismatches(rt, [(fork, 48), (parent, 40)], 1) == [0, 0]
    cp = rt.retire(parent, 40)
    assert cp is not None and parent.closed and rt.retire(parent, 40) is None
    again = rt.lease_from(cp, 56)
    write(rt, [(again, 40, 56)], salt=1)
    assert mismatches(rt, [(again, 56)], 1) == [0]
    for h in (again, fork, cp, cp_mid):
        h.close()
    rt.settle()
    rt.kern_pool.check()


def test_park_zero_wake_and_repark_only_new_pages(rt: Runtime) -> None:
    rt.reserve_host(pages=8, slots=2)
    lease = rt.lease(40)
    write(rt, [(lease, 0, 40)], salt=3)
    cp = rt.retire(lease, 40)
    pages = cp.page_ids()
    parked = rt.park(rt.room(cp))
    rt.settle()
    assert rt.landed(parked) and cp.closed  # the device pages went back
    for state in ("pa", "pb"):  # zero the device copies
        for p in pages:
            call("cuMemsetD8", rt.state_object_address(state, p), 0, PAGE)
    call("cuCtxSynchronize")  # the legacy-stream memsets are done before the wake is issued
    waking = rt.wake(parked, 40, 64)
    woken = None
    while woken is None:
        woken = rt.awake(waking)
    assert woken.prefix_tokens == 40
    assert mismatches(rt, [(woken, 40)], 3) == [0]
    assert_tokens(rt, woken, 32, 40, salt=3)
    write(rt, [(woken, 40, 56)], salt=3)
    cp2 = rt.checkpoint(woken, 56)
    room = rt.room(cp2)
    assert room.num_host_pages == 2  # page 2 (40..47 newly sealed) + the tail page 3; pages 0, 1 are on the host
    parked2 = rt.park(room)
    rt.settle()
    assert len(parked2.host_page_ids()) == 4 and parked2.host_page_ids()[:2] == parked.host_page_ids()[:2]
    for page_index, host_id in enumerate(parked2.host_page_ids()):
        for tag in (0, 1):
            got = host_page(rt, tag, host_id)
            want = page_pattern(tag, page_index * PT, 3)
            stop = min(PT, 56 - page_index * PT)
            assert np.array_equal(got[:stop * BPT], want[:stop * BPT]), f"host page {host_id} state {tag}"
    parked.close()
    parked2.close()
    woken.close()
    rt.settle()
    rt.kern_pool.check()
    rt.host_tier.check()


def test_remap_between_page_and_slot_arenas_under_a_captured_program(rt: Runtime) -> None:
    # Every leasable page holds pattern bytes first, so the blocks a remap moves into the slot arena are
    # dirty: reading zeros from the new slot proves the runtime zeroed them (fresh cuMemCreate memory could
    # read as zero by itself). The write program is captured here, before any remap (tokens = 16).
    whole = rt.lease(128)  # pages 1..8, one slot
    for start in range(0, 128, 16):
        write(rt, [(whole, start, start + 16)], salt=9, tokens=16)
    assert rt.graph_keys == [("write", (("tokens", 16),))]
    assert mismatches(rt, [(whole, 128)], 9) == [0]
    dirty_pages = sorted(whole.page_ids())
    whole.close()
    assert all(page_bytes(rt, state, pg).any() for state in ("pa", "pb") for pg in dirty_pages)
    first = rt.lease(16)
    write(rt, [(first, 0, 16)], salt=5, tokens=16)
    others = [rt.lease(16), rt.lease(16)]  # slots 1..3 all held now
    with pytest.raises(Remapping):
        rt.lease(16, wait=False)  # needs a slot: the highest free page gives its blocks
    rt.settle()
    moved = rt.lease(16)
    assert moved.seq_slot_id == 4  # beyond the slots mapped at load, inside the reserved range
    assert not slot_bytes(rt, 4).any()  # its blocks held page patterns: zeroed before it could be leased
    write(rt, [(moved, 0, 16)], salt=5, tokens=16)  # the graph captured before the remap
    assert rt.graph_keys == [("write", (("tokens", 16),))]
    assert mismatches(rt, [(moved, 16), (first, 16)], 5) == [0, 0]
    for h in (first, moved, *others):
        h.close()
    rt.kern_pool.check()


def test_refusals(rt: Runtime) -> None:
    with pytest.raises(ExceedsPool):
        rt.lease(100_000)
    held = rt.lease(128)  # every leasable page
    with pytest.raises(Busy):
        rt.lease(16)  # the one spare slot cannot give a whole page of both states
    held.close()
    slots = [rt.lease(0) for _ in range(3)]
    with pytest.raises(Remapping):
        rt.lease(0, wait=False)  # the plan is started; the next request or settle() collects it
    rt.settle()
    slots.append(rt.lease_slot())
    for s in slots:
        s.close()
    rt.kern_pool.check()


def test_park_right_after_the_writing_step_1000_times(rt: Runtime) -> None:
    rt.reserve_host(pages=2, slots=1)
    for i in range(1000):
        salt = i % 7
        lease = rt.lease(16)
        write(rt, [(lease, 0, 16)], salt=salt, tokens=16)
        parked = rt.park(rt.room(rt.retire(lease, 16)))
        rt.settle()
        host_id = parked.host_page_ids()[0]
        for tag in (0, 1):
            assert np.array_equal(host_page(rt, tag, host_id), page_pattern(tag, 0, salt)), f"iteration {i}"
        parked.close()


def _parked_page(rt: Runtime) -> Parked:
    """Host room for 2 pages and 1 slot, and one parked (settled) page of 16 tokens written with salt 6."""
    rt.reserve_host(pages=2, slots=1)
    src = rt.lease(16)
    write(rt, [(src, 0, 16)], salt=6, tokens=16)
    parked = rt.park(rt.room(rt.retire(src, 16)))
    rt.settle()
    return parked


def test_page_released_and_reused_by_a_wake_is_never_corrupted(rt: Runtime) -> None:
    parked = _parked_page(rt)
    for i in range(50):
        victim = rt.lease(16)
        for _ in range(8):  # the releasing lease's last steps are still queued when it closes
            write(rt, [(victim, 0, 16)], salt=i % 5, tokens=16)
        page = victim.page_ids()[0]
        victim.close()
        waking = rt.wake(parked, 16, 16)
        woken = None
        while woken is None:
            woken = rt.awake(waking)
        assert woken.page_ids()[0] == page  # LIFO: the wake reuses the released page
        assert mismatches(rt, [(woken, 16)], 6) == [0], f"iteration {i}"
        woken.close()
    parked.close()


def test_in_flight_copies_closed_or_dropped_never_corrupt_reused_units(rt: Runtime) -> None:
    """A wake dropped before its copies land, and a park closed before its copy lands, release their pages and
    host units only after the copies are done (kern_pool's settle hook): the page a dropped wake was filling is
    leased and written at once, the host page a closed park was writing is parked into at once on the compute
    stream, and neither ever sees the late copy."""
    parked = _parked_page(rt)
    for i in range(50):
        waking = rt.wake(parked, 16, 16)
        page = waking.inner.plan.page_copies[0].dst_page_id  # host page -> this device page
        del waking  # in flight: waits for its copies, then its page returns
        victim = rt.lease(16)
        assert victim.page_ids()[0] == page  # LIFO: the dropped wake's page
        write(rt, [(victim, 0, 16)], salt=i % 5, tokens=16)
        assert mismatches(rt, [(victim, 16)], i % 5) == [0], f"wake dropped, iteration {i}"
        victim.close()
    parked.close()
    for i in range(50):
        lease = rt.lease(16)
        write(rt, [(lease, 0, 16)], salt=i % 5, tokens=16)
        early = rt.park(rt.room(rt.retire(lease, 16)))
        host_id = early.host_page_ids()[0]
        early.close()  # in flight: waits for the copy, then its host page returns
        other = rt.lease(16)
        write(rt, [(other, 0, 16)], salt=5 + i % 2, tokens=16)
        now = rt.park_now(rt.retire(other, 16))  # copies on the compute stream into the same host page
        assert now.host_page_ids()[0] == host_id
        rt.settle()
        call("cuCtxSynchronize")
        for tag in (0, 1):
            assert np.array_equal(host_page(rt, tag, host_id), page_pattern(tag, 0, 5 + i % 2)), f"park closed, {i}"
        now.close()
    rt.settle()
    rt.kern_pool.check()
    rt.host_tier.check()


def test_padded_rows_touch_only_the_scratch_page_and_slot(rt: Runtime) -> None:
    a, b = rt.lease(16), rt.lease(16)
    rt.synchronize()
    snapshot = {s: read_device(rt.state_object_address(s, 0), 9 * PAGE if s != "ss" else 4 * BPS) for s in ("pa", "pb", "ss")}
    write(rt, [(a, 0, 8), (b, 0, 8), (None, 0, 0), (None, 0, 0)], salt=2, tokens=32)  # 16 live tokens, 16 padded
    rt.synchronize()
    live_pages = {a.page_ids()[0], b.page_ids()[0]}
    live_slots = {a.seq_slot_id, b.seq_slot_id}
    for s, before in snapshot.items():
        after = read_device(rt.state_object_address(s, 0), before.size)
        size = BPS if s == "ss" else PAGE
        for oid in range(before.size // size):
            chunk = slice(oid * size, (oid + 1) * size)
            if oid == 0 or oid in (live_slots if s == "ss" else live_pages):
                continue
            assert np.array_equal(after[chunk], before[chunk]), f"{s} object {oid} changed"
    assert mismatches(rt, [(a, 8), (b, 8)], 2) == [0, 0]
    a.close()
    b.close()
