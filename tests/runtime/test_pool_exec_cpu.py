"""kern-runtime's pool execution without a GPU: plans -> driver-call lists (coalescing, 2-D copy
parameters, remap steps), the host layout, NUMA parsing, and the pool API over a recording driver."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import kern_pool
from kern_pool import Copies, HostCopies, Layout, PageCopy, SlotCopy
from kern_runtime import host_tier, pool_exec, pooled, remap
from kern_runtime.host_tier import Copy2D, HostGeometry, class_copies, host_copies
from kern_runtime.pool_exec import ClassGeometry, DtoD, Memset, copy_ops, id_runs, pair_runs, plan_ops, zero_ops

MIB = 1 << 20


# ---------------------------------------------------------------- runs


@pytest.mark.parametrize("ids, runs", [
    ([], []), ([3], [(3, 1)]), ([1, 2, 3], [(1, 3)]), ([5, 1, 2, 3, 9, 2], [(1, 3), (5, 1), (9, 1)]),
    ([7, 6, 5], [(5, 3)]),
])
def test_id_runs(ids: list[int], runs: list[tuple[int, int]]) -> None:
    assert id_runs(ids) == runs


@pytest.mark.parametrize("pairs, runs", [
    ([(1, 10), (2, 11), (3, 12)], [(1, 10, 3)]),
    ([(3, 12), (1, 10), (2, 11)], [(1, 10, 3)]),          # order of the plan does not matter
    ([(1, 10), (2, 12), (3, 13)], [(1, 10, 1), (2, 12, 2)]),  # destination gap splits
    ([(1, 10), (3, 11)], [(1, 10, 1), (3, 11, 1)]),        # source gap splits
    ([(4, 0), (5, 1), (9, 2)], [(4, 0, 2), (9, 2, 1)]),
])
def test_pair_runs(pairs: list[tuple[int, int]], runs: list[tuple[int, int, int]]) -> None:
    assert pair_runs(pairs) == runs


GEO_PAGES = ClassGeometry((1000 * MIB, 2000 * MIB), (4 * MIB, 4 * MIB))
GEO_SLOTS = ClassGeometry((3000 * MIB,), (2 * MIB,))


def test_zero_and_copy_ops_one_call_per_state_and_run() -> None:
    assert zero_ops([3, 4, 5, 9], GEO_PAGES) == [
        Memset(1000 * MIB + 12 * MIB, 12 * MIB), Memset(1000 * MIB + 36 * MIB, 4 * MIB),
        Memset(2000 * MIB + 12 * MIB, 12 * MIB), Memset(2000 * MIB + 36 * MIB, 4 * MIB),
    ]
    assert copy_ops([(7, 1), (8, 2)], GEO_SLOTS) == [DtoD(3000 * MIB + 2 * MIB, 3000 * MIB + 14 * MIB, 4 * MIB)]


def test_plan_ops_zero_first_then_copy() -> None:
    copies = Copies(page_copies=(PageCopy(5, 9),), slot_copies=(SlotCopy(1, 2),), zero_pages=(3,), zero_slots=(4,))
    assert plan_ops(copies, GEO_PAGES, GEO_SLOTS) == [
        Memset(1000 * MIB + 12 * MIB, 4 * MIB), Memset(2000 * MIB + 12 * MIB, 4 * MIB),
        Memset(3000 * MIB + 8 * MIB, 2 * MIB),
        DtoD(1000 * MIB + 36 * MIB, 1000 * MIB + 20 * MIB, 4 * MIB),
        DtoD(2000 * MIB + 36 * MIB, 2000 * MIB + 20 * MIB, 4 * MIB),
        DtoD(3000 * MIB + 4 * MIB, 3000 * MIB + 2 * MIB, 2 * MIB),
    ]
    assert plan_ops(Copies(), GEO_PAGES, GEO_SLOTS) == []


def test_uniform_stride() -> None:
    assert GEO_PAGES.uniform_stride() == 1000 * MIB
    assert GEO_SLOTS.uniform_stride() is None  # one state
    assert ClassGeometry((0, 10, 30), (5, 5, 5)).uniform_stride() is None
    assert ClassGeometry((0, 10), (5, 6)).uniform_stride() is None


# ---------------------------------------------------------------- host layout and 2-D copies


def test_host_geometry_is_state_major() -> None:
    g = HostGeometry(num_pages=10, num_slots=3, page_bytes=(4, 4), slot_bytes=(2,))
    assert g.page_region_offsets == (0, 40)
    assert g.slot_region_offsets == (80,)
    assert g.total_bytes == 86
    assert g.pages(1000) == ClassGeometry((1000, 1040), (4, 4))
    assert g.slots(1000) == ClassGeometry((1080,), (2,))


def test_park_run_of_every_state_is_one_2d_copy() -> None:
    host = HostGeometry(8, 0, (4 * MIB, 4 * MIB), ()).pages(1 << 30)
    pairs = [(5, 0), (6, 1), (7, 2), (9, 3)]  # device -> host
    out = class_copies(pairs, GEO_PAGES, host, to_host=True, max_pitch=(1 << 31) - 1)
    assert out == [
        Copy2D(src=1000 * MIB + 20 * MIB, src_pitch=1000 * MIB, dst=(1 << 30), dst_pitch=32 * MIB,
               width_bytes=12 * MIB, height=2, to_host=True),
        Copy2D(src=1000 * MIB + 36 * MIB, src_pitch=1000 * MIB, dst=(1 << 30) + 12 * MIB, dst_pitch=32 * MIB,
               width_bytes=4 * MIB, height=2, to_host=True),
    ]


def test_wake_copies_mirror_park() -> None:
    host = HostGeometry(8, 0, (4 * MIB, 4 * MIB), ()).pages(1 << 30)
    out = class_copies([(0, 5), (1, 6)], GEO_PAGES, host, to_host=False, max_pitch=(1 << 31) - 1)  # host -> device
    assert out == [Copy2D(src=(1 << 30), src_pitch=32 * MIB, dst=1000 * MIB + 20 * MIB, dst_pitch=1000 * MIB,
                          width_bytes=8 * MIB, height=2, to_host=False)]


def test_pitch_over_the_limit_falls_back_to_one_copy_per_state() -> None:
    host = HostGeometry(8, 0, (4 * MIB, 4 * MIB), ()).pages(1 << 30)
    out = class_copies([(5, 0), (6, 1)], GEO_PAGES, host, to_host=True, max_pitch=512 * MIB)
    assert out == [
        Copy2D(1000 * MIB + 20 * MIB, 8 * MIB, (1 << 30), 8 * MIB, 8 * MIB, 1, True),
        Copy2D(2000 * MIB + 20 * MIB, 8 * MIB, (1 << 30) + 32 * MIB, 8 * MIB, 8 * MIB, 1, True),
    ]


def test_host_copies_pages_then_slots() -> None:
    g = HostGeometry(4, 2, (4 * MIB, 4 * MIB), (2 * MIB,))
    plan = HostCopies("park", (PageCopy(3, 0),), (SlotCopy(2, 1),))
    out = host_copies(plan, GEO_PAGES, GEO_SLOTS, g, 1 << 32, max_pitch=(1 << 31) - 1)
    assert out == [
        Copy2D(1000 * MIB + 12 * MIB, 1000 * MIB, 1 << 32, 16 * MIB, 4 * MIB, 2, True),
        Copy2D(3000 * MIB + 4 * MIB, 2 * MIB, (1 << 32) + 32 * MIB + 2 * MIB, 2 * MIB, 2 * MIB, 1, True),
    ]


# ---------------------------------------------------------------- NUMA


@pytest.mark.parametrize("text, nodes", [("0", [0]), ("0-1\n", [0, 1]), ("0,2-3", [0, 2, 3]), ("", [])])
def test_parse_node_list(text: str, nodes: list[int]) -> None:
    assert host_tier.parse_node_list(text) == nodes


def _sysfs(root: Path, online: str, bdf: str, node: str | None) -> Path:
    (root / "devices" / "system" / "node").mkdir(parents=True)
    (root / "devices" / "system" / "node" / "online").write_text(online)
    if node is not None:
        dev = root / "bus" / "pci" / "devices" / bdf
        dev.mkdir(parents=True)
        (dev / "numa_node").write_text(node + "\n")
    return root


@pytest.mark.parametrize("online, node, want", [
    ("0-1", "1", 1), ("0-1", "0", 0), ("0", "0", None), ("0-1", "-1", None), ("0-1", None, None),
])
def test_numa_target(tmp_path: Path, online: str, node: str | None, want: int | None) -> None:
    root = _sysfs(tmp_path, online, "0000:19:00.0", node)
    assert host_tier.numa_target("0000:19:00.0", root) == want
    assert host_tier.numa_target("0000:19:00.0".upper(), root) == want  # the driver spells hex upper case


def test_node_mask() -> None:
    assert host_tier.node_mask(0) == [1]
    assert host_tier.node_mask(65) == [0, 2]


# ---------------------------------------------------------------- the pool API over a recording driver


class Recorder:
    """Stands in for `driver.call`: records (name, args) and returns plausible handles."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self._next = 100

    def __call__(self, name: str, *args: Any) -> Any:
        self.calls.append((name, args))
        if name == "cuMemAddressReserve":
            return 1 << 40
        if name in ("cuMemCreate", "cuEventCreate", "cuStreamCreate"):
            self._next += 1
            return f"{name}#{self._next}"
        if name == "cuDeviceGetPCIBusId":
            return b"0000:00:00.0\x00"
        if name == "cuDeviceGetAttribute":
            return (1 << 31) - 1
        if name == "cuMemHostAlloc":
            return 1 << 30
        return 0

    def names(self, *wanted: str) -> list[tuple[str, tuple[Any, ...]]]:
        return [c for c in self.calls if c[0] in wanted]

    def clear(self) -> None:
        self.calls.clear()


