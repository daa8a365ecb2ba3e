"""Enqueueing a patched `KernelRecord`: cuLaunchKernel, or cuLaunchKernelEx for clusters / PDL / cooperative."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .driver import call, cu

if TYPE_CHECKING:
    from ..program.records import KernelRecord


def launch_kernel(record: KernelRecord, stream: Any) -> None:
    """Enqueue `record` (already patched) on `stream`. Raises DriverError.

    A launch with a cluster or `pdl` goes through cuLaunchKernelEx; its CUlaunchConfig (dims, shared
    memory, stream, attributes) is built once and kept on the record until one of those changes, so an
    eager replay does not rebuild driver structs per launch. `pdl` sets
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 1: the kernel may start before its stream
    predecessor has finished, and must itself `griddepcontrol.wait` before touching what that predecessor
    writes (the generator only sets `pdl` on such kernels). `cooperative` sets CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 1:
    the driver launches every block at once or fails the launch (a persistent kernel's blocks wait on each other;
    the co-residency was checked at load, cuda/occupancy.py). Both attributes are captured by stream capture."""
    gx, gy, gz = record.grid
    bx, by, bz = record.block
    launch = record.launch
    if record.cluster is None and not launch.pdl and not launch.cooperative:
        call("cuLaunchKernel", record.function, gx, gy, gz, bx, by, bz, record.shared_mem_bytes, stream,
             record.params.address, 0)
        return
    key = (record.grid, record.block, record.shared_mem_bytes, record.cluster, bool(launch.pdl),
           bool(launch.cooperative), int(stream))
    cached = getattr(record, "ex_config", None)
    if cached is None or cached[0] != key:
        cached = (key, _ex_config(record, stream))
        record.ex_config = cached
    call("cuLaunchKernelEx", cached[1], record.function, record.params.address, 0)


def _ex_config(record: KernelRecord, stream: Any) -> Any:
    driver = cu()
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = record.grid
    config.blockDimX, config.blockDimY, config.blockDimZ = record.block
    config.sharedMemBytes = record.shared_mem_bytes
    config.hStream = stream
    attrs = []
    if record.cluster is not None:
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = record.cluster
        attrs.append(attr)
    if record.launch.pdl:
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        attrs.append(attr)
    if record.launch.cooperative:
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        attr.value.cooperative = 1
        attrs.append(attr)
    config.attrs = attrs
    config.numAttrs = len(attrs)
    return config
