"""Minimal, self-contained CUDA driver helpers for the kernel tests and bench (cuda.bindings + numpy only;
deliberately independent of kern_runtime).

* `Gpu()`: primary context on device 0.
* `Gpu.kernel(entry)`: loads the built cubin named by kernels/kernels.json (cuModuleLoadData on its bytes,
  after checking its sha256) and returns a `Kernel` that stages parameters by the [offset, size] ABI
  recorded there.
* `Gpu.alloc(nbytes)`: a `DeviceBuffer` with poisoned guard regions (0xFF bytes) before and after, so an
  out-of-bounds write is detected by `check_guards()`.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import struct
import sys
from pathlib import Path

import numpy as np
from cuda.bindings import driver as cu

REPO_ROOT = Path(__file__).resolve().parents[2]
KERNELS_DIR = REPO_ROOT / "kernels"
GUARD_BYTES = 4096
POISON = 0xFF

# Parameter kinds: pointer, int32, float32, int64.
_PACK = {"p": "<Q", "i": "<i", "f": "<f", "q": "<q"}


class CudaError(RuntimeError):
    pass


def check(result, what: str):
    """Unwrap a cuda.bindings result tuple, raising CudaError with the call name and error name."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        raise CudaError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name} ({int(err)})")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


class DeviceBuffer:
    """nbytes of device memory with GUARD_BYTES of poison on each side."""

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        self._total = self.nbytes + 2 * GUARD_BYTES
        self._base = int(check(cu.cuMemAlloc(self._total), f"cuMemAlloc({self._total})"))
        self.ptr = self._base + GUARD_BYTES
        self.poison_all()

    def poison_all(self) -> None:
        check(cu.cuMemsetD8(self._base, POISON, self._total), "cuMemsetD8")

    def poison(self) -> None:
        """Poison the data region (0xFF bytes: NaN for bf16/f32, -1 for ints)."""
        if self.nbytes:
            check(cu.cuMemsetD8(self.ptr, POISON, self.nbytes), "cuMemsetD8")

    def upload(self, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array)
        assert data.nbytes <= self.nbytes, (data.nbytes, self.nbytes)
        if data.nbytes:
            check(cu.cuMemcpyHtoD(self.ptr, data, data.nbytes), "cuMemcpyHtoD")

    def download(self, dtype, shape) -> np.ndarray:
        out = np.empty(shape, dtype=dtype)
        assert out.nbytes <= self.nbytes, (out.nbytes, self.nbytes)
        if out.nbytes:
            check(cu.cuMemcpyDtoH(out, self.ptr, out.nbytes), "cuMemcpyDtoH")
        return out

    def check_guards(self, name: str = "buffer") -> None:
        """Raise AssertionError if any byte of either guard region changed."""
        for label, addr in (("before", self._base), ("after", self.ptr + self.nbytes)):
            guard = np.empty(GUARD_BYTES, dtype=np.uint8)
            check(cu.cuMemcpyDtoH(guard, addr, GUARD_BYTES), "cuMemcpyDtoH(guard)")
            bad = np.flatnonzero(guard != POISON)
            if bad.size:
                raise AssertionError(f"{name}: {bad.size} guard bytes {label} the data were overwritten (first at {bad[0]})")

    def free(self) -> None:
        if self._base:
            check(cu.cuMemFree(self._base), "cuMemFree")
            self._base = 0


class Kernel:
    def __init__(self, name: str, func, params: list[list[int]]):
        self.name = name
        self.func = func
        self.params = params

    def launch(self, grid, block, args: list[tuple[str, object]], stream=0, sync: bool = True,
               shared_mem: int = 0) -> None:
        """args: (kind, value) per parameter, kind in p/i/f/q; checked against the recorded ABI sizes.
        shared_mem: dynamic shared memory bytes (over 48 KiB raises the function's limit first)."""
        if len(args) != len(self.params):
            raise AssertionError(f"{self.name}: {len(args)} args, ABI has {len(self.params)} params")
        holders = []
        for index, ((kind, value), (_, size)) in enumerate(zip(args, self.params)):
            raw = struct.pack(_PACK[kind], int(value) if kind in "piq" else float(value))
            if len(raw) != size:
                raise AssertionError(f"{self.name}: param {index} is {size} bytes in the cubin, given {kind!r}")
            holders.append(ctypes.create_string_buffer(raw, len(raw)))
        ptrs = (ctypes.c_void_p * max(1, len(holders)))(*[ctypes.addressof(h) for h in holders])
        gx, gy, gz = (tuple(grid) + (1, 1))[:3]
        bx, by, bz = (tuple(block) + (1, 1))[:3]
        static = check(cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, self.func),
                       "cuFuncGetAttribute") if shared_mem else 0
        if shared_mem + static > 48 * 1024:  # the default limit bounds static + dynamic together
            attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(cu.cuFuncSetAttribute(self.func, attr, shared_mem), f"cuFuncSetAttribute({self.name})")
            carveout = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
            check(cu.cuFuncSetAttribute(self.func, carveout, 100), f"cuFuncSetAttribute({self.name}, carveout)")
        check(
            cu.cuLaunchKernel(self.func, gx, gy, gz, bx, by, bz, shared_mem, stream, ctypes.addressof(ptrs), 0),
            f"cuLaunchKernel({self.name}, grid={grid}, block={block})",
        )
        if sync:
            check(cu.cuCtxSynchronize(), f"cuCtxSynchronize after {self.name}")


