"""The executor: `Runtime.load` brings a verified manifest to life; `issue` replays its programs.

Load path (each step's acquisitions go on one `Ledger`, so a failure at any step frees all):
check the arguments -> verify manifest -> open the context and compute stream -> hash and load exactly
the pinned cubins -> resolve each launch's entry in its own module by parameter layout (cooperative
launches checked for co-residency) -> allocate buffers at var max (an `init` buffer written with its
bytes), op scratch, fixed states -> pooled states through VMM (sized by kern_pool from the `Capacity`) ->
compile call tables into launch records -> check pinned cuBLASLt algorithms at both ends of every var
range -> bind weights -> derive programs -> once programs -> synchronise (error words checked) -> ready.

Replay: `run` enqueues launch by launch (`run_range` only the calls of an index range); `issue` uses
the program's CUDA graph when it declares `graph: true` (one capture per key of read vars). Inputs go
through resident pinned staging on the compute stream; `read_output` synchronises.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable, Mapping

import numpy as np
from kern_manifest import ExternLaunch, Manifest, var_max, var_min
from kern_pool import Host, Pool

from .buffer_io import BufferIO
from .cuda.blas import EXTERN_GEMMS, WORKSPACE_BYTES, Blas, check_algo_keys, gemm_call
from .cuda.driver import call, init_driver
from .cuda.dtypes import item_bytes
from .cuda.graphs import graph_key, normalise_vars
from .cuda.memory import Allocation, Ledger, vmm_granularity_bytes
from .cuda.modules import (
    load_module,
    read_pinned_modules,
    resolve_launches,
)
from .cuda.occupancy import CoResidency, check_cooperative_launches, sm_count
from .describe import describe
from .device_faults import ErrorWords
from .errors import (
    ApiError,
    WeightArtifactError,
    int_arg,
)
from .kv.capacity import Capacity, PoolLayout, plan_pool
from .kv.device_pool import DevicePool
from .kv.host_tier import PinnedHost
from .kv.pooled import PoolState
from .kv.state_access import StateAccess
from .load_args import check_load_args, load_spec
from .multigpu.connect import Peers
from .parts import attribute, method
from .program.records import (
    AddressBook,
    ExternRecord,
    Record,
    args_at_range_ends,
    compile_program,
    program_reads,
)
from .program.per_run import zero_spans
from .program.replay import Launcher, Programs, ProgramState
from .weights.loader import Progress, Target, WeightLoader
from .weights.plan import BindPlan, Copy, plan_bind
from .weights.resident import ResidentWeights, weight_identity
from .weights.tensors import Tensors

class Runtime:
    """A loaded manifest on one GPU. Build with `Runtime.load`; close with `close()` (or `with`).

    A façade over parts held as attributes: `peers` (multi-GPU: multigpu/connect.py), `programs` (compiled programs, the one enqueue path, graphs:
    program/replay.py), `io` (inputs, outputs, events: buffer_io.py), `kv` (the device pool:
    kv/device_pool.py) and `states` (whole-state access: kv/state_access.py); the I/O, pool and state methods
    below are theirs."""

    # ---- the parts' methods and properties as the façade's (parts.py): rt.lease(...) is rt.kv.lease(...)
    # the device pool (kv/device_pool.py)
    kern_pool: Pool = attribute("kv", DevicePool.kern_pool)
    scratch_slot_id: int | None = attribute("kv", DevicePool.scratch_slot_id)
    host_tier: Host = attribute("kv", DevicePool.host_tier)
    host_memory: PinnedHost = attribute("kv", DevicePool.host_memory)
    settle = method("kv", DevicePool.settle)
    state_object_address = method("kv", DevicePool.state_object_address)
    lease = method("kv", DevicePool.lease)
    lease_slot = method("kv", DevicePool.lease_slot)
    checkpoint = method("kv", DevicePool.checkpoint)
    retire = method("kv", DevicePool.retire)
    lease_from = method("kv", DevicePool.lease_from)
    fork = method("kv", DevicePool.fork)
    block_table = method("kv", DevicePool.block_table)
    reserve_host = method("kv", DevicePool.reserve_host)
    host_units = method("kv", DevicePool.host_units)
    host_split = method("kv", DevicePool.host_split)
    reserve_host_bytes = method("kv", DevicePool.reserve_host_bytes)
    room = method("kv", DevicePool.room)
    park = method("kv", DevicePool.park)
    park_now = method("kv", DevicePool.park_now)
    wake = method("kv", DevicePool.wake)
    landed = method("kv", DevicePool.landed)
    awake = method("kv", DevicePool.awake)
    wake_now = method("kv", DevicePool.wake_now)
    copy = method("kv", DevicePool.copy)
    copy_out = method("kv", DevicePool.copy_out)
    copy_in = method("kv", DevicePool.copy_in)
    # inputs, outputs, events (buffer_io.py)
    write_input = method("io", BufferIO.write_input)
    read_buffer = method("io", BufferIO.read_buffer)
    read_output = method("io", BufferIO.read_output)
    read_output_async = method("io", BufferIO.read_output_async)
    record_event = method("io", BufferIO.record_event)
    host_array = method("io", BufferIO.host_array)
    # whole-state access (kv/state_access.py)
    read_state = method("states", StateAccess.read_state)
    write_state_at = method("states", StateAccess.write_state_at)
    zero_states = method("states", StateAccess.zero_states)
    # multi-GPU peers (multigpu/connect.py)
    ranks: dict[str, int] = attribute("peers", Peers.ranks)
    peers_ready: bool = attribute("peers", Peers.peers_ready)
    export_handles = method("peers", Peers.export_handles)
    import_peers = method("peers", Peers.import_peers)
    offer = method("peers", Peers.offer)
    connect = method("peers", Peers.connect)

    def __init__(self) -> None:  # use Runtime.load
        self._ledger = Ledger()
        self._closed = False
        self.manifest: Manifest
        self.max_values: dict[str, int] = {}  # every var at its max: what buffers are allocated at
        self.min_values: dict[str, int] = {}  # every var at its min: what unread vars normalise to
        self.topology: dict[str, int] = {}  # topology group -> size
        self.gpu = 0
        self.context: Any = None
        self.stream: Any = None
        self.pool: PoolLayout | None = None
        self.weight_load_stats: tuple[int, float] = (0, 0.0)
        self.weight_load_timings: dict[str, float] = {}  # WeightLoader.timings of the checkpoint copies
        self._buffers: dict[str, Allocation] = {}
        self._states: dict[str, Allocation] = {}
        self._scratch: dict[tuple[str, str], Allocation] = {}
        self._weights: dict[tuple, Allocation] = {}
        self._functions: dict[tuple[str, int], Any] = {}
        self._function_modules: dict[tuple[str, int], str] = {}
        self.programs: Programs | None = None  # compiled programs and their replay (program/replay.py)
        self._blas: Blas | None = None
        self._residency: CoResidency | None = None  # co-resident capacity of cooperative launches (cuda/occupancy.py)
        self.faults: ErrorWords | None = None  # the manifest's error words (device_faults.py); made in _allocate
        self._input_staging: dict[str, tuple[Allocation, Any]] = {}
        self.io: BufferIO  # inputs, outputs, events (buffer_io.py); made in _allocate
        self._ranks: dict[str, int] = {}
        self._rank_sizes: dict[str, int] = {}  # group -> size given as ranks={group: (index, size)}
        self.peers: Peers  # the multi-GPU part (multigpu/connect.py); made first in load
        self._pooled_state: PoolState | None = None
        self.kv = DevicePool(None, None, 0, self._activate)  # the device pool; replaced in _allocate

    # ------------------------------------------------------------ load

    @classmethod
    def load(cls, manifest: Any, kernels_dir: str | os.PathLike[str], tensors: Tensors | None, gpu: int = 0,
             capacity: Capacity = Capacity(tokens=4096, seqs=1), progress: Progress | None = None, *,
             ranks: Mapping[str, int | tuple[int, int]] | None = None, resident: ResidentWeights | None = None,
             threads: int | None = None, staging_bytes: int | None = None) -> "Runtime":
        """Load `manifest` (path, JSON, dict or kern_manifest.Manifest) on device `gpu`.

        `kernels_dir`: directory of `<module>-<sha12>.cubin`; `tensors`: the checkpoint (None only
        for a manifest without checkpoint-bound weights); `capacity`: pooled-state budget;
        `progress(bytes_done, bytes_total)`: weight-load progress (worker threads); `ranks`: this
        process's place per topology group, `{group: index}` or `{group: (index, size)}` (a given size
        must equal the manifest's size of the group); `resident`: device weights kept by `into_resident()` on
        the same GPU; `threads`: weight-loading threads (an int >= 1; None: one per CPU, at most 16);
        `staging_bytes`: bytes of each loading thread's two pinned staging buffers (an int >= 1; None: the
        loader's 8 MiB).
        Raises ManifestParseError/ManifestVerifyError, ManifestError (a manifest fact only the runtime
        checks: wiring, packs, tensor maps, externs), KernelArtifactError (CoResidencyError included),
        WeightArtifactError, ApiError (an argument of the wrong type or value, named in the message:
        kernels_dir, tensors, gpu, capacity, progress, ranks, resident of another GPU, threads,
        staging_bytes; a gpu that does not exist; no tensors for a manifest that binds or derives from
        them; a capacity kern_pool refuses or larger than the device's free memory; NCCL externs),
        CudaError (cuda-bindings or the CUDA driver library cannot be loaded: what a machine without a
        GPU gets), DriverError/BlasError, CallError (a failing call of a derive or once program),
        DeviceFaultError (a kernel run during load wrote an error word). Argument errors are raised
        before anything is allocated (`resident` is then left as it was).
        """
        gpu, ranks_, sizes, threads = check_load_args(kernels_dir, tensors, gpu, capacity, progress, ranks,
                                                       resident, threads)
        if staging_bytes is not None:
            staging_bytes = int_arg(staging_bytes, "staging_bytes", 1)
        rt = cls()
        rt._set_manifest(load_spec(manifest))
        rt.gpu = gpu
        rt._ranks = ranks_
        rt._rank_sizes = sizes
        # checks the topology (ranks against the manifest's groups) and touches nothing: an ApiError here is an
        # argument error, raised before the try below, so a `resident` is left as it was (not closed)
        rt.peers = Peers(rt.manifest, rt.topology, rt.min_values, rt.max_values, rt._ranks, rt._rank_sizes, gpu,
                         rt._ledger, rt._buffers, rt._states, rt._scratch, rt._activate)
        try:
            rt._open_context(gpu)
            rt._load_modules(kernels_dir)
            rt._allocate(capacity, resident)
            rt._compile_programs()
            rt._check_algo_pins()
            rt.peers.check_nccl_records(rt._states_compiled())
            rt._bind_weights(tensors, progress, threads, staging_bytes)
            rt._run_once_programs()
            call("cuStreamSynchronize", rt.stream)
            if rt.faults:
                rt.faults.check()  # a once program that reports a fault fails the load
        except BaseException:
            rt._ledger.close()
            rt._closed = True
            raise
        finally:
            if resident is not None:
                resident.close()
        return rt

    @classmethod
    def load_over(cls, resident: ResidentWeights, manifest: Any, kernels_dir: str | os.PathLike[str], tensors: Tensors | None,
                  **kwargs: Any) -> "Runtime":
        """`load` reusing identical device weight buffers from `resident`, on its GPU unless `gpu` says
        otherwise. Raises like `load` (ApiError when `resident` is not a ResidentWeights or lives on another GPU:
        `load` checks the GPU)."""
        if not isinstance(resident, ResidentWeights):
            raise ApiError(f"load_over: resident must be a ResidentWeights (from into_resident()), got {type(resident).__name__}")
        kwargs.setdefault("gpu", resident.gpu)
        return cls.load(manifest, kernels_dir, tensors, resident=resident, **kwargs)

    def _set_manifest(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self.max_values, self.min_values = var_max(manifest.vars), var_min(manifest.vars)
        self.topology = manifest.topology.sizes()

    @property
    def spec(self) -> Manifest:
        """The loaded kern_manifest.Manifest (the older name of `manifest`)."""
        return self.manifest

    def _open_context(self, gpu: int) -> None:
        init_driver()  # CudaError (not cuda.pathfinder's exception) when libcuda cannot be loaded
        count = int(call("cuDeviceGetCount"))
        if not 0 <= gpu < count:
            raise ApiError(f"gpu {gpu} does not exist: {count} device(s) visible")
        device = call("cuDeviceGet", gpu)
        self.context = call("cuDevicePrimaryCtxRetain", device)
        self._ledger.on_close("primary context", lambda: call("cuDevicePrimaryCtxRelease", device))
        call("cuCtxSetCurrent", self.context)
        self.stream = call("cuStreamCreate", 1)  # CU_STREAM_NON_BLOCKING: never the legacy NULL stream
        stream = self.stream
        self._ledger.on_close("compute stream", lambda: call("cuStreamDestroy", stream))

    def _load_modules(self, kernels_dir: str | os.PathLike[str]) -> None:
        images = read_pinned_modules(kernels_dir, {n: m.sha256 for n, m in self.manifest.modules.items()})
        self.peers.scan_peer_launches(images)  # multicast check of launches that receive peer memory
        modules = {name: load_module(image, name, self._ledger) for name, image in images.items()}
        self._functions, self._function_modules = resolve_launches(self.manifest, modules, self.max_values,
                                                                   self.min_values)
        if any(getattr(l, "cooperative", False) for op in self.manifest.ops.values() for l in op.launches):
            self._residency = CoResidency(sm_count(call("cuDeviceGet", self.gpu)))
            check_cooperative_launches(self.manifest, self._functions, self._residency, self.min_values,
                                       self.max_values)

    def _allocate(self, capacity: Capacity, resident: ResidentWeights | None) -> None:
        spec, maxv = self.manifest, self.max_values
        for name, buf in spec.buffers.items():
            shape = buf.shape_at(maxv)
            nbytes = math.prod(shape) * item_bytes(buf.dtype)
            if buf.kind == "weight" and resident is not None and buf.placement == "device" and not buf.derived:
                key = weight_identity(buf, shape)
                claimed = resident.buffers.pop(key, None)
                if claimed is not None:
                    self._buffers[name] = self._ledger.adopt(claimed)
                    self._weights[key] = claimed
                    continue
            if buf.placement == "host":
                alloc = self._ledger.pinned(nbytes, f"buffer {name}")
            elif buf.export:
                alloc = self.peers.peer_vmm(nbytes, f"buffer {name}", self.stream)  # one VMM block peers can map
            else:
                alloc = self._ledger.device(nbytes, f"buffer {name}")
            self._buffers[name] = alloc
            if buf.init is not None:  # a device-resident table: its bytes, verified to be the buffer's size
                data = np.frombuffer(buf.init.data(), dtype=np.uint8)  # u8[nbytes]
                # on the runtime's stream, which the once programs reading it run on (a plain cuMemcpyHtoD is
                # on the legacy stream, and its DMA may still be in flight when it returns)
                call("cuMemcpyHtoDAsync", alloc.address, data.ctypes.data, data.nbytes, self.stream)
        for op in spec.ops.values():
            for sname, expr in op.scratch.items():
                self._scratch[(op.name, sname)] = self._ledger.device(expr.eval(maxv), f"scratch {op.name}.{sname}")
        for name, state in spec.states.items():
            if state.kind == "fixed":
                nbytes = state.bytes or 0
                if self.topology:  # peers may map states: VMM
                    alloc = self.peers.peer_vmm(nbytes, f"state {name}", self.stream)
                else:
                    alloc = self._ledger.device(nbytes, f"state {name}")
                call("cuMemsetD8Async", alloc.address, 0, max(nbytes, 1), self.stream)
                self._states[name] = alloc
        if any(isinstance(l, ExternLaunch) and l.name in EXTERN_GEMMS for op in spec.ops.values() for l in op.launches):
            workspace = self._ledger.device(WORKSPACE_BYTES, "cuBLASLt workspace")
            self._blas = Blas(workspace.address)
            blas = self._blas
            self._ledger.on_close("cuBLASLt", blas.close)
        for name, buf in spec.buffers.items():
            if buf.kind == "input":
                alloc = self._buffers[name]
                staging = self._ledger.pinned(alloc.nbytes, f"input staging {name}")
                event = call("cuEventCreate", 2)
                self._ledger.on_close(f"input event {name}", lambda e=event: call("cuEventDestroy", e))
                self._input_staging[name] = (staging, event)
        self.faults = ErrorWords(self.manifest, self._buffers)  # error words (device_faults.py lists the waits)
        self.io = BufferIO(self.manifest, self.max_values, self._buffers, self._input_staging, self._ledger,
                           self.stream, self._activate, self.faults.check if self.faults else (lambda: None))
        # the pool last: sized from what the allocations above left free; then the whole-state access over all
        self._allocate_pool(capacity)
        self.states = StateAccess(self.manifest, self._states, self._buffers, self._pooled_state, self.stream,
                                  self._activate)

    def _allocate_pool(self, capacity: Capacity) -> None:
        spec = self.manifest
        if any(s.pooled for s in spec.states.values()):
            granularity = vmm_granularity_bytes(self.gpu)
            # free memory after every other allocation (buffers, scratch, fixed states, the cuBLASLt
            # workspace, input staging): tokens=None takes it less the headroom (spec, K1b)
            free_bytes, _ = call("cuMemGetInfo")
            free_bytes = int(free_bytes)
            self.pool = plan_pool(spec.states, capacity, granularity, free_bytes)  # refuses one past free_bytes
            assert self.pool is not None
            # one arena for every pooled state, mapped where kern_pool says, zeroed (kv/remap.py, kv/pooled.py)
            ps = PoolState.create(self.pool.layout, self.gpu, self.context, self.stream)
            self._ledger.on_close("pooled states", ps.close)
            self._pooled_state = ps
            self.kv = DevicePool(ps, self.stream, self.gpu, self._activate)
            for i, name in enumerate(self.pool.layout.states):
                self._states[name] = Allocation(f"state {name}", ps.arena.state_base(i), self.pool.mapped_bytes[name])

    def _address_book(self, extra: Mapping[str, int] | None = None) -> AddressBook:
        targets = {name: a.address for name, a in self._buffers.items()}
        targets.update({name: a.address for name, a in self._states.items()})
        targets.update(extra or {})
        scratch = {key: a.address for key, a in self._scratch.items()}
        pages = dict(self.pool.reserved_pages) if self.pool is not None else {}
        # a tensor map's fill dim spans its pooled state's whole reserved range (records._fill_range)
        reserve = {name: self.pool.reserve_bytes for name in self.pool.layout.states} if self.pool is not None else {}
        return AddressBook(targets, scratch, self._ranks, pages, reserve)

    def _compile(self, name: str, book: AddressBook) -> ProgramState:
        from .cuda.tensormaps import encode_tiled

        program = self.manifest.programs[name]
        records, calls = compile_program(self.manifest, name, book, lambda op, li: self._functions[(op, li)], encode_tiled)
        for rec in records:
            if self._residency is not None and getattr(rec.launch, "cooperative", False):
                rec.residency = self._residency  # checked again whenever new var values patch its geometry
        zero = zero_spans(self.manifest, name, lambda b: self._buffers[b].address, lambda b: self._buffers[b].nbytes)
        return ProgramState(name, program.graph, program.kind, records, program_reads(records), calls, zero=zero)

    def _compile_programs(self) -> None:
        self.programs = Programs(Launcher(self.stream, self._blas, self.peers.nccl_issue))
        book = self._address_book()
        for name, program in self.manifest.programs.items():
            if program.kind == "derive":
                continue  # compiled against the source staging area in _bind_weights
            self.programs.states[name] = self._compile(name, book)

    def _check_algo_pins(self) -> None:
        """Every pinned algorithm at both ends of its var ranges (when-vars clamped to the interval)."""
        if self._blas is None:
            return
        minv, maxv = self.min_values, self.max_values
        for state in self._states_compiled():
            for rec in state.records:
                if not isinstance(rec, ExternRecord) or rec.name not in EXTERN_GEMMS or not rec.algo:
                    continue
                check_algo_keys(rec.algo, rec.path)
                for args in args_at_range_ends(rec, minv, maxv):
                    self._blas.plan(gemm_call(rec.name, args, rec.path), rec.algo, rec.path)

    def _bind_weights(self, tensors: Tensors | None, progress: Progress | None, threads: int | None,
                      staging_bytes: int | None = None) -> None:
        maxv = self.max_values
        targets = []
        for name, buf in self.manifest.buffers.items():
            if buf.kind != "weight" or buf.bind is None or buf.derived:
                continue
            shape = buf.shape_at(maxv)
            key = weight_identity(buf, shape)
            if key in self._weights:
                continue  # claimed from a ResidentWeights: already filled
            if tensors is None:
                raise ApiError(f"buffer {name!r} binds checkpoint tensors, but no tensors were given")
            plan = plan_bind(buf, tensors.meta, maxv)
            alloc = self._buffers[name]
            targets.append(Target(plan, alloc.address, alloc.host_address))
            if buf.placement == "device":
                self._weights[key] = alloc
        derive = [p for p in self.manifest.programs.values() if p.kind == "derive"]
        start = time.perf_counter()
        nbytes = 0
        if targets:
            assert tensors is not None
            loader = WeightLoader(tensors, self.context, threads=threads, progress=progress,
                                  staging_bytes=staging_bytes)
            nbytes, _ = loader.run(targets)
            self.weight_load_timings = dict(loader.timings)
        for program in derive:
            nbytes += self._run_derive(program.name, tensors, threads)
        self.weight_load_stats = (nbytes, time.perf_counter() - start)

    def _run_derive(self, name: str, tensors: Tensors | None, threads: int | None) -> int:
        """Stream a derive program's source tensors into one staging area and run it once."""
        sources = self.manifest.programs[name].sources or {}
        if tensors is None:
            raise ApiError(f"derive program {name!r} needs checkpoint tensors, none were given")
        offsets, targets, total = {}, [], 0
        for src, tensor in sources.items():
            meta = tensors.meta(tensor)
            if meta is None:
                raise WeightArtifactError(f"checkpoint has no tensor {tensor!r} (source {src!r} of derive program {name!r})")
            offsets[src] = total
            total += -(-meta.nbytes // 256) * 256
        ledger = Ledger()
        try:
            staging = ledger.device(total, f"derive staging {name}")
            for src, tensor in sources.items():
                meta = tensors.meta(tensor)
                assert meta is not None
                copy = Copy.linear(tensor, 0, 0, meta.nbytes)
                plan = BindPlan(f"{name}.{src}", meta.nbytes, (copy,))
                targets.append(Target(plan, staging.address + offsets[src]))
            WeightLoader(tensors, self.context, threads=threads).run(targets)
            state = self._compile(name, self._address_book({s: staging.address + o for s, o in offsets.items()}))
            self._programs().enqueue(state, self.min_values)
            call("cuStreamSynchronize", self.stream)
        finally:
            ledger.close()
        return total

    def _run_once_programs(self) -> None:
        for name, program in self.manifest.programs.items():
            if program.kind == "once":
                state = self._programs().states[name]
                self.peers.check_once_program(name, state)  # no peers / NCCL before connect
                self._programs().enqueue(state, self.min_values)

    # ------------------------------------------------------------ replay

    def _activate(self) -> None:
        if self._closed:
            raise ApiError("the runtime is closed")
        call("cuCtxSetCurrent", self.context)

    def _programs(self) -> Programs:
        assert self.programs is not None, "kern bug: programs used before they were compiled"
        return self.programs

    def _states_compiled(self) -> list[ProgramState]:
        return list(self.programs.states.values()) if self.programs is not None else []

    def _program(self, name: str) -> ProgramState:
        programs = self.programs
        if programs is None:
            raise ApiError(f"unknown program {name!r}: this runtime has no compiled programs")
        state = programs.states.get(name) if isinstance(name, str) else None  # the per-step path: one dict get
        return state if state is not None else programs.get(name)

    def run(self, program: str, vars: Mapping[str, int] | None = None) -> None:
        """Enqueue `program` launch by launch (eager) on the compute stream; does not synchronise.
        Raises ApiError (unknown program, bad vars: not a mapping, unknown, not integers, out of range),
        CallError (a failing call)."""
        self._activate()
        state = self._program(program)
        self.peers.require_ready(state)  # peers connected, NCCL joined (multigpu/connect.py)
        self._programs().enqueue(state, normalise_vars(vars, self.manifest.vars, state.reads, program))

    def run_range(self, program: str, vars: Mapping[str, int] | None, start: int, stop: int) -> None:
        """`run` restricted to the program's calls `start <= index < stop` (indices into the flattened call
        list of `program`, `rec.call_index` of `records(program)`: a `{"program": ...}` call is expanded in
        place; every launch of each of those calls, `when` deciding activity as in `run`, in program
        order). Eager and not synchronising, like `run`; `start == stop` enqueues nothing. Vars are
        checked and patched into the whole program as `run` does, so the range sees exactly the launch
        configuration `run` would. Raises ApiError (unknown program; start or stop not an integer, a bool
        included; start < 0, stop > the program's number of calls, start > stop; bad vars; a peer table
        not filled or an NCCL group not joined, as `run`), CallError (a failing call). Every ApiError is
        raised before anything is enqueued."""
        self._activate()
        state = self._program(program)
        count = state.calls
        first = int_arg(start, f"run_range({program!r}): start")
        end = int_arg(stop, f"run_range({program!r}): stop")
        if first < 0:
            raise ApiError(f"run_range({program!r}): start {first} is negative")
        if end > count:
            raise ApiError(f"run_range({program!r}): stop {end} is past the program's {count} call(s)")
        if first > end:
            raise ApiError(f"run_range({program!r}): start {first} is after stop {end}")
        self.peers.require_ready(state)  # peers connected, NCCL joined (multigpu/connect.py)
        self._programs().enqueue(state, normalise_vars(vars, self.manifest.vars, state.reads, program),
                                 range(first, end))

    def issue(self, program: str, vars: Mapping[str, int] | None = None, eager: bool = False) -> None:
        """Enqueue `program`: as its CUDA graph when it declares `graph: true` (captured on first use
        per key of read vars) unless `eager`; launch by launch otherwise. Does not synchronise.
        Raises ApiError (unknown program, bad vars: not a mapping, unknown, not integers, out of range),
        CallError (a failing call)."""
        self._activate()
        state = self._program(program)
        self.peers.require_ready(state)  # peers connected, NCCL joined (multigpu/connect.py)
        values = normalise_vars(vars, self.manifest.vars, state.reads, program)
        programs = self.programs
        if eager or not state.graph:
            programs.enqueue(state, values)
            return
        key = graph_key(program, values, state.reads)
        programs.graphs.replay(key, lambda: programs.enqueue(state, values), self.stream)

    @property
    def graph_keys(self) -> list[tuple]:
        """Keys of the graphs captured so far."""
        return self.programs.graphs.keys() if self.programs is not None else []

    def synchronize(self) -> None:
        """Wait for everything enqueued on the compute stream. Raises DeviceFaultError when a kernel wrote an error
        word (device_faults.py)."""
        self._activate()
        call("cuStreamSynchronize", self.stream)
        if self.faults:
            self.faults.check()

    # ------------------------------------------------------------ inputs and outputs

    def records(self, program: str) -> list[Record]:
        """The compiled launch records of `program` in order (`rec.op`, `rec.call_index`, `rec.active` after
        the last patch, `rec.path`, `rec.launch.entry` or `rec.name` of an extern)."""
        return list(self._program(program).records)

    def run_hooked(self, program: str, vars: Mapping[str, int] | None,
                   on_launch: Callable[[int, Record], None]) -> None:
        """`run` (eager, no synchronisation) calling `on_launch(index, record)` on this thread before each
        active record is enqueued; the hook may enqueue its own work on `self.stream` (events, a gate).
        Raises ApiError (unknown program, bad vars, `on_launch` not callable), CallError (a failing call)."""
        self._activate()
        if not callable(on_launch):
            raise ApiError(f"run_hooked: on_launch must be callable(index, record), got {type(on_launch).__name__}")
        state = self._program(program)
        self.peers.require_ready(state)
        values = normalise_vars(vars, self.manifest.vars, state.reads, program)
        self.programs.enqueue_hooked(state, values, on_launch)

    # ------------------------------------------------------------ geometry and description

    @property
    def page_tokens(self) -> int | None:
        """Tokens per page of the paged states; None without paged states."""
        return self.pool.page_tokens if self.pool else None

    @property
    def num_pages(self) -> int | None:
        """Page ids 0..num_pages-1 exist in every paged state; page 0 is the reserved scratch page."""
        return self.pool.num_pages if self.pool else None

    @property
    def scratch_page_id(self) -> int | None:
        """The reserved scratch page id (0), never leased; None without paged states."""
        return self.pool.scratch_page_id if self.pool else None

    @property
    def reserved_pages(self) -> Mapping[str, int]:
        """Paged state -> pages its reserved virtual range holds (what `{"pages_of": state}` resolves to:
        the bound kernels check block-table page ids against); empty without paged states."""
        return dict(self.pool.reserved_pages) if self.pool else {}

    @property
    def num_slots(self) -> int | None:
        """Per-seq slots sized at load (slot ids 0..num_slots-1; slot 0 is the scratch slot,
        `scratch_slot_id`); None without per-seq states."""
        return self.pool.num_slots if self.pool and self.pool.layout.has_slots else None

    def address_of(self, name: str) -> int:
        """Device address of a buffer or state (tests, debugging)."""
        alloc = self._buffers.get(name) or self._states.get(name)
        if alloc is None:
            raise ApiError(f"unknown buffer or state {name!r}")
        return alloc.address

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary for startup logs (describe.py)."""
        return describe(self)

    # ------------------------------------------------------------ lifetime

    def into_resident(self) -> ResidentWeights:
        """Close this runtime but keep its device weight buffers (checkpoint-bound, not derived)
        for `Runtime.load(..., resident=...)` / `load_over` on the same GPU."""
        self._activate()
        call("cuStreamSynchronize", self.stream)
        kept = {key: self._ledger.detach(alloc) for key, alloc in self._weights.items()}
        self._weights.clear()
        device = call("cuDeviceGet", self.gpu)
        call("cuDevicePrimaryCtxRetain", device)  # the resident keeps the context alive
        resident = ResidentWeights(self.gpu, self.context, device, kept)
        self.close()
        return resident

    def close(self) -> None:
        """Synchronise the compute stream, destroy the captured graphs, then free everything this runtime
        acquired; a second call does nothing. Error words are not read. Raises DriverError when the
        synchronisation, a graph's destruction or a free fails (a sticky device fault, say); the
        allocations are freed and the runtime is marked closed even then (the first failing free is
        raised after every other was tried)."""
        if self._closed:
            return
        try:
            call("cuCtxSetCurrent", self.context)
            call("cuStreamSynchronize", self.stream)
            if self.programs is not None:
                self.programs.close()
        finally:
            self._closed = True
            self._ledger.close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


