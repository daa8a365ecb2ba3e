"""Prefix: a token-keyed radix tree over kept prefixes, in two tiers (Resident, Parked).

Generic over what it keeps: anything with `num_tokens`, `has_slot` and `close()` (a `Checkpoint`
and a host `Parked` on one device; a tuple of them on a tray), and optionally `landed`: an entry whose
kept object says `landed` False (a host `Parked` whose copy is still in flight) is filed but serves no
lookup until it lands. Rules:

* `insert(tokens, kept)` files `kept` at the node for exactly `tokens`; the same tokens are the same
  entry. A pure-KV entry (no slot) serves every depth along its path, so it makes shallower pure-KV
  entries of its tier redundant (they are dropped) and is itself redundant under a deeper one.
* `lookup(tokens)` gives the longest usable entry for a strict prefix of the prompt (never its last
  token): an entry with a slot is usable only at its own length; a pure-KV entry for as many tokens
  as it shares with the prompt; an entry not landed is not usable. Ties go to `Resident`. A hit locks
  its entry until closed.
  Lookups never change the tree structure (they only stamp the logical clock).
* `evict(park)` takes the coldest evictable resident entry (unlocked, and a leaf: no resident entry
  below it, or a pure-KV entry covered by a deeper one) and parks it through `park` or drops it.
* Time is a logical clock: the same sequence of calls always gives the same decisions.

Edges are token tuples compared with one slice comparison each (C speed), children keyed by the
edge's first token; a 32k-token lookup costs one 32k-element tuple comparison plus a dict lookup per
branch point, then (per tier) one subtree-count read per node on the path to find the pure-KV entry
sharing the most tokens, wherever it branches off the path.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from .errors import Closed, Misuse


class Kept(Protocol):
    """What the tree keeps: its length, whether it carries per-seq state, and how to release it."""

    @property
    def num_tokens(self) -> int: ...

    @property
    def has_slot(self) -> bool: ...

    def close(self) -> object: ...


def _usable(entry: Entry) -> bool:
    """Whether a lookup may serve `entry`: its kept object has landed (objects without `landed` always have) and
    is not closed (a checkpoint its owner closed after filing it, caller misuse: served, its `lease_from` would
    raise Closed; skipped, the prompt is prefilled and `evict` still drops the entry)."""
    kept = entry.kept
    return getattr(kept, "landed", True) is not False and getattr(kept, "closed", False) is not True


R = TypeVar("R", bound=Kept)
P = TypeVar("P", bound=Kept)


class Tier(enum.Enum):
    RESIDENT = "resident"
    PARKED = "parked"


Resident = Tier.RESIDENT
Parked = Tier.PARKED


class _TreeNode:
    __slots__ = ("parent", "edge", "depth", "children", "entries", "counts")

    def __init__(self, parent: _TreeNode | None, edge: tuple[int, ...], depth: int) -> None:
        self.parent = parent
        self.edge = edge
        self.depth = depth
        self.children: dict[int, _TreeNode] = {}
        self.entries: list[Entry | None] = [None, None]  # by tier index
        # entries in this subtree (self included): [resident, parked, resident kv, parked kv]
        self.counts = [0, 0, 0, 0]


_TIER_INDEX = {Tier.RESIDENT: 0, Tier.PARKED: 1}


def _tier_index(tier: Any) -> int:
    if not isinstance(tier, Tier):
        raise Misuse(f"tier must be Resident or Parked (a kern_pool.prefix.Tier), got {tier!r}")
    return _TIER_INDEX[tier]


class Entry:
    """One kept prefix in the tree. `clock`: logical time of its last use; `locks`: live hits."""

    __slots__ = ("kept", "node", "tier", "kv", "clock", "locks", "alive")

    def __init__(self, kept: Any, node: _TreeNode, tier: Tier, clock: int) -> None:
        self.kept = kept
        self.node = node
        self.tier = tier
        self.kv = not kept.has_slot
        self.clock = clock
        self.locks = 0
        self.alive = True

    @property
    def num_tokens(self) -> int:
        return self.node.depth


class Hit:
    """A lookup result: use `kept` for its first `num_tokens` tokens. Holds a lock on the entry
    (it is never evicted while the hit is open); `close()` releases it, a second close is a no-op."""

    __slots__ = ("kept", "num_tokens", "tier", "_entry", "_prefix")

    def __init__(self, prefix: Prefix[Any, Any], entry: Entry, num_tokens: int) -> None:
        self.kept = entry.kept
        self.num_tokens = num_tokens
        self.tier = entry.tier
        self._entry: Entry | None = entry
        self._prefix = prefix
        entry.locks += 1

    @property
    def closed(self) -> bool:
        """Whether the hit was closed (its entry's lock released)."""
        return self._entry is None

    def close(self) -> bool:
        """Release the lock on the entry. True if this call released it, False if already closed."""
        entry, self._entry = self._entry, None
        if entry is None:
            return False
        self._prefix._unlock(entry)
        return True

    def __enter__(self) -> Hit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if self._entry is not None:
            self.close()

    def __repr__(self) -> str:
        return f"Hit({self.num_tokens} tokens, {self.tier.value})"


@dataclass(frozen=True, slots=True)
class Eviction:
    """What `evict` did: the entry's length and whether it was parked (else dropped)."""

    num_tokens: int
    parked: bool


def _common(toks: tuple[int, ...], pos: int, edge: tuple[int, ...]) -> int:
    """Length of the common prefix of toks[pos:] and edge."""
    n = min(len(edge), len(toks) - pos)
    lo, step = 0, 64
    while lo + step <= n and toks[pos + lo : pos + lo + step] == edge[lo : lo + step]:
        lo += step
    while lo < n and toks[pos + lo] == edge[lo]:
        lo += 1
    return lo


class Prefix(Generic[R, P]):
    """The prefix index. Owns what it keeps: dropped entries are `close()`d."""

    def __init__(self) -> None:
        self._root = _TreeNode(None, (), 0)
        self._clock = 0
        self._heaps: tuple[list[tuple[int, int, Entry]], list[tuple[int, int, Entry]]] = ([], [])
        self._pushes = 0
        self._filed: set[int] = set()  # id() of every filed kept object (each entry holds its object)

    # ---- queries ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._root.counts[0] + self._root.counts[1]

    def count(self, tier: Tier) -> int:
        """Entries of `tier`. Raises `Misuse` for a tier that is not a `Tier`."""
        return self._root.counts[_tier_index(tier)]

    def entries(self) -> list[tuple[tuple[int, ...], Tier, Any]]:
        """(tokens, tier, kept) of every entry, depth-first in child order (for tests and tools)."""
        out: list[tuple[tuple[int, ...], Tier, Any]] = []
        stack: list[tuple[_TreeNode, tuple[int, ...]]] = [(self._root, ())]
        while stack:
            node, toks = stack.pop()
            for e in node.entries:
                if e is not None:
                    out.append((toks, e.tier, e.kept))
            for child in reversed(list(node.children.values())):
                stack.append((child, toks + child.edge))
        return out

    def structure(self) -> tuple[Any, ...]:
        """A hashable picture of the tree (edges, entries' tiers), to prove lookups change nothing."""

        def walk(node: _TreeNode) -> tuple[Any, ...]:
            tiers = tuple(e.tier.value if e else None for e in node.entries)
            return (node.edge, tiers, tuple(walk(c) for c in node.children.values()))

        return walk(self._root)

    def lookup(self, tokens: Sequence[int]) -> Hit | None:
        """Longest usable entry for a strict prefix of `tokens` (never the last token), or None.

        The hit's `num_tokens` is what to resume (a slot entry's own length; for a pure-KV entry the
        tokens it shares with the prompt, capped at len(tokens) - 1). Ties prefer `Resident`. An entry
        whose kept object is not `landed` (a host park in flight) is skipped. The entry is stamped with
        the clock and locked until the hit closes. No structure changes.

        Cost: one walk down the prompt's path (one slice comparison per edge, so O(len(tokens))
        token comparisons at C speed) with O(b) Python steps for the b nodes on the path; then, per
        tier, at most b subtree-count reads to find the deepest point of the path whose subtree
        holds a pure-KV entry (every such entry shares exactly that many tokens with the prompt, as
        it branches off the path there), and one descent to fetch that entry (a scan of the children
        of each node on the way down).
        """
        toks = tokens if type(tokens) is tuple else tuple(tokens)
        limit = len(toks) - 1
        if limit < 1:
            return None
        best: Entry | None = None
        best_len = 0
        node, pos = self._root, 0
        path: list[_TreeNode] = []  # nodes whose whole path the prompt matches, root first
        while True:
            if 0 < pos <= limit:
                for e in node.entries:
                    if e is not None and (pos > best_len or (pos == best_len and e.tier is Resident)) and _usable(e):
                        best, best_len = e, pos
            path.append(node)
            if pos >= len(toks):
                break
            child = node.children.get(toks[pos])
            if child is None:
                break
            edge = child.edge
            if toks[pos : pos + len(edge)] == edge:
                node, pos = child, pos + len(edge)
                continue
            # the prompt leaves (or ends inside) child's edge: all its subtree shares the new `pos` tokens
            path.append(child)
            pos += _common(toks, pos, edge)
            break
        # Pure-KV entries serve what they share with the prompt: the deepest path point whose subtree
        # holds one of the tier gives its length (the last point shares `pos`, each full node its depth).
        for ti in (0, 1):
            searched = None  # the subtree below this point already holds no usable pure-KV entry
            for i in range(len(path) - 1, 0, -1):
                point = path[i]
                if point.counts[2 + ti]:
                    usable = min(pos if i == len(path) - 1 else point.depth, limit)
                    if not (usable > best_len or (usable == best_len and ti == 0 and best is not None
                                                  and best.tier is Parked)):
                        break  # shallower points share fewer tokens still
                    found = self._find_usable_kv(point, ti, searched)
                    if found is not None:
                        best, best_len = found, usable
                        break
                searched = point
        if best is None:
            return None
        self._touch(best)
        return Hit(self, best, best_len)

    # ---- changes ---------------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], kept: R, tier: Tier = Resident) -> bool:
        """File `kept` (tier `tier`) under exactly `tokens`; the tree now owns it.

        Returns False when an equal entry already exists or a deeper pure-KV entry of the tier covers
        it: then `kept` is closed at once and the existing entry is stamped as used. Raises `Closed`
        for a closed `kept`, `Misuse` when `kept` is already filed in this tree (under any tokens or
        tier), `len(tokens) != kept.num_tokens`, tokens are empty or `tier` is not a `Tier`; a refusal
        changes nothing and the caller keeps `kept`.
        """
        toks = tokens if type(tokens) is tuple else tuple(tokens)
        n = len(toks)
        ti = self._admit(n, kept, tier)
        kv = not kept.has_slot
        node, pos, child, m = self._walk(toks)
        # Already there, or covered by a deeper pure-KV entry of this tier?
        if m == 0 and pos == n:
            same = node.entries[ti]
            if same is not None:
                self._touch(same)
                kept.close()
                return False
            below = node.counts[2 + ti]
        elif pos + m == n:
            below = child.counts[2 + ti]  # type: ignore[union-attr]
        else:
            below = 0
        if kv and below:
            self._touch(self._find_kv(node if m == 0 else child, ti))  # type: ignore[arg-type]
            kept.close()
            return False
        if m:
            node = self._split(child, m)  # type: ignore[arg-type]
            pos += m
        if pos < n:
            leaf = _TreeNode(node, toks[pos:], n)
            node.children[toks[pos]] = leaf
            node = leaf
        self._clock += 1
        entry = Entry(kept, node, tier, self._clock)
        node.entries[ti] = entry
        self._filed.add(id(kept))
        self._count(node, ti, kv, +1)
        self._push(entry)
        if kv:  # shallower unlocked pure-KV entries of this tier on the path are now redundant
            anc = node.parent
            while anc is not None:
                e = anc.entries[ti]
                parent = anc.parent
                if e is not None and e.kv and e.locks == 0:
                    self._remove(e, close=True)
                anc = parent
        return True

    def evict(self, park: Callable[[R], P | None] | None = None) -> Eviction | None:
        """Evict the coldest evictable resident entry; None when nothing can be evicted.

        With `park`, `park(kept)` may return the parked form (filed as `Parked` at the same tokens;
        the resident `kept` then belongs to it) or None (the entry is dropped and closed). An
        exception from `park`, or the `Closed` / `Misuse` `insert` would raise for what it returned,
        propagates and leaves the entry filed and evictable as before.
        """
        item = self._pop_victim(0)
        if item is None:
            return None
        entry = item[2]
        try:
            parked = park(entry.kept) if park is not None else None
            if parked is not None:
                self._admit(entry.node.depth, parked, Parked)
        except BaseException:
            heapq.heappush(self._heaps[0], item)  # put the victim back exactly: it is still filed
            raise
        n = entry.node.depth
        if parked is None:
            self._remove(entry, close=True)
            return Eviction(n, False)
        toks = self._path_tokens_of(entry.node, n)  # before removal: the node may be merged away
        self._remove(entry, close=False)
        self._insert_at_path(toks, parked)
        return Eviction(n, True)

    def evict_parked(self) -> bool:
        """Drop the coldest evictable parked entry (closing it). False when none can be dropped."""
        item = self._pop_victim(1)
        if item is None:
            return False
        self._remove(item[2], close=True)
        return True

    def clear(self) -> None:
        """Drop every unlocked entry, deepest first (locked ones stay)."""
        found: list[Entry] = []
        stack = [self._root]
        while stack:
            node = stack.pop()
            found.extend(e for e in node.entries if e is not None)
            stack.extend(node.children.values())
        found.sort(key=lambda e: -e.node.depth)
        for e in found:
            if e.alive and e.locks == 0:
                self._remove(e, close=True)

    # ---- internals -------------------------------------------------------------------------------
    def _admit(self, n: int, kept: Any, tier: Any) -> int:
        """The tier index for filing `kept` under `n` tokens, or `Closed` / `Misuse` (nothing changed; `Misuse` also
        for an object that is not a kept prefix, such as a live `Lease`)."""
        ti = _tier_index(tier)
        if not (hasattr(kept, "num_tokens") and hasattr(kept, "has_slot") and callable(getattr(kept, "close", None))):
            raise Misuse(f"insert: a {type(kept).__name__} is not a kept prefix (it needs num_tokens, has_slot and "
                         "close()): file a Checkpoint (pool.checkpoint / retire) or a host Parked, not a Lease")
        if getattr(kept, "closed", False) is True:
            raise Closed(f"insert: {kept!r} is closed")
        if id(kept) in self._filed:
            raise Misuse(f"insert: {kept!r} is already filed in this tree, which owns it")
        if n == 0 or n != kept.num_tokens:
            raise Misuse(f"insert: {n} tokens for a kept prefix of {kept.num_tokens} tokens")
        return ti

    def _walk(self, toks: tuple[int, ...]) -> tuple[_TreeNode, int, _TreeNode | None, int]:
        """Deepest node fully matched, its depth, the partly matched child and how far into its edge."""
        node, pos = self._root, 0
        while pos < len(toks):
            child = node.children.get(toks[pos])
            if child is None:
                return node, pos, None, 0
            edge = child.edge
            if toks[pos : pos + len(edge)] == edge:
                node, pos = child, pos + len(edge)
                continue
            return node, pos, child, _common(toks, pos, edge)
        return node, pos, None, 0

    def _split(self, child: _TreeNode, m: int) -> _TreeNode:
        """Cut `child`'s edge after m tokens; the new middle node takes over child's place."""
        parent = child.parent
        assert parent is not None and 0 < m < len(child.edge), "kern bug: bad split"
        mid = _TreeNode(parent, child.edge[:m], parent.depth + m)
        mid.counts = list(child.counts)
        parent.children[child.edge[0]] = mid
        child.edge = child.edge[m:]
        child.parent = mid
        mid.children[child.edge[0]] = child
        return mid

    def _path_tokens_of(self, node: _TreeNode, n: int) -> tuple[int, ...]:
        parts: list[tuple[int, ...]] = []
        while node.parent is not None:
            parts.append(node.edge)
            node = node.parent
        toks = tuple(t for part in reversed(parts) for t in part)
        assert len(toks) == n, "kern bug: path length differs from depth"
        return toks

    def _insert_at_path(self, toks: tuple[int, ...], parked: Any) -> None:
        node, pos, child, m = self._walk(toks)
        if m == 0 and pos == len(toks):
            old = node.entries[1]
            if old is not None:
                if old.locks:
                    parked.close()
                    self._touch(old)
                    return
                self._remove(old, close=True)
        self.insert(toks, parked, Parked)

    def _count(self, node: _TreeNode | None, ti: int, kv: bool, delta: int) -> None:
        while node is not None:
            c = node.counts
            c[ti] += delta
            if kv:
                c[2 + ti] += delta
            node = node.parent

    def _find_kv(self, node: _TreeNode, ti: int) -> Entry:
        """A pure-KV entry of tier ti in node's subtree (self first, then first child holding one)."""
        while True:
            e = node.entries[ti]
            if e is not None and e.kv:
                return e
            for child in node.children.values():
                if child.counts[2 + ti]:
                    node = child
                    break
            else:
                raise AssertionError("kern bug: kv count without a kv entry")

    def _find_usable_kv(self, node: _TreeNode, ti: int, searched: _TreeNode | None) -> Entry | None:
        """A usable (landed) pure-KV entry of tier ti in node's subtree, or None. `_find_kv`'s when that one
        is usable (the common case, and the same choice as before); else a search of the subtree that skips
        the child `searched` (already known to hold none), so one lookup visits each node at most once."""
        first = self._find_kv(node, ti)
        if _usable(first):
            return first
        stack = [node]
        while stack:
            at = stack.pop()
            e = at.entries[ti]
            if e is not None and e.kv and _usable(e):
                return e
            stack.extend(c for c in reversed(list(at.children.values())) if c is not searched and c.counts[2 + ti])
        return None

    def _touch(self, entry: Entry) -> None:
        self._clock += 1
        entry.clock = self._clock
        self._push(entry)

    def _push(self, entry: Entry) -> None:
        heap = self._heaps[_TIER_INDEX[entry.tier]]
        self._pushes += 1  # unique tie-breaker: the heap never compares entries, order is deterministic
        heapq.heappush(heap, (entry.clock, self._pushes, entry))
        if len(heap) > 64 and len(heap) > 4 * (self._root.counts[0] + self._root.counts[1] + 1):
            keep: dict[int, tuple[int, int, Entry]] = {}
            for item in heap:  # one item per live entry at its current clock, the latest push wins
                if item[2].alive and item[2].clock == item[0]:
                    keep[id(item[2])] = item
            heap[:] = keep.values()
            heapq.heapify(heap)

    def _evictable(self, entry: Entry) -> bool:
        ti = _TIER_INDEX[entry.tier]
        if not entry.alive or entry.locks:
            return False
        counts = entry.node.counts
        return counts[ti] == 1 or (entry.kv and counts[2 + ti] > 1)

    def _pop_victim(self, ti: int) -> tuple[int, int, Entry] | None:
        """Pop heap items up to the coldest evictable entry of tier ti; its item (clock, push, entry)."""
        heap = self._heaps[ti]
        while heap:
            item = heapq.heappop(heap)
            clock, _, entry = item
            if entry.alive and entry.clock == clock and self._evictable(entry):
                return item
        return None

    def _unlock(self, entry: Entry) -> None:
        entry.locks -= 1
        assert entry.locks >= 0, "kern bug: entry unlocked more often than locked"
        if entry.locks == 0 and entry.alive:
            self._push(entry)

    def _remove(self, entry: Entry, *, close: bool) -> None:
        """Take `entry` out of the tree (closing its kept object if `close`), prune and merge nodes."""
        assert entry.alive, "kern bug: entry removed twice"
        ti = _TIER_INDEX[entry.tier]
        node = entry.node
        node.entries[ti] = None
        entry.alive = False
        self._filed.discard(id(entry.kept))
        self._count(node, ti, entry.kv, -1)
        if close:
            entry.kept.close()
        # the nearest entry above of this tier may have become a leaf
        anc = node if node.counts[ti] else node.parent
        while anc is not None:
            e = anc.entries[ti]
            if e is not None:
                self._push(e)
                break
            anc = anc.parent
        # prune empty leaves, then merge a pass-through node into its only child
        while node.parent is not None and not node.children and node.entries == [None, None]:
            parent = node.parent
            del parent.children[node.edge[0]]
            node = parent
        if node.parent is not None and node.entries == [None, None] and len(node.children) == 1:
            (only,) = node.children.values()
            parent = node.parent
            only.edge = node.edge + only.edge
            only.parent = parent
            parent.children[node.edge[0]] = only


def check_prefix(prefix: Prefix[Any, Any]) -> None:
    """Assert the tree's invariants (kern bugs): counts match entries, no empty or pass-through
    node, every child filed under its own first token, depths add up, no dead entry filed, no kept
    object filed twice."""
    kept_ids: list[int] = []

    def walk(node: _TreeNode) -> list[int]:
        counts = [0, 0, 0, 0]
        for ti, e in enumerate(node.entries):
            if e is not None:
                assert e.alive and e.node is node and _TIER_INDEX[e.tier] == ti
                kept_ids.append(id(e.kept))
                counts[ti] += 1
                counts[2 + ti] += e.kv
        for key, child in node.children.items():
            assert child.edge and child.edge[0] == key, "kern bug: child filed under a wrong key"
            assert child.parent is node and child.depth == node.depth + len(child.edge)
            sub = walk(child)
            counts = [a + b for a, b in zip(counts, sub)]
        if node.parent is not None:
            assert node.edge, "kern bug: zero-length edge"
            has = node.entries != [None, None]
            assert has or len(node.children) >= 2, "kern bug: empty or pass-through node"
        assert counts == node.counts, f"kern bug: subtree counts {node.counts} != {counts}"
        return counts

    walk(prefix._root)
    assert len(set(kept_ids)) == len(kept_ids), "kern bug: one kept object filed twice"
    assert set(kept_ids) == prefix._filed, "kern bug: filed-object set differs from the entries"


__all__ = ["Entry", "Eviction", "Hit", "Kept", "Parked", "Prefix", "Resident", "Tier", "check_prefix", "Closed"]
