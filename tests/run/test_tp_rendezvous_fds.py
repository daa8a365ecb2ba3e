"""kern_run.tp_rendezvous.exchange_fds: file descriptors (the CUDA POSIX-fd export handles) travel with the offers.

Each rank hands in memfds whose bytes name the rank and the descriptor's index; every rank must get, for every
other rank, new descriptors that read back those bytes, in order, and keep its own list as given. Ranks run as
threads (one process: descriptor counts of /proc/self/fd show leaks) and as processes (spawn_ranks). Failure
paths: a count announced but not attached, too many descriptors, a rank dying after it sent its descriptors;
every descriptor a failing exchange received is closed.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import threading
from pathlib import Path

import pytest
from test_tp_rendezvous import _wait_for
from kern_run.tp_rendezvous import (
    FDS_PER_MESSAGE,
    MAX_FDS,
    SOCKET_NAME,
    RendezvousFrameError,
    RendezvousPayloadError,
    RendezvousPeerDiedError,
    exchange_fds,
    private_dir,
    spawn_ranks,
)

WORKER = str(Path(__file__).with_name("tp_rank_worker.py"))
FRAME = struct.Struct("!4sHHIIQ")


def memfd(text: str) -> int:
    fd = os.memfd_create("kern-test")
    os.write(fd, text.encode())
    return fd


def read_fd(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def rdv():
    with private_dir() as d:
        yield d / SOCKET_NAME


def run_ranks(world, counts, where, timeout_s=10.0, **kw):
    """Every rank on a thread hands in counts[r] memfds reading f"r{r}.{i}"; rank -> (result or exception, own fds)."""
    out: dict[int, object] = {}
    own = {r: [memfd(f"r{r}.{i}") for i in range(counts[r])] for r in range(world)}

    def one(r):
        try:
            out[r] = exchange_fds(r, world, f"payload {r}".encode(), own[r], where, timeout_s, **kw)
        except Exception as err:  # noqa: BLE001 - the test inspects it
            out[r] = err

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 10)
        assert not t.is_alive()
    return out, own


@pytest.mark.parametrize("world, counts", [(2, [1, 1]), (4, [1, 2, 0, 3]), (8, [2] * 8)])
def test_threads_receive_every_peers_descriptors(rdv, world, counts):
    before = open_fds()
    out, own = run_ranks(world, counts, rdv)
    for r in range(world):
        payloads, fds = out[r]
        assert payloads == [f"payload {p}".encode() for p in range(world)]
        assert fds[r] == own[r]  # this rank's own, as given (no copies made)
        for p in range(world):
            assert [read_fd(fd) for fd in fds[p]] == [f"r{p}.{i}" for i in range(counts[p])], (r, p)
            if p != r:
                assert not set(fds[p]) & set(own[p])  # new descriptors of the same memfds
                assert [os.fstat(fd).st_ino for fd in fds[p]] == [os.fstat(fd).st_ino for fd in own[p]]
    for r in range(world):
        for p, fds in enumerate(out[r][1]):
            if p != r:
                for fd in fds:
                    os.close(fd)
    for fds in own.values():
        for fd in fds:
            os.close(fd)
    assert open_fds() == before


def test_more_descriptors_than_one_message_holds(rdv):
    """Rank 0 forwards 3 x 100 descriptors to rank 3: two SCM_RIGHTS batches of at most FDS_PER_MESSAGE."""
    assert 300 > FDS_PER_MESSAGE
    out, own = run_ranks(4, [100, 100, 100, 0], rdv, max_fds=100)
    _, fds = out[3]
    assert [len(f) for f in fds] == [100, 100, 100, 0]
    assert read_fd(fds[2][99]) == "r2.99" and read_fd(fds[0][0]) == "r0.0"
    for r in range(4):
        for p, f in enumerate(out[r][1]):
            for fd in f if p != r else []:
                os.close(fd)
    for f in own.values():
        for fd in f:
            os.close(fd)


def test_too_many_descriptors_refused_before_sending(tmp_path):
    fds = [memfd("x") for _ in range(3)]
    try:
        with pytest.raises(RendezvousPayloadError) as info:
            exchange_fds(1, 2, b"", fds, tmp_path / "never-made" / "s.sock", 1.0, max_fds=2)
        assert (info.value.rank, info.value.size, info.value.limit) == (1, 3, 2)
        assert "rank 1: 3 file descriptors, more than the 2" in str(info.value)
        with pytest.raises(TypeError, match="fds: a sequence of open file descriptors"):
            exchange_fds(0, 2, b"", [1.5], tmp_path / "s.sock", 1.0)
    finally:
        for fd in fds:
            os.close(fd)
    assert MAX_FDS >= 2


def test_announced_count_must_match_what_is_attached(rdv):
    """A peer announcing 2 descriptors and attaching 1 is refused, naming it; the one it sent is closed."""
    sent = memfd("lie")
    before = open_fds()

    def liar():
        _wait_for(rdv)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(rdv))
            socket.send_fds(conn, [FRAME.pack(b"KTPR", 1, 2, 1, 2, 3) + b"abc"], [sent])
            conn.settimeout(3)
            try:
                conn.recv(4096)
            except OSError:
                pass

    t = threading.Thread(target=liar)
    t.start()
    with pytest.raises(RendezvousFrameError) as info:
        exchange_fds(0, 2, b"host", [], rdv, 5.0)
    t.join(5)
    assert info.value.rank == 1 and "rank 1 announced 2 file descriptors and attached 1" in str(info.value)
    assert open_fds() == before  # the descriptor rank 0 received was closed
    os.close(sent)


def test_peer_announcing_more_than_the_cap_is_refused(rdv):
    out: dict[int, object] = {}
    fds = [memfd("a"), memfd("b"), memfd("c")]
    t = threading.Thread(target=lambda: out.__setitem__(1, _catch(1, 2, b"x", fds, rdv, 5.0)))
    t.start()
    out[0] = _catch(0, 2, b"y", [], rdv, 5.0, max_fds=2)
    t.join(10)
    assert isinstance(out[0], RendezvousPayloadError) and out[0].rank == 1
    assert "rank 1 announces 3 file descriptors, more than the 2" in str(out[0])
    assert isinstance(out[1], RendezvousPayloadError)  # rank 0's verdict, raised again on rank 1
    for fd in fds:
        os.close(fd)


def test_rank_dying_after_sending_descriptors_closes_them(rdv):
    """Rank 1 of 3 sends its frame and descriptors, then rank 2 dies mid-frame: rank 0 fails the group naming
    rank 2 and closes rank 1's descriptors it held."""
    before = open_fds()
    own1 = [memfd("one")]
    out: dict[int, object] = {}
    threads = [threading.Thread(target=lambda: out.__setitem__(0, _catch(0, 3, b"0", [], rdv, 10.0))),
               threading.Thread(target=lambda: out.__setitem__(1, _catch(1, 3, b"1", own1, rdv, 10.0)))]
    for t in threads:
        t.start()
    _wait_for(rdv)
    import subprocess

    proc = subprocess.run([sys.executable, WORKER, "partial", str(rdv), "2", "3"], check=False, timeout=30)
    assert proc.returncode == -9
    for t in threads:
        t.join(15)
    assert isinstance(out[0], RendezvousPeerDiedError) and out[0].rank == 2
    assert isinstance(out[1], RendezvousPeerDiedError) and out[1].rank == 2
    os.close(own1[0])
    assert open_fds() == before


@pytest.mark.parametrize("world", [2, 4])
def test_processes_pass_descriptors_via_spawn_ranks(tmp_path, world):
    """Real processes: each rank hands in two memfds; each writes what it read through its peers' descriptors."""
    spawn_ranks(world, [sys.executable, WORKER, "fds", str(tmp_path), "2", "20"], timeout_s=60)
    for r in range(world):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        want = [[f"pid-of-{p}.{i}" for i in range(2)] for p in range(world)]
        seen = [[text.split(":", 1)[1] for text in row] for row in got]
        assert seen == want, f"rank {r}"
        pids = {int(text.split(":", 1)[0]) for row in got for text in row}
        assert len(pids) == world  # every rank's bytes were written by its own process


def _catch(*args, **kw):
    try:
        return exchange_fds(*args, **kw)
    except Exception as err:  # noqa: BLE001 - the test inspects it
        return err


