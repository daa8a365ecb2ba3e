"""The runtime's device pool (`DevicePool`, held as `Runtime.kv`): leases, checkpoints, forks, remaps and the host tier, executed on the device.

The runtime owns one kern_pool `Pool` over its layout; every request goes to the pool (which decides)
and the returned plan is executed before the call returns:

* handle plans (`Copies`: zero pages / slots, copy pages / slots) on the compute stream, coalesced
  into runs (pool_exec.py), so every later launch sees them done;
* remap plans on a background thread (remap.py). A request the free lists cannot serve raises
  kern_pool's `Remapping` with the plan; the runtime starts it at once and, with `wait=True` (the
  default), blocks in `settle()` and asks again, so the caller sees only `Busy` / `ExceedsPool` /
  `Misuse`; with `wait=False` it re-raises `Remapping` and the plan is collected (new objects zeroed
  on the stream, `Pool.land`) at the next `lease` / `checkpoint` / `lease_from` / `fork` / `wake`;
* host copies (host_tier.py) on the transfer stream, or on the compute stream for `park_now` /
  `wake_now`;
* plans another pool decided (K3: the head rank's, for ranks holding the same ids): `copy(copies)`,
  `copy_out(park plan)`, `copy_in(wake plan)` check every id against this runtime's mapped pages / slots
  and host tier before issuing anything, then run on the compute stream; this runtime's own pool and
  host accounting are not consulted or changed.

The host tier is sized by counts (`reserve_host(pages, slots)`) or by bytes
(`reserve_host_bytes(host_bytes, turn_tokens)`, the counts of `host_split(host_bytes, turn_tokens)`).

The handles it hands out (handles.py) wrap kern_pool's; `PoolState` / `HostState` (pooled.py) hold the
arena, the remap worker and the host tier.
"""


from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import kern_pool
import numpy as np
from kern_pool import Busy, Closed, Layout, Misuse, Pool, Remapping
from kern_pool.errors import check_count

from ..cuda.driver import call
from ..errors import ApiError, int_arg
from .handles import DeviceCheckpoint, DeviceLease, DeviceWaking
from .host_tier import (
    HostGeometry,
    PinnedHost,
    check_host_copies,
    gpu_pci_bus_id,
    issue_copies,
    new_event,
    numa_target,
)
from .pool_exec import check_copies
from .pooled import HostState, PoolState

T = TypeVar("T")
MAX_PLANS_PER_REQUEST = 4  # a request needs at most one plan; a few more tolerate plans left by others


