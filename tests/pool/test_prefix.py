"""Prefix radix tree: structure, lookup rules, locks, eviction order, tiers, determinism."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pool_testkit import K

from kern_pool import Busy, Misuse, Prefix, Resident, check_prefix
from kern_pool.prefix import Eviction, Parked, Tier


def build(*items: tuple[tuple[int, ...], K]) -> Prefix:
    p: Prefix = Prefix()
    for toks, kept in items:
        assert p.insert(toks, kept)
        check_prefix(p)
    return p


def test_lookup_is_a_strict_prefix_for_slot_entries() -> None:
    a = K(4, has_slot=True)
    p = build(((1, 2, 3, 4), a))
    assert p.lookup((1, 2, 3, 4)) is None  # whole prompt: never its last token
    hit = p.lookup((1, 2, 3, 4, 5))
    assert hit is not None and hit.kept is a and hit.num_tokens == 4
    assert p.lookup((1, 2, 3, 9, 9)) is None  # slot entries are usable only at their own length
    hit.close()


def test_pure_kv_entry_serves_any_shared_length() -> None:
    a = K(8)
    p = build(((1, 2, 3, 4, 5, 6, 7, 8), a))
    for prompt, n in [((1, 2, 3, 4, 5, 6, 7, 8), 7), ((1, 2, 3, 9), 3), ((1, 2, 3, 4, 5, 6, 7, 8, 9), 8), ((1,), None),
                      ((2, 1), None)]:
        hit = p.lookup(prompt)
        assert (hit.num_tokens if hit else None) == n
        if hit:
            assert hit.kept is a
            hit.close()


def test_lookups_never_change_structure() -> None:
    p = build(((1, 2, 3, 4, 5, 6), K(6)), ((1, 2, 3, 4, 7, 8), K(6)), ((1, 2, 9, 9), K(4, has_slot=True)))
    before = p.structure()
    for prompt in [(1, 2, 3), (1, 2, 3, 4, 5, 6, 7), (1, 2, 9, 9, 9), (1, 2, 3, 4, 7), (5,), ()]:
        hit = p.lookup(prompt)
        if hit:
            hit.close()
        assert p.structure() == before
    check_prefix(p)


def test_same_tokens_are_the_same_entry() -> None:
    a, b = K(3, True), K(3, True)
    p = build(((1, 2, 3), a))
    assert p.insert((1, 2, 3), b) is False
    assert b.closes == 1 and a.closes == 0 and len(p) == 1
    with pytest.raises(Misuse):
        p.insert((1, 2), K(3))


def test_deeper_pure_kv_entry_replaces_shallower_ones() -> None:
    short, long_ = K(3), K(6)
    p = build(((1, 2, 3), short))
    p.insert((1, 2, 3, 4, 5, 6), long_)
    assert short.closes == 1 and len(p) == 1
    again = K(4)
    assert p.insert((1, 2, 3, 4), again) is False  # covered by the 6-token entry
    assert again.closes == 1
    hit = p.lookup((1, 2, 3, 4, 9))
    assert hit is not None and hit.kept is long_ and hit.num_tokens == 4
    hit.close()
    check_prefix(p)


def test_locked_shallower_kv_entry_survives_and_is_evicted_later() -> None:
    short, long_ = K(3), K(6)
    p = build(((1, 2, 3), short))
    hit = p.lookup((1, 2, 3, 4))
    assert hit is not None and hit.kept is short
    p.insert((1, 2, 3, 4, 5, 6), long_)
    assert short.closes == 0 and len(p) == 2
    assert p.evict() is not None and long_.closes == 1  # short is locked; long is the only candidate
    assert p.evict() is None
    hit.close()
    assert p.evict() is not None and short.closes == 1
    check_prefix(p)


def test_evicts_coldest_leaf_first_and_respects_locks() -> None:
    base, left, right = K(2, True, "base"), K(4, True, "left"), K(4, True, "right")
    p = build(((1, 2), base), ((1, 2, 3, 4), left), ((1, 2, 5, 6), right))
    # base is the coldest but not a leaf: left goes first, then right, then base
    hit = p.lookup((1, 2, 3, 4, 0))  # warms left and locks it
    assert hit is not None and hit.kept is left
    order = []
    while (ev := p.evict()) is not None:
        order.append(ev.num_tokens)
        check_prefix(p)
    assert order == [4]  # right; base is not a leaf while left lives, left is locked
    assert right.closes == 1 and base.closes == 0
    hit.close()
    assert [p.evict().num_tokens, p.evict().num_tokens] == [4, 2]  # type: ignore[union-attr]
    assert p.evict() is None and len(p) == 0
    check_prefix(p)


def test_hit_close_twice_is_a_no_op() -> None:
    p = build(((1, 2), K(2)))
    hit = p.lookup((1, 2, 3))
    assert hit is not None
    assert hit.close() is True and hit.close() is False
    assert p.evict() is not None


def test_park_moves_entry_to_parked_tier_and_resident_wins_ties() -> None:
    a = K(4)
    p = build(((1, 2, 3, 4), a))
    parked = K(4, name="parked")
    ev = p.evict(park=lambda kept: parked)
    assert ev is not None and ev.parked and a.closes == 0  # the resident belongs to the parked form now
    assert p.count(Resident) == 0 and p.count(Parked) == 1
    hit = p.lookup((1, 2, 3, 4, 5))
    assert hit is not None and hit.tier is Parked and hit.kept is parked
    hit.close()
    res = K(4, name="res")
    p.insert((1, 2, 3, 4), res)
    hit = p.lookup((1, 2, 3, 4, 5))
    assert hit is not None and hit.tier is Resident and hit.kept is res
    hit.close()
    assert p.evict_parked() and parked.closes == 1
    assert not p.evict_parked()
    check_prefix(p)


def test_park_refused_drops_the_entry() -> None:
    a = K(4)
    p = build(((1, 2, 3, 4), a))
    ev = p.evict(park=lambda kept: None)
    assert ev is not None and not ev.parked and a.closes == 1 and len(p) == 0


def test_clear_drops_unlocked_entries() -> None:
    a, b = K(2), K(3, True)
    p = build(((1, 2), a), ((5, 6, 7), b))
    hit = p.lookup((5, 6, 7, 8))
    p.clear()
    assert a.closes == 1 and b.closes == 0 and len(p) == 1
    assert hit is not None
    hit.close()
    check_prefix(p)


def _run(seed: int) -> list[object]:
    rng = random.Random(seed)
    p: Prefix = Prefix()
    log: list[object] = []
    for _ in range(300):
        toks = tuple(rng.randrange(3) for _ in range(rng.randrange(1, 9)))
        op = rng.randrange(3)
        if op == 0:
            log.append(p.insert(toks, K(len(toks), has_slot=rng.random() < 0.3)))
        elif op == 1:
            hit = p.lookup(toks)
            log.append((hit.num_tokens, hit.tier) if hit else None)
            if hit:
                hit.close()
        else:
            ev = p.evict()
            log.append(ev)
        check_prefix(p)
    log.append(p.structure())
    return log


def test_same_calls_give_same_decisions() -> None:
    assert _run(7) == _run(7)
    assert _run(8) == _run(8)


def test_long_prompts_use_few_nodes() -> None:
    toks = tuple(range(32768))
    p = build((toks, K(32768)))
    hit = p.lookup(toks + (1,))
    assert hit is not None and hit.num_tokens == 32768
    hit.close()
    assert len(p.structure()[2]) == 1  # one edge for the whole prompt


def _hit(p: Prefix, prompt: tuple[int, ...]) -> tuple[int, Tier, K] | None:
    hit = p.lookup(prompt)
    if hit is None:
        return None
    out = (hit.num_tokens, hit.tier, hit.kept)
    hit.close()
    return out


def test_kv_entry_branching_above_the_deepest_match_is_found() -> None:
    # a pure-KV entry serves what it shares with the prompt even when the prompt goes on down a
    # different branch (a slot entry's or another tier's)
    kv, slot = K(4, name="kv"), K(4, True, "slot")
    q = build(((7, 8, 9, 1), kv), ((7, 8, 9, 2), slot))
    assert _hit(q, (7, 8, 9, 2)) == (3, Resident, kv)
    kv, slot = K(2, name="kv"), K(3, True, "slot")
    r = build(((0, 0), kv), ((0, 1, 0), slot))
    assert _hit(r, (0, 1, 1)) == (1, Resident, kv)
    assert _hit(r, (0, 1, 0, 5)) == (3, Resident, slot)


def test_resident_kv_wins_a_tie_with_a_parked_kv_on_another_branch() -> None:
    res, parked = K(4, name="res"), K(4, name="parked")
    p = build(((7, 8, 9, 1), res))
    assert p.insert((7, 8, 9, 2), parked, Parked)
    check_prefix(p)
    assert _hit(p, (7, 8, 9, 2)) == (3, Resident, res)
    assert _hit(p, (7, 8, 9, 2, 5)) == (4, Parked, parked)  # longer still beats the tier


def _usable(toks: tuple[int, ...], has_slot: bool, prompt: tuple[int, ...]) -> int:
    limit = len(prompt) - 1
    if has_slot:
        return len(toks) if len(toks) <= limit and prompt[: len(toks)] == toks else 0
    n = 0
    while n < min(len(toks), len(prompt)) and toks[n] == prompt[n]:
        n += 1
    return min(n, limit)


_TOKS = st.lists(st.integers(0, 2), min_size=1, max_size=6).map(tuple)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_TOKS, st.booleans(), st.booleans()), max_size=12), st.lists(_TOKS, min_size=1, max_size=8))
def test_lookup_matches_brute_force(inserts: list[tuple[tuple[int, ...], bool, bool]],
                                    prompts: list[tuple[int, ...]]) -> None:
    p: Prefix = Prefix()
    for toks, has_slot, parked in inserts:
        p.insert(toks, K(len(toks), has_slot), Parked if parked else Resident)
        check_prefix(p)
    stored = p.entries()
    for prompt in prompts:
        # the best (length, tier) over every stored entry: longest first, then Resident
        want = max(((n, tier is Resident) for toks, tier, kept in stored
                    if (n := _usable(toks, kept.has_slot, prompt)) > 0), default=None)
        got = _hit(p, prompt)
        if want is None:
            assert got is None, (prompt, stored)
            continue
        assert got is not None, (prompt, stored)
        n, tier, kept = got
        assert (n, tier is Resident) == want, (prompt, stored, got)
        assert any(k is kept and t is tier and _usable(toks, k.has_slot, prompt) == n for toks, t, k in stored)
    check_prefix(p)


def test_a_failing_park_leaves_the_entry_evictable() -> None:
    a = K(3)
    p = build(((1, 2, 3), a))

    def park(kept: K) -> K:
        raise Busy("host full")

    with pytest.raises(Busy):
        p.evict(park)
    assert len(p) == 1 and a.closes == 0
    check_prefix(p)
    parked = K(3, name="parked")
    assert p.evict(lambda kept: parked) == Eviction(3, True)
    assert p.count(Parked) == 1 and a.closes == 0
    assert p.evict() is None and p.evict_parked() and parked.closes == 1 and len(p) == 0
