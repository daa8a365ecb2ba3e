"""Error words: buffers with `error` (docs/manifest.md) that kernels write a nonzero code into when they give up (a
bounded wait that timed out, an instruction they cannot execute), checked by the host where it learns that work
finished.

An error word is `u32[n]` in pinned, device-mapped host memory: word 0 the code (0: no fault), words 1.. detail.
`ErrorWords.check()` reads word 0 of each (a load from host memory, no copy and no synchronisation) and, when it is
nonzero, clears the word and raises `DeviceFaultError` naming the code, the manifest's meaning of it and the
programs that pass the buffer. The runtime calls it after these points where the host has waited for the compute
stream, and only these: `synchronize`, the final synchronisation of `Runtime.load`, `read_buffer` / `read_output`,
a `ReadbackHandle` or `EventHandle` waited, an `EventHandle` polled ready. `read_state`, `write_state_at`,
`into_resident`, `close` and the pool's waits synchronise without calling it.
A caller that reads a step's outputs therefore reads its faults with them, at no extra cost per step; with steps
pipelined (step k+1 enqueued before step k is read) a fault of step k is raised when step k's event is waited.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from kern_manifest import Manifest

from .cuda.memory import Allocation
from .errors import DeviceFaultError
from .program.per_run import programs_passing


@dataclass(frozen=True)
class ErrorWord:
    """One error word: its buffer name, a live u32 view of its pinned memory, the manifest's spec and the programs
    that pass it."""

    buffer: str
    words: np.ndarray  # u32[n], host-mapped
    codes: object  # kern_manifest.ErrorWord
    programs: tuple[str, ...]


class ErrorWords:
    """Every error word of one runtime (none for most manifests: `check` is then one empty loop)."""

    def __init__(self, manifest: Manifest, buffers: Mapping[str, Allocation]) -> None:
        self._words: list[ErrorWord] = []
        for name, spec in manifest.buffers.items():
            if spec.error is None:
                continue
            alloc = buffers[name]
            count = alloc.nbytes // 4
            view = alloc.host_view()[: count * 4].view(np.uint32)  # u32[n]
            view[:] = 0  # pinned memory is not zeroed on allocation
            self._words.append(ErrorWord(name, view, spec.error, programs_passing(manifest, name)))

    def __bool__(self) -> bool:
        return bool(self._words)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(w.buffer for w in self._words)

    def check(self) -> None:
        """Raise DeviceFaultError for the first error word whose word 0 is nonzero, after clearing it (the detail
        words too). Call only once the host has waited for the work that may write it."""
        for word in self._words:
            code = int(word.words[0])
            if code:
                detail = tuple(int(v) for v in word.words[1:])
                word.words[:] = 0
                raise DeviceFaultError(word.buffer, code, word.codes.meaning(code), word.programs, detail)
