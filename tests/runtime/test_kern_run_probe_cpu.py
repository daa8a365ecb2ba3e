"""`kern run --gpu 99` past the driver on a CPU machine: the device probe (kern_run.preflight.probe_device) against
the fake driver's device count is one line naming the ordinal and the devices there are, for any ordinal."""

from __future__ import annotations

import pytest

from fake_cuda import FakeDriver, fake_cuda  # noqa: F401 - the fixture
from kern_run.errors import NoDeviceError
from kern_run.preflight import probe_device


@pytest.mark.parametrize("gpu", [99, 2**70, 1])
def test_an_ordinal_past_the_devices_is_one_line(fake_cuda: FakeDriver, gpu: int) -> None:
    fake_cuda.device_count = 1
    with pytest.raises(NoDeviceError) as err:
        probe_device(gpu)
    assert str(err.value) == f"--gpu {gpu} but 1 CUDA device(s) are visible: pass --gpu 0..0"
    assert err.value.exit_code == 3


def test_an_ordinal_inside_the_devices_passes(fake_cuda: FakeDriver) -> None:
    fake_cuda.device_count = 8
    assert probe_device(7) == 8
    fake_cuda.device_count = 0
    with pytest.raises(NoDeviceError, match="no CUDA device visible"):
        probe_device(0)
