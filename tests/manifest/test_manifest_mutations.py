"""Hypothesis mutations of a valid manifest: the verifier never crashes with anything but the two
manifest errors, and whatever it accepts round-trips exactly."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kern_manifest import ManifestParseError, ManifestVerifyError, parse_manifest, verify

EXAMPLE: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "example.json").read_text())

# Names that occur in the example, so "rename a reference" often lands on another real name.
NAMES = sorted({"tokens", "seqs", "hidden", "normed", "embed", "rope", "kv.0", "w_qkv.0", "step", "decode", "load",
                "gemm", "argmax", "x", "w", "out", "n_tokens", "part_val", "tp", "i32", "u64", "f32", "ptr", "int",
                "weight", "paged", "fixed", "per_seq", "derive", "once", "bf16", "cublaslt_bf16_tn", "nccl_allreduce_f32",
                "tokens - 65", "tokens * 4611686018427387904", "cdiv(tokens, seqs - 1)", "(", "", "1//0"})

JSON_SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(-3, 70), st.integers(-(2**64), 2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(NAMES), st.text(max_size=8),
)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda c: st.one_of(st.lists(c, max_size=3),
                                                              st.dictionaries(st.sampled_from(NAMES), c, max_size=3)),
                           max_leaves=6)


def paths_of(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += paths_of(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += paths_of(v, (*prefix, i))
    return out


def get(node: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        node = node[p]
    return node


def mutate(obj: dict[str, Any], kind: str, pick: int, value: Any) -> None:
    paths = [p for p in paths_of(obj) if p]
    if not paths:
        return
    path = paths[pick % len(paths)]
    parent, key = get(obj, path[:-1]), path[-1]
    current = parent[key]
    if kind == "delete":
        del parent[key]
    elif kind == "replace":
        parent[key] = value
    elif kind == "number" and isinstance(current, int) and not isinstance(current, bool):
        parent[key] = current + (value if isinstance(value, int) and not isinstance(value, bool) else -1)
    elif kind == "rename" and isinstance(current, str):
        parent[key] = value if isinstance(value, str) else current + "_x"
    elif kind == "rename_key" and isinstance(parent, dict):
        new = value if isinstance(value, str) else f"{key}_x"
        parent[new] = parent.pop(key)
    elif kind == "duplicate" and isinstance(parent, list):
        parent.insert(key, copy.deepcopy(current))
    elif kind == "add_key" and isinstance(current, dict):
        current[value if isinstance(value, str) else "extra"] = copy.deepcopy(current)


MUTATIONS = st.lists(st.tuples(st.sampled_from(["delete", "replace", "number", "rename", "rename_key", "duplicate",
                                                "add_key"]),
                               st.integers(0, 10_000), JSON_VALUES), min_size=1, max_size=4)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(MUTATIONS)
def test_mutations_only_raise_manifest_errors(mutations: list[tuple[str, int, Any]]) -> None:
    obj = copy.deepcopy(EXAMPLE)
    for kind, pick, value in mutations:
        mutate(obj, kind, pick, value)
    try:
        m = parse_manifest(json.dumps(obj))
        verify(m)
    except ManifestParseError as exc:
        assert exc.path.startswith("$") and exc.message
        return
    except ManifestVerifyError as exc:
        assert exc.faults and all(f.path.startswith("$") and f.message for f in exc.faults)
        return
    # Accepted: it must round-trip exactly, and its derived quantities must be computable.
    assert m.to_json() == obj
    assert parse_manifest(m.to_json()) == m
    for buf in m.buffers.values():
        assert buf.nbytes_at_max(m.vars) >= 0
    for prog in m.programs.values():
        assert prog.vars_read(m) <= set(m.vars)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64) | st.text(max_size=64))
def test_garbage_text_is_a_parse_error(data: bytes | str) -> None:
    try:
        verify(parse_manifest(data))
    except ManifestParseError as exc:
        assert exc.path == "$"
        return
    except ManifestVerifyError:  # pragma: no cover - garbage cannot be a complete manifest
        raise AssertionError("garbage parsed as a manifest")
    raise AssertionError("garbage accepted")
