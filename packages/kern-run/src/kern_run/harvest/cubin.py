"""A cubin's kernel entries and their parameter layouts, read from the ELF itself (no CUDA, no cuobjdump).

A cubin is an ELF64 little-endian file (e_machine 190, EM_CUDA). Its kernels are the global `STT_FUNC`
symbols marked `STO_CUDA_ENTRY` (0x10 in `st_other`); the parameter layout of kernel `k` is in section
`.nv.info.k` as `EIATTR_KPARAM_INFO` attributes (attribute 0x17, format `EIFMT_SVAL`: a 16-bit payload size,
then the payload `u32 index, u16 ordinal, u16 offset, u32 flags` whose bits 18..31 are the size in bytes). A kernel
with a parameter too large for those 14 bits (nvcc 13 emits it for kern_persistent_decode's 8 KiB by-value table)
has attribute 0x45 instead, the same payload with the u32 holding the size in bytes itself (read from the
committed cubins: the sizes equal cuobjdump's). This
is what `cuobjdump -elf` prints as `Ordinal / Offset / Size` (tools/kernel_abi.py reads that text) and what the
driver returns from `cuFuncGetParamInfo`; tests/harvest/test_cubin.py checks it against kernels/kernels.json
for every committed cubin.

Every offset is checked against the file before it is read, and every loop advances by a fixed record size
through a section that lies inside the file, so a hostile file is refused (CubinError) in time linear in its
size.
"""

from __future__ import annotations

import struct

ELF_MAGIC = b"\x7fELF"
EM_CUDA = 190
SHT_SYMTAB = 2
STT_FUNC = 2
STB_GLOBAL = 1
STO_CUDA_ENTRY = 0x10
EIFMT_SVAL = 4
EIATTR_KPARAM_INFO = 0x17
EIATTR_KPARAM_INFO_V2 = 0x45  # the same record, the size a whole u32 (parameters of 16 KiB and more fit)
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym
_KPARAM = struct.Struct("<IHHI")

Layout = tuple[tuple[int, int], ...]


class CubinError(ValueError):
    """The bytes are not a cubin whose kernels and parameter layouts can be read (the message says where)."""


def _u(fmt: str, data: bytes, offset: int, what: str) -> tuple:
    size = struct.calcsize(fmt)
    if offset < 0 or offset + size > len(data):
        raise CubinError(f"{what} at byte {offset} is past the end of the file ({len(data)} bytes)")
    return struct.unpack_from(fmt, data, offset)


def _sections(data: bytes) -> list[tuple[int, int, int, int, int]]:
    """(name offset, type, file offset, size, link) of every section, each checked to lie inside the file."""
    if data[:4] != ELF_MAGIC:
        raise CubinError("not an ELF file (no \\x7fELF magic)")
    ei_class, ei_data = _u("<BB", data, 4, "ELF identification")
    if ei_class != 2 or ei_data != 1:
        raise CubinError(f"not a 64-bit little-endian ELF (class {ei_class}, data {ei_data})")
    (machine,) = _u("<H", data, 0x12, "e_machine")
    if machine != EM_CUDA:
        raise CubinError(f"e_machine is {machine}, not {EM_CUDA} (CUDA)")
    (shoff,) = _u("<Q", data, 0x28, "e_shoff")
    shentsize, shnum, shstrndx = _u("<HHH", data, 0x3A, "section header fields")
    if shnum and shentsize != _SECTION.size:
        raise CubinError(f"section header size {shentsize}, expected {_SECTION.size}")
    if shoff + shnum * _SECTION.size > len(data):
        raise CubinError(f"{shnum} section headers at byte {shoff} run past the end of the file ({len(data)} bytes)")
    out = []
    for i in range(shnum):
        name, kind, _flags, _addr, offset, size, link, _info, _align, _entsize = _SECTION.unpack_from(
            data, shoff + i * _SECTION.size)
        if kind != 8 and offset + size > len(data):  # SHT_NOBITS (8) occupies no file bytes
            raise CubinError(f"section {i} ({size} bytes at {offset}) runs past the end of the file")
        out.append((name, kind, offset, 0 if kind == 8 else size, link))
    if shnum and shstrndx >= shnum:
        raise CubinError(f"section name table index {shstrndx} out of range ({shnum} sections)")
    return out


