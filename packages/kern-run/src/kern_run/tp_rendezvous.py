"""The rendezvous of N rank processes (one per GPU): every rank hands in one blob, every rank gets all of them.

`exchange(rank, world, payload, where, timeout_s)` is how the ranks of a tensor-parallel group swap their
`kern_runtime.Offer.to_bytes()` blobs before `Runtime.connect`. Transport: one Unix-domain stream socket,
`where`, inside a private directory (owned by this user, no group/other access: anyone who can reach the
socket can feed the group an offer). Rank 0 hosts: it binds `where`, reads one frame from each other rank,
and answers each with every payload in rank order, or with its verdict when the group fails. Ranks 1..N-1
connect with retries until the deadline, send their frame and wait for the answer.

`exchange_fds` also carries file descriptors (CUDA export handles of type CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
kern_runtime `Offer.fds()`): each rank's descriptors ride as SCM_RIGHTS ancillary data on its frame's first
byte, and rank 0 forwards every other rank's descriptors with its answer (in batches of at most
`FDS_PER_MESSAGE`, each on one byte of the answer), so every rank ends with new descriptors of its peers'.

Frames (big-endian). A rank's frame: magic `KTPR`, u16 version, u16 fds (descriptors attached to the frame), u32
rank, u32 world, u64 payload length, the payload. Rank 0's answer: magic, u16 version, u8 status, u8 0, u32 n;
status 0: n (= world) u64 lengths, n u16 descriptor counts (of each rank's descriptors that follow; the
receiver's own count is 0: it keeps its own), then the payloads; status 1: n bytes of JSON `{"kind", "message",
"ranks", ...}`, rank 0's error, raised again on every connected rank as the same class.

Bounds: one deadline, `timeout_s` from the call (rank 0 fails at the deadline; the other ranks wait up to
`REPLY_GRACE_S` longer for rank 0's verdict, so they name the same missing rank); payloads of at most
`max_bytes` (default `MAX_PAYLOAD_BYTES`, 16 MiB); at most `max_fds` descriptors per rank (default `MAX_FDS`);
`world` at most `MAX_WORLD`. Descriptors received by a failing exchange are closed before it raises. Rank 0 removes the socket
file on every exit path; the directory belongs to whoever made it (`private_dir()`, `spawn_ranks`).

`spawn_ranks(world, argv, env)` starts the N rank processes with `KERN_TP_RANK`, `KERN_TP_WORLD` and
`KERN_TP_RENDEZVOUS` set, and fails the group (terminating the rest) as soon as one rank exits non-zero or
dies, naming it; `rank_env()` reads those variables in a rank.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import selectors
import shutil
import signal
import socket
import stat
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError, RefusalError

MAX_PAYLOAD_BYTES = 16 * 2**20  # an Offer of 40 GiB of states in 2 MiB blocks is about 2 MiB
MAX_WORLD = 64
MAX_FDS = 64  # descriptors one rank may hand in (one per exported block; a TP rank exports one or two)
FDS_PER_MESSAGE = 250  # SCM_RIGHTS descriptors per sendmsg (Linux's SCM_MAX_FD is 253)
REPLY_GRACE_S = 0.5  # how much longer than the deadline a rank waits for rank 0's answer
CONNECT_RETRY_S = 0.01  # pause between connection attempts while rank 0 is not listening yet
SOCKET_NAME = "rendezvous.sock"
ENV_RANK, ENV_WORLD, ENV_RENDEZVOUS = "KERN_TP_RANK", "KERN_TP_WORLD", "KERN_TP_RENDEZVOUS"

_MAGIC = b"KTPR"
_VERSION = 1
_FRAME = struct.Struct("!4sHHIIQ")  # magic, version, flags, rank, world, payload length
_ANSWER = struct.Struct("!4sHBBI")  # magic, version, status, 0, n (world, or JSON length)
_LENGTH = struct.Struct("!Q")
_COUNT = struct.Struct("!H")
_MAX_VERDICT_BYTES = 64 * 2**10
_SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes on Linux, NUL included


class RendezvousError(RefusalError):
    """The rendezvous failed; `rank` is the rank it names (None when no rank can be named)."""

    exit_code = 1
    kind = "error"

    def __init__(self, message: str, *, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank

    def _verdict(self) -> dict[str, object]:
        return {"kind": self.kind, "message": str(self), "rank": self.rank}


class RendezvousTimeoutError(RendezvousError):
    """Ranks `missing` (ascending; `rank` is the first) had not handed in their payload by the deadline."""

    kind = "timeout"

    def __init__(self, message: str, *, missing: Sequence[int]) -> None:
        super().__init__(message, rank=missing[0] if missing else None)
        self.missing = tuple(missing)

    def _verdict(self) -> dict[str, object]:
        return {**super()._verdict(), "missing": list(self.missing)}


class RendezvousPeerDiedError(RendezvousError):
    """Rank `rank` closed its connection before the exchange finished (it died, or gave up)."""

    kind = "died"


class RendezvousFrameError(RendezvousError):
    """A peer sent bytes that are not a valid frame for this group (`rank` None when it never named itself)."""

    kind = "frame"


class RendezvousPayloadError(RendezvousError):
    """Rank `rank`'s payload is `size` bytes, more than the `limit` a payload may hold."""

    kind = "payload"

    def __init__(self, message: str, *, rank: int | None, size: int, limit: int) -> None:
        super().__init__(message, rank=rank)
        self.size, self.limit = size, limit

    def _verdict(self) -> dict[str, object]:
        return {**super()._verdict(), "size": self.size, "limit": self.limit}


