"""Replay: the compiled programs of one runtime and the one path by which every launch record is enqueued.

`Launcher.enqueue(state, rec)` is that path, for every kind of record: a kernel (`cuLaunchKernel` /
`cuLaunchKernelEx`), a cuBLASLt / cuBLAS extern GEMM, an NCCL collective; `Launcher.zero` zeroes the program's
`zero_each_run` buffers (program/per_run.py) before its first launch. `Runtime.run` / `run_range` /
`issue`, `run_hooked` and a `LocalGroup`'s interleaved replay all go through it, so a failing launch is
always the same `CallError` (program, call index, op, cause).

`Programs` holds the compiled `ProgramState`s, patches var values into them (only when the values of the
vars they read change) and keeps the CUDA graphs (`GraphCache`). Per step, an eager replay costs one
`Launcher.enqueue` per active record and a graph replay one `cuGraphLaunch`: nothing is rebuilt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..cuda.blas import Blas, gemm_call
from ..cuda.graphs import GraphCache
from ..cuda.launch import launch_kernel
from ..errors import ApiError, CallError, KernError
from ..cuda.driver import call
from .per_run import ZeroSpan
from .records import NCCL_EXTERNS, ExternRecord, KernelRecord, Record


@dataclass
class ProgramState:
    """A compiled program: its records, the vars they read, and the last values patched in."""

    name: str
    graph: bool
    kind: str
    records: list[Record]
    reads: frozenset[str]
    calls: int = 0  # op calls of the program, inlined programs expanded (run_range's bound)
    patched_key: tuple | None = None
    zero: tuple[ZeroSpan, ...] = ()  # zero_each_run buffers its calls pass (per_run.zero_spans)


def is_nccl(rec: Any) -> bool:
    """Whether `rec` is an NCCL collective (an extern record of an `nccl_*` extern)."""
    return isinstance(rec, ExternRecord) and rec.name in NCCL_EXTERNS


class Launcher:
    """Enqueues one patched, active record on `stream`: kernels directly, GEMM externs through `blas` (None when
    the manifest has none), NCCL externs through `nccl(rec, stream)` (the runtime's peers part, which knows the
    communicators). Raises CallError naming the program, the call index and the op."""

    def __init__(self, stream: Any, blas: Blas | None, nccl: Callable[[ExternRecord, Any], None]) -> None:
        self.stream = stream
        self.blas = blas
        self.nccl = nccl

    def enqueue(self, state: ProgramState, rec: Record) -> None:
        try:
            if isinstance(rec, KernelRecord):
                launch_kernel(rec, self.stream)
            elif rec.name in NCCL_EXTERNS:
                self.nccl(rec, self.stream)
            else:
                assert self.blas is not None, "kern bug: a GEMM extern record without a cuBLASLt handle"
                self.blas.matmul(gemm_call(rec.name, rec.args, rec.path), int(self.stream), rec.algo, rec.path)
        except KernError as exc:
            raise CallError(state.name, rec.call_index, rec.op, exc) from exc

    def zero(self, state: ProgramState, calls: range | None = None) -> None:
        """Zero, on `stream`, every `zero_each_run` buffer that the calls in `calls` (None: all) pass: one
        `cuMemsetD8Async` each, a memset node when captured. Raises CallError naming the first call that passes
        the buffer."""
        for span in state.zero:
            if not span.applies(calls):
                continue
            try:
                call("cuMemsetD8Async", span.address, 0, span.nbytes, self.stream)
            except KernError as exc:
                first = min(span.calls)
                op = next((r.op for r in state.records if r.call_index == first), "?")
                raise CallError(state.name, first, op, exc) from exc


class Programs:
    """The compiled programs of one runtime (`states`, by name), their graphs, and replay through `launcher`."""

    def __init__(self, launcher: Launcher) -> None:
        self.states: dict[str, ProgramState] = {}
        self.launcher = launcher
        self.graphs = GraphCache()

    def get(self, name: str) -> ProgramState:
        """The compiled program `name`. Raises ApiError naming the runnable programs."""
        state = self.states.get(name) if isinstance(name, str) else None
        if state is None:
            runnable = sorted(n for n, p in self.states.items() if p.kind == "run")
            raise ApiError(f"unknown program {name!r}; runnable programs: {runnable}")
        return state

    @staticmethod
    def patch(state: ProgramState, values: Mapping[str, int]) -> None:
        """Patch `values` into every record of `state`, unless the read vars' values are those patched last."""
        key = tuple(sorted((v, values[v]) for v in state.reads))
        if key == state.patched_key:
            return
        state.patched_key = None
        for rec in state.records:
            try:
                rec.patch(values)
            except Exception as exc:  # KernError, kern_manifest.ExprError and friends
                raise CallError(state.name, rec.call_index, rec.op, exc) from exc
        state.patched_key = key

    def enqueue(self, state: ProgramState, values: Mapping[str, int], calls: range | None = None) -> None:
        """Patch `values` into the whole program, then enqueue its active records (of the calls in `calls`
        only, when given) in call order (a call's launches are kept together), after zeroing the `zero_each_run`
        buffers those calls pass."""
        self.patch(state, values)
        self.launcher.zero(state, calls)
        enqueue = self.launcher.enqueue
        for rec in state.records:
            if rec.active and (calls is None or rec.call_index in calls):
                enqueue(state, rec)

    def enqueue_hooked(self, state: ProgramState, values: Mapping[str, int],
                       on_launch: Callable[[int, Record], None]) -> None:
        """`enqueue` calling `on_launch(index, record)` before each active record."""
        self.patch(state, values)
        self.launcher.zero(state)
        enqueue = self.launcher.enqueue
        for index, rec in enumerate(state.records):
            if rec.active:
                on_launch(index, rec)
                enqueue(state, rec)

    def close(self) -> None:
        self.graphs.close()
