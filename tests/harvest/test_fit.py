"""fit.py: the families in their order, each fit reproducing its samples through kern_manifest's evaluator, and
values no family explains refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kern_manifest import parse_expr
from kern_run.harvest.fit import FitError, fit_samples


@pytest.mark.parametrize(("samples", "expr", "family", "exact"), [
    ([(1, 7), (2, 7)], 7, "literal", True),
    ([(1, 1), (2, 2)], "tokens", "linear", True),
    ([(1, 2560), (2, 5120)], "2560 * tokens", "linear", True),
    ([(1, 0), (2, 128)], "128 * tokens - 128", "linear", True),
    ([(1, -3), (2, -6)], "-3 * tokens", "linear", True),
    ([(1, 5), (2, 4)], "-tokens + 6", "linear", True),
    ([(1, 1), (3, 2)], "cdiv(tokens, 2)", "cdiv", False),  # 2-1 is no multiple of 3-1: not linear
    ([(1, 1), (2, 1), (3, 2), (64, 32)], "cdiv(tokens, 2)", "cdiv", False),
    ([(2, 1), (4, 2), (5, 2)], "(tokens // 2)", "floordiv", False),
    ([(1, 100), (2, 200), (3, 300)], "100 * tokens", "linear", True),
])
def test_families(samples, expr, family: str, exact: bool) -> None:  # type: ignore[no-untyped-def]
    fit = fit_samples(samples)
    assert (fit.expr, fit.family, fit.exact_on_domain) == (expr, family, exact)
    for t, v in samples:
        assert (parse_expr(expr).eval({"tokens": t}) if isinstance(expr, str) else expr) == v


def test_unexplained_values_are_refused_naming_them() -> None:
    with pytest.raises(FitError, match=r"no expression in tokens reproduces 0 at tokens=1, 5 at tokens=2, 7 at tokens=3"):
        fit_samples([(1, 0), (2, 5), (3, 7)])
    with pytest.raises(ValueError, match="distinct token counts"):
        fit_samples([(1, 0), (1, 1)])


@given(a=st.integers(-10**6, 10**6).filter(bool), b=st.integers(-10**9, 10**9),
       ts=st.lists(st.integers(1, 4096), min_size=2, max_size=5, unique=True))
def test_any_linear_samples_fit_and_reproduce(a: int, b: int, ts: list[int]) -> None:
    fit = fit_samples([(t, a * t + b) for t in ts], "n")
    assert fit.family == "linear"
    assert [parse_expr(fit.expr).eval({"n": t}) for t in ts] == [a * t + b for t in ts]


@given(a=st.integers(1, 1000), d=st.sampled_from([2, 4, 8, 64, 128]),
       ts=st.lists(st.integers(1, 4096), min_size=2, max_size=6, unique=True))
def test_block_counts_fit_and_reproduce(a: int, d: int, ts: list[int]) -> None:
    samples = [(t, a * -(-t // d)) for t in ts]
    fit = fit_samples(samples)
    assert [fit.at(t) for t in ts] == [v for _, v in samples]
