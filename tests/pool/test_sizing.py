"""Block size rule, capacity budgets and layouts."""

from __future__ import annotations

import pytest

from kern_pool import Capacity, ExceedsPool, Layout, Misuse, PooledState, block_bytes_for
from kern_pool.sizing import GIB, MIB


@pytest.mark.parametrize(
    ("objects", "expected"),
    [
        ([72 * MIB], 36 * MIB),  # qwen3-4b page of 512 tokens: half, a multiple of 2 MiB
        ([49 * MIB], 24 * MIB),  # half is 24.5 MiB -> round down to 24
        ([449 * MIB, 49 * MIB], 24 * MIB),  # smallest object decides
        ([1024 * MIB], 64 * MIB),  # capped
        ([3 * MIB], 64 * MIB),  # under two granularities: the cap
        ([4 * MIB], 2 * MIB),  # exactly two granularities
        ([5 * MIB], 2 * MIB),
        ([9 * MIB], 4 * MIB),
    ],
)
def test_block_bytes_rule(objects: list[int], expected: int) -> None:
    assert block_bytes_for(objects) == expected


def test_block_bytes_parameters() -> None:
    assert block_bytes_for([100 * MIB], granularity_bytes=4 * MIB) == 48 * MIB
    assert block_bytes_for([100 * MIB], cap_bytes=16 * MIB) == 16 * MIB
    with pytest.raises(Misuse):
        block_bytes_for([])
    with pytest.raises(Misuse):
        block_bytes_for([MIB], cap_bytes=3 * MIB)


def test_capacity_budget_per_state_rounding() -> None:
    kv = PooledState("kv", bytes_per_token=144 * 1024, page_tokens=16)  # 2.25 MiB page
    rec = PooledState("rec", bytes_per_seq=5 * MIB)
    layout = Layout.from_capacity([kv, rec], Capacity(tokens=1000, seqs=3))
    # smallest object 2.25 MiB < 4 MiB -> cap 64 MiB blocks
    assert layout.block_bytes == 64 * MIB
    assert layout.page_tokens == 16
    # tokens aligned down to 992 -> 62 pages + 1 scratch; 63 * 2.25 MiB = 141.75 MiB -> 3 blocks
    # slots: (3 + 2) * 5 MiB = 25 MiB -> 1 block (rounded per state, not once over the sum)
    assert layout.num_blocks == 3 + 1
    assert layout.initial_pages == 3 * 64 * MIB // (144 * 1024 * 16)  # every page the arena holds
    assert layout.initial_slots == 64 // 5
    assert layout.states == ("kv", "rec")


def test_capacity_tokens_align_to_largest_page_unit() -> None:
    a = PooledState("a", bytes_per_token=2 * MIB, page_tokens=4)
    b = PooledState("b", bytes_per_token=2 * MIB, page_tokens=8)
    layout = Layout.from_capacity([a, b], Capacity(tokens=100, seqs=0))
    assert layout.page_tokens == 8
    assert layout.page_bytes == (16 * MIB, 16 * MIB)
    assert layout.block_bytes == 8 * MIB
    # 96 tokens -> 12 pages + scratch = 13 pages of 16 MiB per state = 26 blocks each
    assert layout.num_blocks == 52
    assert layout.initial_pages == 13


def test_capacity_none_fills_free_memory_minus_headroom() -> None:
    kv = PooledState("kv", bytes_per_token=MIB, page_tokens=16)
    layout = Layout.from_capacity([kv], Capacity(tokens=None, seqs=1), free_bytes=2 * GIB)
    # 16 MiB pages in 8 MiB blocks: 2 GiB - 1 GiB holds 128 blocks = 64 pages, the scratch page among them,
    # so 63 pages (1008 tokens) are leasable; the whole pool is exactly free - headroom
    assert layout.initial_pages == 64
    assert layout.num_blocks * layout.block_bytes == GIB
    with pytest.raises(Misuse):
        Layout.from_capacity([kv], Capacity(tokens=None, seqs=1))
    with pytest.raises(ExceedsPool):
        Layout.from_capacity([kv], Capacity(tokens=None, seqs=1), free_bytes=GIB)