class DevicePool:
    """The runtime's device KV / state pool: kern_pool decides, this executes (see the module docstring).

    `state`: the pooled states' `PoolState` (None when the manifest declares no paged or per-seq state: every
    call then raises ApiError); `stream`: the compute stream; `gpu`: the device ordinal (NUMA placement of the
    host tier); `activate()`: makes the runtime's context current and raises ApiError once it is closed."""

    def __init__(self, state: PoolState | None, stream: Any, gpu: int, activate: Callable[[], None]) -> None:
        self._state = state
        self.stream = stream
        self.gpu = gpu
        self._activate = activate

    # ------------------------------------------------------------ plumbing

    def _ps(self) -> PoolState:
        self._activate()
        ps = self._state
        if ps is None:
            raise ApiError("the manifest declares no paged or per-seq states: there is no pool")
        return ps

    def _own_lease(self, lease: Any, what: str) -> DeviceLease:
        """`lease` if it is a kern_runtime `Lease` of this runtime, else kern_pool `Misuse` (the pool
        layer refuses a closed one with `Closed`)."""
        if not isinstance(lease, DeviceLease):
            raise Misuse(f"{what} needs a kern_runtime DeviceLease of this runtime, got {type(lease).__name__}")
        if lease._owner is not self:
            raise Misuse(f"{what} with a lease of another pool (another runtime)")
        return lease

    @staticmethod
    def _own_checkpoint(checkpoint: Any, what: str) -> DeviceCheckpoint:
        """`checkpoint` if it is a kern_runtime `Checkpoint`, else kern_pool `Misuse` (the pool layer
        refuses one of another pool with `Misuse`, a closed one with `Closed`)."""
        if not isinstance(checkpoint, DeviceCheckpoint):
            raise Misuse(f"{what} needs a kern_runtime DeviceCheckpoint, got {type(checkpoint).__name__}")
        return checkpoint

    def _own_parked(self, hs: HostState, parked: Any, what: str) -> kern_pool.Parked:
        """`parked` if it is a kern_pool `Parked` of this runtime's host tier, else `Misuse`."""
        if not isinstance(parked, kern_pool.Parked):
            raise Misuse(f"{what} needs a Parked (from park / park_now), got {type(parked).__name__}")
        if parked.host is not hs.host:
            raise Misuse(f"{what} of a parked entry of another host (another runtime)")
        return parked

    def _own_waking(self, waking: Any, what: str) -> DeviceWaking:
        """`waking` if it is a kern_runtime `Waking` of this runtime, else `Misuse`."""
        if not isinstance(waking, DeviceWaking):
            raise Misuse(f"{what} needs a kern_runtime DeviceWaking (from wake), got {type(waking).__name__}")
        if waking._owner is not self:
            raise Misuse(f"{what} of a waking of another host (another runtime)")
        return waking

    def _pool_request(self, fn: Callable[[Pool], T], wait: bool) -> T:
        ps = self._ps()
        ps.collect(self.stream)
        for _ in range(MAX_PLANS_PER_REQUEST):
            try:
                return fn(ps.pool)
            except Remapping as exc:
                ps.start_remap(exc.plan, self.stream)
                if not wait:
                    raise
                ps.collect(self.stream, block=True)
        raise AssertionError("kern bug: a request kept asking for remap plans")

    @property
    def kern_pool(self) -> Pool:
        """The kern_pool `Pool` deciding this runtime's pages and slots (read-only use: counts, check())."""
        return self._ps().pool

    @property
    def scratch_slot_id(self) -> int | None:
        """Per-seq slot padded rows index (0); None without per-seq states."""
        ps = self._state
        return ps.pool.scratch_slot_id if ps is not None else None

    def settle(self) -> None:
        """Block until the remap plan in flight has landed (new objects zeroed) and every park in
        flight has landed (its device pages returned)."""
        self._ps().collect(self.stream, block=True)

    def state_object_address(self, state: str, object_id: int) -> int:
        """Device address of page / slot `object_id` of pooled state `state` (tests, tools). Raises ApiError for a
        state that is not pooled, and for an `object_id` that is not an integer (a bool included) or whose object
        lies outside the state's reserved range (`0 <= object_id < va_bytes_per_state // object bytes`): an id
        whose address would be another state's memory, or none. The id need not be mapped now."""
        ps = self._ps()
        if not isinstance(state, str) or state not in ps.layout.states:
            raise ApiError(f"{state!r} is not a pooled state; pooled: {list(ps.layout.states)}")
        i = ps.layout.states.index(state)
        n_paged = len(ps.layout.page_bytes)
        size = ps.layout.page_bytes[i] if i < n_paged else ps.layout.slot_bytes[i - n_paged]
        object_id = int_arg(object_id, f"state_object_address({state!r}): object_id")
        count = ps.layout.va_bytes_per_state // size
        if not 0 <= object_id < count:
            kind = "page" if i < n_paged else "slot"
            raise ApiError(f"state_object_address({state!r}): {kind} {object_id} is outside the state's reserved "
                           f"range of {count} {kind}s")
        return ps.arena.state_base(i) + object_id * size

    # ------------------------------------------------------------ leases and checkpoints

    def lease(self, num_tokens: int, *, wait: bool = True) -> DeviceLease:
        """A fresh sequence: pages for `num_tokens` tokens and (with per-seq states) a zeroed slot.

        Raises kern_pool `Busy` (evict something), `ExceedsPool`, `Misuse`, and `Remapping` only with
        `wait=False`. The zeroing is enqueued on the compute stream before this returns.
        """
        lease = self._pool_request(lambda pool: pool.lease(num_tokens), wait)
        self._state.run(lease.plan, self.stream)  # type: ignore[union-attr]
        return DeviceLease(self, lease)

    def lease_slot(self, *, wait: bool = True) -> DeviceLease:
        """A slot-only lease (no pages), its slot zeroed on the compute stream."""
        lease = self._pool_request(lambda pool: pool.lease_slot(), wait)
        self._state.run(lease.plan, self.stream)  # type: ignore[union-attr]
        return DeviceLease(self, lease)

    def checkpoint(self, lease: DeviceLease, num_tokens: int, *, wait: bool = True) -> DeviceCheckpoint:
        """Keep the first `num_tokens` tokens of `lease` (which keeps running); the slot is copied on
        the compute stream, after every launch already enqueued (so checkpoint at the lease's current
        position when it has per-seq state). Raises kern_pool `Misuse` (not a Lease of this runtime, bad
        length), `Closed`, `Busy`, `ExceedsPool`."""
        self._own_lease(lease, "checkpoint()")
        cp = self._pool_request(lambda pool: pool.checkpoint(lease.inner, num_tokens), wait)
        self._state.run(cp.plan, self.stream)  # type: ignore[union-attr]
        return DeviceCheckpoint(cp)

    def retire(self, lease: DeviceLease, num_tokens: int) -> DeviceCheckpoint | None:
        """End `lease`, keeping its first `num_tokens` tokens without a copy (None if already closed).
        Raises kern_pool `Misuse` (not a Lease of this runtime, bad length)."""
        self._own_lease(lease, "retire()")
        ps = self._ps()
        ps.collect(self.stream)
        cp = ps.pool.retire(lease.inner, num_tokens)
        return DeviceCheckpoint(cp) if cp is not None else None

    def lease_from(self, checkpoint: DeviceCheckpoint, num_tokens: int, *, prefix_tokens: int | None = None,
                   hold: Any = None, wait: bool = True) -> DeviceLease:
        """A new sequence resuming `checkpoint` (at `prefix_tokens`, default all of it) with pages for
        `num_tokens` tokens; a mid-page prefix copies that page, the slot is copied (compute stream).
        Raises kern_pool `Misuse` (not a Checkpoint of this runtime, bad lengths), `Closed`, `Busy`,
        `ExceedsPool`."""
        self._own_checkpoint(checkpoint, "lease_from()")
        lease = self._pool_request(
            lambda pool: pool.lease_from(checkpoint.inner, num_tokens, prefix_tokens=prefix_tokens, hold=hold), wait)
        self._state.run(lease.plan, self.stream)  # type: ignore[union-attr]
        return DeviceLease(self, lease)

    def fork(self, parent: DeviceLease, prefix_tokens: int, num_tokens: int, *, wait: bool = True) -> DeviceLease:
        """A new sequence sharing the first `prefix_tokens` tokens of the live `parent`. Raises kern_pool
        `Misuse` (not a Lease of this runtime, bad lengths), `Closed`, `Busy`, `ExceedsPool`."""
        self._own_lease(parent, "fork()")
        lease = self._pool_request(lambda pool: pool.fork(parent.inner, prefix_tokens, num_tokens), wait)
        self._state.run(lease.plan, self.stream)  # type: ignore[union-attr]
        return DeviceLease(self, lease)

    def block_table(self, leases: Sequence[DeviceLease | None], width: int, rows: int | None = None) -> np.ndarray:
        """i32[rows, width]: row r is `leases[r]`'s page ids (`seq_line`); rows past the leases and
        None entries are all scratch page (padding of a captured program).

        Raises ApiError (`leases` not a list or tuple, `width` not an int >= 1, `rows` not an int >= the
        number of leases, a lease's pages exceed the width), kern_pool `Misuse` (an entry that is neither
        None nor a Lease of this runtime), `Closed` (a closed lease)."""
        ps = self._ps()
        if not isinstance(leases, (list, tuple)):
            raise ApiError(f"block_table needs a list of leases (or None), got {type(leases).__name__}")
        width = int_arg(width, "block_table width", 1)
        rows = len(leases) if rows is None else int_arg(rows, "block_table rows", 0)
        if rows < len(leases):
            raise ApiError(f"{len(leases)} leases for {rows} block-table rows")
        for r, lease in enumerate(leases):
            if lease is not None:
                self._own_lease(lease, f"block_table leases[{r}]")
                if lease.closed:
                    raise Closed(f"block_table leases[{r}] is closed")
        scratch = ps.pool.scratch_page_id or 0
        table = np.full((rows, width), scratch, dtype=np.int32)
        for r, lease in enumerate(leases):
            if lease is not None:
                lease.seq_line(table, r)
        return table

    # ------------------------------------------------------------ host tier

    def reserve_host(self, pages: int, slots: int = 0) -> int:
        """One pinned allocation for `pages` host pages and `slots` host slots (state-major layout,
        host_tier.py), NUMA-preferred to the GPU's node on multi-node machines; a transfer stream.
        Returns the bytes allocated. Raises ApiError when called twice or when the tier would exceed the
        machine's physical memory (`os.sysconf` pages x page size; pinned memory cannot be swapped out), kern_pool
        `Misuse` when `pages` or `slots` is not an int >= 0 (both before anything is allocated)."""
        ps = self._ps()
        _no_host_yet(ps)
        pages = check_count(pages, "reserve_host pages")
        slots = check_count(slots, "reserve_host slots")
        return self._reserve_host(ps, pages, slots, f"reserve_host({pages}, {slots})")

    def host_units(self, host_bytes: int, turn_tokens: int) -> int:
        """Whole host units in `host_bytes` for this runtime's layout (kern_pool `host_units`): one unit is
        the pages of one turn of `turn_tokens` tokens plus one slot (pages alone without per-seq states, one
        slot alone without paged states). Raises kern_pool `Misuse` for `host_bytes` not an int >= 0 or
        `turn_tokens` not an int >= 1, ApiError without pooled states."""
        ps = self._ps()
        host_bytes, turn_tokens = _host_bytes_args(host_bytes, turn_tokens, "host_units")
        return kern_pool.host_units(host_bytes, ps.layout, turn_tokens)

    def host_split(self, host_bytes: int, turn_tokens: int) -> tuple[int, int]:
        """`(host pages, host slots)` that `host_bytes` of pinned memory hold for this runtime's layout
        (kern_pool `host_split`: `host_units` units of `ceil(turn_tokens / page_tokens)` pages + one slot;
        a pure-KV layout gives every byte to pages, a layout without paged states to slots). Pure: nothing
        is allocated; `reserve_host(*rt.host_split(b, t))` is `reserve_host_bytes(b, t)`. Raises like
        `host_units`."""
        ps = self._ps()
        host_bytes, turn_tokens = _host_bytes_args(host_bytes, turn_tokens, "host_split")
        return kern_pool.host_split(host_bytes, ps.layout, turn_tokens)

    def reserve_host_bytes(self, host_bytes: int, turn_tokens: int) -> int:
        """`reserve_host` with the counts `host_split(host_bytes, turn_tokens)` gives (the spec's
        `--host-gib` bytes with one slot per `--host-turn` tokens of pages). Returns the bytes allocated:
        at most `host_bytes`, less than one unit short of it. Raises ApiError when called twice, when
        `host_bytes` holds no unit at all (the message gives a unit's bytes) or when the tier would exceed
        the machine's physical memory; kern_pool `Misuse` for `host_bytes` not an int >= 0 or `turn_tokens`
        not an int >= 1; all before anything is allocated."""
        ps = self._ps()
        _no_host_yet(ps)
        host_bytes, turn_tokens = _host_bytes_args(host_bytes, turn_tokens, "reserve_host_bytes")
        pages, slots = kern_pool.host_split(host_bytes, ps.layout, turn_tokens)
        what = f"reserve_host_bytes({host_bytes}, {turn_tokens})"
        if pages == 0 and slots == 0:
            unit_bytes, unit = _smallest_unit(ps.layout, turn_tokens)
            raise ApiError(f"{what}: {host_bytes} bytes hold no host unit; one unit ({unit}) is {unit_bytes} bytes")
        return self._reserve_host(ps, pages, slots, f"{what} -> {pages} pages + {slots} slots")

    def _reserve_host(self, ps: PoolState, pages: int, slots: int, what: str) -> int:
        geometry = HostGeometry(pages, slots, ps.layout.page_bytes, ps.layout.slot_bytes)
        physical = host_memory_bytes()
        if physical is not None and geometry.total_bytes > physical:
            raise ApiError(f"{what}: {geometry.total_bytes} bytes of pinned memory "
                           f"({ps.layout.page_bytes} per page, {ps.layout.slot_bytes} per slot) exceed this "
                           f"machine's {physical} bytes of physical memory")
        device = call("cuDeviceGet", self.gpu)
        node = numa_target(gpu_pci_bus_id(device))
        memory = PinnedHost(geometry.total_bytes, node)
        stream = None
        try:
            stream = call("cuStreamCreate", 1)  # non-blocking: never synchronises with the NULL stream
            # 0: never fold states into one 2-D copy; the driver refuses 2-D copies across the arena's
            # separate VMM mappings (host_tier module docstring), so each state's run is a 1-D copy.
            max_pitch = 0
            ps.host = HostState(ps.pool, memory, geometry, stream, max_pitch)
        except BaseException:
            if stream is not None:
                call("cuStreamDestroy", stream)
            memory.close()
            raise
        return geometry.total_bytes

    def _hs(self) -> tuple[PoolState, HostState]:
        ps = self._ps()
        if ps.host is None:
            raise ApiError("no host tier: call reserve_host(pages, slots) first")
        return ps, ps.host

    @property
    def host_tier(self) -> kern_pool.Host:
        """kern_pool's `Host` accounting of the host tier (counts; read-only use)."""
        return self._hs()[1].host

    @property
    def host_memory(self) -> PinnedHost:
        """The pinned allocation (tests read it through `.view()`)."""
        return self._hs()[1].memory

    def room(self, checkpoint: DeviceCheckpoint) -> kern_pool.Room:
        """Reserve host units for `checkpoint`. Raises `Busy` (err.checkpoint is `checkpoint`, untouched),
        `ExceedsPool`, `Misuse` (not a Checkpoint of this runtime), `Closed`."""
        self._own_checkpoint(checkpoint, "room()")
        ps, hs = self._hs()
        ps.collect(self.stream)
        try:
            return hs.host.room(checkpoint.inner)
        except Busy as exc:
            raise Busy(str(exc), checkpoint=checkpoint) from None

    def _transfer_after_compute(self, hs: HostState) -> None:
        event = new_event()
        call("cuEventRecord", event, self.stream)
        call("cuStreamWaitEvent", hs.stream, event, 0)
        call("cuEventDestroy", event)  # the wait keeps what it needs

    def park(self, room: kern_pool.Room) -> kern_pool.Parked:
        """Copy the room's checkpoint to the host on the transfer stream (after everything queued on
        the compute stream). The checkpoint's device pages and slot return when the copy lands (`landed`,
        `settle`, or any later pool call that finds it done), even if the checkpoint is closed before
        (kern_pool's park holds them)."""
        ps, hs = self._hs()
        parked = hs.host.park(room)
        copies = hs.copies(parked.plan, ps.pages, ps.slots)
        self._transfer_after_compute(hs)
        issue_copies(copies, hs.stream)
        event = new_event()
        call("cuEventRecord", event, hs.stream)
        hs.parks.append((parked, event))
        return parked

    def park_now(self, checkpoint: DeviceCheckpoint) -> kern_pool.Parked:
        """room + park on the compute stream: the checkpoint's pages return at once (later launches
        are ordered after the copy). Raises like `room`."""
        self._own_checkpoint(checkpoint, "park_now()")
        ps, hs = self._hs()
        ps.collect(self.stream)
        try:
            parked = hs.host.park(hs.host.room(checkpoint.inner))
        except Busy as exc:
            raise Busy(str(exc), checkpoint=checkpoint) from None
        issue_copies(hs.copies(parked.plan, ps.pages, ps.slots), self.stream)
        parked.land()
        return parked

    def wake(self, parked: kern_pool.Parked, num_tokens: int, lease_tokens: int, *, hold: Any = None,
             wait: bool = True) -> DeviceWaking:
        """Lease `lease_tokens` tokens of pages and fill the first `num_tokens` from `parked` on the
        transfer stream (after everything queued on the compute stream). `awake` hands out the lease.
        A `parked` whose park has not landed (its own copy, or a park whose host pages it reuses): with
        `wait` this blocks until the parks in flight land; else kern_pool `NotLanded`, nothing issued."""
        ps, hs = self._hs()
        _after_parks(hs, parked, wait)
        inner = self._pool_request(lambda pool: hs.host.wake(parked, num_tokens, lease_tokens, hold=hold), wait)
        self._transfer_after_compute(hs)
        ps.run(inner.lease_copies, hs.stream)  # zero a slot the host does not fill
        issue_copies(hs.copies(inner.plan, ps.pages, ps.slots), hs.stream)
        event = new_event()
        call("cuEventRecord", event, hs.stream)
        return DeviceWaking(self, inner, event)

    def landed(self, item: kern_pool.Parked | DeviceWaking) -> bool:
        """Non-blocking: have the copies of a park or a wake landed? (A landed park returns its pages.)
        Raises kern_pool `Misuse` for anything but a Parked or Waking of this runtime."""
        ps, hs = self._hs()
        if isinstance(item, DeviceWaking):
            return self._own_waking(item, "landed()").landed
        self._own_parked(hs, item, "landed()")
        hs.poll()
        return item.landed

    def awake(self, waking: DeviceWaking) -> DeviceLease | None:
        """The woken lease once its copies have landed, else None (never blocks). The lease is handed
        out once: a successful awake consumes the Waking (runtime.md: awake(waking) -> DeviceLease).
        Raises kern_pool `Misuse` (not a Waking of this runtime), `Closed` (the Waking or its lease was
        closed, or the Waking was already awakened)."""
        self._activate()
        self._own_waking(waking, "awake()")
        if waking.inner.lease_closed:
            raise Closed("awake() of a closed Waking (or of one whose lease was closed)")
        if waking.inner.taken:  # its lease went to an earlier awake: a second wrapper would share it
            raise Closed("awake() of a Waking already awakened: awake consumes it, the lease was handed out once")
        if not waking.landed:
            return None
        return DeviceLease(self, waking.inner.lease)

    def wake_now(self, parked: kern_pool.Parked, num_tokens: int, lease_tokens: int, *, hold: Any = None,
                 wait: bool = True) -> DeviceLease:
        """`wake` with the copies on the compute stream: the lease is usable at once. The compute stream never
        waits for the transfer stream: a `parked` whose park has not landed is waited for on the host (`wait`)
        or refused (kern_pool `NotLanded`), as in `wake`."""
        ps, hs = self._hs()
        _after_parks(hs, parked, wait)
        inner = self._pool_request(lambda pool: hs.host.wake(parked, num_tokens, lease_tokens, hold=hold), wait)
        ps.run(inner.lease_copies, self.stream)
        issue_copies(hs.copies(inner.plan, ps.pages, ps.slots), self.stream)
        inner.land()
        return DeviceLease(self, inner.lease)

    # ------------------------------------------------------------ plans decided elsewhere (K3)

    def copy(self, copies: kern_pool.Copies) -> None:
        """Execute a `kern_pool.Copies` that another pool decided (the head rank's, for ranks / segments
        holding the same page and slot ids) on this runtime's pooled states: zero first, then copy, on the
        compute stream, coalesced like this runtime's own plans (one call per state per run).

        Every id is checked before anything is issued: an int naming a page / slot mapped here now (not a
        hole, not one a remap in flight adds or removes) and not the scratch page / slot (the pool never
        leases those, so no plan names them); no destination written twice and no source that is also a
        destination. Raises kern_pool `Misuse` (not a `Copies`, a bad id), ApiError without pooled states.
        Which ids hold what is the plan's owner's business: this runtime's own pool is not consulted or
        changed."""
        ps = self._ps()
        ps.collect(self.stream)
        check_copies(copies, _device_id_check(ps.pool, "page"), _device_id_check(ps.pool, "slot"))
        ps.run(copies, self.stream)

    def copy_out(self, plan: kern_pool.HostCopies) -> None:
        """`copy` across the host boundary, device -> host: execute another pool's `"park"` `HostCopies`
        (device page / slot ids -> this runtime's host page / slot ids) on the compute stream (ordered like
        `park_now`: later launches may reuse the pages at once). Device ids are checked as in `copy`, host
        ids against this runtime's host tier (`reserve_host`), before anything is issued. Raises kern_pool
        `Misuse` (not a `HostCopies`, a `"wake"` plan, a bad id), ApiError (no host tier). This runtime's
        host accounting (`host_tier`) is not consulted or changed."""
        self._copy_host(plan, "park", "copy_out()")

    def copy_in(self, plan: kern_pool.HostCopies) -> None:
        """`copy_out`'s mirror, host -> device: execute another pool's `"wake"` `HostCopies` (host ids ->
        device ids) on the compute stream (like `wake_now`). Refusals as `copy_out` (a `"park"` plan is
        `Misuse`)."""
        self._copy_host(plan, "wake", "copy_in()")

    def _copy_host(self, plan: kern_pool.HostCopies, direction: str, what: str) -> None:
        ps, hs = self._hs()
        ps.collect(self.stream)
        check_host_copies(plan, direction, _device_id_check(ps.pool, "page"), _device_id_check(ps.pool, "slot"),
                          hs.geometry, what)
        issue_copies(hs.copies(plan, ps.pages, ps.slots), self.stream)


