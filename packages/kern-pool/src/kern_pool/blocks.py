"""Physical blocks under the per-state virtual ranges.

Object i of a class (page or slot) occupies bytes `[i * object_bytes, (i + 1) * object_bytes)` of
every state of that class. A virtual block is mapped while at least one mapped object covers it (its
use count); a block straddling two objects is shared and unmapped only when its last user leaves.
Physical blocks not mapped anywhere sit on a LIFO free stack.

Setup is O(1) in the pool's size: the initial mapping (every state's first blocks, mapped to consecutive
physical blocks) is held as a rule, not as one entry per block, and a block gets its own entry only once
a remap touches it; the free stacks hold their never-used ids as one range (`IdStack`). So a pool of
millions of pages costs, before use, one refcount per page and slot id (`Pool`), not one object per block.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from .plans import BlockMove
from .sizing import Layout

PAGES = 0
SLOTS = 1


class IdStack:
    """A LIFO stack of ids (a free list) whose bottom is the descending run `hi - 1, ..., lo` (`lo` on top of
    it, popped first), held as two ints; ids pushed later sit in a list above it. Iterating goes bottom to
    top, as over the list `[hi - 1, ..., lo] + pushed` it stands for, so `pop()` returns the same ids in the
    same order as that list would, and building it is O(1) however many ids it holds."""

    __slots__ = ("_lo", "_hi", "_top")

    def __init__(self, lo: int, hi: int) -> None:
        self._lo = lo
        self._hi = max(lo, hi)
        self._top: list[int] = []

    def __len__(self) -> int:
        return self._hi - self._lo + len(self._top)

    def __iter__(self) -> Iterator[int]:
        yield from range(self._hi - 1, self._lo - 1, -1)
        yield from self._top

    def __repr__(self) -> str:
        return f"IdStack(run {self._lo}..{self._hi - 1}, pushed {self._top})"

    def append(self, oid: int) -> None:
        self._top.append(oid)

    def extend(self, ids: Iterable[int]) -> None:
        self._top.extend(ids)

    def pop(self) -> int:
        if self._top:
            return self._top.pop()
        if self._lo < self._hi:
            self._lo += 1
            return self._lo - 1
        raise IndexError("pop from an empty id stack")

    def pop_many(self, n: int) -> list[int]:
        """`n` ids (n <= len), in the order `n` pops would return them."""
        top = self._top
        k = min(n, len(top))
        out = top[len(top) - k:]
        del top[len(top) - k:]
        out.reverse()
        rest = n - k
        assert rest <= self._hi - self._lo, "kern bug: popping more ids than the stack holds"
        out.extend(range(self._lo, self._lo + rest))
        self._lo += rest
        return out

    def discard(self, ids: set[int]) -> None:
        """Remove `ids` (each on the stack), keeping the order of the rest. The highest ids of the run (the
        ones a remap takes first) come off its end without listing it."""
        self._top = [o for o in self._top if o not in ids]
        in_run = sorted((o for o in ids if self._lo <= o < self._hi), reverse=True)
        k = 0
        while k < len(in_run) and in_run[k] == self._hi - 1:
            k += 1
            self._hi -= 1
        in_run = in_run[k:]
        if in_run:  # ids inside the run: list it (O(run), as a plain list always was)
            gone = set(in_run)
            run = [o for o in range(self._hi - 1, self._lo - 1, -1) if o not in gone]
            self._top = run + self._top
            self._lo = self._hi = 0


class _Arena:
    """One state's virtual range: use count and physical block per virtual block index.

    The initial mapping is implicit: virtual blocks `0 .. base_blocks - 1` (those covering objects
    `0 .. base_objects - 1`) map to physical blocks `base_phys + b` with the use count those objects give,
    until `touch(b)` copies a block into `use` / `phys` (then they alone say whether it is mapped).
    """

    __slots__ = ("state_index", "object_bytes", "block_bytes", "use", "phys", "base_objects", "base_blocks",
                 "base_phys", "touched")

    def __init__(self, state_index: int, object_bytes: int, block_bytes: int, base_objects: int = 0,
                 base_phys: int = 0) -> None:
        self.state_index = state_index
        self.object_bytes = object_bytes
        self.block_bytes = block_bytes
        self.use: dict[int, int] = {}
        self.phys: dict[int, int] = {}
        self.base_objects = base_objects
        self.base_blocks = -(-base_objects * object_bytes // block_bytes)
        self.base_phys = base_phys
        self.touched: set[int] = set()  # initial blocks now held in use / phys

    def covering(self, object_id: int) -> range:
        """Virtual block indices covering object `object_id`."""
        start = object_id * self.object_bytes
        return range(start // self.block_bytes, (start + self.object_bytes - 1) // self.block_bytes + 1)

    def _base_use(self, b: int) -> int:
        """Initial objects covering initial block `b`: those starting before its end and ending after its start."""
        ob, bb = self.object_bytes, self.block_bytes
        return min(self.base_objects, -(-(b + 1) * bb // ob)) - b * bb // ob

    def _implicit(self, b: int) -> bool:
        return b < self.base_blocks and b not in self.touched

    def use_of(self, b: int) -> int:
        """Mapped objects covering virtual block `b` (0: unmapped). Pure."""
        n = self.use.get(b)
        if n is not None:
            return n
        return self._base_use(b) if self._implicit(b) else 0

    def touch(self, b: int) -> None:
        """Give an initial block its own `use` / `phys` entry (before changing it)."""
        if self._implicit(b):
            self.touched.add(b)
            self.use[b] = self._base_use(b)
            self.phys[b] = self.base_phys + b

    def all_use(self) -> dict[int, int]:
        """Every mapped virtual block's use count (O(blocks); for `check`)."""
        out = {b: self._base_use(b) for b in range(self.base_blocks) if b not in self.touched}
        out.update(self.use)
        return out

    def all_phys(self) -> dict[int, int]:
        """Every mapped virtual block's physical block (O(blocks))."""
        out = {b: self.base_phys + b for b in range(self.base_blocks) if b not in self.touched}
        out.update(self.phys)
        return out


