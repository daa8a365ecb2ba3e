"""Peer memory between the ranks of a topology group: handles, offers, and the mapping of peers' memory.

Export buffers (`export: true`) and states of a manifest with a topology are VMM allocations. Each
is offered to the group as a `PeerHandle`: its physical blocks, each either

- **fabric**: a 64-byte `CUmemFabricHandle` (the device reports
  `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED` and `cuMemCreate` accepted
  `CU_MEM_HANDLE_TYPE_FABRIC`); any process on the fabric imports it with
  `cuMemImportFromShareableHandle`; it has a wire form (`Offer.to_bytes`);
- **fd**: a POSIX file descriptor (`cuMemCreate` with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, exported by
  `cuMemExportToShareableHandle`): processes of one host import it after it travelled over a Unix socket
  (`SCM_RIGHTS`; kern_run.tp_rendezvous). Its wire form carries the descriptor's index into `Offer.fds()`;
  the descriptors themselves travel beside the bytes, and `Offer.from_bytes(data, fds)` puts them back;
- **local**: the `CUmemGenericAllocationHandle` itself, meaningful only inside the exporting process
  (one process holding every rank: `connect_local`). It has no wire form.

Blocks are created fabric where the device supports it (unless `KERN_NO_FABRIC=1`), else with the POSIX file
descriptor type (unless `KERN_NO_POSIX_FD=1`); a driver refusal of either falls back to the next, down to plain
(local-only) blocks. An fd-typed allocation still offers local handles in one process (`offer()`);
`offer(portable=True)` exports descriptors, which the caller then owns (`Offer.close_fds()`).
Importing maps every block of a member's allocation into a fresh virtual range of the importer
(`cuMemAddressReserve` + `cuMemMap`) and grants the importer's device read/write (`cuMemSetAccess`): for a
local handle of device 0 mapped by device 1's runtime, that access grant is what makes the memory reachable
over NVLink/PCIe P2P. Kernels see plain addresses either way; no multicast object is ever created.

The dataclasses and the wire format are pure Python (CPU tests); `export_handle`, `map_peer` need the
driver.
"""

from __future__ import annotations

import base64
import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from kern_manifest import json_text_fault

from ..cuda.driver import call, cu
from ..errors import ApiError, DriverError

OFFER_MAGIC = b"KERN-OFFER/1\n"
FABRIC_HANDLE_BYTES = 64
NCCL_ID_BYTES = 128  # ncclUniqueId
MAX_OFFER_BYTES = 64 * 2**20  # an offer of 40 GiB of states in 2 MiB blocks is about 2 MiB


HANDLE_KINDS = ("fabric", "fd", "local")
MAX_OFFER_FDS = 256  # file descriptors one offer may carry (one per exported block)


@dataclass(frozen=True)
class PeerBlock:
    """One physical block of an allocation: byte `offset` in it, `nbytes`, and the handle (fabric:
    64 bytes; fd: an int file descriptor of this process; local: the driver's allocation handle object)."""

    offset: int
    nbytes: int
    handle: Any


