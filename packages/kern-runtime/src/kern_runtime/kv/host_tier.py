"""The pinned host tier: one pinned allocation, park / wake copies on a transfer stream.

Host layout (state-major, chosen because it coalesces best): the host pages of paged state `i` are
one region of `num_host_pages * page_bytes[i]` bytes, the regions one after another, then the host
slots of every per-seq state the same way. Host page `h` of state `i` is at
`host_base + region_i + h * page_bytes[i]`. A run of `k` consecutive page ids on both sides is then
contiguous in every state on both sides, and when every state has the same page size and the
states are equally spaced on both sides (the device arena always is, remap.py; the host regions are
when page sizes agree) the whole run of every state is ONE `cuMemcpy2DAsync`:
`width = k * page_bytes`, `height = number of states`, pitches = the distance between states on each
side. That needs both pitches within `CU_DEVICE_ATTRIBUTE_MAX_PITCH`; when they are not (a device
state stride above it: big pools) or page sizes differ, each state's run is its own copy (height 1).
Measured on the H200 (2026-11-29): the driver refuses (CUDA_ERROR_INVALID_VALUE) a 2-D copy whose rows lie
in different VMM mappings of the pool arena, which the across-states copy always is; so the runtime passes
`max_pitch = 0` and every state's run is one 1-D copy (`reserve_host`).
A page-major host layout ("one host page = every state's page end to end") would instead need one
copy per (state, run) always, or a copy per page with height = states. Counts are pinned by CPU tests.

Ordering: the transfer stream waits for an event recorded on the compute stream when the copy is
issued (so it starts after everything already queued there, e.g. the step that wrote the pages or
the last step of a lease whose pages a wake reuses); the compute stream never waits for the
transfer stream. A parked checkpoint's device pages return to the pool only after the park's copy
event completes (`poll`); a woken lease is handed out only after its copy event completes.
`park_now` / `wake_now` put the copies on the compute stream instead (stream order is the guarantee).

NUMA: the allocation is made with the thread's memory policy set to prefer the GPU's NUMA node
(`/sys/bus/pci/devices/<bdf>/numa_node`, `set_mempolicy(MPOL_PREFERRED)`), restored afterwards;
skipped on a single-node machine or when the node is unknown (-1).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kern_pool import HostCopies, Misuse, PageCopy, SlotCopy

from ..cuda.driver import call, cu
from .pool_exec import ClassGeometry, IdCheck, check_pairs, pair_runs

MPOL_DEFAULT = 0
MPOL_PREFERRED = 1
SET_MEMPOLICY_SYSCALL = {"x86_64": 238, "aarch64": 236}


# ---------------------------------------------------------------- NUMA


def parse_node_list(text: str) -> list[int]:
    """A sysfs node list ("0", "0-1", "0,2-3", "") -> sorted node ids."""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return sorted(out)


def device_numa_node(pci_bus_id: str, sys_root: str | os.PathLike[str] = "/sys") -> int | None:
    """NUMA node of a PCI device (`0000:19:00.0`, any case) from sysfs; None when unknown (-1 or absent)."""
    path = Path(sys_root) / "bus" / "pci" / "devices" / pci_bus_id.strip().lower() / "numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def numa_target(pci_bus_id: str, sys_root: str | os.PathLike[str] = "/sys") -> int | None:
    """The node to bind the pinned allocation to, or None (single node, unknown node)."""
    try:
        online = parse_node_list((Path(sys_root) / "devices" / "system" / "node" / "online").read_text())
    except (OSError, ValueError):
        return None
    if len(online) < 2:
        return None
    node = device_numa_node(pci_bus_id, sys_root)
    return node if node in online else None


def node_mask(node: int) -> list[int]:
    """The `unsigned long` words of a nodemask with only `node` set."""
    words = [0] * (node // 64 + 1)
    words[node // 64] = 1 << (node % 64)
    return words


def _set_mempolicy(mode: int, words: Sequence[int]) -> None:
    nr = SET_MEMPOLICY_SYSCALL.get(platform.machine())
    if nr is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    mask = (ctypes.c_ulong * max(len(words), 1))(*words)
    maxnode = 64 * len(words) + 1 if words else 0
    if libc.syscall(nr, mode, mask if words else None, ctypes.c_ulong(maxnode)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"set_mempolicy({mode}) failed: {os.strerror(err)}")


@contextlib.contextmanager
def preferred_node(node: int | None) -> Iterator[None]:
    """Within the block, this thread's new memory prefers `node` (no-op for None)."""
    if node is None:
        yield
        return
    _set_mempolicy(MPOL_PREFERRED, node_mask(node))
    try:
        yield
    finally:
        _set_mempolicy(MPOL_DEFAULT, [])


