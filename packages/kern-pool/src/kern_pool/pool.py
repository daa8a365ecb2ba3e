"""The pool: pages and slots over physical blocks, and every sharing / copy / remap decision.

Pages and slots are two object classes, each on its own never-moving virtual range per state (see
blocks.py). Free objects sit on LIFO stacks (O(1) lease and release). When one class runs out, a
`RemapPlan` moves blocks from the other class's free objects (highest-numbered first) into this
class's lowest-numbered holes; one plan is in flight at a time. Page 0 and slot 0 are scratch: never
leased, padded rows of a captured program's block table / slot mapping point at them.
"""

from __future__ import annotations

import heapq
import weakref
from collections.abc import Sequence
from typing import Any

from .blocks import PAGES, SLOTS, Blocks, IdStack
from .errors import Busy, Closed, ExceedsPool, Misuse, Remapping, check_count, check_hold
from .handles import Checkpoint, Lease, _Node, chain_pages, node_at
from .plans import BlockMove, Copies, PageCopy, RemapPlan, SlotCopy
from .sizing import MAX_IDS, Layout

HOLE = -1  # unmapped id below `top`
INCOMING = -2  # mapped by the plan in flight, not leasable until it lands
OUTGOING = -3  # unmapped by the plan in flight


class _Objects:
    """Refcounts, LIFO free stack and holes of one class. refs >= 0: mapped (0 = free).

    `free` starts as the run of ids `1 .. initial - 1` (an `IdStack`: O(1), popping the lowest first)."""

    __slots__ = ("refs", "free", "holes", "top", "limit", "name")

    def __init__(self, name: str, initial: int, limit: int) -> None:
        self.name = name
        self.refs = [0] * initial
        if initial:
            self.refs[0] = 1  # scratch, held by the pool forever
        self.free = IdStack(1, initial)  # pop() -> lowest id
        self.holes: list[int] = []
        self.top = initial
        self.limit = limit

    def lowest_holes(self, n: int) -> list[int] | None:
        """The n lowest unmapped ids (None when the virtual range cannot hold them). Pure."""
        out = heapq.nsmallest(n, self.holes)
        more = n - len(out)
        if self.top + more > self.limit:
            return None
        return out + list(range(self.top, self.top + more))

    def claim_holes(self, ids: list[int]) -> None:
        for oid in ids:
            if oid >= self.top:
                self.refs.extend([HOLE] * (oid + 1 - self.top))
                self.top = oid + 1
            self.refs[oid] = INCOMING
        self.holes = [h for h in self.holes if self.refs[h] == HOLE]
        heapq.heapify(self.holes)

    def mapped_ids(self) -> list[int]:
        return [i for i, r in enumerate(self.refs) if r >= 0 or r == INCOMING]

    def unref(self, oid: int) -> None:
        """Drop one reference to `oid`; at zero it goes back on the free stack."""
        n = self.refs[oid] - 1
        assert n >= 0, f"kern bug: {self.name} {oid} released more often than held"
        self.refs[oid] = n
        if n == 0:
            self.free.append(oid)


