"""Peer memory between the ranks of a topology group: handles, offers, and the mapping of peers' memory.

Export buffers (`export: true`) and states of a manifest with a topology are VMM allocations. Each
is offered to the group as a `PeerHandle`: its physical blocks, each either

- **fabric**: a 64-byte `CUmemFabricHandle` (the device reports
  `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED` and `cuMemCreate` accepted
  `CU_MEM_HANDLE_TYPE_FABRIC`); any process on the fabric imports it with
  `cuMemImportFromShareableHandle`; it has a wire form (`Offer.to_bytes`);
- **local**: the `CUmemGenericAllocationHandle` itself, meaningful only inside the exporting process
  (one process holding every rank: `connect_local`). It has no wire form.

`KERN_NO_FABRIC=1` forces local handles. Importing maps every block of a member's allocation into a
fresh virtual range of the importer (`cuMemAddressReserve` + `cuMemMap`) and grants the importer's
device read/write (`cuMemSetAccess`): for a local handle of device 0 mapped by device 1's runtime,
that access grant is what makes the memory reachable over NVLink/PCIe P2P. Kernels see plain
addresses either way; no multicast object is ever created.

The dataclasses and the wire format are pure Python (CPU tests); `export_handle`, `map_peer` need the
driver.
"""

from __future__ import annotations

import base64
import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

from kern_manifest import json_text_fault

from .driver import call, cu
from .errors import ApiError, DriverError

OFFER_MAGIC = b"KERN-OFFER/1\n"
FABRIC_HANDLE_BYTES = 64
NCCL_ID_BYTES = 128  # ncclUniqueId
MAX_OFFER_BYTES = 64 * 2**20  # an offer of 40 GiB of states in 2 MiB blocks is about 2 MiB


@dataclass(frozen=True)
class PeerBlock:
    """One physical block of an allocation: byte `offset` in it, `nbytes`, and the handle (fabric:
    64 bytes; local: the driver's allocation handle object)."""

    offset: int
    nbytes: int
    handle: Any


@dataclass(frozen=True)
class PeerHandle:
    """What a rank offers for one export buffer or state: `kind` fabric | local, mapped `nbytes`,
    its `blocks`, the owning device `gpu` and process `pid` (local handles work only in that process)."""

    name: str
    kind: str
    nbytes: int
    blocks: tuple[PeerBlock, ...]
    gpu: int
    pid: int

    def to_json(self) -> dict[str, Any]:
        if self.kind != "fabric":
            raise ApiError(
                f"peer handle of {self.name!r} is a local handle (only valid inside process {self.pid}); it has no "
                "wire form. Offers cross processes only with fabric handles: the device must support them and the "
                "container must hold an IMEX channel; unset KERN_NO_FABRIC. In one process use connect_local.")
        return {"name": self.name, "nbytes": self.nbytes, "gpu": self.gpu, "pid": self.pid,
                "blocks": [[b.offset, b.nbytes, base64.b64encode(bytes(b.handle)).decode("ascii")] for b in self.blocks]}

    @classmethod
    def from_json(cls, obj: Any) -> "PeerHandle":
        """The handle of `to_json()`'s object. Raises ApiError for anything else: a value of the wrong JSON type,
        a negative count (nbytes, gpu, pid, a block's offset or size), blocks out of order, overlapping or past
        `nbytes`, or a fabric handle that is not 64 bytes."""
        o = _wire_object(obj, "peer handle")
        name = _wire_str(o.get("name"), "peer handle name")
        where = f"peer handle {name!r}"
        nbytes = _wire_count(o.get("nbytes"), f"{where}: nbytes")
        blocks = []
        end = 0
        for i, item in enumerate(_wire_list(o.get("blocks"), f"{where}: blocks")):
            if not isinstance(item, list) or len(item) != 3:
                raise ApiError(f"malformed kern offer: {where}: block {i} is not [offset, nbytes, handle]")
            offset = _wire_count(item[0], f"{where}: block {i} offset")
            size = _wire_count(item[1], f"{where}: block {i} nbytes", low=1)
            if offset < end or offset + size > nbytes:
                raise ApiError(f"malformed kern offer: {where}: block {i} spans bytes {offset}..{offset + size}; blocks "
                               f"ascend without overlap inside the {nbytes} bytes of the allocation")
            end = offset + size
            try:
                raw = base64.b64decode(_wire_str(item[2], f"{where}: block {i} handle"), validate=True)
            except ValueError:
                raise ApiError(f"malformed kern offer: {where}: block {i} handle is not base64") from None
            if len(raw) != FABRIC_HANDLE_BYTES:
                raise ApiError(f"peer handle {name!r}: a fabric handle is {FABRIC_HANDLE_BYTES} bytes, got {len(raw)}")
            blocks.append(PeerBlock(offset, size, raw))
        return cls(name, "fabric", nbytes, tuple(blocks), _wire_count(o.get("gpu"), f"{where}: gpu"),
                   _wire_count(o.get("pid"), f"{where}: pid", low=1))


