"""The spec's K3 pool entry points without a GPU (runtime.md "host 层（K3）"):

* the host tier sized from bytes: `Runtime.host_units` / `host_split` (kern_pool's split for this runtime's
  layout) and `reserve_host_bytes(host_bytes, turn_tokens)`, which pins exactly what the split implies;
* executing a plan another pool decided (the head rank's, for ranks holding the same ids):
  `copy(Copies)`, `copy_out(park HostCopies)`, `copy_in(wake HostCopies)` issue exactly the plan's driver
  calls, and a plan naming an id this runtime does not map issues nothing.

Recorder / FakeRuntime (test_pool_exec_cpu.py) record driver calls; one test goes through the real
`Runtime` over fake_cuda.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import kern_pool
from fake_cuda import FakeDriver, fake_cuda  # noqa: F401 - the fixture
from kern_pool import Copies, HostCopies, Layout, PageCopy, SlotCopy
from kern_runtime import ApiError, Capacity, Runtime, pooled
from kern_runtime.host_tier import HostGeometry
from runtime_helpers import base_manifest
from test_pool_exec_cpu import FakeRuntime, Recorder, rec  # noqa: F401 - rec is the fixture

MIB = 1 << 20
BASE = 1 << 40  # the Recorder's cuMemAddressReserve
HOST = 1 << 30  # the Recorder's cuMemHostAlloc

KV_SLOTS = Layout(page_tokens=16, page_bytes=(MIB, MIB), slot_bytes=(2 * MIB,), block_bytes=MIB, num_blocks=32,
                  initial_pages=9, initial_slots=4)
KV_ONLY = Layout(page_tokens=16, page_bytes=(MIB, 2 * MIB), slot_bytes=(), block_bytes=MIB, num_blocks=30,
                 initial_pages=9, initial_slots=0)
SLOTS_ONLY = Layout(page_tokens=16, page_bytes=(), slot_bytes=(MIB, 3 * MIB), block_bytes=MIB, num_blocks=24,
                    initial_pages=0, initial_slots=5)


def pinned(rec: Recorder) -> list[int]:
    """Sizes of every cuMemHostAlloc recorded."""
    return [int(args[0]) for _, args in rec.names("cuMemHostAlloc")]


# ---------------------------------------------------------------- 1. the host tier from bytes


@pytest.mark.parametrize("layout", [KV_SLOTS, KV_ONLY, SLOTS_ONLY], ids=["kv+slots", "kv", "slots"])
@pytest.mark.parametrize(("host_bytes", "turn_tokens"), [(100 * MIB, 64), (100 * MIB + 12345, 40), (37 * MIB, 1),
                                                         (0, 16), (3 * MIB, 1000)])
def test_host_split_is_kern_pools_for_this_layout(rec: Recorder, layout: Layout, host_bytes: int,
                                                  turn_tokens: int) -> None:
    rt = FakeRuntime(layout)
    assert rt.host_split(host_bytes, turn_tokens) == kern_pool.host_split(host_bytes, layout, turn_tokens)
    assert rt.host_units(host_bytes, turn_tokens) == kern_pool.host_units(host_bytes, layout, turn_tokens)
    assert not pinned(rec)  # pure


def test_host_split_by_hand(rec: Recorder) -> None:
    """KV_SLOTS: a page is 2 MiB over both states, a slot 2 MiB; a 64-token turn is 4 pages + 1 slot = 10 MiB."""
    rt = FakeRuntime(KV_SLOTS)
    assert rt.host_units(100 * MIB, 64) == 10 and rt.host_split(100 * MIB, 64) == (40, 10)
    assert rt.host_split(100 * MIB - 1, 64) == (36, 9)
    assert rt.host_split(100 * MIB, 65) == (40, 8)  # 5 pages + 1 slot = 12 MiB -> 8 units, 4 MiB left
    assert FakeRuntime(KV_ONLY).host_split(100 * MIB, 64) == (33, 0)  # 3 MiB a page, every byte to pages
    assert FakeRuntime(SLOTS_ONLY).host_split(100 * MIB, 64) == (0, 25)  # 4 MiB a slot


@pytest.mark.parametrize("layout", [KV_SLOTS, KV_ONLY, SLOTS_ONLY], ids=["kv+slots", "kv", "slots"])
@pytest.mark.parametrize(("host_bytes", "turn_tokens"), [(100 * MIB, 64), (100 * MIB + 12345, 40), (37 * MIB, 1)])
def test_reserve_host_bytes_pins_what_the_split_implies(rec: Recorder, layout: Layout, host_bytes: int,
                                                        turn_tokens: int) -> None:
    rt = FakeRuntime(layout)
    pages, slots = kern_pool.host_split(host_bytes, layout, turn_tokens)
    want = pages * sum(layout.page_bytes) + slots * sum(layout.slot_bytes)
    assert want == HostGeometry(pages, slots, layout.page_bytes, layout.slot_bytes).total_bytes
    rec.clear()
    assert rt.reserve_host_bytes(host_bytes, turn_tokens) == want
    assert pinned(rec) == [want]  # one pinned allocation of exactly the split's bytes
    assert (rt.host_tier.num_pages, rt.host_tier.num_slots) == (pages, slots)
    assert rt.host_memory.nbytes == want
    turn_pages = -(-turn_tokens // layout.page_tokens) if layout.page_bytes else 0
    unit = turn_pages * sum(layout.page_bytes) + sum(layout.slot_bytes) if layout.slot_bytes else sum(layout.page_bytes)
    assert want <= host_bytes < want + unit  # less than one unit left over


def test_reserve_host_bytes_tier_parks_and_wakes(rec: Recorder) -> None:
    rt = FakeRuntime(KV_SLOTS)
    rt.reserve_host_bytes(30 * MIB, 32)  # 2 pages + 1 slot = 6 MiB a unit: 5 units -> 10 pages, 5 slots
    assert (rt.host_tier.num_pages, rt.host_tier.num_slots) == (10, 5)
    lease = rt.lease(40)
    lease.advance_to(40)
    parked = rt.park_now(rt.retire(lease, 40))
    assert rt.host_tier.free_pages == 7 and rt.host_tier.free_slots == 4
    woken = rt.wake_now(parked, 40, 48)
    assert woken.prefix_tokens == 40
    rt.kern_pool.check()
    rt.host_tier.check()


@pytest.mark.parametrize(("host_bytes", "turn_tokens", "match"), [
    (-1, 64, "reserve_host_bytes host_bytes must be an int >= 0"),
    (1.5 * MIB, 64, "reserve_host_bytes host_bytes"),
    ("100", 64, "reserve_host_bytes host_bytes"),
    (True, 64, "reserve_host_bytes host_bytes"),
    (100 * MIB, 0, "reserve_host_bytes turn_tokens must be an int >= 1"),
    (100 * MIB, 16.0, "reserve_host_bytes turn_tokens"),
    (100 * MIB, None, "reserve_host_bytes turn_tokens"),
])
def test_reserve_host_bytes_refuses_bad_inputs_before_allocating(rec: Recorder, host_bytes: Any, turn_tokens: Any,
                                                                 match: str) -> None:
    rt = FakeRuntime(KV_SLOTS)
    rec.clear()
    with pytest.raises(kern_pool.Misuse, match=match):
        rt.reserve_host_bytes(host_bytes, turn_tokens)
    with pytest.raises(kern_pool.Misuse, match=match.replace("reserve_host_bytes", "host_split")):
        rt.host_split(host_bytes, turn_tokens)
    with pytest.raises(kern_pool.Misuse, match=match.replace("reserve_host_bytes", "host_units")):
        rt.host_units(host_bytes, turn_tokens)
    assert rec.calls == []
    assert rt.reserve_host_bytes(20 * MIB, 64) == 20 * MIB  # still usable


def test_reserve_host_bytes_refuses_bytes_without_a_unit(rec: Recorder) -> None:
    rt = FakeRuntime(KV_SLOTS)
    rec.clear()
    for host_bytes in (0, 10 * MIB - 1):
        with pytest.raises(ApiError, match=r"hold no host unit; one unit \(4 pages of 16 tokens \+ one slot\) "
                                           r"is 10485760 bytes"):
            rt.reserve_host_bytes(host_bytes, 64)
    assert rec.calls == []
    assert rt.reserve_host_bytes(10 * MIB, 64) == 10 * MIB
    for layout, small, match in ((KV_ONLY, 3 * MIB - 1, r"one unit \(one page of 16 tokens\) is 3145728 bytes"),
                                 (SLOTS_ONLY, 4 * MIB - 1, r"one unit \(one slot\) is 4194304 bytes")):
        other = FakeRuntime(layout)
        with pytest.raises(ApiError, match=match):
            other.reserve_host_bytes(small, 64)
        assert other.reserve_host_bytes(small + 1, 64) == small + 1


def test_reserve_host_bytes_refuses_a_second_tier_and_more_than_physical_memory(
        rec: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    rt = FakeRuntime(KV_SLOTS)
    monkeypatch.setattr(pooled, "host_memory_bytes", lambda: 64 * MIB)
    rec.clear()
    with pytest.raises(ApiError, match=r"reserve_host_bytes\(104857600, 64\) -> 40 pages \+ 10 slots: 104857600 "
                                       r"bytes of pinned memory .* exceed this machine's 67108864 bytes"):
        rt.reserve_host_bytes(100 * MIB, 64)
    assert rec.calls == []
    assert rt.reserve_host_bytes(60 * MIB, 64) == 60 * MIB  # fits
    rec.clear()
    for again in (lambda: rt.reserve_host_bytes(10 * MIB, 64), lambda: rt.reserve_host(1, 1)):
        with pytest.raises(ApiError, match="already called"):
            again()
    assert rec.calls == []


def test_host_split_without_pooled_states_is_an_api_error(fake_cuda: FakeDriver, tmp_path: Path) -> None:
    with Runtime.load(base_manifest(), tmp_path, None) as rt:
        for call in (lambda: rt.host_split(MIB, 16), lambda: rt.host_units(MIB, 16),
                     lambda: rt.reserve_host_bytes(MIB, 16), lambda: rt.copy(Copies())):
            with pytest.raises(ApiError, match="no paged or per-seq states"):
                call()


def test_reserve_host_bytes_on_the_runtime(fake_cuda: FakeDriver, tmp_path: Path) -> None:
    """The real Runtime (fake driver): the pinned allocation is the split's bytes."""
    manifest = base_manifest(states={"pa": {"kind": "paged", "bytes_per_token": 8192, "page_tokens": 16},
                                     "ss": {"kind": "per_seq", "bytes_per_seq": 4096}})
    with Runtime.load(manifest, tmp_path, None, capacity=Capacity(tokens=128, seqs=2)) as rt:
        layout = rt.kern_pool.layout
        pages, slots = rt.host_split(5 * MIB + 17, 48)
        assert (pages, slots) == kern_pool.host_split(5 * MIB + 17, layout, 48)
        assert pages == 3 * slots and slots == (5 * MIB + 17) // (3 * 16 * 8192 + 4096)
        before = fake_cuda.called("cuMemHostAlloc")
        total = rt.reserve_host_bytes(5 * MIB + 17, 48)
        assert total == pages * 16 * 8192 + slots * 4096
        assert fake_cuda.called("cuMemHostAlloc") == before + 1
        assert rt.host_memory.nbytes == total and rt.host_memory.view().size == total


