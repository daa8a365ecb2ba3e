"""Parse a cubin's kernel ABI out of the CUDA binary utilities' text output.

Two sources, both from `cuobjdump` (CUDA toolkit, or the `nvidia-cuda-cuobjdump` wheel):

* `cuobjdump -elf X.cubin`: each kernel has a `.nv.info.<entry>` section whose `EIATTR_KPARAM_INFO`
  records give one parameter each (`Ordinal`, `Offset`, `Size`, hex). They are listed in descending
  ordinal order; we sort by ordinal and return `[offset, size]` pairs in bytes.
* `cuobjdump -res-usage X.cubin`: one `Function <entry>:` line followed by `REG:n STACK:n SHARED:n
  LOCAL:n ...` per kernel.

Pure text parsing, no subprocess: the build tool runs the binaries, tests feed captured text.
"""

from __future__ import annotations

import re

_SECTION_RE = re.compile(r"^\.nv\.info\.(?P<entry>\S+)\s*$")
_KPARAM_RE = re.compile(
    r"Ordinal\s*:\s*(?P<ordinal>0x[0-9a-fA-F]+)\s+Offset\s*:\s*(?P<offset>0x[0-9a-fA-F]+)\s+"
    r"Size\s*:\s*(?P<size>0x[0-9a-fA-F]+)"
)
_FUNCTION_RE = re.compile(r"^\s*Function\s+(?P<entry>[^\s:]+)\s*:\s*$")
_RES_FIELD_RE = re.compile(r"(?P<key>[A-Z]+(?:\[\d+\])?):(?P<value>\d+)")


class KernelAbiError(ValueError):
    """The cuobjdump text does not describe a consistent kernel ABI (message names entry and problem)."""


def parse_kparam_info(elf_text: str) -> dict[str, list[list[int]]]:
    """Kernel parameter layout per entry from `cuobjdump -elf` text.

    Returns {entry: [[offset_bytes, size_bytes], ...]} ordered by parameter ordinal. An entry whose
    `.nv.info.<entry>` section has no KPARAM_INFO records (a kernel without parameters) maps to [].
    Raises KernelAbiError on duplicate or missing ordinals, or overlapping parameters.
    """
    records: dict[str, dict[int, tuple[int, int]]] = {}
    current: str | None = None
    for line in elf_text.splitlines():
        stripped = line.strip()
        section = _SECTION_RE.match(stripped)
        if section:
            current = section.group("entry")
            records.setdefault(current, {})
            continue
        if stripped.startswith(".") and not stripped.startswith(".nv.info."):
            current = None  # another section's dump starts
            continue
        if current is None:
            continue
        match = _KPARAM_RE.search(line)
        if match is None:
            continue
        ordinal = int(match.group("ordinal"), 16)
        if ordinal in records[current]:
            raise KernelAbiError(f"{current}: parameter ordinal {ordinal} listed twice")
        records[current][ordinal] = (int(match.group("offset"), 16), int(match.group("size"), 16))

    params: dict[str, list[list[int]]] = {}
    for entry, by_ordinal in records.items():
        ordinals = sorted(by_ordinal)
        if ordinals != list(range(len(ordinals))):
            raise KernelAbiError(f"{entry}: parameter ordinals {ordinals} are not 0..{len(ordinals) - 1}")
        layout = [list(by_ordinal[o]) for o in ordinals]
        end = 0
        for ordinal, (offset, size) in enumerate(layout):
            if size <= 0 or offset < end:
                raise KernelAbiError(f"{entry}: parameter {ordinal} at offset {offset} size {size} overlaps or is empty")
            end = offset + size
        params[entry] = layout
    return params


def parse_res_usage(res_text: str) -> dict[str, dict[str, int]]:
    """Resource usage per entry from `cuobjdump -res-usage` text: {entry: {"REG": n, "SHARED": n, ...}}.

    SHARED is the static shared memory in bytes as the cubin declares it (on sm_90 this includes the
    1 KiB the toolchain reserves per block); STACK and LOCAL are per-thread bytes.
    """
    usage: dict[str, dict[str, int]] = {}
    current: str | None = None
    for line in res_text.splitlines():
        function = _FUNCTION_RE.match(line)
        if function:
            current = function.group("entry")
            continue
        if current is not None and "REG:" in line:
            usage[current] = {m.group("key"): int(m.group("value")) for m in _RES_FIELD_RE.finditer(line)}
            current = None
    return usage
