"""Shared by the manifest fault tests: mutate a base manifest, and assert the faults it raises."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from kern_manifest import ManifestParseError, ManifestVerifyError, parse_manifest, verify


def mutate(base: dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """A deep copy of `base` with `change` applied (its return value ignored)."""
    obj = copy.deepcopy(base)
    change(obj)
    return obj


def assert_parse_fault(text: str, path: str, words: str) -> None:
    """`text` fails to parse (or verify) with a ManifestParseError at `path` whose message holds `words`."""
    with pytest.raises(ManifestParseError) as info:
        verify(parse_manifest(text))
    assert info.value.path == path
    assert words in info.value.message


def assert_verify_faults(obj: dict[str, Any], paths: list[str], words: str) -> None:
    """`obj` parses, and verification reports exactly the faults at `paths`, the first naming `words`."""
    manifest = parse_manifest(obj)
    with pytest.raises(ManifestVerifyError) as info:
        verify(manifest)
    assert info.value.paths == paths, info.value.faults
    assert words in info.value.faults[0].message
