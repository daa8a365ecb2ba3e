"""A fake TP rank for tests/run/test_tp_procs.py, started by `spawn_ranks`: kern_run.tp_procs.join_group and the step
stream (kern_run.tp_steps) over a fake runtime instead of a GPU.

    python tp_procs_worker.py MODE OUT TIMEOUT

Every rank offers one fd handle (a memfd reading "rank <r>") and joins the group; rank 0 then drives a scripted
sequence of writes and issues through StreamingRuntime, the others follow. Each rank writes OUT/rank<r>.json (what
it applied, what its peers' descriptors read, its open descriptor counts); a failing rank leaves OUT/rank<r>.error
(tp_procs.report_failure) and exits 1. MODE picks a failure:

    ok          nothing fails
    die         rank 1 dies by SIGKILL after applying 3 frames
    noshow      rank 2 never reaches the rendezvous (sleeps until terminated)
    garbage     rank 1 hands in bytes that are not an offer
    family      rank 1's offer is of another manifest family
    reject      rank 1's runtime refuses the program "bad" (it reports the error to rank 0)
    lost        rank 0's all-reduce status says a wait gave up on rank 1 (what the kernel writes)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from kern_run.tp_procs import join_group, report_failure
from kern_run.tp_rendezvous import rank_env
from kern_run.tp_steps import STEPS_SOCKET, StepSender, StreamingRuntime, connect_steps, follow
from kern_runtime import ApiError
from kern_runtime.multigpu.peers import Offer, PeerBlock, PeerHandle, check_offers

FAMILY = "f" * 64


class FakeRuntime:
    """What join_group and the step stream use of a kern_runtime.Runtime, recording every call."""

    def __init__(self, rank: int, mode: str) -> None:
        self.rank, self.mode = rank, mode
        self.applied: list[Any] = []
        self.peer_texts: dict[int, str] = {}
        self.status = np.zeros(4, dtype=np.int32)
        self.pool = None
        self.page_tokens = self.num_pages = None
        self.weight_load_stats = (0, 0.0)
        self.memfd = os.memfd_create("fake-ar")
        os.write(self.memfd, f"rank {rank}".encode())

    def offer(self, portable: bool = False) -> Any:
        assert portable
        if self.mode == "garbage" and self.rank == 1:
            return _Garbage()
        family = "e" * 64 if self.mode == "family" and self.rank == 1 else FAMILY
        handle = PeerHandle("ar", "fd", 4096, (PeerBlock(0, 4096, os.dup(self.memfd)),), gpu=self.rank, pid=os.getpid())
        return Offer(family, f"digest {self.rank}", {"tp": self.rank}, {"ar": handle})

    def connect(self, offers: dict[str, list[Offer]]) -> None:
        members = offers["tp"]
        check_offers("tp", len(members), members, FAMILY, self.rank)
        for i, o in enumerate(members):
            if i != self.rank:
                self.peer_texts[i] = os.pread(o.handles["ar"].blocks[0].handle, 64, 0).decode()

    def write_input(self, name: str, array: np.ndarray) -> None:
        self.applied.append(["write", name, str(array.dtype), list(array.shape), np.asarray(array).tolist()])
        self._maybe_die()

    def issue(self, program: str, vars: Any = None, eager: bool = False) -> None:
        if program == "bad" and self.mode == "reject" and self.rank == 1:
            raise ApiError(f"unknown program {program!r}")
        self.applied.append(["issue", program, dict(vars or {}), eager])
        self._maybe_die()
        if self.mode == "lost" and self.rank == 0 and len(self.applied) >= 4:
            self.status[:] = [1, 1, 0, 7]

    def _maybe_die(self) -> None:
        if self.mode == "die" and self.rank == 1 and len(self.applied) == 3:
            os.kill(os.getpid(), signal.SIGKILL)

    def read_output(self, name: str, rows: int | None = None) -> np.ndarray:
        return np.zeros(1, dtype=np.int64)

    def read_buffer(self, name: str, rows: int | None = None) -> np.ndarray:
        return np.zeros(1, dtype=np.uint16)

    def host_array(self, name: str) -> np.ndarray:
        assert name == "ar_status"
        return self.status

    def synchronize(self) -> None:
        pass

    def record_event(self) -> Any:
        return _Event()

    def close(self) -> None:
        os.close(self.memfd)


class _Event:
    def wait(self) -> None:
        pass


class _Garbage:
    def to_bytes(self) -> bytes:
        return b"GET / HTTP/1.1\r\n\r\n"

    def fds(self) -> list[int]:
        return []

    def close_fds(self) -> None:
        pass


def script(srt: StreamingRuntime, mode: str) -> None:
    """Rank 0's calls: inputs of several dtypes and shapes, programs with vars, a readback."""
    srt.write_input("token_ids", np.arange(5, dtype=np.int32))
    srt.write_input("block_table", np.arange(12, dtype=np.int32).reshape(2, 6))
    srt.issue("prefill", {"tokens": 5, "seqs": 1})
    for step in range(4):
        srt.write_input("positions", np.asarray([5 + step], dtype=np.int32))
        srt.issue("decode", {"tokens": 1, "seqs": 1}, eager=step == 2)
        srt.read_output("next_token", 1)
    if mode == "reject":
        srt.issue("bad", {})
        time.sleep(0.5)  # rank 1 reports before the next frame
        srt.issue("decode", {"tokens": 1, "seqs": 1})
    srt.record_event().wait()
    srt.write_input("seq_lens", np.asarray([9], dtype=np.int64))


def main(mode: str, out: Path, timeout_s: float) -> int:
    me = rank_env()
    fds_before = len(os.listdir("/proc/self/fd"))
    if mode == "noshow" and me.rank == 2:
        time.sleep(600)
    rt = FakeRuntime(me.rank, mode)
    listener = None
    try:
        if me.rank == 0:
            import socket

            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(me.where.parent / STEPS_SOCKET))
            listener.listen(me.world)
        join_group(rt, me, timeout_s)
        if me.rank == 0:
            srt = StreamingRuntime(rt, StepSender.accept(listener, me.world, timeout_s), "ar_status")
            listener.close()
            try:
                script(srt, mode)
            finally:
                srt.sender.close(timeout_s)
        else:
            conn = connect_steps(me.where.parent / STEPS_SOCKET, me.rank, timeout_s)
            follow(rt, conn, me.rank, "ar_status")
    except Exception as exc:  # noqa: BLE001 - reported as a rank of kern run reports
        print(report_failure(exc, me, out), file=sys.stderr)
        return 1
    finally:
        rt.close()
    result = {"applied": rt.applied, "peers": {str(k): v for k, v in rt.peer_texts.items()},
              "fds_before": fds_before, "fds_after": len(os.listdir("/proc/self/fd"))}
    (out / f"rank{me.rank}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])))