def open_gpu(device: int = 0) -> "Gpu":
    """`Gpu(device)` for a benchmark script, or exit 3 with one line on stderr when there is no usable CUDA
    device or driver (the traceback would say nothing more)."""
    try:
        return Gpu(device)
    except Exception as exc:  # no libcuda (cuda.pathfinder's DynamicLibNotFoundError), cuInit failing, no device
        print(f"no CUDA device: {type(exc).__name__}: {exc}; this benchmark needs an NVIDIA GPU and driver",
              file=sys.stderr)
        raise SystemExit(3) from None


class Gpu:
    def __init__(self, device: int = 0):
        check(cu.cuInit(0), "cuInit")
        self.device = check(cu.cuDeviceGet(device), "cuDeviceGet")
        self.context = check(cu.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        check(cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        self.meta = json.loads((KERNELS_DIR / "kernels.json").read_text())
        self._modules: dict[str, object] = {}
        self._buffers: list[DeviceBuffer] = []

    def _module(self, module: str):
        if module not in self._modules:
            info = self.meta["modules"][module]
            image = (KERNELS_DIR / info["file"]).read_bytes()
            digest = hashlib.sha256(image).hexdigest()
            assert digest == info["sha256"], f"{info['file']}: sha256 {digest} != kernels.json {info['sha256']}"
            self._modules[module] = check(cu.cuModuleLoadData(image), f"cuModuleLoadData({info['file']})")
        return self._modules[module]

    def kernel(self, entry: str) -> Kernel:
        for module, info in self.meta["modules"].items():
            if entry in info["entries"]:
                func = check(cu.cuModuleGetFunction(self._module(module), entry.encode()), f"cuModuleGetFunction({entry})")
                return Kernel(entry, func, info["entries"][entry]["params"])
        raise KeyError(f"{entry} not in kernels/kernels.json")

    def probe_kernels(self, module: str, defines: list[str] | tuple[str, ...], entries,
                      work: Path) -> dict[str, Kernel]:
        """`entries` of kernels-src/<module>.cu compiled into `work` with the build's flags and -D for each of
        `defines` (tools/build_kernels.compile_probe: a timing or test variant), loaded into this context, each with
        the committed entry's params (kernels.json: a -D probe keeps the ABI). Raises KeyError for an entry
        kernels.json lacks, subprocess.CalledProcessError when nvcc fails."""
        from tools.build_kernels import compile_probe

        image = compile_probe(module, tuple(defines), work).read_bytes()
        loaded = check(cu.cuModuleLoadData(image), f"cuModuleLoadData({module} {' '.join(defines)})")
        params = {name: rec["params"] for info in self.meta["modules"].values()
                  for name, rec in info["entries"].items()}
        return {e: Kernel(e, check(cu.cuModuleGetFunction(loaded, e.encode()), f"cuModuleGetFunction({e})"), params[e])
                for e in entries}

    def alloc(self, nbytes: int) -> DeviceBuffer:
        buf = DeviceBuffer(nbytes)
        self._buffers.append(buf)
        return buf

    def array(self, data: np.ndarray) -> DeviceBuffer:
        buf = self.alloc(max(1, np.asarray(data).nbytes))
        buf.upload(data)
        return buf

    def check_all_guards(self) -> None:
        for i, buf in enumerate(self._buffers):
            buf.check_guards(f"buffer #{i} ({buf.nbytes} bytes)")

    def free_all(self) -> None:
        for buf in self._buffers:
            buf.free()
        self._buffers.clear()
