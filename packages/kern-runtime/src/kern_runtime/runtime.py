"""The executor: `Runtime.load` brings a verified manifest to life; `issue` replays its programs.

Load path (each step's acquisitions go on one `Ledger`, so a failure at any step frees all):
verify manifest -> hash and load exactly the pinned cubins -> resolve each launch's entry in its own
module by parameter layout -> allocate buffers at var max, op scratch, fixed states -> pooled states
through VMM (sized by kern_pool from the `Capacity`) -> bind weights -> compile call tables into
launch records -> check pinned cuBLASLt algorithms at both ends of every var range -> derive and once
programs -> ready.

Replay: `run` enqueues launch by launch (`run_range` only the calls of an index range); `issue` uses
the program's CUDA graph when it declares `graph: true` (one capture per key of read vars). Inputs go
through resident pinned staging on the compute stream; `read_output` synchronises.
"""

from __future__ import annotations

import math
import os
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from .blas import EXTERN_GEMMS, WORKSPACE_BYTES, Blas, check_algo_keys, gemm_call
from .capacity import Capacity, PoolLayout, plan_pool
from .driver import call, cu
from .dtypes import item_bytes, numpy_dtype
from .errors import (
    ApiError, CallError, KernError, KernelArtifactError, ManifestParseError, ManifestVerifyError,
    WeightArtifactError, int_arg,
)
from .graphs import GraphCache, graph_key, normalise_vars
from .host_tier import event_done
from .launch import launch_kernel
from .memory import Allocation, Ledger, vmm_granularity_bytes
from .modules import (
    function_attributes, load_module, raise_shared_limit, read_pinned_modules, resolve_function, set_shared_carveout,
)
from .multigpu import PeerMethods, is_nccl
from .pooled import PoolMethods, PoolState
from .records import (
    NCCL_EXTERNS, AddressBook, ExternRecord, KernelRecord, Record, args_at_range_ends, compile_call, program_reads,
)
from .state_access import StateMethods
from .stepping import StepMethods
from .spec import BufferSpec, ExternLaunch, KernelLaunch, Spec, spec_from_json
from .weights.loader import Progress, Target, WeightLoader
from .weights.plan import BindPlan, Copy, plan_bind
from .weights.tensors import Tensors

SHARED_DEFAULT_LIMIT_BYTES = 48 * 1024


# ---------------------------------------------------------------- manifest intake


def load_spec(manifest: Any) -> Spec:
    """Parse + verify a manifest given as a path, JSON text, a JSON dict or a kern_manifest.Manifest.

    Raises ManifestParseError / ManifestVerifyError (subclasses of kern_manifest's) for bad input.
    """
    import kern_manifest

    try:
        if isinstance(manifest, kern_manifest.Manifest):
            parsed = manifest
        elif isinstance(manifest, (str, os.PathLike)) and not str(manifest).lstrip().startswith("{"):
            try:
                text = kern_manifest.read_manifest_bytes(manifest)  # a regular file of at most 64 MiB
            except OSError as exc:
                raise kern_manifest.ManifestParseError(
                    "$", f"cannot read manifest {os.fspath(manifest)!r}: {exc.strerror or exc}") from None
            parsed = kern_manifest.parse_manifest(text)
        else:
            parsed = kern_manifest.parse_manifest(manifest)
        kern_manifest.verify(parsed)
    except kern_manifest.ManifestParseError as exc:
        raise ManifestParseError(exc.path, exc.message) from exc
    except kern_manifest.ManifestVerifyError as exc:
        raise ManifestVerifyError(exc.faults) from exc
    return spec_from_json(parsed.to_json())


# ---------------------------------------------------------------- helper records


@dataclass
class ProgramState:
    """A compiled program: its records, the vars they read, and the last values patched in."""

    name: str
    graph: bool
    kind: str
    records: list[Record]
    reads: frozenset[str]
    patched_key: tuple | None = None


@dataclass
class Resident:
    """Device weight buffers kept from a closed runtime for `Runtime.load(..., resident=...)`.

    `buffers`: identity key (see `weight_identity`) -> Allocation. Holds a reference on the GPU's
    primary context; `close()` frees what no load claimed and drops that reference (idempotent)."""

    gpu: int
    context: Any
    device: Any
    buffers: dict[tuple, Allocation] = field(default_factory=dict)

    def close(self) -> None:
        if self.context is None:
            return
        call("cuCtxSetCurrent", self.context)
        while self.buffers:
            _, alloc = self.buffers.popitem()
            alloc.free()
        self.context = None
        call("cuDevicePrimaryCtxRelease", self.device)


