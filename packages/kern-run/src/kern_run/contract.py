"""The caller contract: what kern-run uses from a runtime, and how a Generator gets its KV pages.

Declared here as `typing.Protocol`s (docs/caller.md "The runtime contract"), so what a runtime must provide
is written down once and checked by a test (tests/run/test_caller_contract.py) against both implementations:
`kern_runtime.Runtime` (one GPU) and `kern_run.tp.TpRuntime` (the tensor-parallel group). Nothing in kern-run
probes a runtime with `getattr` / `hasattr`: a capability is in `CallerRuntime`, or in one of the optional
protocols below, which the code that has it passes in explicitly.

- `CallerRuntime`: every runtime `Generator` drives (inputs, programs, outputs, a pool lease, description).
- `DeviceSteps` (optional): events and host-mapped views, for the pipelined decode loop. `Generator.open`
  passes its `Runtime`; the TP group has none (the synchronous loop).
- `PrefixRuntime` (optional): `lease_from` / `retire` / `checkpoint` on top of `CallerRuntime`, for prefix reuse
  (`kern_run.prefix_cache`, `kern_run.batch_pages`).
- `PageSource`: where a `Generator` gets one sequence's pages (`generate.SeqPages`: a lease of the runtime's
  pool; `prefix_cache.PrefixPages`: a lease resumed from a cached prefix). Given to the Generator's
  constructor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np


class SeqLease(Protocol):
    """One sequence's pages (kern_runtime.Lease, kern_pool.Lease)."""

    def page_ids(self) -> list[int]:
        """Page ids in position order: page i holds positions [i * page_tokens, (i + 1) * page_tokens)."""
        ...

    def close(self) -> bool:
        """Return the pages (idempotent: False when already closed)."""
        ...


@runtime_checkable
class CallerRuntime(Protocol):
    """What `kern_run.generate.Generator` and `kern run` use from a loaded runtime (kern_runtime.Runtime's names
    and signatures: a test compares them).

    `page_tokens` / `num_pages`: the KV pool's page size (tokens) and page ids 0..num_pages-1 (page 0 is the
    runtime's scratch page, never leased); None without paged states. `weight_load_stats`: (bytes, seconds) of
    the checkpoint load.
    """

    weight_load_stats: tuple[int, float]

    @property
    def page_tokens(self) -> int | None: ...

    @property
    def num_pages(self) -> int | None: ...

    def write_input(self, name: str, array: np.ndarray) -> None:
        """Copy `array` (a prefix of dim-0 rows allowed) into input buffer `name` (async, compute stream)."""
        ...

    def issue(self, program: str, vars: Mapping[str, int] | None = None, eager: bool = False) -> None:
        """Enqueue `program` at var values `vars` (as its CUDA graph unless `eager`). Does not synchronise."""
        ...

    def read_output(self, name: str, rows: int | None = None) -> np.ndarray:
        """Synchronise and copy output buffer `name` (or its first `rows` rows) to the host."""
        ...

    def read_buffer(self, name: str, rows: int | None = None) -> np.ndarray:
        """Synchronise and copy any buffer to the host (bf16 as uint16 bits)."""
        ...

    def lease(self, num_tokens: int, *, wait: bool = True) -> SeqLease:
        """A fresh sequence of pages for `num_tokens` tokens. Raises a kern_pool `PoolError` when the pool
        cannot hold them."""
        ...

    def describe(self) -> dict[str, Any]:
        """What the loaded runtime holds (allocated bytes, pages, graphs), for the log."""
        ...

    def into_resident(self) -> Any:
        """Close the runtime keeping its device weights for a next load on the same GPU (a
        `kern_runtime.Resident`); None when this runtime cannot keep them (it is left open then)."""
        ...

    def close(self) -> None:
        """Free everything (idempotent)."""
        ...


class StepEvent(Protocol):
    """An event recorded on the compute stream (kern_runtime.EventHandle)."""

    def wait(self) -> None: ...


@runtime_checkable
class DeviceSteps(Protocol):
    """Optional: what the pipelined decode loop needs beyond `CallerRuntime` (kern_runtime.Runtime has it)."""

    def record_event(self) -> StepEvent:
        """An event behind everything enqueued so far (no synchronisation)."""
        ...

    def host_array(self, name: str) -> np.ndarray:
        """A live view of `placement: host` buffer `name` (no copy): read after an event behind its writer."""
        ...


@runtime_checkable
class PrefixRuntime(CallerRuntime, Protocol):
    """Optional: a runtime whose pool keeps and resumes prefixes (kern_runtime.Runtime), for prefix reuse."""

    def lease_from(self, checkpoint: Any, num_tokens: int, *, prefix_tokens: int | None = None,
                   hold: Any = None, wait: bool = True) -> SeqLease:
        """A sequence resuming `checkpoint`'s first `prefix_tokens` tokens, with pages for `num_tokens`. Raises
        kern_pool `Busy` (evict something), `ExceedsPool`."""
        ...

    def retire(self, lease: Any, num_tokens: int) -> Any:
        """End `lease` keeping its first `num_tokens` tokens: a checkpoint, or None when it was closed."""
        ...

    def checkpoint(self, lease: Any, num_tokens: int, *, wait: bool = True) -> Any:
        """Keep the first `num_tokens` tokens of `lease`, which keeps running (a batch row's prompt while it
        decodes): a checkpoint. Raises kern_pool `Busy` / `ExceedsPool` / `Misuse`."""
        ...


@dataclass(frozen=True)
class Reserved:
    """One sequence's pages from a `PageSource`.

    `page_ids`: the block-table row, ceil(num_tokens / page_tokens) ids. `cached_tokens`: positions
    0..cached_tokens-1 already hold the K/V of the prompt's first `cached_tokens` ids (a resumed prefix): the
    Generator's prefill starts there. 0 for fresh pages."""

    page_ids: tuple[int, ...]
    cached_tokens: int = 0


@runtime_checkable
class PageSource(Protocol):
    """Where a `Generator` gets its sequence's pages (generate.SeqPages, prefix_cache.PrefixPages).

    `max_tokens`: tokens one sequence can hold. `reserve(num_tokens, prompt_ids)`: pages for a sequence of
    `num_tokens` tokens whose first ids are `prompt_ids` (a source may resume a cached prefix of them; `()`:
    reuse nothing); the previous reservation is released first. Raises kern_run InputError when the pool
    cannot hold them. `release()`: return the current pages (idempotent)."""

    @property
    def max_tokens(self) -> int: ...

    def reserve(self, num_tokens: int, prompt_ids: Sequence[int] = ()) -> Reserved: ...

    def release(self) -> None: ...