def test_bad_states_and_layouts() -> None:
    with pytest.raises(Misuse):
        PooledState("x")
    with pytest.raises(Misuse):
        PooledState("x", bytes_per_token=1, bytes_per_seq=1, page_tokens=1)
    with pytest.raises(Misuse):
        PooledState("x", bytes_per_token=1)
    with pytest.raises(Misuse):
        Capacity(tokens=-1, seqs=0)
    with pytest.raises(Misuse):
        Layout(page_tokens=4, page_bytes=(MIB,), slot_bytes=(), block_bytes=MIB, num_blocks=1, initial_pages=2, initial_slots=0)


def test_simple_layout_is_page_sized_blocks() -> None:
    layout = Layout.simple(page_tokens=4, pages=3, slots=2)
    assert layout.num_blocks == 4 + 3
    assert layout.initial_pages == 4 and layout.initial_slots == 3
    assert layout.va_bytes_per_state == 7 * MIB


def test_page_units_must_divide_the_largest() -> None:
    """16 and 24 tokens: a 24-token page holds no whole number of 16-token pages, so the layout is refused,
    naming both (4 and 8 above are accepted)."""
    a = PooledState("a", bytes_per_token=MIB, page_tokens=16)
    b = PooledState("b", bytes_per_token=MIB, page_tokens=24)
    with pytest.raises(Misuse, match="must divide the largest, 24; got a 16, b 24"):
        Layout.from_capacity([a, b], Capacity(tokens=96, seqs=0))


def test_states_may_be_any_iterable_of_pooled_states() -> None:
    """A generator of states is read once: its per-seq state is not lost between the paged and per-seq passes."""
    kv = PooledState("kv", bytes_per_token=1024, page_tokens=16)
    rec = PooledState("rec", bytes_per_seq=MIB)
    from_list = Layout.from_capacity([kv, rec], Capacity(tokens=1024, seqs=1))
    from_gen = Layout.from_capacity((s for s in [kv, rec]), Capacity(tokens=1024, seqs=1))
    assert from_gen == from_list
    assert from_gen.slot_bytes == (MIB,)
    assert block_bytes_for(iter([4 * MIB])) == block_bytes_for([4 * MIB]) == 2 * MIB


@pytest.mark.parametrize(("call", "needle"), [
    (lambda: Layout.from_capacity([("kv", 1)], Capacity(100, 1)), "states[0] is a tuple, expected a PooledState"),
    (lambda: Layout.from_capacity([PooledState("kv", bytes_per_token=1, page_tokens=16)], None),
     "from_capacity needs a Capacity, got NoneType"),
    (lambda: Layout.from_capacity(PooledState("kv", bytes_per_token=1, page_tokens=16), Capacity(100, 1)),
     "states must be a sequence of PooledState"),
    (lambda: PooledState(None, bytes_per_token=1, page_tokens=16), "name must be a non-empty str, got None"),
    (lambda: PooledState("", bytes_per_seq=1), "name must be a non-empty str"),
    (lambda: Layout(16, [MIB], (), MIB, 4, 2, 0), "Layout page_bytes must be a tuple, got list"),
    (lambda: Layout(16, MIB, (), MIB, 4, 2, 0), "Layout page_bytes must be a tuple, got int"),
    (lambda: Layout(16, (MIB,), (), MIB, 4, 2, 0, states=("a", "b", "c")), "one distinct non-empty name per"),
    (lambda: Layout(16, (MIB, MIB), (), MIB, 4, 2, 0, states=("a", "a")), "one distinct non-empty name per"),
    (lambda: Layout.simple(16, 10**19), "ids are int32 on the device, at most 2147483646"),
    (lambda: block_bytes_for("abc"), "object sizes must be a sequence of ints, got str"),
])
def test_layout_inputs_of_the_wrong_kind_are_misuse(call, needle: str) -> None:
    with pytest.raises(Misuse) as err:
        call()
    assert needle in str(err.value)
