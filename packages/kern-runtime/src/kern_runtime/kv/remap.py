"""Pooled-state memory on the device: one VMM arena, and kern_pool remap plans run off the main thread.

`Arena`: one `cuMemAddressReserve` for every pooled state; state `i` (kern_pool `Layout.states`
order: paged states, then per-seq states) owns `[base + i * stride, base + (i + 1) * stride)` with
`stride = Layout.va_bytes_per_state` (room for every physical block of the pool, so a state's range
never moves and programs captured at load address every page and slot a later remap creates).
`Layout.num_blocks` physical blocks of `block_bytes` are created once (`cuMemCreate`) and mapped
where kern_pool's `Pool.mapping()` says; a remap unmaps and maps blocks, it never creates or frees
one. Equal spacing of the states also lets the host tier fold a page run of every state into one
2-D copy (host_tier.py).

`RemapWorker`: one plan at a time on a background thread: wait for the compute-stream event recorded
when the plan was started (every launch that could touch the donor objects was enqueued before it),
unmap, map, set access. The main thread collects the result (`done` / `wait`), zeroes the new objects
on the compute stream and reports `Pool.land(plan)`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from kern_pool import BlockMove, Layout, RemapPlan

from ..cuda.driver import call, cu
from ..cuda.memory import vmm_properties


class Arena:
    """Reserved ranges + physical blocks of the pooled states. Build with `Arena.create`; `close()` frees.

    `mapped`: (state_index, block_index) -> physical block id currently mapped there.
    """

    def __init__(self, layout: Layout, device_ordinal: int) -> None:
        self.layout = layout
        self.device_ordinal = device_ordinal
        self.block_bytes = layout.block_bytes
        self.stride = layout.va_bytes_per_state
        self.base = 0
        self.reserved_bytes = 0
        self.handles: list[Any] = []
        self.mapped: dict[tuple[int, int], int] = {}

    @classmethod
    def create(cls, layout: Layout, device_ordinal: int, mapping: Iterable[BlockMove]) -> Arena:
        """Reserve, create every block, map `mapping` with read/write access. A failure frees what was taken."""
        arena = cls(layout, device_ordinal)
        try:
            arena.reserved_bytes = arena.stride * len(layout.states)
            arena.base = int(call("cuMemAddressReserve", arena.reserved_bytes, arena.block_bytes, 0, 0))
            prop = vmm_properties(device_ordinal)
            for _ in range(layout.num_blocks):
                arena.handles.append(call("cuMemCreate", arena.block_bytes, prop, 0))
            arena.map(mapping)
        except BaseException:
            arena.close()
            raise
        return arena

    def state_base(self, state_index: int) -> int:
        """Virtual base address of state `state_index` (Layout.states order)."""
        return self.base + state_index * self.stride

    def block_address(self, move: BlockMove) -> int:
        return self.state_base(move.state_index) + move.block_index * self.block_bytes

    def map(self, moves: Iterable[BlockMove]) -> None:
        """cuMemMap + cuMemSetAccess (read/write for this device) per block."""
        driver = cu()
        access = driver.CUmemAccessDesc()
        access.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = self.device_ordinal
        access.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        for m in moves:
            key = (m.state_index, m.block_index)
            assert key not in self.mapped, f"kern bug: block {key} mapped twice"
            va = self.block_address(m)
            call("cuMemMap", va, self.block_bytes, 0, self.handles[m.physical_block_id], 0)
            self.mapped[key] = m.physical_block_id
            call("cuMemSetAccess", va, self.block_bytes, [access], 1)

    def unmap(self, moves: Iterable[BlockMove]) -> None:
        for m in moves:
            key = (m.state_index, m.block_index)
            assert self.mapped.get(key) == m.physical_block_id, f"kern bug: unmapping {key}, not mapped as planned"
            call("cuMemUnmap", self.block_address(m), self.block_bytes)
            del self.mapped[key]

    def state_blocks(self, state_index: int) -> list[int]:
        """Mapped virtual block indices of a state, ascending."""
        return sorted(b for s, b in self.mapped if s == state_index)

    def close(self) -> None:
        """Unmap everything, release every block, free the range (idempotent; tries every step)."""
        first: BaseException | None = None
        for (s, b) in sorted(self.mapped):
            try:
                call("cuMemUnmap", self.state_base(s) + b * self.block_bytes, self.block_bytes)
            except BaseException as exc:  # noqa: BLE001 - keep freeing
                first = first or exc
        self.mapped.clear()
        while self.handles:
            handle = self.handles.pop()
            try:
                call("cuMemRelease", handle)
            except BaseException as exc:  # noqa: BLE001
                first = first or exc
        if self.base:
            base, self.base = self.base, 0
            try:
                call("cuMemAddressFree", base, self.reserved_bytes)
            except BaseException as exc:  # noqa: BLE001
                first = first or exc
        if first is not None:
            raise first


class RemapWorker:
    """Runs one `RemapPlan` at a time on a background thread (see the module docstring)."""

    def __init__(self, arena: Arena, context: Any) -> None:
        self._arena = arena
        self._context = context
        self.plan: RemapPlan | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._event: Any = None

    @property
    def busy(self) -> bool:
        return self.plan is not None

    def start(self, plan: RemapPlan, stream: Any) -> None:
        """Record the guard event on `stream` now and execute `plan` behind it on a new thread."""
        assert self.plan is None, "kern bug: a second remap plan started while one is in flight"
        event = call("cuEventCreate", cu().CUevent_flags.CU_EVENT_DISABLE_TIMING)
        call("cuEventRecord", event, stream)
        self.plan, self._event, self._error = plan, event, None
        self._thread = threading.Thread(target=self._run, name=f"kern-remap-{plan.serial}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            call("cuCtxSetCurrent", self._context)
            call("cuEventSynchronize", self._event)
            assert self.plan is not None
            self._arena.unmap(self.plan.unmap)
            self._arena.map(self.plan.map)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            self._error = exc

    def done(self) -> bool:
        """True when the plan in flight has finished on its thread (or none is in flight)."""
        return self._thread is None or not self._thread.is_alive()

    def finish(self) -> RemapPlan:
        """Join the thread and return the executed plan (raises the thread's error). Clears the slot."""
        assert self.plan is not None and self._thread is not None, "kern bug: finish() without a plan"
        self._thread.join()
        plan, error, event = self.plan, self._error, self._event
        self.plan, self._thread, self._error, self._event = None, None, None, None
        call("cuEventDestroy", event)
        if error is not None:
            raise error
        return plan
