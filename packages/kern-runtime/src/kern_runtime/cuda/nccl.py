"""NCCL collectives as extern ops, through `cupy.cuda.nccl` (imported lazily: extras cu12 / cu13).

Externs `nccl_{allreduce,allgather,reducescatter,alltoall}_{f32,bf16}` take the wiring
`[send, recv, count, {"rank": g}]`; `count` is elements per rank:

| collective      | send elements  | recv elements  | result                                                   |
|-----------------|----------------|----------------|----------------------------------------------------------|
| `allreduce`     | count          | count          | element-wise sum over the group                          |
| `allgather`     | count          | count x size   | member r's send lands in recv block r                    |
| `reducescatter` | count x size   | count          | rank r gets the sum of every member's send block r       |
| `alltoall`      | count x size   | count x size   | rank r's send block p lands in rank p's recv block r     |

`alltoall` is one NCCL group of a send/recv pair per peer. One communicator per topology group; NCCL
calls are stream-ordered on the runtime's compute stream and capturable into its CUDA graphs.

Before the first communicator is created, `pin_nccl_env` sets `NCCL_RUNTIME_CONNECT=0` (lazy
connection setup would fall into a graph capture and be refused) and `NCCL_PROTO=LL,LL128` unless the
caller set them, and forces `NCCL_NVLS_ENABLE=0` whatever the caller set: NVLink multicast (NVLS) is
never used on these machines. Nothing here calls a multicast API.

The pure part (`nccl_call`, `element_counts`, `check_extent`) is tested on the CPU.
"""

from __future__ import annotations

import importlib
import os
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Mapping, MutableMapping, Sequence

from ..errors import ApiError, CudaError, ManifestError

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall")
NCCL_DTYPES: dict[str, tuple[int, int]] = {"f32": (7, 4), "bf16": (9, 2)}  # name -> (ncclDataType_t, item bytes)
NCCL_SUM = 0
NCCL_ENV_DEFAULTS: dict[str, str] = {"NCCL_RUNTIME_CONNECT": "0", "NCCL_PROTO": "LL,LL128"}
NCCL_FORCED: dict[str, str] = {"NCCL_NVLS_ENABLE": "0"}
UNIQUE_ID_BYTES = 128