def weight_identity(buffer: BufferSpec, shape: tuple[int, ...]) -> tuple:
    """What must agree for a weight buffer to be reused: name, dtype, shape, placement, export, bind."""
    return (buffer.name, buffer.dtype, shape, buffer.placement, buffer.export, repr(buffer.bind))


class ReadbackHandle:
    """An output copy in flight: `ready()` polls, `wait()` blocks and returns the array (a copy)."""

    def __init__(self, staging: Allocation, event: Any, shape: tuple[int, ...], dtype: np.dtype, nbytes: int,
                 on_done: Callable[[], None]) -> None:
        self._staging, self._event = staging, event
        self._shape, self._dtype, self._nbytes = shape, dtype, nbytes
        self._on_done = on_done
        self._result: np.ndarray | None = None

    def ready(self) -> bool:
        return self._result is not None or event_done(self._event)

    def wait(self) -> np.ndarray:
        if self._result is None:
            call("cuEventSynchronize", self._event)
            raw = self._staging.host_view()[: self._nbytes].copy()
            self._result = raw.view(self._dtype).reshape(self._shape)
            self._on_done()
        return self._result


# ---------------------------------------------------------------- the runtime


class Runtime(PoolMethods, PeerMethods, StepMethods, StateMethods):
    """A loaded manifest on one GPU. Build with `Runtime.load`; close with `close()` (or `with`)."""

    def __init__(self) -> None:  # use Runtime.load
        self._ledger = Ledger()
        self._closed = False
        self.spec: Spec
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
        self._programs: dict[str, ProgramState] = {}
        self._graphs = GraphCache()
        self._blas: Blas | None = None
        self._input_staging: dict[str, tuple[Allocation, Any]] = {}
        self._readback_free: list[tuple[Allocation, Any]] = []
        # (handle, its staging and event) per readback not yet waited: a dropped handle's pair is reused once
        # its copy has completed (_reclaim_readbacks), instead of staying pinned until close
        self._readback_busy: list[tuple[weakref.ref, tuple[Allocation, Any]]] = []
        self._ranks: dict[str, int] = {}
        self._rank_sizes: dict[str, int] = {}  # group -> size given as ranks={group: (index, size)}
        self._init_peers()  # multi-GPU (multigpu.py)
        self._pooled_state: PoolState | None = None  # pool API (pooled.py)

    # ------------------------------------------------------------ load

    @classmethod
    def load(cls, manifest: Any, kernels_dir: str | os.PathLike[str], tensors: Tensors | None, gpu: int = 0,
             capacity: Capacity = Capacity(tokens=4096, seqs=1), progress: Progress | None = None, *,
             ranks: Mapping[str, int | tuple[int, int]] | None = None, resident: Resident | None = None,
             threads: int | None = None) -> "Runtime":
        """Load `manifest` (path, JSON, dict or kern_manifest.Manifest) on device `gpu`.

        `kernels_dir`: directory of `<module>-<sha12>.cubin`; `tensors`: the checkpoint (None only
        for a manifest without checkpoint-bound weights); `capacity`: pooled-state budget;
        `progress(bytes_done, bytes_total)`: weight-load progress (worker threads); `ranks`: this
        process's place per topology group, `{group: index}` or `{group: (index, size)}` (a given size
        must equal the manifest's size of the group); `resident`: device weights kept by `into_resident()` on
        the same GPU; `threads`: weight-loading threads (an int >= 1; None: one per CPU, at most 16).
        Raises ManifestParseError/ManifestVerifyError, KernelArtifactError, WeightArtifactError,
        ApiError (an argument of the wrong type or value, named in the message: kernels_dir, tensors,
        gpu, capacity, progress, ranks, resident of another GPU, threads; a capacity kern_pool refuses
        or larger than the device's free memory; NCCL externs), DriverError/BlasError. Argument errors
        are raised before anything is allocated (`resident` is then left as it was).
        """
        gpu, ranks_, sizes, threads = _check_load_args(kernels_dir, tensors, gpu, capacity, progress, ranks,
                                                       resident, threads)
        spec = load_spec(manifest)
        rt = cls()
        rt.spec = spec
        rt.gpu = gpu
        rt._ranks = ranks_
        rt._rank_sizes = sizes
        try:
            rt._check_topology()
            rt._open_context(gpu)
            rt._load_modules(kernels_dir)
            rt._allocate(capacity, resident)
            rt._compile_programs()
            rt._check_algo_pins()
            rt._check_nccl_records()
            rt._bind_weights(tensors, progress, threads)
            rt._run_once_programs()
            call("cuStreamSynchronize", rt.stream)
        except BaseException:
            rt._ledger.close()
            rt._closed = True
            raise
        finally:
            if resident is not None:
                resident.close()
        return rt

    @classmethod
    def load_over(cls, resident: Resident, manifest: Any, kernels_dir: str | os.PathLike[str], tensors: Tensors | None,
                  **kwargs: Any) -> "Runtime":
        """`load` reusing identical device weight buffers from `resident`, on its GPU unless `gpu` says
        otherwise. Raises like `load` (ApiError when `resident` is not a Resident or lives on another GPU:
        `load` checks the GPU)."""
        if not isinstance(resident, Resident):
            raise ApiError(f"load_over: resident must be a Resident (from into_resident()), got {type(resident).__name__}")
        kwargs.setdefault("gpu", resident.gpu)
        return cls.load(manifest, kernels_dir, tensors, resident=resident, **kwargs)

    def _open_context(self, gpu: int) -> None:
        call("cuInit", 0)
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
        images = read_pinned_modules(kernels_dir, self.spec.modules)
        self._scan_peer_launches(images)  # multicast check of launches that receive peer memory
        modules = {name: load_module(image, name, self._ledger) for name, image in images.items()}
        maxv, minv = self.spec.max_values, self.spec.min_values
        # The dynamic shared memory limit and the preferred carveout are properties of the function, not
        # of a launch: one function launched by several ops gets the largest of their shared sizes and
        # their one carveout (modules.function_attributes).
        uses: list[tuple[Any, str, int, int | None]] = []
        for op in self.spec.ops.values():
            for li, launch in enumerate(op.launches):
                if not isinstance(launch, KernelLaunch):
                    continue
                if launch.module not in modules:
                    raise KernelArtifactError(f"{launch.path}: module {launch.module!r} is not pinned")
                fn = resolve_function(modules[launch.module], launch.entry, launch.params,
                                      f"{launch.path} (module {launch.module!r})")
                shared = max(launch.shared_mem.eval(maxv), launch.shared_mem.eval(minv))
                uses.append((fn, launch.path, shared, launch.carveout))
                self._functions[(op.name, li)] = fn
                self._function_modules[(op.name, li)] = launch.module
        for attrs in function_attributes(uses):
            if attrs.shared_mem > SHARED_DEFAULT_LIMIT_BYTES:
                raise_shared_limit(attrs.function, attrs.shared_mem)
            if attrs.carveout is not None:
                set_shared_carveout(attrs.function, attrs.carveout)

    def _allocate(self, capacity: Capacity, resident: Resident | None) -> None:
        spec, maxv = self.spec, self.spec.max_values
        granularity = None
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
                alloc = self._peer_vmm(nbytes, f"buffer {name}")  # one VMM block peers can map
            else:
                alloc = self._ledger.device(nbytes, f"buffer {name}")
            self._buffers[name] = alloc
        for op in spec.ops.values():
            for sname, expr in op.scratch:
                self._scratch[(op.name, sname)] = self._ledger.device(expr.eval(maxv), f"scratch {op.name}.{sname}")
        for name, state in spec.states.items():
            if state.kind == "fixed":
                if spec.topology:  # peers may map states: VMM
                    alloc = self._peer_vmm(state.nbytes, f"state {name}")
                else:
                    alloc = self._ledger.device(state.nbytes, f"state {name}")
                call("cuMemsetD8Async", alloc.address, 0, max(state.nbytes, 1), self.stream)
                self._states[name] = alloc
        if any(isinstance(l, ExternLaunch) and l.extern in EXTERN_GEMMS for op in spec.ops.values() for l in op.launches):
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
        # the pool last: sized from what the allocations above left free
        if any(s.pooled for s in spec.states.values()):
            granularity = granularity or vmm_granularity_bytes(self.gpu)
            # free memory after every other allocation (buffers, scratch, fixed states, the cuBLASLt
            # workspace, input staging): tokens=None takes it less the headroom (spec, K1b)
            free_bytes, _ = call("cuMemGetInfo")
            free_bytes = int(free_bytes)
            self.pool = plan_pool(spec.states, capacity, granularity, free_bytes)
            assert self.pool is not None
            # kern_pool builds per-block lists: refuse a pool the device cannot hold before that
            pool_bytes = self.pool.layout.num_blocks * self.pool.block_bytes
            if pool_bytes > free_bytes:
                raise ApiError(f"capacity {capacity}: the pool needs {pool_bytes} bytes of device memory, "
                               f"GPU {self.gpu} has {free_bytes} bytes free")
            # one arena for every pooled state, mapped where kern_pool says, zeroed (remap.py, pooled.py)
            ps = PoolState.create(self.pool.layout, self.gpu, self.context, self.stream)
            self._ledger.on_close("pooled states", ps.close)
            self._pooled_state = ps
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
        from .tensormaps import encode_tiled

        program = self.spec.programs[name]
        records: list[Record] = []
        for index, c in enumerate(program.calls):
            records.extend(compile_call(index, c, self.spec, book, lambda op, li: self._functions[(op, li)], encode_tiled))
        return ProgramState(name, program.graph, program.kind, records, program_reads(records))

    def _compile_programs(self) -> None:
        book = self._address_book()
        for name, program in self.spec.programs.items():
            if program.kind == "derive":
                continue  # compiled against the source staging area in _bind_weights
            self._programs[name] = self._compile(name, book)

    def _check_algo_pins(self) -> None:
        """Every pinned algorithm at both ends of its var ranges (when-vars clamped to the interval)."""
        if self._blas is None:
            return
        minv, maxv = self.spec.min_values, self.spec.max_values
        for state in self._programs.values():
            for rec in state.records:
                if not isinstance(rec, ExternRecord) or rec.launch.extern not in EXTERN_GEMMS or not rec.launch.algo:
                    continue
                check_algo_keys(rec.launch.algo, rec.launch.path)
                for args in args_at_range_ends(rec, minv, maxv):
                    self._blas.plan(gemm_call(rec.launch.extern, args, rec.launch.path), rec.launch.algo,
                                    rec.launch.path)

    def _bind_weights(self, tensors: Tensors | None, progress: Progress | None, threads: int | None) -> None:
        maxv = self.spec.max_values
        targets = []
        for name, buf in self.spec.buffers.items():
            if buf.kind != "weight" or buf.bind is None or buf.derived:
                continue
            shape = buf.shape_at(maxv)
            key = weight_identity(buf, shape)
            if key in self._weights:
                continue  # claimed from a Resident: already filled
            if tensors is None:
                raise ApiError(f"buffer {name!r} binds checkpoint tensors, but no tensors were given")
            plan = plan_bind(buf, tensors.meta, maxv)
            alloc = self._buffers[name]
            targets.append(Target(plan, alloc.address, alloc.host_address))
            if buf.placement == "device":
                self._weights[key] = alloc
        derive = [p for p in self.spec.programs.values() if p.kind == "derive"]
        start = time.perf_counter()
        nbytes = 0
        if targets:
            assert tensors is not None
            loader = WeightLoader(tensors, self.context, threads=threads, progress=progress)
            nbytes, _ = loader.run(targets)
            self.weight_load_timings = dict(loader.timings)
        for program in derive:
            nbytes += self._run_derive(program.name, tensors, threads)
        self.weight_load_stats = (nbytes, time.perf_counter() - start)

    def _run_derive(self, name: str, tensors: Tensors | None, threads: int | None) -> int:
        """Stream a derive program's source tensors into one staging area and run it once."""
        program = self.spec.programs[name]
        if tensors is None:
            raise ApiError(f"derive program {name!r} needs checkpoint tensors, none were given")
        offsets, targets, total = {}, [], 0
        for src, tensor in program.sources.items():
            meta = tensors.meta(tensor)
            if meta is None:
                raise WeightArtifactError(f"checkpoint has no tensor {tensor!r} (source {src!r} of derive program {name!r})")
            offsets[src] = total
            total += -(-meta.nbytes // 256) * 256
        ledger = Ledger()
        try:
            staging = ledger.device(total, f"derive staging {name}")
            for src, tensor in program.sources.items():
                meta = tensors.meta(tensor)
                assert meta is not None
                copy = Copy.linear(tensor, 0, 0, meta.nbytes)
                plan = BindPlan(f"{name}.{src}", meta.nbytes, (copy,))
                targets.append(Target(plan, staging.address + offsets[src]))
            WeightLoader(tensors, self.context, threads=threads).run(targets)
            state = self._compile(name, self._address_book({s: staging.address + o for s, o in offsets.items()}))
            self._enqueue(state, self.spec.min_values)
            call("cuStreamSynchronize", self.stream)
        finally:
            ledger.close()
        return total

    def _run_once_programs(self) -> None:
        for name, program in self.spec.programs.items():
            if program.kind == "once":
                self._check_once_program(name, self._programs[name])  # no peers / NCCL before connect
                self._enqueue(self._programs[name], self.spec.min_values)

    # ------------------------------------------------------------ replay

    def _activate(self) -> None:
        if self._closed:
            raise ApiError("the runtime is closed")
        call("cuCtxSetCurrent", self.context)

    def _program(self, name: str) -> ProgramState:
        state = self._programs.get(name) if isinstance(name, str) else None
        if state is None:
            runnable = sorted(n for n, p in self._programs.items() if p.kind == "run")
            raise ApiError(f"unknown program {name!r}; runnable programs: {runnable}")
        return state

    def _patch(self, state: ProgramState, values: Mapping[str, int]) -> None:
        key = tuple(sorted((v, values[v]) for v in state.reads))
        if key == state.patched_key:
            return
        state.patched_key = None
        for rec in state.records:
            try:
                rec.patch(values)
            except KernError as exc:
                raise CallError(state.name, rec.call_index, rec.op, exc) from exc
            except Exception as exc:  # kern_manifest.ExprError and friends
                raise CallError(state.name, rec.call_index, rec.op, exc) from exc
        state.patched_key = key

    def _enqueue(self, state: ProgramState, values: Mapping[str, int], calls: range | None = None) -> None:
        """Patch `values` into the whole program, then enqueue its active records (of the calls in `calls`
        only, when given) in call order (_compile keeps a call's launches together)."""
        self._patch(state, values)
        for rec in state.records:
            if rec.active and (calls is None or rec.call_index in calls):
                self._enqueue_record(state, rec)

    def _enqueue_record(self, state: ProgramState, rec: Record) -> None:
        """One patched, active record on the compute stream (CallError on failure)."""
        stream = self.stream
        try:
            if isinstance(rec, KernelRecord):
                launch_kernel(rec, stream)
            elif is_nccl(rec):
                self._nccl_issue(rec)  # multigpu.py
            else:
                assert self._blas is not None
                g = gemm_call(rec.launch.extern, rec.args, rec.launch.path)
                self._blas.matmul(g, int(stream), rec.launch.algo, rec.launch.path)
        except KernError as exc:
            raise CallError(state.name, rec.call_index, rec.op, exc) from exc

    def run(self, program: str, vars: Mapping[str, int] | None = None) -> None:
        """Enqueue `program` launch by launch (eager) on the compute stream; does not synchronise.
        Raises ApiError (unknown program, bad vars: not a mapping, unknown, not integers, out of range),
        CallError (a failing call)."""
        self._activate()
        state = self._program(program)
        self._require_ready(state)  # peers connected, NCCL joined (multigpu.py)
        self._enqueue(state, normalise_vars(vars, self.spec.vars, state.reads, program))

    def run_range(self, program: str, vars: Mapping[str, int] | None, start: int, stop: int) -> None:
        """`run` restricted to the program's calls `start <= index < stop` (indices into the manifest's call
        list of `program`; every launch of each of those calls, `when` deciding activity as in `run`, in
        program order). Eager and not synchronising, like `run`; `start == stop` enqueues nothing. Vars are
        checked and patched into the whole program as `run` does, so the range sees exactly the launch
        configuration `run` would. Raises ApiError (unknown program; start or stop not an integer, a bool
        included; start < 0, stop > the program's number of calls, start > stop; bad vars; a peer table
        not filled or an NCCL group not joined, as `run`), CallError (a failing call). Every ApiError is
        raised before anything is enqueued."""
        self._activate()
        state = self._program(program)
        count = len(self.spec.programs[state.name].calls)
        first = int_arg(start, f"run_range({program!r}): start")
        end = int_arg(stop, f"run_range({program!r}): stop")
        if first < 0:
            raise ApiError(f"run_range({program!r}): start {first} is negative")
        if end > count:
            raise ApiError(f"run_range({program!r}): stop {end} is past the program's {count} call(s)")
        if first > end:
            raise ApiError(f"run_range({program!r}): start {first} is after stop {end}")
        self._require_ready(state)  # peers connected, NCCL joined (multigpu.py)
        self._enqueue(state, normalise_vars(vars, self.spec.vars, state.reads, program), range(first, end))

    def issue(self, program: str, vars: Mapping[str, int] | None = None, eager: bool = False) -> None:
        """Enqueue `program`: as its CUDA graph when it declares `graph: true` (captured on first use
        per key of read vars) unless `eager`; launch by launch otherwise. Does not synchronise.
        Raises ApiError (unknown program, bad vars: not a mapping, unknown, not integers, out of range),
        CallError (a failing call)."""
        self._activate()
        state = self._program(program)
        self._require_ready(state)  # peers connected, NCCL joined (multigpu.py)
        values = normalise_vars(vars, self.spec.vars, state.reads, program)
        if eager or not state.graph:
            self._enqueue(state, values)
            return
        key = graph_key(program, values, state.reads)
        self._graphs.replay(key, lambda: self._enqueue(state, values), self.stream)

    @property
    def graph_keys(self) -> list[tuple]:
        """Keys of the graphs captured so far."""
        return self._graphs.keys()

    def synchronize(self) -> None:
        """Wait for everything enqueued on the compute stream."""
        self._activate()
        call("cuStreamSynchronize", self.stream)

    # ------------------------------------------------------------ inputs and outputs

    def _buffer(self, name: str, kinds: tuple[str, ...] | None = None) -> tuple[BufferSpec, Allocation]:
        spec = self.spec.buffers.get(name)
        if spec is None:
            raise ApiError(f"unknown buffer {name!r}")
        if kinds is not None and spec.kind not in kinds:
            raise ApiError(f"buffer {name!r} is a {spec.kind} buffer, expected {' or '.join(kinds)}")
        return spec, self._buffers[name]

    def write_input(self, name: str, array: np.ndarray) -> None:
        """Copy `array` into input buffer `name` (a prefix of rows is allowed: fewer dim-0 rows than
        the buffer holds; later rows keep their old bytes). Async on the compute stream from the
        buffer's resident pinned staging area. Raises ApiError for a dtype, trailing-shape or row
        count mismatch."""
        self._activate()
        spec, alloc = self._buffer(name, ("input",))
        array = np.asarray(array)
        want = numpy_dtype(spec.dtype)
        if array.dtype.newbyteorder("<") != want.newbyteorder("<") or array.dtype.byteorder == ">":
            raise ApiError(f"input {name!r} is {spec.dtype} ({want}), got an array of {array.dtype}")
        shape = spec.shape_at(self.spec.max_values)
        if array.ndim == 0 and not shape:
            pass
        elif array.ndim != len(shape) or tuple(array.shape[1:]) != tuple(shape[1:]) or array.shape[0] > shape[0]:
            raise ApiError(f"input {name!r} holds up to {list(shape)}, got an array of shape {list(array.shape)}")
        staging, event = self._input_staging[name]
        call("cuEventSynchronize", event)  # the previous copy out of the staging area is done
        nbytes = array.nbytes
        staging.host_view()[:nbytes] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        if nbytes:
            call("cuMemcpyHtoDAsync", alloc.address, staging.host_address, nbytes, self.stream)
        call("cuEventRecord", event, self.stream)

    def read_buffer(self, name: str, rows: int | None = None) -> np.ndarray:
        """Synchronise and copy any buffer (or its first `rows` dim-0 rows) into a new array.
        bf16 / fp8 come back as raw bits (uint16 / uint8). Raises ApiError (unknown buffer, `rows` not
        an integer in 0..the buffer's rows)."""
        self._activate()
        spec, alloc = self._buffer(name)
        shape = list(spec.shape_at(self.spec.max_values))
        if rows is not None:
            rows = int_arg(rows, f"buffer {name!r} rows")
            if not shape or not 0 <= rows <= shape[0]:
                raise ApiError(f"buffer {name!r} has {shape[0] if shape else 0} rows, asked for {rows}")
            shape[0] = rows
        dtype = numpy_dtype(spec.dtype)
        out = np.empty(shape, dtype=dtype)
        call("cuStreamSynchronize", self.stream)
        if out.nbytes:
            if alloc.host_address:
                out.reshape(-1).view(np.uint8)[:] = alloc.host_view()[: out.nbytes]
            else:
                call("cuMemcpyDtoH", out.ctypes.data, alloc.address, out.nbytes)
        return out

    def read_output(self, name: str, rows: int | None = None) -> np.ndarray:
        """`read_buffer` for an output buffer (ApiError for any other kind, or a bad `rows`)."""
        self._buffer(name, ("output",))
        return self.read_buffer(name, rows)

    def read_output_async(self, name: str, rows: int | None = None) -> ReadbackHandle:
        """Enqueue a copy of output `name` into pinned memory after the work already on the compute
        stream; the handle's `wait()` returns the array. Raises ApiError (not an output buffer, `rows`
        not an integer in 0..the buffer's rows) before anything is allocated."""
        self._activate()
        spec, alloc = self._buffer(name, ("output",))
        shape = list(spec.shape_at(self.spec.max_values))
        if rows is not None:
            rows = int_arg(rows, f"output {name!r} rows")
            if not shape or not 0 <= rows <= shape[0]:
                raise ApiError(f"output {name!r} has {shape[0] if shape else 0} rows, asked for {rows}")
            shape[0] = rows
        dtype = numpy_dtype(spec.dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        self._reclaim_readbacks()
        pair = next((p for p in self._readback_free if p[0].nbytes >= nbytes), None)
        if pair is None:
            staging = self._ledger.pinned(max(nbytes, 8), f"readback {name}")
            event = call("cuEventCreate", 2)
            self._ledger.on_close("readback event", lambda e=event: call("cuEventDestroy", e))
            pair = (staging, event)
        else:
            self._readback_free.remove(pair)
        staging, event = pair
        if nbytes:
            call("cuMemcpyDtoHAsync", staging.host_address, alloc.address, nbytes, self.stream)
        call("cuEventRecord", event, self.stream)
        def done() -> None:  # the handle was waited: its pair is free now
            self._readback_busy.remove(entry)
            self._readback_free.append(pair)

        handle = ReadbackHandle(staging, event, tuple(shape), dtype, nbytes, done)
        entry = (weakref.ref(handle), pair)  # this readback in _readback_busy (done() reads it when called)
        self._readback_busy.append(entry)
        return handle

    def _reclaim_readbacks(self) -> None:
        """Move the staging of every readback whose handle was dropped unwaited, and whose copy has completed,
        to the free list (a dropped handle's copy may still be running: its buffer is kept until it ends)."""
        for entry in list(self._readback_busy):
            ref, pair = entry
            if ref() is None and event_done(pair[1]):
                self._readback_busy.remove(entry)
                self._readback_free.append(pair)

    # ------------------------------------------------------------ geometry and description

    @property
    def page_tokens(self) -> int | None:
        return self.pool.page_tokens if self.pool else None

    @property
    def num_pages(self) -> int | None:
        """Page ids 0..num_pages-1 exist in every paged state; page 0 is the reserved scratch page."""
        return self.pool.num_pages if self.pool else None

    @property
    def scratch_page_id(self) -> int | None:
        return self.pool.scratch_page_id if self.pool else None

    @property
    def reserved_pages(self) -> Mapping[str, int]:
        """Paged state -> pages its reserved virtual range holds (what `{"pages_of": state}` resolves to:
        the bound kernels check block-table page ids against); empty without paged states."""
        return dict(self.pool.reserved_pages) if self.pool else {}

    @property
    def num_slots(self) -> int | None:
        return self.pool.num_slots if self.pool and self.pool.layout.has_slots else None

    def address_of(self, name: str) -> int:
        """Device address of a buffer or state (tests, debugging)."""
        alloc = self._buffers.get(name) or self._states.get(name)
        if alloc is None:
            raise ApiError(f"unknown buffer or state {name!r}")
        return alloc.address

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary for startup logs."""
        spec, maxv = self.spec, self.spec.max_values
        classes: dict[str, dict[str, int]] = {}
        for name, buf in spec.buffers.items():
            entry = classes.setdefault(buf.kind, {"count": 0, "bytes": 0})
            entry["count"] += 1
            entry["bytes"] += buf.nbytes_at(maxv)
        launches = []
        for op in spec.ops.values():
            for li, launch in enumerate(op.launches):
                if isinstance(launch, KernelLaunch):
                    launches.append({"op": op.name, "entry": launch.entry, "module": launch.module,
                                     "params": [list(p) for p in launch.params], "when": _when_json(launch.when)})
                else:
                    launches.append({"op": op.name, "extern": launch.extern, "module": "runtime built-in",
                                     "algo": dict(launch.algo) if launch.algo else None, "when": _when_json(launch.when)})
        weights = [b for b in spec.buffers.values() if b.kind == "weight"]
        states = {}
        for name, st in spec.states.items():
            states[name] = {"kind": st.kind, "bytes": self._states[name].nbytes if name in self._states else 0}
        return {
            "manifest": spec.name, "digest": spec.digest, "gpu": self.gpu,
            "vars": {n: [v.min, v.max] for n, v in spec.vars.items()},
            "states": states,
            "pool": None if self.pool is None else {
                "page_tokens": self.pool.page_tokens, "num_pages": self.pool.num_pages, "num_slots": self.pool.num_slots,
                "block_bytes": self.pool.block_bytes, "scratch_page_id": self.pool.scratch_page_id},
            "buffers": classes,
            "launches": launches,
            "binds": {"buffers": len(weights), "derived": sum(1 for b in weights if b.derived),
                      "segments": sum(len(b.bind or ()) for b in weights),
                      "bytes": sum(b.nbytes_at(maxv) for b in weights)},
            "weight_load": {"bytes": self.weight_load_stats[0], "seconds": self.weight_load_stats[1]},
            "programs": {n: {"kind": p.kind, "graph": p.graph, "calls": len(spec.programs[n].calls),
                             "launches": len(p.records), "graph_launches": 1 if p.graph else None,
                             "vars_read": sorted(p.reads)} for n, p in self._programs.items()},
        }

    # ------------------------------------------------------------ lifetime

    def into_resident(self) -> Resident:
        """Close this runtime but keep its device weight buffers (checkpoint-bound, not derived)
        for `Runtime.load(..., resident=...)` / `load_over` on the same GPU."""
        self._activate()
        call("cuStreamSynchronize", self.stream)
        kept = {key: self._ledger.detach(alloc) for key, alloc in self._weights.items()}
        self._weights.clear()
        device = call("cuDeviceGet", self.gpu)
        call("cuDevicePrimaryCtxRetain", device)  # the resident keeps the context alive
        resident = Resident(self.gpu, self.context, device, kept)
        self.close()
        return resident

    def close(self) -> None:
        """Free everything (idempotent)."""
        if self._closed:
            return
        try:
            call("cuCtxSetCurrent", self.context)
            call("cuStreamSynchronize", self.stream)
            self._graphs.close()
        finally:
            self._closed = True
            self._ledger.close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _check_load_args(kernels_dir: Any, tensors: Any, gpu: Any, capacity: Any, progress: Any, ranks: Any,
                     resident: Any, threads: Any) -> tuple[int, dict[str, int], dict[str, int], int | None]:
    """`Runtime.load`'s arguments checked before anything is allocated: (gpu, ranks as {group: index},
    the group sizes `ranks` gave as {group: size}, threads) as ints. Raises ApiError naming the argument;
    the sizes are checked against the manifest's topology later (`_check_topology`)."""
    if not isinstance(kernels_dir, (str, os.PathLike)):
        raise ApiError(f"kernels_dir must be a directory path (str or os.PathLike), got {type(kernels_dir).__name__}")
    if tensors is not None and not isinstance(tensors, Tensors):
        raise ApiError(f"tensors must be a Tensors (SafetensorsTensors, HostTensors, ...) or None, "
                       f"got {type(tensors).__name__}")
    gpu = int_arg(gpu, "gpu")
    if not isinstance(capacity, Capacity):
        raise ApiError(f"capacity must be a Capacity(tokens=..., seqs=...), got {type(capacity).__name__}")
    if progress is not None and not callable(progress):
        raise ApiError(f"progress must be callable(bytes_done, bytes_total) or None, got {type(progress).__name__}")
    if ranks is None:
        ranks = {}
    if not isinstance(ranks, Mapping):
        raise ApiError(f"ranks must be a mapping of topology group -> index or (index, size), "
                       f"got {type(ranks).__name__}")
    checked: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for group, rank in ranks.items():
        if not isinstance(group, str):
            raise ApiError(f"ranks: group names are strings, got {group!r}")
        if isinstance(rank, (tuple, list)):  # (index, size): the topology's entry for this group
            if len(rank) != 2:
                raise ApiError(f"ranks[{group!r}] must be an index or an (index, size) pair, got {rank!r}")
            checked[group] = int_arg(rank[0], f"ranks[{group!r}] index")
            sizes[group] = int_arg(rank[1], f"ranks[{group!r}] size")
        else:
            checked[group] = int_arg(rank, f"ranks[{group!r}]")
    if resident is not None:
        if not isinstance(resident, Resident):
            raise ApiError(f"resident must be a Resident (from into_resident()), got {type(resident).__name__}")
        if resident.gpu != gpu:
            raise ApiError(f"resident weights live on GPU {resident.gpu}, not {gpu}")
    if threads is not None:
        threads = int_arg(threads, "threads", 1)
    return gpu, checked, sizes, threads


def _when_json(when) -> dict[str, list[str]] | None:
    if not when:
        return None
    return {var: [lo.source, hi.source] for var, lo, hi in when}
