"""Reading a launch's arguments out of the driver call's own memory (the capture's CUPTI callbacks).

Pure ctypes over addresses the driver hands the callback, so tests exercise it on host memory:

- `kernelParams` (`void**`): entry i points at parameter i's bytes; with the layout from `cuFuncGetParamInfo`
  (offset, size per parameter) the parameter buffer is assembled as the kernel sees it;
- `extra` (`void**`, key/value pairs ending with `CU_LAUNCH_PARAM_END`): `CU_LAUNCH_PARAM_BUFFER_POINTER` and
  `CU_LAUNCH_PARAM_BUFFER_SIZE` give the buffer whole (cuda.h);
- `CUlaunchConfig` (`cuLaunchKernelEx`): grid, block, dynamic shared memory; the struct of cuda.h, whose seven
  `unsigned int`s come first;
- the structs CUPTI passes as a driver callback's `functionParams` (cupti's generated_cuda_meta.h:
  `cuLaunchKernel_params`, ...: the call's arguments in order, a pointer argument as the address it holds) and the
  resource callback's `CUpti_ModuleResourceData` (cupti_callbacks.h). cupti-python 13.4 has classes for them too;
  reading them here keeps the capture working with cupti-python releases that do not (13.0 to 13.3), and the
  layouts were checked against cupti-python 13.4's classes over the same bytes.
"""

from __future__ import annotations

import ctypes
import struct

CU_LAUNCH_PARAM_END = 0x00
CU_LAUNCH_PARAM_BUFFER_POINTER = 0x01
CU_LAUNCH_PARAM_BUFFER_SIZE = 0x02
MAX_EXTRA_PAIRS = 64

Layout = tuple[tuple[int, int], ...]


class LaunchConfig(ctypes.Structure):
    """cuda.h `CUlaunchConfig` (CUDA 12+)."""

    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
                ("numAttrs", ctypes.c_uint)]


class LaunchKernelParams(ctypes.Structure):
    """`cuLaunchKernel_params` (also `cuLaunchKernel_ptsz_params`)."""

    _fields_ = [("f", ctypes.c_void_p), ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint),
                ("blockDimZ", ctypes.c_uint), ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("kernelParams", ctypes.c_void_p), ("extra", ctypes.c_void_p)]


class LaunchKernelExParams(ctypes.Structure):
    """`cuLaunchKernelEx_params` (also `_ptsz`): `const CUlaunchConfig *config; CUfunction f; void **kernelParams;
    void **extra`."""

    _fields_ = [("config", ctypes.c_void_p), ("f", ctypes.c_void_p), ("kernelParams", ctypes.c_void_p),
                ("extra", ctypes.c_void_p)]


class OutInParams(ctypes.Structure):
    """The first two fields of the params struct of every load and handle lookup the recorder watches: `OUT *out;
    IN in` (further fields follow). `cuModuleLoadData(Ex)_params`: `CUmodule *module; const void *image`;
    `cuModuleLoad_params`: `CUmodule *module; const char *fname`; `cuModuleGetFunction_params`: `CUfunction
    *hfunc; CUmodule hmod`; likewise cuLibraryLoadData, cuLibraryGetKernel, cuKernelGetFunction, cuLibraryGetModule
    (cuda.h / generated_cuda_meta.h)."""

    _fields_ = [("out", ctypes.c_void_p), ("given", ctypes.c_void_p)]


class MemAllocParams(ctypes.Structure):
    """`cuMemAlloc_v2_params`: `CUdeviceptr *dptr; size_t bytesize` (also cudaMalloc's `void **devPtr; size_t`)."""

    _fields_ = [("dptr", ctypes.c_void_p), ("bytesize", ctypes.c_size_t)]


class MemFreeParams(ctypes.Structure):
    """`cuMemFree_v2_params`: `CUdeviceptr dptr` (also cudaFree's `void *devPtr`)."""

    _fields_ = [("dptr", ctypes.c_uint64)]


class ModuleResourceData(ctypes.Structure):
    """`CUpti_ModuleResourceData`: `uint32_t moduleId; size_t cubinSize; const char *pCubin`."""

    _fields_ = [("moduleId", ctypes.c_uint32), ("cubinSize", ctypes.c_size_t), ("pCubin", ctypes.c_void_p)]


ELF_IMAGE_MAX = 1 << 30  # the largest in-memory ELF image read_elf_image accepts (bytes)


def read_elf_image(address: int) -> bytes | None:
    """The ELF64 image (a cubin) whose header starts at `address`, as `cuModuleLoadData(module, image)` is handed
    it without a size: its length is the furthest of the section header table, the program header table and every
    section with file bytes (System V ABI, ELF-64 header and section header layouts). None when `address` is 0 or
    holds no little-endian ELF64 header (a fatbin or PTX), or the extent is past ELF_IMAGE_MAX."""
    if not address:
        return None
    head = ctypes.string_at(address, 64)
    if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
    phoff, shoff = struct.unpack_from("<QQ", head, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 0x36)
    end = max(64, phoff + phentsize * phnum, shoff + shentsize * shnum)
    if end > ELF_IMAGE_MAX or (shnum and shentsize < 64):
        return None
    table = ctypes.string_at(address + shoff, shentsize * shnum) if shnum else b""
    for i in range(shnum):
        sh_type, = struct.unpack_from("<I", table, i * shentsize + 4)
        offset, size = struct.unpack_from("<QQ", table, i * shentsize + 0x18)
        if sh_type != 8:  # SHT_NOBITS holds no file bytes
            end = max(end, offset + size)
    return ctypes.string_at(address, end) if end <= ELF_IMAGE_MAX else None


