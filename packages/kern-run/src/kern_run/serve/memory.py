"""KV memory the scheduler leases from: kern_pool's public API, with park and wake landing asynchronously.

`KvMemory` is the slice of the pool API the scheduler uses. Two implementations:

- `PoolMemory`: a bare kern_pool `Pool` (and optionally a `Host`), the plans not executed (tests, the fake
  engine). Park and wake copies "land" `land_after` polls after they were issued, so the scheduler is tested
  against copies that are still in flight (an unlanded park holds its device pages; an unlanded wake's lease
  is not usable).
- `RuntimeMemory`: a kern_runtime `Runtime` (executes every plan on the device; `park` / `wake` copy on its
  transfer stream and land when their events complete).

Park and wake are asynchronous with explicit landing: `park` returns a `Parked` whose pages return only once
it lands (`landed`); `wake` returns a waking handle whose lease `awake` hands out once it lands (None before).
`poll()` is called once per scheduler step to land what has finished.
"""

from __future__ import annotations

from typing import Any, Protocol

import kern_pool


class KvMemory(Protocol):
    """Leases, checkpoints and the host tier (docs/pool.md). Errors are kern_pool's: `Busy` (evict or wait),
    `Remapping` (wait), `ExceedsPool` (never fits), `NotLanded` (a park not landed yet)."""

    page_tokens: int

    @property
    def has_host(self) -> bool: ...

    def lease(self, num_tokens: int) -> Any: ...

    def lease_from(self, kept: Any, num_tokens: int, *, prefix_tokens: int, hold: Any) -> Any: ...

    def grow(self, lease: Any, num_tokens: int) -> None: ...

    def checkpoint(self, lease: Any, num_tokens: int) -> Any: ...

    def room(self, kept: Any) -> Any: ...

    def park(self, room: Any) -> Any: ...

    def landed(self, parked: Any) -> bool: ...

    def wake(self, parked: Any, num_tokens: int, lease_tokens: int, *, hold: Any) -> Any: ...

    def awake(self, waking: Any) -> Any | None: ...

    def poll(self) -> None: ...

    @property
    def parks_in_flight(self) -> int: ...

    @property
    def pages_in_use(self) -> int: ...


class PlanExecutor(Protocol):
    """Carries out kern_pool's plans on some memory (fake_engine.FakeEngine keeps a simulated KV store)."""

    def run(self, copies: kern_pool.Copies) -> None: ...

    def host_copies(self, copies: kern_pool.HostCopies) -> None: ...


