"""Fitting an integer that varies between runs as an expression in the token count.

The specification's miner reports an "expression fitting" for every launch value that is not a pointer
(../shared/seed/runtime.md, the harvest flow); here that is, for samples `(t_i, v_i)` (the value `v_i` seen in
the run at `t_i` tokens, one sample per run, at least two runs):

1. every `v_i` equal: the literal `v`;
2. else the first family, in this order, whose integer coefficients reproduce every sample exactly:
   `a * t + b`, then `a * cdiv(t, d) + b` and `a * (t // d) + b` for `d` = 2, 4, ..., 4096 (block sizes:
   grids and per-block counts are of this form); `a` and `b` are solved from the two samples with the smallest
   and largest basis value, then every sample is checked;
3. nothing fits: FitError (the miner reports the value as unexplained).

Each fit is then asserted through kern_manifest's own evaluator (`parse_expr(expr).eval`), so what the manifest
will compute is what the capture saw. With two samples a linear fit exists whenever `v_2 - v_1` is a multiple of
`t_2 - t_1`, so two runs at adjacent token counts (1 and 2) always fit: the expression is then exact on the var's
whole domain `[1, 2]`, which the generator declares; with gaps between the runs, values between them are the
family's prediction (`Fit.exact_on_domain` says which).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kern_manifest import ExprError, ManifestParseError, parse_expr

DIVISORS = tuple(1 << k for k in range(1, 13))


class FitError(ValueError):
    """No family reproduces the samples (the message lists them)."""


@dataclass(frozen=True)
class Fit:
    """`expr`: a kern integer expression (an int for a literal, else a string over `var`); `family`: `literal`,
    `linear`, `cdiv` or `floordiv`; `samples`: the (t, v) it reproduces; `exact_on_domain`: every integer of
    `[min t, max t]` was sampled, so the expression is the captured value wherever the var can be."""

    expr: int | str
    family: str
    samples: tuple[tuple[int, int], ...]
    exact_on_domain: bool

    @property
    def is_literal(self) -> bool:
        return self.family == "literal"

    def at(self, t: int, var: str = "tokens") -> int:
        """The expression's value at `var = t` (kern_manifest's evaluator)."""
        return self.expr if isinstance(self.expr, int) else parse_expr(self.expr).eval({var: t})


def _term(a: int, basis: str) -> str:
    return basis if a == 1 else f"-{basis}" if a == -1 else f"{a} * {basis}"


def render(a: int, basis: str, b: int) -> str:
    """`a * basis + b` in the manifest's expression grammar, without unit factors or a zero offset."""
    text = _term(a, basis)
    return text if b == 0 else f"{text} + {b}" if b > 0 else f"{text} - {-b}"


def _families(var: str) -> list[tuple[str, str, Callable[[int], int]]]:
    out: list[tuple[str, str, Callable[[int], int]]] = [("linear", var, lambda t: t)]
    for d in DIVISORS:
        out.append(("cdiv", f"cdiv({var}, {d})", lambda t, d=d: -(-t // d)))
        out.append(("floordiv", f"({var} // {d})", lambda t, d=d: t // d))
    return out


def fit_samples(samples: Sequence[tuple[int, int]], var: str = "tokens") -> Fit:
    """The simplest expression (module docstring) reproducing `samples`: (t, v) pairs with distinct t >= 1.
    Raises FitError when none does, ValueError for fewer than one sample or repeated t; asserts that the
    expression, evaluated by kern_manifest, gives every sample."""
    pairs = tuple((int(t), int(v)) for t, v in samples)
    ts = [t for t, _ in pairs]
    if not pairs or len(set(ts)) != len(ts):
        raise ValueError(f"samples {list(pairs)}: need one or more with distinct token counts")
    exact = set(range(min(ts), max(ts) + 1)) <= set(ts)
    values = {v for _, v in pairs}
    if len(values) == 1:
        return Fit(values.pop(), "literal", pairs, exact)
    for family, basis, u in _families(var):
        us = [(u(t), v) for t, v in pairs]
        (u0, v0), (u1, v1) = min(us), max(us)
        if u0 == u1 or (v1 - v0) % (u1 - u0):
            continue
        a = (v1 - v0) // (u1 - u0)
        b = v0 - a * u0
        if a == 0 or any(a * x + b != v for x, v in us):
            continue
        fit = Fit(render(a, basis, b), family, pairs, exact)
        _assert_reproduces(fit, var)
        return fit
    raise FitError(f"no expression in {var} reproduces {', '.join(f'{v} at {var}={t}' for t, v in pairs)} (tried "
                   f"a*{var}+b, a*cdiv({var},d)+b and a*({var}//d)+b for d up to {DIVISORS[-1]})")


def _assert_reproduces(fit: Fit, var: str) -> None:
    try:
        got = [(t, fit.at(t, var)) for t, _ in fit.samples]
    except (ExprError, ManifestParseError) as exc:  # a bug in render: the grammar is kern_manifest's
        raise AssertionError(f"fit {fit.expr!r} does not evaluate: {exc}") from None
    assert got == list(fit.samples), f"fit {fit.expr!r} gives {got}, the capture {list(fit.samples)}"
