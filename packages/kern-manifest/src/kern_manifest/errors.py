"""Errors of kern-manifest: one base class, variants by what went wrong.

- `ManifestParseError`: the text is not JSON, or a JSON value has the wrong type (a list where an
  object belongs, a string where an integer belongs, a malformed expression). Parsing stops at the
  first such error; `.path` names it.
- `ManifestVerifyError`: the manifest is well-formed but inconsistent (dangling names, sizes that do
  not match, binds that do not tile, ...). `.faults` lists every fault found, each with its JSON path.
- `ExprError`: an integer expression could not be evaluated (unknown var, divisor <= 0, a value
  outside the signed 64-bit range). The verifier turns these into faults; the runtime sees them only
  when it evaluates with values the verifier did not cover.

Paths are JSONPath-like: `$.ops.rmsnorm.launches[0].args[3]`; a name that is not a plain identifier
is written in brackets, `$.buffers["w_qkv.0"].bind[1]`.
"""

from __future__ import annotations

from dataclasses import dataclass


class ManifestError(Exception):
    """Base class of every error kern-manifest raises: the manifest (or its generator) must be fixed."""


class ManifestParseError(ManifestError):
    """Not JSON, or a JSON value of the wrong type at `path`."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}")


@dataclass(frozen=True)
class Fault:
    """One verify fault: where (`path`, JSONPath-like) and what to fix (`message`)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ManifestVerifyError(ManifestError):
    """A well-formed manifest that is inconsistent; `faults` holds every fault found (never empty)."""

    def __init__(self, faults: list[Fault]) -> None:
        assert faults, "ManifestVerifyError without faults is a bug in kern-manifest"
        self.faults = list(faults)
        lines = "\n".join(f"  {f}" for f in self.faults)
        super().__init__(f"manifest has {len(self.faults)} fault(s):\n{lines}")

    @property
    def paths(self) -> list[str]:
        """The path of every fault, in the order found."""
        return [f.path for f in self.faults]


class ExprError(ManifestError):
    """An integer expression cannot be evaluated with the given var values."""

    def __init__(self, source: str, message: str) -> None:
        self.source = source
        self.message = message
        super().__init__(f"expression {source!r}: {message}")
