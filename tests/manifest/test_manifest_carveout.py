"""`carveout` on a kernel launch: the model, round trip, digest and every fault (range, type, conflicts)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from manifest_testkit import assert_parse_fault, assert_verify_faults, mutate

from kern_manifest import Launch, ManifestParseError, find_faults, parse_manifest, verify

EXAMPLE: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "example.json").read_text())
NORM = "$.ops.rmsnorm.launches[0]"


def mutated(change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    return mutate(EXAMPLE, change)


def launch(o: dict[str, Any], op: str = "rmsnorm", i: int = 0) -> dict[str, Any]:
    return o["ops"][op]["launches"][i]


def second_norm_op(o: dict[str, Any], carveout: int | None) -> None:
    """Add op `rmsnorm_b`: a copy of `rmsnorm` (the same module and entry) with `carveout` (None: without it)."""
    op = copy.deepcopy(o["ops"]["rmsnorm"])
    op["launches"][0].pop("carveout", None)
    if carveout is not None:
        op["launches"][0]["carveout"] = carveout
    o["ops"]["rmsnorm_b"] = op


@pytest.mark.parametrize("value", [0, 50, 100])
def test_carveout_parses_into_the_model_and_round_trips(value: int) -> None:
    obj = mutated(lambda o: launch(o).update(carveout=value))
    m = parse_manifest(obj)
    verify(m)
    norm = m.ops["rmsnorm"].launches[0]
    assert isinstance(norm, Launch) and norm.carveout == value
    assert norm.to_json()["carveout"] == value
    assert m.to_json() == obj  # written back where given, 0 included
    assert parse_manifest(m.to_json()) == m
    assert parse_manifest(json.dumps(m.to_json(), indent=1)) == m


def test_a_launch_without_carveout_has_none_and_writes_no_key() -> None:
    m = parse_manifest(EXAMPLE)
    norm = m.ops["rmsnorm"].launches[0]
    assert isinstance(norm, Launch) and norm.carveout is None
    assert "carveout" not in norm.to_json()
    assert m.to_json() == EXAMPLE


def test_carveout_is_part_of_the_digest_and_the_family_digest() -> None:
    base = parse_manifest(EXAMPLE)
    full = parse_manifest(mutated(lambda o: launch(o).update(carveout=100)))
    half = parse_manifest(mutated(lambda o: launch(o).update(carveout=50)))
    assert len({base.digest, full.digest, half.digest}) == 3
    assert len({base.family_digest, full.family_digest, half.family_digest}) == 3


def test_launches_of_one_function_agree_or_leave_it_out() -> None:
    """The same (module, entry) from two ops: equal values, or one of them without carveout, verify."""
    for other in (100, None):
        obj = mutated(lambda o: (launch(o).update(carveout=100), second_norm_op(o, other)))
        assert find_faults(parse_manifest(obj)) == []
    # another function of the same module may prefer another carveout
    obj = mutated(lambda o: (launch(o, "argmax", 0).update(carveout=100), launch(o, "argmax", 1).update(carveout=0)))
    assert find_faults(parse_manifest(obj)) == []


# (id, mutation, JSON path, a word the message must contain)
PARSE_CASES: list[tuple[str, Callable[[dict[str, Any]], Any], str, str]] = [
    ("carveout-float", lambda o: launch(o).update(carveout=50.5), f"{NORM}.carveout",
     "expected an integer, got a number"),
    ("carveout-bool", lambda o: launch(o).update(carveout=True), f"{NORM}.carveout",
     "expected an integer, got a boolean"),
    ("carveout-string", lambda o: launch(o).update(carveout="100"), f"{NORM}.carveout",
     "expected an integer, got a string"),
    ("carveout-null", lambda o: launch(o).update(carveout=None), f"{NORM}.carveout", "expected an integer, got null"),
]

# (id, mutation, expected fault paths (exactly these), a word the first message must contain)
VERIFY_CASES: list[tuple[str, Callable[[dict[str, Any]], Any], list[str], str]] = [
    ("carveout-negative", lambda o: launch(o).update(carveout=-1), [f"{NORM}.carveout"],
     "carveout is -1; it must be in [0, 100]"),
    ("carveout-above-100", lambda o: launch(o).update(carveout=101), [f"{NORM}.carveout"],
     "carveout is 101; it must be in [0, 100]"),
    ("carveout-on-extern", lambda o: launch(o, "gemm", 0).update(carveout=100), ["$.ops.gemm.launches[0].carveout"],
     "unknown key 'carveout'"),
    ("carveout-conflict", lambda o: (launch(o).update(carveout=100), second_norm_op(o, 50)),
     ["$.ops.rmsnorm_b.launches[0].carveout"],
     "carveout 50 of entry 'kern_add_rmsnorm' (module 'norm') differs from carveout 100 at "
     "$.ops.rmsnorm.launches[0].carveout"),
    ("carveout-conflict-within-one-op",
     lambda o: o["ops"]["argmax"]["launches"].extend([dict(launch(o, "argmax", 1), carveout=c) for c in (100, 25)]),
     ["$.ops.argmax.launches[3].carveout"], "differs from carveout 100 at $.ops.argmax.launches[2].carveout"),
]


@pytest.mark.parametrize("change, path, words", [c[1:] for c in PARSE_CASES], ids=[c[0] for c in PARSE_CASES])
def test_a_carveout_that_is_not_an_integer_is_a_parse_error(change: Callable[[dict[str, Any]], Any], path: str,
                                                             words: str) -> None:
    assert_parse_fault(json.dumps(mutated(change)), path, words)


@pytest.mark.parametrize("change, paths, words", [c[1:] for c in VERIFY_CASES], ids=[c[0] for c in VERIFY_CASES])
def test_a_bad_carveout_is_a_verify_fault(change: Callable[[dict[str, Any]], Any], paths: list[str],
                                          words: str) -> None:
    assert_verify_faults(mutated(change), paths, words)


def test_every_disagreeing_launch_is_a_fault_and_range_faults_come_too() -> None:
    def change(o: dict[str, Any]) -> None:
        launch(o).update(carveout=100)
        second_norm_op(o, 50)
        o["ops"]["rmsnorm_c"] = copy.deepcopy(o["ops"]["rmsnorm_b"])
        launch(o, "rmsnorm_c").update(carveout=101)

    faults = find_faults(parse_manifest(mutated(change)))
    assert [f.path for f in faults] == ["$.ops.rmsnorm_c.launches[0].carveout",  # out of range (check_launch)
                                        "$.ops.rmsnorm_b.launches[0].carveout",  # then the conflicts
                                        "$.ops.rmsnorm_c.launches[0].carveout"]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), st.booleans(), st.integers(-200, 300), st.integers(-(2**64), 2**64),
                 st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=4)))
def test_any_json_value_as_carveout_is_accepted_exactly_when_an_integer_in_0_to_100(value: Any) -> None:
    obj = mutated(lambda o: launch(o).update(carveout=value))
    accept = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 100
    try:
        m = parse_manifest(json.dumps(obj))
    except ManifestParseError as exc:
        assert not isinstance(value, int) or isinstance(value, bool)
        assert exc.path == f"{NORM}.carveout"
        return
    faults = find_faults(m)
    if not accept:
        assert [f.path for f in faults] == [f"{NORM}.carveout"]
        return
    assert faults == []
    assert m.ops["rmsnorm"].launches[0].carveout == value
    assert m.to_json() == obj


@pytest.mark.parametrize("value", [True, 50.5, "100"])
def test_a_python_built_launch_with_a_non_integer_carveout_is_a_verify_fault(value: Any) -> None:
    """parse_manifest refuses these; a Manifest built (or replaced into) in Python reaches verify with them."""
    import dataclasses

    m = parse_manifest(EXAMPLE)
    op = m.ops["rmsnorm"]
    bad = dataclasses.replace(op, launches=(dataclasses.replace(op.launches[0], carveout=value), *op.launches[1:]))
    faults = find_faults(dataclasses.replace(m, ops={**m.ops, "rmsnorm": bad}))
    assert [f.path for f in faults] == [f"{NORM}.carveout"]
    assert "must be an integer percent" in faults[0].message
