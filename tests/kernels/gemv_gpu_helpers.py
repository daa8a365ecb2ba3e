"""What the gemv tests and bench need beyond tests/kernels/gpu_helpers.py: dynamic shared memory, a
stream, and programmatic dependent launch (PDL).

``gpu_helpers.Kernel.launch`` passes no dynamic shared memory and launches on the legacy stream; every
GEMV entry needs ``16 * ceil(k / 8)`` bytes of it, and the PDL check needs ``cuLaunchKernelEx``. Arguments
are staged exactly as there: ``(kind, value)`` per parameter, kind ``p`` (8-byte pointer), ``i`` (int32),
``f`` (float32), checked against the parameter sizes recorded for the entry.

``gemv_kernels(gpu)`` takes the entries from the built cubin listed in kernels/kernels.json (module
``gemv``, via ``Gpu.kernel``); when that file does not list the module yet, or ``KERN_GEMV_FROM_SOURCE=1``,
it compiles kernels-src/gemv.cu here with the build tool's flags (nvcc on PATH) and uses the parameter
layout of the signatures below. ``KERN_GEMV_DEFINES="KERN_GEMV_UNROLL=4 ..."`` adds -D flags to that
compile (the bench's variants).
"""

from __future__ import annotations

import ctypes
import os
import struct
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
from cuda.bindings import driver as cu
from tests.kernels.gpu_helpers import Gpu, Kernel, check
from tools.reference_kernels import from_bf16_bits

REPO_ROOT = Path(__file__).resolve().parents[2]
NVCC_FLAGS = ("-cubin", "-arch=sm_90", "-O3", "-std=c++17")  # tools/build_kernels.py FLAGS

