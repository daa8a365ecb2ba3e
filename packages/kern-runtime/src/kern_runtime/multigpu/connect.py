"""Multi-GPU: the runtime's peer and NCCL part (`Peers`, held as `Runtime.peers`), and
`connect_local` / `LocalGroup` for one process holding every rank.

Handshake (docs/runtime.md "Multi-GPU"):

    offers = {"tp": [rt_of_rank0.offer(), rt_of_rank1.offer()]}   # moved between processes as
    rt.connect(offers)                                            # Offer.to_bytes / Offer.from_bytes

`connect` checks every member's manifest agrees with this one (the family digest: everything but
binds, name and meta), maps the members' export buffers / states into this rank's peer tables
(`import_peers`), refuses to finish with an unfilled peer table, then joins each NCCL group (group
member 0's offer carries the NCCL unique id). Until then `run` / `issue` are refused (ApiError).

One process, several GPUs: `group = connect_local([rt0, rt1])` does the same with local handles and
all NCCL joins inside one `ncclGroupStart/End`. NCCL collectives of one process's ranks must be
issued from one thread interleaved, so programs with NCCL externs go through `group.issue(...)` /
`group.run(...)` (the runtimes refuse them on their own); graph programs are captured jointly, every
rank's stream at once, and replayed with one `cuGraphLaunch` per rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Mapping, Sequence

import numpy as np
from kern_manifest import ExternLaunch, Launch, Manifest, RankWiring, Ref

from ..cuda.driver import call, cu
from ..cuda.graphs import capture_mode, graph_key, normalise_vars
from ..cuda.memory import vmm_granularity_bytes
from ..cuda.nccl import Communicator, NcclCall, check_extent, group_end, group_start, nccl_call, pin_nccl_env, unique_id
from ..errors import ApiError, KernelArtifactError, KernError, ManifestError
from ..program.records import NCCL_EXTERNS, ExternRecord, args_at_range_ends, call_sites, launch_path
from ..program.replay import is_nccl
from .peers import (
    Offer,
    PeerHandle,
    check_offers,
    export_handle,
    fabric_wanted,
    map_peer,
    missing_peer_tables,
    posix_fd_wanted,
    vmm_with_fallback,
)


def nccl_group(launch: ExternLaunch, path: str) -> str:
    """The topology group of an NCCL extern launch (its `{"rank": g}` wiring) at JSON path `path`."""
    for w in launch.args:
        if isinstance(w, RankWiring):
            return w.rank
    raise ManifestError(f"{path}: extern {launch.name} has no {{\"rank\": group}} argument")


def has_nccl(state: Any) -> bool:
    return any(is_nccl(r) for r in state.records)


class Peers:
    """The multi-GPU part of one runtime (`Runtime.peers`): topology checks, peer tables, export handles,
    offer / connect, NCCL communicators and their dispatch, run gating.

    `manifest`, `topology` (group -> size), `min_values` / `max_values`: the loaded manifest's facts; `ranks`:
    this process's index per group, `rank_sizes` the sizes `ranks` gave; `gpu`, `ledger`: where peer mappings
    and communicators are registered; `buffers`, `states`, `scratch`: name -> allocation (filled as the runtime
    allocates); `activate()`: makes the runtime's context current, ApiError once it is closed. Checks the
    topology at construction (ApiError / ManifestError), before anything is allocated."""

    def __init__(self, manifest: Manifest, topology: Mapping[str, int], min_values: Mapping[str, int],
                 max_values: Mapping[str, int], ranks: Mapping[str, int], rank_sizes: Mapping[str, int], gpu: int,
                 ledger: Any, buffers: Mapping[str, Any], states: Mapping[str, Any], scratch: Mapping[Any, Any],
                 activate: Callable[[], None]) -> None:
        self.manifest, self.topology = manifest, topology
        self.min_values, self.max_values = min_values, max_values
        self._ranks, self._rank_sizes, self.gpu, self._ledger = dict(ranks), dict(rank_sizes), gpu, ledger
        self._buffers, self._states, self._scratch, self._activate = buffers, states, scratch, activate
        self.peer_tables: dict[str, tuple[str, str]] = {}  # peer table buffer -> (of, group)
        self.peers_filled: set[str] = set()
        self._peer_maps: dict[tuple[str, str, int], int] = {}  # (of, group, member) -> address mapped here
        self.comms: dict[str, Communicator] = {}
        self.nccl_groups: set[str] = set()  # groups NCCL externs name
        self.local_group: Any = None  # connect_local's LocalGroup
        self._fabric = False
        self._posix_fd = False
        self._peer_granularity: int | None = None
        self.check_topology()

    # ------------------------------------------------------------ load-time checks

    def check_topology(self) -> None:
        """Ranks for every group used (in range, of the manifest's group size where `ranks` gave one), the
        peer tables, the groups NCCL externs name."""
        topo = self.topology
        sizes = self._rank_sizes
        for group, rank in self._ranks.items():
            if group not in topo:
                raise ApiError(f"ranks names group {group!r}; the manifest's topology has {sorted(topo)}")
            if group in sizes and sizes[group] != topo[group]:
                raise ApiError(f"ranks[{group!r}] gives group {group!r} size {sizes[group]}; the manifest's "
                               f"topology has size {topo[group]}")
            if not 0 <= rank < topo[group]:
                raise ApiError(f"rank {rank} is outside group {group!r} of size {topo[group]}")
        for name, buf in self.manifest.buffers.items():
            if buf.peers is not None:
                self.peer_tables[name] = (buf.peers.of, buf.peers.group)
        for op in self.manifest.ops.values():
            for li, launch in enumerate(op.launches):
                if isinstance(launch, ExternLaunch) and launch.name in NCCL_EXTERNS:
                    path = launch_path(op.name, li)
                    group = nccl_group(launch, path)
                    if group not in topo:
                        raise ManifestError(f"{path}: extern {launch.name} names group {group!r}, which the "
                                            f"topology does not declare ({sorted(topo)})")
                    self.nccl_groups.add(group)
        needed = self.nccl_groups | {g for _, g in self.peer_tables.values()}
        missing = sorted(g for g in needed if g not in self._ranks)
        if missing:
            raise ApiError(f"the manifest uses topology group(s) {missing}: pass ranks={{group: index}} "
                           "(or {group: (index, size)}) to load")

    def peer_sensitive(self) -> set[str]:
        """Buffers and states peers reach: peer tables, export buffers, and what some table maps."""
        names = set(self.peer_tables) | {of for of, _ in self.peer_tables.values()}
        return names | {n for n, b in self.manifest.buffers.items() if b.export}

    def scan_peer_launches(self, images: Mapping[str, bytes]) -> None:
        """Every kernel launch of an op that some call passes peer-reachable memory has its SASS
        checked for multicast instructions (sass.py; KernelArtifactError)."""
        from ..cuda.sass import check_peer_launch

        sensitive = self.peer_sensitive()
        if not sensitive:
            return
        done: set[tuple[str, int]] = set()
        for program in self.manifest.programs:
            for site in call_sites(self.manifest, program):
                if not any(isinstance(a, Ref) and a.name in sensitive for a in site.call.args.values()):
                    continue
                for li, launch in enumerate(site.op.launches):
                    if not isinstance(launch, Launch) or (site.op.name, li) in done:
                        continue
                    done.add((site.op.name, li))
                    path = launch_path(site.op.name, li)
                    if launch.module not in images:
                        raise KernelArtifactError(f"{path}: module {launch.module!r} is not pinned")
                    check_peer_launch(images[launch.module], launch.module, launch.entry, f"{path} (called by {site.path})")

    def peer_vmm(self, nbytes: int, label: str, stream: Any) -> Any:
        """One-block VMM allocation a peer can map (a fabric handle where the device gives one, else a POSIX file
        descriptor handle, else local only: peers.vmm_with_fallback), zeroed on `stream`."""
        if self._peer_granularity is None:
            self._fabric = fabric_wanted(self.gpu)
            self._posix_fd = posix_fd_wanted()
            self._peer_granularity = vmm_granularity_bytes(self.gpu)
        size = -(-max(int(nbytes), 1) // self._peer_granularity) * self._peer_granularity
        alloc = vmm_with_fallback(self._ledger, size, size, size, self.gpu, label, self._fabric, self._posix_fd)
        self._fabric = self._fabric and alloc.fabric  # one refusal: the next kind from then on
        self._posix_fd = self._posix_fd and (alloc.fabric or alloc.posix_fd)
        call("cuMemsetD8Async", alloc.address, 0, size, stream)
        return alloc

    def _allocation_ranges(self) -> dict[str, tuple[int, int]]:
        ranges = {n: (a.address, a.nbytes) for n, a in self._buffers.items()}
        ranges.update({n: (a.address, a.nbytes) for n, a in self._states.items()})
        ranges.update({f"scratch {op}.{sc}": (a.address, a.nbytes) for (op, sc), a in self._scratch.items()})
        return ranges

    def check_nccl_records(self, programs: Iterable[Any]) -> None:
        """Every NCCL record at both ends of the var ranges: count >= 1, rank in the group, send and
        recv inside their allocations (refused at load, never mid-run)."""
        ranges = None
        minv, maxv = self.min_values, self.max_values
        for state in programs:
            for rec in state.records:
                if not is_nccl(rec):
                    continue
                ranges = ranges if ranges is not None else self._allocation_ranges()
                for args in args_at_range_ends(rec, minv, maxv):
                    ncall = nccl_call(rec.name, args, nccl_group(rec.launch, rec.path), self.topology, rec.path)
                    check_extent(ncall, ranges, f"{rec.path} (program {state.name!r} call #{rec.call_index})")

    def check_once_program(self, name: str, state: Any) -> None:
        """Once programs run at load, before connect: no peer tables, no NCCL."""
        tables = set(self.peer_tables)
        uses = [site.path for site in call_sites(self.manifest, name)
                if any(isinstance(a, Ref) and a.name in tables for a in site.call.args.values())]
        if uses or has_nccl(state):
            raise ApiError(f"once program {name!r} uses peer tables or NCCL ({(uses or ['an NCCL extern'])[0]}); once "
                           "programs run at load, before connect: make it a run program issued after connect")

    # ------------------------------------------------------------ replay hooks

    def _nccl_call(self, rec: ExternRecord) -> NcclCall:
        group = nccl_group(rec.launch, rec.path)
        if group not in self.comms:
            raise ApiError(f"{rec.path}: extern {rec.name} runs on NCCL group {group!r}, which this "
                           "runtime never joined: connect() (or connect_local) first")
        return nccl_call(rec.name, rec.args, group, self.topology, rec.path)

    def nccl_issue(self, rec: ExternRecord, stream: Any) -> None:
        """Enqueue NCCL record `rec` on `stream` (the `Launcher`'s NCCL path). Raises ApiError before a join."""
        ncall = self._nccl_call(rec)
        self.comms[ncall.group].issue(ncall, int(stream))

    def require_ready(self, state: Any, via_group: bool = False) -> None:
        """Refuse a run before every peer table is filled or while an NCCL group it uses is not joined,
        and an NCCL program of a connect_local runtime issued on its own."""
        missing = missing_peer_tables(self.peer_tables, self.peers_filled)
        if missing:
            raise ApiError(f"program {state.name!r}: peer table(s) not filled yet: {', '.join(missing)}; connect() "
                           "(or connect_local) first")
        if not has_nccl(state):
            return
        for rec in state.records:
            if is_nccl(rec) and nccl_group(rec.launch, rec.path) not in self.comms:
                raise ApiError(f"program {state.name!r}: {rec.path}: NCCL group {nccl_group(rec.launch, rec.path)!r} was "
                               "never joined: connect() (or connect_local) first")
        if self.local_group is not None and not via_group:
            raise ApiError(f"program {state.name!r} holds NCCL collectives and this runtime was connected with "
                           "connect_local: issue it through the LocalGroup (group.issue / group.run), which interleaves "
                           "the ranks' calls in one thread")

    # ------------------------------------------------------------ public API

    @property
    def ranks(self) -> dict[str, int]:
        """This runtime's index per topology group."""
        return dict(self._ranks)

    @property
    def peers_ready(self) -> bool:
        """Every peer table filled and every NCCL group joined."""
        return not missing_peer_tables(self.peer_tables, self.peers_filled) and self.nccl_groups <= set(self.comms)

    def export_handles(self, portable: bool = False) -> dict[str, PeerHandle]:
        """A PeerHandle for every export buffer and every VMM-backed state, by name (fabric or local handles).
        `portable`: handles another process can import (fabric, else POSIX file descriptors, which the caller
        owns and closes: `Offer.close_fds`), and only for what some peer table maps (every rank's manifest has
        the same tables), so no descriptor is made for memory no peer reads. Raises ApiError when `portable`
        meets an allocation without a shareable handle type."""
        self._activate()
        wanted = {of for of, _ in self.peer_tables.values()} if portable else None
        out: dict[str, PeerHandle] = {}
        try:
            for name, buf in self.manifest.buffers.items():
                if buf.export and (wanted is None or name in wanted):
                    out[name] = export_handle(name, self._buffers[name], portable)
            for name, alloc in self._states.items():
                if alloc.blocks and (wanted is None or name in wanted):
                    out[name] = export_handle(name, alloc, portable)
        except BaseException:
            Offer("", "", {}, out).close_fds()
            raise
        return out

    def import_peers(self, group: str, members: Sequence[Mapping[str, PeerHandle]]) -> None:
        """Map what this rank's peer tables of `group` need from every member and write the tables
        (entry i: member i's allocation as mapped here; this rank's own entry: its own address). Each
        (target, member) is mapped once and stays mapped for the runtime's life. Raises ApiError for a
        wrong member count or a missing handle."""
        self._activate()
        size = self.topology.get(group)
        if size is None:
            raise ApiError(f"unknown topology group {group!r}; the manifest declares {sorted(self.topology)}")
        if len(members) != size:
            raise ApiError(f"group {group!r} has {size} members, import_peers got {len(members)} handle tables")
        me = self._ranks.get(group)
        for table, (of, g) in self.peer_tables.items():
            if g != group:
                continue
            addresses = []
            for i, handles in enumerate(members):
                if i == me:
                    addresses.append((self._buffers.get(of) or self._states[of]).address)
                    continue
                key = (of, group, i)
                if key not in self._peer_maps:
                    handle = handles.get(of)
                    if handle is None:
                        raise ApiError(f"group {group!r}: member {i} offers no handle for {of!r} (peer table {table!r})")
                    self._peer_maps[key] = map_peer(handle, self.gpu, self._ledger, vmm_granularity_bytes(self.gpu))
                addresses.append(self._peer_maps[key])
            data = np.asarray(addresses, dtype=np.uint64)
            call("cuMemcpyHtoD", self._buffers[table].address, data.ctypes.data, data.nbytes)
            self.peers_filled.add(table)

    def offer(self, portable: bool = False) -> Offer:
        """This rank's side of the handshake: family digest, ranks, peer handles, and a fresh NCCL
        unique id for each NCCL group in which this rank is member 0. `portable`: for other processes
        (`export_handles(portable=True)`; the offer's descriptors are the caller's: `Offer.close_fds()` once
        the exchange has sent them)."""
        if any(self._ranks.get(g) == 0 for g in self.nccl_groups):
            pin_nccl_env()  # before NCCL's first call in this process (NCCL_NVLS_ENABLE=0 included)
        ids = {g: unique_id() for g in sorted(self.nccl_groups) if self._ranks.get(g) == 0}
        handles = self.export_handles(portable)
        return Offer(self.manifest.family_digest, self.manifest.digest, dict(self._ranks), handles, ids)

    def connect(self, offers: Mapping[str, Sequence[Offer]]) -> None:
        """Join every group: `offers[group]` is the members' offers in member order (this rank's
        included). Checks the manifests agree, imports peers, checks no peer table is unfilled, joins
        the NCCL groups (blocks until every member joins). Raises ApiError."""
        self.prepare_connect(offers)
        for group in sorted(self.nccl_groups):
            self.join_nccl(group, nccl_id_of(group, offers[group]))

    def prepare_connect(self, offers: Mapping[str, Sequence[Offer]]) -> None:
        needed = self.nccl_groups | {g for _, g in self.peer_tables.values()}
        for group in sorted(needed):
            if group not in offers:
                raise ApiError(f"connect: no offers for group {group!r}, which the manifest uses")
        for group, members in offers.items():
            if group not in self.topology:
                raise ApiError(f"connect: unknown group {group!r}; the manifest declares {sorted(self.topology)}")
            check_offers(group, self.topology[group], list(members), self.manifest.family_digest, self._ranks.get(group))
            self.import_peers(group, [o.handles for o in members])
        missing = missing_peer_tables(self.peer_tables, self.peers_filled)
        if missing:
            raise ApiError(f"connect: peer table(s) left unfilled: {', '.join(missing)}")

    def own(self, label: str, undo: Callable[[], None]) -> None:
        """Register `undo` (a communicator's close) on the runtime's ledger."""
        self._ledger.on_close(label, undo)

    def join_nccl(self, group: str, uid: bytes) -> None:
        self._activate()
        comm = Communicator.create(group, self.topology[group], self._ranks[group], uid, self.gpu)
        self.comms[group] = comm
        self._ledger.on_close(f"NCCL communicator {group}", comm.close)


def nccl_id_of(group: str, offers: Sequence[Offer]) -> bytes:
    uid = offers[0].nccl_ids.get(group)
    if uid is None:
        raise ApiError(f"group {group!r}: member 0's offer carries no NCCL id (does its manifest use NCCL in {group!r}?)")
    return uid


# ---------------------------------------------------------------- one process, every rank


def connect_local(runtimes: Sequence[Any]) -> "LocalGroup":
    """Connect runtimes of one process that together hold every rank of every group their manifest
    uses: offers exchanged in-process (local handles allowed), peers imported, every NCCL join inside
    one ncclGroupStart/End. Returns the LocalGroup that issues NCCL programs. Raises ApiError."""
    rts = list(runtimes)
    if not rts:
        raise ApiError("connect_local needs at least one runtime")
    offers_by_rt = [rt.offer() for rt in rts]
    groups = set().union(*(set(rt.topology) for rt in rts))
    offers: dict[str, list[Offer]] = {}
    for group in sorted(groups):
        members: dict[int, Offer] = {}
        for rt, offer in zip(rts, offers_by_rt):
            rank = rt.ranks.get(group)
            if rank is None:
                continue
            if rank in members:
                raise ApiError(f"connect_local: two runtimes are rank {rank} of group {group!r}")
            members[rank] = offer
        size = rts[0].topology.get(group, 0)
        if members and sorted(members) != list(range(size)):
            raise ApiError(f"connect_local: group {group!r} of size {size} has runtimes for ranks {sorted(members)}; "
                           "one process must hold every rank")
        if members:
            offers[group] = [members[r] for r in range(size)]
    for rt in rts:
        rt.peers.prepare_connect({g: o for g, o in offers.items() if g in rt.ranks})
    joins = [(rt, g) for rt in rts for g in sorted(rt.peers.nccl_groups)]
    if joins:
        pin_nccl_env()
        created: list[tuple[Any, str, Communicator]] = []
        group_start()
        try:
            for rt, g in joins:
                rt._activate()
                created.append((rt, g, Communicator.create(g, rt.topology[g], rt.ranks[g], nccl_id_of(g, offers[g]), rt.gpu)))
        finally:
            group_end()
        for rt, g, comm in created:
            rt.peers.comms[g] = comm
            rt.peers.own(f"NCCL communicator {g}", comm.close)
    group = LocalGroup(rts)
    for rt in rts:
        rt.peers.local_group = group
    return group


class LocalGroup:
    """Ranks held by one process. `issue` / `run` enqueue a program on every rank, interleaved call
    by call, each NCCL collective of all ranks in one NCCL group call; graph programs are captured on
    every rank's stream together. Inputs are per runtime (`group.runtimes[i].write_input`) or to all
    (`write_input`)."""

    def __init__(self, runtimes: Sequence[Any]) -> None:
        self.runtimes = list(runtimes)

    def write_input(self, name: str, array: Any) -> None:
        for rt in self.runtimes:
            rt.write_input(name, array)

    def synchronize(self) -> None:
        for rt in self.runtimes:
            rt.synchronize()

    def _states(self, program: str, vars: Mapping[str, int] | None) -> list[tuple[Any, Any, dict[str, int]]]:
        out = []
        for rt in self.runtimes:
            rt._activate()
            state = rt._program(program)
            rt.peers.require_ready(state, via_group=True)
            out.append((rt, state, normalise_vars(vars, rt.manifest.vars, state.reads, program)))
        counts = {len(s.records) for _, s, _ in out}
        if len(counts) != 1:
            raise ApiError(f"program {program!r} compiles to {sorted(counts)} records on the ranks; the manifests disagree")
        return out

    def _enqueue_all(self, items: list[tuple[Any, Any, dict[str, int]]]) -> None:
        """Every rank's records, interleaved call by call, each through its runtime's one enqueue path
        (`Launcher.enqueue`); an NCCL collective of all ranks inside one ncclGroupStart/End."""
        for rt, state, values in items:
            rt._activate()
            rt.programs.patch(state, values)
            rt.programs.launcher.zero(state)  # zero_each_run buffers, before the program's first launch
        for i in range(len(items[0][1].records)):
            recs = [state.records[i] for _, state, _ in items]
            if not any(r.active for r in recs):
                continue
            grouped = is_nccl(recs[0])
            if grouped:
                group_start()
            try:
                for (rt, state, _), rec in zip(items, recs):
                    if rec.active:
                        rt._activate()
                        rt.programs.launcher.enqueue(state, rec)
            finally:
                if grouped:
                    group_end()

    def run(self, program: str, vars: Mapping[str, int] | None = None) -> None:
        """Every rank's `program`, launch by launch (eager). Does not synchronise."""
        self._enqueue_all(self._states(program, vars))

    def issue(self, program: str, vars: Mapping[str, int] | None = None, eager: bool = False) -> None:
        """Every rank's `program`: its CUDA graph (captured jointly on first use per key) unless `eager`
        or not a graph program."""
        items = self._states(program, vars)
        if eager or not items[0][1].graph:
            self._enqueue_all(items)
            return
        keys = [graph_key(program, values, state.reads) for _, state, values in items]
        if not all(key in rt.programs.graphs for (rt, _, _), key in zip(items, keys)):
            self._capture(items, keys)
        for (rt, _, _), key in zip(items, keys):
            rt._activate()
            rt.programs.graphs.replay(key, lambda: None, rt.stream)

    def _capture(self, items: list[tuple[Any, Any, dict[str, int]]], keys: list[Any]) -> None:
        mode = capture_mode()  # thread-local, as every capture of kern (cuda.graphs.GraphCache.capture)
        begun: list[Any] = []
        graphs: list[Any] = []
        try:
            for rt, _, _ in items:
                rt._activate()
                call("cuStreamBeginCapture", rt.stream, mode)
                begun.append(rt)
            self._enqueue_all(items)
        except BaseException:
            for rt in begun:
                try:
                    g = call("cuStreamEndCapture", rt.stream)
                    if g is not None:
                        call("cuGraphDestroy", g)
                except KernError:
                    pass
            raise
        for rt, _, _ in items:
            rt._activate()
            graphs.append(call("cuStreamEndCapture", rt.stream))
        for (rt, _, _), key, graph in zip(items, keys, graphs):
            rt._activate()
            try:
                rt.programs.graphs.put(key, call("cuGraphInstantiate", graph, 0))
            finally:
                call("cuGraphDestroy", graph)

    def close(self) -> None:
        for rt in self.runtimes:
            rt.peers.local_group = None
            rt.close()
