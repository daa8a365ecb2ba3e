"""Whole-state access (`read_state`, `write_state_at`, `zero_states`, state_access.py) over the fake driver.

The fake driver of fake_cuda.py leaves VMM reservations unbacked; `BackedDriver` below backs each one with
host memory (so pooled states hold real bytes) and reports a 4 KiB VMM granularity (so the pool's blocks
are 8 KiB and the arena stays small). Remaps do not move bytes here; the API refuses a remapped state anyway.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import kern_pool
from fake_cuda import FakeDriver, install
from kern_runtime import ApiError, Capacity, Runtime
from kern_runtime.kv.pooled import remapped_states
from runtime_helpers import base_manifest

PAGE = 16 * 1024  # pa: 1024 bytes per token, 16-token pages
SLOT = 16 * 1024  # ss: bytes per seq
FIXED = 100  # fx: bytes


class BackedDriver(FakeDriver):
    """FakeDriver whose VMM reservations are host memory (copies and memsets reach them)."""

    def _cuMemAddressReserve(self, nbytes: int, *rest: Any) -> tuple:
        return (0, self._alloc(nbytes))

    def _cuMemGetAllocationGranularity(self, prop: Any, option: Any) -> tuple:
        return (0, 4096)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[BackedDriver]:
    yield install(monkeypatch, BackedDriver())


def manifest() -> dict:
    return base_manifest(states={"pa": {"kind": "paged", "bytes_per_token": PAGE // 16, "page_tokens": 16},
                                 "ss": {"kind": "per_seq", "bytes_per_seq": SLOT},
                                 "fx": {"kind": "fixed", "bytes": FIXED}})


@pytest.fixture
def rt(fake: BackedDriver, tmp_path: Path) -> Iterator[Runtime]:
    with Runtime.load(manifest(), tmp_path, None, capacity=Capacity(tokens=64, seqs=2)) as r:
        yield r


def sizes(rt: Runtime) -> dict[str, int]:
    assert rt.pool is not None
    return {"pa": rt.pool.mapped_bytes["pa"], "ss": rt.pool.mapped_bytes["ss"], "fx": FIXED}


def pattern(n: int, seed: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.int64) * 7 + seed * 31 + 1) % 251 + 1).astype(np.uint8)  # never 0


def device_bytes(address: int, n: int) -> np.ndarray:
    """n bytes at a fake device address (a host pointer)."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(address)).copy()


def copies(fake: BackedDriver) -> list[str]:
    return [name for name, _ in fake.calls if name.startswith(("cuMemcpy", "cuMemset"))]


def fill_all(rt: Runtime) -> dict[str, np.ndarray]:
    want = {name: pattern(size, seed) for seed, (name, size) in enumerate(sizes(rt).items())}
    for name, data in want.items():
        rt.write_state_at(name, 0, data)
    return want


# ---------------------------------------------------------------- round trips


def test_states_read_whole_and_zeroed_at_load(rt: Runtime) -> None:
    got = {name: rt.read_state(name) for name in ("pa", "ss", "fx")}
    want = {n: (np.dtype(np.uint8), (s,)) for n, s in sizes(rt).items()}
    assert {n: (a.dtype, a.shape) for n, a in got.items()} == want
    assert sizes(rt)["pa"] == rt.describe()["states"]["pa"]["bytes"] >= rt.num_pages * PAGE  # whole blocks
    assert sizes(rt)["ss"] >= rt.num_slots * SLOT
    assert all(not a.any() for a in got.values())


def test_write_then_read_round_trips(rt: Runtime, fake: BackedDriver) -> None:
    want = fill_all(rt)
    for name, data in want.items():
        np.testing.assert_array_equal(rt.read_state(name), data)
    # a write inside a state changes exactly its bytes, whatever the bytes-like type
    patches = [("pa", 2 * PAGE + 5, b"\x01\x02\x03"), ("ss", SLOT, bytearray(b"\xff" * 9)),
               ("fx", 4, memoryview(np.array([1.5, -2.0], np.float32))),
               ("fx", FIXED - 8, np.array([[0x0102, 0x0304], [0x0506, 0x0708]], np.uint16)),
               ("pa", sizes(rt)["pa"] - 1, np.array([200], np.uint8)), ("ss", sizes(rt)["ss"], b"")]
    for name, offset, data in patches:
        raw = np.frombuffer(bytes(data), np.uint8)
        want[name][offset:offset + raw.size] = raw
        rt.write_state_at(name, np.int64(offset), data)
    for name, data in want.items():
        np.testing.assert_array_equal(rt.read_state(name), data)
    assert bytes(rt.read_state("fx")[4:12]) == np.array([1.5, -2.0], np.float32).tobytes()
    assert rt.read_state("fx")[FIXED - 8:].tolist() == [2, 1, 4, 3, 6, 5, 8, 7]  # little-endian u16s
    # byte offsets are the kernels' view: page 2 of pa, slot 1 of ss
    assert device_bytes(rt.state_object_address("pa", 2) + 5, 3).tolist() == [1, 2, 3]
    assert device_bytes(rt.state_object_address("ss", 1), 9).tolist() == [255] * 9


