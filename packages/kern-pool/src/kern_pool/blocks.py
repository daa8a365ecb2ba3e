"""Physical blocks under the per-state virtual ranges.

Object i of a class (page or slot) occupies bytes `[i * object_bytes, (i + 1) * object_bytes)` of
every state of that class. A virtual block is mapped while at least one mapped object covers it (its
use count); a block straddling two objects is shared and unmapped only when its last user leaves.
Physical blocks not mapped anywhere sit on a LIFO free stack.
"""

from __future__ import annotations

from collections.abc import Iterable

from .plans import BlockMove
from .sizing import Layout

PAGES = 0
SLOTS = 1


class _Arena:
    """One state's virtual range: use count and physical block per virtual block index."""

    __slots__ = ("state_index", "object_bytes", "block_bytes", "use", "phys")

    def __init__(self, state_index: int, object_bytes: int, block_bytes: int) -> None:
        self.state_index = state_index
        self.object_bytes = object_bytes
        self.block_bytes = block_bytes
        self.use: dict[int, int] = {}
        self.phys: dict[int, int] = {}

    def covering(self, object_id: int) -> range:
        """Virtual block indices covering object `object_id`."""
        start = object_id * self.object_bytes
        return range(start // self.block_bytes, (start + self.object_bytes - 1) // self.block_bytes + 1)


class Blocks:
    """Block accounting for both object classes. Not thread-safe; the pool drives it."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        block = layout.block_bytes
        self.arenas: tuple[tuple[_Arena, ...], tuple[_Arena, ...]] = (
            tuple(_Arena(i, b, block) for i, b in enumerate(layout.page_bytes)),
            tuple(_Arena(len(layout.page_bytes) + j, b, block) for j, b in enumerate(layout.slot_bytes)),
        )
        self.free_phys: list[int] = list(range(layout.num_blocks - 1, -1, -1))  # pop() -> lowest id
        self.map_objects(PAGES, range(layout.initial_pages))
        self.map_objects(SLOTS, range(layout.initial_slots))

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
                    if b not in seen and not arena.use.get(b):
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
            count += sum(1 for b, d in drop.items() if arena.use[b] == d)
        return count

    def map_objects(self, cls: int, object_ids: Iterable[int]) -> list[BlockMove]:
        """Count `object_ids` as mapped; map a free physical block under every newly used block."""
        moves: list[BlockMove] = []
        ids = list(object_ids)
        for arena in self.arenas[cls]:
            for oid in ids:
                for b in arena.covering(oid):
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
        return tuple(
            BlockMove(a.state_index, b, a.phys[b])
            for arenas in self.arenas
            for a in arenas
            for b in sorted(a.phys)
        )

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
                assert want == arena.use, f"kern bug: block use counts of state {arena.state_index} drifted"
                assert set(arena.phys) == set(arena.use), "kern bug: mapped blocks differ from used blocks"
                held.extend(arena.phys.values())
        assert len(set(held)) == len(held), "kern bug: a physical block is mapped twice"
        assert len(set(self.free_phys)) == len(self.free_phys), "kern bug: duplicate free physical block"
        assert not set(held) & set(self.free_phys), "kern bug: physical block both free and mapped"
        assert len(held) + len(self.free_phys) == self.layout.num_blocks, "kern bug: physical blocks leaked"
