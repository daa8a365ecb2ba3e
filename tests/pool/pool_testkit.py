"""Test helpers for kern-pool: a tiny in-memory executor that applies plans to page / slot contents."""

from __future__ import annotations

from typing import Any

from kern_pool import Copies, Host, HostCopies, Lease, Pool, Prefix, RemapPlan, check_prefix


class Memory:
    """Page contents (page id -> list of page_tokens tokens, None = never written), slot values and
    host copies. Applying a plan does exactly what kern-runtime would do with bytes."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.P = pool.page_tokens
        self.pages: dict[int, list[Any]] = {}
        self.slots: dict[int, Any] = {}
        self.host_pages: dict[int, list[Any]] = {}
        self.host_slots: dict[int, Any] = {}

    def page(self, page_id: int) -> list[Any]:
        return self.pages.setdefault(page_id, [None] * self.P)

    def apply(self, plan: Copies | RemapPlan | HostCopies) -> None:
        if isinstance(plan, RemapPlan):
            for p in plan.zero_pages:
                self.pages[p] = [0] * self.P
            for s in plan.zero_slots:
                self.slots[s] = 0
            return
        if isinstance(plan, HostCopies):
            park = plan.direction == "park"
            src_p, dst_p = (self.pages, self.host_pages) if park else (self.host_pages, self.pages)
            src_s, dst_s = (self.slots, self.host_slots) if park else (self.host_slots, self.slots)
            for c in plan.page_copies:
                dst_p[c.dst_page_id] = list(src_p.get(c.src_page_id, [None] * self.P))
            for c in plan.slot_copies:
                dst_s[c.dst_slot_id] = src_s.get(c.src_slot_id)
            return
        for p in plan.zero_pages:
            self.pages[p] = [0] * self.P
        for s in plan.zero_slots:
            self.slots[s] = 0
        for c in plan.page_copies:
            self.pages[c.dst_page_id] = list(self.page(c.src_page_id))
        for c in plan.slot_copies:
            self.slots[c.dst_slot_id] = self.slots.get(c.src_slot_id)

    def write(self, lease: Lease, pos: int, token: Any) -> None:
        """Write `token` at position `pos` through the lease's slot mapping."""
        slot = lease.slot(pos)
        self.page(slot // self.P)[slot % self.P] = token

    def fill(self, lease: Lease, tokens: list[Any], start: int = 0) -> None:
        for i, t in enumerate(tokens):
            self.write(lease, start + i, t)

    def read(self, handle: Any, num_tokens: int) -> list[Any]:
        """The first `num_tokens` tokens a lease / checkpoint sees through its page list."""
        pages = handle.page_ids()
        return [self.page(pages[i // self.P])[i % self.P] for i in range(num_tokens)]

    def read_host(self, parked: Any, num_tokens: int) -> list[Any]:
        """The first `num_tokens` tokens a parked entry holds on the host (through its host page ids)."""
        pages = parked.host_page_ids()
        return [self.host_pages[pages[i // self.P]][i % self.P] for i in range(num_tokens)]


def invariant(pool: Pool, prefix: Prefix | None = None, host: Host | None = None) -> None:
    """The global invariant after every step: free + distinct held blocks = budget, each refcount =
    its holders, nothing both free and held, no duplicate free entry (Pool.check), tree and host."""
    pool.check()
    mapped = {m.physical_block_id for m in pool.mapping()}
    free = pool._blocks.free_phys
    assert len(mapped) + len(free) == pool.layout.num_blocks
    assert pool.held_pages + pool.free_pages == pool.leasable_pages
    if prefix is not None:
        check_prefix(prefix)
    if host is not None:
        host.check()


class K:
    """A stand-in kept object for prefix-only tests."""

    def __init__(self, num_tokens: int, has_slot: bool = False, name: str = "") -> None:
        self.num_tokens = num_tokens
        self.has_slot = has_slot
        self.name = name
        self.closes = 0

    def close(self) -> bool:
        self.closes += 1
        return self.closes == 1

    def __repr__(self) -> str:
        return f"K({self.name or self.num_tokens})"


def pool_state(pool: Pool, host: Host | None = None) -> tuple[object, ...]:
    """Everything a refusal must leave as it was: page / slot refcounts and free stacks, free blocks,
    the plan in flight and (with a host) the host's free units."""
    state: tuple[object, ...] = (
        list(pool._pages.refs), list(pool._pages.free), list(pool._slots.refs), list(pool._slots.free),
        list(pool._blocks.free_phys), pool.remap_in_flight,
    )
    if host is not None:
        state += (list(host._free_pages), list(host._free_slots), host._reserved)
    return state


def retired(pool: Pool, num_tokens: int) -> Any:
    """A checkpoint of `num_tokens` tokens retired from a fresh lease that reached them (`advance_to`: with a
    slot, retire only at the lease's position)."""
    lease = pool.lease(num_tokens)
    lease.advance_to(num_tokens)
    return pool.retire(lease, num_tokens)
