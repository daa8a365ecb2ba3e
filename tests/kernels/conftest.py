"""Fixtures shared by the kernel GPU tests: one `Gpu` per module (tests/kernels/gpu_helpers.py), a
guard-checking `dev` per test, and the gemv module's kernels and the SM count."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="module")
def gpu():
    from tests.kernels.gpu_helpers import Gpu

    g = Gpu()
    yield g
    g.free_all()


@pytest.fixture
def dev(gpu):
    """The Gpu; after the test every buffer's guards must be intact, then all buffers are freed."""
    yield gpu
    try:
        gpu.check_all_guards()
    finally:
        gpu.free_all()


@pytest.fixture(scope="module")
def kernels(gpu) -> dict[str, Any]:
    """The gemv module's entries (the committed cubin, or built from source with KERN_GEMV_FROM_SOURCE=1)."""
    from tests.kernels.gemv_gpu_helpers import gemv_kernels

    found, origin = gemv_kernels(gpu)
    print(f"gemv cubin: {origin}")
    return found


@pytest.fixture(scope="module")
def sms(gpu) -> int:
    from tests.kernels.gemv_gpu_helpers import sm_count

    return sm_count(gpu)
