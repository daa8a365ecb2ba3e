"""How the `Runtime` façade exposes its parts' methods without a mixin: `method(part, fn)` and `attribute(part,
prop)`, one class attribute per name.

Each becomes a read-only attribute of the façade that is the part's attribute (a bound method or a property's
value): `rt.lease(...)` is `rt.kv.lease(...)`. The part is an ordinary object with explicit constructor arguments,
held as an attribute of the runtime; its docstrings and signatures are the façade's, for `help` and
`inspect.signature` and for type checkers alike (`method` keeps `fn`'s parameters: mypy checks `rt.lease(...)`
against `DevicePool.lease`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")


class _Delegated:
    """A façade attribute read from its part: `getattr(getattr(obj, part), name)`. Read on the class, it is the
    part class's own attribute (the function or property), so `inspect.signature(Runtime.lease)` and `help`
    show the part's signature and docstring."""

    def __init__(self, part: str, name: str, declared: Any) -> None:
        self.part, self.name, self.declared = part, name, declared
        self.__doc__ = getattr(declared, "__doc__", None)

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self.declared
        return getattr(getattr(obj, self.part), self.name)

    def __set__(self, obj: Any, value: Any) -> None:  # a data descriptor: read-only, never shadowed
        raise AttributeError(f"{self.name} is read-only (it is {self.part}.{self.name})")


def method(part: str, fn: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[Any, P], R]:
    """The façade's method `fn.__name__`: the bound method of the façade's attribute `part` (`fn` is the part
    class's function: `method("kv", DevicePool.lease)`)."""
    return cast(Any, _Delegated(part, fn.__name__, fn))


def attribute(part: str, declared: Any) -> Any:
    """The façade's read-only attribute that is attribute `declared` of its attribute `part`: a property, or a
    `__slots__` member, read on the part class (annotate the façade's attribute with its type: `kern_pool: Pool =
    attribute("kv", DevicePool.kern_pool)`). Raises TypeError for anything else."""
    if isinstance(declared, property) and declared.fget is not None:
        return _Delegated(part, declared.fget.__name__, declared)
    if type(declared).__name__ == "member_descriptor":
        return _Delegated(part, declared.__name__, declared)
    raise TypeError(f"attribute(): {declared!r} is no property or __slots__ member")