# ---------------------------------------------------------------- 2. executing another pool's plan (K3)


def dev(state: int, oid: int, layout: Layout) -> int:
    """Device address of object `oid` of pooled state `state` (Layout order) on a FakeRuntime."""
    n_paged = len(layout.page_bytes)
    size = layout.page_bytes[state] if state < n_paged else layout.slot_bytes[state - n_paged]
    return BASE + state * layout.va_bytes_per_state + oid * size


def test_copy_issues_exactly_the_calls_the_head_issued(rec: Recorder) -> None:
    """The head's pool decides (lease, checkpoint, lease_from a mid-page prefix, fork); a rank with the same
    layout executing each plan with `copy` issues exactly the head's driver calls."""
    head, rank = FakeRuntime(KV_SLOTS), FakeRuntime(KV_SLOTS)  # 3 slots: at most 3 handles with a slot
    leases: list[Any] = []
    steps = [
        lambda: head.lease(40),
        lambda: (leases[0].advance_to(40), head.checkpoint(leases[0], 40))[1],
        lambda: head.lease_from(leases[1], 60),
        lambda: (leases[0].close(), leases[2].advance_to(60), head.fork(leases[2], 60, 70))[2],
    ]
    for step in steps:
        rec.clear()
        handle = step()
        leases.append(handle)
        head_calls = list(rec.calls)
        assert head_calls and head.kern_pool.remap_in_flight is None
        rec.clear()
        rank.copy(handle.inner.plan)
        assert rec.calls == head_calls
    assert rank.kern_pool.held_pages == 0 and rank.kern_pool.free_slots == 3  # the rank's pool is untouched


