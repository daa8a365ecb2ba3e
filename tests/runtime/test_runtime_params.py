"""Parameter staging: encodings and the u64-slot block with its pointer array."""

from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest

from kern_runtime import ApiError, ParamBlock, encode_pointer, encode_scalar


@pytest.mark.parametrize(
    ("type_name", "value", "expected"),
    [
        ("i32", -2, struct.pack("<i", -2)),
        ("u32", 2**32 - 1, b"\xff\xff\xff\xff"),
        ("i64", 2**40, struct.pack("<q", 2**40)),
        ("u64", 2**64 - 1, b"\xff" * 8),
        ("f32", 1e-6, struct.pack("<f", 1e-6)),
        ("f64", 0.5, struct.pack("<d", 0.5)),
    ],
)
def test_encode_scalar_is_little_endian(type_name: str, value, expected: bytes) -> None:
    assert encode_scalar(type_name, value) == expected


@pytest.mark.parametrize(("type_name", "value"), [("i32", 2**31), ("u32", -1), ("u64", 2**64), ("i32", 1.5)])
def test_encode_scalar_refuses_values_that_do_not_fit(type_name: str, value) -> None:
    with pytest.raises(ApiError, match=type_name):
        encode_scalar(type_name, value)


def test_encode_pointer() -> None:
    assert encode_pointer(0x7F00_0000_1000) == (0x7F00_0000_1000).to_bytes(8, "little")
    with pytest.raises(ApiError):
        encode_pointer(-1)


def test_param_block_slots_and_pointers() -> None:
    # three params: ptr (8), i32 (4), 128-byte pack -> slots 0, 1, 2..17
    block = ParamBlock([8, 4, 128])
    assert block.slots.shape == (18,)
    base = block.slots.ctypes.data
    assert list(block.pointers) == [base, base + 8, base + 16]
    block.write(0, encode_pointer(0xDEAD_BEEF))
    block.write(1, encode_scalar("i32", 7))
    block.write(2, bytes(range(128)))
    assert block.read(0) == encode_pointer(0xDEAD_BEEF)
    assert block.read(1) == encode_scalar("i32", 7)
    assert block.read(2) == bytes(range(128))
    # the void** really points at the staged bytes
    ptrs = (ctypes.c_uint64 * 3).from_address(block.address)
    assert ctypes.string_at(ptrs[1], 4) == encode_scalar("i32", 7)
    assert ctypes.string_at(ptrs[2], 128) == bytes(range(128))


def test_param_block_patch_changes_only_that_param() -> None:
    block = ParamBlock([4, 4])
    block.write(0, encode_scalar("i32", 1))
    block.write(1, encode_scalar("i32", 2))
    before = block.slots.copy()
    block.write(1, encode_scalar("i32", 3))
    assert block.read(0) == encode_scalar("i32", 1)
    assert block.slots[0] == before[0]
    assert block.read(1) == encode_scalar("i32", 3)


def test_param_block_refuses_size_mismatch() -> None:
    block = ParamBlock([4])
    with pytest.raises(ApiError, match="parameter 0: 8 bytes staged, the kernel takes 4"):
        block.write(0, bytes(8))


def test_empty_param_block_address_is_null() -> None:
    assert ParamBlock([]).address == 0
    assert np.all(ParamBlock([8]).slots == 0)