class PoolMemory:
    """`KvMemory` over a kern_pool `Pool` and optional `Host`. `executor`: runs each plan as it is decided (None:
    plans not executed, pure accounting). `land_after`: polls before a park or wake lands (0: at once, inside
    the call)."""

    def __init__(self, pool: kern_pool.Pool, host: kern_pool.Host | None = None, land_after: int = 0,
                 executor: PlanExecutor | None = None) -> None:
        self.pool = pool
        self.host = host
        self.page_tokens = pool.page_tokens
        self.land_after = land_after
        self.executor = executor
        self._flying: list[list[Any]] = []  # [item, polls left]

    def _run(self, handle: Any) -> Any:
        if self.executor is not None:
            self.executor.run(handle.plan)
        return handle

    @property
    def has_host(self) -> bool:
        return self.host is not None

    def lease(self, num_tokens: int) -> Any:
        return self._run(self.pool.lease(num_tokens))

    def lease_from(self, kept: Any, num_tokens: int, *, prefix_tokens: int, hold: Any) -> Any:
        return self._run(self.pool.lease_from(kept, num_tokens, prefix_tokens=prefix_tokens, hold=hold))

    def grow(self, lease: Any, num_tokens: int) -> None:
        self.pool.grow(lease, num_tokens)

    def checkpoint(self, lease: Any, num_tokens: int) -> Any:
        return self._run(self.pool.checkpoint(lease, num_tokens))

    def room(self, kept: Any) -> Any:
        assert self.host is not None
        return self.host.room(kept)

    def park(self, room: Any) -> Any:
        assert self.host is not None
        parked = self.host.park(room)
        if self.executor is not None:
            self.executor.host_copies(parked.plan)
        self._launch(parked)
        return parked

    def landed(self, parked: Any) -> bool:
        return bool(parked.landed)

    def wake(self, parked: Any, num_tokens: int, lease_tokens: int, *, hold: Any) -> Any:
        assert self.host is not None
        if not parked.landed:  # the host tier's own rule may say so too; the scheduler treats both alike
            raise kern_pool.NotLanded(f"{parked!r}: its park has not landed; it cannot be woken yet")
        waking = self.host.wake(parked, num_tokens, lease_tokens, hold=hold)
        if self.executor is not None:
            self.executor.run(waking.lease_copies)
            self.executor.host_copies(waking.plan)
        self._launch(waking)
        return waking

    def awake(self, waking: Any) -> Any | None:
        return waking.lease if waking.landed else None

    def _launch(self, item: Any) -> None:
        if self.land_after == 0:
            item.land()
        else:
            self._flying.append([item, self.land_after])

    def poll(self) -> None:
        still = []
        for entry in self._flying:
            item = entry[0]
            if isinstance(item, kern_pool.Parked) and item.closed:  # dropped before landing (settled)
                continue
            entry[1] -= 1
            if entry[1] > 0:
                still.append(entry)
                continue
            try:
                item.land()
            except kern_pool.Closed:  # a Waking closed before landing (its request was cancelled)
                pass
        self._flying = still

    @property
    def parks_in_flight(self) -> int:
        return sum(1 for item, _ in self._flying if isinstance(item, kern_pool.Parked) and not item.landed)

    @property
    def pages_in_use(self) -> int:
        return self.pool.held_pages


class RuntimeMemory:
    """`KvMemory` over a kern_runtime `Runtime` (its pool; plans executed on its streams). `has_host`: the runtime
    already has a host tier (else `reserve_host_bytes` pins one)."""

    def __init__(self, rt: Any, has_host: bool = False) -> None:
        self.rt = rt
        self.page_tokens = int(rt.kern_pool.page_tokens)
        self._has_host = has_host
        self._parks: list[Any] = []

    def reserve_host_bytes(self, host_bytes: int, turn_tokens: int) -> int:
        """Pin the host tier (`Runtime.reserve_host_bytes`); returns the bytes pinned."""
        nbytes = self.rt.reserve_host_bytes(host_bytes, turn_tokens)
        self._has_host = True
        return int(nbytes)

    @property
    def has_host(self) -> bool:
        return self._has_host

    def lease(self, num_tokens: int) -> Any:
        return self.rt.lease(num_tokens)

    def lease_from(self, kept: Any, num_tokens: int, *, prefix_tokens: int, hold: Any) -> Any:
        return self.rt.lease_from(kept, num_tokens, prefix_tokens=prefix_tokens, hold=hold)

    def grow(self, lease: Any, num_tokens: int) -> None:
        lease.grow(num_tokens)

    def checkpoint(self, lease: Any, num_tokens: int) -> Any:
        return self.rt.checkpoint(lease, num_tokens)

    def room(self, kept: Any) -> Any:
        return self.rt.room(kept)

    def park(self, room: Any) -> Any:
        parked = self.rt.park(room)
        self._parks.append(parked)
        return parked

    def landed(self, parked: Any) -> bool:
        return bool(self.rt.landed(parked))

    def wake(self, parked: Any, num_tokens: int, lease_tokens: int, *, hold: Any) -> Any:
        if not self.rt.landed(parked):
            raise kern_pool.NotLanded(f"{parked!r}: its park has not landed; it cannot be woken yet")
        return self.rt.wake(parked, num_tokens, lease_tokens, hold=hold)

    def awake(self, waking: Any) -> Any | None:
        return self.rt.awake(waking)

    def poll(self) -> None:
        self._parks = [p for p in self._parks if not p.closed and not self.rt.landed(p)]

    @property
    def parks_in_flight(self) -> int:
        return len(self._parks)

    @property
    def pages_in_use(self) -> int:
        return int(self.rt.kern_pool.held_pages)
