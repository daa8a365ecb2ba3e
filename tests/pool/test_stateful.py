"""Hypothesis state machine: random lease / write / checkpoint / fork / lease_from / retire / drop /
remap / lookup / evict / park / wake, with every invariant checked after every step, contents checked
through a simulated page store, and no leak once every handle is closed. A lease holding a slot is
cut only at exactly its current position; any other length (`rewind`) must be `Misuse` and change
nothing."""

from __future__ import annotations

import weakref
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from pool_testkit import Memory
from pool_testkit import invariant as global_invariant

from kern_pool import (
    Busy,
    Checkpoint,
    ExceedsPool,
    Host,
    Layout,
    Lease,
    Misuse,
    Pool,
    Prefix,
    Remapping,
    Resident,
)
from kern_pool.sizing import MIB

LAYOUTS = {
    "kv": lambda: Layout.simple(page_tokens=4, pages=6),
    "kv2": lambda: Layout.simple(page_tokens=2, pages=8),
    "slots": lambda: Layout.simple(page_tokens=4, pages=5, slots=3),
    # 3 MiB objects over 2 MiB blocks: remaps share straddling blocks
    "remap": lambda: Layout(page_tokens=4, page_bytes=(3 * MIB,), slot_bytes=(3 * MIB,), block_bytes=2 * MIB,
                            num_blocks=16, initial_pages=5, initial_slots=4),
}
TOKENS = st.integers(1, 3)


