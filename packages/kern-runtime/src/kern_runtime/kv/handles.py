"""The runtime's handles over kern_pool's: `DeviceLease`, `DeviceCheckpoint`, `DeviceWaking`.

Each wraps the kern_pool handle (`.inner`) and reads its facts through (`_forwards`): kern_pool decides and
keeps the state; these add only what needs the device (the `slots` array, a block-table row, `grow` through
the device pool's remap execution, the wake copies' event). Closing or dropping one returns its pages and slot
to the pool at once: launches already enqueued that use them still run first, because every later reuse
(zeroing, copies, launches, wakes) is ordered after them on the streams.
"""

from __future__ import annotations

from typing import Any, TypeVar

import kern_pool
import numpy as np

from ..cuda.driver import call
from ..errors import ApiError, int_arg
from ..parts import attribute, method
from .host_tier import event_done

T = TypeVar("T")


class _Closing:
    """`with handle:` closes it; its repr is the kern_pool handle's."""

    __slots__ = ()
    inner: Any

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return f"runtime {self.inner!r}"


class DeviceLease(_Closing):
    """A kern_pool `Lease` (`inner`) on this runtime's device: kern_pool's facts (`page_ids()`, `slot(pos)`,
    `seq_slot_id`, lengths, `closed`, `close()`) read through, plus what needs the device or the runtime: `slots` as an array, `grow` (which may execute a remap),
    `seq_line` into a block table. See docs/pool.md for the semantics of each field."""

    __slots__ = ("_owner", "inner", "__weakref__")
    # kern_pool's facts, read through to `inner` (parts.py): never a second copy of kern_pool's state or logic
    page_ids = method("inner", kern_pool.Lease.page_ids)
    slot = method("inner", kern_pool.Lease.slot)
    advance_to = method("inner", kern_pool.Lease.advance_to)
    close = method("inner", kern_pool.Lease.close)
    seq_slot_id: int | None = attribute("inner", kern_pool.Lease.seq_slot_id)
    prefix_tokens: int = attribute("inner", kern_pool.Lease.prefix_tokens)
    paged: bool = attribute("inner", kern_pool.Lease.paged)
    frozen_tokens: int = attribute("inner", kern_pool.Lease.frozen_tokens)
    reached_tokens: int = attribute("inner", kern_pool.Lease.reached_tokens)
    num_pages: int = attribute("inner", kern_pool.Lease.num_pages)
    capacity_tokens: int = attribute("inner", kern_pool.Lease.capacity_tokens)
    closed: bool = attribute("inner", kern_pool.Lease.closed)

    def __init__(self, owner: Any, inner: kern_pool.Lease) -> None:
        self._owner = owner  # the DevicePool that leased it (ownership checks, grow)
        self.inner = inner

    def slots(self, start: int, stop: int) -> np.ndarray:
        """i32[stop - start]: slot-mapping values of positions start..stop-1 (same refusals as `slot`)."""
        if stop > start:
            self.inner.slot(start)  # refuses frozen / out-of-range positions
            self.inner.slot(stop - 1)
        pages = np.asarray(self.inner.page_ids(), dtype=np.int64)
        pos = np.arange(start, stop)
        P = self.inner.pool.page_tokens
        return (pages[pos // P] * P + pos % P).astype(np.int32)

    def grow(self, num_tokens: int, *, wait: bool = True) -> None:
        """Reserve pages for `num_tokens` tokens in total (refusals as `Runtime.lease`)."""
        self._owner._pool_request(lambda pool: pool.grow(self.inner, num_tokens), wait)

    def seq_line(self, table: np.ndarray, row: int) -> np.ndarray:
        """Write this lease's page ids into `table[row]` (i32[rows, width]), the rest of the row the
        scratch page; returns the row. Raises ApiError when `table` is not a 2-D numpy array, `row` is
        not an integer in 0..rows-1 or the pages exceed the width; kern_pool `Closed` for a closed lease."""
        if not isinstance(table, np.ndarray) or table.ndim != 2:
            raise ApiError(f"seq_line needs a 2-D block table (numpy array [rows, width]), got "
                           f"{type(table).__name__}{list(table.shape) if isinstance(table, np.ndarray) else ''}")
        index = int_arg(row, "seq_line row")
        if not 0 <= index < table.shape[0]:
            raise ApiError(f"seq_line row {row!r} is outside the block table's {table.shape[0]} rows")
        ids = self.inner.page_ids()
        line = table[index]
        if len(ids) > line.shape[0]:
            raise ApiError(f"lease holds {len(ids)} pages; block-table row {index} has room for {line.shape[0]}")
        line[: len(ids)] = ids
        line[len(ids):] = self.inner.pool.scratch_page_id or 0
        return line


class DeviceCheckpoint(_Closing):
    """A kern_pool `Checkpoint` (`inner`) kept on this runtime's device (`Prefix` can keep it); its facts are
    kern_pool's, read through."""

    __slots__ = ("inner", "__weakref__")
    page_ids = method("inner", kern_pool.Checkpoint.page_ids)
    close = method("inner", kern_pool.Checkpoint.close)
    num_tokens: int = attribute("inner", kern_pool.Checkpoint.num_tokens)
    has_slot: bool = attribute("inner", kern_pool.Checkpoint.has_slot)
    paged: bool = attribute("inner", kern_pool.Checkpoint.paged)
    seq_slot_id: int | None = attribute("inner", kern_pool.Checkpoint.seq_slot_id)
    closed: bool = attribute("inner", kern_pool.Checkpoint.closed)

    def __init__(self, inner: kern_pool.Checkpoint) -> None:
        self.inner = inner


class DeviceWaking:
    """A kern_pool `Waking` (`inner`): pages being filled from the host on the transfer stream; `Runtime.awake`
    hands out the lease once the copies have landed. `close()` before that waits for the copies, then releases the pages."""

    __slots__ = ("_owner", "inner", "_event", "__weakref__")

    def __init__(self, owner: Any, inner: kern_pool.Waking, event: Any) -> None:
        self._owner, self.inner, self._event = owner, inner, event

    @property
    def landed(self) -> bool:
        if self.inner.landed:
            return True
        if self._event is not None and event_done(self._event):
            self._land()
        return self.inner.landed

    def _land(self) -> None:
        if self._event is not None:
            call("cuEventDestroy", self._event)
            self._event = None
        self.inner.land()

    def wait(self) -> None:
        """Block until the copies have landed."""
        if self._event is not None:
            call("cuEventSynchronize", self._event)
            self._land()

    def close(self) -> bool:
        self.wait()
        return self.inner.close()

    def __del__(self) -> None:
        # Dropped unclosed: wait for the copies before the lease's pages can be leased again (kern_pool's
        # settle hook would too, through the host state) and free the event.
        try:
            self.close()
        except Exception:  # the runtime and its context are gone: nothing is left in flight
            pass
