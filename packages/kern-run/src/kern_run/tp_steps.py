"""The step stream of a tensor-parallel group in processes (one per GPU): rank 0 drives, the others follow.

Rank 0 runs the caller (tokenizer, Generator, stop conditions, output); every input it writes and every program it
issues goes first to each follower, then to its own runtime (`StreamingRuntime`, rank 0's `contract.CallerRuntime`
and `DeviceSteps`). A follower (`follow`) applies the same calls in the same order to its runtime, so every rank
enqueues the same collectives in the same order and their all-reduced activations agree; outputs are read on rank 0
alone. The followers never read back, so they run ahead of rank 0 as far as its stream goes.

Transport: one Unix stream socket per follower, `<rendezvous dir>/steps.sock` (the rendezvous' private directory,
mode 0700). Frames (big-endian): u32 header length, u64 payload length, a JSON header, the payload.

    rank 0 -> follower   {"op": "write", "name", "dtype", "shape"} + the array's bytes
                         {"op": "issue", "program", "vars", "eager"}
                         {"op": "close"}
    follower -> rank 0   {"op": "hello", "rank"} once, on connecting
                         {"op": "error", "message"} before it exits on a failure
                         {"op": "closed"} after "close": its stream synchronised, its all-reduce status clean

Failures name the rank: before every frame rank 0 looks for what a follower sent (an error frame, or the end of
its connection: it died) and raises `StepRankError`; a send to a dead follower raises it too. The one-shot
all-reduce's status word (meta.tp.allreduce.status, host-mapped) is checked by rank 0 after every event and
readback, and by a follower at close: `AllreduceTimeoutError` names the rank a wait gave up on.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import struct
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .errors import RefusalError

STEPS_SOCKET = "steps.sock"
MAX_HEADER_BYTES = 64 * 2**10
MAX_PAYLOAD_BYTES = 256 * 2**20  # an input buffer (the largest is a prefill chunk's block table or token ids)
CONNECT_RETRY_S = 0.01
_FRAME = struct.Struct("!IQ")
_DTYPES = frozenset({"int32", "int64", "uint32", "uint64", "uint16", "uint8", "float32", "float16"})


class StepRankError(RefusalError):
    """Rank `rank` of the group failed (it reported `message`, died, or broke the stream)."""

    exit_code = 1

    def __init__(self, message: str, *, rank: int) -> None:
        super().__init__(message)
        self.rank = rank


class AllreduceTimeoutError(StepRankError):
    """A one-shot all-reduce of this rank gave up waiting for rank `rank` (status {1, rank, block, epoch})."""


def send_frame(conn: socket.socket, header: Mapping[str, Any], payload: bytes | memoryview = b"") -> None:
    """One frame; raises OSError (BrokenPipeError: the peer is gone)."""
    head = json.dumps(header, separators=(",", ":")).encode()
    conn.sendall(_FRAME.pack(len(head), len(payload)) + head)
    if len(payload):
        conn.sendall(payload)


def _recv_exact(conn: socket.socket, size: int, deadline: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            conn.settimeout(remaining)
        chunk = conn.recv(min(size - len(buf), 2**20))
        if not chunk:
            raise EOFError(f"the connection closed {len(buf)} bytes into a {size}-byte part")
        buf += chunk
    return bytes(buf)


def recv_frame(conn: socket.socket, deadline: float | None = None) -> tuple[dict[str, Any], bytes]:
    """(header, payload). Raises EOFError (closed), TimeoutError (past `deadline`, a time.monotonic() value),
    ValueError (a frame over the bounds or a header that is not a JSON object with a string "op")."""
    head_len, payload_len = _FRAME.unpack(_recv_exact(conn, _FRAME.size, deadline))
    if head_len > MAX_HEADER_BYTES or payload_len > MAX_PAYLOAD_BYTES:
        raise ValueError(f"a frame of {head_len} header / {payload_len} payload bytes, more than "
                         f"{MAX_HEADER_BYTES} / {MAX_PAYLOAD_BYTES}")
    header = json.loads(_recv_exact(conn, head_len, deadline))
    if not isinstance(header, dict) or not isinstance(header.get("op"), str):
        raise ValueError(f"a frame header that is not an object with an 'op': {str(header)[:60]!r}")
    return header, _recv_exact(conn, payload_len, deadline)


# ---------------------------------------------------------------- rank 0


class StepSender:
    """Rank 0's end: one connection per follower, ranks 1..world-1 (`accept` makes one)."""

    def __init__(self, conns: Mapping[int, socket.socket]) -> None:
        self.conns = dict(conns)
        self.closed = False

    @classmethod
    def accept(cls, listener: socket.socket, world: int, timeout_s: float) -> "StepSender":
        """Accept ranks 1..world-1 on `listener` (bound, listening), each naming itself in a hello frame, within
        `timeout_s`. Raises StepRankError naming the lowest rank that did not connect, or a peer that sent
        garbage (rank -1 when it never named a valid rank)."""
        deadline = time.monotonic() + timeout_s
        conns: dict[int, socket.socket] = {}
        try:
            while len(conns) < world - 1:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([listener], [], [], remaining)[0]:
                    missing = [r for r in range(1, world) if r not in conns]
                    raise StepRankError(f"rank 0: rank {missing[0]} of {world} did not join the step stream within "
                                        f"{timeout_s:g} s", rank=missing[0])
                conn, _ = listener.accept()
                try:
                    header, _ = recv_frame(conn, deadline)
                except (EOFError, TimeoutError, ValueError, OSError) as exc:
                    conn.close()
                    raise StepRankError(f"rank 0: a peer of the step stream sent no valid hello ({exc})",
                                        rank=-1) from None
                rank = header.get("rank")
                if header["op"] != "hello" or type(rank) is not int or not 1 <= rank < world or rank in conns:
                    conn.close()
                    raise StepRankError(f"rank 0: a step-stream hello {json.dumps(header)[:80]} does not name a new "
                                        f"rank of 1..{world - 1}", rank=-1)
                conn.settimeout(None)
                conns[rank] = conn
        except BaseException:
            for conn in conns.values():
                conn.close()
            raise
        return cls(conns)

    def _check(self) -> None:
        """Raise for any follower that sent something (an error report) or closed its connection (died)."""
        readable, _, _ = select.select(list(self.conns.values()), [], [], 0)
        for rank, conn in sorted(self.conns.items()):
            if conn in readable:
                raise self._failure(rank, conn)

    def _failure(self, rank: int, conn: socket.socket) -> StepRankError:
        try:
            header, _ = recv_frame(conn, time.monotonic() + 1.0)
        except (EOFError, OSError, TimeoutError, ValueError):
            return StepRankError(f"rank 0: rank {rank} left the step stream (it died or exited)", rank=rank)
        if header["op"] == "error":
            return StepRankError(f"rank 0: rank {rank} failed: {str(header.get('message'))[:2000]}", rank=rank)
        return StepRankError(f"rank 0: rank {rank} sent an unexpected {header['op']!r} frame", rank=rank)

    def _send(self, header: Mapping[str, Any], payload: bytes | memoryview = b"") -> None:
        if self.closed:
            raise StepRankError("rank 0: the step stream is closed", rank=0)
        self._check()
        for rank, conn in sorted(self.conns.items()):
            try:
                send_frame(conn, header, payload)
            except OSError:
                raise self._failure(rank, conn) from None

    def write_input(self, name: str, array: np.ndarray) -> None:
        if array.dtype.name not in _DTYPES:
            raise TypeError(f"write_input {name!r}: dtype {array.dtype} does not travel on the step stream")
        self._send({"op": "write", "name": name, "dtype": array.dtype.name, "shape": list(array.shape)},
                   memoryview(np.ascontiguousarray(array)).cast("B"))

    def issue(self, program: str, vars: Mapping[str, int] | None, eager: bool) -> None:
        self._send({"op": "issue", "program": program, "vars": {k: int(v) for k, v in (vars or {}).items()},
                    "eager": bool(eager)})

    def close(self, timeout_s: float = 60.0) -> None:
        """Send "close" and wait up to `timeout_s` for every follower's "closed". Idempotent. Raises StepRankError
        naming a follower that reported an error, died, or did not answer."""
        if self.closed:
            return
        try:
            self._send({"op": "close"})
            deadline = time.monotonic() + timeout_s
            for rank, conn in sorted(self.conns.items()):
                try:
                    header, _ = recv_frame(conn, deadline)
                except TimeoutError:
                    raise StepRankError(f"rank 0: rank {rank} did not finish its steps within {timeout_s:g} s",
                                        rank=rank) from None
                except (EOFError, OSError, ValueError):
                    raise StepRankError(f"rank 0: rank {rank} left the step stream before finishing",
                                        rank=rank) from None
                if header["op"] == "error":
                    raise StepRankError(f"rank 0: rank {rank} failed: {str(header.get('message'))[:2000]}",
                                        rank=rank)
                if header["op"] != "closed":
                    raise StepRankError(f"rank 0: rank {rank} answered close with {header['op']!r}", rank=rank)
        finally:
            self.closed = True
            for conn in self.conns.values():
                conn.close()


