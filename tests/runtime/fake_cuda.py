"""A fake `cuda.bindings.driver` for CPU tests of `Runtime.load` and the pool API.

Use the `fake_cuda` fixture (import it into the test module): it puts a `FakeDriver` in
`sys.modules["cuda.bindings.driver"]` for one test and restores the real module afterwards, so
`kern_runtime.cuda.driver.cu()` (which imports the module on every use) sees the fake.

What the fake does:

* device memory and pinned memory are host numpy arrays, so addresses are real host pointers and
  copies between them are `memmove`s (`mem` maps each live allocation's address to its array);
  VMM reservations hand out unbacked addresses above `VMM_BASE`, and copies touching them are skipped;
* every driver call is appended to `calls` as `(name, args)`; `fail[name] = code` makes that call
  return the CUresult `code`;
* `device_count`, `free_bytes` (what `cuMemGetInfo` reports free; total is twice that) and
  `entries` (kernel entry -> parameter layout `((offset, size), ...)`, which every loaded module
  exposes) are plain attributes to set per test;
* any other `cu*` function succeeds with no outputs; enums and types come from the real module.
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import mmap
import os
import sys
import types
from typing import Any, Iterator

import numpy as np
import pytest

real = pytest.importorskip("cuda.bindings.driver")

OK = 0
INVALID_VALUE = int(real.CUresult.CUDA_ERROR_INVALID_VALUE)
NOT_PERMITTED = int(real.CUresult.CUDA_ERROR_NOT_PERMITTED)
POSIX_FD = real.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
FABRIC = real.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC
VMM_BASE = 1 << 56
_ids = itertools.count(1000)


class Handle:
    """An opaque driver handle (context, stream, event, module, function, ...)."""

    def __init__(self, kind: str, **fields: Any) -> None:
        self.kind, self.id = kind, next(_ids)
        self.__dict__.update(fields)

    def __int__(self) -> int:
        return self.id

    def __repr__(self) -> str:
        return f"<fake {self.kind} #{self.id}>"


class FakeDriver(types.ModuleType):
    """The fake module; its state is reset per test by the fixture."""

    def __init__(self) -> None:
        super().__init__("cuda.bindings.driver")
        self.mem: dict[int, np.ndarray] = {}
        self.calls: list[tuple[str, tuple]] = []
        self.fail: dict[str, int] = {}
        self.device_count = 1
        self.free_bytes = 8 << 30
        self.entries: dict[str, tuple[tuple[int, int], ...]] = {}
        self.static_shared: dict[str, int] = {}  # entry -> static shared memory bytes (cuFuncGetAttribute)
        self.fabric_permitted = False  # cuMemCreate with a fabric handle type: NOT_PERMITTED unless True
        self.live_blocks: dict[int, Handle] = {}  # handle id -> physical block not yet released
        self._vbase = VMM_BASE

    def called(self, name: str) -> int:
        """How many times driver function `name` was called."""
        return sum(1 for c, _ in self.calls if c == name)

    def __getattr__(self, name: str) -> Any:  # only for names not set on the instance
        target = getattr(real, name)
        if name.startswith("cu") and callable(target) and not isinstance(target, type):
            return lambda *args: self._call(name, args)
        return target

    # ------------------------------------------------------------ implementation

    def _alloc(self, nbytes: int) -> int:
        array = np.zeros(max(int(nbytes), 1), np.uint8)
        self.mem[array.ctypes.data] = array
        return array.ctypes.data

    def _call(self, name: str, args: tuple) -> tuple:
        self.calls.append((name, args))
        if name in self.fail:
            return (self.fail[name],)
        handler = getattr(type(self), "_" + name, None)
        return handler(self, *args) if handler is not None else (OK,)

    def _cuDeviceGetCount(self) -> tuple:
        return (OK, self.device_count)

    def _cuDeviceGet(self, ordinal: int) -> tuple:
        if type(ordinal) is not int:  # the real binding refuses anything but an int
            raise TypeError(f"cuDeviceGet: ordinal of type {type(ordinal).__name__}")
        return (OK, Handle("device", ordinal=ordinal))

    def _cuDevicePrimaryCtxRetain(self, device: Any) -> tuple:
        return (OK, Handle("context"))

    def _cuStreamCreate(self, flags: int) -> tuple:
        return (OK, Handle("stream"))

    def _cuEventCreate(self, flags: Any) -> tuple:
        return (OK, Handle("event"))

    def _cuMemAlloc(self, nbytes: int) -> tuple:
        return (OK, self._alloc(nbytes))

    def _cuMemHostAlloc(self, nbytes: int, flags: Any) -> tuple:
        return (OK, self._alloc(nbytes))

    def _cuMemHostGetDevicePointer(self, address: int, flags: int) -> tuple:
        return (OK, address)

    def _cuMemFree(self, address: Any) -> tuple:
        self.mem.pop(int(address), None)
        return (OK,)

    _cuMemFreeHost = _cuMemFree

    def _copy(self, dst: Any, src: Any, nbytes: Any, *rest: Any) -> tuple:
        dst, src, nbytes = int(dst), int(src), int(nbytes)
        if nbytes and dst < VMM_BASE and src < VMM_BASE:
            ctypes.memmove(dst, src, nbytes)
        return (OK,)

    _cuMemcpyHtoDAsync = _cuMemcpyDtoHAsync = _cuMemcpyDtoDAsync = _copy
    _cuMemcpyHtoD = _cuMemcpyDtoH = _cuMemcpyDtoD = _copy

    def _cuMemsetD8Async(self, dst: Any, value: int, nbytes: int, stream: Any) -> tuple:
        dst = int(dst)
        if any(a <= dst and dst + nbytes <= a + arr.size for a, arr in self.mem.items()):
            ctypes.memset(dst, value, nbytes)
        return (OK,)

    def _cuMemGetInfo(self) -> tuple:
        return (OK, self.free_bytes, 2 * self.free_bytes)

    def _cuMemGetAllocationGranularity(self, prop: Any, option: Any) -> tuple:
        return (OK, 2 << 20)

    def _cuMemAddressReserve(self, nbytes: int, *rest: Any) -> tuple:
        address = self._vbase
        self._vbase += int(nbytes) + (1 << 30)
        return (OK, address)

    def _cuMemCreate(self, nbytes: int, prop: Any, flags: int) -> tuple:
        kind = prop.requestedHandleTypes
        if kind == FABRIC and not self.fabric_permitted:
            return (NOT_PERMITTED,)
        block = Handle("block", nbytes=int(nbytes), handle_type=kind, memfd=-1)
        if kind == POSIX_FD:
            block.memfd = os.memfd_create(f"fake-block-{block.id}")
            os.ftruncate(block.memfd, int(nbytes))
        self.live_blocks[block.id] = block
        return (OK, block)

    def _cuMemExportToShareableHandle(self, handle: Any, kind: Any, flags: int) -> tuple:
        if kind != POSIX_FD or getattr(handle, "handle_type", None) != POSIX_FD or handle.id not in self.live_blocks:
            return (INVALID_VALUE,)
        return (OK, os.dup(handle.memfd))

    def _cuMemImportFromShareableHandle(self, fd: Any, kind: Any) -> tuple:
        if kind != POSIX_FD or type(fd) is not int:
            return (INVALID_VALUE,)
        try:
            nbytes = os.fstat(fd).st_size
        except OSError:
            return (INVALID_VALUE,)
        block = Handle("block", nbytes=nbytes, handle_type=POSIX_FD, memfd=os.dup(fd), imported=True)
        self.live_blocks[block.id] = block
        return (OK, block)

    def _cuMemRelease(self, handle: Any) -> tuple:
        block = self.live_blocks.pop(getattr(handle, "id", -1), None)
        if block is None:
            return (INVALID_VALUE,)
        if block.memfd >= 0:
            os.close(block.memfd)
        return (OK,)

    @staticmethod
    def block_memory(handle: Any) -> mmap.mmap:
        """The bytes of a POSIX-fd block (exported or imported), as a shared mapping of its memfd."""
        return mmap.mmap(handle.memfd, handle.nbytes)

    def _cuDeviceGetAttribute(self, attribute: Any, device: Any) -> tuple:
        return (OK, (1 << 31) - 1)

    def _cuDeviceGetPCIBusId(self, length: int, device: Any) -> tuple:
        return (OK, b"0000:00:00.0\x00")

    def _cuModuleLoadData(self, image: Any) -> tuple:
        return (OK, Handle("module"))

    def _cuModuleGetFunctionCount(self, module: Any) -> tuple:
        return (OK, len(self.entries))

    def _cuModuleEnumerateFunctions(self, count: int, module: Any) -> tuple:
        return (OK, [Handle("function", entry=e) for e in self.entries])

    def _cuFuncGetName(self, function: Any) -> tuple:
        return (OK, function.entry.encode())

    def _cuFuncGetAttribute(self, attribute: Any, function: Any) -> tuple:
        return (OK, self.static_shared.get(function.entry, 0))

    def _cuFuncGetParamInfo(self, function: Any, index: int) -> tuple:
        layout = self.entries[function.entry]
        if index >= len(layout):
            return (INVALID_VALUE,)
        return (OK, *layout[index])

    def _cuStreamEndCapture(self, stream: Any) -> tuple:
        return (OK, Handle("graph"))

    def _cuGraphInstantiate(self, graph: Any, flags: int) -> tuple:
        return (OK, Handle("graph exec"))


def install(monkeypatch: pytest.MonkeyPatch, fake: FakeDriver) -> FakeDriver:
    """Install `fake` (a FakeDriver, or a test's subclass of it) as `cuda.bindings.driver` for the test."""
    import cuda.bindings

    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", fake)
    monkeypatch.setattr(cuda.bindings, "driver", fake)
    return fake


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDriver]:
    """A fresh `FakeDriver` installed as `cuda.bindings.driver` for the test's duration."""
    yield install(monkeypatch, FakeDriver())
    gc.collect()  # finalizers of dropped handles still talk to the fake, not the real driver
