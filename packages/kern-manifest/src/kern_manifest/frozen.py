"""Immutable JSON helpers: a hashable read-only mapping, freeze/thaw of JSON values, JSON paths."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class FrozenMap(Mapping[K, V]):
    """A read-only, insertion-ordered, hashable mapping (equality ignores order, like dict)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[K, V] | None = None) -> None:
        object.__setattr__(self, "_items", dict(items or {}))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("FrozenMap is immutable")

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"


def freeze(value: Any) -> Any:
    """A JSON value made immutable: objects -> FrozenMap, arrays -> tuple."""
    if isinstance(value, dict):
        return FrozenMap({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Inverse of `freeze`: plain dicts and lists again."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


def key_path(path: str, key: str) -> str:
    """`$.ops` + `rmsnorm` -> `$.ops.rmsnorm`; names that are not identifiers go in brackets:
    `$.buffers["w_qkv.0"]`."""
    if _IDENT.fullmatch(key):
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key)}]"


def index_path(path: str, index: int) -> str:
    """`$.x` + 3 -> `$.x[3]`."""
    return f"{path}[{index}]"


def canonical_json(obj: Any) -> str:
    """The canonical serialisation the digest hashes (docs/manifest.md, "Digest")."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
