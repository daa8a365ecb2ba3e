"""The manifest fields a persistent kernel stands on: `cooperative` on a launch, `zero_each_run`, `error` and `init`
on a buffer. Model, round trip, digest, and every fault at its JSON path (docs/manifest.md)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from manifest_testkit import assert_parse_fault, assert_verify_faults, mutate

from kern_manifest import Buffer, BufferInit, ErrorWord, Launch, parse_manifest, verify

EXAMPLE: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "example.json").read_text())
NORM = "$.ops.rmsnorm.launches[0]"

COUNTERS = {"kind": "workspace", "dtype": "u32", "shape": [64], "zero_each_run": True}
ERROR = {"kind": "workspace", "dtype": "u32", "shape": [8], "placement": "host",
         "error": {"codes": {"1": "a counter wait timed out", "2": "an instruction has an unknown opcode"}}}


def mutated(change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    return mutate(EXAMPLE, change)


def norm(o: dict[str, Any]) -> dict[str, Any]:
    return o["ops"]["rmsnorm"]["launches"][0]


def with_buffer(name: str, spec: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return lambda o: o["buffers"].__setitem__(name, json.loads(json.dumps(spec)))


# ---------------------------------------------------------------------------------------------- cooperative


@pytest.mark.parametrize("value", [True, False])
def test_cooperative_parses_round_trips_and_enters_the_digest(value: bool) -> None:
    obj = mutated(lambda o: norm(o).update(cooperative=value))
    m = parse_manifest(obj)
    verify(m)
    launch = m.ops["rmsnorm"].launches[0]
    assert isinstance(launch, Launch) and launch.cooperative is value
    assert m.to_json() == obj  # written back where given, false included
    assert parse_manifest(m.to_json()) == m
    base = parse_manifest(EXAMPLE)
    assert base.ops["rmsnorm"].launches[0].cooperative is False and "cooperative" not in norm(base.to_json())
    assert m.digest != base.digest  # the digest covers the JSON as written: an explicit false too


def test_cooperative_must_be_a_boolean() -> None:
    obj = mutated(lambda o: norm(o).update(cooperative=1))
    assert_parse_fault(json.dumps(obj), f"{NORM}.cooperative", "expected a boolean, got an integer")


def test_cooperative_with_a_cluster_is_a_fault() -> None:
    obj = mutated(lambda o: norm(o).update(cooperative=True, cluster=[1, 1, 1]))
    assert_verify_faults(obj, [f"{NORM}.cooperative"], "takes no 'cluster'")


def test_cooperative_with_pdl_is_a_fault() -> None:
    obj = mutated(lambda o: norm(o).update(cooperative=True, pdl=True))
    assert_verify_faults(obj, [f"{NORM}.cooperative"], "takes no 'pdl'")


# ---------------------------------------------------------------------------------------------- zero_each_run


def test_zero_each_run_parses_and_round_trips() -> None:
    obj = mutated(with_buffer("counters", COUNTERS))
    m = parse_manifest(obj)
    verify(m)
    buf = m.buffers["counters"]
    assert isinstance(buf, Buffer) and buf.zero_each_run is True and buf.error is None
    assert m.to_json() == obj and parse_manifest(m.to_json()) == m
    assert m.buffers["hidden"].zero_each_run is False


@pytest.mark.parametrize(("change", "paths", "words"), [
    (dict(kind="input"), ["$.buffers.counters.zero_each_run"], "only workspace and scratch"),
    (dict(kind="output"), ["$.buffers.counters.zero_each_run"], "only workspace and scratch"),
    (dict(placement="host"), ["$.buffers.counters.zero_each_run"], "lives on the device"),
    (dict(export=True), ["$.buffers.counters.zero_each_run"], "export buffer or peer table"),
])
def test_zero_each_run_faults(change: dict[str, Any], paths: list[str], words: str) -> None:
    assert_verify_faults(mutated(with_buffer("counters", {**COUNTERS, **change})), paths, words)


def test_zero_each_run_must_be_a_boolean() -> None:
    obj = mutated(with_buffer("counters", {**COUNTERS, "zero_each_run": "yes"}))
    assert_parse_fault(json.dumps(obj), "$.buffers.counters.zero_each_run", "expected a boolean, got a string")


# ---------------------------------------------------------------------------------------------- error


def test_error_word_parses_and_round_trips() -> None:
    obj = mutated(with_buffer("fault", ERROR))
    m = parse_manifest(obj)
    verify(m)
    word = m.buffers["fault"].error
    assert isinstance(word, ErrorWord)
    assert word.meaning(1) == "a counter wait timed out" and word.meaning(7) is None
    assert m.to_json() == obj and parse_manifest(m.to_json()) == m


def test_error_word_without_codes_writes_back_as_written() -> None:
    spec = {**ERROR, "error": {}}
    obj = mutated(with_buffer("fault", spec))
    m = parse_manifest(obj)
    verify(m)
    assert m.buffers["fault"].error == ErrorWord() and m.buffers["fault"].error.meaning(1) is None
    assert m.to_json() == obj


@pytest.mark.parametrize(("change", "paths", "words"), [
    (dict(kind="output"), ["$.buffers.fault.kind"], "an error word is a 'workspace' buffer"),
    (dict(dtype="i32"), ["$.buffers.fault.dtype"], "holds u32 codes"),
    (dict(placement="device"), ["$.buffers.fault.placement"], "pinned host memory"),
    (dict(shape=["tokens"]), ["$.buffers.fault.shape"], "shape is constant"),
    (dict(shape=[0]), ["$.buffers.fault.shape"], "has 0 u32 words"),
    (dict(shape=[65]), ["$.buffers.fault.shape"], "has 65 u32 words; give 1..64"),
    (dict(zero_each_run=True), ["$.buffers.fault.zero_each_run", "$.buffers.fault.zero_each_run"],
     "lives on the device"),  # placement host is the first fault, the error word the second
    (dict(error={"codes": {"0": "none"}}), ['$.buffers.fault.error.codes["0"]'], "decimal integer 1..4294967295"),
    (dict(error={"codes": {"07": "x"}}), ['$.buffers.fault.error.codes["07"]'], "without leading zeros"),
    (dict(error={"codes": {"4294967296": "x"}}), ['$.buffers.fault.error.codes["4294967296"]'], "1..4294967295"),
    (dict(error={"codes": {"-1": "x"}}), ['$.buffers.fault.error.codes["-1"]'], "decimal integer"),
    (dict(error={"codes": {"3": " "}}), ['$.buffers.fault.error.codes["3"]'], "non-empty description"),
    (dict(error={"codes": {}, "severity": 1}), ["$.buffers.fault.error.severity"], "unknown key 'severity'"),
])
def test_error_word_faults(change: dict[str, Any], paths: list[str], words: str) -> None:
    assert_verify_faults(mutated(with_buffer("fault", {**ERROR, **change})), paths, words)


def test_error_word_with_zero_each_run_names_the_lost_fault() -> None:
    spec = {**ERROR, "zero_each_run": True}
    m = parse_manifest(mutated(with_buffer("fault", spec)))
    from kern_manifest import find_faults

    messages = [f.message for f in find_faults(m)]
    assert any("wiped by the next" in text for text in messages)


def test_error_codes_must_be_strings() -> None:
    obj = mutated(with_buffer("fault", {**ERROR, "error": {"codes": {"1": 5}}}))
    assert_parse_fault(json.dumps(obj), "$.buffers.fault.error.codes[\"1\"]", "expected a string, got an integer")


# ---------------------------------------------------------------------------------------------- init

TABLE_BYTES = bytes(range(32))
TABLE = {"kind": "workspace", "dtype": "u32", "shape": [8], "init": {"base64": base64.b64encode(TABLE_BYTES).decode()}}


def test_init_parses_round_trips_and_decodes() -> None:
    obj = mutated(with_buffer("table", TABLE))
    m = parse_manifest(obj)
    verify(m)
    init = m.buffers["table"].init
    assert isinstance(init, BufferInit) and init.data() == TABLE_BYTES
    assert m.to_json() == obj and parse_manifest(m.to_json()) == m
    other = mutated(with_buffer("table", {**TABLE, "init": {"base64": base64.b64encode(bytes(32)).decode()}}))
    assert parse_manifest(other).digest != m.digest  # the contents are pinned by the digest


@pytest.mark.parametrize(("change", "paths", "words"), [
    (dict(kind="scratch"), ["$.buffers.table.init"], "only workspace buffers take 'init'"),
    (dict(placement="host"), ["$.buffers.table.init"], "lives on the device"),
    (dict(zero_each_run=True), ["$.buffers.table.init"], "does not go with zero_each_run"),
    (dict(shape=["tokens"]), ["$.buffers.table.shape"], "shape is constant"),
    (dict(shape=[9]), ["$.buffers.table.init.base64"], "decodes to 32 bytes; the buffer holds 36"),
    (dict(init={"base64": "AAAA!"}), ["$.buffers.table.init.base64"], "is not base64 text"),
    (dict(init={"base64": "AAA"}), ["$.buffers.table.init.base64"], "is not base64 text"),
    (dict(init={"base64": "", "zlib": True}), ["$.buffers.table.init.zlib", "$.buffers.table.init.base64"],
     "unknown key 'zlib'"),
])
def test_init_faults(change: dict[str, Any], paths: list[str], words: str) -> None:
    assert_verify_faults(mutated(with_buffer("table", {**TABLE, **change})), paths, words)


def test_init_needs_its_base64_string() -> None:
    obj = mutated(with_buffer("table", {**TABLE, "init": {}}))
    assert_parse_fault(json.dumps(obj), "$.buffers.table.init", "missing required key 'base64'")
