"""kern_run.tp_rendezvous: N ranks swap their offers over a Unix socket; the launcher fails the group on a bad rank.

Ranks run as threads (fast) and as real processes (`spawn_ranks` + tp_rank_worker.py); every received payload is
compared with the bytes the sending rank was given. Failures are checked for the rank they name and their time.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from kern_run.errors import ConfigError
from kern_run.tp_rendezvous import (
    MAX_PAYLOAD_BYTES,
    SOCKET_NAME,
    GroupFailedError,
    RendezvousFrameError,
    RendezvousPayloadError,
    RendezvousPeerDiedError,
    RendezvousTimeoutError,
    exchange,
    private_dir,
    rank_env,
    spawn_ranks,
)
from tp_rank_worker import payload as worker_payload

WORKER = str(Path(__file__).with_name("tp_rank_worker.py"))
FRAME = struct.Struct("!4sHHIIQ")


@pytest.fixture
def rdv():
    with private_dir() as d:
        yield d / SOCKET_NAME
    assert not d.exists()


def run_ranks(world, payloads, where, timeout_s, ranks=None, **kw):
    """exchange() of `ranks` (default all) on threads; rank -> the list returned, or the exception raised."""
    out: dict[int, object] = {}

    def one(r):
        try:
            out[r] = exchange(r, world, payloads[r], where, timeout_s, **kw)
        except Exception as err:  # noqa: BLE001 - the test inspects it
            out[r] = err

    threads = [threading.Thread(target=one, args=(r,)) for r in (range(world) if ranks is None else ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 10)
        assert not t.is_alive()
    return out


def random_payloads(world, seed):
    rng = random.Random(seed)
    sizes = [rng.choice([0, 1, 17, 4096, rng.randrange(2**20 + 1), 2**20]) for _ in range(world)]
    return [rng.randbytes(n) for n in sizes]


@pytest.mark.parametrize("world", [1, 2, 4, 8])
@pytest.mark.parametrize("seed", [0, 1])
def test_threads_get_every_payload_in_rank_order(rdv, world, seed):
    payloads = random_payloads(world, seed)
    out = run_ranks(world, payloads, rdv, 10.0)
    for r in range(world):
        assert out[r] == payloads, f"rank {r}"
    assert not rdv.exists()


def test_ranks_may_start_in_any_order_and_late(rdv):
    payloads = random_payloads(4, 7)
    out: dict[int, object] = {}

    def one(r, delay):
        time.sleep(delay)
        out[r] = exchange(r, 4, payloads[r], rdv, 10.0)

    threads = [threading.Thread(target=one, args=(r, d)) for r, d in [(3, 0.0), (1, 0.05), (0, 0.3), (2, 0.5)]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert [out[r] for r in range(4)] == [payloads] * 4


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_processes_via_spawn_ranks(tmp_path, world):
    spawn_ranks(world, [sys.executable, WORKER, "exchange", str(tmp_path), "5", "20"], timeout_s=60)
    want = [hashlib.sha256(worker_payload(5, r)).hexdigest() for r in range(world)]
    assert len({len(worker_payload(5, r)) for r in range(world)}) == world  # sizes differ, 0 among them
    for r in range(world):
        assert json.loads((tmp_path / f"rank{r}.json").read_text()) == want, f"rank {r}"


def test_missing_rank_is_named_in_bounded_time(rdv):
    payloads = random_payloads(3, 2)
    t0 = time.monotonic()
    out = run_ranks(3, payloads, rdv, 1.0, ranks=[0, 1])
    elapsed = time.monotonic() - t0
    assert elapsed < 5
    for r in (0, 1):
        err = out[r]
        assert isinstance(err, RendezvousTimeoutError), (r, err)
        assert err.missing == (2,) and err.rank == 2
        assert "rank 2 of 3 did not arrive within 1 s" in str(err)
    assert str(out[1]).startswith("rank 1: rank 0 failed the group: rank 0:")
    assert not rdv.exists()


def test_missing_host_is_named(rdv):
    t0 = time.monotonic()
    with pytest.raises(RendezvousTimeoutError) as info:
        exchange(1, 2, b"x", rdv, 0.5)
    assert time.monotonic() - t0 < 5
    assert info.value.missing == (0,) and "rank 0 (the host) did not arrive" in str(info.value)


def test_rank_killed_mid_frame_fails_the_group(rdv):
    payloads = random_payloads(3, 3)
    out: dict[int, object] = {}
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, _catch(r, 3, payloads[r], rdv, 20.0)))
               for r in (0, 1)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    _wait_for(rdv)
    proc = subprocess.run([sys.executable, WORKER, "partial", str(rdv), "2", "3"], check=False, timeout=30)
    assert proc.returncode == -9
    for t in threads:
        t.join(30)
    assert time.monotonic() - t0 < 5  # long before the 20 s deadline
    assert isinstance(out[0], RendezvousPeerDiedError) and out[0].rank == 2
    assert "rank 2 closed its connection before sending its whole frame" in str(out[0])
    assert isinstance(out[1], RendezvousPeerDiedError) and out[1].rank == 2  # rank 0's verdict
    assert not rdv.exists()


def test_host_dying_mid_answer_is_named(rdv):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(rdv))
    listener.listen(1)

    def fake_host():
        conn, _ = listener.accept()
        head = conn.recv(FRAME.size, socket.MSG_WAITALL)
        conn.recv(FRAME.unpack(head)[5], socket.MSG_WAITALL)
        conn.sendall(struct.pack("!4sHBBI", b"KTPR", 1, 0, 0, 2) + struct.pack("!Q", 10))  # then dies
        conn.close()

    t = threading.Thread(target=fake_host)
    t.start()
    with pytest.raises(RendezvousPeerDiedError) as info:
        exchange(1, 2, b"abc", rdv, 5.0)
    t.join(5)
    listener.close()
    assert info.value.rank == 0 and "rank 0 closed the connection before its whole answer" in str(info.value)


def test_oversized_payload_is_refused_before_sending(tmp_path):
    big = bytes(MAX_PAYLOAD_BYTES + 1)
    with pytest.raises(RendezvousPayloadError) as info:
        exchange(3, 4, big, tmp_path / "never-made" / "s.sock", 1.0)
    assert (info.value.rank, info.value.size, info.value.limit) == (3, MAX_PAYLOAD_BYTES + 1, MAX_PAYLOAD_BYTES)
    assert f"rank 3: payload of {MAX_PAYLOAD_BYTES + 1} bytes" in str(info.value)
    assert exchange(0, 1, bytes(MAX_PAYLOAD_BYTES), tmp_path / "unused.sock", 1.0) == [bytes(MAX_PAYLOAD_BYTES)]


def test_peer_announcing_more_than_the_host_cap_is_refused(rdv):
    payloads = [b"a" * 10, b"b" * 2000]
    out: dict[int, object] = {}
    t1 = threading.Thread(target=lambda: out.__setitem__(1, _catch(1, 2, payloads[1], rdv, 5.0)))
    t1.start()
    out[0] = _catch(0, 2, payloads[0], rdv, 5.0, max_bytes=1000)
    t1.join(10)
    for r in (0, 1):
        err = out[r]
        assert isinstance(err, RendezvousPayloadError), (r, err)
        assert (err.rank, err.size, err.limit) == (1, 2000, 1000)
    assert "rank 1 announces a payload of 2000 bytes" in str(out[0])


@pytest.mark.parametrize("frame, named, text", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", None, "not a kern rendezvous frame"),
    (FRAME.pack(b"KTPR", 1, 0, 1, 5, 0), 1, "claims rank 1 of world 5"),
    (FRAME.pack(b"KTPR", 1, 0, 0, 2, 0), None, "claims rank 0 of world 2"),
    (FRAME.pack(b"KTPR", 1, 0, 9, 2, 0), None, "claims rank 9 of world 2"),
    (FRAME.pack(b"KTPR", 2, 0, 1, 2, 0), 1, "version 2"),
])
def test_garbage_frame_is_refused(rdv, frame, named, text):
    t = threading.Thread(target=_send_raw, args=(rdv, frame))
    t.start()
    t0 = time.monotonic()
    with pytest.raises(RendezvousFrameError) as info:
        exchange(0, 2, b"host", rdv, 5.0)
    t.join(5)
    assert time.monotonic() - t0 < 3
    assert info.value.rank == named and text in str(info.value)
    assert not rdv.exists()


def test_duplicate_rank_is_refused(rdv):
    frame = FRAME.pack(b"KTPR", 1, 0, 1, 3, 4) + b"abcd"
    threads = [threading.Thread(target=_send_raw, args=(rdv, frame)) for _ in range(2)]
    for t in threads:
        t.start()
    with pytest.raises(RendezvousFrameError) as info:
        exchange(0, 3, b"host", rdv, 5.0)
    for t in threads:
        t.join(5)
    assert info.value.rank == 1 and "rank 1 arrived twice" in str(info.value)


def test_garbage_answer_is_refused(rdv):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(rdv))
    listener.listen(1)

    def fake_host():
        conn, _ = listener.accept()
        conn.recv(FRAME.size + 3, socket.MSG_WAITALL)
        conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
        conn.close()

    t = threading.Thread(target=fake_host)
    t.start()
    with pytest.raises(RendezvousFrameError) as info:
        exchange(1, 2, b"abc", rdv, 5.0)
    t.join(5)
    listener.close()
    assert info.value.rank == 0


def test_stale_socket_is_replaced_and_other_files_refused(rdv):
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(rdv))
    stale.close()  # the file stays: a crashed group's leftover
    assert stat.S_ISSOCK(os.lstat(rdv).st_mode)
    payloads = random_payloads(2, 9)
    out = run_ranks(2, payloads, rdv, 5.0)
    assert out[0] == out[1] == payloads and not rdv.exists()
    rdv.write_text("not a socket")
    with pytest.raises(ConfigError, match="exists and is not a socket"):
        exchange(0, 2, b"", rdv, 1.0)
    assert rdv.read_text() == "not a socket"


def test_non_private_directory_is_refused():
    with private_dir() as d:
        os.chmod(d, 0o755)
        with pytest.raises(ConfigError, match="is not private"):
            exchange(0, 2, b"", d / SOCKET_NAME, 1.0)
        with pytest.raises(ConfigError, match="does not exist"):
            exchange(1, 2, b"", d / "missing" / SOCKET_NAME, 1.0)
    with pytest.raises(ValueError, match="a Unix socket path may hold"):
        exchange(0, 2, b"", "/tmp/" + "x" * 120, 1.0)


@pytest.mark.parametrize("args, exc, text", [
    ((2, 2, b""), ValueError, "rank 2: outside world 2"),
    ((-1, 2, b""), ValueError, "rank -1"),
    ((True, 2, b""), TypeError, "rank: an int"),
    ((0, 65, b""), ValueError, "at most 64"),
    ((0, 2, "text"), TypeError, "payload: bytes-like"),
])
def test_bad_arguments(rdv, args, exc, text):
    with pytest.raises(exc, match=text):
        exchange(*args, rdv, 1.0)
    with pytest.raises(ValueError, match="timeout_s"):
        exchange(0, 2, b"", rdv, float("inf"))


@pytest.fixture
def short_tmp(monkeypatch):
    base = Path(tempfile.mkdtemp(prefix="kt"))
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    yield base
    assert list(base.iterdir()) == []  # spawn_ranks removed its rendezvous directory
    base.rmdir()


def test_launcher_fails_the_group_when_one_rank_exits_3(short_tmp):
    t0 = time.monotonic()
    with pytest.raises(GroupFailedError) as info:
        spawn_ranks(4, [sys.executable, WORKER, "fail", "3", "3", "30"], timeout_s=60)
    assert time.monotonic() - t0 < 10  # long before the ranks' 30 s rendezvous deadline
    assert (info.value.rank, info.value.returncode) == (3, 3)
    assert str(info.value).startswith("rank 3 of 4 exited with status 3")


def test_launcher_names_a_rank_killed_by_a_signal(short_tmp):
    code = "import os, signal, time\nif os.environ['KERN_TP_RANK'] == '1': os.kill(os.getpid(), signal.SIGKILL)\n" \
           "time.sleep(30)"
    with pytest.raises(GroupFailedError) as info:
        spawn_ranks(3, [sys.executable, "-c", code], timeout_s=30, term_grace_s=1)
    assert (info.value.rank, info.value.returncode) == (1, -9)
    assert "rank 1 of 3 died from SIGKILL; terminated ranks 0, 2" in str(info.value)


def test_launcher_timeout_names_a_running_rank(short_tmp):
    code = "import os, time\nif os.environ['KERN_TP_RANK'] != '0': time.sleep(30)"
    t0 = time.monotonic()
    with pytest.raises(GroupFailedError) as info:
        spawn_ranks(2, [sys.executable, "-c", code], timeout_s=1.0, term_grace_s=1)
    assert time.monotonic() - t0 < 5
    assert (info.value.rank, info.value.returncode) == (1, None)
    assert "rank 1 of 2 still running after 1 s" in str(info.value)


def test_launcher_sets_the_rank_environment(short_tmp, tmp_path):
    code = ("import os, sys\nfrom kern_run.tp_rendezvous import rank_env\ne = rank_env()\n"
            f"open(os.path.join({str(tmp_path)!r}, str(e.rank)), 'w').write(f'{{e.world}} {{e.where}} "
            "{os.environ[\"EXTRA\"]}')")
    spawn_ranks(2, [sys.executable, "-c", code], {"EXTRA": "yes"}, timeout_s=30)
    texts = [(tmp_path / str(r)).read_text().split() for r in range(2)]
    assert [t[0] for t in texts] == ["2", "2"] and [t[2] for t in texts] == ["yes", "yes"]
    assert texts[0][1] == texts[1][1] and texts[0][1].startswith(str(short_tmp))
    assert texts[0][1].endswith(SOCKET_NAME)


@pytest.mark.parametrize("env, text", [
    ({}, "KERN_TP_RANK is not set"),
    ({"KERN_TP_RANK": "x", "KERN_TP_WORLD": "2"}, "KERN_TP_RANK='x'"),
    ({"KERN_TP_RANK": "2", "KERN_TP_WORLD": "2", "KERN_TP_RENDEZVOUS": "/x"}, "need 0 <= rank < world"),
    ({"KERN_TP_RANK": "0", "KERN_TP_WORLD": "2"}, "KERN_TP_RENDEZVOUS is not set"),
])
def test_rank_env_refusals(env, text):
    with pytest.raises(ConfigError, match=text):
        rank_env(env)


def _catch(*args, **kw):
    try:
        return exchange(*args, **kw)
    except Exception as err:  # noqa: BLE001 - the test inspects it
        return err


def _wait_for(path, timeout_s=5.0):
    end = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.005)


def _send_raw(where, data):
    _wait_for(where)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(where))
        conn.sendall(data)
        conn.settimeout(3)
        try:
            conn.recv(4096)
        except OSError:
            pass
