"""Integer expressions over vars: a recursive-descent parser and an evaluator (never `eval`).

Grammar (docs/manifest.md, "Vars and integer expressions"):

    expr   := term (('+' | '-') term)*
    term   := unary (('*' | '//' | '%') unary)*
    unary  := '-' unary | atom
    atom   := INT | NAME | '(' expr ')' | FUNC '(' expr (',' expr)* ')'
    FUNC   := 'min' | 'max' | 'cdiv'

NAME is `[A-Za-z_][A-Za-z0-9_]*` (inside an expression `-` is always minus). `//` and `%` are floor
division and modulo (Python semantics) and need a divisor > 0; `cdiv(a, b)` = ceil(a / b) needs b > 0;
`min`/`max` take one or more arguments, `cdiv` exactly two. Every intermediate value must lie in the
signed 64-bit range.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .errors import ExprError, ManifestParseError

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1
MAX_SOURCE_CHARS = 4096
MAX_DEPTH = 64
FUNCS = {"min": (1, None), "max": (1, None), "cdiv": (2, 2)}  # name -> (min args, max args or None)

_TOKEN = re.compile(r"\s*(?:(?P<int>[0-9]+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>//|[-+*%(),/]))")

# AST nodes are tuples: ("int", v) | ("var", name) | ("neg", a) | (op, a, b) for op in + - * // % |
# ("call", func, (args...)).
Node = tuple[Any, ...]


class _Parser:
    def __init__(self, source: str, path: str) -> None:
        self.source = source
        self.path = path
        self.tokens: list[tuple[str, str, int]] = []  # (kind, text, position)
        pos = 0
        end = len(source.rstrip())
        while pos < end:
            match = _TOKEN.match(source, pos)
            if match is None:
                at = pos + len(source[pos:]) - len(source[pos:].lstrip())
                self.fail(at, f"unexpected character {source[at]!r}")
            kind = match.lastgroup
            assert kind is not None
            self.tokens.append((kind, match.group(kind), match.start(kind)))
            pos = match.end()
        self.tokens.append(("end", "", len(source)))
        self.index = 0

    def fail(self, position: int, message: str) -> None:
        raise ManifestParseError(self.path, f"bad expression {self.source!r} at position {position}: {message}")

    def peek(self) -> tuple[str, str, int]:
        return self.tokens[self.index]

    def take(self) -> tuple[str, str, int]:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def expect(self, text: str) -> None:
        kind, got, position = self.take()
        if got != text or kind not in ("op",):
            self.fail(position, f"expected {text!r}, found {got or 'end of input'!r}")

    def parse(self) -> Node:
        if len(self.tokens) == 1:
            self.fail(0, "empty expression")
        node = self.expr(0)
        kind, text, position = self.peek()
        if kind != "end":
            self.fail(position, f"unexpected {text!r} after a complete expression")
        return node

    def expr(self, depth: int) -> Node:
        if depth > MAX_DEPTH:
            self.fail(self.peek()[2], f"nested deeper than {MAX_DEPTH} levels")
        node = self.term(depth)
        while self.peek()[1] in ("+", "-") and self.peek()[0] == "op":
            op = self.take()[1]
            node = (op, node, self.term(depth))
        return node

    def term(self, depth: int) -> Node:
        node = self.unary(depth)
        while self.peek()[0] == "op" and self.peek()[1] in ("*", "//", "%", "/"):
            op, position = self.take()[1:]
            if op == "/":
                self.fail(position, "'/' is not an operator: use '//' (floor division) or cdiv(a, b)")
            node = (op, node, self.unary(depth))
        return node

    def unary(self, depth: int) -> Node:
        if depth > MAX_DEPTH:
            self.fail(self.peek()[2], f"nested deeper than {MAX_DEPTH} levels")
        if self.peek()[:2] == ("op", "-"):
            self.take()
            return ("neg", self.unary(depth + 1))
        return self.atom(depth)

    def atom(self, depth: int) -> Node:
        kind, text, position = self.take()
        if kind == "int":
            return ("int", int(text))
        if kind == "name":
            if text in FUNCS:
                return self.call(text, position, depth)
            if self.peek()[:2] == ("op", "("):
                self.fail(position, f"unknown function {text!r}: the functions are min, max and cdiv")
            return ("var", text)
        if (kind, text) == ("op", "("):
            node = self.expr(depth + 1)
            self.expect(")")
            return node
        self.fail(position, f"expected a number, a var name, a function or '(', found {text or 'end of input'!r}")
        raise AssertionError("unreachable")

    def call(self, func: str, position: int, depth: int) -> Node:
        if self.peek()[:2] != ("op", "("):
            self.fail(self.peek()[2], f"{func} is a function: write {func}(...)")
        self.take()
        args = [self.expr(depth + 1)]
        while self.peek()[:2] == ("op", ","):
            self.take()
            args.append(self.expr(depth + 1))
        self.expect(")")
        least, most = FUNCS[func]
        if len(args) < least or (most is not None and len(args) > most):
            wanted = f"exactly {least}" if least == most else f"at least {least}"
            self.fail(position, f"{func} takes {wanted} argument(s), got {len(args)}")
        return ("call", func, tuple(args))


def _children(node: Node) -> tuple[Node, ...]:
    """The operands of a node, left to right."""
    tag = node[0]
    if tag in ("int", "var"):
        return ()
    if tag == "neg":
        return (node[1],)
    if tag == "call":
        return node[2]
    return (node[1], node[2])


def _collect_vars(root: Node, out: set[str]) -> int:
    """Add the var names under `root` to `out`; returns the number of nodes."""
    # iterative: `1+1+...+1` (up to MAX_SOURCE_CHARS) parses into a left-deep tree far deeper than Python's
    # recursion limit, while its parentheses nest only MAX_DEPTH deep
    stack = [root]
    nodes = 0
    while stack:
        node = stack.pop()
        nodes += 1
        if node[0] == "var":
            out.add(node[1])
        stack.extend(_children(node))
    return nodes


def _show(value: int) -> str:
    """An integer for a message: its digits, or `~2^bits` (signed) past 128 bits (Python refuses to print
    integers of more than 4300 digits)."""
    if value.bit_length() <= 128:
        return str(value)
    return f"{'-' if value < 0 else ''}~2^{value.bit_length()}"


class Expr:
    """An integer expression: a JSON integer or a string in the grammar above. Immutable, hashable.

    `Expr(7)`, `Expr("cdiv(tokens, 16) * 4")`. Raises `ManifestParseError` (carrying `path`) on bad
    syntax, naming the position. Equality is by written form (`Expr("a+1") != Expr("a + 1")`), which is
    what the digest sees.
    """

    __slots__ = ("_json", "_node", "_vars", "_nodes")

    def __init__(self, source: int | str, path: str = "$") -> None:
        if isinstance(source, bool) or not isinstance(source, (int, str)):
            raise ManifestParseError(path, f"expected an integer or an expression string, got {type(source).__name__}")
        node: Node
        if isinstance(source, int):
            if not I64_MIN <= source <= I64_MAX:
                raise ManifestParseError(path, f"integer {_show(source)} is outside the signed 64-bit range")
            node = ("int", source)
        else:
            if len(source) > MAX_SOURCE_CHARS:
                raise ManifestParseError(path, f"expression longer than {MAX_SOURCE_CHARS} characters")
            node = _Parser(source, path).parse()
        names: set[str] = set()
        object.__setattr__(self, "_nodes", _collect_vars(node, names))
        object.__setattr__(self, "_json", source)
        object.__setattr__(self, "_node", node)
        object.__setattr__(self, "_vars", frozenset(names))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Expr is immutable")

    @property
    def source(self) -> str:
        """The expression text (`str(n)` for an integer literal)."""
        return self._json if isinstance(self._json, str) else str(self._json)

    @property
    def json(self) -> int | str:
        """The JSON value it was written as (integer or string)."""
        return self._json

    @property
    def vars(self) -> frozenset[str]:
        """Names of the vars the expression reads."""
        return self._vars

    @property
    def nodes(self) -> int:
        """Nodes of the parsed expression (operators, literals, var reads): what one `eval` visits."""
        return self._nodes

    @property
    def is_const(self) -> bool:
        """True when the expression reads no var."""
        return not self._vars

    def eval(self, vars: Mapping[str, int]) -> int:
        """Value with the given var values. Raises `ExprError` for a `vars` that is not a mapping, a missing var,
        a var value that is not an int, a divisor <= 0, or any intermediate value outside the signed 64-bit
        range."""
        if not isinstance(vars, Mapping):
            raise ExprError(self.source, f"var values must be a mapping of names to ints, got {type(vars).__name__}")
        return self._eval(self._node, vars)

    def _eval(self, root: Node, vars: Mapping[str, int]) -> int:
        # post-order with an explicit stack (see _collect_vars): operands left to right, as a recursive
        # evaluator would, so the first fault raised is the same
        values: list[int] = []
        stack: list[tuple[Node, bool]] = [(root, False)]
        while stack:
            node, operands_done = stack.pop()
            kids = _children(node)
            if kids and not operands_done:
                stack.append((node, True))
                stack.extend((kid, False) for kid in reversed(kids))
                continue
            args = values[len(values) - len(kids):] if kids else []
            del values[len(values) - len(kids):]
            values.append(self._apply(node, args, vars))
        return values[0]

    def _apply(self, node: Node, args: list[int], vars: Mapping[str, int]) -> int:
        """One node's value from its operands' values."""
        tag = node[0]
        if tag == "int":
            value = node[1]
        elif tag == "var":
            if node[1] not in vars:
                raise ExprError(self.source, f"var {node[1]!r} has no value")
            value = vars[node[1]]
            if isinstance(value, bool) or not isinstance(value, int):
                raise ExprError(self.source, f"var {node[1]!r} = {value!r}: a var's value is an int")
        elif tag == "neg":
            value = -args[0]
        elif tag == "call":
            if node[1] == "min":
                value = min(args)
            elif node[1] == "max":
                value = max(args)
            else:
                if args[1] <= 0:
                    raise ExprError(self.source, f"cdiv divisor is {args[1]}; it must be > 0")
                value = -((-args[0]) // args[1])
        else:
            left, right = args
            if tag == "+":
                value = left + right
            elif tag == "-":
                value = left - right
            elif tag == "*":
                value = left * right
            else:
                if right <= 0:
                    raise ExprError(self.source, f"{tag} divisor is {right}; it must be > 0")
                value = left // right if tag == "//" else left % right
        if not I64_MIN <= value <= I64_MAX:
            raise ExprError(self.source, f"intermediate value {_show(value)} is outside the signed 64-bit range")
        return value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Expr):
            return NotImplemented
        return type(self._json) is type(other._json) and self._json == other._json

    def __hash__(self) -> int:
        return hash((type(self._json).__name__, self._json))

    def __repr__(self) -> str:
        return f"Expr({self._json!r})"

    def __str__(self) -> str:
        return self.source


def parse_expr(source: int | str, path: str = "$") -> Expr:
    """`Expr(source, path)`: parse an integer expression (raises `ManifestParseError` on bad syntax)."""
    return Expr(source, path)