class Pool:
    """Host-side accounting of one device's pooled states. Single-threaded; no memory is touched.

    Every request either succeeds with a handle whose `plan` the executor runs, or raises a refusal
    and changes nothing (`Remapping` installs a plan and changes only what that plan covers).
    """

    def __init__(self, layout: Layout) -> None:
        """Raises `Misuse` for a `layout` that is not a `Layout`, `ExceedsPool` when this process cannot
        allocate its accounting (one refcount, 8 bytes, per initial page and slot id; blocks and free lists
        cost nothing until used).

        Building is O(1) in the layout's blocks: the initial mapping and free lists are ranges until a
        lease or remap touches them, so a pool of 4 M pages is set up in milliseconds."""
        if not isinstance(layout, Layout):
            raise Misuse(f"Pool needs a Layout, got {type(layout).__name__}")
        self.layout = layout
        self.page_tokens = layout.page_tokens
        self._blocks = Blocks(layout)
        try:
            # ids are int32 on the device: a remap never numbers one past MAX_IDS - 1
            self._pages = _Objects("page", layout.initial_pages, min(self._blocks.max_objects(PAGES), MAX_IDS))
            self._slots = _Objects("slot", layout.initial_slots, min(self._blocks.max_objects(SLOTS), MAX_IDS))
        except MemoryError:
            ids = layout.initial_pages + layout.initial_slots
            raise ExceedsPool(f"Pool: {layout.initial_pages} pages + {layout.initial_slots} slots need {8 * ids} "
                              "bytes of host memory for their refcounts, more than this process can allocate") from None
        self._remap: RemapPlan | None = None
        self._remap_serial = 0
        self._leasable_pages = max(0, layout.initial_pages - 1)
        self._handles: weakref.WeakSet[Any] = weakref.WeakSet()
        self._host_tier: weakref.ref[Any] | None = None  # the pool's Host, if any (kern_pool.host: one per pool)

    # ---- read-only views -------------------------------------------------------------------------
    @property
    def scratch_page_id(self) -> int | None:
        """Page never leased (padded block-table rows point here); None without paged states."""
        return 0 if self.layout.paged else None

    @property
    def scratch_slot_id(self) -> int | None:
        """Slot never leased (padded rows' per-seq index); None without per-seq states."""
        return 0 if self.layout.has_slots else None

    @property
    def free_pages(self) -> int:
        """Pages (ids) free to lease now without a remap: mapped, unheld, not scratch, not in flight."""
        return len(self._pages.free)

    @property
    def free_slots(self) -> int:
        """Slots (ids) free to lease now without a remap: mapped, unheld, not scratch, not in flight."""
        return len(self._slots.free)

    @property
    def mapped_pages(self) -> int:
        """Pages currently mapped, scratch included (free + held + in-flight incoming)."""
        return sum(1 for r in self._pages.refs if r >= 0 or r == INCOMING)

    @property
    def leasable_pages(self) -> int:
        """Mapped pages that can be leased (scratch and in-flight pages excluded)."""
        return self._leasable_pages

    @property
    def held_pages(self) -> int:
        """Pages referenced by some handle (scratch excluded). O(1)."""
        return self._leasable_pages - len(self._pages.free)

    @property
    def remap_in_flight(self) -> RemapPlan | None:
        """The installed `RemapPlan` the executor has not reported with `land()` yet; None when none is."""
        return self._remap

    def refcounts(self, kind: str) -> Sequence[int]:
        """The live per-id refcounts of `kind` ("page" or "slot"), indexed by id, not copied (read it, never
        write it): >= 0 mapped (0 free; the scratch id is held by the pool), negative a hole or an id a remap
        in flight adds or removes. Raises Misuse for another kind."""
        if kind not in ("page", "slot"):
            raise Misuse(f"refcounts({kind!r}): kind is 'page' or 'slot'")
        return self._pages.refs if kind == "page" else self._slots.refs

    def page_refs(self, page_id: int) -> int:
        """Direct holders of `page_id` (a chain node, leases' own pages, checkpoints' tails). Raises `Misuse` for an
        id that is not an int in [0, page ids)."""
        page_id = check_count(page_id, "page_refs page_id")
        if page_id >= len(self._pages.refs):
            raise Misuse(f"page_refs({page_id}): page ids are 0 .. {len(self._pages.refs) - 1}")
        return self._pages.refs[page_id]

    def holders(self, page_id: int) -> int:
        """Live handles whose page list contains `page_id` (O(handles * pages); for tests and tools)."""
        return sum(1 for h in list(self._handles) if not h.closed and h.paged and page_id in h.page_ids())

    def mapping(self) -> tuple[BlockMove, ...]:
        """Every current (state, virtual block) -> physical block mapping; the executor maps these at load."""
        return self._blocks.mapping()

    # ---- requests --------------------------------------------------------------------------------
    def lease(self, num_tokens: int) -> Lease:
        """A fresh sequence with pages for `num_tokens` tokens and (with per-seq states) a zeroed slot.

        Raises `Misuse` (tokens not an int >= 0, tokens on a pool without pages), `ExceedsPool`,
        `Busy`, `Remapping`. `lease.plan.zero_slots` lists the slot to zero.
        """
        num_tokens = check_count(num_tokens, "lease() num_tokens")
        if num_tokens and not self.layout.paged:
            raise Misuse(f"lease({num_tokens}): tokens need paged states")
        n_pages = self._pages_for(num_tokens)
        n_slots = 1 if self.layout.has_slots else 0
        pages, slots = self._acquire(n_pages, n_slots, n_pages)
        lease = self._new_lease(self.layout.paged)
        lease._pages = pages
        if slots:
            lease.seq_slot_id = slots[0]
            lease.plan = Copies(zero_slots=(slots[0],))
        return lease

    def lease_slot(self) -> Lease:
        """A slot-only lease (no pages; `paged` is False): a peer rank's share of a sequence."""
        if not self.layout.has_slots:
            raise Misuse("lease_slot() on a pool without per-seq states")
        _, slots = self._acquire(0, 1, 0)
        lease = self._new_lease(False)
        lease.seq_slot_id = slots[0]
        lease.plan = Copies(zero_slots=(slots[0],))
        return lease

    def grow(self, lease: Lease, num_tokens: int) -> None:
        """Reserve pages so `lease` holds `num_tokens` tokens in total (no-op if it already does).

        Raises `Closed`, `Misuse` (not a `Lease` of this pool, tokens not an int >= 0, slot-only
        lease), `ExceedsPool`, `Busy`, `Remapping`.
        """
        self._own(lease, Lease)
        num_tokens = check_count(num_tokens, "grow() num_tokens")
        more = self._pages_for(num_tokens) - lease.num_pages
        if more <= 0:
            return
        if not lease.paged:
            raise Misuse("grow() on a slot-only lease")
        pages, _ = self._acquire(more, 0, lease.num_pages + more)
        lease._pages.extend(pages)

    def checkpoint(self, lease: Lease, num_tokens: int) -> Checkpoint:
        """Keep the first `num_tokens` tokens of `lease` (which keeps running).

        Full pages are sealed into the shared chain (the lease can no longer write them); the
        partial last page is shared and the lease may only write it from `num_tokens` on; the slot
        is copied into a new slot (`checkpoint.plan.slot_copies`). With per-seq state the length
        must be exactly the lease's `reached_tokens` (`_check_slot_len`). Raises `Closed`, `Misuse` (not a `Lease` of
        this pool, length not an int or out of range), `Busy` / `Remapping` (no slot for the copy),
        `ExceedsPool`; a refusal changes nothing.
        """
        self._own(lease, Lease)
        num_tokens = self._check_len(lease, num_tokens)
        self._check_slot_len(lease, num_tokens, "checkpoint")
        slots: list[int] = []
        if lease.seq_slot_id is not None:
            _, slots = self._acquire(0, 1, 0)
        cp = self._make_checkpoint(lease, num_tokens)
        lease._frozen = max(lease._frozen, num_tokens)
        if slots:
            cp.seq_slot_id = slots[0]
            cp.plan = Copies(slot_copies=(SlotCopy(lease.seq_slot_id, slots[0]),))  # type: ignore[arg-type]
        return cp

    def retire(self, lease: Lease, num_tokens: int) -> Checkpoint | None:
        """End `lease`, keeping its first `num_tokens` tokens, with no copy: pages past them return,
        the slot moves to the checkpoint. A second retire (or retire after close) is a checked
        no-op returning None. Raises `Misuse` for a length that is not an int, negative or beyond the
        lease, other than a slot-holding lease's `reached_tokens` (`_check_slot_len`), or a handle that is
        not a `Lease` of this pool; a refusal leaves the lease running."""
        if isinstance(lease, Lease) and lease.closed:
            return None
        self._own(lease, Lease)
        num_tokens = self._check_len(lease, num_tokens)
        self._check_slot_len(lease, num_tokens, "retire")
        cp = self._make_checkpoint(lease, num_tokens)
        cp.seq_slot_id, lease.seq_slot_id = lease.seq_slot_id, None
        lease.close()
        return cp

    def lease_from(
        self,
        source: Checkpoint,
        num_tokens: int,
        *,
        prefix_tokens: int | None = None,
        hold: Any = None,
    ) -> Lease:
        """A new sequence resuming `source` at `prefix_tokens` (default: all of it), with pages for
        `num_tokens` tokens in total.

        Full pages below `prefix_tokens` are shared; when it falls mid-page that page is copied into
        the lease's first own page (`plan.page_copies`), so the checkpoint's page never changes; the
        slot is copied. `prefix_tokens < source.num_tokens` is allowed only for pure-KV checkpoints.
        `hold` (anything with `close()`, e.g. a prefix `Hit`) is closed when the lease closes.
        Raises `Closed`, `Misuse` (lengths not ints or out of range, a `hold` without `close()`; also for a
        `source` that is not a `Checkpoint` of this pool, e.g. a host `Parked`: wake it with `Host.wake`),
        `ExceedsPool`, `Busy`, `Remapping`; a refusal changes nothing.
        """
        self._own(source, Checkpoint)
        num_tokens = check_count(num_tokens, "lease_from() num_tokens")
        check_hold(hold, "lease_from()")
        if prefix_tokens is not None:
            prefix_tokens = check_count(prefix_tokens, "lease_from() prefix_tokens")
        length = source.num_tokens if prefix_tokens is None else prefix_tokens
        if not 0 <= length <= source.num_tokens:
            raise Misuse(f"prefix_tokens {length} outside 0..{source.num_tokens} of the checkpoint")
        if length < source.num_tokens and source.has_slot:
            raise Misuse(f"checkpoint with per-seq state resumes only at its length {source.num_tokens}, not {length}")
        if not source.paged:
            return self._slot_only_branch("lease_from a slot-only checkpoint", source.seq_slot_id, length,
                                          num_tokens, hold)
        self._check_reserve(num_tokens, length)
        P = self.page_tokens
        full, partial = divmod(length, P)
        src_partial = None
        if partial:
            cp_depth = source._chain.index + 1 if source._chain is not None else 0
            src_partial = node_at(source._chain, full).page_id if full < cp_depth else source.tail_page_id  # type: ignore[union-attr]
            assert src_partial is not None, "kern bug: partial prefix page missing"
        return self._branch(source._chain, full, src_partial, source.seq_slot_id, length, num_tokens, hold)

    def fork(self, parent: Lease, prefix_tokens: int, num_tokens: int) -> Lease:
        """A new sequence sharing the first `prefix_tokens` tokens of the live `parent`.

        Full pages are sealed into the parent's chain and shared; a mid-page `prefix_tokens` copies
        that page for the child (the parent keeps writing its own); the parent's slot is copied (so
        with per-seq state the fork must be at the parent's current position: a length below the one
        the slot has reached (`reached_tokens`) is refused, and a fork of a lease with a slot freezes the
        parent below `prefix_tokens`, as a checkpoint does). Raises `Closed`, `Misuse` (lengths not
        ints or out of range), `ExceedsPool`, `Busy`, `Remapping`; a refusal changes nothing.
        """
        self._own(parent, Lease)
        num_tokens = check_count(num_tokens, "fork() num_tokens")
        prefix_tokens = self._check_len(parent, prefix_tokens)
        self._check_slot_len(parent, prefix_tokens, "fork")
        if not parent.paged:
            child = self._slot_only_branch("fork of a slot-only lease", parent.seq_slot_id, prefix_tokens,
                                           num_tokens, None)
            parent._frozen = max(parent._frozen, prefix_tokens)
            return child
        self._check_reserve(num_tokens, prefix_tokens)
        P = self.page_tokens
        full, partial = divmod(prefix_tokens, P)
        n_pages = self._pages_for(num_tokens)
        n_slots = 1 if parent.seq_slot_id is not None else 0
        pages, slots = self._acquire(n_pages - full, n_slots, n_pages)
        self._seal(parent, full)  # only after the acquisition: a refusal changes nothing
        src_partial = None
        if partial:
            depth = parent.sealed_pages
            src_partial = node_at(parent._chain, full).page_id if full < depth else parent._pages[full - depth]  # type: ignore[union-attr]
        if parent.seq_slot_id is not None:  # its state is at prefix_tokens now: it cannot go back
            parent._frozen = max(parent._frozen, prefix_tokens)
        return self._finish_branch(node_at(parent._chain, full - 1), src_partial, parent.seq_slot_id,
                                   prefix_tokens, pages, slots, None)

    def _slot_only_branch(self, what: str, slot_id: int | None, length: int, num_tokens: int, hold: Any) -> Lease:
        """lease_from / fork of a slot-only source: no pages, so no tokens can be reserved."""
        if num_tokens:
            raise Misuse(f"{what} cannot reserve tokens (pass 0)")
        return self._slot_only_from(slot_id, length, hold)

    @staticmethod
    def _check_reserve(num_tokens: int, prefix_tokens: int) -> None:
        if num_tokens < prefix_tokens:
            raise Misuse(f"num_tokens {num_tokens} is below the prefix {prefix_tokens}")

    def land(self, plan: RemapPlan) -> None:
        """The executor reports `plan` executed: its new pages / slots become leasable."""
        if not isinstance(plan, RemapPlan):
            raise Misuse(f"land() needs the RemapPlan in flight, got {type(plan).__name__}")
        if self._remap is None or plan is not self._remap:
            raise Misuse(f"land(): plan {plan.serial} is not the plan in flight")
        for objs, added, removed in (
            (self._pages, plan.zero_pages, plan.removed_pages),
            (self._slots, plan.zero_slots, plan.removed_slots),
        ):
            for oid in sorted(added, reverse=True):
                objs.refs[oid] = 0
                objs.free.append(oid)
            for oid in removed:
                objs.refs[oid] = HOLE
                heapq.heappush(objs.holes, oid)
        self._leasable_pages += len(plan.zero_pages)
        self._remap = None

    # ---- internals -------------------------------------------------------------------------------
    def _pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_tokens) if self.page_tokens else 0

    def _new_lease(self, paged: bool) -> Lease:
        lease = Lease(self, paged)
        self._handles.add(lease)
        return lease

    def _own(self, handle: Lease | Checkpoint, kind: type[Lease] | type[Checkpoint]) -> None:
        """Misuse unless `handle` is a `kind` of this pool; Closed if it is closed."""
        if not isinstance(handle, kind):
            raise Misuse(f"expected a {kind.__name__} of this pool, got {type(handle).__name__}")
        if handle._pool is not self:
            raise Misuse("handle belongs to another pool")
        if handle.closed:
            raise Closed(f"{type(handle).__name__} is closed")

    def _check_len(self, lease: Lease, num_tokens: int) -> int:
        """`num_tokens` as an int; Misuse unless it is an integer in 0..the lease's tokens (any >= 0 when
        slot-only)."""
        num_tokens = check_count(num_tokens, "length")
        if lease.paged and num_tokens > lease.capacity_tokens:
            raise Misuse(f"length {num_tokens} outside 0..{lease.capacity_tokens} tokens held by the lease")
        return num_tokens

    @staticmethod
    def _check_slot_len(lease: Lease, num_tokens: int, what: str) -> None:
        """Misuse when `lease` holds a slot and `num_tokens` is not exactly the position it has reached.

        A per-seq (recurrent) state holds the sequence as it is *now*: checkpoint / fork copy the slot and
        retire hands it over, so they are valid only at the lease's current position (runtime.md, fork
        (K2): "只能在父的当前位置分叉"). A shorter length would file the state of `reached` tokens under a
        length it does not have; a longer one, tokens the state never saw. The position is
        `lease.reached_tokens` (the inherited prefix, checkpointed / forked lengths, every position
        handed out by `slot(pos)`, `advance_to`). Pure-KV leases may be cut at any length in range.
        """
        if lease.seq_slot_id is None:
            return
        reached = lease.reached_tokens
        if num_tokens != reached:
            way = "cannot go back" if num_tokens < reached else "has not seen the tokens past it"
            raise Misuse(
                f"{what}({lease!r}, {num_tokens}): the lease's per-seq state has reached {reached} tokens and "
                f"{way}; with a slot, {what} only at exactly the current position {reached}"
            )

    def _acquire(self, n_pages: int, n_slots: int, total_pages: int) -> tuple[list[int], list[int]]:
        """Pop `n_pages` free pages and `n_slots` free slots, all or nothing; else raise a refusal."""
        pages_objs, slots_objs = self._pages, self._slots
        if n_pages > len(pages_objs.free) or n_slots > len(slots_objs.free):
            self._refuse(n_pages, n_slots, total_pages)
        pages = pages_objs.free.pop_many(n_pages)  # the same order as popping one by one: lowest ids first
        slots = [slots_objs.free.pop() for _ in range(n_slots)]
        refs = pages_objs.refs
        for p in pages:
            refs[p] = 1
        for s in slots:
            slots_objs.refs[s] = 1
        return pages, slots

    def _refuse(self, n_pages: int, n_slots: int, total_pages: int) -> None:
        layout = self.layout
        need_blocks = sum(-(-(total_pages + 1) * b // layout.block_bytes) for b in layout.page_bytes)
        need_blocks += sum(-(-(n_slots + 1) * b // layout.block_bytes) for b in layout.slot_bytes)
        if (need_blocks > layout.num_blocks or total_pages + 1 > self._pages.limit
                or (n_slots and n_slots + 1 > self._slots.limit)):
            raise ExceedsPool(
                f"{total_pages} pages + {n_slots} slots need {need_blocks} blocks; the pool has {layout.num_blocks}"
            )
        if self._remap is not None:
            raise Remapping(f"remap plan {self._remap.serial} in flight: ask again after it lands", self._remap)
        plan = self._plan(max(0, n_pages - len(self._pages.free)), max(0, n_slots - len(self._slots.free)),
                          n_pages, n_slots)
        if plan is None:
            raise Busy(
                f"need {n_pages} pages + {n_slots} slots; free {len(self._pages.free)} pages, "
                f"{len(self._slots.free)} slots, {len(self._blocks.free_phys)} blocks: evict something"
            )
        self._remap = plan
        raise Remapping(f"remap plan {plan.serial} installed: ask again after it lands", plan)

    def _plan(self, short_pages: int, short_slots: int, keep_pages: int, keep_slots: int) -> RemapPlan | None:
        """Blocks for the missing objects: free blocks first, then the other class's free objects."""
        blocks = self._blocks
        new_pages = self._pages.lowest_holes(short_pages)
        new_slots = self._slots.lowest_holes(short_slots)
        if new_pages is None or new_slots is None:
            return None
        need = blocks.new_blocks_needed(PAGES, new_pages) + blocks.new_blocks_needed(SLOTS, new_slots)
        have = len(blocks.free_phys)
        donor_cls, donors = PAGES, []
        if have < need and (short_pages == 0) != (short_slots == 0):
            donor_cls = SLOTS if short_pages else PAGES
            objs = self._slots if short_pages else self._pages
            keep = keep_slots if short_pages else keep_pages
            candidates = sorted(objs.free, reverse=True)[: max(0, len(objs.free) - keep)]
            for oid in candidates:
                donors.append(oid)
                if have + blocks.blocks_freed(donor_cls, donors) >= need:
                    break
            if have + blocks.blocks_freed(donor_cls, donors) < need:
                return None
        elif have < need:
            return None
        unmap = blocks.unmap_objects(donor_cls, donors)
        blocks.release_phys(unmap)
        mapped = blocks.map_objects(PAGES, new_pages) + blocks.map_objects(SLOTS, new_slots)
        donor_objs = self._pages if donor_cls == PAGES else self._slots
        donor_objs.free.discard(set(donors))
        for oid in donors:
            donor_objs.refs[oid] = OUTGOING
        if donor_cls == PAGES:
            self._leasable_pages -= len(donors)
        self._pages.claim_holes(new_pages)
        self._slots.claim_holes(new_slots)
        self._remap_serial += 1
        return RemapPlan(
            serial=self._remap_serial,
            unmap=tuple(unmap),
            map=tuple(mapped),
            removed_pages=tuple(donors) if donor_cls == PAGES else (),
            removed_slots=tuple(donors) if donor_cls == SLOTS else (),
            zero_pages=tuple(new_pages),
            zero_slots=tuple(new_slots),
        )

    def _seal(self, lease: Lease, full: int) -> None:
        """Seal the lease's own pages below page index `full` into chain nodes (refs move, no counts change)."""
        depth = lease.sealed_pages
        if full <= depth:
            return
        chain, origins = lease._chain, lease._origins
        for i in range(full - depth):
            chain = _Node(lease._pages[i], chain, depth + i)
            if origins is not None and (host_node := origins.get(depth + i)) is not None:
                chain.host = weakref.ref(host_node)
        lease._chain = chain
        del lease._pages[: full - depth]

    def _make_checkpoint(self, lease: Lease, num_tokens: int) -> Checkpoint:
        cp = Checkpoint(self, num_tokens, lease.paged)
        self._handles.add(cp)
        woken = lease._woken_slot  # a woken slot checkpointed at its woken length: still the host's copy
        if woken is not None and woken[0] == num_tokens:
            cp.host_slot = woken[1]
        if not lease.paged:
            return cp
        full, partial = divmod(num_tokens, self.page_tokens)
        self._seal(lease, full)
        chain = node_at(lease._chain, full - 1)
        if chain is not None:
            chain.refs += 1
        cp._chain = chain
        if partial:
            depth = lease.sealed_pages
            page = node_at(lease._chain, full).page_id if full < depth else lease._pages[full - depth]  # type: ignore[union-attr]
            self._pages.refs[page] += 1
            cp.tail_page_id = page
            tail = lease._woken_tail  # the woken partial page, frozen below its woken tokens
            if tail is not None and tail[0] == full and partial <= tail[1]:
                cp.host_tail = tail[2]
        return cp

    def _copy_source(self, cp: Checkpoint) -> Checkpoint:
        """A second holder of `cp`'s chain, tail page and slot, for a copy in flight that reads them (a park:
        kern_pool.host). Closing `cp` then releases nothing the copy reads; closing this one (when the copy
        lands) does. Pool-internal: it is a live handle for `check()`, never handed to a caller."""
        hold = Checkpoint(self, cp.num_tokens, cp.paged)
        self._handles.add(hold)
        if cp._chain is not None:
            cp._chain.refs += 1
        hold._chain = cp._chain
        if cp.tail_page_id is not None:
            self._pages.refs[cp.tail_page_id] += 1
            hold.tail_page_id = cp.tail_page_id
        if cp.seq_slot_id is not None:
            self._slots.refs[cp.seq_slot_id] += 1
            hold.seq_slot_id = cp.seq_slot_id
        return hold

    def _branch(self, chain_tail: _Node | None, full: int, src_partial: int | None, src_slot: int | None,
                length: int, num_tokens: int, hold: Any) -> Lease:
        n_pages = self._pages_for(num_tokens)
        n_slots = 1 if self.layout.has_slots else 0
        pages, slots = self._acquire(n_pages - full, n_slots, n_pages)
        return self._finish_branch(node_at(chain_tail, full - 1), src_partial, src_slot, length, pages, slots, hold)

    def _finish_branch(self, chain: _Node | None, src_partial: int | None, src_slot: int | None,
                       length: int, pages: list[int], slots: list[int], hold: Any) -> Lease:
        lease = self._new_lease(True)
        if chain is not None:
            chain.refs += 1
        lease._chain = chain
        lease._pages = pages
        lease.prefix_tokens = lease._frozen = length
        lease._hold = hold
        page_copies = (PageCopy(src_partial, pages[0]),) if src_partial is not None else ()
        slot_copies: tuple[SlotCopy, ...] = ()
        zero_slots: tuple[int, ...] = ()
        if slots:
            lease.seq_slot_id = slots[0]
            if src_slot is not None:
                slot_copies = (SlotCopy(src_slot, slots[0]),)
            else:
                zero_slots = (slots[0],)
        lease.plan = Copies(page_copies=page_copies, slot_copies=slot_copies, zero_slots=zero_slots)
        return lease

    def _slot_only_from(self, src_slot: int | None, length: int, hold: Any) -> Lease:
        _, slots = self._acquire(0, 1, 0)
        lease = self._new_lease(False)
        lease.seq_slot_id = slots[0]
        lease.prefix_tokens = length
        lease._hold = hold
        if src_slot is not None:
            lease.plan = Copies(slot_copies=(SlotCopy(src_slot, slots[0]),))
        return lease

    def _unref_chain(self, node: _Node | None) -> None:
        while node is not None:
            node.refs -= 1
            assert node.refs >= 0, "kern bug: chain node released more often than held"
            if node.refs:
                return
            self._pages.unref(node.page_id)
            node = node.parent

    def _release_lease(self, lease: Lease) -> None:
        lease._closed = True
        self._unref_chain(lease._chain)
        lease._chain = None
        for p in reversed(lease._pages):
            self._pages.unref(p)
        lease._pages = []
        lease._origins = None
        if lease.seq_slot_id is not None:
            self._slots.unref(lease.seq_slot_id)
            lease.seq_slot_id = None
        hold, lease._hold = lease._hold, None
        if hold is not None:
            hold.close()

    def _release_checkpoint(self, cp: Checkpoint) -> None:
        cp._closed = True
        self._unref_chain(cp._chain)
        cp._chain = None
        if cp.tail_page_id is not None:
            self._pages.unref(cp.tail_page_id)
            cp.tail_page_id = None
        if cp.seq_slot_id is not None:
            self._slots.unref(cp.seq_slot_id)
            cp.seq_slot_id = None

    # ---- invariants ------------------------------------------------------------------------------
    def live_handles(self) -> list[Lease | Checkpoint]:
        """Open leases and checkpoints of this pool (order unspecified)."""
        return [h for h in list(self._handles) if not h.closed]

    def check(self) -> None:
        """Assert every accounting invariant (kern bugs only; O(everything), for tests and debugging).

        Each page / slot / node refcount equals its direct holders among live handles; free stacks
        hold no duplicate and exactly the mapped objects nobody holds; block use counts match the
        mapped objects and free + mapped physical blocks equal the budget.
        """
        handles = self.live_handles()
        node_refs: dict[int, int] = {}
        nodes: dict[int, _Node] = {}
        page_want = [0] * len(self._pages.refs)
        slot_want = [0] * len(self._slots.refs)
        if page_want:
            page_want[0] = 1
        if slot_want:
            slot_want[0] = 1
        for h in handles:
            tail = h._chain
            if tail is not None:
                node_refs[id(tail)] = node_refs.get(id(tail), 0) + 1
            node = tail
            while node is not None and id(node) not in nodes:
                nodes[id(node)] = node
                page_want[node.page_id] += 1
                if node.parent is not None:
                    node_refs[id(node.parent)] = node_refs.get(id(node.parent), 0) + 1
                node = node.parent
            if isinstance(h, Lease):
                for p in h._pages:
                    page_want[p] += 1
                assert chain_pages(h._chain) + h._pages == h.page_ids()
            elif h.tail_page_id is not None:
                page_want[h.tail_page_id] += 1
            if h.seq_slot_id is not None:
                slot_want[h.seq_slot_id] += 1
        for key, node in nodes.items():
            assert node.refs == node_refs.get(key, 0), f"kern bug: node of page {node.page_id} refs {node.refs}"
        for objs, want in ((self._pages, page_want), (self._slots, slot_want)):
            free = objs.free
            assert len(set(free)) == len(free), f"kern bug: duplicate free {objs.name}"
            for oid, r in enumerate(objs.refs):
                if r >= 0:
                    assert r == want[oid], f"kern bug: {objs.name} {oid} refs {r}, holders {want[oid]}"
                else:
                    assert want[oid] == 0, f"kern bug: unmapped {objs.name} {oid} is held"
            assert sorted(free) == [i for i, r in enumerate(objs.refs) if r == 0], f"kern bug: {objs.name} free list"
            assert sorted(objs.holes) == [i for i, r in enumerate(objs.refs) if r == HOLE], "kern bug: holes"
        self._blocks.check((self._pages.mapped_ids(), self._slots.mapped_ids()))
