"""What the small-M MMA tests and bench need (kernels-src/gemv_mma.cu, docs/kernels-gemv.md "Small-M MMA entries"):
the entries, launches with a thread-block cluster (cuLaunchKernelEx), and the builder's launch geometry.

``mma_kernels(gpu)`` takes the entries from the built cubin listed in kernels/kernels.json (module ``gemv_mma``,
via ``Gpu.kernel``); when that file does not list the module yet, or ``KERN_MMA_FROM_SOURCE=1``, it compiles
kernels-src/gemv_mma.cu here with the build tool's flags (nvcc on PATH), ``KERN_MMA_DEFINES="KERN_MMA_UNROLL=4"``
adding -D flags, and uses the parameter layouts below. Arguments are staged as in gemv_gpu_helpers.launch:
``(kind, value)`` per parameter, ``p`` pointer, ``i`` int32, ``f`` float32.
"""

from __future__ import annotations

import ctypes
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda.bindings import driver as cu
from kern_run.models.qwen3.mma import MMA_THREADS, MMA_TILES, mma_geometry
from tests.kernels.gemv_gpu_helpers import NVCC_FLAGS, _layout
from tests.kernels.gpu_helpers import Gpu, Kernel, check

REPO_ROOT = Path(__file__).resolve().parents[2]
KINDS = ("rmsnorm", "residual", "rmsnorm_swiglu")


def entry(kind: str, tile: int) -> str:
    return f"kern_mma_{kind}_m{tile}"


# (w, src, [norm_w,] out, m, n, k[, eps]) per entry
MMA_PARAMS: dict[str, list[list[int]]] = {
    entry(kind, tile): (_layout(8, 8, 8, 4, 4, 4) if kind == "residual" else _layout(8, 8, 8, 8, 4, 4, 4, 4))
    for kind in KINDS for tile in MMA_TILES
}

_PACK = {"p": "<Q", "i": "<i", "f": "<f"}


def compile_mma(out_dir: Path, defines: tuple[str, ...] = ()) -> Path:
    """nvcc kernels-src/gemv_mma.cu -> out_dir/gemv_mma[-defines].cubin (tools/build_kernels.compile_probe)."""
    from tools.build_kernels import compile_probe

    return compile_probe("gemv_mma", defines, out_dir)


def mma_kernels(gpu: Gpu, defines: tuple[str, ...] | None = None) -> tuple[dict[str, Kernel], str]:
    """(entry name -> Kernel, where the cubin came from); see the module docstring for the order. `defines`
    (e.g. ("KERN_MMA_UNROLL=8",)) compiles the source with those -D flags instead of KERN_MMA_DEFINES."""
    if defines is None:
        defines = tuple(os.environ.get("KERN_MMA_DEFINES", "").split())
    if "gemv_mma" in gpu.meta["modules"] and os.environ.get("KERN_MMA_FROM_SOURCE") != "1" and not defines:
        return {name: gpu.kernel(name) for name in MMA_PARAMS}, "kernels/" + gpu.meta["modules"]["gemv_mma"]["file"]
    with tempfile.TemporaryDirectory() as tmp:
        image = compile_mma(Path(tmp), defines).read_bytes()
    module = check(cu.cuModuleLoadData(image), "cuModuleLoadData(gemv_mma)")
    found = {name: Kernel(name, check(cu.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})"),
                          params) for name, params in MMA_PARAMS.items()}
    return found, f"kernels-src/gemv_mma.cu compiled here {' '.join(NVCC_FLAGS)} {' '.join(defines)}"


@dataclass(frozen=True)
class MmaLaunch:
    """grid blocks (a multiple of cluster), cluster blocks per cluster, block threads, dynamic shared bytes."""

    grid: int
    cluster: int
    smem_bytes: int
    block: int = MMA_THREADS


def builder_launch(kind: str, rows: int, k: int, tile: int, sms: int) -> MmaLaunch:
    """The launch kern_run.models.qwen3.mma gives the `tile` entry of a projection with `rows` outputs per row."""
    geo = mma_geometry(rows, k, sms, swiglu=kind == "rmsnorm_swiglu")
    return MmaLaunch(geo.grid, geo.cluster, geo.shared_mem(k, tile))


def launch(kernel: Kernel, shape: MmaLaunch, args: list[tuple[str, Any]], stream: Any = 0, pdl: bool = False) -> None:
    """Launch `kernel` (1-D grid in clusters of shape.cluster blocks, through cuLaunchKernelEx) on `stream`, no sync;
    `pdl`: with programmatic stream serialization."""
    if len(args) != len(kernel.params):
        raise AssertionError(f"{kernel.name}: {len(args)} args, ABI has {len(kernel.params)} params")
    holders = []
    for index, ((kind, value), (_, size)) in enumerate(zip(args, kernel.params)):
        raw = struct.pack(_PACK[kind], int(value) if kind in "pi" else float(value))
        if len(raw) != size:
            raise AssertionError(f"{kernel.name}: param {index} is {size} bytes in the cubin, given {kind!r}")
        holders.append(ctypes.create_string_buffer(raw, len(raw)))
    pointers = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
    what = f"{kernel.name} grid={shape.grid} cluster={shape.cluster} block={shape.block} smem={shape.smem_bytes}"
    attr_id = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    check(cu.cuFuncSetAttribute(kernel.func, attr_id, max(shape.smem_bytes, 48 * 1024)), f"cuFuncSetAttribute({what})")
    carveout = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT  # as the manifests' 100
    check(cu.cuFuncSetAttribute(kernel.func, carveout, 100), f"cuFuncSetAttribute({what}, carveout)")
    attrs = []
    cluster = cu.CUlaunchAttribute()
    cluster.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    cluster.value.clusterDim.x, cluster.value.clusterDim.y, cluster.value.clusterDim.z = shape.cluster, 1, 1
    attrs.append(cluster)
    if pdl:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        attrs.append(attr)
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = shape.grid, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = shape.block, 1, 1
    config.sharedMemBytes = shape.smem_bytes
    config.hStream = stream
    config.attrs = attrs
    config.numAttrs = len(attrs)
    check(cu.cuLaunchKernelEx(config, kernel.func, ctypes.addressof(pointers), 0), f"cuLaunchKernelEx({what})")


def max_active_clusters(kernel: Kernel, shape: MmaLaunch) -> int:
    """cuOccupancyMaxActiveClusters of `kernel` at `shape` (the clusters the GPU runs at once)."""
    attr_id = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    check(cu.cuFuncSetAttribute(kernel.func, attr_id, max(shape.smem_bytes, 48 * 1024)), "cuFuncSetAttribute")
    cluster = cu.CUlaunchAttribute()
    cluster.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    cluster.value.clusterDim.x, cluster.value.clusterDim.y, cluster.value.clusterDim.z = shape.cluster, 1, 1
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = shape.grid, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = shape.block, 1, 1
    config.sharedMemBytes = shape.smem_bytes
    config.attrs = [cluster]
    config.numAttrs = 1
    return int(check(cu.cuOccupancyMaxActiveClusters(kernel.func, config), "cuOccupancyMaxActiveClusters"))