class GroupFailedError(RefusalError):
    """`spawn_ranks`: rank `rank` exited with `returncode` (negative: killed by signal -returncode), or was
    still running at the timeout (`returncode` None); the other ranks were terminated."""

    exit_code = 1

    def __init__(self, message: str, *, rank: int, returncode: int | None) -> None:
        super().__init__(message)
        self.rank, self.returncode = rank, returncode


def exchange(rank: int, world: int, payload: bytes, where: str | os.PathLike[str], timeout_s: float, *,
             max_bytes: int = MAX_PAYLOAD_BYTES) -> list[bytes]:
    """Swap one payload per rank; returns `world` payloads, rank order (this rank's own at index `rank`).

    rank: int in [0, world); world: int in [1, MAX_WORLD]; payload: bytes-like, at most `max_bytes` bytes;
    where: the socket path (an absolute or relative path of at most 107 bytes) in an existing private
    directory; timeout_s: seconds (finite, > 0), the deadline of the whole exchange. world 1 returns
    `[payload]` without touching `where`.

    Raises ValueError / TypeError for a bad argument (named); RendezvousPayloadError (naming the rank and
    size) for a payload over `max_bytes`, before anything is sent; RendezvousTimeoutError naming the ranks
    that had not arrived by the deadline (on rank 0; on the others, rank 0's verdict, or rank 0 itself when
    it never answered); RendezvousPeerDiedError naming a rank whose connection closed mid-exchange;
    RendezvousFrameError for a peer's garbage; ConfigError when `where`'s directory is not private or a
    non-socket file sits at `where`. Rank 0 raises within `timeout_s`, the others within `timeout_s +
    REPLY_GRACE_S` (plus the transfer of the answer).
    """
    payloads, fds = exchange_fds(rank, world, payload, (), where, timeout_s, max_bytes=max_bytes, max_fds=0)
    assert not any(fds), "a descriptor arrived though max_fds is 0"
    return payloads


