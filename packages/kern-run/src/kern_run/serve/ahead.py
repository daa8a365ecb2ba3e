"""A decode step enqueued before its predecessor's tokens are read: what RuntimeEngine keeps of it, and whether
the scheduler's next step is what it computed (docs/serve.md "Pipelined decode").

`kern run`'s decode loop keeps the GPU fed by issuing step k+1 before it reads step k's token: the decode program
ends by writing every row's next inputs on the device (`meta.caller.decode_advance`), so step k+1 needs nothing
from the host. The server's scheduler decides each step from the tokens of the last, so the engine guesses: when
the loop says the next step should carry the same rows (`Scheduler.steady`), it enqueues that step right behind
this one (`AheadStep`), then reads this one. At the next `decode(rows)` the step already enqueued is the answer
when `matches(rows)`: every row of `rows` ran in it with the same request, position and token (rows it ran that
`rows` lacks belong to requests that ended: their results are dropped). Otherwise it is dropped whole and `rows`
run as a new step. Pure host logic: no device call here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from .engine import DecodeRow


@dataclass
class AheadStep:
    """A decode step at `bucket` enqueued behind another, `event` recorded behind it. `rows`: row -> (req_id,
    position) it computes; `tokens`: row -> the token it was fed (the step before's, filled in once that step is
    read). `prefilled`: a prefill was enqueued after it, so the per-row inputs it advanced on the device for the
    step after it are overwritten (nothing may be chained onto it)."""

    bucket: int
    rows: dict[int, tuple[int, int]]
    event: Any
    tokens: dict[int, int] = field(default_factory=dict)
    prefilled: bool = False

    @classmethod
    def after(cls, rows: Sequence[DecodeRow], bucket: int, event: Any) -> "AheadStep":
        """The step after `rows` (each row one position on), at `bucket`."""
        return cls(bucket, {r.row: (r.req_id, r.position + 1) for r in rows}, event)

    def fed(self, rows: Sequence[DecodeRow], tokens: Sequence[int]) -> None:
        """Record the tokens the step before produced (`tokens[i]` of `rows[i]`): what this step was fed."""
        for r, token in zip(rows, tokens):
            self.tokens[r.row] = int(token)

    def matches(self, rows: Sequence[DecodeRow]) -> bool:
        """Whether this step computed every row of `rows`: the same row, request, position and token, the row
        not newly placed (`history` None) and not asking for top logprobs (those run synchronously)."""
        return all(r.history is None and not r.sampling.top_logprobs
                   and self.rows.get(r.row) == (r.req_id, r.position) and self.tokens.get(r.row) == r.token_id
                   for r in rows)

    def complete(self, rows: Sequence[DecodeRow]) -> bool:
        """`matches(rows)` with every row of this step in `rows` (no request of it ended)."""
        return len(rows) == len(self.rows) and self.matches(rows)
