"""How the `Runtime` façade exposes its parts' methods without a mixin: `delegates(part, *names)`.

Each name becomes a read-only attribute of the façade that is the part's attribute (a bound method or a
property's value): `rt.lease(...)` is `rt.kv.lease(...)`. The part is an ordinary object with explicit
constructor arguments, held as an attribute of the runtime; its docstrings are the façade's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


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


def delegates(part: str, part_class: type, *names: str) -> Callable[[type[T]], type[T]]:
    """Class decorator: each of `names` of the façade is attribute `name` of its attribute `part` (an instance
    of `part_class`, whose docstrings the façade shows)."""
    def decorate(cls: type[T]) -> type[T]:
        for name in names:
            assert not hasattr(cls, name), f"kern bug: {cls.__name__}.{name} is defined twice"
            setattr(cls, name, _Delegated(part, name, getattr(part_class, name)))
        return cls
    return decorate
