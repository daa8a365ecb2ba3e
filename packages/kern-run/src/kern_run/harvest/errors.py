"""The harvest's refusals: a capture directory that cannot be read, and a capture that cannot be replayed.

`CaptureFormatError` names the file (and line or key) of a capture directory that breaks
docs/harvest.md "Capture directory". `HarvestRefusal` carries every `Problem` the miner or the generator
found, each naming where it is (`run 1 launch 17 param 3`, `cubin 3f2a...`), so one refusal reports every
unexplained launch at once; nothing is written when one is raised.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RefusalError


class CaptureFormatError(RefusalError):
    """A capture directory (or one of its files) is not in the `kern-harvest-capture/1` format; the message
    names the file, the line or JSON key, and what was expected."""


class CaptureError(RefusalError):
    """`kern harvest capture` cannot run: no GPU, torch or cupti-python missing, an option out of range, or the
    step did not do what a capture needs (the message says which)."""

    exit_code = 3


@dataclass(frozen=True)
class Problem:
    """One thing the harvest cannot explain. `where`: `run R launch L param P`, `launch L`, `cubin SHA`,
    `tensor NAME`, ...; `message`: what is wrong there."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


class HarvestRefusal(RefusalError):
    """The capture cannot become a manifest. `problems`: every Problem found (at least one); `str()` is one line
    (the count and the first few), `report()` one line per problem."""

    exit_code = 1
    SHOWN = 3  # problems named in the one-line form

    def __init__(self, problems: list[Problem]) -> None:
        assert problems, "a refusal names at least one problem"
        self.problems = list(problems)
        head = "; ".join(str(p) for p in self.problems[:self.SHOWN])
        more = f"; and {len(self.problems) - self.SHOWN} more" if len(self.problems) > self.SHOWN else ""
        super().__init__(f"{len(self.problems)} unexplained: {head}{more}")

    def report(self) -> list[str]:
        """One line per problem, in the order found."""
        return [str(p) for p in self.problems]
