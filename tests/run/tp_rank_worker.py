"""A fake TP rank for tests/run/test_tp_rendezvous.py, started by `spawn_ranks` (or by the test itself).

    python tp_rank_worker.py exchange OUT SEED TIMEOUT   every rank swaps payload(SEED, rank) and writes the
                                                         sha256 of each received payload to OUT/rank<r>.json
    python tp_rank_worker.py fail RANK CODE TIMEOUT      rank RANK exits CODE at once; the others exchange
    python tp_rank_worker.py partial WHERE RANK WORLD    connect to WHERE, send a header announcing 4096 bytes
                                                         and 100 of them, then die by SIGKILL
    python tp_rank_worker.py fds OUT COUNT TIMEOUT       every rank hands in COUNT memfds holding
                                                         "<pid>:pid-of-<rank>.<i>" (exchange_fds) and writes what
                                                         it reads through every rank's descriptors to OUT/rank<r>.json
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import socket
import struct
import sys
from pathlib import Path

from kern_run.tp_rendezvous import exchange, exchange_fds, rank_env


def payload(seed: int, rank: int) -> bytes:
    """Random bytes of a random size in 0..1 MiB (size 0 for rank 1 of every seed, so empty payloads travel)."""
    rng = random.Random(seed * 1000 + rank)
    size = 0 if rank == 1 else rng.randrange(0, 2**20 + 1)
    return rng.randbytes(size)


def main(argv: list[str]) -> int:
    mode = argv[0]
    if mode == "partial":
        where, rank, world = argv[1], int(argv[2]), int(argv[3])
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(where)
        conn.sendall(struct.pack("!4sHHIIQ", b"KTPR", 1, 0, rank, world, 4096) + bytes(100))
        os.kill(os.getpid(), signal.SIGKILL)
    me = rank_env()
    if mode == "fds":
        own = []
        for i in range(int(argv[2])):
            fd = os.memfd_create("kern-test")
            os.write(fd, f"{os.getpid()}:pid-of-{me.rank}.{i}".encode())
            own.append(fd)
        _, fds = exchange_fds(me.rank, me.world, b"", own, me.where, float(argv[3]))
        seen = [[os.pread(fd, 4096, 0).decode() for fd in row] for row in fds]
        Path(argv[1], f"rank{me.rank}.json").write_text(json.dumps(seen))
        return 0
    if mode == "fail" and me.rank == int(argv[1]):
        return int(argv[2])
    seed = int(argv[2]) if mode == "exchange" else 0
    got = exchange(me.rank, me.world, payload(seed, me.rank), me.where, float(argv[3]))
    if mode == "exchange":
        digests = [hashlib.sha256(p).hexdigest() for p in got]
        Path(argv[1], f"rank{me.rank}.json").write_text(json.dumps(digests))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
