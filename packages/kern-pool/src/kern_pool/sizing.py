"""Block size, capacity and the layout of the pooled states.

Source of the rules: the original runtime spec (state memory, K1b) and ARCHITECTURE.md section 5.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .errors import ExceedsPool, Misuse, check_count

MIB = 1 << 20
GIB = 1 << 30
GRANULARITY_BYTES = 2 * MIB  # cuMemGetAllocationGranularity on current NVIDIA GPUs
MAX_BLOCK_BYTES = 64 * MIB  # driver cost of a pool operation is per block: keep blocks few
HEADROOM_BYTES = 1 * GIB  # left free when `Capacity.tokens is None`
MAX_IDS = (1 << 31) - 1  # page and slot ids are int32 in block tables and slot mappings


def block_bytes_for(
    object_bytes: Sequence[int],
    granularity_bytes: int = GRANULARITY_BYTES,
    cap_bytes: int = MAX_BLOCK_BYTES,
) -> int:
    """Physical block size in bytes for pooled objects of the given sizes.

    A whole multiple of `granularity_bytes`, at most half the smallest object, at most `cap_bytes`.
    When the smallest object is under two granularities an object spans at most two blocks anyway, so
    the cap is taken. Raises `Misuse` for an empty size list, a size, granularity or cap that is not
    an int > 0, or a cap that is not a multiple of the granularity.
    """
    if isinstance(object_bytes, (str, bytes)) or not isinstance(object_bytes, Iterable):
        raise Misuse(f"object sizes must be a sequence of ints, got {type(object_bytes).__name__}")
    object_bytes = tuple(object_bytes)  # an iterator is read once
    if not object_bytes:
        raise Misuse("object sizes must be non-empty")
    for size in object_bytes:
        check_count(size, "object size in bytes", 1)
    check_count(granularity_bytes, "granularity_bytes", 1)
    check_count(cap_bytes, "cap_bytes", 1)
    if cap_bytes < granularity_bytes or cap_bytes % granularity_bytes:
        raise Misuse(f"cap {cap_bytes} B must be a positive multiple of the granularity {granularity_bytes} B")
    smallest = min(object_bytes)
    if smallest < 2 * granularity_bytes:
        return cap_bytes
    return min(cap_bytes, (smallest // 2) // granularity_bytes * granularity_bytes)


@dataclass(frozen=True, slots=True)
class PooledState:
    """A pooled state: paged (`bytes_per_token` > 0, page unit `page_tokens`) or per-seq (`bytes_per_seq` > 0).

    Raises `Misuse` for a name that is not a non-empty str, sizes that are not ints >= 0 or not exactly one of the
    two kinds."""

    name: str
    bytes_per_token: int = 0
    bytes_per_seq: int = 0
    page_tokens: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise Misuse(f"a pooled state's name must be a non-empty str, got {self.name!r}")
        check_count(self.bytes_per_token, f"state {self.name!r}: bytes_per_token")
        check_count(self.bytes_per_seq, f"state {self.name!r}: bytes_per_seq")
        check_count(self.page_tokens, f"state {self.name!r}: page_tokens")
        if (self.bytes_per_token > 0) == (self.bytes_per_seq > 0):
            raise Misuse(f"state {self.name!r}: exactly one of bytes_per_token / bytes_per_seq must be > 0")
        if self.bytes_per_token > 0 and self.page_tokens <= 0:
            raise Misuse(f"paged state {self.name!r}: page_tokens must be > 0, got {self.page_tokens}")

    @property
    def paged(self) -> bool:
        """Whether the state is paged (`bytes_per_token` > 0) rather than per-seq."""
        return self.bytes_per_token > 0


@dataclass(frozen=True, slots=True)
class Capacity:
    """What the caller wants to hold at once: `tokens` of paged state (None: fill free memory) and `seqs` sequences.

    Raises `Misuse` unless both are ints >= 0 (`tokens` may be None)."""

    tokens: int | None
    seqs: int

    def __post_init__(self) -> None:
        if self.tokens is not None:
            check_count(self.tokens, "Capacity tokens")
        check_count(self.seqs, "Capacity seqs")


def _blocks_covering(num_objects: int, object_bytes: int, block_bytes: int) -> int:
    """Blocks needed for objects 0..num_objects-1 laid end to end from offset 0."""
    return -(-num_objects * object_bytes // block_bytes)


@dataclass(frozen=True, slots=True)
class Layout:
    """Pooled memory: object sizes per state, block size and counts. Everything is an integer.

    `page_bytes[i]` is one page (`page_tokens` tokens) of paged state i; `slot_bytes[j]` one slot of
    per-seq state j. `states` lists state names pages first, then slots (the `state_index` of a
    `BlockMove`). `num_blocks` physical blocks of `block_bytes` exist; at start pages
    `0..initial_pages-1` and slots `0..initial_slots-1` are mapped (page 0 and slot 0 are scratch).
    Each state reserves `num_blocks * block_bytes` of virtual range, enough for every block at once.
    Raises `Misuse` for a field that is not an int (sizes > 0, counts >= 0), objects that do not fit, or
    more than `MAX_IDS` initial pages or slots (ids are int32 on the device).
    """

    page_tokens: int
    page_bytes: tuple[int, ...]
    slot_bytes: tuple[int, ...]
    block_bytes: int
    num_blocks: int
    initial_pages: int
    initial_slots: int
    states: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("page_bytes", "slot_bytes", "states"):
            if not isinstance(getattr(self, name), tuple):
                raise Misuse(f"Layout {name} must be a tuple, got {type(getattr(self, name)).__name__}")
        for name in ("page_tokens", "num_blocks", "initial_pages", "initial_slots"):
            check_count(getattr(self, name), f"Layout {name}")
        check_count(self.block_bytes, "Layout block_bytes", 1)
        for size in self.page_bytes + self.slot_bytes:
            check_count(size, "Layout page / slot bytes", 1)
        if not self.page_bytes and not self.slot_bytes:
            raise Misuse("a layout needs at least one pooled state")
        if self.page_bytes and (self.page_tokens <= 0 or self.initial_pages < 1):
            raise Misuse(f"paged layout needs page_tokens > 0 and >= 1 page (scratch), got {self.page_tokens}, {self.initial_pages}")
        if self.slot_bytes and self.initial_slots < 1:
            raise Misuse(f"per-seq layout needs >= 1 slot (scratch), got {self.initial_slots}")
        if not self.page_bytes and self.initial_pages:
            raise Misuse("pages without paged states")
        if not self.slot_bytes and self.initial_slots:
            raise Misuse("slots without per-seq states")
        for what, count in (("initial_pages", self.initial_pages), ("initial_slots", self.initial_slots)):
            if count > MAX_IDS:
                raise Misuse(f"Layout {what} {count}: ids are int32 on the device, at most {MAX_IDS}")
        used = sum(_blocks_covering(self.initial_pages, b, self.block_bytes) for b in self.page_bytes)
        used += sum(_blocks_covering(self.initial_slots, b, self.block_bytes) for b in self.slot_bytes)
        if used > self.num_blocks:
            raise Misuse(f"initial objects need {used} blocks, only {self.num_blocks} exist")
        n_states = len(self.page_bytes) + len(self.slot_bytes)
        if self.states and (len(self.states) != n_states or len(set(self.states)) != n_states
                            or not all(isinstance(n, str) and n for n in self.states)):
            raise Misuse(f"Layout states {self.states!r}: one distinct non-empty name per pooled state, pages first "
                         f"({len(self.page_bytes)} paged + {len(self.slot_bytes)} per-seq)")
        if not self.states:
            names = tuple(f"page{i}" for i in range(len(self.page_bytes))) + tuple(
                f"slot{j}" for j in range(len(self.slot_bytes))
            )
            object.__setattr__(self, "states", names)

    @property
    def paged(self) -> bool:
        """Whether the layout has paged states (pages of `page_tokens` tokens; `page_bytes` non-empty)."""
        return bool(self.page_bytes)

    @property
    def has_slots(self) -> bool:
        """Whether the layout has per-seq states (one slot per sequence; `slot_bytes` non-empty)."""
        return bool(self.slot_bytes)

    @property
    def va_bytes_per_state(self) -> int:
        """Virtual range each state reserves (never moved): room for every physical block."""
        return self.num_blocks * self.block_bytes

    @classmethod
    def simple(cls, page_tokens: int, pages: int, slots: int = 0, *, blocks_per_page: int = 1) -> Layout:
        """A test / simulator layout: one paged state, optionally one per-seq state of one block per slot.

        `pages` and `slots` are the leasable counts; the scratch page / slot are added on top, and the
        block budget is exactly what they need (block = page when `blocks_per_page` is 1). Raises
        `Misuse` for counts that are not ints (`page_tokens`, `blocks_per_page` > 0; the rest >= 0) or `pages` /
        `slots` past the int32 ids.
        """
        check_count(page_tokens, "Layout.simple page_tokens", 1)
        for what, count in (("pages", pages), ("slots", slots)):
            if check_count(count, f"Layout.simple {what}") >= MAX_IDS:
                raise Misuse(f"Layout.simple {what} {count}: ids are int32 on the device, at most {MAX_IDS - 1} "
                             "leasable (plus the scratch one)")
        check_count(blocks_per_page, "Layout.simple blocks_per_page", 1)
        block = MIB
        n_pages = pages + 1
        n_slots = slots + 1 if slots else 0
        return cls(
            page_tokens=page_tokens,
            page_bytes=(block * blocks_per_page,),
            slot_bytes=(block,) if slots else (),
            block_bytes=block,
            num_blocks=n_pages * blocks_per_page + n_slots,
            initial_pages=n_pages,
            initial_slots=n_slots,
        )

    @classmethod
    def from_capacity(
        cls,
        states: Sequence[PooledState],
        capacity: Capacity,
        *,
        free_bytes: int | None = None,
        granularity_bytes: int = GRANULARITY_BYTES,
        cap_bytes: int = MAX_BLOCK_BYTES,
        headroom_bytes: int = HEADROOM_BYTES,
    ) -> Layout:
        """Size the pool for `capacity`.

        tokens are aligned down to the largest page unit (the block-table stride; every paged state's
        `page_tokens` must divide it, else `Misuse`); slots are
        `seqs + 2` (slot 0 of them is the scratch slot); one scratch page is added on top of the
        tokens. Budget bytes = tokens * sum(bytes_per_token) + (seqs + 2) * sum(bytes_per_seq)
        (+ one scratch page), rounded up to whole blocks per state on its own. `tokens=None` fills
        `free_bytes - headroom_bytes`: tokens is the largest multiple of the page unit whose final
        layout (scratch page, slots, every state rounded up to whole blocks) takes at most that many
        bytes, so `num_blocks * block_bytes <= free_bytes - headroom_bytes`. With `tokens` given,
        `free_bytes` (if given) bounds the layout too: no headroom is taken, but a layout whose
        `num_blocks * block_bytes` exceeds `free_bytes` is refused. Raises `Misuse` for bad
        inputs (sizes that are not ints >= 0), `ExceedsPool` when `tokens` is None and
        `free_bytes - headroom_bytes` does not hold the layout with one page (and the scratch page and
        the slots), or, without paged states, the slots; when `tokens` is given and the layout needs
        more than `free_bytes`; or when it needs more than `MAX_IDS` pages or slots (ids are int32; a
        fill stops there, and the objects an arena's last block would add past it are not mapped).
        """
        if free_bytes is not None:
            check_count(free_bytes, "free_bytes")
        check_count(headroom_bytes, "headroom_bytes")
        if not isinstance(capacity, Capacity):
            raise Misuse(f"from_capacity needs a Capacity, got {type(capacity).__name__}")
        if isinstance(states, (str, bytes)) or not isinstance(states, Iterable):
            raise Misuse(f"states must be a sequence of PooledState, got {type(states).__name__}")
        states = tuple(states)  # an iterator is read once
        for i, s in enumerate(states):
            if not isinstance(s, PooledState):
                raise Misuse(f"states[{i}] is a {type(s).__name__}, expected a PooledState")
        paged = [s for s in states if s.paged]
        per_seq = [s for s in states if not s.paged]
        if not states:
            raise Misuse("no pooled states")
        page_tokens = max((s.page_tokens for s in paged), default=0)
        if any(page_tokens % s.page_tokens for s in paged):  # a page of the largest unit holds whole smaller pages
            raise Misuse(f"every paged state's page_tokens must divide the largest, {page_tokens}; got "
                         + ", ".join(f"{s.name} {s.page_tokens}" for s in paged))
        page_bytes = tuple(s.bytes_per_token * page_tokens for s in paged)
        slot_bytes = tuple(s.bytes_per_seq for s in per_seq)
        block = block_bytes_for(page_bytes + slot_bytes, granularity_bytes, cap_bytes)
        n_slots = capacity.seqs + 2 if per_seq else 0
        slot_blocks = [_blocks_covering(n_slots, b, block) for b in slot_bytes]

        def page_blocks(n_pages: int) -> list[int]:
            return [_blocks_covering(n_pages, b, block) for b in page_bytes]

        tokens = capacity.tokens
        if tokens is None:
            if free_bytes is None:
                raise Misuse("Capacity.tokens is None: pass free_bytes (what the device reports free)")
            budget_blocks = (free_bytes - headroom_bytes) // block if free_bytes >= headroom_bytes else -1
            left = budget_blocks - sum(slot_blocks)  # blocks the page arenas may take
            if not paged:
                if left < 0:
                    raise ExceedsPool(f"{free_bytes} B free less {headroom_bytes} B headroom does not hold "
                                      f"{n_slots} slots ({sum(slot_blocks)} blocks of {block} B)")
                tokens = 0
            else:
                # Pages per state rounded up to whole blocks is monotone in the page count: bisect for the
                # most leasable pages k (k + 1 with the scratch page) whose arenas fit in `left` blocks.
                # (k + 1) * sum(page_bytes) <= left * block bounds k from above.
                # Ids are int32: at most MAX_IDS pages, the scratch page included, also after rounding up.
                lo, hi = 0, min(max(left, 0) * block // sum(page_bytes), MAX_IDS - 1)
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if sum(page_blocks(mid + 1)) <= left:
                        lo = mid
                    else:
                        hi = mid - 1
                if lo < 1:
                    raise ExceedsPool(f"{free_bytes} B free less {headroom_bytes} B headroom holds no page")
                tokens = lo * page_tokens
        if paged:
            tokens = tokens // page_tokens * page_tokens
        n_pages = tokens // page_tokens + 1 if paged else 0
        arena_blocks = page_blocks(n_pages) + slot_blocks
        need_bytes = sum(arena_blocks) * block
        asked = f"Capacity(tokens={capacity.tokens}, seqs={capacity.seqs})"
        if capacity.tokens is not None and free_bytes is not None and need_bytes > free_bytes:
            raise ExceedsPool(f"{asked} needs {need_bytes} bytes ({sum(arena_blocks)} blocks of {block} B); "
                              f"free_bytes says the device has {free_bytes} bytes free")
        for what, count in (("pages", n_pages), ("slots", n_slots)):
            if count > MAX_IDS:
                raise ExceedsPool(f"{asked} needs {count} {what} (scratch included): ids are int32 on the device, "
                                  f"at most {MAX_IDS}")
        # Objects that fit in each state's whole-block arena (>= what was asked, often a few more; never more
        # than the int32 ids can number).
        pages = min(min((n * block // b for n, b in zip(arena_blocks, page_bytes)), default=0), MAX_IDS)
        slots = min(min((n * block // b for n, b in zip(arena_blocks[len(page_bytes):], slot_bytes)), default=0),
                    MAX_IDS)
        return cls(
            page_tokens=page_tokens if paged else 0,
            page_bytes=page_bytes,
            slot_bytes=slot_bytes,
            block_bytes=block,
            num_blocks=sum(arena_blocks),
            initial_pages=pages,
            initial_slots=slots,
            states=tuple(s.name for s in paged) + tuple(s.name for s in per_seq),
        )
