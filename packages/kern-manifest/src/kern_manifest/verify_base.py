"""Shared machinery of the verifier: fault collection and corner evaluation of expressions."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import ExprError, Fault
from .expr import Expr
from .frozen import key_path
from .model import EXTERNS, Manifest

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_CORNER_VARS = 12  # 4096 corners
# Expression nodes the verifier evaluates, over all corners of all expressions of one manifest (about a second;
# the Qwen3-4B manifest needs 4,070): a manifest past it is refused rather than verified for minutes.
MAX_CORNER_WORK = 1 << 20
# Range comparisons of the `when` partition checks of one manifest (verify_ops.check_when_partition: about 2 n^2 k
# for a group of n launches over k vars; committed manifests need a few hundred): O(n^2) is polynomial, but a 64 MiB
# file can hold 100,000 launches in one op.
MAX_WHEN_WORK = 1 << 20
F32_MAX = 3.4028234663852886e38
MAX_BLOCK_THREADS = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_TENSORMAP_RANK = 5
MAX_TENSORMAP_BOX = 256
STATE_FIELDS = {"fixed": ("bytes",), "paged": ("bytes_per_token", "page_tokens"), "per_seq": ("bytes_per_seq",)}
EXTERN_INT_ROLES = {  # extern -> {position: role} for integer arguments that must be >= 1
    name: {i: "mnk" for i in range(len(req)) if req[i] == "i"} for name, (req, _) in EXTERNS.items()
    if not name.startswith("nccl_")
}

TOP_KEYS = ("format", "name", "meta", "vars", "modules", "buffers", "states", "ops", "programs", "topology", "digest")


class VerifierBase:
    """Holds the manifest and the faults found so far; helpers every check uses."""

    def __init__(self, m: Manifest) -> None:
        self.m = m
        self.faults: list[Fault] = []
        self.corner_work = 0  # expression nodes evaluated so far (MAX_CORNER_WORK)
        self.when_work = 0  # `when` range comparisons so far (MAX_WHEN_WORK)
        self._corners: dict[frozenset[str], list[dict[str, int]]] = {}
        self.fill_maps: dict[str, list[Any]] = {}  # op -> its fill tensor maps (verify_ops.fill_tensormaps)

    # -------------------------------------------------------------------------------- helpers

    def fault(self, path: str, message: str) -> None:
        self.faults.append(Fault(path, message))

    def unknown(self, extra: Mapping[str, Any], path: str, known: Iterable[str]) -> None:
        for key in extra:
            self.fault(key_path(path, key), f"unknown key {key!r}; allowed here: {', '.join(known)}")

    def name(self, name: str, path: str, what: str) -> None:
        if not NAME.fullmatch(name):
            self.fault(path, f"{what} name {name!r} must match [A-Za-z_][A-Za-z0-9_.-]*")

    def afford(self, exprs: Iterable[Expr], path: str, what: str) -> bool:
        """Charge evaluating `exprs` at every corner of the vars they read to the manifest's MAX_CORNER_WORK;
        False (with one fault, at the first expression past the budget) when it does not fit."""
        exprs = list(exprs)
        names = exprs[0].vars if len(exprs) == 1 else frozenset().union(*(e.vars for e in exprs))
        corners = 1 << sum(1 for n in names if n in self.m.vars and self.m.vars[n].min != self.m.vars[n].max)
        work = corners * sum(e.nodes for e in exprs)
        spent = self.corner_work
        self.corner_work += work
        if self.corner_work <= MAX_CORNER_WORK:
            return True
        if spent <= MAX_CORNER_WORK:  # the first one past the budget; the manifest is refused already after it
            self.fault(path, f"{what} {exprs[0].source[:60]!r}{'...' if len(exprs[0].source) > 60 else ''}: "
                             f"checking it at its {corners} corner(s) evaluates {work} expression nodes, past what "
                             f"is left of the {MAX_CORNER_WORK} nodes the verifier evaluates for one manifest "
                             "(simplify the expressions or read fewer vars in each)")
        return False

    def corners(self, names: frozenset[str]) -> list[dict[str, int]]:
        """Every combination of min and max of the vars `names` (declared vars), made once per set of names:
        callers only read the list and its dicts."""
        made = self._corners.get(names)
        if made is None:
            ordered = sorted(names)
            ranges = [sorted({self.m.vars[n].min, self.m.vars[n].max}) for n in ordered]
            made = self._corners[names] = [dict(zip(ordered, combo)) for combo in itertools.product(*ranges)]
        return made

    def values(self, e: Expr, path: str, what: str, lo: int | None = None, hi: int | None = None,
               hint: str = "") -> list[tuple[dict[str, int], int]] | None:
        """Evaluate `e` at every corner; record faults for undeclared vars, evaluation errors, and values
        outside [lo, hi]. Returns (corner, value) pairs, or None when it cannot be evaluated."""
        missing = sorted(v for v in e.vars if v not in self.m.vars)
        if missing:
            self.fault(path, f"{what} {e.source!r} reads undeclared var(s) {', '.join(missing)}; declare them in "
                             f"$.vars or fix the expression")
            return None
        if len(e.vars) > MAX_CORNER_VARS:
            self.fault(path, f"{what} {e.source!r} reads {len(e.vars)} vars; at most {MAX_CORNER_VARS} are supported")
            return None
        if not self.afford((e,), path, what):
            return None
        out = []
        for corner in self.corners(e.vars):
            try:
                value = e.eval(corner)
            except ExprError as exc:
                self.fault(path, f"{what} {e.source!r}{_at(corner)}: {exc.message}")
                return None
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                bounds = f">= {lo}" if hi is None else (f"<= {hi}" if lo is None else f"in [{lo}, {hi}]")
                self.fault(path, f"{what} {e.source!r} is {value}{_at(corner)}; it must be {bounds}{hint}")
                return None
            out.append((corner, value))
        return out

    def max_value(self, e: Expr, path: str, what: str, lo: int | None = None, hi: int | None = None) -> int | None:
        vals = self.values(e, path, what, lo, hi)
        return None if vals is None else max(v for _, v in vals)


def _at(corner: Mapping[str, int]) -> str:
    """" at tokens=1, seqs=4" for a fault message ("" for no vars)."""
    at = ", ".join(f"{k}={v}" for k, v in corner.items())
    return f" at {at}" if at else ""
