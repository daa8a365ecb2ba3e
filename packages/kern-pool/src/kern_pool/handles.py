"""Handles the pool hands out: `Lease` (a live sequence) and `Checkpoint` (a kept prefix).

A handle owns its references: closing it (explicitly, through `with`, or when it is dropped) returns
them; a second close is a checked no-op that returns False. Chain nodes (`_Node`) hold one sealed page
each and a reference to the node before it, so a sequence's checkpoints of any depth share one chain.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from .errors import Closed, Misuse, check_count
from .plans import Copies

if TYPE_CHECKING:
    from .pool import Pool

_NO_COPIES = Copies()


class Handle:
    """What every pool handle shares: `with` closes it, and so does dropping it while it is open.

    Subclasses set `self._closed` and define `close() -> bool` (True when that call released the
    references, False for a second close)."""

    __slots__ = ()
    _closed: bool
    close: Any  # () -> bool, defined by each subclass

    def __enter__(self):  # -> the subclass's own type
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()


class _Node:
    """A sealed page in a shared chain: page `page_id` at page index `index` of its sequence.

    `refs` counts direct holders: child nodes, leases whose chain ends here, checkpoints whose chain
    ends here. `host` is a weak reference to the node's copy on the host tier (None when not parked).
    """

    __slots__ = ("page_id", "parent", "index", "refs", "host", "__weakref__")

    def __init__(self, page_id: int, parent: _Node | None, index: int) -> None:
        self.page_id = page_id
        self.parent = parent
        self.index = index
        self.refs = 1
        self.host: weakref.ref[Any] | None = None


def node_at(tail: _Node | None, index: int) -> _Node | None:
    """The node at page index `index` of the chain ending at `tail` (None for index -1)."""
    if index < 0:
        return None
    node = tail
    while node is not None and node.index > index:
        node = node.parent
    assert node is not None and node.index == index, "kern bug: chain shorter than its handle says"
    return node


def chain_pages(tail: _Node | None) -> list[int]:
    """Page ids of the chain ending at `tail`, first page first."""
    out: list[int] = []
    node = tail
    while node is not None:
        out.append(node.page_id)
        node = node.parent
    out.reverse()
    return out


class Lease(Handle):
    """A live sequence: sealed chain pages + its own pages + (where the model has per-seq state) one slot.

    `prefix_tokens`: tokens inherited from a checkpoint / parent (never written by this lease).
    `plan`: the `Copies` to execute before the first use. Positions below `frozen_tokens` (the prefix,
    sealed pages, checkpointed lengths) are refused by `slot(pos)`. `reached_tokens`: the position the
    sequence has reached (`slot(pos)` raises it to `pos + 1`, `advance_to(n)` to `n`); a checkpoint, fork
    or retire of a lease holding a slot must name exactly it.
    """

    __slots__ = (
        "_pool", "_chain", "_pages", "_origins", "seq_slot_id", "prefix_tokens", "_frozen",
        "_closed", "_hold", "plan", "paged", "_woken_tail", "_woken_slot", "_reached", "__weakref__",
    )

    def __init__(self, pool: Pool, paged: bool) -> None:
        self._pool = pool
        self.paged = paged
        self._chain: _Node | None = None
        self._pages: list[int] = []
        self._origins: dict[int, Any] | None = None
        self.seq_slot_id: int | None = None
        self.prefix_tokens = 0
        self._frozen = 0
        self._reached = 0  # 1 + the highest position written (slot) or declared (advance_to)
        self._closed = False
        self._hold: Any = None
        self.plan = _NO_COPIES
        # set by Host.wake: (page index, tokens frozen in it, weak link to its host page) and (woken
        # length, weak link to the host slot); checkpoints inherit the links (Pool._make_checkpoint)
        self._woken_tail: tuple[int, int, Any] | None = None
        self._woken_slot: tuple[int, Any] | None = None

    @property
    def closed(self) -> bool:
        """Whether the lease was closed (by `close()`, `retire`, leaving a `with` block); then it holds nothing."""
        return self._closed

    @property
    def pool(self) -> Pool:
        """The `Pool` that leased it (its `page_tokens`, `scratch_page_id`; an executor checks ownership)."""
        return self._pool

    @property
    def sealed_pages(self) -> int:
        """Pages at the front that are sealed into a shared chain (never written again)."""
        return self._chain.index + 1 if self._chain is not None else 0

    @property
    def num_pages(self) -> int:
        """Pages the lease holds: sealed chain pages plus its own (reserved) pages."""
        return self.sealed_pages + len(self._pages)

    @property
    def capacity_tokens(self) -> int:
        """Tokens the lease's pages hold: `num_pages * page_tokens`."""
        return self.num_pages * self._pool.page_tokens

    @property
    def frozen_tokens(self) -> int:
        """Tokens below which `slot(pos)` refuses to write: the prefix, sealed pages, checkpointed (and, with a
        slot, forked) lengths."""
        return max(self._frozen, self.sealed_pages * self._pool.page_tokens)

    @property
    def reached_tokens(self) -> int:
        """Tokens the sequence has reached (its per-seq state's position, in tokens): the largest of the
        inherited prefix, `frozen_tokens`, `pos + 1` for every position handed out by `slot(pos)`, and the
        last `advance_to(n)`. Only grows."""
        return max(self._reached, self.prefix_tokens, self.frozen_tokens)

    def advance_to(self, num_tokens: int) -> None:
        """Declare that the sequence has consumed its first `num_tokens` tokens (for callers that write
        positions without `slot(pos)`: a slot mapping computed from `page_ids()`, a slot-only lease).

        Raises `Misuse` for a count that is not an int, below `reached_tokens` (a per-seq state cannot go
        back) or, paged, beyond the reserved pages; `Closed` after close. A refusal changes nothing."""
        self._check()
        num_tokens = check_count(num_tokens, "advance_to() num_tokens")
        reached = self.reached_tokens
        if num_tokens < reached:
            raise Misuse(f"advance_to({num_tokens}) on {self!r}: it has already reached {reached} tokens")
        if self.paged and num_tokens > self.capacity_tokens:
            raise Misuse(f"advance_to({num_tokens}) is beyond the lease's {self.capacity_tokens} tokens: grow it first")
        self._reached = num_tokens

    def page_ids(self) -> list[int]:
        """Page ids in sequence order (the block-table row). Raises `Closed` after close."""
        self._check()
        return chain_pages(self._chain) + self._pages

    def slot(self, pos: int) -> int:
        """Slot-mapping value for writing position `pos`: `page_id * page_tokens + pos % page_tokens`.
        Raises `reached_tokens` to at least `pos + 1` (the position is about to be written).

        Raises `Misuse` for a position that is not an int, before `frozen_tokens` (the prefix, a sealed
        page, a checkpointed length), beyond the reserved pages, or on a slot-only lease; `Closed` after
        close.
        """
        self._check()
        pos = check_count(pos, "position")
        if not self.paged:
            raise Misuse("slot(pos) on a slot-only lease: it has no pages")
        if pos < self.frozen_tokens:
            raise Misuse(f"position {pos} is below {self.frozen_tokens}: inherited, sealed or checkpointed")
        page_tokens = self._pool.page_tokens
        index = pos // page_tokens - self.sealed_pages
        if index >= len(self._pages):
            raise Misuse(f"position {pos} is beyond the lease's {self.capacity_tokens} tokens: grow it first")
        if pos >= self._reached:
            self._reached = pos + 1
        return self._pages[index] * page_tokens + pos % page_tokens

    def grow(self, num_tokens: int) -> None:
        """Reserve pages for `num_tokens` tokens in total (see `Pool.grow`)."""
        self._pool.grow(self, num_tokens)

    def close(self) -> bool:
        """Return every page, node and slot reference. True if this call released them."""
        if self._closed:
            return False
        self._pool._release_lease(self)
        return True

    def _check(self) -> None:
        if self._closed:
            raise Closed("lease is closed (released or retired)")

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.num_pages} pages, slot {self.seq_slot_id}"
        return f"Lease(prefix={self.prefix_tokens}, {state})"