def test_read_and_write_are_ordered_on_the_compute_stream(rt: Runtime, fake: BackedDriver) -> None:
    fake.calls.clear()
    rt.write_state_at("fx", 10, b"abc")
    rt.read_state("fx")
    names = [(n, a) for n, a in fake.calls if n != "cuCtxSetCurrent"]
    assert [n for n, _ in names] == ["cuMemcpyHtoDAsync", "cuStreamSynchronize", "cuStreamSynchronize", "cuMemcpyDtoH"]
    htod, sync = names[0][1], names[1][1]
    assert htod[0] == rt.address_of("fx") + 10 and htod[2] == 3 and htod[3] is rt.stream and sync == (rt.stream,)
    assert names[3][1][1:] == (rt.address_of("fx"), FIXED)


def test_zero_states_zeroes_exactly_the_named_states(rt: Runtime, fake: BackedDriver) -> None:
    want = fill_all(rt)
    fake.calls.clear()
    rt.zero_states(["pa"])
    assert [(n, a[1:]) for n, a in fake.calls if n == "cuMemsetD8Async"] == [
        ("cuMemsetD8Async", (0, sizes(rt)["pa"], rt.stream))]
    assert not rt.read_state("pa").any()
    np.testing.assert_array_equal(rt.read_state("ss"), want["ss"])
    np.testing.assert_array_equal(rt.read_state("fx"), want["fx"])
    rt.zero_states(())
    np.testing.assert_array_equal(rt.read_state("fx"), want["fx"])
    rt.zero_states(("fx",))
    assert not rt.read_state("fx").any()
    np.testing.assert_array_equal(rt.read_state("ss"), want["ss"])
    fill_all(rt)
    rt.zero_states()
    assert all(not rt.read_state(n).any() for n in ("pa", "ss", "fx"))
    assert rt.read_buffer("x").shape == (64, 4)  # buffers are not states: untouched API


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize("call, match", [
    (lambda rt: rt.read_state("nope"), r"read_state: 'nope' is not a state; states: \['fx', 'pa', 'ss'\]"),
    (lambda rt: rt.read_state("x"), "'x' is a buffer, not a state"),
    (lambda rt: rt.read_state(3), "state name must be a string"),
    (lambda rt: rt.write_state_at("kv", 0, b"a"), "write_state_at: 'kv' is not a state"),
    (lambda rt: rt.zero_states(["fx", "nope"]), "zero_states: 'nope' is not a state"),
    (lambda rt: rt.write_state_at("fx", -1, b"a"), "1 bytes at offset -1 do not fit state 'fx' of 100 bytes"),
    (lambda rt: rt.write_state_at("fx", 98, b"abc"), "3 bytes at offset 98 do not fit state 'fx' of 100 bytes"),
    (lambda rt: rt.write_state_at("fx", 101, b""), "0 bytes at offset 101 do not fit state 'fx' of 100 bytes"),
    (lambda rt: rt.write_state_at("fx", 0, np.zeros(26, np.float32)), "104 bytes at offset 0 do not fit state 'fx'"),
    (lambda rt: rt.write_state_at("fx", 1.0, b"a"), r"write_state_at 'fx' offset_bytes must be an integer, got 1\.0"),
    (lambda rt: rt.write_state_at("fx", True, b"a"), "offset_bytes must be an integer, got True"),
    (lambda rt: rt.write_state_at("fx", "0", b"a"), "offset_bytes must be an integer"),
    (lambda rt: rt.write_state_at("fx", 0, [1, 2]),
     "data must be bytes, bytearray, memoryview or a numpy array, got list"),
    (lambda rt: rt.write_state_at("fx", 0, "ab"), "data must be bytes, .* got str"),
    (lambda rt: rt.write_state_at("fx", 0, None), "data must be bytes, .* got NoneType"),
    (lambda rt: rt.write_state_at("fx", 0, np.array([b"x", 1], dtype=object)), "holds Python objects"),
    (lambda rt: rt.write_state_at("fx", 0, np.ones(2, ">f4")), "big-endian"),
    (lambda rt: rt.write_state_at("fx", 0, np.zeros(2, [("a", "<i4"), ("b", ">f4")])), "big-endian"),
    (lambda rt: rt.write_state_at("fx", 0, np.zeros(2, [("a", ">i2", (3,))])), "big-endian"),
    (lambda rt: rt.zero_states("fx"), "names must be None or a list / tuple / set of state names, got str"),
    (lambda rt: rt.zero_states(7), "got int"),
])
def test_refusals_are_typed_and_change_nothing(rt: Runtime, fake: BackedDriver, call, match: str) -> None:
    want = fill_all(rt)
    fake.calls.clear()
    with pytest.raises(ApiError, match=match):
        call(rt)
    assert copies(fake) == []  # refused before anything was enqueued
    for name, data in want.items():
        np.testing.assert_array_equal(rt.read_state(name), data)


