"""Enqueueing a patched `KernelRecord`: cuLaunchKernel, or cuLaunchKernelEx for clusters / PDL."""

from __future__ import annotations

from typing import Any

from .driver import call, cu
from .records import KernelRecord


def launch_kernel(record: KernelRecord, stream: Any) -> None:
    """Enqueue `record` (already patched) on `stream`. Raises DriverError."""
    gx, gy, gz = record.grid
    bx, by, bz = record.block
    if record.cluster is None and not record.launch.pdl:
        call("cuLaunchKernel", record.function, gx, gy, gz, bx, by, bz, record.shared_mem_bytes, stream,
             record.params.address, 0)
        return
    driver = cu()
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
    config.blockDimX, config.blockDimY, config.blockDimZ = bx, by, bz
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
    config.attrs = attrs
    config.numAttrs = len(attrs)
    call("cuLaunchKernelEx", config, record.function, record.params.address, 0)