def pin_nccl_env(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set the NCCL variables kern relies on before any communicator exists. Returns what was set.

    Defaults (`NCCL_RUNTIME_CONNECT=0`, `NCCL_PROTO=LL,LL128`) apply only where the caller left the
    variable unset; `NCCL_NVLS_ENABLE` is always `0` (a caller's other value is overridden, with a warning).
    """
    env = os.environ if environ is None else environ
    changed: dict[str, str] = {}
    for key, value in NCCL_ENV_DEFAULTS.items():
        if key not in env:
            env[key] = value
            changed[key] = value
    for key, value in NCCL_FORCED.items():
        if env.get(key) != value:
            if key in env:
                warnings.warn(f"kern: {key}={env[key]!r} overridden to {value!r}: NVLink multicast stays off",
                              RuntimeWarning, stacklevel=2)
            env[key] = value
            changed[key] = value
    return changed


def split_extern(extern: str) -> tuple[str, str]:
    """`nccl_allgather_bf16` -> ("allgather", "bf16"). Raises ManifestError for another name."""
    parts = extern.split("_")
    if len(parts) != 3 or parts[0] != "nccl" or parts[1] not in COLLECTIVES or parts[2] not in NCCL_DTYPES:
        raise ManifestError(f"{extern!r} is not an NCCL extern (nccl_{{{','.join(COLLECTIVES)}}}_{{f32,bf16}})")
    return parts[1], parts[2]


def element_counts(collective: str, count: int, size: int) -> tuple[int, int]:
    """(send elements, recv elements) of one rank's call."""
    if collective == "allreduce":
        return count, count
    if collective == "allgather":
        return count, count * size
    if collective == "reducescatter":
        return count * size, count
    if collective == "alltoall":
        return count * size, count * size
    raise ManifestError(f"unknown collective {collective!r}")


@dataclass(frozen=True)
class NcclCall:
    """One rank's collective: addresses, `count` per rank, the group and its size, this rank."""

    collective: str
    dtype: str
    send: int
    recv: int
    count: int
    group: str
    size: int
    rank: int

    @property
    def item_bytes(self) -> int:
        return NCCL_DTYPES[self.dtype][1]

    @property
    def send_bytes(self) -> int:
        return element_counts(self.collective, self.count, self.size)[0] * self.item_bytes

    @property
    def recv_bytes(self) -> int:
        return element_counts(self.collective, self.count, self.size)[1] * self.item_bytes


def nccl_call(extern: str, args: Sequence[int], group: str, topology: Mapping[str, int], where: str) -> NcclCall:
    """Check a patched NCCL record's arguments `[send, recv, count, rank]` against the topology.

    Raises ManifestError (arity, unknown group) or ApiError (count < 1, rank outside the group).
    """
    collective, dtype = split_extern(extern)
    if len(args) != 4:
        raise ManifestError(f"{where}: extern {extern} takes [send, recv, count, {{\"rank\": g}}], got {len(args)} args")
    if group not in topology:
        raise ManifestError(f"{where}: extern {extern} names topology group {group!r}, which the manifest "
                            f"does not declare (groups: {sorted(topology)})")
    send, recv, count, rank = (int(a) for a in args)
    size = int(topology[group])
    if count < 1:
        raise ApiError(f"{where}: extern {extern}: count is {count}; it must be >= 1 element per rank")
    if not 0 <= rank < size:
        raise ApiError(f"{where}: extern {extern}: rank {rank} is outside group {group!r} of size {size}")
    if send == 0 or recv == 0:
        raise ApiError(f"{where}: extern {extern}: a null send or recv pointer")
    if send % NCCL_DTYPES[dtype][1] or recv % NCCL_DTYPES[dtype][1]:
        raise ApiError(f"{where}: extern {extern}: send/recv are not aligned to {NCCL_DTYPES[dtype][1]} bytes")
    return NcclCall(collective, dtype, send, recv, count, group, size, rank)


def check_extent(call: NcclCall, ranges: Mapping[str, tuple[int, int]], where: str) -> None:
    """Both operands lie inside one named allocation. `ranges`: name -> (base, nbytes).

    Raises ApiError naming the operand, its byte range and the allocation it starts in (if any)."""
    for label, address, nbytes in (("send", call.send, call.send_bytes), ("recv", call.recv, call.recv_bytes)):
        home = next(((n, b, s) for n, (b, s) in ranges.items() if b <= address < b + max(s, 1)), None)
        if home is None:
            raise ApiError(f"{where}: nccl_{call.collective}_{call.dtype} {label} address {address:#x} lies in no buffer")
        name, base, size = home
        if address + nbytes > base + size:
            raise ApiError(f"{where}: nccl_{call.collective}_{call.dtype} {label} needs {nbytes} bytes at offset "
                           f"{address - base} of {name!r}, which has {size} bytes (count {call.count}, group "
                           f"{call.group!r} of {call.size})")


# ---------------------------------------------------------------- cupy side


def nccl_module() -> ModuleType:
    """`cupy.cuda.nccl`. Raises CudaError naming the extras when cupy (or its NCCL) is missing."""
    try:
        module = importlib.import_module("cupy.cuda.nccl")
    except Exception as exc:  # noqa: BLE001 - ImportError or cupy's own failures to find libnccl
        raise CudaError(f"NCCL externs need cupy with NCCL (pip install 'kern-runtime[cu13]' or '[cu12]'): {exc}") from exc
    if not getattr(module, "available", True):
        raise CudaError("cupy.cuda.nccl is present but NCCL is not available (libnccl not found)")
    return module


def unique_id() -> bytes:
    """A fresh NCCL unique id as 128 bytes (the group's member 0 puts it in its offer)."""
    raw = nccl_module().get_unique_id()
    return bytes((int(b) + 256) % 256 for b in raw)


def _id_tuple(uid: bytes) -> tuple[int, ...]:
    if len(uid) != UNIQUE_ID_BYTES:
        raise ApiError(f"an NCCL unique id is {UNIQUE_ID_BYTES} bytes, got {len(uid)}")
    return tuple(b - 256 if b > 127 else b for b in uid)  # cupy takes the id as signed chars


class Communicator:
    """One rank's NCCL communicator of one topology group. `issue(call, stream)` enqueues a collective."""

    def __init__(self, group: str, size: int, rank: int, comm: Any) -> None:
        self.group, self.size, self.rank, self.comm = group, size, rank, comm

    @classmethod
    def create(cls, group: str, size: int, rank: int, uid: bytes, gpu: int) -> "Communicator":
        """ncclCommInitRank on device `gpu` (blocks until every member joins unless inside a group call)."""
        pin_nccl_env()
        nccl = nccl_module()
        import cupy

        with cupy.cuda.Device(gpu):
            try:  # cupy 14 takes the id as bytes; older cupy as a tuple of signed chars
                comm = nccl.NcclCommunicator(size, bytes(uid), rank)
            except TypeError:
                comm = nccl.NcclCommunicator(size, _id_tuple(uid), rank)
        return cls(group, size, rank, comm)

    def issue(self, call: NcclCall, stream: int) -> None:
        nccl = nccl_module()
        dt = NCCL_DTYPES[call.dtype][0]
        c = self.comm
        if call.collective == "allreduce":
            c.allReduce(call.send, call.recv, call.count, dt, NCCL_SUM, stream)
        elif call.collective == "allgather":
            c.allGather(call.send, call.recv, call.count, dt, stream)
        elif call.collective == "reducescatter":
            c.reduceScatter(call.send, call.recv, call.count, dt, NCCL_SUM, stream)
        else:
            step = call.count * call.item_bytes
            nccl.groupStart()
            try:
                for peer in range(call.size):
                    c.send(call.send + peer * step, call.count, dt, peer, stream)
                    c.recv(call.recv + peer * step, call.count, dt, peer, stream)
            finally:
                nccl.groupEnd()

    def close(self) -> None:
        if self.comm is not None:
            try:
                self.comm.destroy()
            finally:
                self.comm = None


def group_start() -> None:
    nccl_module().groupStart()


def group_end() -> None:
    nccl_module().groupEnd()