# ---------------------------------------------------------------- geometry and copy plans


@dataclass(frozen=True, slots=True)
class HostGeometry:
    """State-major host layout of `num_pages` host pages and `num_slots` host slots (module docstring)."""

    num_pages: int
    num_slots: int
    page_bytes: tuple[int, ...]
    slot_bytes: tuple[int, ...]

    @property
    def page_region_offsets(self) -> tuple[int, ...]:
        out, off = [], 0
        for b in self.page_bytes:
            out.append(off)
            off += self.num_pages * b
        return tuple(out)

    @property
    def slot_region_offsets(self) -> tuple[int, ...]:
        out, off = [], self.num_pages * sum(self.page_bytes)
        for b in self.slot_bytes:
            out.append(off)
            off += self.num_slots * b
        return tuple(out)

    @property
    def total_bytes(self) -> int:
        return self.num_pages * sum(self.page_bytes) + self.num_slots * sum(self.slot_bytes)

    def pages(self, host_base: int) -> ClassGeometry:
        return ClassGeometry(tuple(host_base + o for o in self.page_region_offsets), self.page_bytes)

    def slots(self, host_base: int) -> ClassGeometry:
        return ClassGeometry(tuple(host_base + o for o in self.slot_region_offsets), self.slot_bytes)


@dataclass(frozen=True, slots=True)
class Copy2D:
    """One cuMemcpy2DAsync: `height` rows of `width_bytes`; row r reads `src + r * src_pitch` and writes
    `dst + r * dst_pitch`. `to_host`: device -> pinned host (park); else host -> device (wake)."""

    src: int
    src_pitch: int
    dst: int
    dst_pitch: int
    width_bytes: int
    height: int
    to_host: bool


def class_copies(pairs: Iterable[tuple[int, int]], device: ClassGeometry, host: ClassGeometry, to_host: bool,
                 max_pitch: int) -> list[Copy2D]:
    """Copies for `(src_id, dst_id)` pairs of one class (src is the device id when `to_host`).

    Runs of consecutive ids on both sides fold into one copy per state, or into one copy for every
    state when both sides are uniformly spaced within `max_pitch` (module docstring).
    """
    out: list[Copy2D] = []
    dev_stride, host_stride = device.uniform_stride(), host.uniform_stride()
    across = dev_stride is not None and host_stride is not None and max(dev_stride, host_stride) <= max_pitch
    for src_id, dst_id, count in pair_runs(pairs):
        dev_id, host_id = (src_id, dst_id) if to_host else (dst_id, src_id)
        if across:
            size = device.object_bytes[0]
            d, h = device.bases[0] + dev_id * size, host.bases[0] + host_id * size
            src, src_pitch, dst, dst_pitch = (d, dev_stride, h, host_stride) if to_host else (h, host_stride, d, dev_stride)
            out.append(Copy2D(src, src_pitch, dst, dst_pitch, count * size, device.num_states, to_host))  # type: ignore[arg-type]
            continue
        for dbase, hbase, size in zip(device.bases, host.bases, device.object_bytes):
            d, h = dbase + dev_id * size, hbase + host_id * size
            src, dst = (d, h) if to_host else (h, d)
            out.append(Copy2D(src, count * size, dst, count * size, count * size, 1, to_host))
    return out


def host_copies(plan: HostCopies, dev_pages: ClassGeometry, dev_slots: ClassGeometry, host: HostGeometry,
                host_base: int, max_pitch: int) -> list[Copy2D]:
    """A park or wake plan as 2-D copies (pages first, then slots)."""
    to_host = plan.direction == "park"
    assert plan.direction in ("park", "wake"), f"kern bug: host plan direction {plan.direction!r}"
    out = class_copies(((c.src_page_id, c.dst_page_id) for c in plan.page_copies), dev_pages, host.pages(host_base),
                       to_host, max_pitch)
    out += class_copies(((c.src_slot_id, c.dst_slot_id) for c in plan.slot_copies), dev_slots,
                        host.slots(host_base), to_host, max_pitch)
    return out


def host_id_check(count: int, name: str) -> IdCheck:
    """Ids of a host tier of `count` units of one class (`name`: "host page" / "host slot"): 0..count-1."""
    def why(oid: int) -> str | None:
        return None if oid < count else f"{name} {oid} is outside this runtime's {count} {name}s"
    return why