class PoolMachine(RuleBasedStateMachine):
    @initialize(kind=st.sampled_from(sorted(LAYOUTS)), host_pages=st.integers(0, 6))
    def setup(self, kind: str, host_pages: int) -> None:
        self.pool = Pool(LAYOUTS[kind]())
        self.P = self.pool.page_tokens
        self.mem = Memory(self.pool)
        self.prefix: Prefix = Prefix()
        self.host = Host(self.pool, host_pages, host_pages) if host_pages else None
        self.leases: list[tuple[Lease, list[int]]] = []
        self.cps: list[Checkpoint] = []
        self.hits: list[Any] = []
        self.parked: list[Any] = []  # entries parked by `park_cp` (outside the prefix tree)
        # woken lease -> (the parked entry it woke from, woken length): re-parking it unchanged copies nothing
        self.woken: weakref.WeakKeyDictionary[Lease, tuple[Any, int]] = weakref.WeakKeyDictionary()
        self.sources: weakref.WeakKeyDictionary[Checkpoint, tuple[Any, int]] = weakref.WeakKeyDictionary()
        self.tokens: weakref.WeakKeyDictionary[Any, tuple[int, ...]] = weakref.WeakKeyDictionary()

    # ---- helpers -----------------------------------------------------------------------------------
    def snapshot(self) -> tuple[object, ...]:
        p = self.pool
        return (list(p._pages.refs), list(p._pages.free), list(p._slots.refs), list(p._slots.free),
                list(p._blocks.free_phys), self.prefix.structure())

    def attempt(self, make: Any) -> Any:
        """Run a request; a refusal must change nothing (a Remapping only installs its plan)."""
        before = self.snapshot()
        in_flight = self.pool.remap_in_flight
        try:
            return make()
        except (Busy, ExceedsPool):
            assert self.snapshot() == before
        except Remapping as r:
            assert r.plan is self.pool.remap_in_flight
            if in_flight is not None:
                assert r.plan is in_flight and self.snapshot() == before
        return None

    def add(self, lease: Lease, toks: list[int]) -> None:
        """Track a new lease: its slot (if any) starts at its inherited tokens."""
        self.leases.append((lease, toks))
        assert lease.reached_tokens == len(toks)

    def new_lease(self, lease: Lease | None, toks: list[int]) -> None:
        if lease is None:
            return
        self.mem.apply(lease.plan)
        if lease.seq_slot_id is not None and lease.plan.zero_slots:
            assert self.mem.slots[lease.seq_slot_id] == 0
            self.mem.slots[lease.seq_slot_id] = tuple(toks)
        self.add(lease, toks)

    def keep(self, cp: Checkpoint | None, toks: list[int]) -> None:
        if cp is None:
            return
        self.mem.apply(cp.plan)
        self.tokens[cp] = tuple(toks[: cp.num_tokens])
        self.cps.append(cp)

    def park(self, cp: Checkpoint) -> Any:
        assert self.host is not None
        try:
            parked = self.host.park(self.host.room(cp))
        except (Busy, ExceedsPool):
            return None
        self.mem.apply(parked.plan)
        parked.land()
        self.tokens[parked] = self.tokens[cp]
        return parked

    # ---- rules -------------------------------------------------------------------------------------
    @rule(n=st.integers(0, 14))
    def lease(self, n: int) -> None:
        self.new_lease(self.attempt(lambda: self.pool.lease(n)), [])

    @precondition(lambda self: self.pool.layout.has_slots)
    @rule()
    def lease_slot(self) -> None:
        lease = self.attempt(self.pool.lease_slot)
        if lease is not None:
            self.mem.apply(lease.plan)
            self.mem.slots[lease.seq_slot_id] = ()
            self.add(lease, [])

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 99), data=st.data())
    def write(self, i: int, data: st.DataObject) -> None:
        lease, toks = self.leases[i % len(self.leases)]
        if not lease.paged:
            return
        new = data.draw(st.lists(TOKENS, min_size=1, max_size=5))
        if self.attempt(lambda: lease.grow(len(toks) + len(new)) or True) is None:
            return
        for t in new:
            self.mem.write(lease, len(toks), t)
            toks.append(t)
        if lease.seq_slot_id is not None:
            self.mem.slots[lease.seq_slot_id] = tuple(toks)

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 99), frac=st.floats(0, 1), retire=st.booleans())
    def checkpoint(self, i: int, frac: float, retire: bool) -> None:
        k = i % len(self.leases)
        lease, toks = self.leases[k]
        n = int(len(toks) * frac)
        if lease.seq_slot_id is not None and lease.paged:
            n = len(toks)  # per-seq state: only at the current position
        if not lease.paged:
            n = len(toks)
        if retire:
            cp = self.pool.retire(lease, n)
            self.leases.pop(k)
            self.keep(cp, toks)
        else:
            cp = self.attempt(lambda: self.pool.checkpoint(lease, n))
            self.keep(cp, toks)
        if cp is not None and lease in self.woken:
            self.sources[cp] = self.woken[lease]

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 99), frac=st.floats(0, 1), extra=st.integers(0, 5))
    def fork(self, i: int, frac: float, extra: int) -> None:
        lease, toks = self.leases[i % len(self.leases)]
        if not lease.paged:
            return
        n = len(toks) if lease.seq_slot_id is not None else int(len(toks) * frac)
        child = self.attempt(lambda: self.pool.fork(lease, n, n + extra))
        if child is not None:
            self.mem.apply(child.plan)
            assert not child.plan.zero_slots
            self.add(child, toks[:n])

    @precondition(lambda self: any(lease.seq_slot_id is not None for lease, _ in self.leases))
    @rule(i=st.integers(0, 99), back=st.integers(-20, 20).filter(bool),
          op=st.sampled_from(["checkpoint", "fork", "retire"]), extra=st.integers(0, 5))
    def rewind(self, i: int, back: int, op: str, extra: int) -> None:
        """A lease with a slot is cut only at exactly the position it has reached (the tokens written
        through `slot`, or inherited): any other length is Misuse naming both, and changes nothing."""
        slotted = [(lease, toks) for lease, toks in self.leases if lease.seq_slot_id is not None]
        lease, toks = slotted[i % len(slotted)]
        reached = len(toks)
        assert lease.reached_tokens == reached
        n = reached - back if reached >= back else reached + abs(back)
        total = n + extra if lease.paged else 0
        call = {"checkpoint": lambda: self.pool.checkpoint(lease, n), "fork": lambda: self.pool.fork(lease, n, total),
                "retire": lambda: self.pool.retire(lease, n)}[op]
        pages = lease.page_ids() if lease.paged else None
        before = (self.snapshot(), self.pool.remap_in_flight, lease.frozen_tokens, pages)
        try:
            call()
        except Misuse as err:
            beyond = lease.paged and n > lease.capacity_tokens and "outside" in str(err)
            assert beyond or f"reached {reached} tokens" in str(err), str(err)
        else:
            raise AssertionError(f"{op}({lease!r}, {n}) off the reached {reached} was accepted")
        assert not lease.closed
        pages = lease.page_ids() if lease.paged else None
        assert (self.snapshot(), self.pool.remap_in_flight, lease.frozen_tokens, pages) == before

    @precondition(lambda self: self.cps)
    @rule(i=st.integers(0, 99), frac=st.floats(0, 1), extra=st.integers(0, 5))
    def lease_from(self, i: int, frac: float, extra: int) -> None:
        cp = self.cps[i % len(self.cps)]
        toks = list(self.tokens[cp])
        n = len(toks) if cp.has_slot or not cp.paged else int(len(toks) * frac)
        total = 0 if not cp.paged else n + extra
        lease = self.attempt(lambda: self.pool.lease_from(cp, total, prefix_tokens=n))
        if lease is not None:
            self.mem.apply(lease.plan)
            if cp.has_slot:
                assert self.mem.slots[lease.seq_slot_id] == tuple(toks)
            elif lease.seq_slot_id is not None:
                self.mem.slots[lease.seq_slot_id] = tuple(toks[:n])
            self.add(lease, toks[:n])

    @precondition(lambda self: self.cps)
    @rule(i=st.integers(0, 99))
    def insert(self, i: int) -> None:
        cp = self.cps.pop(i % len(self.cps))
        if not cp.paged or cp.num_tokens == 0:
            cp.close()
            return
        self.prefix.insert(self.tokens[cp], cp)

    @rule(kind=st.sampled_from(["lease", "checkpoint", "hit"]), i=st.integers(0, 99))
    def drop(self, kind: str, i: int) -> None:
        items: list[Any] = {"lease": self.leases, "checkpoint": self.cps, "hit": self.hits}[kind]
        if items:
            item = items.pop(i % len(items))
            (item[0] if kind == "lease" else item).close()

    @precondition(lambda self: self.pool.remap_in_flight is not None)
    @rule()
    def land(self) -> None:
        plan = self.pool.remap_in_flight
        self.mem.apply(plan)
        self.pool.land(plan)

    @rule(data=st.data())
    def lookup(self, data: st.DataObject) -> None:
        known = [list(t) for t, _, _ in self.prefix.entries()]
        base = data.draw(st.sampled_from(known)) if known and data.draw(st.booleans()) else []
        prompt = base[: data.draw(st.integers(0, len(base)))] + data.draw(st.lists(TOKENS, max_size=4))
        before = self.prefix.structure()
        hit = self.prefix.lookup(prompt)
        assert self.prefix.structure() == before
        if hit is None:
            return
        assert 0 < hit.num_tokens < len(prompt)
        assert list(self.tokens[hit.kept][: hit.num_tokens]) == prompt[: hit.num_tokens]
        self.hits.append(hit)

    @precondition(lambda self: self.hits)
    @rule(i=st.integers(0, 99), extra=st.integers(0, 4))
    def use_hit(self, i: int, extra: int) -> None:
        hit = self.hits.pop(i % len(self.hits))
        n = hit.num_tokens
        toks = list(self.tokens[hit.kept][:n])
        if hit.tier is Resident:
            lease = self.attempt(lambda: self.pool.lease_from(hit.kept, n + extra, prefix_tokens=n, hold=hit))
        else:
            assert self.host is not None
            waking = self.attempt(lambda: self.host.wake(hit.kept, n, n + extra, hold=hit))
            lease = None
            if waking is not None:
                self.mem.apply(waking.plan)
                waking.land()
                lease = waking.lease
        if lease is None:
            hit.close()
            return
        self.mem.apply(lease.plan)
        if lease.seq_slot_id is not None and not lease.plan.slot_copies and hit.tier is Resident:
            self.mem.slots[lease.seq_slot_id] = tuple(toks)
        self.add(lease, toks)

    @precondition(lambda self: self.host is not None and self.cps)
    @rule(i=st.integers(0, 99))
    def park_cp(self, i: int) -> None:
        """Park a kept checkpoint directly; a woken session re-parked at its woken length copies nothing
        that its source entry (still parked) holds: no full page, no tail page, no slot."""
        cp = self.cps.pop(i % len(self.cps))
        source = self.sources.get(cp)
        parked = self.park(cp)
        if parked is None:
            cp.close()
            return
        self.parked.append(parked)
        if source is not None and not source[0].closed and source[1] == cp.num_tokens:
            assert parked.plan.page_copies == () and parked.plan.slot_copies == ()
            assert parked.host_page_ids() == source[0].host_page_ids()[: len(parked.host_page_ids())]

    @precondition(lambda self: self.parked)
    @rule(i=st.integers(0, 99), frac=st.floats(0, 1), extra=st.integers(0, 4))
    def wake_parked(self, i: int, frac: float, extra: int) -> None:
        assert self.host is not None
        parked = self.parked[i % len(self.parked)]
        toks = list(self.tokens[parked])
        n = len(toks) if parked.has_slot or not parked.paged else int(len(toks) * frac)
        waking = self.attempt(lambda: self.host.wake(parked, n, n + extra if parked.paged else 0))
        if waking is None:
            return
        self.mem.apply(waking.lease_copies)
        self.mem.apply(waking.plan)
        waking.land()
        lease = waking.lease
        if lease.seq_slot_id is not None and not parked.has_slot:
            self.mem.slots[lease.seq_slot_id] = tuple(toks[:n])
        self.add(lease, toks[:n])
        self.woken[lease] = (parked, n)

    @precondition(lambda self: self.host is not None and any(lease in self.woken for lease, _ in self.leases))
    @rule(i=st.integers(0, 99), frac=st.floats(0, 1), retire=st.booleans())
    def sleep_again(self, i: int, frac: float, retire: bool) -> None:
        """A woken lease goes back to the host (checkpoint or retire, then park) at its current length or,
        pure KV, shorter; a checkpoint at the woken length whose source is still parked copies nothing."""
        woken = [k for k, (lease, _) in enumerate(self.leases) if lease in self.woken]
        k = woken[i % len(woken)]
        lease, toks = self.leases[k]
        n = len(toks) if lease.seq_slot_id is not None or not lease.paged else int(len(toks) * frac)
        if retire:
            self.leases.pop(k)
        cp = self.pool.retire(lease, n) if retire else self.attempt(lambda: self.pool.checkpoint(lease, n))
        if cp is None:
            return
        self.keep(cp, toks)
        self.sources[cp] = self.woken[lease]
        self.park_cp(len(self.cps) - 1)

    @precondition(lambda self: self.parked)
    @rule(i=st.integers(0, 99))
    def drop_parked(self, i: int) -> None:
        self.parked.pop(i % len(self.parked)).close()

    @rule(park=st.booleans())
    def evict(self, park: bool) -> None:
        self.prefix.evict(self.park if park and self.host is not None else None)

    @rule()
    def evict_parked(self) -> None:
        self.prefix.evict_parked()

    # ---- invariants ----------------------------------------------------------------------------------
    @invariant()
    def accounting(self) -> None:
        if not hasattr(self, "pool"):
            return
        global_invariant(self.pool, self.prefix, self.host)

    @invariant()
    def contents(self) -> None:
        if not hasattr(self, "pool"):
            return
        for lease, toks in self.leases:
            if lease.paged:
                assert self.mem.read(lease, len(toks)) == toks
            if lease.seq_slot_id is not None and lease.paged:
                assert self.mem.slots[lease.seq_slot_id] == tuple(toks)
        kept = [*self.cps, *(k for _, tier, k in self.prefix.entries() if tier is Resident)]
        for cp in kept:
            if cp.paged:
                assert tuple(self.mem.read(cp, cp.num_tokens)) == self.tokens[cp]
        for toks, tier, parked in self.prefix.entries():
            if tier is not Resident:
                assert tuple(self.mem.read_host(parked, len(toks))) == toks
        for parked in self.parked:
            toks = self.tokens[parked]
            if parked.paged:
                assert tuple(self.mem.read_host(parked, len(toks))) == toks
            if parked.has_slot:
                assert self.mem.host_slots[parked.slot_id] == toks

    def teardown(self) -> None:
        if not hasattr(self, "pool"):
            return
        for hit in self.hits:
            hit.close()
        for lease, _ in self.leases:
            lease.close()
        for cp in self.cps:
            cp.close()
        for parked in self.parked:
            parked.close()
        self.prefix.clear()
        if self.pool.remap_in_flight is not None:
            self.pool.land(self.pool.remap_in_flight)
        global_invariant(self.pool, self.prefix, self.host)
        assert len(self.prefix) == 0
        assert self.pool.held_pages == 0 and self.pool.free_pages == self.pool.leasable_pages
        assert self.pool.free_slots == max(0, sum(1 for r in self.pool._slots.refs if r >= 0) - 1)
        assert not self.pool.live_handles()
        if self.host is not None:
            assert self.host.free_pages == self.host.num_pages and self.host.free_slots == self.host.num_slots


PoolMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)
)
TestPoolMachine = PoolMachine.TestCase


# ---- the same inputs give the same plans -------------------------------------------------------------
from hypothesis import given  # noqa: E402

OPS = st.lists(st.tuples(st.sampled_from(["lease", "ckpt", "retire", "fork", "from", "close", "look", "evict", "land"]),
                         st.integers(0, 20), st.integers(0, 20)), max_size=60)


def _replay(kind: str, ops: list[tuple[str, int, int]]) -> list[object]:
    pool = Pool(LAYOUTS[kind]())
    prefix: Prefix = Prefix()
    leases: list[Lease] = []
    cps: list[Checkpoint] = []
    log: list[object] = []
    for op, a, b in ops:
        try:
            if op == "lease":
                leases.append(pool.lease(a % 13))
                log.append((leases[-1].page_ids(), leases[-1].seq_slot_id, leases[-1].plan))
            elif op in ("ckpt", "retire") and leases:
                lease = leases[a % len(leases)]
                n = lease.capacity_tokens if lease.seq_slot_id is not None else min(b, lease.capacity_tokens)
                cp = pool.checkpoint(lease, n) if op == "ckpt" else pool.retire(lease, n)
                if op == "retire":
                    leases.remove(lease)
                log.append((cp.page_ids(), cp.seq_slot_id, cp.plan))  # type: ignore[union-attr]
                if n and a % 2:
                    prefix.insert(tuple(range(1, n + 1)), cp)  # type: ignore[arg-type]
                else:
                    cps.append(cp)  # type: ignore[arg-type]
            elif op == "fork" and leases:
                p = leases[a % len(leases)]
                n = p.capacity_tokens if p.seq_slot_id is not None else min(b, p.capacity_tokens)
                leases.append(pool.fork(p, n, n + 1))
                log.append((leases[-1].page_ids(), leases[-1].plan))
            elif op == "from" and cps:
                cp = cps[a % len(cps)]
                leases.append(pool.lease_from(cp, cp.num_tokens + b % 5))
                log.append((leases[-1].page_ids(), leases[-1].plan))
            elif op == "close" and leases:
                leases.pop(a % len(leases)).close()
            elif op == "look":
                hit = prefix.lookup(tuple(range(1, a + 2)))
                log.append(hit and (hit.num_tokens, hit.kept.page_ids()))
                if hit:
                    hit.close()
            elif op == "evict":
                log.append(prefix.evict())
            elif op == "land" and pool.remap_in_flight is not None:
                pool.land(pool.remap_in_flight)
        except (Busy, ExceedsPool, Remapping) as e:
            log.append((type(e).__name__, getattr(e, "plan", None)))
        except Exception as e:  # noqa: BLE001 - misuse counts as a decision too
            log.append(type(e).__name__)
    log.append(pool.mapping())
    return log


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(sorted(LAYOUTS)), ops=OPS)
def test_same_inputs_give_same_plans(kind: str, ops: list[tuple[str, int, int]]) -> None:
    assert _replay(kind, ops) == _replay(kind, ops)


