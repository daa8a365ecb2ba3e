"""Executing bind plans: checkpoint bytes into weight buffers.

Paths by source and destination:

| source      | device buffer                                              | host-placement buffer      |
|-------------|------------------------------------------------------------|----------------------------|
| FileBlob    | os.pread into a pinned staging buffer, then H2D (workers)  | os.pread straight into it  |
| HostBlob    | memcpy into pinned staging, then H2D (workers)             | memcpy                     |
| DeviceBlob  | cuMemcpyDtoDAsync / cuMemcpy2DAsync, streams round robin   | cuMemcpy2D to host         |

Workers: `threads` threads, each with its own stream and two pinned staging buffers of
`staging_bytes` (double buffering: while one is being DMA'd the next pread fills the other; an event
per buffer says when it may be refilled). Copies are split into pieces of at most `staging_bytes`
(whole blocks of a strided copy where a block fits) and dealt out by a shared counter. One pread per
piece: a contiguous copy is never read row by row.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..driver import call, cu
from ..errors import WeightArtifactError
from ..memory import Ledger
from .plan import BindPlan, Copy
from .tensors import DeviceBlob, FileBlob, HostBlob, Tensors

MiB = 1024 * 1024
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
    """A unit of work: `nbytes` source bytes at `src_offset` of `blob`, written as blocks of
    `block_bytes` every `dst_pitch` bytes from destination offset `dst_offset` of `target`."""

    target: Target
    blob: FileBlob | HostBlob | DeviceBlob
    src_offset: int
    nbytes: int
    dst_offset: int
    block_bytes: int
    dst_pitch: int

    @property
    def blocks(self) -> int:
        return self.nbytes // self.block_bytes

    @property
    def contiguous(self) -> bool:
        return self.blocks <= 1 or self.block_bytes == self.dst_pitch


def split_copy(copy: Copy, piece_bytes: int) -> list[tuple[int, int, int, int, int]]:
    """Split `copy` into pieces of at most `piece_bytes` source bytes.

    Returns (src_start, nbytes, dst_offset, block_bytes, dst_pitch) per piece. A strided copy keeps
    whole blocks per piece; a block larger than `piece_bytes` is split into contiguous pieces.
    """
    out = []
    if copy.contiguous:
        for start in range(0, copy.nbytes, piece_bytes):
            n = min(piece_bytes, copy.nbytes - start)
            out.append((copy.src_start + start, n, copy.dst_offset + start, n, n))
        return out
    block = copy.block_bytes
    if block > piece_bytes:
        for b in range(copy.blocks):
            for start in range(0, block, piece_bytes):
                n = min(piece_bytes, block - start)
                out.append((copy.src_start + b * block + start, n, copy.dst_offset + b * copy.dst_pitch_bytes + start, n, n))
        return out
    per_piece = piece_bytes // block
    for b in range(0, copy.blocks, per_piece):
        count = min(per_piece, copy.blocks - b)
        out.append((copy.src_start + b * block, count * block, copy.dst_offset + b * copy.dst_pitch_bytes, block,
                    copy.dst_pitch_bytes))
    return out


def _pread_into(fd: int, view: memoryview, offset: int, path: str) -> None:
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            raise WeightArtifactError(f"{path}: short read at byte {offset + done} (file truncated?)")
        done += got


def _host_view(address: int, nbytes: int) -> memoryview:
    return memoryview((ctypes.c_uint8 * nbytes).from_address(address)).cast("B")


def _copy2d(src: int, src_is_host: bool, dst: int, dst_is_host: bool, width: int, height: int, dst_pitch: int,
            stream: int | None) -> None:
    driver = cu()
    p = driver.CUDA_MEMCPY2D()
    host_t = driver.CUmemorytype.CU_MEMORYTYPE_HOST
    dev_t = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
    p.srcMemoryType = host_t if src_is_host else dev_t
    if src_is_host:
        p.srcHost = src
    else:
        p.srcDevice = src
    p.srcPitch = width
    p.dstMemoryType = host_t if dst_is_host else dev_t
    if dst_is_host:
        p.dstHost = dst
    else:
        p.dstDevice = dst
    p.dstPitch = dst_pitch
    p.WidthInBytes = width
    p.Height = height
    if stream is None:
        call("cuMemcpy2D", p)
    else:
        call("cuMemcpy2DAsync", p, stream)


class WeightLoader:
    """Fills weight buffers from a `Tensors`. One use: `run(targets)` -> (bytes, seconds)."""

    def __init__(self, tensors: Tensors, context, *, threads: int | None = None, staging_bytes: int = 16 * MiB,
                 progress: Progress | None = None) -> None:
        self.tensors = tensors
        self.context = context
        self.threads = threads or max(1, min(16, os.cpu_count() or 1))
        self.staging_bytes = staging_bytes
        self.progress = progress
        self._lock = threading.Lock()
        self._done = 0
        self._total = 0

    def _advance(self, nbytes: int) -> None:
        with self._lock:
            self._done += nbytes
            if self.progress is not None:
                self.progress(self._done, self._total)

    def pieces(self, targets: Sequence[Target]) -> list[Piece]:
        """Every piece of every copy (pure given the tensors' blobs)."""
        out = []
        for target in targets:
            for copy in target.plan.copies:
                blob = self.tensors.blob(copy.tensor)
                for src, n, dst, block, pitch in split_copy(copy, self.staging_bytes):
                    out.append(Piece(target, blob, src, n, dst, block, pitch))
        return out

    def run(self, targets: Sequence[Target]) -> tuple[int, float]:
        """Execute every copy; returns (bytes copied, seconds). Raises WeightArtifactError for
        unreadable files, DriverError for copy failures."""
        start = time.perf_counter()
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
        return self._total, time.perf_counter() - start

    # ------------------------------------------------------------ paths

    def _device_copies(self, pieces: list[Piece]) -> None:
        if not pieces:
            return
        streams = [call("cuStreamCreate", 1) for _ in range(min(8, len(pieces)))]  # CU_STREAM_NON_BLOCKING
        try:
            for i, p in enumerate(pieces):
                stream = streams[i % len(streams)]
                src = p.blob.address + p.src_offset  # type: ignore[union-attr]
                host = p.target.host_address
                if host:
                    _copy2d(src, False, host + p.dst_offset, True, p.block_bytes, p.blocks, p.dst_pitch, stream)
                elif p.contiguous:
                    call("cuMemcpyDtoDAsync", p.target.address + p.dst_offset, src, p.nbytes, stream)
                else:
                    _copy2d(src, False, p.target.address + p.dst_offset, False, p.block_bytes, p.blocks, p.dst_pitch, stream)
            for s in streams:
                call("cuStreamSynchronize", s)
        finally:
            for s in streams:
                call("cuStreamDestroy", s)
        self._advance(sum(p.nbytes for p in pieces))

    def _host_fill(self, pieces: list[Piece], fds: dict[str, int]) -> None:
        for p in pieces:
            dst = p.target.host_address + p.dst_offset
            if p.contiguous:
                view = _host_view(dst, p.nbytes)
                self._read_source(p, view, fds)
            else:
                tmp = np.empty(p.nbytes, dtype=np.uint8)
                self._read_source(p, memoryview(tmp), fds)
                out = np.ctypeslib.as_array((ctypes.c_uint8 * ((p.blocks - 1) * p.dst_pitch + p.block_bytes)).from_address(dst))
                for b in range(p.blocks):
                    out[b * p.dst_pitch : b * p.dst_pitch + p.block_bytes] = tmp[b * p.block_bytes : (b + 1) * p.block_bytes]
            self._advance(p.nbytes)

    def _read_source(self, p: Piece, view: memoryview, fds: dict[str, int]) -> None:
        blob = p.blob
        if isinstance(blob, FileBlob):
            _pread_into(fds[blob.path], view, blob.offset + p.src_offset, blob.path)
        else:
            assert isinstance(blob, HostBlob)
            np.frombuffer(view, dtype=np.uint8)[:] = blob.data[p.src_offset : p.src_offset + p.nbytes]

    def _staged(self, pieces: list[Piece], fds: dict[str, int]) -> None:
        if not pieces:
            return
        threads = min(self.threads, len(pieces))
        ledger = Ledger()
        counter = iter(range(len(pieces)))
        counter_lock = threading.Lock()
        errors: list[BaseException] = []
        try:
            buffers = [[ledger.pinned(self.staging_bytes, f"weight staging {t}.{j}") for j in range(2)] for t in range(threads)]

            def worker(t: int) -> None:
                try:
                    call("cuCtxSetCurrent", self.context)
                    stream = call("cuStreamCreate", 1)
                    events = [call("cuEventCreate", 2) for _ in range(2)]  # CU_EVENT_DISABLE_TIMING
                    try:
                        turn = 0
                        while not errors:
                            with counter_lock:
                                index = next(counter, None)
                            if index is None:
                                break
                            p = pieces[index]
                            j = turn % 2
                            turn += 1
                            call("cuEventSynchronize", events[j])  # the DMA out of this buffer is done
                            staging = buffers[t][j]
                            self._read_source(p, _host_view(staging.host_address, p.nbytes), fds)
                            dst = p.target.address + p.dst_offset
                            if p.contiguous:
                                call("cuMemcpyHtoDAsync", dst, staging.host_address, p.nbytes, stream)
                            else:
                                _copy2d(staging.host_address, True, dst, False, p.block_bytes, p.blocks, p.dst_pitch, stream)
                            call("cuEventRecord", events[j], stream)
                            self._advance(p.nbytes)
                        call("cuStreamSynchronize", stream)
                    finally:
                        for e in events:
                            call("cuEventDestroy", e)
                        call("cuStreamDestroy", stream)
                except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
                    errors.append(exc)

            workers = [threading.Thread(target=worker, args=(t,), name=f"kern-weights-{t}") for t in range(threads)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        finally:
            ledger.close()
        if errors:
            raise errors[0]