def exchange_fds(rank: int, world: int, payload: bytes, fds: Sequence[int], where: str | os.PathLike[str],
                 timeout_s: float, *, max_bytes: int = MAX_PAYLOAD_BYTES,
                 max_fds: int = MAX_FDS) -> tuple[list[bytes], list[list[int]]]:
    """`exchange`, with file descriptors: returns (payloads, descriptors), both `world` long in rank order.

    fds: this rank's open descriptors (ints >= 0, at most `max_fds`), sent with SCM_RIGHTS; they stay the
    caller's. descriptors[rank] is `list(fds)` itself; descriptors[r] for every other rank r are new
    descriptors of this process (the kernel's copies of what rank r sent), the caller's to close. Raises as
    `exchange` does, and RendezvousPayloadError for more than `max_fds` descriptors (this rank's, before
    anything is sent, or a peer's), RendezvousFrameError when a peer's descriptors do not match the count it
    announced. On any failure the descriptors received so far are closed.
    """
    _check_int("rank", rank, 0)
    _check_int("world", world, 1)
    _check_int("max_bytes", max_bytes, 0)
    _check_int("max_fds", max_fds, 0)
    if world > MAX_WORLD:
        raise ValueError(f"world {world}: at most {MAX_WORLD} ranks")
    if rank >= world:
        raise ValueError(f"rank {rank}: outside world {world} (ranks 0..{world - 1})")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s) \
            or timeout_s <= 0:
        raise ValueError(f"timeout_s {timeout_s!r}: a finite number of seconds > 0")
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise TypeError(f"payload: bytes-like, not {type(payload).__name__}")
    if isinstance(fds, (str, bytes)) or not all(type(fd) is int and fd >= 0 for fd in fds):
        raise TypeError("fds: a sequence of open file descriptors (ints >= 0)")
    own = list(fds)
    data = bytes(payload)
    if len(data) > max_bytes:
        raise RendezvousPayloadError(f"rank {rank}: payload of {len(data)} bytes, more than the {max_bytes} a "
                                     f"rendezvous payload may hold", rank=rank, size=len(data), limit=max_bytes)
    if len(own) > max_fds:
        raise RendezvousPayloadError(f"rank {rank}: {len(own)} file descriptors, more than the {max_fds} a rank may "
                                     f"hand in", rank=rank, size=len(own), limit=max_fds)
    deadline = time.monotonic() + timeout_s
    if world == 1:
        return [data], [own]
    path = _socket_path(where)
    received: dict[int, list[int]] = {}
    try:
        if rank == 0:
            payloads = _host(world, data, own, path, deadline, timeout_s, max_bytes, max_fds, received)
        else:
            payloads = _join(rank, world, data, own, path, deadline, timeout_s, max_bytes, max_fds, received)
    except BaseException:
        _close_all(received)
        raise
    return payloads, [own if r == rank else received.get(r, []) for r in range(world)]


def _close_all(received: Mapping[int, list[int]]) -> None:
    for fds in received.values():
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