def test_copy_refuses_ids_only_the_heads_remap_mapped(rec: Recorder) -> None:
    """A rank follows the head's copies, not its remaps: a slot the head's remap added is not mapped here."""
    head, rank = FakeRuntime(KV_SLOTS), FakeRuntime(KV_SLOTS)
    held = [head.lease(16) for _ in range(4)]  # the fourth slot needs a remap (pages give blocks)
    assert [h.seq_slot_id for h in held] == [1, 2, 3, 4]
    rec.clear()
    with pytest.raises(kern_pool.Misuse, match="slot 4 is not mapped on this runtime"):
        rank.copy(held[3].inner.plan)
    assert rec.calls == []


def test_copy_on_a_rank_with_other_object_sizes(rec: Recorder) -> None:
    """Same ids, other bytes (another segment's layers): the plan's runs at this rank's addresses."""
    other = Layout(page_tokens=16, page_bytes=(2 * MIB,), slot_bytes=(3 * MIB,), block_bytes=MIB, num_blocks=40,
                   initial_pages=9, initial_slots=4)
    rank = FakeRuntime(other)
    plan = Copies(page_copies=(PageCopy(3, 7), PageCopy(4, 8), PageCopy(1, 2)), slot_copies=(SlotCopy(1, 3),),
                  zero_pages=(5, 6), zero_slots=(2,))
    rec.clear()
    rank.copy(plan)
    assert rec.calls == [
        ("cuMemsetD8Async", (dev(0, 5, other), 0, 4 * MIB, "compute")),
        ("cuMemsetD8Async", (dev(1, 2, other), 0, 3 * MIB, "compute")),
        ("cuMemcpyDtoDAsync", (dev(0, 2, other), dev(0, 1, other), 2 * MIB, "compute")),
        ("cuMemcpyDtoDAsync", (dev(0, 7, other), dev(0, 3, other), 4 * MIB, "compute")),  # 3,4 -> 7,8: one run
        ("cuMemcpyDtoDAsync", (dev(1, 3, other), dev(1, 1, other), 3 * MIB, "compute")),
    ]
    rank.copy(Copies())
    assert len(rec.calls) == 5  # an empty plan issues nothing


