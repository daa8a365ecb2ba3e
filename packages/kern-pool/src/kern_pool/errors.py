"""Typed errors of kern-pool.

Refusals (`Remapping`, `Busy`, `ExceedsPool`) tell the caller what to do next; they are expected
during normal operation and leave the pool unchanged except where stated. `Misuse` is a caller error
(bad length, refused position, closed handle, handle of another pool). `NotLanded` means a copy
plan has not been reported as executed yet. Internal inconsistencies are `AssertionError` (a kern bug).
"""

from __future__ import annotations

import operator
from typing import Any


class PoolError(Exception):
    """Base class of every error kern-pool raises on purpose."""


class Refused(PoolError):
    """A request for pages, slots or host units could not be served now (see the subclasses)."""


class Remapping(Refused):
    """A remap plan is in flight: ask again after it lands; do not evict for this.

    `plan` is the in-flight `RemapPlan` (the executor runs it and reports `Pool.land(plan)`).
    """

    def __init__(self, message: str, plan: Any) -> None:
        super().__init__(message)
        self.plan = plan


class Busy(Refused):
    """Held objects block the request: release or evict something, then ask again.

    `checkpoint` is set when a host-tier `room()` refused: the checkpoint is handed back untouched.
    """

    def __init__(self, message: str, checkpoint: Any = None) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint


class ExceedsPool(Refused):
    """The request can never fit, however much is evicted (bigger than the whole budget)."""


class Misuse(PoolError):
    """The caller broke the API contract: the message names the bad value and what was expected."""


class Closed(Misuse):
    """A closed (released, retired or consumed) handle was used."""


class NotLanded(PoolError):
    """A copy plan has not been reported as landed yet: its result is not usable."""


def check_count(value: Any, what: str, minimum: int = 0) -> int:
    """`value` as an `int` if it is an integer (anything with `__index__`, e.g. a numpy integer; not a
    `bool`) of at least `minimum`; else `Misuse` naming `what`.

    Every token count, length, position and size a public entry point takes goes through this before
    anything is acquired or changed (a float or string length would otherwise fail half way, as a
    `TypeError`, after a slot or page was taken).
    """
    try:
        number = operator.index(value)
    except TypeError:
        number = None
    if isinstance(value, bool) or number is None or number < minimum:
        raise Misuse(f"{what} must be an int >= {minimum}, got {value!r}")
    return number


def check_hold(hold: Any, what: str) -> None:
    """Misuse unless `hold` is None or has a callable `close()` (it is closed with the lease it rides on;
    anything else would fail only then, when the lease is dropped)."""
    if hold is not None and not callable(getattr(hold, "close", None)):
        raise Misuse(f"{what}: hold must be None or have close(), got {type(hold).__name__}")
