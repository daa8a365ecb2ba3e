"""What the runtime keeps for its pooled states: the kern_pool `Pool`, the VMM arena and its remap worker
(`PoolState`), and the pinned host tier with its transfer stream (`HostState`). The pool API over them is
`device_pool.DevicePool`; the handles it hands out are in `handles.py`.
"""

from __future__ import annotations

from typing import Any

import kern_pool
from kern_pool import Layout, Pool

from ..cuda.driver import call
from .host_tier import HostGeometry, PinnedHost, event_done, host_copies
from .pool_exec import ClassGeometry, execute, plan_ops, zero_ops
from .remap import Arena, RemapWorker


class HostState:
    """The host tier of one device pool: kern_pool's `Host` accounting, the pinned memory, the transfer stream
    and the parks in flight (landed by `poll`)."""

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
        self.host: HostState | None = None
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