BAD_COPIES = [
    (Copies(page_copies=(PageCopy(1, 9),)), r"page_copies\[0\]\.dst_page_id: page 9 is not mapped"),
    (Copies(page_copies=(PageCopy(1, 2), PageCopy(100, 3))), r"page_copies\[1\]\.src_page_id: page 100 is not mapped"),
    (Copies(page_copies=(PageCopy(0, 2),)), r"src_page_id: page 0 is the scratch page"),
    (Copies(slot_copies=(SlotCopy(1, 4),)), r"slot_copies\[0\]\.dst_slot_id: slot 4 is not mapped"),
    (Copies(slot_copies=(SlotCopy(1, 0),)), r"slot 0 is the scratch slot"),
    (Copies(zero_pages=(1, 2, 9)), r"zero_pages\[2\]: page 9 is not mapped"),
    (Copies(zero_slots=(0,)), r"zero_slots\[0\]: slot 0 is the scratch slot"),
    (Copies(zero_pages=(-1,)), r"zero_pages\[0\] must be an int >= 0"),
    (Copies(zero_pages=(True,)), r"zero_pages\[0\] must be an int"),
    (Copies(page_copies=(PageCopy(1.0, 2),)),  # type: ignore[arg-type]
     r"page_copies\[0\]\.src_page_id must be an int"),
    (Copies(page_copies=(SlotCopy(1, 2),)),  # type: ignore[arg-type]
     r"page_copies\[0\] must be a kern_pool PageCopy, got SlotCopy"),
    (Copies(zero_pages=[1, 2, 9]), r"zero_pages\[2\]"),  # type: ignore[arg-type]
    (Copies(zero_pages=5), r"zero_pages must be a tuple of ids, got int"),  # type: ignore[arg-type]
    (Copies(page_copies=(PageCopy(1, 3), PageCopy(2, 3))), r"destination 3 is written twice \(from 1 and 2\)"),
    (Copies(page_copies=(PageCopy(1, 2), PageCopy(2, 3))), r"id 2 is both a source and a destination"),
    (Copies(zero_pages=(1,), page_copies=(PageCopy(1, 2),)), r"page 1 is both zeroed and copied"),
    (Copies(zero_pages=(3,), page_copies=(PageCopy(1, 3),)), r"page 3 is both zeroed and copied"),
    (Copies(zero_slots=(2,), slot_copies=(SlotCopy(2, 1),)), r"slot 2 is both zeroed and copied"),
    (HostCopies("park", (PageCopy(1, 2),)), r"copy\(\) needs a kern_pool Copies, got HostCopies"),
    (None, r"needs a kern_pool Copies, got NoneType"),
]