def _wire_kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def _wire_object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ApiError(f"malformed kern offer: {what} is {_wire_kind(value)}, expected an object")
    return value


def _wire_list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ApiError(f"malformed kern offer: {what} is {_wire_kind(value)}, expected an array")
    return value


def _wire_str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ApiError(f"malformed kern offer: {what} is {_wire_kind(value)}, expected a string")
    return value


def _wire_count(value: Any, what: str, low: int = 0) -> int:
    """An integer >= `low` (a JSON integer: not a boolean, a number with a fraction or a string)."""
    if type(value) is not int or value < low:
        shown = repr(value)[:40] if type(value) is int else _wire_kind(value)
        raise ApiError(f"malformed kern offer: {what} is {shown}, expected an integer >= {low}")
    return value


@dataclass(frozen=True)
class Offer:
    """One rank's side of the handshake: the manifest's family digest (what all ranks must share) and
    full digest, this rank's index per group, its peer handles, and an NCCL unique id for each group
    in which it is member 0 (and which has NCCL externs)."""

    family_digest: str
    digest: str
    ranks: Mapping[str, int]
    handles: Mapping[str, PeerHandle]
    nccl_ids: Mapping[str, bytes] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        """The wire form (magic line + JSON). Raises ApiError when a handle is local."""
        body = {"family_digest": self.family_digest, "digest": self.digest, "ranks": dict(self.ranks),
                "handles": {n: h.to_json() for n, h in self.handles.items()},
                "nccl_ids": {g: base64.b64encode(uid).decode("ascii") for g, uid in self.nccl_ids.items()}}
        return OFFER_MAGIC + json.dumps(body, sort_keys=True, separators=(",", ":")).encode("ascii")

    @classmethod
    def from_bytes(cls, data: bytes) -> "Offer":
        """Parse `to_bytes()` output (bytes-like, at most MAX_OFFER_BYTES). Raises ApiError for anything else:
        not bytes, no magic line, not ASCII JSON (nested too deeply included), a missing key or a value of the
        wrong JSON type, a negative rank, byte count, GPU or block range (`PeerHandle.from_json`), an NCCL id
        that is not base64 of 128 bytes."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ApiError(f"a kern offer is bytes (Offer.to_bytes), got {type(data).__name__}")
        data = bytes(data)
        if not data.startswith(OFFER_MAGIC):
            raise ApiError("not a kern offer (the wire form starts with 'KERN-OFFER/1')")
        if len(data) > MAX_OFFER_BYTES:
            raise ApiError(f"malformed kern offer: {len(data)} bytes, more than the {MAX_OFFER_BYTES} an offer may hold")
        try:
            body = json.loads(data[len(OFFER_MAGIC):].decode("ascii"))
        except (ValueError, RecursionError) as exc:  # not ASCII, not JSON, nested too deeply, too many digits
            raise ApiError(f"malformed kern offer: {json_text_fault(exc) or exc}") from None
        o = _wire_object(body, "the offer")
        for key in ("family_digest", "digest", "ranks", "handles", "nccl_ids"):
            if key not in o:
                raise ApiError(f"malformed kern offer: no {key!r}")
        ranks = {_wire_str(g, "a group name"): _wire_count(r, f"rank in group {g!r}")
                 for g, r in _wire_object(o["ranks"], "ranks").items()}
        handles = {n: PeerHandle.from_json(h) for n, h in _wire_object(o["handles"], "handles").items()}
        nccl_ids = {}
        for g, u in _wire_object(o["nccl_ids"], "nccl_ids").items():
            try:
                nccl_ids[g] = base64.b64decode(_wire_str(u, f"NCCL id of group {g!r}"), validate=True)
            except ValueError:
                raise ApiError(f"malformed kern offer: the NCCL id of group {g!r} is not base64") from None
            if len(nccl_ids[g]) != NCCL_ID_BYTES:
                raise ApiError(f"malformed kern offer: the NCCL id of group {g!r} is {len(nccl_ids[g])} bytes, "
                               f"expected {NCCL_ID_BYTES}")
        return cls(_wire_str(o["family_digest"], "family_digest"), _wire_str(o["digest"], "digest"), ranks, handles,
                   nccl_ids)


def check_offers(group: str, size: int, offers: list[Offer], family_digest: str, my_rank: int | None = None) -> None:
    """The offers of one group, in member order: one per member, every family digest equal to ours,
    member i says it is rank i. Raises ApiError naming the first disagreement."""
    if len(offers) != size:
        raise ApiError(f"group {group!r} has {size} members, connect got {len(offers)} offers")
    for i, offer in enumerate(offers):
        if offer.family_digest != family_digest:
            raise ApiError(f"group {group!r}: member {i}'s manifest (family digest {offer.family_digest[:12]}) differs "
                           f"from this rank's ({family_digest[:12]}): every rank must load the same model manifest "
                           "(per-rank manifests may differ only in their binds, name and meta)")
        if offer.ranks.get(group) != i:
            raise ApiError(f"group {group!r}: offer {i} is from rank {offer.ranks.get(group)} of the group; pass the "
                           "offers in member order")
    if my_rank is not None and not 0 <= my_rank < size:
        raise ApiError(f"group {group!r}: this runtime's rank {my_rank} is outside the group of {size}")


def missing_peer_tables(tables: Mapping[str, tuple[str, str]], filled: set[str]) -> list[str]:
    """Peer tables (name -> (of, group)) not yet filled, as 'name (peers of X in g)'."""
    return [f"{n} (peers of {of} in {g})" for n, (of, g) in tables.items() if n not in filled]


# ---------------------------------------------------------------- driver side


def fabric_wanted(gpu: int) -> bool:
    """Fabric handles unless KERN_NO_FABRIC=1 or the device does not report fabric support."""
    if os.environ.get("KERN_NO_FABRIC") == "1":
        return False
    driver = cu()
    attr = getattr(driver.CUdevice_attribute, "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED", None)
    if attr is None:
        return False
    try:
        return bool(call("cuDeviceGetAttribute", attr, call("cuDeviceGet", gpu)))
    except DriverError:
        return False


def vmm_with_fallback(ledger: Any, reserve: int, mapped: int, block: int, gpu: int, label: str, fabric: bool):
    """`ledger.vmm` with fabric handles when `fabric`, falling back to local (with a warning) when
    the driver refuses them (no IMEX channel, unsupported)."""
    if fabric:
        try:
            return ledger.vmm(reserve, mapped, block, gpu, label, fabric=True)
        except DriverError as exc:
            warnings.warn(f"kern: {label}: cuMemCreate with a fabric handle failed ({exc.result}); using local handles "
                          "(peers only inside this process)", RuntimeWarning, stacklevel=2)
    return ledger.vmm(reserve, mapped, block, gpu, label)


def export_handle(name: str, alloc: Any) -> PeerHandle:
    """The PeerHandle of a VMM allocation (fabric handles exported with cuMemExportToShareableHandle)."""
    if not alloc.blocks:
        raise ApiError(f"{name!r} is not a VMM allocation; only export buffers and states have peer handles")
    blocks = []
    for offset, nbytes, handle in alloc.blocks:
        if alloc.fabric:
            driver = cu()
            fh = call("cuMemExportToShareableHandle", handle, driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC, 0)
            data = bytes(fh.data) if hasattr(fh, "data") else bytes(fh)
            blocks.append(PeerBlock(offset, nbytes, data[:FABRIC_HANDLE_BYTES]))
        else:
            blocks.append(PeerBlock(offset, nbytes, handle))
    return PeerHandle(name, "fabric" if alloc.fabric else "local", alloc.nbytes, tuple(blocks), alloc.gpu, os.getpid())


def map_peer(handle: PeerHandle, gpu: int, ledger: Any, granularity: int) -> int:
    """Map a member's allocation into this process for device `gpu`; returns the base address.
    Undo (unmap, release imports, free the range) goes on `ledger`."""
    driver = cu()
    if handle.kind == "local" and handle.pid != os.getpid():
        raise ApiError(f"peer {handle.name!r}: a local handle of process {handle.pid} cannot be mapped in process "
                       f"{os.getpid()}")
    size = -(-max(handle.nbytes, 1) // granularity) * granularity
    undo: list = []
    try:
        base = int(call("cuMemAddressReserve", size, granularity, 0, 0))
        undo.append(lambda: call("cuMemAddressFree", base, size))
        for block in handle.blocks:
            if handle.kind == "fabric":
                fh = driver.CUmemFabricHandle()
                fh.data = bytes(block.handle)
                h = call("cuMemImportFromShareableHandle", fh, driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC)
                undo.append(lambda h=h: call("cuMemRelease", h))
            else:
                h = block.handle
            call("cuMemMap", base + block.offset, block.nbytes, 0, h, 0)
            undo.append(lambda o=block.offset, n=block.nbytes: call("cuMemUnmap", base + o, n))
        access = driver.CUmemAccessDesc()
        access.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = gpu
        access.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        call("cuMemSetAccess", base, handle.nbytes, [access], 1)
    except BaseException:
        while undo:
            undo.pop()()
        raise

    def release() -> None:
        while undo:
            undo.pop()()

    ledger.on_close(f"peer mapping {handle.name}@gpu{handle.gpu}", release)
    return base