# ---- the host tier around sessions that sleep and wake -----------------------------------------------
class HostMachine(RuleBasedStateMachine):
    """Sessions written, cut (checkpoint / retire), parked, woken, resumed (lease_from, which recycles
    device pages), cut again and re-parked, in any order. Every parked entry must hold its tokens (and
    slot) on the host whatever it shares, and a session woken and parked again at its woken length,
    with its source still parked, copies nothing."""

    @initialize(kind=st.sampled_from(["kv", "kv2", "slots"]))
    def setup(self, kind: str) -> None:
        self.pool = Pool({"kv": lambda: Layout.simple(page_tokens=4, pages=10),
                          "kv2": lambda: Layout.simple(page_tokens=2, pages=14),
                          "slots": lambda: Layout.simple(page_tokens=4, pages=10, slots=6)}[kind]())
        self.P = self.pool.page_tokens
        self.host = Host(self.pool, 12, 6)
        self.mem = Memory(self.pool)
        self.leases: list[tuple[Lease, list[int]]] = []
        self.cps: list[Checkpoint] = []
        self.parked: list[Any] = []
        self.tokens: weakref.WeakKeyDictionary[Any, tuple[int, ...]] = weakref.WeakKeyDictionary()
        self.woken: weakref.WeakKeyDictionary[Any, tuple[Any, int]] = weakref.WeakKeyDictionary()
        self.kept = 0  # parks that copied nothing (the case under test must actually happen)

    def call(self, make: Any) -> Any:
        """A request, remaps landed at once; None when refused (Busy / ExceedsPool)."""
        while True:
            try:
                return make()
            except Remapping as r:
                self.mem.apply(r.plan)
                self.pool.land(r.plan)
            except (Busy, ExceedsPool):
                return None

    def length(self, lease: Lease, toks: list[int], frac: float) -> int:
        return len(toks) if lease.seq_slot_id is not None else int(len(toks) * frac)

    def add(self, lease: Lease | None, toks: list[int], woken: Any = None) -> None:
        if lease is None:
            return
        self.mem.apply(lease.plan)
        if lease.seq_slot_id is not None and lease.plan.zero_slots:
            self.mem.slots[lease.seq_slot_id] = tuple(toks)
        self.leases.append((lease, toks))
        if woken is not None:
            self.woken[lease] = woken

    @rule(toks=st.lists(TOKENS, min_size=1, max_size=10))
    def session(self, toks: list[int]) -> None:
        lease = self.call(lambda: self.pool.lease(len(toks)))
        if lease is None:
            return
        self.add(lease, [])
        self.mem.fill(lease, toks)
        self.leases[-1][1].extend(toks)
        if lease.seq_slot_id is not None:
            self.mem.slots[lease.seq_slot_id] = tuple(toks)

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 99), more=st.lists(TOKENS, min_size=1, max_size=5))
    def write(self, i: int, more: list[int]) -> None:
        lease, toks = self.leases[i % len(self.leases)]
        if self.call(lambda: lease.grow(len(toks) + len(more)) or True) is None:
            return
        self.mem.fill(lease, more, len(toks))
        toks.extend(more)
        if lease.seq_slot_id is not None:
            self.mem.slots[lease.seq_slot_id] = tuple(toks)

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 99), frac=st.floats(0, 1), retire=st.booleans(), park=st.booleans())
    def cut(self, i: int, frac: float, retire: bool, park: bool) -> None:
        k = i % len(self.leases)
        lease, toks = self.leases[k]
        n = self.length(lease, toks, frac)
        source = self.woken.get(lease)
        if retire:
            self.leases.pop(k)
            cp = self.pool.retire(lease, n)
        else:
            try:
                cp = self.call(lambda: self.pool.checkpoint(lease, n))
            except Misuse:  # a slot already checkpointed further on
                return
        if cp is None:
            return
        self.mem.apply(cp.plan)
        self.tokens[cp] = tuple(toks[:n])
        if not park:
            self.cps.append(cp)
            return
        try:
            parked = self.host.park(self.host.room(cp))
        except (Busy, ExceedsPool):
            cp.close()
            return
        self.mem.apply(parked.plan)
        parked.land()
        self.tokens[parked] = self.tokens[cp]
        self.parked.append(parked)
        if source is not None and not source[0].closed and source[1] == n:
            assert parked.plan.page_copies == () and parked.plan.slot_copies == (), parked.plan
            self.kept += 1

    @precondition(lambda self: self.cps)
    @rule(i=st.integers(0, 99), frac=st.floats(0, 1), extra=st.integers(0, 5))
    def resume(self, i: int, frac: float, extra: int) -> None:
        cp = self.cps[i % len(self.cps)]
        toks = list(self.tokens[cp])
        n = len(toks) if cp.has_slot else int(len(toks) * frac)
        self.add(self.call(lambda: self.pool.lease_from(cp, n + extra, prefix_tokens=n)), toks[:n])

    @precondition(lambda self: self.parked)
    @rule(i=st.integers(0, 99), frac=st.floats(0, 1), extra=st.integers(0, 5))
    def wake(self, i: int, frac: float, extra: int) -> None:
        parked = self.parked[i % len(self.parked)]
        toks = list(self.tokens[parked])
        n = len(toks) if parked.has_slot else int(len(toks) * frac)
        waking = self.call(lambda: self.host.wake(parked, n, n + extra))
        if waking is None:
            return
        self.mem.apply(waking.lease_copies)
        self.mem.apply(waking.plan)
        waking.land()
        self.add(waking.lease, toks[:n], (parked, n))

    @precondition(lambda self: any(lease in self.woken and lease.paged for lease, _ in self.leases))
    @rule(i=st.integers(0, 99), back=st.integers(0, 6), more=st.lists(TOKENS, min_size=1, max_size=5),
          frac=st.floats(0, 1))
    def recycle(self, i: int, back: int, more: list[int], frac: float) -> None:
        """A woken session keeps a shorter prefix and ends: its pages go back to the pool (LIFO), a new
        session resumes that prefix on them with other tokens and parks; nothing may be taken for the
        old host copies (the device page ids, chain node and length can all be the same)."""
        woken = [k for k, (lease, _) in enumerate(self.leases) if lease in self.woken and lease.paged]
        lease, toks = self.leases.pop(woken[i % len(woken)])
        n = max(0, len(toks) - back) if lease.seq_slot_id is None else len(toks)
        cp = self.call(lambda: self.pool.checkpoint(lease, n))
        lease.close()
        if cp is None:
            return
        self.mem.apply(cp.plan)
        self.tokens[cp] = tuple(toks[:n])
        self.cps.append(cp)
        self.resume(len(self.cps) - 1, 1.0, len(more))
        if self.leases and self.leases[-1][1] == toks[:n]:
            self.write(len(self.leases) - 1, more)
            self.cut(len(self.leases) - 1, frac, True, True)

    @rule(kind=st.sampled_from(["lease", "checkpoint", "parked"]), i=st.integers(0, 99))
    def drop(self, kind: str, i: int) -> None:
        items: list[Any] = {"lease": self.leases, "checkpoint": self.cps, "parked": self.parked}[kind]
        if items:
            item = items.pop(i % len(items))
            (item[0] if kind == "lease" else item).close()

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "pool"):
            return
        global_invariant(self.pool, host=self.host)
        for lease, toks in self.leases:
            assert self.mem.read(lease, len(toks)) == toks
        for cp in self.cps:
            assert tuple(self.mem.read(cp, cp.num_tokens)) == self.tokens[cp]
        for parked in self.parked:
            toks = self.tokens[parked]
            assert tuple(self.mem.read_host(parked, len(toks))) == toks
            if parked.has_slot:
                assert self.mem.host_slots[parked.slot_id] == toks

    def teardown(self) -> None:
        if not hasattr(self, "pool"):
            return
        for lease, _ in self.leases:
            lease.close()
        for item in [*self.cps, *self.parked]:
            item.close()
        if self.pool.remap_in_flight is not None:
            self.pool.land(self.pool.remap_in_flight)
        global_invariant(self.pool, host=self.host)
        assert self.host.free_pages == self.host.num_pages and self.host.free_slots == self.host.num_slots
        assert self.pool.held_pages == 0 and not self.pool.live_handles()


HostMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)
)
TestHostMachine = HostMachine.TestCase
