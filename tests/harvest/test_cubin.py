"""cubin.py reads every committed kern cubin's kernels and parameter layouts exactly as kernels/kernels.json records
them (cuobjdump's EIATTR_KPARAM_INFO, the layouts cuFuncGetParamInfo returns), and refuses broken ELF quickly."""

from __future__ import annotations

import json
import struct
import time

import pytest

from kern_run.harvest.cubin import CubinError, cubin_entries
from tests.harvest.harvest_testkit import KERNELS

INDEX = json.loads((KERNELS / "kernels.json").read_text())["modules"]


@pytest.mark.parametrize("module", sorted(INDEX))
def test_layouts_equal_kernels_json(module: str) -> None:
    entry = INDEX[module]
    got = cubin_entries((KERNELS / entry["file"]).read_bytes())
    assert got == {name: tuple(tuple(p) for p in e["params"]) for name, e in entry["entries"].items()}


def _embed() -> bytes:
    return (KERNELS / INDEX["embed"]["file"]).read_bytes()


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda b: b"\x7fELG" + b[4:], "not an ELF file"),
    (lambda b: b[:4] + b"\x01" + b[5:], "not a 64-bit little-endian ELF"),
    (lambda b: b[:0x12] + struct.pack("<H", 62) + b[0x14:], "e_machine is 62, not 190"),
    (lambda b: b[:0x28] + struct.pack("<Q", len(b)) + b[0x30:], "section headers at byte"),
    (lambda b: b[:200], "past the end of the file"),
    (lambda b: b[:0x3C] + struct.pack("<H", 60000) + b[0x3E:], "section headers at byte"),
])
def test_broken_cubins_are_refused(mutate, message: str) -> None:
    with pytest.raises(CubinError, match=message):
        cubin_entries(mutate(_embed()))


def test_a_kparam_record_past_its_section_is_refused() -> None:
    data = bytearray(_embed())
    at = data.find(bytes([0x04, 0x17, 0x0C, 0x00]))  # the first KPARAM_INFO: EIFMT_SVAL, attr 0x17, 12 bytes
    assert at > 0
    data[at + 2:at + 4] = struct.pack("<H", 0xFFFF)
    with pytest.raises(CubinError, match=r"\.nv\.info\.kern_embed_gather: attribute 0x17 of 65535 bytes runs past"):
        cubin_entries(bytes(data))


def test_garbage_is_refused_in_bounded_time() -> None:
    start = time.perf_counter()
    blob = b"\x7fELF\x02\x01" + bytes(range(256)) * 4096
    with pytest.raises(CubinError):
        cubin_entries(blob)
    assert time.perf_counter() - start < 1.0