class FakeRuntime(pooled.PoolMethods):
    def __init__(self, layout: Layout) -> None:
        self.stream = "compute"
        self.context = "ctx"
        self.gpu = 0
        self._pooled_state = pooled.PoolState.create(layout, 0, "ctx", "compute")

    def _activate(self) -> None:
        pass


@pytest.fixture
def rec(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    r = Recorder()
    for mod in (pool_exec, remap, pooled, host_tier):
        monkeypatch.setattr(mod, "call", r)
    monkeypatch.setattr(pooled, "event_done", lambda event: True)
    monkeypatch.setattr(host_tier, "numa_target", lambda bdf, sys_root="/sys": None)
    monkeypatch.setattr(pooled, "numa_target", lambda bdf, sys_root="/sys": None)
    return r


def test_load_maps_every_block_of_the_layout_and_zeroes_it(rec: Recorder) -> None:
    layout = Layout.simple(page_tokens=16, pages=3, slots=1)  # 1 MiB blocks: 4 pages + 2 slots
    rt = FakeRuntime(layout)
    maps = rec.names("cuMemMap")
    base, stride = 1 << 40, layout.va_bytes_per_state
    assert [m[1][0] for m in maps] == [base + i * MIB for i in range(4)] + [base + stride + j * MIB for j in range(2)]
    assert len(rec.names("cuMemCreate")) == layout.num_blocks
    assert len(rec.names("cuMemsetD8Async")) == 6
    assert rt.state_object_address(layout.states[1], 1) == base + stride + MIB


def test_lease_from_mid_page_copies_one_page_and_the_slot(rec: Recorder) -> None:
    layout = Layout.simple(page_tokens=16, pages=6, slots=3)
    rt = FakeRuntime(layout)
    base, stride = 1 << 40, layout.va_bytes_per_state
    rec.clear()
    lease = rt.lease(40)
    assert lease.page_ids() == [1, 2, 3] and lease.seq_slot_id == 1
    assert rec.calls == [("cuMemsetD8Async", (base + stride + MIB, 0, MIB, "compute"))]  # the slot is zeroed
    lease.advance_to(40)  # with a slot, checkpoint only at the position reached
    cp = rt.checkpoint(lease, 40)
    assert rec.calls[-1] == ("cuMemcpyDtoDAsync", (base + stride + 2 * MIB, base + stride + MIB, MIB, "compute"))
    rec.clear()
    child = rt.lease_from(cp, 60)
    assert child.page_ids() == [1, 2, 4, 5]
    assert rec.calls == [
        ("cuMemcpyDtoDAsync", (base + 4 * MIB, base + 3 * MIB, MIB, "compute")),  # page 3 (mid-page) -> 4
        ("cuMemcpyDtoDAsync", (base + stride + 3 * MIB, base + stride + 2 * MIB, MIB, "compute")),
    ]
    table = rt.block_table([child, None], width=6, rows=3)
    assert table.tolist() == [[1, 2, 4, 5, 0, 0], [0] * 6, [0] * 6]
    assert child.slots(40, 43).tolist() == [4 * 16 + 8, 4 * 16 + 9, 4 * 16 + 10]
    with pytest.raises(kern_pool.Misuse):
        child.slots(30, 41)  # inherited prefix


def test_remap_runs_on_a_thread_after_the_guard_event_then_zeroes_and_lands(rec: Recorder) -> None:
    layout = Layout.simple(page_tokens=16, pages=6, slots=1)  # slot 1 only; pages 1..6 free
    rt = FakeRuntime(layout)
    base, stride = 1 << 40, layout.va_bytes_per_state
    first = rt.lease_slot()
    rec.clear()
    with pytest.raises(kern_pool.Remapping):
        rt.lease_slot(wait=False)
    assert rt.kern_pool.remap_in_flight is not None
    second = rt.lease_slot()  # waits in settle, then the new slot is leasable
    names = [c[0] for c in rec.calls]
    assert names[:2] == ["cuEventCreate", "cuEventRecord"]
    assert names.index("cuEventSynchronize") < names.index("cuMemUnmap") < names.index("cuMemMap")
    unmap = rec.names("cuMemUnmap")[0][1]
    mapped = rec.names("cuMemMap")[0][1]
    assert unmap == (base + 6 * MIB, MIB)  # the highest free page gives its block
    assert mapped[0] == base + stride + 2 * MIB  # into the lowest slot hole
    zero = [c for c in rec.calls if c[0] == "cuMemsetD8Async"]
    assert zero == [("cuMemsetD8Async", (base + stride + 2 * MIB, 0, MIB, "compute"))] * 2  # land + lease zero
    assert second.seq_slot_id == 2 and first.seq_slot_id == 1
    assert rt.kern_pool.remap_in_flight is None
    rt.kern_pool.check()


def test_park_and_wake_issue_per_state_copies_behind_the_compute_stream(rec: Recorder) -> None:
    """Each state's run of pages is one 1-D copy (the H200 driver refuses 2-D copies whose rows lie in
    different VMM mappings of the arena, so the runtime never folds states into one 2-D copy)."""
    layout = Layout(page_tokens=16, page_bytes=(MIB, MIB), slot_bytes=(), block_bytes=MIB, num_blocks=18,
                    initial_pages=9, initial_slots=0)
    rt = FakeRuntime(layout)
    base, stride, host = 1 << 40, layout.va_bytes_per_state, 1 << 30
    assert rt.reserve_host(pages=4) == 8 * MIB
    lease = rt.lease(48)
    cp = rt.retire(lease, 40)
    rec.clear()
    parked = rt.park(rt.room(cp))
    names = [c[0] for c in rec.calls]
    assert names == ["cuEventCreate", "cuEventRecord", "cuStreamWaitEvent", "cuEventDestroy",
                     "cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync", "cuEventCreate", "cuEventRecord"]
    assert rec.calls[2][1][1] == rec.calls[1][1][0]  # the transfer stream waits for the compute event
    park = [c[1][:3] for c in rec.names("cuMemcpyDtoHAsync")]  # (dst host, src device, bytes)
    assert [(int(d), int(s), n) for d, s, n in park] == [
        (host, base + MIB, 3 * MIB), (host + 4 * MIB, base + stride + MIB, 3 * MIB)]
    assert rt.landed(parked) and rt.kern_pool.free_pages == 8
    rec.clear()
    waking = rt.wake(parked, 40, 64)
    woken = rt.awake(waking)
    assert woken is not None and woken.prefix_tokens == 40 and woken.num_pages == 4
    assert not rec.names("cuMemcpy2DAsync")
    wake = [tuple(int(x) for x in c[1][:3]) for c in rec.names("cuMemcpyHtoDAsync")]  # (dst device, src host, bytes)
    runs = host_tier.pair_runs(zip(range(3), woken.page_ids()[:3]))  # host pages 0..2 -> the lease's first pages
    assert wake == [(base + state * stride + d * MIB, host + state * 4 * MIB + h * MIB, n * MIB)
                    for h, d, n in runs for state in range(2)]
    rt.kern_pool.check()
    rt.host_tier.check()


def test_awake_consumes_the_waking_a_second_awake_is_closed(rec: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    """runtime.md: awake(waking) -> Lease hands the lease out once. A second awake used to wrap
    `waking.inner.lease` again: two kern_runtime Leases over one pool lease."""
    layout = Layout.simple(page_tokens=16, pages=8, slots=3)
    rt = FakeRuntime(layout)
    rt.reserve_host(pages=4, slots=2)
    lease = rt.lease(40)
    lease.advance_to(40)
    parked = rt.park_now(rt.retire(lease, 40))
    waking = rt.wake(parked, 40, 64)
    monkeypatch.setattr(pooled, "event_done", lambda event: False)
    assert rt.awake(waking) is None and rt.awake(waking) is None  # not landed: asking again is fine
    monkeypatch.setattr(pooled, "event_done", lambda event: True)
    woken = rt.awake(waking)
    assert woken is not None and woken.prefix_tokens == 40 and woken.seq_slot_id is not None
    pool = rt.kern_pool
    state = (pool.free_pages, pool.free_slots, rt.host_tier.free_pages, rt.host_tier.free_slots)
    rec.clear()
    for _ in range(2):
        with pytest.raises(kern_pool.Closed, match="already awakened"):
            rt.awake(waking)
    assert rec.calls == []  # nothing issued
    assert rt.landed(waking)  # only asks
    assert (pool.free_pages, pool.free_slots, rt.host_tier.free_pages, rt.host_tier.free_slots) == state
    assert not woken.closed and woken.page_ids() == waking.inner._lease.page_ids()
    assert waking.close() is False and not woken.closed  # the woken lease is the caller's now
    with pytest.raises(kern_pool.Closed, match="already awakened"):
        rt.awake(waking)
    woken.close()
    with pytest.raises(kern_pool.Closed):
        rt.awake(waking)
    parked.close()
    pool.check()
    rt.host_tier.check()
    assert pool.held_pages == 0
