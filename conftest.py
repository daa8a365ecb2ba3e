"""Root pytest configuration: GPU tests skip cleanly without a device, and fail when KERN_REQUIRE_GPU=1."""

from __future__ import annotations

import os

import pytest


def _cuda_device_count() -> int:
    """Number of CUDA devices the driver reports; 0 where there is no driver or no device."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return 0
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return 0
        err, count = driver.cuDeviceGetCount()
        return count if err == driver.CUresult.CUDA_SUCCESS else 0
    except Exception:  # noqa: BLE001 - no libcuda at all is "no device"
        return 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    devices = _cuda_device_count()
    if devices > 0:
        return
    if os.environ.get("KERN_REQUIRE_GPU") == "1":
        raise pytest.UsageError("KERN_REQUIRE_GPU=1 but no CUDA device is visible: GPU tests cannot pass by skipping")
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in gpu_items:
        item.add_marker(skip)
