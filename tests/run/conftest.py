"""Fixtures for kern-run's CPU tests; the helpers live in kern_run_testutil.py."""

from kern_run_testutil import (  # noqa: F401
    FakeRuntime, fake_runtime, kernels_dir, stub_device_probe, tiny_ckpt, tiny_manifest, with_device,
)