@contextlib.contextmanager
def private_dir(prefix: str = "kern-tp-") -> Iterator[Path]:
    """A fresh directory of mode 0700 (tempfile.mkdtemp, under $TMPDIR or /tmp), removed with its contents
    on exit; put the socket at `dir / SOCKET_NAME`."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world: int
    where: Path


def rank_env(environ: Mapping[str, str] | None = None) -> RankEnv:
    """This rank's place, from KERN_TP_RANK / KERN_TP_WORLD / KERN_TP_RENDEZVOUS (as `spawn_ranks` sets them).
    Raises ConfigError naming the variable that is missing or not a valid value."""
    env = os.environ if environ is None else environ
    values: dict[str, int] = {}
    for name in (ENV_RANK, ENV_WORLD):
        text = env.get(name)
        if text is None:
            raise ConfigError(f"{name} is not set: rank processes are started by kern_run.tp_rendezvous.spawn_ranks")
        if not text.isdigit() or len(text) > 4:
            raise ConfigError(f"{name}={text!r}: not a rank number")
        values[name] = int(text)
    rank, world = values[ENV_RANK], values[ENV_WORLD]
    if not 1 <= world <= MAX_WORLD or rank >= world:
        raise ConfigError(f"{ENV_RANK}={rank} {ENV_WORLD}={world}: need 0 <= rank < world <= {MAX_WORLD}")
    where = env.get(ENV_RENDEZVOUS)
    if not where:
        raise ConfigError(f"{ENV_RENDEZVOUS} is not set: rank processes are started by spawn_ranks")
    return RankEnv(rank, world, Path(where))


def spawn_ranks(world: int, argv: Sequence[str], env: Mapping[str, str] | None = None, *, timeout_s: float = 600.0,
                term_grace_s: float = 2.0) -> None:
    """Run `argv` as `world` rank processes and wait for all of them.

    Each rank gets os.environ updated with `env`, then KERN_TP_RANK (0..world-1), KERN_TP_WORLD and
    KERN_TP_RENDEZVOUS (the socket path in a fresh private directory, removed when this returns or raises).
    stdin is /dev/null; stdout / stderr are inherited. Returns when every rank exited 0. Raises
    GroupFailedError naming the first rank seen to exit non-zero or die by a signal, or (timeout_s seconds
    after the start) the lowest rank still running; every other rank still running then gets SIGTERM, and
    SIGKILL `term_grace_s` later, and is reaped before this raises. ValueError / TypeError for bad arguments.
    """
    _check_int("world", world, 1)
    if world > MAX_WORLD:
        raise ValueError(f"world {world}: at most {MAX_WORLD} ranks")
    if isinstance(argv, (str, bytes)) or not argv or not all(isinstance(a, str) for a in argv):
        raise TypeError("argv: a non-empty sequence of str (the program and its arguments)")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s {timeout_s!r}: seconds > 0")
    deadline = time.monotonic() + timeout_s
    exits: queue.Queue[tuple[int, int]] = queue.Queue()
    procs: list[subprocess.Popen[bytes]] = []
    with private_dir() as rdv:
        try:
            for rank in range(world):
                rank_environ = {**os.environ, **(env or {}), ENV_RANK: str(rank), ENV_WORLD: str(world),
                                ENV_RENDEZVOUS: str(rdv / SOCKET_NAME)}
                proc = subprocess.Popen(list(argv), env=rank_environ, stdin=subprocess.DEVNULL)
                procs.append(proc)
                threading.Thread(target=lambda r=rank, p=proc: exits.put((r, p.wait())), daemon=True).start()
            done = 0
            while done < world:
                try:
                    rank, code = exits.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    running = [r for r, p in enumerate(procs) if p.poll() is None]
                    raise GroupFailedError(f"rank {running[0]} of {world} still running after {timeout_s:g} s "
                                           f"(ranks running: {_ranks(running)}); the group was terminated",
                                           rank=running[0], returncode=None) from None
                if code != 0:
                    others = [r for r, p in enumerate(procs) if r != rank and p.poll() is None]
                    raise GroupFailedError(f"rank {rank} of {world} {_exit_text(code)}"
                                           + (f"; terminated {_ranks(others)}" if others else ""),
                                           rank=rank, returncode=code)
                done += 1
        finally:
            _terminate(procs, term_grace_s)


# -- rank 0 -------------------------------------------------------------------------------------------------


@dataclass
class _Incoming:
    """One connection's frame, read as it arrives."""

    header: bytes = b""
    rank: int | None = None
    length: int = 0
    body: bytearray | None = None
    nfds: int = 0  # descriptors the header announces
    fds: list[int] = field(default_factory=list)  # descriptors received so far (closed by the caller on failure)

    @property
    def need(self) -> int:
        if self.body is None:
            return _FRAME.size - len(self.header)
        return self.length - len(self.body)


