"""A fake TP rank process for test_peer_fd_handles_cpu.py, started by kern_run's `spawn_ranks`.

    python fd_rank_worker.py OUT TIMEOUT

Installs fake_cuda's FakeDriver as `cuda.bindings.driver`, loads the test's peer manifest as rank KERN_TP_RANK,
writes "written by rank <r>" into its export block (a memfd in the fake), swaps `offer(portable=True)` blobs and
descriptors with `exchange_fds`, connects, and writes OUT/rank<r>.json: what each imported block reads, the peer
table's own entry and this rank's address, whether the peers are ready, and the open descriptor counts before
the load and after everything was closed.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import cuda.bindings
import numpy as np
from fake_cuda import FakeDriver  # this script's directory is sys.path[0]

fake = FakeDriver()
sys.modules["cuda.bindings.driver"] = fake
cuda.bindings.driver = fake  # type: ignore[attr-defined]

from kern_run.tp_rendezvous import exchange_fds, rank_env  # noqa: E402
from kern_runtime import Offer  # noqa: E402
from test_peer_fd_handles_cpu import load  # noqa: E402


def main(out: Path, timeout_s: float) -> int:
    me = rank_env()
    before = len(os.listdir("/proc/self/fd"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the fabric refusal
        rt = load(me.rank, me.world)
    text = f"written by rank {me.rank}".encode()
    (_, _, block), = rt._buffers["ar"].blocks
    FakeDriver.block_memory(block)[: len(text)] = text
    offer = rt.offer(portable=True)
    try:
        blobs, fds = exchange_fds(me.rank, me.world, offer.to_bytes(), offer.fds(), me.where, timeout_s)
    finally:
        offer.close_fds()
    offers = [offer if p == me.rank else Offer.from_bytes(blobs[p], fds[p]) for p in range(me.world)]
    try:
        rt.connect({"tp": offers})
    finally:
        for p, o in enumerate(offers):
            if p != me.rank:
                o.close_fds()
    imported = [b for b in fake.live_blocks.values() if getattr(b, "imported", False)]
    reads = [bytes(FakeDriver.block_memory(b)[:32]).rstrip(b"\0").decode() for b in imported]
    table = rt.read_buffer("ar_peers").view(np.uint64)
    result = {"imports": reads, "table_self": int(table[me.rank]), "own_address": rt.address_of("ar"),
              "ready": rt.peers_ready}
    rt.close()
    result["open_fds_before"], result["open_fds_after"] = before, len(os.listdir("/proc/self/fd"))
    (out / f"rank{me.rank}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), float(sys.argv[2])))
