"""Executing bind plans: checkpoint bytes into weight buffers.

Paths by source and destination:

| source      | device buffer                                              | host-placement buffer      |
|-------------|------------------------------------------------------------|----------------------------|
| FileBlob    | os.pread into a pinned staging buffer, then H2D (workers)  | os.pread, then CPU scatter |
| HostBlob    | memcpy into pinned staging, then H2D (workers)             | memcpy                     |
| DeviceBlob  | cuMemcpyDtoDAsync / cuMemcpy2DAsync, streams round robin   | cuMemcpyDtoHAsync / 2-D    |

Every copy of a plan is cut by `split_copy` into pieces whose source range fits one staging buffer
(whole rows of a 2-D copy). A piece is one `os.pread` of its whole contiguous source range (for a
column slice: full checkpoint rows, of which the copy takes `width` bytes each) and one DMA:
`cuMemcpyHtoDAsync` for a dense piece, else one `cuMemcpy2DAsync` from the staging buffer (source
pitch = the checkpoint's row or block pitch, destination pitch = the buffer's), never a copy per row.

Workers: `threads` threads, each with its own stream and two pinned staging buffers of
`min(staging_bytes, largest piece)` bytes, allocated by the worker on first use (so the allocations
overlap the other workers' reads and copies) and freed by it when it runs out of pieces. Double
buffering: while one buffer is DMA'd the next pread fills the other; an event per buffer says when it
may be refilled. Pieces are dealt out in plan order by a shared counter.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..cuda.driver import call, cu
from ..errors import ApiError, DriverError, WeightArtifactError
from .plan import BindPlan, Copy, split_copy
from .tensors import DeviceBlob, FileBlob, HostBlob, Tensors

__all__ = ["MiB", "STAGING_BYTES", "MAX_THREADS", "Progress", "Target", "Piece", "WeightLoader", "split_copy"]

MiB = 1024 * 1024
STAGING_BYTES = 8 * MiB
"""Default bytes of each of a worker's two pinned staging buffers (read when a loader is built). 8 MiB
keeps every pread and DMA far above the size where per-call costs matter while halving the pinned
memory allocated per load against 16 MiB (16 threads: 256 MiB)."""
MAX_THREADS = 16
"""Default worker count: min(MAX_THREADS, CPUs)."""

Progress = Callable[[int, int], None]
"""progress(bytes_done, bytes_total); called from worker threads, serialised by a lock."""


@dataclass(frozen=True)
class Target:
    """Where a plan's buffer lives: device address (`address`) and for host placement the host
    pointer (`host_address`, else 0)."""

    plan: BindPlan
    address: int
    host_address: int = 0


@dataclass(frozen=True)
class Piece:
    """A unit of work: `copy` (source offsets into `blob`, destination offsets into `target`'s
    buffer), its source range at most one staging buffer."""

    target: Target
    blob: FileBlob | HostBlob | DeviceBlob
    copy: Copy

    @property
    def nbytes(self) -> int:
        return self.copy.nbytes


def _pread_into(fd: int, view: memoryview, offset: int, path: str) -> None:
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            raise WeightArtifactError(f"{path}: short read at byte {offset + done} (file truncated?)")
        done += got


def _host_view(address: int, nbytes: int) -> memoryview:
    return memoryview((ctypes.c_uint8 * nbytes).from_address(address)).cast("B")


def _rows(array: np.ndarray, pitch: int, width: int, height: int) -> np.ndarray:
    """`height` x `width` view of a 1-D uint8 array whose rows start every `pitch` bytes."""
    return np.lib.stride_tricks.as_strided(array, shape=(height, width), strides=(pitch, 1), writeable=True)


def _memcpy2d(src: int, src_pitch: int, src_is_host: bool, dst: int, dst_pitch: int, dst_is_host: bool,
              width: int, height: int, stream: Any | None) -> None:
    """One cuMemcpy2D(Async): `height` rows of `width` bytes, row i from `src + i * src_pitch` to
    `dst + i * dst_pitch`."""
    driver = cu()
    p = driver.CUDA_MEMCPY2D()
    for side, address, pitch, is_host in (("src", src, src_pitch, src_is_host), ("dst", dst, dst_pitch, dst_is_host)):
        memory = driver.CUmemorytype.CU_MEMORYTYPE_HOST if is_host else driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
        setattr(p, f"{side}MemoryType", memory)
        setattr(p, f"{side}Host" if is_host else f"{side}Device", address)
        setattr(p, f"{side}Pitch", pitch)
    p.WidthInBytes = width
    p.Height = height
    if stream is None:
        call("cuMemcpy2D", p)
    else:
        call("cuMemcpy2DAsync", p, stream)


class WeightLoader:
    """Fills weight buffers from a `Tensors`. One use: `run(targets)` -> (bytes, seconds).

    After `run`, `timings` holds seconds summed over the workers (`staging_alloc`, `read`, `wait`,
    `issue`, `drain`, `staging_free`) and the phases' wall time (`wall`), for benchmarks."""

    def __init__(self, tensors: Tensors, context, *, threads: int | None = None, staging_bytes: int | None = None,
                 progress: Progress | None = None) -> None:
        self.tensors = tensors
        self.context = context
        self.threads = threads or max(1, min(MAX_THREADS, os.cpu_count() or 1))
        self.staging_bytes = staging_bytes or STAGING_BYTES
        self.progress = progress
        self.timings: dict[str, float] = {}
        self._lock = threading.Lock()
        self._done = 0
        self._total = 0

    def _advance(self, nbytes: int) -> None:
        """Count `nbytes` as loaded and report to the progress callback. Raises ApiError (chained to what the
        callback raised) when the callback fails: the load then stops as on any worker error."""
        with self._lock:
            self._done += nbytes
            if self.progress is not None:
                try:
                    self.progress(self._done, self._total)
                except Exception as exc:
                    raise ApiError(f"the load's progress callback raised {type(exc).__name__}: {exc}") from exc

    def _time(self, spent: dict[str, float]) -> None:
        with self._lock:
            for key, seconds in spent.items():
                self.timings[key] = self.timings.get(key, 0.0) + seconds

    def pieces(self, targets: Sequence[Target]) -> list[Piece]:
        """Every piece of every copy (pure given the tensors' blobs). Raises WeightArtifactError when
        a blob is shorter than the plan's reads of it."""
        out = []
        for target in targets:
            for copy in target.plan.copies:
                blob = self.tensors.blob(copy.tensor)
                if copy.src_stop > blob.nbytes:
                    raise WeightArtifactError(f"tensor {copy.tensor!r}: its bytes end at {blob.nbytes}, the bind of "
                                              f"{target.plan.buffer!r} reads up to byte {copy.src_stop}")
                out += [Piece(target, blob, piece) for piece in split_copy(copy, self.staging_bytes)]
        return out

    def run(self, targets: Sequence[Target]) -> tuple[int, float]:
        """Execute every copy; returns (bytes copied, seconds). Raises WeightArtifactError for
        unreadable files, DriverError for copy failures."""
        start = time.perf_counter()
        self.timings = {}
        pieces = self.pieces(targets)
        self._total = sum(p.nbytes for p in pieces)
        self._done = 0
        device_src = [p for p in pieces if isinstance(p.blob, DeviceBlob)]
        host_dst = [p for p in pieces if p.target.host_address and not isinstance(p.blob, DeviceBlob)]
        staged = [p for p in pieces if not p.target.host_address and not isinstance(p.blob, DeviceBlob)]
        fds: dict[str, int] = {}
        try:
            for p in pieces:
                if isinstance(p.blob, FileBlob) and p.blob.path not in fds:
                    try:
                        fds[p.blob.path] = os.open(p.blob.path, os.O_RDONLY)
                    except OSError as exc:
                        raise WeightArtifactError(f"{p.blob.path}: cannot open: {exc}") from exc
            self._device_copies(device_src)
            self._staged(staged, fds)
            self._host_fill(host_dst, fds)
        finally:
            for fd in fds.values():
                os.close(fd)
        seconds = time.perf_counter() - start
        self.timings["wall"] = seconds
        return self._total, seconds

    # ------------------------------------------------------------ paths

    def _device_copies(self, pieces: list[Piece]) -> None:
        if not pieces:
            return
        streams = [call("cuStreamCreate", 1) for _ in range(min(8, len(pieces)))]  # CU_STREAM_NON_BLOCKING
        try:
            for i, p in enumerate(pieces):
                stream = streams[i % len(streams)]
                c = p.copy
                src = p.blob.address + c.src_offset  # type: ignore[union-attr]
                host = p.target.host_address
                if host:
                    if c.dense:
                        call("cuMemcpyDtoHAsync", host + c.dst_offset, src, c.nbytes, stream)
                    else:
                        _memcpy2d(src, c.src_pitch, False, host + c.dst_offset, c.dst_pitch, True, c.width, c.height,
                                  stream)
                elif c.dense:
                    call("cuMemcpyDtoDAsync", p.target.address + c.dst_offset, src, c.nbytes, stream)
                else:
                    dst = p.target.address + c.dst_offset
                    try:
                        _memcpy2d(src, c.src_pitch, False, dst, c.dst_pitch, False, c.width, c.height, stream)
                    except DriverError:
                        # device-to-device 2-D copies may refuse pitches cuMemAllocPitch did not choose
                        for s, d in c.rows():
                            call("cuMemcpyDtoDAsync", p.target.address + d, p.blob.address + s, c.width, stream)  # type: ignore[union-attr]
            for s in streams:
                call("cuStreamSynchronize", s)
        finally:
            for s in streams:
                call("cuStreamDestroy", s)
        self._advance(sum(p.nbytes for p in pieces))

    def _host_fill(self, pieces: list[Piece], fds: dict[str, int]) -> None:
        for p in pieces:
            c = p.copy
            dst = p.target.host_address + c.dst_offset
            if c.dense:
                self._read_source(p.blob, c.src_offset, _host_view(dst, c.nbytes), fds)
            else:
                tmp = np.empty(c.src_span, dtype=np.uint8)
                self._read_source(p.blob, c.src_offset, memoryview(tmp), fds)
                out = np.ctypeslib.as_array((ctypes.c_uint8 * c.dst_span).from_address(dst))
                _rows(out, c.dst_pitch, c.width, c.height)[...] = _rows(tmp, c.src_pitch, c.width, c.height)
            self._advance(p.nbytes)

    def _read_source(self, blob: FileBlob | HostBlob | DeviceBlob, offset: int, view: memoryview,
                     fds: dict[str, int]) -> None:
        """`len(view)` bytes of `blob` from `offset` into `view`."""
        if isinstance(blob, FileBlob):
            _pread_into(fds[blob.path], view, blob.offset + offset, blob.path)
        else:
            assert isinstance(blob, HostBlob)
            np.frombuffer(view, dtype=np.uint8)[:] = blob.data[offset : offset + len(view)]

    def _staged(self, pieces: list[Piece], fds: dict[str, int]) -> None:
        if not pieces:
            return
        threads = min(self.threads, len(pieces))
        size = max(p.copy.src_span for p in pieces)  # every staging buffer holds any piece
        counter = iter(range(len(pieces)))
        counter_lock = threading.Lock()
        errors: list[BaseException] = []

        def take() -> Piece | None:
            if errors:
                return None
            with counter_lock:
                index = next(counter, None)
            return None if index is None else pieces[index]

        def worker() -> None:
            try:
                call("cuCtxSetCurrent", self.context)
                self._work(take, size, fds, errors)
            except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
                errors.append(exc)

        workers = [threading.Thread(target=worker, name=f"kern-weights-{t}") for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if errors:
            raise errors[0]

    def _work(self, take: Callable[[], Piece | None], size: int, fds: dict[str, int],
              errors: list[BaseException]) -> None:
        """One worker: pieces from `take()` through two lazily allocated staging buffers on one stream.
        Failures go to `errors`; the stream is drained before its staging buffers are freed."""
        spent = dict.fromkeys(("staging_alloc", "read", "wait", "issue", "drain", "staging_free"), 0.0)
        stream = call("cuStreamCreate", 1)  # CU_STREAM_NON_BLOCKING
        events: list[Any] = []
        staging: list[int] = []
        views: list[memoryview] = []
        flags = cu().CU_MEMHOSTALLOC_PORTABLE
        try:
            events = [call("cuEventCreate", 2) for _ in range(2)]  # CU_EVENT_DISABLE_TIMING
            turn = 0
            while (p := take()) is not None:
                j = turn % 2
                turn += 1
                t0 = time.perf_counter()
                if j == len(staging):  # first use of this buffer
                    staging.append(int(call("cuMemHostAlloc", size, flags)))
                    views.append(_host_view(staging[j], size))
                    spent["staging_alloc"] += time.perf_counter() - t0
                else:
                    call("cuEventSynchronize", events[j])  # the DMA out of this buffer is done
                    spent["wait"] += time.perf_counter() - t0
                c = p.copy
                t1 = time.perf_counter()
                self._read_source(p.blob, c.src_offset, views[j][: c.src_span], fds)
                t2 = time.perf_counter()
                dst = p.target.address + c.dst_offset
                if c.dense:
                    call("cuMemcpyHtoDAsync", dst, staging[j], c.nbytes, stream)
                else:
                    _memcpy2d(staging[j], c.src_pitch, True, dst, c.dst_pitch, False, c.width, c.height, stream)
                call("cuEventRecord", events[j], stream)
                spent["read"] += t2 - t1
                spent["issue"] += time.perf_counter() - t2
                self._advance(c.nbytes)
            t0 = time.perf_counter()
            call("cuStreamSynchronize", stream)
            spent["drain"] += time.perf_counter() - t0
        except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
            errors.append(exc)
        finally:
            t0 = time.perf_counter()
            steps: list[Callable[[], Any]] = []
            if staging:  # nothing may still read a staging buffer when it is freed
                steps.append(lambda: call("cuStreamSynchronize", stream))
            steps += [lambda h=h: call("cuMemFreeHost", h) for h in staging]
            steps += [lambda e=e: call("cuEventDestroy", e) for e in events]
            steps.append(lambda: call("cuStreamDestroy", stream))
            for step in steps:
                try:
                    step()
                except BaseException as exc:  # noqa: BLE001 - keep releasing, report
                    errors.append(exc)
            spent["staging_free"] += time.perf_counter() - t0
            self._time(spent)