class Checkpoint(Handle):
    """A kept prefix of `num_tokens` tokens: a shared chain of full pages, the partial last page
    (`tail_page_id`, shared, read only below `num_tokens`) and its own slot copy (`seq_slot_id`).

    Only its holder releases it (`close`); the pool never evicts a checkpoint. `has_slot` is False for
    pure-KV checkpoints, which `lease_from` may also resume at a shorter length.
    """

    __slots__ = (
        "_pool", "_chain", "tail_page_id", "seq_slot_id", "num_tokens", "paged", "_closed", "plan",
        "host_tail", "host_slot", "__weakref__",
    )

    def __init__(self, pool: Pool, num_tokens: int, paged: bool) -> None:
        self._pool = pool
        self.num_tokens = num_tokens
        self.paged = paged
        self._chain: _Node | None = None
        self.tail_page_id: int | None = None
        self.seq_slot_id: int | None = None
        self._closed = False
        self.plan = _NO_COPIES
        self.host_tail: Any = None  # weak link to a host copy of the tail's first tokens (see host.py)
        self.host_slot: Any = None  # weak link to a host copy of the slot at num_tokens

    @property
    def closed(self) -> bool:
        """Whether the checkpoint was closed (released by its holder); then it holds nothing."""
        return self._closed

    @property
    def has_slot(self) -> bool:
        """Whether it holds a slot (a copy of the per-seq state at `num_tokens`); False for pure-KV ones."""
        return self.seq_slot_id is not None

    @property
    def num_pages(self) -> int:
        """Pages it holds: full chain pages plus the partial last page, if any (`ceil(num_tokens / page_tokens)`;
        0 for a slot-only checkpoint)."""
        return (self._chain.index + 1 if self._chain is not None else 0) + (self.tail_page_id is not None)

    def page_ids(self) -> list[int]:
        """Page ids in sequence order. Raises `Closed` after close."""
        if self._closed:
            raise Closed("checkpoint is closed")
        pages = chain_pages(self._chain)
        if self.tail_page_id is not None:
            pages.append(self.tail_page_id)
        return pages

    def close(self) -> bool:
        """Return the chain, tail page and slot references. True if this call released them."""
        if self._closed:
            return False
        self._pool._release_checkpoint(self)
        return True

    def __repr__(self) -> str:
        return f"Checkpoint({self.num_tokens} tokens{', closed' if self._closed else ''})"