def _layout(*sizes: int) -> list[list[int]]:
    """[offset, size] per parameter for naturally aligned parameters in order."""
    out, offset = [], 0
    for size in sizes:
        offset = -(-offset // size) * size
        out.append([offset, size])
        offset += size
    return out


# Parameter layouts of the entries (docs/kernels-gemv.md), for a cubin compiled here.
GEMV_PARAMS: dict[str, list[list[int]]] = {
    "kern_gemv": _layout(8, 8, 8, 4, 4),  # w, x, y, n, k
    "kern_gemv_rmsnorm": _layout(8, 8, 8, 8, 4, 4, 4),  # w, residual, norm_w, y, n, k, eps
    "kern_gemv_residual": _layout(8, 8, 8, 4, 4),  # w, x, residual, n, k
    "kern_gemv_silu_residual": _layout(8, 8, 8, 4, 4),  # w, gate_up, residual, n, k
    # rows family (docs/kernels-gemv.md "Rows entries")
    "kern_gemv_rows": _layout(8, 8, 8, 4, 4),  # w, x, y, n, k
    "kern_gemv_rows_rmsnorm": _layout(8, 8, 8, 8, 4, 4, 4),  # w, residual, norm_w, y, n, k, eps
    "kern_gemv_rows_residual": _layout(8, 8, 8, 4, 4),  # w, x, residual, n, k
    "kern_gemv_rmsnorm_swiglu": _layout(8, 8, 8, 8, 4, 4, 4),  # w_gate_up, residual, norm_w, act, inter, k, eps
    # multi-row rows family (docs/kernels-gemv.md "Multi-row rows entries"): the M = 1 arguments, then i32 m
    **{f"kern_gemv_rows_rmsnorm_m{t}": _layout(8, 8, 8, 8, 4, 4, 4, 4) for t in (2, 4, 8)},
    **{f"kern_gemv_rows_residual_m{t}": _layout(8, 8, 8, 4, 4, 4) for t in (2, 4, 8)},
    **{f"kern_gemv_rmsnorm_swiglu_m{t}": _layout(8, 8, 8, 8, 4, 4, 4, 4) for t in (2, 4, 8)},
    # multi-row v1 RMSNorm entry (the lm_head's): w, residual [m, k], norm_w, y [m, n], n, k, eps, m
    **{f"kern_gemv_rmsnorm_m{t}": _layout(8, 8, 8, 8, 4, 4, 4, 4) for t in (2, 4, 8)},
}

_PACK = {"p": "<Q", "i": "<i", "f": "<f", "q": "<q"}


def compile_gemv(out_dir: Path, defines: tuple[str, ...] = ()) -> Path:
    """nvcc kernels-src/gemv.cu -> out_dir/gemv[-defines].cubin (tools/build_kernels.compile_probe); the path."""
    from tools.build_kernels import compile_probe

    return compile_probe("gemv", defines, out_dir)


def kernels_from_cubin(image: bytes) -> dict[str, Kernel]:
    """Load a gemv cubin (current context) and return its entries (GEMV_PARAMS) as Kernels."""
    module = check(cu.cuModuleLoadData(image), "cuModuleLoadData(gemv)")
    return {
        name: Kernel(name, check(cu.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})"), params)
        for name, params in GEMV_PARAMS.items()
    }


def gemv_kernels(gpu: Gpu) -> tuple[dict[str, Kernel], str]:
    """(entry name -> Kernel, where the cubin came from); see the module docstring for the order."""
    defines = tuple(os.environ.get("KERN_GEMV_DEFINES", "").split())
    if "gemv" in gpu.meta["modules"] and os.environ.get("KERN_GEMV_FROM_SOURCE") != "1" and not defines:
        return {name: gpu.kernel(name) for name in GEMV_PARAMS}, "kernels/" + gpu.meta["modules"]["gemv"]["file"]
    with tempfile.TemporaryDirectory() as tmp:
        image = compile_gemv(Path(tmp), defines).read_bytes()
    return kernels_from_cubin(image), f"kernels-src/gemv.cu compiled here {' '.join(NVCC_FLAGS)} {' '.join(defines)}"


def create_stream() -> Any:
    return check(cu.cuStreamCreate(0), "cuStreamCreate")


def assert_pdl_chain_matches_serial(chain: Callable[..., tuple[Any, Any]], stream: Any) -> None:
    """`chain(pdl=False)` once (its residual and qkv, uint16 bf16 bits, must be finite), then `chain(pdl=True)`
    five times, each bit for bit equal to it; destroys `stream` afterwards, also when an assertion fails."""
    try:
        serial_residual, serial_qkv = chain(pdl=False)
        assert np.isfinite(from_bf16_bits(serial_qkv)).all() and np.isfinite(from_bf16_bits(serial_residual)).all()
        for attempt in range(5):
            pdl_residual, pdl_qkv = chain(pdl=True)
            assert np.array_equal(pdl_residual, serial_residual), f"PDL chain (try {attempt}): residual != serial"
            assert np.array_equal(pdl_qkv, serial_qkv), f"PDL chain (try {attempt}): qkv != serial"
    finally:
        check(cu.cuStreamDestroy(stream), "cuStreamDestroy")


def sm_count(gpu: Gpu) -> int:
    attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    return int(check(cu.cuDeviceGetAttribute(attr, gpu.device), "cuDeviceGetAttribute(SM count)"))


def launch(
    kernel: Kernel,
    grid: int,
    block: int,
    smem_bytes: int,
    args: list[tuple[str, Any]],
    stream: Any = 0,
    pdl: bool = False,
) -> None:
    """Launch ``kernel`` on a 1-D grid with ``smem_bytes`` of dynamic shared memory on ``stream``; no sync
    (a fault surfaces at the next synchronize). ``pdl``: through cuLaunchKernelEx with the programmatic
    stream serialization attribute, so the launch may start before the previous kernel in the stream ends
    (its griddepcontrol.wait orders the reads)."""
    if len(args) != len(kernel.params):
        raise AssertionError(f"{kernel.name}: {len(args)} args, ABI has {len(kernel.params)} params")
    holders = []
    for index, ((kind, value), (_, size)) in enumerate(zip(args, kernel.params)):
        raw = struct.pack(_PACK[kind], int(value) if kind in "piq" else float(value))
        if len(raw) != size:
            raise AssertionError(f"{kernel.name}: param {index} is {size} bytes in the cubin, given {kind!r}")
        holders.append(ctypes.create_string_buffer(raw, len(raw)))
    pointers = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
    what = f"{kernel.name} grid={grid} block={block} smem={smem_bytes}"
    static = check(cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, kernel.func),
                   "cuFuncGetAttribute") if smem_bytes else 0
    # above the default limit (static + dynamic) a function must opt in, as the runtime does at load
    if smem_bytes + static > 48 * 1024:
        attr_id = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(cu.cuFuncSetAttribute(kernel.func, attr_id, smem_bytes), f"cuFuncSetAttribute({what})")
    if not pdl:
        check(
            cu.cuLaunchKernel(kernel.func, grid, 1, 1, block, 1, 1, smem_bytes, stream, ctypes.addressof(pointers), 0),
            f"cuLaunchKernel({what})",
        )
        return
    attr = cu.CUlaunchAttribute()
    attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
    config.sharedMemBytes = smem_bytes
    config.hStream = stream
    config.attrs = [attr]
    config.numAttrs = 1
    check(cu.cuLaunchKernelEx(config, kernel.func, ctypes.addressof(pointers), 0), f"cuLaunchKernelEx({what}, PDL)")