def _after_parks(hs: Any, parked: Any, wait: bool) -> None:
    """A wake reads host pages that a park in flight may still be writing; kern_pool refuses it (`NotLanded`)
    until that park has landed. With `wait`, block until every park in flight has landed first."""
    if wait and isinstance(parked, kern_pool.Parked) and not parked.closed and not parked.landed:
        hs.poll(block=True)


def _no_host_yet(ps: PoolState) -> None:
    if ps.host is not None:
        raise ApiError("reserve_host() was already called: the host tier is allocated once")


def _host_bytes_args(host_bytes: Any, turn_tokens: Any, what: str) -> tuple[int, int]:
    """(host_bytes, turn_tokens) as ints, or kern_pool `Misuse` naming `what` (before anything is allocated)."""
    return check_count(host_bytes, f"{what} host_bytes"), check_count(turn_tokens, f"{what} turn_tokens", 1)


def _smallest_unit(layout: Layout, turn_tokens: int) -> tuple[int, str]:
    """Bytes and wording of the smallest amount `host_split` turns into something: a turn's pages plus one
    slot; one page without per-seq states (every byte to pages); one slot without paged states."""
    page, slot = sum(layout.page_bytes), sum(layout.slot_bytes)
    if not slot:
        return page, f"one page of {layout.page_tokens} tokens"
    if not page:
        return slot, "one slot"
    turn_pages = -(-turn_tokens // layout.page_tokens)
    return turn_pages * page + slot, f"{turn_pages} pages of {layout.page_tokens} tokens + one slot"


def _device_id_check(pool: Pool, name: str) -> Callable[[int], str | None]:
    """Which page (or slot) ids a plan executed here may name: mapped now (free or held; not a hole, not
    added or removed by a remap in flight) and not scratch. Reads kern_pool's per-id refcounts (>= 0:
    mapped; `Pool.refcounts`), so each check is O(1)."""
    refs = pool.refcounts(name)
    scratch = pool.scratch_page_id if name == "page" else pool.scratch_slot_id

    def why(oid: int) -> str | None:
        if oid == scratch:
            return f"{name} {oid} is the scratch {name} (never leased, so never in a plan)"
        if oid >= len(refs) or refs[oid] < 0:
            mapped = sum(1 for r in refs if r >= 0)
            return (f"{name} {oid} is not mapped on this runtime ({mapped} {name}s mapped, ids below {len(refs)}; "
                    "a hole, or added / removed by a remap in flight)")
        return None
    return why


def host_memory_bytes() -> int | None:
    """Physical memory of this machine in bytes (`SC_PHYS_PAGES` x `SC_PAGE_SIZE`), None where the OS does not
    say."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * size if pages > 0 and size > 0 else None