def check_host_copies(plan: Any, direction: str, dev_page: IdCheck, dev_slot: IdCheck, host: HostGeometry,
                      what: str) -> HostCopies:
    """`plan` if it is a kern_pool `HostCopies` of `direction` ("park": device -> host, "wake": host ->
    device) whose device ids pass `dev_page` / `dev_slot` and whose host ids lie in `host`; else kern_pool
    `Misuse` (no destination written twice either). Pure: nothing is issued (K3 `copy_out` / `copy_in`)."""
    if not isinstance(plan, HostCopies):
        raise Misuse(f"{what} needs a kern_pool HostCopies, got {type(plan).__name__}")
    if plan.direction != direction:
        way = "device -> host" if direction == "park" else "host -> device"
        raise Misuse(f"{what} executes {direction!r} plans ({way}), got {plan.direction!r}")
    host_page = host_id_check(host.num_pages, "host page")
    host_slot = host_id_check(host.num_slots, "host slot")
    to_host = direction == "park"
    for items, kind, dev, hst in ((plan.page_copies, PageCopy, dev_page, host_page),
                                  (plan.slot_copies, SlotCopy, dev_slot, host_slot)):
        src, dst = (dev, hst) if to_host else (hst, dev)
        field = "page_copies" if kind is PageCopy else "slot_copies"
        check_pairs(items, kind, f"{what} {field}", src, dst, same_space=False)
    return plan


def issue_copies(copies: Sequence[Copy2D], stream: Any) -> None:
    """Enqueue each copy on `stream`: cuMemcpy{DtoH,HtoD}Async for height 1, cuMemcpy2DAsync otherwise."""
    driver = cu()
    device, host = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE, driver.CUmemorytype.CU_MEMORYTYPE_HOST
    for c in copies:
        if c.height == 1:  # a plain run: the 1-D copy (no pitch checks, the common path)
            if c.to_host:
                call("cuMemcpyDtoHAsync", c.dst, c.src, c.width_bytes, stream)
            else:
                call("cuMemcpyHtoDAsync", c.dst, c.src, c.width_bytes, stream)
            continue
        p = driver.CUDA_MEMCPY2D()
        if c.to_host:
            p.srcMemoryType, p.srcDevice, p.dstMemoryType, p.dstHost = device, c.src, host, c.dst
        else:
            p.srcMemoryType, p.srcHost, p.dstMemoryType, p.dstDevice = host, c.src, device, c.dst
        p.srcPitch, p.dstPitch = c.src_pitch, c.dst_pitch
        p.WidthInBytes, p.Height = c.width_bytes, c.height
        call("cuMemcpy2DAsync", p, stream)


# ---------------------------------------------------------------- events


def new_event() -> Any:
    return call("cuEventCreate", cu().CUevent_flags.CU_EVENT_DISABLE_TIMING)


def event_done(event: Any) -> bool:
    """Non-blocking: has the work before `event` finished? (CUDA_ERROR_NOT_READY -> False)."""
    result = cu().cuEventQuery(event)
    code = int(result[0] if isinstance(result, tuple) else result)
    if code == 0:
        return True
    if code == int(cu().CUresult.CUDA_ERROR_NOT_READY):
        return False
    from ..cuda.driver import check

    check("cuEventQuery", result)  # raises DriverError
    return False


# ---------------------------------------------------------------- the pinned allocation


class PinnedHost:
    """One cuMemHostAlloc of `nbytes` (portable, device-mapped), NUMA-preferred; `close()` frees it."""

    def __init__(self, nbytes: int, numa_node: int | None) -> None:
        driver = cu()
        flags = driver.CU_MEMHOSTALLOC_DEVICEMAP | driver.CU_MEMHOSTALLOC_PORTABLE
        self.nbytes = nbytes
        self.numa_node = numa_node
        with preferred_node(numa_node):
            self.address = int(call("cuMemHostAlloc", max(nbytes, 1), flags))

    def view(self) -> Any:
        """uint8[nbytes] numpy view (no copy)."""
        import numpy as np

        return np.ctypeslib.as_array((ctypes.c_uint8 * self.nbytes).from_address(self.address))

    def close(self) -> None:
        if self.address:
            address, self.address = self.address, 0
            call("cuMemFreeHost", address)


def gpu_pci_bus_id(device: Any) -> str:
    raw = call("cuDeviceGetPCIBusId", 32, device)
    text = raw.decode() if isinstance(raw, (bytes, bytearray)) else str(raw)
    return text.split("\x00", 1)[0]
