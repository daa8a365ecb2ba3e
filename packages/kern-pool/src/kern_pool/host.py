"""Host tier accounting: pinned host pages and slots, parked chains, park / wake plans.

A host page holds one page of every paged state end to end, a host slot one slot of every per-seq
state; the executor lays host pages first, then host slots, in one pinned allocation, and kern-pool
only counts unit ids. Parked pages form chains like device pages (one `HostNode` per full page);
device chain nodes keep a weak link to their host copy, so parking the next turn of a session copies
only its new pages, and a woken session parked again copies no full page at all.

Flow: `room(checkpoint)` reserves host units (or refuses, handing the checkpoint back), `park(room)`
returns a `Parked` with the device->host plan (the device pages return when it `land()`s),
`wake(parked, num_tokens, tokens)` returns a `Waking` whose lease is usable only after `land()`.
A room also holds a reference to the host chain its checkpoint shares, so that chain cannot die
between `room` and `park` (`park` hands the reference to the parked entry, `Room.close` drops it).
Every handle is checked to be of the right type and of this host / pool before anything changes.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from .blocks import IdStack
from .errors import Busy, Closed, ExceedsPool, Misuse, NotLanded, check_count, check_hold
from .handles import Checkpoint, Handle, Lease, _Node
from .plans import Copies, HostCopies, PageCopy, SlotCopy
from .pool import Pool
from .sizing import Layout


def host_split(host_bytes: int, layout: Layout, turn_tokens: int) -> tuple[int, int]:
    """Split `host_bytes` of pinned memory into (host pages, host slots).

    One unit = `ceil(turn_tokens / page_tokens)` pages plus one slot (one per-seq state copy per
    session turn); without per-seq states every byte goes to pages, without paged states to slots.
    Raises `Misuse` for a turn length that is not an int > 0 or bytes that are not an int >= 0.
    """
    units = host_units(host_bytes, layout, turn_tokens)
    page_bytes, slot_bytes = sum(layout.page_bytes), sum(layout.slot_bytes)
    if not slot_bytes:
        return host_bytes // page_bytes, 0
    if not page_bytes:
        return 0, host_bytes // slot_bytes
    turn_pages = -(-turn_tokens // layout.page_tokens)
    return units * turn_pages, units


def host_units(host_bytes: int, layout: Layout, turn_tokens: int) -> int:
    """Whole (turn pages + one slot) units in `host_bytes` (pages alone without per-seq states).
    Raises `Misuse` like `host_split`."""
    host_bytes = check_count(host_bytes, "host_bytes")
    turn_tokens = check_count(turn_tokens, "turn_tokens", 1)
    page_bytes, slot_bytes = sum(layout.page_bytes), sum(layout.slot_bytes)
    turn_pages = -(-turn_tokens // layout.page_tokens) if page_bytes else 0
    unit = turn_pages * page_bytes + slot_bytes
    return host_bytes // unit


class HostNode:
    """A parked page: host page `page_id`, the node before it, and its direct holders `refs`.

    A full page sits in a chain (`parent` is the page before it); a partial tail page is a node of its
    own (`parent` None), held by every parked entry (and room) that ends with it. `writer` is a weak link
    to the `Parked` whose copy writes the page (it may still be in flight)."""

    __slots__ = ("page_id", "parent", "refs", "alive", "writer", "__weakref__")

    def __init__(self, page_id: int, parent: HostNode | None) -> None:
        self.page_id = page_id
        self.parent = parent
        self.refs = 1
        self.alive = True
        self.writer: weakref.ref[Parked] | None = None


class HostSlot:
    """A parked slot: host slot `slot_id` and its direct holders `refs` (parked entries, rooms)."""

    __slots__ = ("slot_id", "refs", "alive", "writer", "__weakref__")

    def __init__(self, slot_id: int) -> None:
        self.slot_id = slot_id
        self.refs = 1
        self.alive = True
        self.writer: weakref.ref[Parked] | None = None  # as HostNode.writer


def _live(ref: Any) -> Any:
    """The object behind a weak link (`HostNode` / `HostSlot`) while it is alive, else None."""
    obj = ref() if ref is not None else None
    return obj if obj is not None and obj.alive else None


def _in_flight_writer(unit: HostNode | HostSlot | None) -> Parked | None:
    """The `Parked` whose copy writes `unit` if that copy has not landed (a closed writer has landed)."""
    ref = unit.writer if unit is not None else None
    writer = ref() if ref is not None else None
    return writer if writer is not None and not writer.landed else None


def _live_host(node: _Node) -> HostNode | None:
    ref = node.host
    if ref is None:
        return None
    host_node = ref()
    return host_node if host_node is not None and host_node.alive else None


class Room(Handle):
    """Host units reserved for parking one checkpoint; `close()` gives them back unused.

    It holds the host pages and slot the park needs plus one reference to the host chain the
    checkpoint already shares (`_shared`), so that chain stays alive even if every parked entry
    using it closes before `park`. `close()` (also on leaving a `with` block or when the room is
    dropped unparked) returns all of them; `park` consumes the room.
    """

    __slots__ = ("_host", "checkpoint", "_pages", "_slot", "_shared", "_tail", "_kept_slot", "_new", "_closed",
                 "__weakref__")

    def __init__(self, host: Host, checkpoint: Checkpoint, pages: list[int], slot: int | None,
                 shared: HostNode | None, new: list[_Node], tail: HostNode | None = None,
                 kept_slot: HostSlot | None = None) -> None:
        self._host = host
        self.checkpoint = checkpoint
        self._pages = pages
        self._slot = slot
        self._shared = shared
        self._tail = tail  # a host tail the checkpoint's tail page still equals (held: no copy)
        self._kept_slot = kept_slot  # likewise a host slot
        self._new = new
        self._closed = False

    @property
    def num_host_pages(self) -> int:
        """Host pages reserved (the checkpoint's pages not already on the host)."""
        return len(self._pages)

    @property
    def closed(self) -> bool:
        """Whether the room was closed or consumed by `park`; then it reserves nothing."""
        return self._closed

    def close(self) -> bool:
        """Give the reserved units and the shared-chain reference back. False if already closed or parked."""
        if self._closed:
            return False
        self._closed = True
        host = self._host
        host._reserved -= len(self._pages) + (self._slot is not None)
        host._free_pages.extend(reversed(self._pages))
        if self._slot is not None:
            host._free_slots.append(self._slot)
        self._pages, self._slot, self._new = [], None, []
        shared, self._shared = self._shared, None
        host._unref_chain(shared)
        tail, self._tail = self._tail, None
        host._unref_chain(tail)
        kept, self._kept_slot = self._kept_slot, None
        host._unref_slot(kept)
        return True


class Parked(Handle):
    """A checkpoint's copy on the host: `num_tokens`, `has_slot`, `paged`, host page ids, `plan`
    (device->host).

    Until `land()` it holds the device checkpoint and, apart from it, the checkpoint's pages and slot
    themselves (the copy reads them), so closing the checkpoint while the copy flies releases nothing;
    landing releases both. `landed` is True once its own copy and every in-flight park whose host pages
    it reuses have landed. `close()` (also dropping it) returns the host units (and the checkpoint if still
    held); before it has landed it first calls the host's `settle` hook, so an executor waits for the
    copies before any unit is reused.
    """

    __slots__ = ("_host", "num_tokens", "_chain", "_tail", "_slot", "_has_slot", "_paged", "plan",
                 "_checkpoint", "_source", "_after", "_closed", "__weakref__")

    def __init__(self, host: Host, num_tokens: int, has_slot: bool, paged: bool) -> None:
        self._host = host
        self.num_tokens = num_tokens
        self._has_slot = has_slot
        self._paged = paged
        self._chain: HostNode | None = None
        self._tail: HostNode | None = None
        self._slot: HostSlot | None = None
        self.plan = HostCopies("park")
        self._checkpoint: Checkpoint | None = None
        self._source: Checkpoint | None = None  # the pool's own hold on what the copy reads
        self._after: tuple[weakref.ref[Parked], ...] = ()  # in-flight parks writing host units it shares
        self._closed = False

    @property
    def has_slot(self) -> bool:
        """Whether the parked copy includes a host slot (the checkpoint had per-seq state)."""
        return self._has_slot

    @property
    def paged(self) -> bool:
        """Whether the parked checkpoint held pages (False: a slot-only checkpoint, e.g. a peer rank's)."""
        return self._paged

    @property
    def tail_page_id(self) -> int | None:
        """Host page of the partial last page (possibly shared with other parked entries)."""
        return self._tail.page_id if self._tail is not None else None

    @property
    def slot_id(self) -> int | None:
        """Host slot (possibly shared with other parked entries)."""
        return self._slot.slot_id if self._slot is not None else None

    @property
    def landed(self) -> bool:
        """True when every copy its host bytes come from is done: its own park (`land()`) and the in-flight
        parks whose host pages / slot it reuses (a checkpoint sharing pages with another checkpoint whose park
        is still writing them). Only then may it be woken or served by a lookup."""
        if self._source is not None:
            return False
        if self._after:
            if any(dep is not None and not dep.landed for dep in (ref() for ref in self._after)):
                return False
            self._after = ()  # landed once, landed for good
        return True

    @property
    def host(self) -> Host:
        """The `Host` tier it is parked in (an executor checks a Parked is its own)."""
        return self._host

    @property
    def closed(self) -> bool:
        """Whether the parked entry was closed; then it holds no host units (and no device checkpoint)."""
        return self._closed

    def host_page_ids(self) -> list[int]:
        """Host page ids of the parked copy in sequence order (chain pages, then the partial tail page)."""
        out: list[int] = []
        node = self._chain
        while node is not None:
            out.append(node.page_id)
            node = node.parent
        out.reverse()
        if self.tail_page_id is not None:
            out.append(self.tail_page_id)
        return out

    def land(self) -> None:
        """The executor reports this park's copies done: the device checkpoint and the park's own hold on its
        pages and slot are released. (`landed` also waits for the parks it shares host units with.)"""
        source, self._source = self._source, None
        cp, self._checkpoint = self._checkpoint, None
        if source is not None:
            source.close()
        if cp is not None:
            cp.close()

    def close(self) -> bool:
        """Return the host pages and slot (and the device checkpoint if the park has not landed; the host's
        `settle` hook runs first then). True if this call released them, False if already closed."""
        if self._closed:
            return False
        if not self.landed:
            self._host._settle(self)  # the copies read the checkpoint and write the host units
        self._closed = True
        self.land()
        self._host._release_parked(self)
        return True

    def __repr__(self) -> str:
        return f"Parked({self.num_tokens} tokens{', closed' if self._closed else ''})"


class Waking:
    """A lease being filled from the host. `plan` is host->device; `lease` raises `NotLanded` until
    the executor reports `land()`. Until then it also holds the host pages and slot the copies read, so
    closing the parked entry it wakes from frees none of them. `close()` (also dropping it) before taking
    the lease releases it; before `land()` it first calls the host's `settle` hook, so an executor waits for
    the copies before the pages (device or host) can be used again."""

    __slots__ = ("_host", "_lease", "plan", "_landed", "_taken", "_reads", "__weakref__")

    def __init__(self, host: Host, lease: Lease, plan: HostCopies,
                 reads: tuple[HostNode | None, HostNode | None, HostSlot | None] | None = None) -> None:
        self._host = host
        self._lease = lease
        self.plan = plan
        self._landed = False
        self._taken = False
        self._reads = reads  # (chain node, tail node, slot) the copies read, one reference each; None once landed

    @property
    def landed(self) -> bool:
        """Whether the executor reported the wake copies done (`land()`); only then is `lease` usable."""
        return self._landed

    @property
    def taken(self) -> bool:
        """The lease was handed out (`lease` read after landing) or the Waking was closed: nothing more to take."""
        return self._taken

    @property
    def lease_closed(self) -> bool:
        """The woken lease was closed (through this Waking or by its holder)."""
        return self._lease.closed

    @property
    def lease_copies(self) -> Copies:
        """The pool's own device plan for the woken lease (e.g. its fresh slot zeroed when the parked entry
        holds none); an executor runs it before `plan`'s host copies, and a rank following this pool
        (kern-runtime `copy`) runs it too. Readable before and after `land()`."""
        return self._lease.plan

    def land(self) -> None:
        """The executor reports the wake copies done. Raises `Closed` after `close()` (the lease is gone)."""
        if self._taken and self._lease.closed:
            raise Closed("land() of a Waking that was closed: its lease was released")
        self._landed = True
        self._release_reads()

    def _release_reads(self) -> None:
        reads, self._reads = self._reads, None
        if reads is not None:
            chain, tail, slot = reads
            self._host._unref_chain(chain)
            self._host._unref_chain(tail)
            self._host._unref_slot(slot)

    @property
    def lease(self) -> Lease:
        """The woken lease, once landed. Raises `NotLanded` before `land()`, `Closed` after `close()`."""
        if self._lease.closed:
            raise Closed("this Waking was closed: its lease was released")
        if not self._landed:
            raise NotLanded("wake copies have not landed: the lease is not usable yet")
        self._taken = True
        return self._lease

    def close(self) -> bool:
        """Release the woken lease (its device pages and slot) and the host units the copies read, unless the
        lease was already taken; before `land()` the host's `settle` hook runs first. True if the lease was
        released by this call, False once taken or closed."""
        if self._taken:
            return False
        if not self._landed:
            self._host._settle(self)  # the copies write the lease's pages and slot, and read host units
        self._taken = True
        self._release_reads()
        return self._lease.close()

    def __del__(self) -> None:
        if not getattr(self, "_taken", True):
            self.close()


class Host:
    """Pinned host tier of `num_pages` host pages and `num_slots` host slots for one pool."""

    def __init__(self, pool: Pool, num_pages: int, num_slots: int = 0, *,
                 settle: Callable[[Parked | Waking], None] | None = None) -> None:
        """Raises `Misuse` for a `pool` that is not a `Pool`, a pool that already has a live host tier (parked
        pages are linked from the pool's chain nodes, one link per node: two tiers would read each other's
        links), or sizes (counts of units) that are not ints >= 0.

        `settle`: the executor's hook for a `Parked` or `Waking` closed (or dropped) before `land()`:
        it returns once that entry's copies are done (and may land it), before any of its device or host
        units is released. Without it (pure accounting) they are released at once."""
        if not isinstance(pool, Pool):
            raise Misuse(f"Host needs a Pool, got {type(pool).__name__}")
        num_pages = check_count(num_pages, "Host num_pages")
        num_slots = check_count(num_slots, "Host num_slots")
        if pool._host_tier is not None and pool._host_tier() is not None:
            raise Misuse("this pool already has a host tier: one Host per Pool (parked pages are linked from the "
                         "pool's chain nodes); drop the other Host and every Room / Parked / Waking it handed out "
                         "(closed ones too) first")
        pool._host_tier = weakref.ref(self)
        self.settle = settle
        self.pool = pool
        self.num_pages = num_pages
        self.num_slots = num_slots
        self._free_pages = IdStack(0, num_pages)  # pop() -> lowest id; O(1) however many
        self._free_slots = IdStack(0, num_slots)
        self._parked: weakref.WeakSet[Parked] = weakref.WeakSet()
        self._rooms: weakref.WeakSet[Room] = weakref.WeakSet()  # open rooms (they hold shared chains)
        self._wakings: weakref.WeakSet[Waking] = weakref.WeakSet()  # wakes (in flight until landed or closed)
        self._reserved = 0  # host units held by open rooms

    @classmethod
    def from_bytes(cls, pool: Pool, host_bytes: int, turn_tokens: int) -> Host:
        """A host tier of `host_bytes` split by `host_split`."""
        pages, slots = host_split(host_bytes, pool.layout, turn_tokens)
        return cls(pool, pages, slots)

    @property
    def free_pages(self) -> int:
        """Host pages neither parked nor reserved by an open room."""
        return len(self._free_pages)

    @property
    def free_slots(self) -> int:
        """Host slots neither parked nor reserved by an open room."""
        return len(self._free_slots)

    def room(self, checkpoint: Checkpoint) -> Room:
        """Reserve host units for `checkpoint`: pages not already on the host (weak links) + slot.

        The room also holds a reference to the host chain the checkpoint already shares (released by
        `park` or `Room.close`). Raises `Busy` (host full: drop a parked entry; `err.checkpoint` is
        the untouched checkpoint), `ExceedsPool` (it can never fit on the host), `Misuse` (not a
        `Checkpoint` of this host's pool), `Closed`. A refusal changes nothing.
        """
        self._own_checkpoint(checkpoint, "room()")
        new: list[_Node] = []
        node = checkpoint._chain
        shared = None
        while node is not None:
            shared = _live_host(node)
            if shared is not None:
                break
            new.append(node)
            node = node.parent
        new.reverse()
        tail = _live(checkpoint.host_tail) if checkpoint.tail_page_id is not None else None
        kept_slot = _live(checkpoint.host_slot) if checkpoint.has_slot else None
        n_pages = len(new) + (checkpoint.tail_page_id is not None and tail is None)
        n_slots = 1 if checkpoint.has_slot and kept_slot is None else 0
        if n_pages > self.num_pages or n_slots > self.num_slots:
            raise ExceedsPool(f"{n_pages} host pages + {n_slots} slots exceed the host's {self.num_pages} + {self.num_slots}")
        if n_pages > len(self._free_pages) or n_slots > len(self._free_slots):
            raise Busy(f"host full: need {n_pages} pages + {n_slots} slots, free {len(self._free_pages)} + "
                       f"{len(self._free_slots)}", checkpoint=checkpoint)
        pages = self._free_pages.pop_many(n_pages)
        slot = self._free_slots.pop() if n_slots else None
        self._reserved += n_pages + n_slots
        for held in (shared, tail, kept_slot):
            if held is not None:
                held.refs += 1  # the room's own reference: it outlives the parked entries holding it
        room = Room(self, checkpoint, pages, slot, shared, new, tail, kept_slot)
        self._rooms.add(room)
        return room

    def park(self, room: Room) -> Parked:
        """Copy the room's checkpoint to the host. The plan lists only pages not already there.

        Consumes the room (its units and shared-chain reference pass to the parked entry). Raises
        `Misuse` (not a `Room` of this host), `Closed` (room closed or parked, or its checkpoint
        closed since `room()`: the room is then closed too).
        """
        if not isinstance(room, Room):
            raise Misuse(f"park() needs a Room from Host.room(), got {type(room).__name__}")
        if room._host is not self:
            raise Misuse("park() with a room of another host")
        if room._closed:
            raise Closed("park() with a closed room")
        cp = room.checkpoint
        if cp.closed:
            room.close()
            raise Closed("the checkpoint was closed after room()")
        parked = Parked(self, cp.num_tokens, cp.has_slot, cp.paged)
        me = weakref.ref(parked)
        # the shared host units may still be written by another park in flight: this one lands after it
        after = {id(w): w for w in map(_in_flight_writer, (room._shared, room._tail, room._kept_slot)) if w is not None}
        pages = list(room._pages)
        copies: list[PageCopy] = []
        chain, room._shared = room._shared, None  # the room's reference becomes the parked entry's
        for dev in room._new:
            host_page = pages.pop(0)
            chain = HostNode(host_page, chain)  # the new node holds its parent's reference
            chain.writer = me
            dev.host = weakref.ref(chain)
            copies.append(PageCopy(dev.page_id, host_page))
        parked._chain = chain
        parked._tail, room._tail = room._tail, None  # a kept tail: the room's reference passes on
        if cp.tail_page_id is not None and parked._tail is None:
            parked._tail = HostNode(pages.pop(0), None)
            parked._tail.writer = me
            copies.append(PageCopy(cp.tail_page_id, parked._tail.page_id))
        slot_copies: tuple[SlotCopy, ...] = ()
        parked._slot, room._kept_slot = room._kept_slot, None
        if room._slot is not None:
            parked._slot = HostSlot(room._slot)
            parked._slot.writer = me
            slot_copies = (SlotCopy(cp.seq_slot_id, room._slot),)  # type: ignore[arg-type]
        assert not pages, "kern bug: room reserved more host pages than the park used"
        self._reserved -= len(room._pages) + (room._slot is not None)
        room._pages, room._slot, room._new, room._closed = [], None, [], True
        parked.plan = HostCopies("park", tuple(copies), slot_copies)
        parked._checkpoint = cp
        parked._source = self.pool._copy_source(cp)  # the copy reads these until it lands, whoever closes cp
        parked._after = tuple(weakref.ref(w) for w in after.values())
        self._parked.add(parked)
        return parked

    def park_now(self, checkpoint: Checkpoint) -> Parked:
        """room + park + land in one step (copies ordered on the compute stream): the device pages
        return at once. Raises like `room`."""
        parked = self.park(self.room(checkpoint))
        parked.land()
        return parked

    def wake(self, parked: Parked, num_tokens: int, lease_tokens: int, *, hold: Any = None) -> Waking:
        """Lease `lease_tokens` tokens of pages and fill the first `num_tokens` (tokens) from `parked`.

        Only the pages covering `num_tokens` are copied (a partial hit wakes only what it needs), each
        page from its host copy. A slot-only entry (`parked.paged` False: parked from a slot-only
        checkpoint, and every entry of a pool without paged states) wakes into a slot-only lease, like
        `Pool.lease_from` of a slot-only checkpoint: `lease_tokens` must be 0 and only the slot is
        copied. `hold` is closed with the lease. Raises `Closed`, `Misuse` (not a `Parked` of this
        host, lengths not ints or out of range, a `hold` without `close()`) before anything is leased, and
        the pool's refusals (a refusal changes nothing).
        """
        if not isinstance(parked, Parked):
            raise Misuse(f"wake() needs a Parked from this host, got {type(parked).__name__}")
        if parked._host is not self:
            raise Misuse("wake() of a parked entry of another host")
        if parked.closed:
            raise Closed("wake() of a closed parked entry")
        num_tokens = check_count(num_tokens, "wake() num_tokens")
        lease_tokens = check_count(lease_tokens, "wake() lease_tokens")
        check_hold(hold, "wake()")
        paged = parked.paged
        if not 0 <= num_tokens <= parked.num_tokens or (lease_tokens < num_tokens if paged else lease_tokens != 0):
            raise Misuse(f"wake {num_tokens} of {parked.num_tokens} tokens into a lease of {lease_tokens}"
                         + ("" if paged else " (a slot-only parked entry reserves no tokens: pass 0)"))
        if num_tokens < parked.num_tokens and parked.has_slot:
            raise Misuse("a parked entry with per-seq state wakes only at its full length")
        if not parked.landed:
            raise NotLanded(f"wake() of {parked!r}: its park has not landed (its host pages are still being "
                            "written, by its own copy or by a park it shares pages with); wake it once "
                            "parked.landed is True")
        lease = self.pool.lease(lease_tokens) if paged else self.pool.lease_slot()
        P = self.pool.page_tokens
        full, partial = divmod(num_tokens, P) if paged else (0, 0)
        nodes: list[HostNode] = []
        node = parked._chain
        while node is not None:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        if parked._tail is not None:
            nodes.append(parked._tail)
        dev_pages = lease.page_ids()
        needed = full + (1 if partial else 0)
        copies = tuple(PageCopy(nodes[i].page_id, dev_pages[i]) for i in range(needed))
        if partial:  # the lease is frozen below num_tokens: its page `full` keeps the host page's first tokens
            lease._woken_tail = (full, partial, weakref.ref(nodes[full]))
        slot_copies: tuple[SlotCopy, ...] = ()
        if parked._slot is not None and lease.seq_slot_id is not None:
            slot_copies = (SlotCopy(parked._slot.slot_id, lease.seq_slot_id),)
            lease.plan = Copies()
            lease._woken_slot = (num_tokens, weakref.ref(parked._slot))
        lease._origins = {i: nodes[i] for i in range(full)}
        lease.prefix_tokens = lease._frozen = num_tokens
        lease._hold = hold
        # the copies read host units until they land: hold them (the node of the last page read holds the
        # pages before it; the tail page is a node of its own), so closing `parked` frees none of them
        in_chain = len(nodes) - (parked._tail is not None)
        read_chain = nodes[needed - 1] if 0 < needed <= in_chain else (parked._chain if needed else None)
        read_tail = parked._tail if needed > in_chain else None
        read_slot = parked._slot if slot_copies else None
        for unit in (read_chain, read_tail, read_slot):
            if unit is not None:
                unit.refs += 1
        waking = Waking(self, lease, HostCopies("wake", copies, slot_copies), (read_chain, read_tail, read_slot))
        self._wakings.add(waking)
        return waking

    def _settle(self, item: Parked | Waking) -> None:
        if self.settle is not None:
            self.settle(item)

    def _own_checkpoint(self, checkpoint: Checkpoint, what: str) -> None:
        """Misuse unless `checkpoint` is an open `Checkpoint` of this host's pool (Closed if closed)."""
        if not isinstance(checkpoint, Checkpoint):
            raise Misuse(f"{what} needs a Checkpoint, got {type(checkpoint).__name__}")
        if checkpoint._pool is not self.pool:
            raise Misuse(f"{what} with a checkpoint of another pool")
        if checkpoint.closed:
            raise Closed(f"{what} for a closed checkpoint")

    def _unref_chain(self, node: HostNode | None) -> None:
        """Drop one reference to the host chain ending at `node`; freed nodes die and free their page."""
        while node is not None:
            node.refs -= 1
            assert node.refs >= 0, "kern bug: host node released more often than held"
            if node.refs:
                return
            node.alive = False
            self._free_pages.append(node.page_id)
            node = node.parent

    def _unref_slot(self, slot: HostSlot | None) -> None:
        if slot is None:
            return
        slot.refs -= 1
        assert slot.refs >= 0, "kern bug: host slot released more often than held"
        if not slot.refs:
            slot.alive = False
            self._free_slots.append(slot.slot_id)

    def _release_parked(self, parked: Parked) -> None:
        node, tail, slot = parked._chain, parked._tail, parked._slot
        parked._chain = parked._tail = parked._slot = None
        self._unref_chain(node)
        self._unref_chain(tail)
        self._unref_slot(slot)

    def check(self) -> None:
        """Assert host accounting (kern bugs): node refs = holders (parked entries, open rooms, wakes in
        flight, child nodes), every unit free xor held once, reserved units = open rooms' units."""
        held_pages: list[int] = []
        held_slots: list[int] = []
        refs: dict[int, int] = {}
        nodes: dict[int, HostNode] = {}
        slots: dict[int, HostSlot] = {}

        def hold_slot(slot: HostSlot | None) -> None:
            if slot is not None:
                assert slot.alive, "kern bug: a parked entry or room holds a dead host slot"
                refs[id(slot)] = refs.get(id(slot), 0) + 1
                if id(slot) not in slots:
                    slots[id(slot)] = slot
                    held_slots.append(slot.slot_id)

        def hold(tail: HostNode | None) -> None:
            if tail is not None:
                refs[id(tail)] = refs.get(id(tail), 0) + 1
            node = tail
            while node is not None and id(node) not in nodes:
                assert node.alive, "kern bug: a parked entry or room holds a dead host node"
                nodes[id(node)] = node
                held_pages.append(node.page_id)
                if node.parent is not None:
                    refs[id(node.parent)] = refs.get(id(node.parent), 0) + 1
                node = node.parent

        reserved = 0
        for r in list(self._rooms):
            if not r._closed:
                hold(r._shared)
                hold(r._tail)
                hold_slot(r._kept_slot)
                reserved += len(r._pages) + (r._slot is not None)
        assert reserved == self._reserved, "kern bug: reserved host units differ from open rooms"
        for p in list(self._parked):
            if p.closed:
                continue
            hold(p._chain)
            hold(p._tail)
            hold_slot(p._slot)
        for w in list(self._wakings):  # a wake in flight holds what its copies read
            if w._reads is not None:
                chain, tail, slot = w._reads
                hold(chain)
                hold(tail)
                hold_slot(slot)
        for key, node in nodes.items():
            assert node.refs == refs.get(key, 0), "kern bug: host node refs differ from holders"
        for key, slot in slots.items():
            assert slot.refs == refs[key], "kern bug: host slot refs differ from holders"
        for held, free in ((held_pages, self._free_pages), (held_slots, self._free_slots)):
            assert len(set(free)) == len(free), "kern bug: duplicate free host unit"
            assert len(set(held)) == len(held), "kern bug: host unit held twice"
            assert not set(held) & set(free), "kern bug: host unit both free and held"
        total = len(held_pages) + len(self._free_pages) + len(held_slots) + len(self._free_slots) + self._reserved
        assert total == self.num_pages + self.num_slots, "kern bug: host units leaked"