def _host(world: int, payload: bytes, own_fds: list[int], path: Path, deadline: float, timeout_s: float,
          max_bytes: int, max_fds: int, received: dict[int, list[int]]) -> list[bytes]:
    _remove_stale(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sel = selectors.DefaultSelector()
    conns: dict[socket.socket, _Incoming] = {}
    done: dict[int, socket.socket] = {}
    payloads: dict[int, bytes] = {0: payload}
    claimed = {0}
    try:
        listener.bind(str(path))
        listener.listen(world)
        listener.setblocking(False)
        sel.register(listener, selectors.EVENT_READ, None)
        try:
            while len(payloads) < world:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = [r for r in range(world) if r not in payloads]
                    raise RendezvousTimeoutError(
                        f"rank 0: {_ranks(missing)} of {world} did not arrive within {timeout_s:g} s", missing=missing)
                for key, _ in sel.select(remaining):
                    if key.data is None:
                        with contextlib.suppress(BlockingIOError):
                            conn, _addr = listener.accept()
                            conn.setblocking(False)
                            conns[conn] = _Incoming()
                            sel.register(conn, selectors.EVENT_READ, conns[conn])
                        continue
                    conn = key.fileobj  # type: ignore[assignment]
                    inc = key.data
                    try:
                        chunk, fds, msg_flags, _ = socket.recv_fds(conn, min(inc.need, 2**20), max_fds + 1)
                    except BlockingIOError:
                        continue
                    except OSError:
                        chunk, fds, msg_flags = b"", [], 0
                    inc.fds += fds
                    if msg_flags & socket.MSG_CTRUNC:
                        raise RendezvousPayloadError(f"rank 0: {_who(inc)} attached more than {max_fds} file "
                                                     f"descriptors", rank=inc.rank, size=len(inc.fds), limit=max_fds)
                    if not chunk:
                        raise RendezvousPeerDiedError(f"rank 0: {_who(inc)} closed its connection before sending its "
                                                      f"whole frame", rank=inc.rank)
                    _feed(inc, chunk, world, claimed, max_bytes, max_fds)
                    if inc.need == 0 and inc.body is not None:
                        assert inc.rank is not None
                        if len(inc.fds) != inc.nfds:
                            raise RendezvousFrameError(f"rank 0: rank {inc.rank} announced {inc.nfds} file descriptors "
                                                       f"and attached {len(inc.fds)}", rank=inc.rank)
                        payloads[inc.rank] = bytes(inc.body)
                        received[inc.rank] = inc.fds
                        done[inc.rank] = conn
                        sel.unregister(conn)
        except RendezvousError as err:
            _tell(list(conns), _verdict(err))
            raise
        finally:
            for inc in conns.values():  # descriptors of frames never finished (the finished ones are in received)
                if inc.rank not in received or received[inc.rank] is not inc.fds:
                    _close_all({0: inc.fds})
        all_fds = {0: own_fds, **received}
        failed: list[int] = []
        for rank in sorted(done):
            conn = done[rank]
            try:
                conn.setblocking(True)
                conn.settimeout(max(0.0, deadline - time.monotonic()) + REPLY_GRACE_S)
                answer = _answer(payloads, world, {r: f for r, f in all_fds.items() if r != rank})
                _send_with_fds(conn, answer, [fd for r in range(world) if r != rank for fd in all_fds.get(r, [])])
            except OSError:
                failed.append(rank)
        if failed:
            raise RendezvousPeerDiedError(f"rank 0: {_ranks(failed)} closed the connection before taking the "
                                          f"answer", rank=failed[0])
        return [payloads[r] for r in range(world)]
    finally:
        sel.close()
        for conn in conns:
            conn.close()
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _who(inc: _Incoming) -> str:
    return f"rank {inc.rank}" if inc.rank is not None else "a peer that had not named its rank"


def _feed(inc: _Incoming, chunk: bytes, world: int, claimed: set[int], max_bytes: int, max_fds: int) -> None:
    """Add `chunk` to `inc`; once its header is whole, check it (ranks in `claimed` are taken)."""
    if inc.body is not None:
        inc.body += chunk
        return
    inc.header += chunk
    if len(inc.header) < _FRAME.size:
        return
    magic, version, nfds, rank, their_world, length = _FRAME.unpack(inc.header)
    if magic != _MAGIC:
        raise RendezvousFrameError(f"rank 0: a peer sent a frame that is not a kern rendezvous frame "
                                   f"(starts {inc.header[:8]!r})")
    if version != _VERSION:
        raise RendezvousFrameError(f"rank 0: rank {rank} sent frame version {version}, this is version {_VERSION}",
                                   rank=rank if rank < world else None)
    if their_world != world or not 1 <= rank < world:
        raise RendezvousFrameError(f"rank 0: a peer claims rank {rank} of world {their_world}; this group is "
                                   f"ranks 1..{world - 1} of {world}", rank=rank if 0 < rank < world else None)
    if rank in claimed:
        raise RendezvousFrameError(f"rank 0: rank {rank} arrived twice", rank=rank)
    if length > max_bytes:
        raise RendezvousPayloadError(f"rank 0: rank {rank} announces a payload of {length} bytes, more than the "
                                     f"{max_bytes} a rendezvous payload may hold", rank=rank, size=length,
                                     limit=max_bytes)
    if nfds > max_fds:
        raise RendezvousPayloadError(f"rank 0: rank {rank} announces {nfds} file descriptors, more than the {max_fds} a "
                                     f"rank may hand in", rank=rank, size=nfds, limit=max_fds)
    inc.rank, inc.length, inc.body, inc.nfds = rank, length, bytearray(), nfds
    claimed.add(rank)


def _answer(payloads: dict[int, bytes], world: int, fds: Mapping[int, list[int]]) -> bytes:
    """The status-0 answer; `fds`: the descriptors that follow it, by rank (counts of absent ranks are 0)."""
    parts = [_ANSWER.pack(_MAGIC, _VERSION, 0, 0, world)]
    parts += [_LENGTH.pack(len(payloads[r])) for r in range(world)]
    parts += [_COUNT.pack(len(fds.get(r, ()))) for r in range(world)]
    parts += [payloads[r] for r in range(world)]
    return b"".join(parts)


def _send_with_fds(conn: socket.socket, data: bytes, fds: list[int]) -> None:
    """`data` on `conn`, `fds` riding SCM_RIGHTS on its first bytes, at most FDS_PER_MESSAGE per byte."""
    at = 0
    for i in range(0, len(fds), FDS_PER_MESSAGE):
        assert at < len(data), "more descriptor batches than answer bytes"
        at += socket.send_fds(conn, [data[at:at + 1]], fds[i:i + FDS_PER_MESSAGE])
    conn.sendall(data[at:])


def _verdict(err: RendezvousError) -> bytes:
    body = json.dumps(err._verdict()).encode()[:_MAX_VERDICT_BYTES]
    return _ANSWER.pack(_MAGIC, _VERSION, 1, 0, len(body)) + body


def _tell(conns: list[socket.socket], verdict: bytes) -> None:
    """Best effort: each connected peer gets rank 0's verdict (a dead one is skipped)."""
    for conn in conns:
        with contextlib.suppress(OSError):
            conn.setblocking(True)
            conn.settimeout(0.2)
            conn.sendall(verdict)


# -- ranks 1..N-1 -------------------------------------------------------------------------------------------


def _join(rank: int, world: int, payload: bytes, own_fds: list[int], path: Path, deadline: float, timeout_s: float,
          max_bytes: int, max_fds: int, received: dict[int, list[int]]) -> list[bytes]:
    conn = _connect(rank, path, deadline, timeout_s)
    with conn:
        try:
            conn.settimeout(max(0.001, deadline - time.monotonic()))
            _send_with_fds(conn, _FRAME.pack(_MAGIC, _VERSION, len(own_fds), rank, world, len(payload)) + payload,
                           own_fds)
        except TimeoutError:
            raise RendezvousTimeoutError(f"rank {rank}: rank 0 did not take this rank's payload within "
                                         f"{timeout_s:g} s", missing=[0]) from None
        except OSError as err:
            raise RendezvousPeerDiedError(f"rank {rank}: rank 0 closed the connection while this rank sent its "
                                          f"payload ({err.strerror or err})", rank=0) from None
        reply_deadline = deadline + REPLY_GRACE_S
        got: list[int] = []  # descriptors as they arrive, in rank order
        received[-1] = got  # closed by exchange_fds on failure
        head = _recv(conn, _ANSWER.size, rank, reply_deadline, timeout_s, got, max_fds * world)
        magic, version, status, pad, n = _ANSWER.unpack(head)
        if magic != _MAGIC or version != _VERSION or pad != 0 or status not in (0, 1):
            raise RendezvousFrameError(f"rank {rank}: rank 0 answered with a frame that is not a kern rendezvous "
                                       f"answer (starts {head[:8]!r})", rank=0)
        if status == 1:
            if n > _MAX_VERDICT_BYTES:
                raise RendezvousFrameError(f"rank {rank}: rank 0's verdict is {n} bytes, more than "
                                           f"{_MAX_VERDICT_BYTES}", rank=0)
            raise _raise_verdict(rank, _recv(conn, n, rank, reply_deadline, timeout_s, got, max_fds * world))
        if n != world:
            raise RendezvousFrameError(f"rank {rank}: rank 0 answered with {n} payloads for a world of {world}",
                                       rank=0)
        limit = max_fds * world
        lengths = [_LENGTH.unpack_from(buf)[0] for buf in
                   [_recv(conn, _LENGTH.size, rank, reply_deadline, timeout_s, got, limit) for _ in range(world)]]
        counts = [_COUNT.unpack_from(buf)[0] for buf in
                  [_recv(conn, _COUNT.size, rank, reply_deadline, timeout_s, got, limit) for _ in range(world)]]
        for r, size in enumerate(lengths):
            if size > max_bytes:
                raise RendezvousPayloadError(f"rank {rank}: rank 0 forwards a payload of {size} bytes for rank "
                                             f"{r}, more than the {max_bytes} a rendezvous payload may hold",
                                             rank=r, size=size, limit=max_bytes)
        for r, count in enumerate(counts):
            if count > max_fds or (r == rank and count):
                raise RendezvousPayloadError(f"rank {rank}: rank 0 forwards {count} file descriptors for rank {r} "
                                             f"(at most {max_fds}, none for this rank)", rank=r, size=count,
                                             limit=max_fds)
        out = [_recv(conn, size, rank, reply_deadline, timeout_s, got, limit) for size in lengths]
        if out[rank] != payload:
            raise RendezvousFrameError(f"rank {rank}: rank 0 answered with a different payload for this rank",
                                       rank=0)
        if len(got) != sum(counts):
            raise RendezvousFrameError(f"rank {rank}: rank 0 announced {sum(counts)} file descriptors and sent "
                                       f"{len(got)}", rank=0)
        del received[-1]
        at = 0
        for r, count in enumerate(counts):
            if r != rank:
                received[r] = got[at:at + count]
                at += count
        return out


def _connect(rank: int, path: Path, deadline: float, timeout_s: float) -> socket.socket:
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.settimeout(max(0.001, deadline - time.monotonic()))
            conn.connect(str(path))
            return conn
        except (FileNotFoundError, ConnectionRefusedError, TimeoutError, BlockingIOError):
            conn.close()
        except BaseException:
            conn.close()
            raise
        if time.monotonic() + CONNECT_RETRY_S >= deadline:
            raise RendezvousTimeoutError(f"rank {rank}: rank 0 (the host) did not arrive within {timeout_s:g} s "
                                         f"(no listener at {path})", missing=[0])
        time.sleep(CONNECT_RETRY_S)


def _recv(conn: socket.socket, size: int, rank: int, deadline: float, timeout_s: float, fds: list[int],
          max_fds: int) -> bytes:
    """`size` bytes from rank 0; descriptors riding on them are appended to `fds` (at most `max_fds` in all)."""
    buf = bytearray()
    while len(buf) < size:
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise TimeoutError
            conn.settimeout(remaining)
            chunk, got, msg_flags, _ = socket.recv_fds(conn, min(size - len(buf), 2**20), FDS_PER_MESSAGE)
            fds += got
            if msg_flags & socket.MSG_CTRUNC or len(fds) > max_fds:
                raise RendezvousPayloadError(f"rank {rank}: rank 0 sent more file descriptors than the {max_fds} "
                                             f"this group may forward", rank=0, size=len(fds), limit=max_fds)
        except TimeoutError:
            raise RendezvousTimeoutError(f"rank {rank}: no answer from rank 0 within {timeout_s:g} s "
                                         f"(+{REPLY_GRACE_S:g} s)", missing=[0]) from None
        except OSError:
            chunk = b""
        if not chunk:
            raise RendezvousPeerDiedError(f"rank {rank}: rank 0 closed the connection before its whole answer "
                                          f"({len(buf)} of {size} bytes of a part)", rank=0)
        buf += chunk
    return bytes(buf)


_KINDS: dict[str, type[RendezvousError]] = {
    cls.kind: cls for cls in (RendezvousError, RendezvousTimeoutError, RendezvousPeerDiedError,
                              RendezvousFrameError, RendezvousPayloadError)
}


def _raise_verdict(rank: int, body: bytes) -> RendezvousError:
    """Rank 0's error, as the same class on this rank."""
    try:
        v = json.loads(body)
        cls = _KINDS[v["kind"]]
        message = f"rank {rank}: rank 0 failed the group: {v['message']}"
        named = v.get("rank")
        if not (named is None or isinstance(named, int)):
            raise TypeError
        if cls is RendezvousTimeoutError:
            missing = v["missing"]
            if not isinstance(missing, list) or not all(isinstance(m, int) for m in missing):
                raise TypeError
            return RendezvousTimeoutError(message, missing=missing)
        if cls is RendezvousPayloadError:
            return RendezvousPayloadError(message, rank=named, size=int(v["size"]), limit=int(v["limit"]))
        return cls(message, rank=named)
    except (ValueError, KeyError, TypeError):
        return RendezvousFrameError(f"rank {rank}: rank 0 sent an unreadable verdict ({body[:40]!r})", rank=0)


# -- shared -------------------------------------------------------------------------------------------------


def _socket_path(where: str | os.PathLike[str]) -> Path:
    if not isinstance(where, (str, os.PathLike)):
        raise TypeError(f"where: a socket path, not {type(where).__name__}")
    path = Path(where)
    if len(os.fsencode(path)) > _SUN_PATH_MAX:
        raise ValueError(f"where {str(path)!r}: {len(os.fsencode(path))} bytes, more than the {_SUN_PATH_MAX} "
                         f"a Unix socket path may hold (use a shorter directory, e.g. private_dir())")
    parent = path.parent
    try:
        st = os.stat(parent)
    except FileNotFoundError:
        raise ConfigError(f"rendezvous directory {str(parent)!r} does not exist") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"rendezvous directory {str(parent)!r} is not a directory")
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ConfigError(f"rendezvous directory {str(parent)!r} is not private (mode {stat.S_IMODE(st.st_mode):o}, "
                          f"owner uid {st.st_uid}): it must be this user's, mode 0700 (private_dir() makes one)")
    return path


def _remove_stale(path: Path) -> None:
    """A socket left at `path` by an earlier group is removed; any other file there is refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"rendezvous path {str(path)!r} exists and is not a socket; not removing it")
    os.unlink(path)


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: an int, not {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} {value}: must be >= {low}")


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"died from {name}"
    return f"exited with status {code}"


def _terminate(procs: list[subprocess.Popen[bytes]], grace_s: float) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    end = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


__all__ = [
    "CONNECT_RETRY_S",
    "ENV_RANK",
    "ENV_RENDEZVOUS",
    "ENV_WORLD",
    "MAX_PAYLOAD_BYTES",
    "MAX_WORLD",
    "REPLY_GRACE_S",
    "SOCKET_NAME",
    "GroupFailedError",
    "RankEnv",
    "RendezvousError",
    "RendezvousFrameError",
    "RendezvousPayloadError",
    "RendezvousPeerDiedError",
    "RendezvousTimeoutError",
    "FDS_PER_MESSAGE",
    "MAX_FDS",
    "exchange",
    "exchange_fds",
    "private_dir",
    "rank_env",
    "spawn_ranks",
]