def read_u64(address: int) -> int:
    """The 8-byte value at `address` (an output argument the call has filled: a CUmodule, a device pointer)."""
    return ctypes.c_uint64.from_address(address).value


class LaunchAttribute(ctypes.Structure):
    """cuda.h `CUlaunchAttribute`: a 4-byte id, 4 bytes of padding, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_uint8 * 4), ("value", ctypes.c_uint32 * 16)]


ATTR_COOPERATIVE = 2
ATTR_CLUSTER_DIMENSION = 4
ATTR_CLUSTER_SCHEDULING_POLICY = 5
ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6
MAX_ATTRS = 64


def _attribute_fault(attr: LaunchAttribute) -> str | None:
    """None for an attribute a replay without it runs the same: a 1x1x1 cluster, a cluster scheduling preference, a
    cooperative flag of 0, and programmatic dependent launch (griddepcontrol waits without it are no-ops, so
    dropping it costs overlap, never correctness); else what it is."""
    first = attr.value[0]
    if attr.id == ATTR_CLUSTER_DIMENSION and tuple(attr.value[:3]) == (1, 1, 1):
        return None
    if attr.id in (ATTR_CLUSTER_SCHEDULING_POLICY, ATTR_PROGRAMMATIC_STREAM_SERIALIZATION):
        return None
    if attr.id == ATTR_COOPERATIVE and first == 0:
        return None
    if attr.id == ATTR_CLUSTER_DIMENSION:
        return f"a {attr.value[0]}x{attr.value[1]}x{attr.value[2]} cluster"
    return "a cooperative grid" if attr.id == ATTR_COOPERATIVE else f"launch attribute {attr.id}"


def read_config(address: int) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    """(grid, block, dynamic shared memory bytes) of the `CUlaunchConfig` at `address`. Raises ValueError for a
    launch attribute a replay without it would not run the same (`_attribute_fault`: clusters other than 1x1x1,
    cooperative grids, any other attribute): the capture format records none."""
    c = LaunchConfig.from_address(address)
    if c.numAttrs > MAX_ATTRS or (c.numAttrs and not c.attrs):
        raise ValueError(f"a CUlaunchConfig with {c.numAttrs} launch attributes at 0x{c.attrs or 0:x}")
    attrs = (LaunchAttribute * c.numAttrs).from_address(c.attrs) if c.numAttrs else ()
    faults = [f for f in map(_attribute_fault, attrs) if f]
    if faults:
        raise ValueError(f"a cuLaunchKernelEx with {', '.join(faults)}: not recorded by the capture format")
    return (c.gridDimX, c.gridDimY, c.gridDimZ), (c.blockDimX, c.blockDimY, c.blockDimZ), c.sharedMemBytes


def read_params(kernel_params: int, extra: int, layout: Layout) -> bytes:
    """The parameter buffer of a launch (parameter i at its offset, gaps zero), from `kernelParams` when it is
    not null, else from `extra`'s buffer. Raises ValueError when neither gives it (both null, an `extra` without
    a buffer, or a buffer smaller than the layout)."""
    end = max((o + s for o, s in layout), default=0)
    if kernel_params:
        pointers = (ctypes.c_void_p * len(layout)).from_address(kernel_params)
        buf = bytearray(end)
        for i, (offset, size) in enumerate(layout):
            if pointers[i] is None:
                raise ValueError(f"kernelParams[{i}] is a null pointer")
            buf[offset:offset + size] = ctypes.string_at(pointers[i], size)
        return bytes(buf)
    if not extra:
        if end:
            raise ValueError("a launch with parameters but neither kernelParams nor extra")
        return b""
    words = (ctypes.c_void_p * (2 * MAX_EXTRA_PAIRS + 1)).from_address(extra)
    pointer = size = None
    for i in range(MAX_EXTRA_PAIRS):
        key = words[2 * i] or 0
        if key == CU_LAUNCH_PARAM_END:
            break
        value = words[2 * i + 1] or 0
        if key == CU_LAUNCH_PARAM_BUFFER_POINTER:
            pointer = value
        elif key == CU_LAUNCH_PARAM_BUFFER_SIZE:
            size = ctypes.c_size_t.from_address(value).value
    else:
        raise ValueError(f"extra has no CU_LAUNCH_PARAM_END within {MAX_EXTRA_PAIRS} pairs")
    if not pointer or size is None:
        raise ValueError("extra names no parameter buffer (CU_LAUNCH_PARAM_BUFFER_POINTER and _SIZE)")
    if size < end:
        raise ValueError(f"extra's parameter buffer holds {size} bytes, the layout needs {end}")
    return ctypes.string_at(pointer, end)