@pytest.mark.parametrize(("copies", "match"), BAD_COPIES)
def test_copy_refuses_a_bad_id_before_issuing_anything(rec: Recorder, copies: Any, match: str) -> None:
    rt = FakeRuntime(Layout.simple(page_tokens=16, pages=8, slots=3))  # pages 1..8, slots 1..3 (0: scratch)
    lease = rt.lease(20)
    state = (rt.kern_pool.free_pages, rt.kern_pool.free_slots)
    rec.clear()
    with pytest.raises(kern_pool.Misuse, match=match):
        rt.copy(copies)
    assert rec.calls == []  # nothing issued
    assert (rt.kern_pool.free_pages, rt.kern_pool.free_slots) == state and not lease.closed
    rt.copy(Copies(page_copies=(PageCopy(1, 8),), zero_slots=(3,)))  # a good plan still runs
    assert [c[0] for c in rec.calls] == ["cuMemsetD8Async", "cuMemcpyDtoDAsync"]
    rt.kern_pool.check()


def test_copy_refuses_ids_a_remap_in_flight_adds_or_removes(rec: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    rt = FakeRuntime(Layout.simple(page_tokens=16, pages=6, slots=1))  # slot 1 only; pages 1..6
    first = rt.lease_slot()
    with pytest.raises(kern_pool.Remapping) as exc:
        rt.lease_slot(wait=False)
    plan = exc.value.plan
    assert plan.zero_slots == (2,) and plan.removed_pages == (6,)
    with monkeypatch.context() as m:
        m.setattr(rt._pooled_state.worker, "done", lambda: False)  # still on its thread
        rec.clear()
        for copies, match in ((Copies(zero_slots=(2,)), "slot 2 is not mapped"),
                              (Copies(page_copies=(PageCopy(6, 1),)), "page 6 is not mapped")):
            with pytest.raises(kern_pool.Misuse, match=match):
                rt.copy(copies)
        assert rec.calls == []
    rt.settle()  # landed: slot 2 is mapped, page 6 is a hole
    rec.clear()
    rt.copy(Copies(zero_slots=(2,)))
    assert rec.calls == [("cuMemsetD8Async", (dev(1, 2, rt.kern_pool.layout), 0, MIB, "compute"))]
    with pytest.raises(kern_pool.Misuse, match="page 6 is not mapped"):
        rt.copy(Copies(zero_pages=(6,)))
    assert first.seq_slot_id == 1


def test_copy_out_and_copy_in_issue_the_heads_host_copies_on_the_compute_stream(rec: Recorder) -> None:
    head, rank = FakeRuntime(KV_SLOTS), FakeRuntime(KV_SLOTS)
    head.reserve_host(pages=6, slots=2)
    rank.reserve_host(pages=6, slots=2)
    lease = head.lease(40)
    rank.copy(lease.inner.plan)
    rec.clear()
    lease.advance_to(40)
    parked = head.park_now(head.retire(lease, 40))
    park_calls = rec.names("cuMemcpyDtoHAsync")
    assert len(park_calls) == 3  # 3 pages in each of 2 states (one run each) + the slot
    rec.clear()
    rank.copy_out(parked.plan)
    assert rec.calls == park_calls  # the same copies, in the same order, on the compute stream
    l0 = KV_SLOTS
    assert rec.calls[0] == ("cuMemcpyDtoHAsync", (HOST, dev(0, 1, l0), 3 * MIB, "compute"))
    assert rec.calls[2] == ("cuMemcpyDtoHAsync", (HOST + 6 * MIB * 2, dev(2, 1, l0), 2 * MIB, "compute"))

    rec.clear()
    waking = head.wake(parked, 40, 64)  # on the head's transfer stream
    wake_calls = rec.names("cuMemcpyHtoDAsync")
    woken = head.awake(waking)
    assert woken is not None
    rank.copy(woken.inner.plan)  # the woken lease's own plan (nothing: the slot comes from the host)
    rec.clear()
    rank.copy_in(waking.inner.plan)
    assert [c[0] for c in rec.calls] == ["cuMemcpyHtoDAsync"] * len(wake_calls)
    assert [c[1][:3] for c in rec.calls] == [c[1][:3] for c in wake_calls]
    assert {c[1][3] for c in rec.calls} == {"compute"}
    assert rank.host_tier.free_pages == 6 and rank.kern_pool.held_pages == 0  # the rank's accounting untouched
    head.kern_pool.check()
    head.host_tier.check()


BAD_HOST = [
    ("copy_out", HostCopies("park", (PageCopy(1, 6),)), r"copy_out\(\) page_copies\[0\]\.dst_page_id: host page 6 "
                                                        r"is outside this runtime's 6 host pages"),
    ("copy_out", HostCopies("park", (PageCopy(0, 1),)), r"src_page_id: page 0 is the scratch page"),
    ("copy_out", HostCopies("park", (PageCopy(9, 1),)), r"src_page_id: page 9 is not mapped"),
    ("copy_out", HostCopies("park", (), (SlotCopy(1, 2),)), r"slot_copies\[0\]\.dst_slot_id: host slot 2 is outside "
                                                             r"this runtime's 2 host slots"),
    ("copy_out", HostCopies("park", (PageCopy(1, 0), PageCopy(2, 0))), r"destination 0 is written twice"),
    ("copy_out", HostCopies("wake", (PageCopy(0, 1),)), r"copy_out\(\) executes 'park' plans \(device -> host\), "
                                                        r"got 'wake'"),
    ("copy_out", Copies(), r"copy_out\(\) needs a kern_pool HostCopies, got Copies"),
    ("copy_in", HostCopies("wake", (PageCopy(6, 1),)), r"copy_in\(\) page_copies\[0\]\.src_page_id: host page 6 is "
                                                       r"outside"),
    ("copy_in", HostCopies("wake", (PageCopy(1, 0),)), r"dst_page_id: page 0 is the scratch page"),
    ("copy_in", HostCopies("wake", (), (SlotCopy(0, 4),)), r"dst_slot_id: slot 4 is not mapped"),
    ("copy_in", HostCopies("wake", (), (SlotCopy(-1, 1),)), r"src_slot_id must be an int >= 0"),
    ("copy_in", HostCopies("park", ()), r"copy_in\(\) executes 'wake' plans \(host -> device\), got 'park'"),
]


@pytest.mark.parametrize(("method", "plan", "match"), BAD_HOST)
def test_copy_out_and_copy_in_refuse_a_bad_id_before_issuing_anything(rec: Recorder, method: str, plan: Any,
                                                                      match: str) -> None:
    rt = FakeRuntime(KV_SLOTS)  # pages 1..8, slots 1..3
    rt.reserve_host(pages=6, slots=2)
    rec.clear()
    with pytest.raises(kern_pool.Misuse, match=match):
        getattr(rt, method)(plan)
    assert rec.calls == []
    rt.copy_out(HostCopies("park", (PageCopy(8, 5),), (SlotCopy(3, 1),)))  # the bounds themselves are fine
    rt.copy_in(HostCopies("wake", (PageCopy(5, 8),), (SlotCopy(1, 3),)))
    assert [c[0] for c in rec.calls] == ["cuMemcpyDtoHAsync"] * 3 + ["cuMemcpyHtoDAsync"] * 3


def test_copy_out_without_a_host_tier_is_an_api_error(rec: Recorder) -> None:
    rt = FakeRuntime(KV_SLOTS)
    rec.clear()
    for method, direction in (("copy_out", "park"), ("copy_in", "wake")):
        with pytest.raises(ApiError, match="no host tier"):
            getattr(rt, method)(HostCopies(direction, (PageCopy(1, 0),)))
    assert rec.calls == []