class _CheckedEvent:
    """An event whose wait() then checks the all-reduce status (rank 0's pipelined decode loop)."""

    def __init__(self, event: Any, check: Any) -> None:
        self.event, self.check = event, check

    def wait(self) -> None:
        self.event.wait()
        self.check()


class StreamingRuntime:
    """Rank 0's runtime for the caller: `contract.CallerRuntime` and `DeviceSteps` over its own `kern_runtime.Runtime`
    `rt`, every write and issue streamed to the followers first (`sender`). Leases: tp.GroupPages (a host-only
    kern_pool `Pool` over rank 0's pool layout, as tp.TpRuntime's). `status`: the name of the one-shot all-reduce's host-mapped status buffer, or None."""

    def __init__(self, rt: Any, sender: StepSender, status: str | None) -> None:
        from .tp import GroupPages

        self.rt, self.sender = rt, sender
        self._pages = GroupPages(rt)
        self._status = rt.host_array(status) if status else None
        self.weight_load_stats = rt.weight_load_stats

    @property
    def page_tokens(self) -> int | None:
        return self.rt.page_tokens

    @property
    def num_pages(self) -> int | None:
        return self.rt.num_pages

    def check_status(self) -> None:
        """Raise AllreduceTimeoutError when a one-shot all-reduce of this rank timed out (or was refused)."""
        if self._status is not None and int(self._status[0]) != 0:
            raise status_error(0, [int(v) for v in self._status])

    def write_input(self, name: str, array: np.ndarray) -> None:
        arr = np.ascontiguousarray(array)
        self.sender.write_input(name, arr)
        self.rt.write_input(name, arr)

    def issue(self, program: str, vars: Mapping[str, int] | None = None, eager: bool = False) -> None:
        self.sender.issue(program, vars, eager)
        self.rt.issue(program, vars, eager=eager)

    def read_output(self, name: str, rows: int | None = None) -> np.ndarray:
        out = self.rt.read_output(name, rows)
        self.check_status()
        return out

    def read_buffer(self, name: str, rows: int | None = None) -> np.ndarray:
        out = self.rt.read_buffer(name, rows)
        self.check_status()
        return out

    def record_event(self) -> _CheckedEvent:
        return _CheckedEvent(self.rt.record_event(), self.check_status)

    def host_array(self, name: str) -> np.ndarray:
        return self.rt.host_array(name)

    def lease(self, num_tokens: int, *, wait: bool = True) -> Any:
        """tp.GroupPages.lease: pages for `num_tokens` tokens, the same ids on every rank."""
        return self._pages.lease(num_tokens)

    def describe(self) -> dict[str, Any]:
        return self.rt.describe()

    def into_resident(self) -> None:
        return None

    def close(self) -> None:
        """Close the step stream (waiting for the followers) and the runtime."""
        try:
            self.sender.close()
        finally:
            self.rt.close()