@dataclass(frozen=True)
class PeerHandle:
    """What a rank offers for one export buffer or state: `kind` fabric | fd | local, mapped `nbytes`,
    its `blocks`, the owning device `gpu` and process `pid` (local handles work only in that process; fd
    handles are descriptors of the process holding the PeerHandle)."""

    name: str
    kind: str
    nbytes: int
    blocks: tuple[PeerBlock, ...]
    gpu: int
    pid: int

    def to_json(self, fds: list[int] | None = None) -> dict[str, Any]:
        """The wire object. An fd handle appends its blocks' descriptors to `fds` and names their indices there
        (ApiError without `fds`); a local handle has no wire form (ApiError saying why)."""
        head = {"name": self.name, "kind": self.kind, "nbytes": self.nbytes, "gpu": self.gpu, "pid": self.pid}
        if self.kind == "fabric":
            return {**head, "blocks": [[b.offset, b.nbytes, base64.b64encode(bytes(b.handle)).decode("ascii")]
                                       for b in self.blocks]}
        if self.kind == "fd":
            if fds is None:
                raise ApiError(f"peer handle of {self.name!r} holds file descriptors: serialise it with its offer "
                               "(Offer.to_bytes, the descriptors in Offer.fds())")
            blocks = []
            for b in self.blocks:
                blocks.append([b.offset, b.nbytes, len(fds)])
                fds.append(int(b.handle))
            return {**head, "blocks": blocks}
        raise ApiError(
            f"peer handle of {self.name!r} is a local handle (only valid inside process {self.pid}); it has no "
            "wire form. Offers cross processes with fabric handles (the device must support them and the container "
            "must hold an IMEX channel; unset KERN_NO_FABRIC) or with file descriptors (offer(portable=True), unset "
            "KERN_NO_POSIX_FD). In one process use connect_local.")

    @classmethod
    def from_json(cls, obj: Any, fds: Sequence[int] = ()) -> "PeerHandle":
        """The handle of `to_json()`'s object; an fd handle's block indices resolve into `fds` (the descriptors
        that travelled with the offer). Raises ApiError for anything else: a value of the wrong JSON type, an
        unknown kind, a negative count (nbytes, gpu, pid, a block's offset or size), blocks out of order,
        overlapping or past `nbytes`, a fabric handle that is not 64 bytes, a descriptor index past `fds`."""
        o = _wire_object(obj, "peer handle")
        name = _wire_str(o.get("name"), "peer handle name")
        where = f"peer handle {name!r}"
        kind = _wire_str(o.get("kind", "fabric"), f"{where}: kind")
        if kind not in ("fabric", "fd"):
            raise ApiError(f"malformed kern offer: {where}: kind {kind[:20]!r}, expected 'fabric' or 'fd' (local "
                           "handles have no wire form)")
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
            if kind == "fd":
                index = _wire_count(item[2], f"{where}: block {i} descriptor index")
                if index >= len(fds):
                    raise ApiError(f"malformed kern offer: {where}: block {i} names file descriptor {index}; "
                                   f"{len(fds)} travelled with the offer")
                blocks.append(PeerBlock(offset, size, int(fds[index])))
                continue
            try:
                raw = base64.b64decode(_wire_str(item[2], f"{where}: block {i} handle"), validate=True)
            except ValueError:
                raise ApiError(f"malformed kern offer: {where}: block {i} handle is not base64") from None
            if len(raw) != FABRIC_HANDLE_BYTES:
                raise ApiError(f"peer handle {name!r}: a fabric handle is {FABRIC_HANDLE_BYTES} bytes, got {len(raw)}")
            blocks.append(PeerBlock(offset, size, raw))
        return cls(name, kind, nbytes, tuple(blocks), _wire_count(o.get("gpu"), f"{where}: gpu"),
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

    def fds(self) -> list[int]:
        """The file descriptors of the offer's fd handles, in the order `to_bytes` indexes them (empty without fd
        handles): what travels beside the bytes (SCM_RIGHTS)."""
        out: list[int] = []
        for h in self.handles.values():
            if h.kind == "fd":
                h.to_json(out)
        return out

    def close_fds(self) -> None:
        """Close every descriptor of the offer's fd handles (whoever holds the offer owns them: the exporter
        after the exchange, an importer after connect). Idempotent: a descriptor already closed is skipped."""
        for fd in self.fds():
            try:
                os.close(fd)
            except OSError:
                pass

    def to_bytes(self) -> bytes:
        """The wire form (magic line + JSON); fd handles name indices into `fds()`. Raises ApiError when a handle
        is local."""
        fds: list[int] = []
        body = {"family_digest": self.family_digest, "digest": self.digest, "ranks": dict(self.ranks),
                "handles": {n: h.to_json(fds) for n, h in self.handles.items()},
                "nccl_ids": {g: base64.b64encode(uid).decode("ascii") for g, uid in self.nccl_ids.items()}}
        return OFFER_MAGIC + json.dumps(body, sort_keys=True, separators=(",", ":")).encode("ascii")

    @classmethod
    def from_bytes(cls, data: bytes, fds: Sequence[int] = ()) -> "Offer":
        """Parse `to_bytes()` output (bytes-like, at most MAX_OFFER_BYTES); `fds`: the descriptors that travelled
        with it, in `fds()` order (at most MAX_OFFER_FDS; the offer's fd handles then hold them, not copies).
        Raises ApiError for anything else: not bytes, no magic line, not ASCII JSON (nested too deeply
        included), a missing key or a value of the wrong JSON type, a negative rank, byte count, GPU or block
        range or a descriptor index past `fds` (`PeerHandle.from_json`), an NCCL id that is not base64 of 128
        bytes."""
        if len(fds) > MAX_OFFER_FDS:
            raise ApiError(f"malformed kern offer: {len(fds)} file descriptors, more than the {MAX_OFFER_FDS} an offer "
                           "may carry")
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
        handles = {n: PeerHandle.from_json(h, fds) for n, h in _wire_object(o["handles"], "handles").items()}
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


def posix_fd_wanted() -> bool:
    """POSIX file descriptor handles (where fabric ones are not used) unless KERN_NO_POSIX_FD=1."""
    return os.environ.get("KERN_NO_POSIX_FD") != "1"


def vmm_with_fallback(ledger: Any, reserve: int, mapped: int, block: int, gpu: int, label: str, fabric: bool,
                      posix_fd: bool = False):
    """`ledger.vmm` with fabric handles when `fabric`, else (or when the driver refuses them: no IMEX channel,
    unsupported) with POSIX file descriptor handles when `posix_fd`, else (or on a refusal of those too) plain
    blocks that only this process can map; each fallback warns."""
    if fabric:
        try:
            return ledger.vmm(reserve, mapped, block, gpu, label, fabric=True)
        except DriverError as exc:
            then = "POSIX file descriptor handles" if posix_fd else "local handles (peers only inside this process)"
            warnings.warn(f"kern: {label}: cuMemCreate with a fabric handle failed ({exc.result}); using {then}",
                          RuntimeWarning, stacklevel=2)
    if posix_fd:
        try:
            return ledger.vmm(reserve, mapped, block, gpu, label, posix_fd=True)
        except DriverError as exc:
            warnings.warn(f"kern: {label}: cuMemCreate with a POSIX file descriptor handle failed ({exc.result}); "
                          "using local handles (peers only inside this process)", RuntimeWarning, stacklevel=2)
    return ledger.vmm(reserve, mapped, block, gpu, label)


def export_handle(name: str, alloc: Any, portable: bool = False) -> PeerHandle:
    """The PeerHandle of a VMM allocation: fabric handles exported with cuMemExportToShareableHandle; with
    `portable`, an fd-typed allocation's blocks exported as POSIX file descriptors (new descriptors of this
    process, the caller's to close: `Offer.close_fds`); otherwise local handles. Raises ApiError for an
    allocation that is not VMM, or one that `portable` cannot export (neither fabric nor fd-typed)."""
    if not alloc.blocks:
        raise ApiError(f"{name!r} is not a VMM allocation; only export buffers and states have peer handles")
    kind = "fabric" if alloc.fabric else "fd" if portable and alloc.posix_fd else "local"
    if portable and kind == "local":
        raise ApiError(f"{name!r}: its blocks were created without a shareable handle type (the driver refused fabric "
                       "and POSIX file descriptor handles, or KERN_NO_FABRIC / KERN_NO_POSIX_FD are set): peers in other "
                       "processes cannot map it")
    blocks: list[PeerBlock] = []
    try:
        for offset, nbytes, handle in alloc.blocks:
            if kind == "local":
                blocks.append(PeerBlock(offset, nbytes, handle))
                continue
            driver = cu()
            types = driver.CUmemAllocationHandleType
            if kind == "fabric":
                fh = call("cuMemExportToShareableHandle", handle, types.CU_MEM_HANDLE_TYPE_FABRIC, 0)
                data = bytes(fh.data) if hasattr(fh, "data") else bytes(fh)
                blocks.append(PeerBlock(offset, nbytes, data[:FABRIC_HANDLE_BYTES]))
            else:
                fd = call("cuMemExportToShareableHandle", handle, types.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
                blocks.append(PeerBlock(offset, nbytes, int(fd)))
    except BaseException:
        for b in blocks if kind == "fd" else ():
            os.close(b.handle)
        raise
    return PeerHandle(name, kind, alloc.nbytes, tuple(blocks), alloc.gpu, os.getpid())


def map_peer(handle: PeerHandle, gpu: int, ledger: Any, granularity: int) -> int:
    """Map a member's allocation into this process for device `gpu`; returns the base address.
    Undo (unmap, release imports, free the range) goes on `ledger`. An fd handle's descriptors are imported
    (`cuMemImportFromShareableHandle`), not closed."""
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
            elif handle.kind == "fd":  # the descriptor stays the caller's (Offer.close_fds after connect)
                h = call("cuMemImportFromShareableHandle", int(block.handle),
                         driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
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
