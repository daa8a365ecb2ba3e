"""`Capacity(tokens=None)`: the pool fills free memory less the headroom, and never more.

Spec (state memory, K1b): with tokens None the pool takes what cuMemGetInfo reports free after every
other allocation, less HEADROOM (1 GiB); each pooled state is its own whole-block arena, rounded up on
its own. The token count is therefore chosen on the final, rounded layout: the largest multiple of the
page unit whose layout (scratch page, seqs + 2 slots, every state rounded up to whole blocks) takes at
most `free - headroom` bytes. Explicit tokens are sized by the same rule; with `free_bytes` passed, a layout
of more bytes than that is `ExceedsPool` (no headroom taken).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kern_pool import Capacity, ExceedsPool, Layout, PooledState
from kern_pool.sizing import GIB, HEADROOM_BYTES, MAX_IDS, MIB


def total(layout: Layout) -> int:
    return layout.num_blocks * layout.block_bytes


def qwen3_4b_kv() -> list[PooledState]:
    # 36 layers of K+V, 8 heads x 128 x bf16 x 2 = 4 KiB per token, 16-token pages: 64 KiB pages, 64 MiB blocks
    return [PooledState(f"kv.{i}", bytes_per_token=4096, page_tokens=16) for i in range(36)]


def test_qwen3_4b_at_40_gib_free_stays_within_free_less_headroom() -> None:
    """The audit's case: 40 GiB free used to size a 40.5 GiB pool (1.5 GiB past free - headroom).

    39 GiB / 144 KiB per token = 283989 tokens -> 17749 pages + scratch -> 18 blocks (1024 pages each) per
    state -> 648 blocks = 40.5 GiB. Pages grow on all 36 states together, so the pool grows in steps of
    36 blocks (2.25 GiB): 17 blocks per state (612 = 38.25 GiB) is the most that fits in 39 GiB."""
    layout = Layout.from_capacity(qwen3_4b_kv(), Capacity(tokens=None, seqs=1), free_bytes=40 * GIB)
    assert layout.block_bytes == 64 * MIB
    assert layout.num_blocks == 36 * 17
    assert total(layout) == 38 * GIB + 256 * MIB <= 39 * GIB
    assert layout.initial_pages == 17 * 1024  # 17407 leasable pages + the scratch page
    one_more = Layout.from_capacity(qwen3_4b_kv(), Capacity(tokens=17408 * 16, seqs=1))
    assert total(one_more) == 40 * GIB + 512 * MIB > 39 * GIB


def test_no_room_for_one_page_per_state_is_exceeds_pool() -> None:
    # 36 states need at least 36 x 64 MiB = 2.25 GiB: 3 GiB free less 1 GiB does not hold it
    with pytest.raises(ExceedsPool):
        Layout.from_capacity(qwen3_4b_kv(), Capacity(tokens=None, seqs=1), free_bytes=3 * GIB)
    layout = Layout.from_capacity(qwen3_4b_kv(), Capacity(tokens=None, seqs=1), free_bytes=3 * GIB + 256 * MIB)
    assert total(layout) == 2 * GIB + 256 * MIB and layout.initial_pages == 1024
    with pytest.raises(ExceedsPool):  # free below the headroom
        Layout.from_capacity(qwen3_4b_kv(), Capacity(tokens=None, seqs=1), free_bytes=GIB - 1)


def test_slots_come_out_of_the_budget_first() -> None:
    kv = PooledState("kv", bytes_per_token=MIB, page_tokens=16)  # 16 MiB pages
    rec = PooledState("rec", bytes_per_seq=40 * MIB)  # block 8 MiB: (1 + 2) slots x 40 MiB = 15 blocks
    layout = Layout.from_capacity([kv, rec], Capacity(tokens=None, seqs=1), free_bytes=2 * GIB)
    assert layout.block_bytes == 8 * MIB
    assert total(layout) <= GIB
    # 128 blocks - 15 for slots = 113 -> 56 pages of 2 blocks (55 leasable + scratch)
    assert layout.initial_pages == 56 and layout.num_blocks == 112 + 15
    # per-seq states only: nothing to fill, but the slots must still fit in free - headroom
    only = Layout.from_capacity([rec], Capacity(tokens=None, seqs=1), free_bytes=GIB + 120 * MIB)
    assert total(only) == 120 * MIB and not only.paged
    with pytest.raises(ExceedsPool):
        Layout.from_capacity([rec], Capacity(tokens=None, seqs=1), free_bytes=GIB + 119 * MIB)


# ---------------------------------------------------------------- properties


@dataclass(frozen=True)
class Shape:
    states: tuple[PooledState, ...]
    seqs: int
    granularity: int
    cap: int

    def layout(self, tokens: int | None, **kw: int) -> Layout:
        return Layout.from_capacity(self.states, Capacity(tokens=tokens, seqs=self.seqs),
                                    granularity_bytes=self.granularity, cap_bytes=self.cap, **kw)

    @property
    def page_tokens(self) -> int:
        return max((s.page_tokens for s in self.states if s.paged), default=0)


@st.composite
def shapes(draw: st.DrawFn) -> Shape:
    granularity = draw(st.sampled_from([4096, 64 * 1024, 2 * MIB]))
    cap = granularity * draw(st.sampled_from([1, 2, 3, 8, 32]))
    n_paged = draw(st.one_of(st.integers(0, 4), st.integers(0, 80)))
    n_seq = draw(st.integers(0 if n_paged else 1, 4))
    per_token = st.one_of(st.integers(1, 16 * 1024), st.integers(1, 2 * MIB))
    # page units that divide the largest (others are refused): a unit's divisors, or powers of two
    units = draw(st.sampled_from([[1, 2, 16, 64, 256], [1, 3], [3, 6, 48]]))
    states = [PooledState(f"kv.{i}", bytes_per_token=draw(per_token), page_tokens=draw(st.sampled_from(units)))
              for i in range(n_paged)]
    per_seq = st.one_of(st.integers(1, 4 * MIB), st.integers(1, GIB))
    states += [PooledState(f"rec.{j}", bytes_per_seq=draw(per_seq)) for j in range(n_seq)]
    order = draw(st.permutations(states))  # paged and per-seq states interleaved as a manifest may list them
    return Shape(tuple(order), draw(st.integers(0, 64)), granularity, cap)


HEADROOMS = st.one_of(st.just(HEADROOM_BYTES), st.integers(0, 4 * GIB))


@settings(max_examples=600, deadline=None)
@given(shape=shapes(), headroom=HEADROOMS, data=st.data())
def test_filling_free_memory_fits_and_is_maximal(shape: Shape, headroom: int, data: st.DataObject) -> None:
    """What is asserted, for tokens None and any shape, free bytes and headroom:

    * fits: the layout's whole pool (`num_blocks * block_bytes`) is at most `free - headroom`;
    * same rules as explicit tokens: the layout equals the one explicit `tokens = (P - 1) * page_tokens`
      gives, P being its page count (the scratch page included), so it is page-aligned and rounded per
      state exactly as an explicit capacity is;
    * maximal: one more page (`tokens = P * page_tokens`) would not fit in `free - headroom` -- exact
      maximality among page-aligned token counts, since pool bytes never shrink as tokens grow -- or the
      pool has `MAX_IDS` pages, the most int32 ids number (one more is ExceedsPool);
    * ExceedsPool exactly when the smallest layout (one page and the scratch page, or for per-seq
      states only the seqs + 2 slots) does not fit.
    """
    paged = shape.page_tokens > 0
    smallest = shape.layout(shape.page_tokens if paged else 0)
    # free memory beyond the headroom: anything from below the headroom up to 8 TiB, or a multiple of the
    # smallest pool give or take a few blocks (so that both outcomes and the boundary are well covered)
    extra = data.draw(st.one_of(
        st.integers(-GIB, 4 * GIB),
        st.integers(0, 42).flatmap(lambda e: st.integers(1 << e, 1 << (e + 1))),
        st.builds(lambda k, d: k * total(smallest) + d * smallest.block_bytes,
                  st.integers(0, 5000), st.integers(-3, 3)),
    ), label="free - headroom")
    free = max(0, headroom + extra)
    budget = free - headroom
    try:
        layout = shape.layout(None, free_bytes=free, headroom_bytes=headroom)
    except ExceedsPool:
        assert total(smallest) > budget
        return
    assert total(layout) <= budget
    if not paged:
        assert layout == smallest
        return
    pages = layout.initial_pages
    assert pages >= 2  # at least one page besides the scratch page
    assert layout == shape.layout((pages - 1) * shape.page_tokens)
    if pages == MAX_IDS:
        with pytest.raises(ExceedsPool, match=f"needs {MAX_IDS + 1} pages .*ids are int32"):
            shape.layout(pages * shape.page_tokens)
    else:
        assert total(shape.layout(pages * shape.page_tokens)) > budget


@settings(max_examples=300, deadline=None)
@given(shape=shapes(), tokens=st.integers(0, 1 << 24))
def test_explicit_tokens_are_sized_as_the_rule_says(shape: Shape, tokens: int) -> None:
    """Explicit tokens (unchanged by the tokens-None fix): aligned down to the page unit, one scratch page
    and seqs + 2 slots on top, each state rounded up to whole blocks on its own; `free_bytes` only bounds the
    result (exactly enough is accepted and changes nothing, a byte less is ExceedsPool)."""
    layout = shape.layout(tokens)
    block = layout.block_bytes
    paged = [s for s in shape.states if s.paged]
    per_seq = [s for s in shape.states if not s.paged]
    n_pages = tokens // shape.page_tokens + 1 if paged else 0
    n_slots = shape.seqs + 2 if per_seq else 0
    blocks = [-(-n_pages * s.bytes_per_token * shape.page_tokens // block) for s in paged]
    blocks += [-(-n_slots * s.bytes_per_seq // block) for s in per_seq]
    assert layout.num_blocks == sum(blocks)
    assert layout.states == tuple(s.name for s in paged) + tuple(s.name for s in per_seq)
    if paged:
        assert layout.initial_pages >= n_pages
    if per_seq:
        assert layout.initial_slots >= n_slots
    assert shape.layout(tokens, free_bytes=total(layout)) == layout
    with pytest.raises(ExceedsPool, match=f"needs {total(layout)} bytes .*has {total(layout) - 1} bytes free"):
        shape.layout(tokens, free_bytes=total(layout) - 1)