def status_error(rank: int, status: list[int]) -> StepRankError:
    """The error of a nonzero status word {code, a, b, c} of the one-shot all-reduce or all-gather (the
    vocabulary-parallel lm_head's; both write `ar_status` alike) on rank `rank`."""
    code, a, b, c = status
    if code == 1:
        return AllreduceTimeoutError(f"rank {rank}: a one-shot all-reduce / all-gather gave up waiting for rank {a} "
                                     f"(block {b}, call {c}); the group is failed", rank=a)
    return StepRankError(f"rank {rank}: a one-shot all-reduce / all-gather refused its launch (status {status}: count "
                         f"{a}, grid {b}, group {c}); the manifest does not match its kernel", rank=rank)


# ---------------------------------------------------------------- followers


def connect_steps(path: Path, rank: int, timeout_s: float) -> socket.socket:
    """Connect to rank 0's step stream at `path` (retrying until it listens) and say hello. Raises StepRankError
    naming rank 0 when it does not listen within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(str(path))
            send_frame(conn, {"op": "hello", "rank": rank})
            return conn
        except (FileNotFoundError, ConnectionRefusedError):
            conn.close()
        if time.monotonic() >= deadline:
            raise StepRankError(f"rank {rank}: rank 0's step stream ({path}) did not open within {timeout_s:g} s",
                                rank=0)
        time.sleep(CONNECT_RETRY_S)


def follow(rt: Any, conn: socket.socket, rank: int, status: str | None) -> int:
    """Apply rank 0's stream to `rt` until "close"; returns the number of frames applied. On any failure the
    error is reported to rank 0 (best effort) and raised. Raises StepRankError naming rank 0 when its stream
    ends without "close" or breaks the format."""
    view = rt.host_array(status) if status else None
    frames = 0
    try:
        while True:
            try:
                header, payload = recv_frame(conn)
            except (EOFError, OSError):
                raise StepRankError(f"rank {rank}: rank 0's step stream ended before close (rank 0 died or "
                                    "exited)", rank=0) from None
            except ValueError as exc:
                raise StepRankError(f"rank {rank}: rank 0 sent a bad frame: {exc}", rank=0) from None
            op = header["op"]
            if op == "close":
                rt.synchronize()
                if view is not None and int(view[0]) != 0:
                    raise status_error(rank, [int(v) for v in view])
                send_frame(conn, {"op": "closed"})
                return frames
            if op == "write":
                rt.write_input(str(header["name"]), _array(header, payload, rank))
            elif op == "issue":
                vars = header.get("vars")
                if not isinstance(vars, dict) or not all(isinstance(v, int) for v in vars.values()):
                    raise StepRankError(f"rank {rank}: an issue frame's vars {str(vars)[:60]} are not name -> int",
                                        rank=0)
                rt.issue(str(header["program"]), vars, eager=bool(header.get("eager")))
            else:
                raise StepRankError(f"rank {rank}: rank 0 sent an unknown step {op[:20]!r}", rank=0)
            frames += 1
    except BaseException as exc:
        with contextlib.suppress(OSError):
            send_frame(conn, {"op": "error", "message": str(exc) or type(exc).__name__})
        raise
    finally:
        conn.close()


def _array(header: Mapping[str, Any], payload: bytes, rank: int) -> np.ndarray:
    dtype, shape = header.get("dtype"), header.get("shape")
    if dtype not in _DTYPES or not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise StepRankError(f"rank {rank}: a write frame's dtype {dtype!r} / shape {shape!r} is not an array's",
                            rank=0)
    arr = np.frombuffer(payload, dtype=np.dtype(dtype))
    if arr.size != int(np.prod(shape, dtype=np.int64)):
        raise StepRankError(f"rank {rank}: a write frame of {len(payload)} bytes does not hold {dtype}{shape}", rank=0)
    return arr.reshape(shape)


__all__ = [
    "STEPS_SOCKET", "AllreduceTimeoutError", "StepRankError", "StepSender", "StreamingRuntime", "connect_steps",
    "follow", "recv_frame", "send_frame", "status_error",
]
