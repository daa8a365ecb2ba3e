"""Co-residency of cooperative launches (`"cooperative": true`, docs/manifest.md).

A persistent kernel's blocks wait on counters that other blocks of the same grid advance, so every block must be
resident at once: the grid may hold at most `blocks per SM x SM count` blocks, where blocks per SM is
`cuOccupancyMaxActiveBlocksPerMultiprocessor(function, threads per block, dynamic shared bytes)` (CUDA driver API,
"Occupancy"). The driver refuses a larger cooperative launch at launch time (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
kern refuses it at load, with the launch's JSON path, and again when new var values change the launch's geometry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kern_manifest import Launch, Manifest

from ..errors import CoResidencyError
from .driver import call, cu

BlocksPerSm = Callable[[Any, int, int], int]
"""(CUfunction, threads per block, dynamic shared bytes) -> blocks one SM holds at once."""


def blocks_per_sm(function: Any, threads: int, shared_bytes: int) -> int:
    """cuOccupancyMaxActiveBlocksPerMultiprocessor: blocks of `function` one SM holds at once with `threads` threads
    per block and `shared_bytes` of dynamic shared memory (0 when it cannot hold one). Raises DriverError."""
    return int(call("cuOccupancyMaxActiveBlocksPerMultiprocessor", function, int(threads), int(shared_bytes)))


def sm_count(device: Any) -> int:
    """CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT of `device`. Raises DriverError."""
    attribute = cu().CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    return int(call("cuDeviceGetAttribute", attribute, device))


class CoResidency:
    """The co-resident block capacity of cooperative functions on one device, memoised per (function, threads,
    shared bytes): `capacity(fn, threads, shared)` = blocks per SM x `sms`. `per_sm` is the occupancy query
    (`blocks_per_sm`; CPU tests pass their own)."""

    def __init__(self, sms: int, per_sm: BlocksPerSm = blocks_per_sm) -> None:
        self.sms = sms
        self._per_sm = per_sm
        self._seen: dict[tuple[int, int, int], int] = {}

    def per_sm(self, function: Any, threads: int, shared_bytes: int) -> int:
        key = (int(function), threads, shared_bytes)
        if key not in self._seen:
            self._seen[key] = self._per_sm(function, threads, shared_bytes)
        return self._seen[key]

    def check(self, function: Any, path: str, grid: Iterable[int], block: Iterable[int], shared_bytes: int) -> None:
        """Raise CoResidencyError (naming `path`) when `grid` blocks of `block` threads do not fit at once."""
        blocks, threads = math.prod(grid), math.prod(block)
        per_sm = self.per_sm(function, threads, shared_bytes)
        if blocks > per_sm * self.sms:
            raise CoResidencyError(path, blocks, per_sm * self.sms,
                                   f"{per_sm} block(s) per SM x {self.sms} SMs at {threads} threads and {shared_bytes} "
                                   "bytes of dynamic shared memory")


def range_ends(launch: Launch, min_values: Mapping[str, int], max_values: Mapping[str, int]) -> list[dict[str, int]]:
    """The var values at the low and the high end of the ranges, each var the launch's `when` names clamped into its
    interval (the ends where that launch applies)."""
    out = []
    for base in (min_values, max_values):
        values = dict(base)
        for var, (lo, hi) in (launch.when or {}).items():
            values[var] = min(max(values[var], lo.eval(values)), hi.eval(values))
        out.append(values)
    return out


def check_cooperative_launches(manifest: Manifest, functions: Mapping[tuple[str, int], Any], residency: CoResidency,
                               min_values: Mapping[str, int], max_values: Mapping[str, int]) -> int:
    """Check every cooperative launch of `manifest` at both ends of its var ranges (`range_ends`); `functions`:
    (op, launch index) -> CUfunction. Returns how many launches were checked. Raises CoResidencyError naming the
    first launch that does not fit (`ops.OP.launches[i]`)."""
    from ..program.records import launch_path

    checked = 0
    for op in manifest.ops.values():
        for li, launch in enumerate(op.launches):
            if not isinstance(launch, Launch) or not launch.cooperative:
                continue
            for values in range_ends(launch, min_values, max_values):
                grid = [e.eval(values) for e in launch.grid]
                block = [e.eval(values) for e in launch.block]
                residency.check(functions[(op.name, li)], launch_path(op.name, li), grid, block,
                                launch.shared_mem.eval(values))
            checked += 1
    return checked