def _string(data: bytes, table: tuple[int, int, int, int, int], offset: int) -> str:
    start, size = table[2], table[3]
    if offset >= size:
        raise CubinError(f"string offset {offset} outside its table ({size} bytes)")
    end = data.find(b"\0", start + offset, start + size)
    if end < 0:
        raise CubinError(f"string at offset {offset} of its table is not terminated")
    return data[start + offset:end].decode("utf-8", "replace")


def _kparams(data: bytes, offset: int, size: int, entry: str) -> Layout:
    """The KPARAM_INFO records of one `.nv.info.<entry>` section, ordered by ordinal."""
    by_ordinal: dict[int, tuple[int, int]] = {}
    pos, end = offset, offset + size
    while pos + 4 <= end:
        fmt, attr = data[pos], data[pos + 1]
        if fmt != EIFMT_SVAL:  # EIFMT_NVAL / BVAL / HVAL: a 4-byte record
            pos += 4
            continue
        (length,) = struct.unpack_from("<H", data, pos + 2)
        if pos + 4 + length > end:
            raise CubinError(f".nv.info.{entry}: attribute 0x{attr:02x} of {length} bytes runs past its section")
        if attr in (EIATTR_KPARAM_INFO, EIATTR_KPARAM_INFO_V2):
            if length < _KPARAM.size:
                raise CubinError(f".nv.info.{entry}: KPARAM_INFO of {length} bytes, expected {_KPARAM.size}")
            _index, ordinal, param_offset, flags = _KPARAM.unpack_from(data, pos + 4)
            if ordinal in by_ordinal:
                raise CubinError(f".nv.info.{entry}: parameter ordinal {ordinal} listed twice")
            size = (flags >> 18) & 0x3FFF if attr == EIATTR_KPARAM_INFO else flags
            by_ordinal[ordinal] = (param_offset, size)
        pos += 4 + length
    ordinals = sorted(by_ordinal)
    if ordinals != list(range(len(ordinals))):
        raise CubinError(f".nv.info.{entry}: parameter ordinals {ordinals} are not 0..{len(ordinals) - 1}")
    return tuple(by_ordinal[i] for i in ordinals)


def cubin_entries(data: bytes) -> dict[str, Layout]:
    """{kernel entry name: ((offset_bytes, size_bytes), ...) by parameter ordinal} of the cubin `data`; a kernel
    without parameters maps to `()`. Raises CubinError for bytes that are not a well-formed CUDA ELF, a section
    or string outside the file, or KPARAM_INFO records that do not number the parameters 0..n-1."""
    sections = _sections(data)
    if not sections:
        return {}
    names = sections[_u("<H", data, 0x3E, "e_shstrndx")[0]]
    info: dict[str, tuple[int, int]] = {}
    for name_offset, _kind, offset, size, _link in sections:
        name = _string(data, names, name_offset)
        if name.startswith(".nv.info."):
            info[name[len(".nv.info."):]] = (offset, size)
    entries: dict[str, Layout] = {}
    for _name, kind, offset, size, link in sections:
        if kind != SHT_SYMTAB:
            continue
        if link >= len(sections):
            raise CubinError(f"symbol table links string table {link}, out of range ({len(sections)} sections)")
        strings = sections[link]
        for i in range(size // _SYMBOL.size):
            st_name, st_info, st_other, _shndx, _value, _size = _SYMBOL.unpack_from(data, offset + i * _SYMBOL.size)
            if st_info & 0xF != STT_FUNC or st_info >> 4 != STB_GLOBAL or not st_other & STO_CUDA_ENTRY:
                continue
            entry = _string(data, strings, st_name)
            where = info.get(entry)
            entries[entry] = _kparams(data, *where, entry) if where else ()
    return entries