def test_closed_runtime_refuses(fake: BackedDriver, tmp_path: Path) -> None:
    rt = Runtime.load(manifest(), tmp_path, None, capacity=Capacity(tokens=64, seqs=2))
    rt.close()
    fake.calls.clear()
    for call in (lambda: rt.read_state("fx"), lambda: rt.write_state_at("fx", 0, b"a"), lambda: rt.zero_states(),
                 lambda: rt.zero_states(["fx"])):
        with pytest.raises(ApiError, match="the runtime is closed"):
            call()
    assert fake.calls == []


def test_remapped_states_are_refused_from_the_moment_the_plan_starts(rt: Runtime, fake: BackedDriver) -> None:
    want = fill_all(rt)
    held = [rt.lease_slot() for _ in range(rt.num_slots - 1)]  # every slot but the scratch slot
    rt.write_state_at("ss", 0, want["ss"][:SLOT])  # pool use alone (leases zero slots) is not a remap
    with pytest.raises(kern_pool.Remapping):
        rt.lease_slot(wait=False)  # a new slot from the blocks of the highest free page: plan 1 in flight
    fake.calls.clear()
    for name in ("pa", "ss"):
        for call in (lambda: rt.read_state(name), lambda: rt.write_state_at(name, 0, b"a"),
                     lambda: rt.zero_states(["fx", name])):
            with pytest.raises(ApiError, match=rf"'{name}' \((paged|per_seq)\) was remapped \(remap plan 1\): "
                                              "whole-state reads and writes are valid only before the first remap"):
                call()
    with pytest.raises(ApiError, match="zero_states: state 'pa' .* was remapped"):
        rt.zero_states()  # all states: the first remapped one is named
    assert copies(fake) == []
    rt.settle()
    held.append(rt.lease_slot())
    assert held[-1].seq_slot_id == rt.num_slots  # past the slots mapped at load
    with pytest.raises(ApiError, match="was remapped"):
        rt.read_state("ss")  # landed: still refused
    # a fixed state is never remapped
    np.testing.assert_array_equal(rt.read_state("fx"), want["fx"])
    rt.write_state_at("fx", 0, b"\x00")
    rt.zero_states(["fx"])
    assert not rt.read_state("fx").any()
    for lease in held:
        lease.close()


def test_remapped_states_by_object_class() -> None:
    layout = kern_pool.Layout(page_tokens=16, page_bytes=(PAGE, PAGE), slot_bytes=(SLOT,), block_bytes=8192,
                              num_blocks=40, initial_pages=4, initial_slots=2, states=("ka", "kb", "rec"))
    plan = lambda **kw: kern_pool.RemapPlan(**{"serial": 1, "unmap": (), "map": (), "removed_pages": (),  # noqa: E731
                                               "removed_slots": (), "zero_pages": (), "zero_slots": (), **kw})
    assert remapped_states(layout, plan(zero_pages=(4,))) == ["ka", "kb"]
    assert remapped_states(layout, plan(zero_slots=(2,))) == ["rec"]
    assert remapped_states(layout, plan(zero_slots=(2,), removed_pages=(3,))) == ["ka", "kb", "rec"]
    assert remapped_states(layout, plan(map=(kern_pool.BlockMove(1, 9, 0),))) == ["kb"]
    assert remapped_states(layout, plan()) == []


def test_state_object_address_refuses_ids_outside_the_reserved_range(rt: Runtime) -> None:
    """An id whose object lies outside its state's reserved range (negative, or past the last object that fits)
    had an address in another state's range, or in none; a bool or a float id was used as a number."""
    assert rt.pool is not None
    stride = rt.pool.layout.va_bytes_per_state
    last_page, last_slot = stride // PAGE - 1, stride // SLOT - 1
    base_pa, base_ss = rt.state_object_address("pa", 0), rt.state_object_address("ss", 0)
    assert rt.state_object_address("pa", np.int64(last_page)) == base_pa + last_page * PAGE
    assert rt.state_object_address("ss", last_slot) == base_ss + last_slot * SLOT
    for state, object_id, message in [
        ("pa", -1, r"page -1 is outside the state's reserved range"),
        ("pa", last_page + 1, rf"page {last_page + 1} is outside the state's reserved range of {last_page + 1} pages"),
        ("ss", last_slot + 1, rf"slot {last_slot + 1} is outside the state's reserved range of {last_slot + 1} slots"),
        ("pa", True, r"object_id must be an integer, got True"),
        ("pa", 1.0, r"object_id must be an integer, got 1.0"),
        ("fx", 0, r"'fx' is not a pooled state"),
        (["pa"], 0, r"\['pa'\] is not a pooled state"),
    ]:
        with pytest.raises(ApiError, match=message):
            rt.state_object_address(state, object_id)
