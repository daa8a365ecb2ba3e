"""Prefix radix tree: structure, lookup rules, locks, eviction order, tiers, determinism."""

from __future__ import annotations

import random

import pytest
from pool_testkit import K

from kern_pool import Misuse, Prefix, Resident, check_prefix
from kern_pool.prefix import Parked


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
