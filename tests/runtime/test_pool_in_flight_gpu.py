"""Host copies in flight on a GPU, byte for byte (issue 29, point 4).

`park` / `wake` share the transfer stream, `park_now` / `wake_now` run on the compute stream. Every mix of the
four, with the checkpoint or the parked entry closed while a copy reads it and other sequences writing the
pages freed meanwhile, must give back exactly the bytes written (the `check` kernel counts mismatching bytes of
every paged state and the slot). Manifest, kernels and helpers: test_pool_gpu.py.

Run on the H200:  KERN_REQUIRE_GPU=1 uv run --frozen pytest -q tests/runtime/test_pool_in_flight_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest
from test_pool_gpu import BPT, PT, host_page, kdir, mismatches, page_pattern, rt, write  # noqa: F401 - fixtures

from kern_runtime import Lease, Runtime
from kern_runtime.driver import call

pytestmark = pytest.mark.gpu


def awoken(rt: Runtime, waking: object) -> Lease:
    woken = None
    while woken is None:
        woken = rt.awake(waking)  # type: ignore[arg-type]
    return woken


def host_pages_hold(rt: Runtime, parked: object, num_tokens: int, salt: int) -> None:
    """The parked entry's host pages hold exactly the pattern of positions 0..num_tokens-1."""
    rt.settle()
    call("cuCtxSynchronize")
    for index, host_id in enumerate(parked.host_page_ids()):  # type: ignore[attr-defined]
        stop = min(PT, num_tokens - index * PT) * BPT  # bytes of the positions held in this page
        for tag in (0, 1):
            got, want = host_page(rt, tag, host_id)[:stop], page_pattern(tag, index * PT, salt)[:stop]
            assert np.array_equal(got, want), f"host page {host_id} of state {tag}"


def kept(rt: Runtime, salt: int) -> object:
    """A checkpoint of 40 tokens (pages 0..2 and the slot) written with `salt`, retired from its lease."""
    lease = rt.lease(40)
    write(rt, [(lease, 0, 40)], salt=salt)
    return rt.retire(lease, 40)


def settled(rt: Runtime) -> None:
    """Every copy landed, and the pool's and host tier's accounting exact."""
    rt.settle()
    rt.kern_pool.check()
    rt.host_tier.check()


@pytest.mark.parametrize("park", ["park", "park_now"])
@pytest.mark.parametrize("wake", ["wake", "wake_now"])
@pytest.mark.parametrize("close", [False, True], ids=["kept", "closed-in-flight"])
def test_every_mix_of_park_and_wake_is_byte_exact(rt: Runtime, park: str, wake: str, close: bool) -> None:
    rt.reserve_host(pages=8, slots=2)
    for i in range(20):
        salt = i % 7
        cp = kept(rt, salt)
        parked = rt.park(rt.room(cp)) if park == "park" else rt.park_now(cp)  # type: ignore[arg-type]
        if close:
            cp.close()  # type: ignore[attr-defined]  # a park in flight holds the pages and slot it reads
        victim = rt.lease(48)  # writes other bytes into pages freed meanwhile, right behind the park
        write(rt, [(victim, 0, 48)], salt=(salt + 3) % 7)
        victim.close()
        # wake waits for a park in flight (host side) before issuing; same for wake_now
        woken = awoken(rt, rt.wake(parked, 40, 48)) if wake == "wake" else rt.wake_now(parked, 40, 48)
        assert mismatches(rt, [(woken, 40)], salt) == [0], f"iteration {i}"
        host_pages_hold(rt, parked, 40, salt)
        woken.close()
        parked.close()
    settled(rt)


@pytest.mark.parametrize("wake", ["wake", "wake_now"])
def test_a_parked_entry_closed_under_its_wake_is_not_overwritten_by_the_next_park(rt: Runtime, wake: str) -> None:
    rt.reserve_host(pages=6, slots=2)
    for i in range(20):
        salt = i % 7
        parked = rt.park_now(kept(rt, salt))  # type: ignore[arg-type]
        waking = rt.wake(parked, 40, 48) if wake == "wake" else None
        woken = None if waking is not None else rt.wake_now(parked, 40, 48)
        parked.close()  # the wake in flight holds the host pages and slot it reads
        now = rt.park_now(kept(rt, (salt + 2) % 7))  # type: ignore[arg-type]  # compute stream: not the wake's pages
        if waking is not None:
            woken = awoken(rt, waking)
        assert mismatches(rt, [(woken, 40)], salt) == [0], f"iteration {i}"  # type: ignore[list-item]
        host_pages_hold(rt, now, 40, (salt + 2) % 7)
        woken.close()  # type: ignore[union-attr]
        now.close()
    settled(rt)


@pytest.mark.parametrize("wake", ["wake", "wake_now"])
def test_park_now_reusing_an_in_flight_parks_host_pages_wakes_byte_exact(rt: Runtime, wake: str) -> None:
    rt.reserve_host(pages=8, slots=2)
    for i in range(20):
        salt = i % 7
        lease = rt.lease(48)
        write(rt, [(lease, 0, 32)], salt=salt)
        first = rt.park(rt.room(rt.checkpoint(lease, 32)))  # pages 0, 1 on the transfer stream
        write(rt, [(lease, 32, 40)], salt=salt)
        second = rt.park_now(rt.checkpoint(lease, 40))  # only the tail page, on the compute stream
        assert len(second.plan.page_copies) == 1
        lease.close()
        woken = awoken(rt, rt.wake(second, 40, 48)) if wake == "wake" else rt.wake_now(second, 40, 48)
        assert mismatches(rt, [(woken, 40)], salt) == [0], f"iteration {i}"
        for h in (woken, first, second):
            h.close()
    settled(rt)
