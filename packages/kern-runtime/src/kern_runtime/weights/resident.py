"""Device weight buffers kept from a closed runtime (`Runtime.into_resident()`) for the next `Runtime.load` on
the same GPU (`resident=` / `load_over`): A/B tests load shared weights once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kern_manifest import Buffer

from ..cuda.driver import call
from ..cuda.memory import Allocation


@dataclass
class ResidentWeights:
    """Device weight buffers kept from a closed runtime for `Runtime.load(..., resident=...)`.

    `buffers`: identity key (see `weight_identity`) -> Allocation. Holds a reference on the GPU's
    primary context; `close()` frees what no load claimed and drops that reference (idempotent)."""

    gpu: int
    context: Any
    device: Any
    buffers: dict[tuple, Allocation] = field(default_factory=dict)

    def close(self) -> None:
        if self.context is None:
            return
        call("cuCtxSetCurrent", self.context)
        while self.buffers:
            _, alloc = self.buffers.popitem()
            alloc.free()
        self.context = None
        call("cuDevicePrimaryCtxRelease", self.device)


def weight_identity(buffer: Buffer, shape: tuple[int, ...]) -> tuple:
    """What must agree for a weight buffer to be reused: name, dtype, shape, placement, export, bind."""
    return (buffer.name, buffer.dtype, shape, buffer.placement, buffer.export, repr(buffer.bind))
