"""The integer expression language: exact values, floor semantics, errors with positions, no eval."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kern_manifest import Expr, ExprError, ManifestParseError, parse_expr

VARS = {"tokens": 37, "seqs": 3, "pages": 0, "big": 2**62}


@pytest.mark.parametrize("source, value", [
    ("1 + 2 * 3", 7),
    ("(1 + 2) * 3", 9),
    ("10 - 4 - 3", 3),  # left-associative
    ("2 * 3 % 4", 2),  # (2*3) % 4
    ("2 + 3 % 4", 5),
    ("100 // 10 // 3", 3),  # (100//10)//3
    ("-2 * 3", -6),
    ("- -4", 4),
    ("-7 // 2", -4),  # floor, not truncation
    ("-7 % 2", 1),  # sign of the divisor
    ("7 // 2", 3),
    ("7 % 3", 1),
    ("-(7 // 2)", -3),
    ("cdiv(7, 2)", 4),
    ("cdiv(8, 2)", 4),
    ("cdiv(0, 5)", 0),
    ("cdiv(-7, 2)", -3),
    ("min(5, 2, 9)", 2),
    ("max(5, 2, 9)", 9),
    ("min(4)", 4),
    ("max(tokens, 64) * 2", 128),
    ("cdiv(tokens, 16) * 16", 48),
    ("tokens * seqs - pages", 111),
    ("min(cdiv(tokens, 8), seqs + 10)", 5),
    ("  tokens  ", 37),
    ("big - 1 + big", 2**63 - 1),  # the largest i64, reached exactly
    ("0", 0),
])
def test_value(source: str, value: int) -> None:
    assert Expr(source).eval(VARS) == value


def test_integer_literal_and_written_form() -> None:
    e = Expr(512)
    assert (e.eval({}), e.source, e.json, e.vars, e.is_const) == (512, "512", 512, frozenset(), True)
    s = Expr("cdiv(tokens, 16) + seqs")
    assert (s.source, s.json, s.vars, s.is_const) == ("cdiv(tokens, 16) + seqs", "cdiv(tokens, 16) + seqs",
                                                      frozenset({"tokens", "seqs"}), False)
    assert Expr("a+1") != Expr("a + 1")  # equality is by written form (what the digest hashes)
    assert Expr(1) != Expr("1")
    assert Expr("a + 1") == Expr("a + 1") and hash(Expr("a + 1")) == hash(Expr("a + 1"))
    assert parse_expr("a + 1", "$.x") == Expr("a + 1")


@pytest.mark.parametrize("source, position, words", [
    ("", 0, "empty expression"),
    ("   ", 0, "empty expression"),
    ("1 +", 3, "expected a number"),
    ("tokens / 2", 7, "use '//'"),
    ("(tokens + 1", 11, "expected ')'"),
    ("tokens + 1)", 10, "unexpected ')'"),
    ("1 2", 2, "unexpected '2'"),
    ("min()", 4, "expected a number"),
    ("cdiv(1)", 0, "cdiv takes exactly 2"),
    ("cdiv(1, 2, 3)", 0, "cdiv takes exactly 2"),
    ("max", 3, "max is a function"),
    ("pow(2, 3)", 0, "unknown function 'pow'"),
    ("__import__('os')", 11, "unexpected character \"'\""),
    ("__import__(os)", 0, "unknown function '__import__'"),
    ("tokens.real", 6, "unexpected character '.'"),
    ("1 ** 2", 3, "expected a number"),
    ("a; b", 1, "unexpected character ';'"),
    ("lambda: 1", 6, "unexpected character ':'"),
    ("1e3", 1, "unexpected 'e3'"),
    ("0x10", 1, "unexpected 'x10'"),
])
def test_bad_syntax_is_a_parse_error_with_position(source: str, position: int, words: str) -> None:
    with pytest.raises(ManifestParseError) as info:
        Expr(source, "$.ops.x.launches[0].grid[0]")
    assert info.value.path == "$.ops.x.launches[0].grid[0]"
    assert f"at position {position}:" in info.value.message
    assert words in info.value.message


@pytest.mark.parametrize("value", [True, 1.5, None, [1], {"a": 1}])
def test_non_expression_json_values_are_parse_errors(value: object) -> None:
    with pytest.raises(ManifestParseError, match="expected an integer or an expression string"):
        Expr(value)  # type: ignore[arg-type]


def test_too_deep_or_too_long_is_a_parse_error_not_a_recursion_error() -> None:
    with pytest.raises(ManifestParseError, match="nested deeper than 64"):
        Expr("(" * 200 + "1" + ")" * 200)
    with pytest.raises(ManifestParseError, match="nested deeper than 64"):
        Expr("-" * 200 + "1")
    with pytest.raises(ManifestParseError, match="longer than 4096"):
        Expr("1+" * 3000 + "1")


@pytest.mark.parametrize("source, values, words", [
    ("tokens // seqs", {"tokens": 4, "seqs": 0}, "// divisor is 0"),
    ("tokens % seqs", {"tokens": 4, "seqs": -2}, "% divisor is -2"),
    ("cdiv(tokens, seqs)", {"tokens": 4, "seqs": 0}, "cdiv divisor is 0"),
    ("tokens + 1", {}, "var 'tokens' has no value"),
    ("tokens * tokens", {"tokens": 2**32}, "outside the signed 64-bit range"),
    ("tokens - 1", {"tokens": -(2**63)}, "outside the signed 64-bit range"),
    ("9223372036854775808", {}, "outside the signed 64-bit range"),
])
def test_eval_errors(source: str, values: dict[str, int], words: str) -> None:
    with pytest.raises(ExprError) as info:
        Expr(source).eval(values)
    assert words in info.value.message


def test_expr_is_immutable() -> None:
    e = Expr("tokens")
    with pytest.raises(AttributeError):
        e.foo = 1  # type: ignore[attr-defined]


# Property: random expression trees render to text whose value matches Python integer arithmetic
# computed alongside (the test's own oracle; the library never evaluates Python code).

def _tree() -> st.SearchStrategy[tuple[str, int]]:
    leaves = st.one_of(
        st.integers(0, 1000).map(lambda n: (str(n), n)),
        st.sampled_from(sorted(VARS.items())[:3]).map(lambda kv: (kv[0], kv[1])),
    )

    def extend(children: st.SearchStrategy[tuple[str, int]]) -> st.SearchStrategy[tuple[str, int]]:
        def binary(op: str) -> st.SearchStrategy[tuple[str, int]]:
            def build(pair: tuple[tuple[str, int], tuple[str, int]]) -> tuple[str, int]:
                (a, x), (b, y) = pair
                if op in ("//", "%"):
                    y = abs(y) + 1
                    b = f"(({b}) * ({b}) - ({b}) * ({b}) + {y})"  # always y, always > 0
                value = {"+": x + y, "-": x - y, "*": x * y, "//": x // y if y else 0, "%": x % y if y else 0}[op]
                return f"({a}) {op} ({b})", value
            return st.tuples(children, children).map(build)

        return st.one_of(
            *(binary(op) for op in ("+", "-", "*", "//", "%")),
            children.map(lambda c: (f"-({c[0]})", -c[1])),
            st.lists(children, min_size=1, max_size=3).map(
                lambda cs: (f"min({', '.join(c[0] for c in cs)})", min(c[1] for c in cs))),
            st.lists(children, min_size=1, max_size=3).map(
                lambda cs: (f"max({', '.join(c[0] for c in cs)})", max(c[1] for c in cs))),
            st.tuples(children, st.integers(1, 50)).map(
                lambda p: (f"cdiv({p[0][0]}, {p[1]})", -((-p[0][1]) // p[1]))),
        )

    return st.recursive(leaves, extend, max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(_tree())
def test_random_expressions_match_integer_arithmetic(case: tuple[str, int]) -> None:
    source, value = case
    if len(source) > 4096 or abs(value) >= 2**62:
        return
    try:
        got = Expr(source).eval(VARS)
    except ManifestParseError as exc:  # only nesting depth may refuse a generated tree
        assert "nested deeper" in exc.message
        return
    except ExprError as exc:
        assert "64-bit" in exc.message  # an intermediate grew past i64
        return
    assert got == value