class Blocks:
    """Block accounting for both object classes. Not thread-safe; the pool drives it."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        block = layout.block_bytes
        # The initial objects, mapped as map_objects would map them one by one from a free stack popping
        # 0, 1, 2, ...: each state in turn (pages first) takes the next run of physical blocks.
        arenas: list[_Arena] = []
        used = 0
        for index, (size, count) in enumerate([(b, layout.initial_pages) for b in layout.page_bytes]
                                              + [(b, layout.initial_slots) for b in layout.slot_bytes]):
            arena = _Arena(index, size, block, count, used)
            used += arena.base_blocks
            arenas.append(arena)
        assert used <= layout.num_blocks, "kern bug: the layout's initial objects need more blocks than it has"
        n_paged = len(layout.page_bytes)
        self.arenas: tuple[tuple[_Arena, ...], tuple[_Arena, ...]] = (tuple(arenas[:n_paged]), tuple(arenas[n_paged:]))
        self.free_phys = IdStack(used, layout.num_blocks)  # pop() -> lowest id

    def max_objects(self, cls: int) -> int:
        """Highest object count the reserved virtual range allows for class `cls`."""
        va = self.layout.va_bytes_per_state
        return min((va // a.object_bytes for a in self.arenas[cls]), default=0)

    def new_blocks_needed(self, cls: int, object_ids: Iterable[int]) -> int:
        """Physical blocks that mapping `object_ids` (currently unmapped) would take. Pure."""
        count = 0
        for arena in self.arenas[cls]:
            seen: set[int] = set()
            for oid in object_ids:
                for b in arena.covering(oid):
                    if b not in seen and not arena.use_of(b):
                        seen.add(b)
                        count += 1
        return count

    def blocks_freed(self, cls: int, object_ids: Iterable[int]) -> int:
        """Physical blocks that unmapping `object_ids` (currently mapped) would free. Pure."""
        count = 0
        for arena in self.arenas[cls]:
            drop: dict[int, int] = {}
            for oid in object_ids:
                for b in arena.covering(oid):
                    drop[b] = drop.get(b, 0) + 1
            count += sum(1 for b, d in drop.items() if arena.use_of(b) == d)
        return count

    def map_objects(self, cls: int, object_ids: Iterable[int]) -> list[BlockMove]:
        """Count `object_ids` as mapped; map a free physical block under every newly used block."""
        moves: list[BlockMove] = []
        ids = list(object_ids)
        for arena in self.arenas[cls]:
            for oid in ids:
                for b in arena.covering(oid):
                    arena.touch(b)
                    n = arena.use.get(b, 0)
                    arena.use[b] = n + 1
                    if n == 0:
                        assert self.free_phys, "kern bug: mapping without a free physical block"
                        p = self.free_phys.pop()
                        arena.phys[b] = p
                        moves.append(BlockMove(arena.state_index, b, p))
        return moves

    def unmap_objects(self, cls: int, object_ids: Iterable[int]) -> list[BlockMove]:
        """Count `object_ids` as unmapped; unmap blocks whose last user left (physical ids freed)."""
        moves: list[BlockMove] = []
        ids = list(object_ids)
        for arena in self.arenas[cls]:
            for oid in ids:
                for b in arena.covering(oid):
                    arena.touch(b)
                    n = arena.use[b] - 1
                    assert n >= 0, "kern bug: block use count below zero"
                    if n:
                        arena.use[b] = n
                    else:
                        del arena.use[b]
                        p = arena.phys.pop(b)
                        moves.append(BlockMove(arena.state_index, b, p))
        return moves

    def release_phys(self, moves: Iterable[BlockMove]) -> None:
        """Return the physical blocks of executed unmaps to the free stack (highest pushed first)."""
        for m in sorted(moves, key=lambda m: -m.physical_block_id):
            self.free_phys.append(m.physical_block_id)

    def mapping(self) -> tuple[BlockMove, ...]:
        """Every current mapping, by state then virtual block."""
        out: list[BlockMove] = []
        for arenas in self.arenas:
            for a in arenas:
                phys = a.all_phys()
                out.extend(BlockMove(a.state_index, b, phys[b]) for b in sorted(phys))
        return tuple(out)

    def check(self, mapped: tuple[Iterable[int], Iterable[int]]) -> None:
        """Assert: use counts equal the mapped objects covering each block; free + mapped = num_blocks."""
        held: list[int] = []
        for cls in (PAGES, SLOTS):
            ids = list(mapped[cls])
            for arena in self.arenas[cls]:
                want: dict[int, int] = {}
                for oid in ids:
                    for b in arena.covering(oid):
                        want[b] = want.get(b, 0) + 1
                use, phys = arena.all_use(), arena.all_phys()
                assert want == use, f"kern bug: block use counts of state {arena.state_index} drifted"
                assert set(phys) == set(use), "kern bug: mapped blocks differ from used blocks"
                assert not [b for b, n in arena.use.items() if n <= 0], "kern bug: a block kept with use count 0"
                held.extend(phys.values())
        assert len(set(held)) == len(held), "kern bug: a physical block is mapped twice"
        free = set(self.free_phys)
        assert len(free) == len(self.free_phys), "kern bug: duplicate free physical block"
        assert not set(held) & free, "kern bug: physical block both free and mapped"
        assert len(held) + len(self.free_phys) == self.layout.num_blocks, "kern bug: physical blocks leaked"
