"""launch_params.py over host memory laid out as the driver passes it: kernelParams, extra, CUlaunchConfig."""

from __future__ import annotations

import ctypes

import pytest

from kern_run.harvest.launch_params import LaunchAttribute, LaunchConfig, read_config, read_params

LAYOUT = ((0, 8), (8, 4), (16, 8))


def test_kernel_params_are_assembled_at_their_offsets() -> None:
    a, b, c = ctypes.c_uint64(0x7F0012345678), ctypes.c_int32(-5), ctypes.c_uint64(42)
    array = (ctypes.c_void_p * 3)(ctypes.addressof(a), ctypes.addressof(b), ctypes.addressof(c))
    data = read_params(ctypes.addressof(array), 0, LAYOUT)
    assert data == (0x7F0012345678).to_bytes(8, "little") + (-5).to_bytes(4, "little", signed=True) + b"\0" * 4 + \
        (42).to_bytes(8, "little")


def test_extra_buffer() -> None:
    buf = (ctypes.c_uint8 * 24)(*range(24))
    size = ctypes.c_size_t(24)
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(buf), 2, ctypes.addressof(size), 0)
    assert read_params(0, ctypes.addressof(extra), LAYOUT) == bytes(range(24))
    size.value = 16
    with pytest.raises(ValueError, match="holds 16 bytes, the layout needs 24"):
        read_params(0, ctypes.addressof(extra), LAYOUT)
    with pytest.raises(ValueError, match="neither kernelParams nor extra"):
        read_params(0, 0, LAYOUT)
    assert read_params(0, 0, ()) == b""


def test_launch_config() -> None:
    config = LaunchConfig(7, 2, 1, 128, 1, 1, 49152, None, None, 0)
    assert ctypes.sizeof(LaunchConfig) == 56 and LaunchConfig.hStream.offset == 32  # cuda.h's layout
    assert read_config(ctypes.addressof(config)) == ((7, 2, 1), (128, 1, 1), 49152)


def _config(*attrs: tuple[int, tuple[int, ...]]) -> tuple[LaunchConfig, object]:
    table = (LaunchAttribute * max(len(attrs), 1))()
    for k, (ident, value) in enumerate(attrs):
        table[k].id = ident
        for n, v in enumerate(value):
            table[k].value[n] = v
    return LaunchConfig(1, 1, 1, 32, 1, 1, 0, None, ctypes.addressof(table), len(attrs)), table


def test_attributes_a_replay_can_drop_are_accepted() -> None:
    assert ctypes.sizeof(LaunchAttribute) == 72  # cuda.h: id, pad to 8, a 64-byte union
    config, keep = _config((4, (1, 1, 1)), (5, (1,)), (6, (1,)), (2, (0,)))
    assert read_config(ctypes.addressof(config)) == ((1, 1, 1), (32, 1, 1), 0)


@pytest.mark.parametrize(("attr", "what"), [((4, (2, 1, 1)), "a 2x1x1 cluster"), ((2, (1,)), "a cooperative grid"),
                                            ((1, (0,)), "launch attribute 1")])
def test_attributes_that_change_the_launch_are_refused(attr: tuple[int, tuple[int, ...]], what: str) -> None:
    config, keep = _config((5, (0,)), attr)
    with pytest.raises(ValueError, match=f"a cuLaunchKernelEx with {what}: not recorded"):
        read_config(ctypes.addressof(config))
