"""The runtime's pool API: leases, checkpoints, forks, remaps and the host tier, executed on the device.

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

Handles here wrap kern_pool's (`Lease.inner`, `Checkpoint.inner`); closing or dropping one returns
its pages and slot to the pool at once: launches already enqueued that use them still run first,
because every later reuse (zeroing, copies, launches, wakes) is ordered after them on the streams.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

import kern_pool
from kern_pool import Busy, Closed, Layout, Misuse, Pool, Remapping
from kern_pool.errors import check_count

from .driver import call, cu
from .errors import ApiError, int_arg
from .host_tier import (
    HostGeometry, PinnedHost, check_host_copies, event_done, gpu_pci_bus_id, host_copies, issue_copies, new_event,
    numa_target,
)
from .pool_exec import ClassGeometry, check_copies, execute, plan_ops, zero_ops
from .remap import Arena, RemapWorker

T = TypeVar("T")
MAX_PLANS_PER_REQUEST = 4  # a request needs at most one plan; a few more tolerate plans left by others


class Lease:
    """A live sequence on the device: its page ids (block-table row), slot mapping and per-seq slot.

    Wraps a kern_pool `Lease` (`inner`); see docs/pool.md for the semantics of each field.
    """

    __slots__ = ("_rt", "inner", "__weakref__")

    def __init__(self, rt: Any, inner: kern_pool.Lease) -> None:
        self._rt = rt
        self.inner = inner

    def page_ids(self) -> list[int]:
        """Page ids in sequence order (the block-table row)."""
        return self.inner.page_ids()

    def slot(self, pos: int) -> int:
        """Slot-mapping value of position `pos`: page_id * page_tokens + pos % page_tokens (kern_pool refusals)."""
        return self.inner.slot(pos)

    @property
    def seq_slot_id(self) -> int | None:
        return self.inner.seq_slot_id

    @property
    def prefix_tokens(self) -> int:
        return self.inner.prefix_tokens

    @property
    def frozen_tokens(self) -> int:
        return self.inner.frozen_tokens

    @property
    def reached_tokens(self) -> int:
        """The position the sequence has reached (kern_pool `Lease.reached_tokens`); with a slot, checkpoint /
        fork / retire only at exactly this length."""
        return self.inner.reached_tokens

    def advance_to(self, num_tokens: int) -> None:
        """Declare the first `num_tokens` tokens consumed (kern_pool `Lease.advance_to`): for positions written
        without `slot` / `slots`, e.g. a slot-only lease. kern_pool `Misuse` going back or past the pages."""
        self.inner.advance_to(num_tokens)

    @property
    def paged(self) -> bool:
        return self.inner.paged

    @property
    def num_pages(self) -> int:
        return self.inner.num_pages

    @property
    def capacity_tokens(self) -> int:
        return self.inner.capacity_tokens

    @property
    def closed(self) -> bool:
        return self.inner.closed

    def slots(self, start: int, stop: int) -> np.ndarray:
        """i32[stop - start]: slot-mapping values of positions start..stop-1 (same refusals as `slot`)."""
        if stop > start:
            self.inner.slot(start)  # refuses frozen / out-of-range positions
            self.inner.slot(stop - 1)
        pages = np.asarray(self.inner.page_ids(), dtype=np.int64)
        pos = np.arange(start, stop)
        P = self.inner._pool.page_tokens
        return (pages[pos // P] * P + pos % P).astype(np.int32)

    def grow(self, num_tokens: int, *, wait: bool = True) -> None:
        """Reserve pages for `num_tokens` tokens in total (refusals as `Runtime.lease`)."""
        self._rt._pool_request(lambda pool: pool.grow(self.inner, num_tokens), wait)

    def seq_line(self, table: np.ndarray, row: int) -> np.ndarray:
        """Write this lease's page ids into `table[row]` (i32[rows, width]), the rest of the row the
        scratch page; returns the row. Raises ApiError when `table` is not a 2-D numpy array, `row` is
        not an integer in 0..rows-1 or the pages exceed the width; kern_pool `Closed` for a closed lease."""
        if not isinstance(table, np.ndarray) or table.ndim != 2:
            raise ApiError(f"seq_line needs a 2-D block table (numpy array [rows, width]), got "
                           f"{type(table).__name__}{list(table.shape) if isinstance(table, np.ndarray) else ''}")
        index = int_arg(row, "seq_line row")
        if not 0 <= index < table.shape[0]:
            raise ApiError(f"seq_line row {row!r} is outside the block table's {table.shape[0]} rows")
        ids = self.inner.page_ids()
        line = table[index]
        if len(ids) > line.shape[0]:
            raise ApiError(f"lease holds {len(ids)} pages; block-table row {index} has room for {line.shape[0]}")
        line[: len(ids)] = ids
        line[len(ids):] = self.inner._pool.scratch_page_id or 0
        return line

    def close(self) -> bool:
        return self.inner.close()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"runtime {self.inner!r}"


class Checkpoint:
    """A kept prefix on the device (wraps a kern_pool `Checkpoint`; `Prefix` can keep it)."""

    __slots__ = ("inner", "__weakref__")

    def __init__(self, inner: kern_pool.Checkpoint) -> None:
        self.inner = inner

    @property
    def num_tokens(self) -> int:
        return self.inner.num_tokens

    @property
    def has_slot(self) -> bool:
        return self.inner.has_slot

    @property
    def paged(self) -> bool:
        return self.inner.paged

    @property
    def seq_slot_id(self) -> int | None:
        return self.inner.seq_slot_id

    @property
    def closed(self) -> bool:
        return self.inner.closed

    def page_ids(self) -> list[int]:
        return self.inner.page_ids()

    def close(self) -> bool:
        return self.inner.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"runtime {self.inner!r}"


class Waking:
    """Pages being filled from the host on the transfer stream; `Runtime.awake` hands out the lease
    once the copies have landed. `close()` before that waits for the copies, then releases the pages."""

    __slots__ = ("_rt", "inner", "_event", "__weakref__")

    def __init__(self, rt: Any, inner: kern_pool.Waking, event: Any) -> None:
        self._rt, self.inner, self._event = rt, inner, event

    @property
    def landed(self) -> bool:
        if self.inner.landed:
            return True
        if self._event is not None and event_done(self._event):
            self._land()
        return self.inner.landed

    def _land(self) -> None:
        if self._event is not None:
            call("cuEventDestroy", self._event)
            self._event = None
        self.inner.land()

    def wait(self) -> None:
        """Block until the copies have landed."""
        if self._event is not None:
            call("cuEventSynchronize", self._event)
            self._land()

    def close(self) -> bool:
        self.wait()
        return self.inner.close()

    def __del__(self) -> None:
        # Dropped unclosed: wait for the copies before the lease's pages can be leased again (kern_pool's
        # settle hook would too, through the host state) and free the event.
        try:
            self.close()
        except Exception:  # the runtime and its context are gone: nothing is left in flight
            pass


class _HostState:
    def __init__(self, pool: Pool, memory: PinnedHost, geometry: HostGeometry, stream: Any, max_pitch: int) -> None:
        self.host = kern_pool.Host(pool, geometry.num_pages, geometry.num_slots, settle=self.settle)
        self.memory = memory
        self.geometry = geometry
        self.stream = stream
        self.max_pitch = max_pitch
        self.parks: list[tuple[kern_pool.Parked, Any]] = []  # in flight, with their copy events
        self.closed = False

    def settle(self, item: kern_pool.Parked | kern_pool.Waking) -> None:
        """kern_pool's hook for a park or wake closed (or dropped) before it landed: its device pages and
        host units are released only after this returns, so wait for every copy on the transfer stream."""
        if self.closed:
            return
        call("cuStreamSynchronize", self.stream)
        self.poll()

    def copies(self, plan: kern_pool.HostCopies, pages: ClassGeometry, slots: ClassGeometry) -> list[Any]:
        return host_copies(plan, pages, slots, self.geometry, self.memory.address, self.max_pitch)

    def poll(self, block: bool = False) -> None:
        """Land every park whose copies finished (all of them when `block`). The list is updated before any
        entry lands: landing releases a checkpoint, which may run a finalizer that polls again."""
        if block:
            for _, event in self.parks:
                call("cuEventSynchronize", event)
        done = [entry for entry in self.parks if block or event_done(entry[1])]
        if not done:
            return
        self.parks = [entry for entry in self.parks if not any(entry is d for d in done)]
        for parked, event in done:
            call("cuEventDestroy", event)
            parked.land()

    def close(self) -> None:
        self.poll(block=True)
        call("cuStreamSynchronize", self.stream)
        self.closed = True
        call("cuStreamDestroy", self.stream)
        self.memory.close()


class PoolState:
    """Everything the runtime keeps for its pooled states (see the module docstring)."""

    def __init__(self, layout: Layout, arena: Arena, context: Any, device_ordinal: int) -> None:
        self.layout = layout
        self.pool = Pool(layout)
        self.arena = arena
        self.worker = RemapWorker(arena, context)
        self.device_ordinal = device_ordinal
        n_paged = len(layout.page_bytes)
        self.pages = ClassGeometry(tuple(arena.state_base(i) for i in range(n_paged)), layout.page_bytes)
        self.slots = ClassGeometry(tuple(arena.state_base(n_paged + j) for j in range(len(layout.slot_bytes))),
                                   layout.slot_bytes)
        self.host: _HostState | None = None
        self.remapped: dict[str, int] = {}
        """Pooled state -> serial of the first remap plan that touched it (set when the plan starts: its
        thread may unmap at once). Whole-state access (state_access.py) is refused for these states."""

    @classmethod
    def create(cls, layout: Layout, device_ordinal: int, context: Any, stream: Any) -> PoolState:
        """Reserve + map the pooled states (zeroed on `stream`)."""
        mapping = Pool(layout).mapping()
        arena = Arena.create(layout, device_ordinal, mapping)
        try:
            for m in mapping:
                call("cuMemsetD8Async", arena.block_address(m), 0, arena.block_bytes, stream)
        except BaseException:
            arena.close()
            raise
        return cls(layout, arena, context, device_ordinal)

    def run(self, copies: kern_pool.Copies, stream: Any) -> None:
        if not copies.empty:
            execute(plan_ops(copies, self.pages, self.slots), stream)

    def start_remap(self, plan: kern_pool.RemapPlan, stream: Any) -> None:
        if self.worker.plan is plan:
            return
        if self.worker.busy:  # a finished plan not collected yet
            self.collect(stream, block=True)
        for name in remapped_states(self.layout, plan):
            self.remapped.setdefault(name, plan.serial)
        self.worker.start(plan, stream)

    def collect(self, stream: Any, block: bool = False) -> bool:
        """Land a finished remap plan (the new objects zeroed on `stream` first) and finished parks.
        True when a remap plan landed."""
        landed = False
        if self.worker.busy and (block or self.worker.done()):
            plan = self.worker.finish()
            execute(zero_ops(plan.zero_pages, self.pages) + zero_ops(plan.zero_slots, self.slots), stream)
            self.pool.land(plan)
            landed = True
        if self.host is not None:
            self.host.poll(block)
        return landed

    def close(self) -> None:
        try:
            if self.worker.busy:
                self.worker.finish()
            if self.host is not None:
                self.host.close()
        finally:
            self.arena.close()


def remapped_states(layout: Layout, plan: kern_pool.RemapPlan) -> list[str]:
    """Pooled states whose pages or slots `plan` adds or removes, or whose blocks it maps or unmaps: every
    paged state when it adds / removes pages (a page id names the same page in each), every per-seq state
    when it adds / removes slots. Layout order."""
    n_paged = len(layout.page_bytes)
    touched = {m.state_index for m in plan.unmap + plan.map}
    if plan.zero_pages or plan.removed_pages:
        touched.update(range(n_paged))
    if plan.zero_slots or plan.removed_slots:
        touched.update(range(n_paged, len(layout.states)))
    return [layout.states[i] for i in sorted(touched)]


class PoolMethods:
    """Mixin of `Runtime`: the pool API. Needs `self.stream`, `self._pooled_state`, `self._activate()`."""

    stream: Any
    context: Any
    gpu: int
    _pooled_state: PoolState | None

    def _activate(self) -> None: ...  # provided by Runtime

    # ------------------------------------------------------------ plumbing

    def _ps(self) -> PoolState:
        self._activate()
        ps = self._pooled_state
        if ps is None:
            raise ApiError("the manifest declares no paged or per-seq states: there is no pool")
        return ps

    def _own_lease(self, lease: Any, what: str) -> Lease:
        """`lease` if it is a kern_runtime `Lease` of this runtime, else kern_pool `Misuse` (the pool
        layer refuses a closed one with `Closed`)."""
        if not isinstance(lease, Lease):
            raise Misuse(f"{what} needs a kern_runtime Lease of this runtime, got {type(lease).__name__}")
        if lease._rt is not self:
            raise Misuse(f"{what} with a lease of another pool (another runtime)")
        return lease

    @staticmethod
    def _own_checkpoint(checkpoint: Any, what: str) -> Checkpoint:
        """`checkpoint` if it is a kern_runtime `Checkpoint`, else kern_pool `Misuse` (the pool layer
        refuses one of another pool with `Misuse`, a closed one with `Closed`)."""
        if not isinstance(checkpoint, Checkpoint):
            raise Misuse(f"{what} needs a kern_runtime Checkpoint, got {type(checkpoint).__name__}")
        return checkpoint

    def _own_parked(self, hs: _HostState, parked: Any, what: str) -> kern_pool.Parked:
        """`parked` if it is a kern_pool `Parked` of this runtime's host tier, else `Misuse`."""
        if not isinstance(parked, kern_pool.Parked):
            raise Misuse(f"{what} needs a Parked (from park / park_now), got {type(parked).__name__}")
        if parked._host is not hs.host:
            raise Misuse(f"{what} of a parked entry of another host (another runtime)")
        return parked

    def _own_waking(self, waking: Any, what: str) -> Waking:
        """`waking` if it is a kern_runtime `Waking` of this runtime, else `Misuse`."""
        if not isinstance(waking, Waking):
            raise Misuse(f"{what} needs a kern_runtime Waking (from wake), got {type(waking).__name__}")
        if waking._rt is not self:
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
        ps = self._pooled_state
        return ps.pool.scratch_slot_id if ps is not None else None

    def settle(self) -> None:
        """Block until the remap plan in flight has landed (new objects zeroed) and every park in
        flight has landed (its device pages returned)."""
        self._ps().collect(self.stream, block=True)

    def state_object_address(self, state: str, object_id: int) -> int:
        """Device address of page / slot `object_id` of pooled state `state` (tests, tools)."""
        ps = self._ps()
        if state not in ps.layout.states:
            raise ApiError(f"{state!r} is not a pooled state; pooled: {list(ps.layout.states)}")
        i = ps.layout.states.index(state)
        n_paged = len(ps.layout.page_bytes)
        size = ps.layout.page_bytes[i] if i < n_paged else ps.layout.slot_bytes[i - n_paged]
        return ps.arena.state_base(i) + object_id * size

    # ------------------------------------------------------------ leases and checkpoints

    def lease(self, num_tokens: int, *, wait: bool = True) -> Lease:
        """A fresh sequence: pages for `num_tokens` tokens and (with per-seq states) a zeroed slot.

        Raises kern_pool `Busy` (evict something), `ExceedsPool`, `Misuse`, and `Remapping` only with
        `wait=False`. The zeroing is enqueued on the compute stream before this returns.
        """
        lease = self._pool_request(lambda pool: pool.lease(num_tokens), wait)
        self._pooled_state.run(lease.plan, self.stream)  # type: ignore[union-attr]
        return Lease(self, lease)

    def lease_slot(self, *, wait: bool = True) -> Lease:
        """A slot-only lease (no pages), its slot zeroed on the compute stream."""
        lease = self._pool_request(lambda pool: pool.lease_slot(), wait)
        self._pooled_state.run(lease.plan, self.stream)  # type: ignore[union-attr]
        return Lease(self, lease)

    def checkpoint(self, lease: Lease, num_tokens: int, *, wait: bool = True) -> Checkpoint:
        """Keep the first `num_tokens` tokens of `lease` (which keeps running); the slot is copied on
        the compute stream, after every launch already enqueued (so checkpoint at the lease's current
        position when it has per-seq state). Raises kern_pool `Misuse` (not a Lease of this runtime, bad
        length), `Closed`, `Busy`, `ExceedsPool`."""
        self._own_lease(lease, "checkpoint()")
        cp = self._pool_request(lambda pool: pool.checkpoint(lease.inner, num_tokens), wait)
        self._pooled_state.run(cp.plan, self.stream)  # type: ignore[union-attr]
        return Checkpoint(cp)

    def retire(self, lease: Lease, num_tokens: int) -> Checkpoint | None:
        """End `lease`, keeping its first `num_tokens` tokens without a copy (None if already closed).
        Raises kern_pool `Misuse` (not a Lease of this runtime, bad length)."""
        self._own_lease(lease, "retire()")
        ps = self._ps()
        ps.collect(self.stream)
        cp = ps.pool.retire(lease.inner, num_tokens)
        return Checkpoint(cp) if cp is not None else None

    def lease_from(self, checkpoint: Checkpoint, num_tokens: int, *, prefix_tokens: int | None = None,
                   hold: Any = None, wait: bool = True) -> Lease:
        """A new sequence resuming `checkpoint` (at `prefix_tokens`, default all of it) with pages for
        `num_tokens` tokens; a mid-page prefix copies that page, the slot is copied (compute stream).
        Raises kern_pool `Misuse` (not a Checkpoint of this runtime, bad lengths), `Closed`, `Busy`,
        `ExceedsPool`."""
        self._own_checkpoint(checkpoint, "lease_from()")
        lease = self._pool_request(
            lambda pool: pool.lease_from(checkpoint.inner, num_tokens, prefix_tokens=prefix_tokens, hold=hold), wait)
        self._pooled_state.run(lease.plan, self.stream)  # type: ignore[union-attr]
        return Lease(self, lease)

    def fork(self, parent: Lease, prefix_tokens: int, num_tokens: int, *, wait: bool = True) -> Lease:
        """A new sequence sharing the first `prefix_tokens` tokens of the live `parent`. Raises kern_pool
        `Misuse` (not a Lease of this runtime, bad lengths), `Closed`, `Busy`, `ExceedsPool`."""
        self._own_lease(parent, "fork()")
        lease = self._pool_request(lambda pool: pool.fork(parent.inner, prefix_tokens, num_tokens), wait)
        self._pooled_state.run(lease.plan, self.stream)  # type: ignore[union-attr]
        return Lease(self, lease)

    def block_table(self, leases: Sequence[Lease | None], width: int, rows: int | None = None) -> np.ndarray:
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
            ps.host = _HostState(ps.pool, memory, geometry, stream, max_pitch)
        except BaseException:
            if stream is not None:
                call("cuStreamDestroy", stream)
            memory.close()
            raise
        return geometry.total_bytes

    def _hs(self) -> tuple[PoolState, _HostState]:
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

    def room(self, checkpoint: Checkpoint) -> kern_pool.Room:
        """Reserve host units for `checkpoint`. Raises `Busy` (err.checkpoint is `checkpoint`, untouched),
        `ExceedsPool`, `Misuse` (not a Checkpoint of this runtime), `Closed`."""
        self._own_checkpoint(checkpoint, "room()")
        ps, hs = self._hs()
        ps.collect(self.stream)
        try:
            return hs.host.room(checkpoint.inner)
        except Busy as exc:
            raise Busy(str(exc), checkpoint=checkpoint) from None

    def _transfer_after_compute(self, hs: _HostState) -> None:
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

    def park_now(self, checkpoint: Checkpoint) -> kern_pool.Parked:
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
             wait: bool = True) -> Waking:
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
        return Waking(self, inner, event)

    def landed(self, item: kern_pool.Parked | Waking) -> bool:
        """Non-blocking: have the copies of a park or a wake landed? (A landed park returns its pages.)
        Raises kern_pool `Misuse` for anything but a Parked or Waking of this runtime."""
        ps, hs = self._hs()
        if isinstance(item, Waking):
            return self._own_waking(item, "landed()").landed
        self._own_parked(hs, item, "landed()")
        hs.poll()
        return item.landed

    def awake(self, waking: Waking) -> Lease | None:
        """The woken lease once its copies have landed, else None (never blocks). The lease is handed
        out once: a successful awake consumes the Waking (runtime.md: awake(waking) -> Lease).
        Raises kern_pool `Misuse` (not a Waking of this runtime), `Closed` (the Waking or its lease was
        closed, or the Waking was already awakened)."""
        self._activate()
        self._own_waking(waking, "awake()")
        if waking.inner._lease.closed:
            raise Closed("awake() of a closed Waking (or of one whose lease was closed)")
        if waking.inner._taken:  # its lease went to an earlier awake: a second wrapper would share it
            raise Closed("awake() of a Waking already awakened: awake consumes it, the lease was handed out once")
        if not waking.landed:
            return None
        return Lease(self, waking.inner.lease)

    def wake_now(self, parked: kern_pool.Parked, num_tokens: int, lease_tokens: int, *, hold: Any = None,
                 wait: bool = True) -> Lease:
        """`wake` with the copies on the compute stream: the lease is usable at once. The compute stream never
        waits for the transfer stream: a `parked` whose park has not landed is waited for on the host (`wait`)
        or refused (kern_pool `NotLanded`), as in `wake`."""
        ps, hs = self._hs()
        _after_parks(hs, parked, wait)
        inner = self._pool_request(lambda pool: hs.host.wake(parked, num_tokens, lease_tokens, hold=hold), wait)
        ps.run(inner.lease_copies, self.stream)
        issue_copies(hs.copies(inner.plan, ps.pages, ps.slots), self.stream)
        inner.land()
        return Lease(self, inner.lease)

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


def _after_parks(hs: _HostState, parked: Any, wait: bool) -> None:
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
