"""Device, pinned-host and VMM allocations, each owned by a `Ledger` that frees in reverse order.

Every acquisition registers its undo as it happens; `Ledger.close()` runs the undos last-first, so
a load that fails half way frees everything it got (STYLE.md habit 6). A multi-step VMM mapping
(reserve -> create blocks -> map -> set access) keeps its own undo stack and hands it to the
ledger only when complete.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .driver import call, cu


@dataclass
class Allocation:
    """One owned piece of memory. `address`: device address (for host placement, the device-mapped
    address); `host_address`: host pointer for pinned host memory, else 0; `nbytes`: usable bytes."""

    label: str
    address: int
    nbytes: int
    host_address: int = 0
    undo: list[Callable[[], None]] = field(default_factory=list, repr=False)
    blocks: list[tuple[int, int, object]] = field(default_factory=list, repr=False)
    """VMM allocations: (offset, nbytes, CUmemGenericAllocationHandle) of every mapped physical block."""
    fabric: bool = False  # the blocks were created with a fabric shareable handle type
    posix_fd: bool = False  # the blocks were created exportable as POSIX file descriptors
    gpu: int = -1  # VMM allocations: the device that owns the blocks

    def free(self) -> None:
        """Release (idempotent). Runs this allocation's undo steps last-first."""
        while self.undo:
            self.undo.pop()()

    def host_view(self) -> np.ndarray:
        """uint8[nbytes] numpy view of pinned host memory (no copy)."""
        assert self.host_address, f"{self.label} is not host memory"
        return np.ctypeslib.as_array((ctypes.c_uint8 * self.nbytes).from_address(self.host_address))


class Ledger:
    """Owns allocations and other undos; `close()` runs them last-first. Not thread-safe."""

    def __init__(self) -> None:
        self._undo: list[Allocation | tuple[str, Callable[[], None]]] = []

    def adopt(self, allocation: Allocation) -> Allocation:
        self._undo.append(allocation)
        return allocation

    def on_close(self, label: str, fn: Callable[[], None]) -> None:
        """Register a non-memory undo (destroy a stream, unload a module, ...)."""
        self._undo.append((label, fn))

    def detach(self, allocation: Allocation) -> Allocation:
        """Stop owning `allocation` (it moves to another owner, e.g. a Resident)."""
        self._undo.remove(allocation)
        return allocation

    def close(self) -> None:
        """Free everything last-first. Raises the first failure after trying every undo."""
        first: BaseException | None = None
        while self._undo:
            item = self._undo.pop()
            try:
                if isinstance(item, Allocation):
                    item.free()
                else:
                    item[1]()
            except BaseException as exc:  # noqa: BLE001 - keep freeing, report the first
                first = first or exc
        if first is not None:
            raise first

    # ------------------------------------------------------------ acquisitions

    def device(self, nbytes: int, label: str) -> Allocation:
        """cuMemAlloc of max(nbytes, 1) bytes."""
        address = int(call("cuMemAlloc", max(int(nbytes), 1)))
        alloc = Allocation(label, address, int(nbytes))
        alloc.undo.append(lambda: call("cuMemFree", address))
        return self.adopt(alloc)

    def pinned(self, nbytes: int, label: str) -> Allocation:
        """Page-locked, device-mapped, portable host memory (cuMemHostAlloc) and its device address."""
        driver = cu()
        flags = driver.CU_MEMHOSTALLOC_DEVICEMAP | driver.CU_MEMHOSTALLOC_PORTABLE
        host = int(call("cuMemHostAlloc", max(int(nbytes), 1), flags))
        alloc = Allocation(label, 0, int(nbytes), host_address=host)
        alloc.undo.append(lambda: call("cuMemFreeHost", host))
        self.adopt(alloc)
        alloc.address = int(call("cuMemHostGetDevicePointer", host, 0))
        return alloc

    def vmm(self, reserve_bytes: int, mapped_bytes: int, block_bytes: int, device_ordinal: int, label: str,
            fabric: bool = False, posix_fd: bool = False) -> Allocation:
        """Reserve a VA range of `reserve_bytes`, create `mapped_bytes / block_bytes` physical blocks
        and map them from the start of the range with read/write access for `device_ordinal`. Both
        sizes are whole numbers of blocks. Undo stack: a failure at any step releases what the
        earlier steps took. `nbytes` of the result is `mapped_bytes`; `blocks` lists the physical
        blocks. `fabric`: create the blocks with CU_MEM_HANDLE_TYPE_FABRIC (peers in other processes or
        trays can import them); `posix_fd`: with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (peers in other
        processes of this host import them from a file descriptor passed over a Unix socket); the caller falls
        back when the driver refuses."""
        driver = cu()
        if mapped_bytes <= 0 or mapped_bytes % block_bytes or reserve_bytes % block_bytes or reserve_bytes < mapped_bytes:
            raise AssertionError(f"{label}: reserve {reserve_bytes} / map {mapped_bytes} bytes vs {block_bytes}-byte blocks")
        prop = vmm_properties(device_ordinal, fabric, posix_fd)
        alloc = Allocation(label, 0, int(mapped_bytes), fabric=fabric, posix_fd=posix_fd and not fabric,
                           gpu=device_ordinal)
        nbytes = mapped_bytes
        try:
            base = int(call("cuMemAddressReserve", reserve_bytes, block_bytes, 0, 0))
            alloc.undo.append(lambda: call("cuMemAddressFree", base, reserve_bytes))
            alloc.address = base
            for offset in range(0, nbytes, block_bytes):
                handle = call("cuMemCreate", block_bytes, prop, 0)
                alloc.undo.append(lambda h=handle: call("cuMemRelease", h))
                alloc.blocks.append((offset, block_bytes, handle))
                call("cuMemMap", base + offset, block_bytes, 0, handle, 0)
                alloc.undo.append(lambda o=offset: call("cuMemUnmap", base + o, block_bytes))
            access = driver.CUmemAccessDesc()
            access.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            access.location.id = device_ordinal
            access.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            call("cuMemSetAccess", base, nbytes, [access], 1)
        except BaseException:
            alloc.free()
            raise
        return self.adopt(alloc)


def vmm_properties(device_ordinal: int, fabric: bool = False, posix_fd: bool = False):
    """CUmemAllocationProp for pinned device memory on `device_ordinal` (with a fabric handle type
    when `fabric`, else a POSIX file descriptor handle type when `posix_fd`)."""
    driver = cu()
    prop = driver.CUmemAllocationProp()
    prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device_ordinal
    if fabric:
        prop.requestedHandleTypes = driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC
    elif posix_fd:
        prop.requestedHandleTypes = driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    return prop


def vmm_granularity_bytes(device_ordinal: int) -> int:
    """Minimum VMM allocation granularity of the device (2 MiB on H200)."""
    driver = cu()
    return int(call("cuMemGetAllocationGranularity", vmm_properties(device_ordinal),
                    driver.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
