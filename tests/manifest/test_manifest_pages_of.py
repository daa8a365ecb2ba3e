"""`{"pages_of": state}` int call arguments: the model, round trip, digest, capture key and every fault."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from manifest_testkit import assert_parse_fault, assert_verify_faults, mutate

from kern_manifest import (
    Expr,
    PagesOf,
    find_faults,
    parse_manifest,
    verify,
)

DATA = Path(__file__).parent / "data" / "valid_pages_of.json"
BASE: dict[str, Any] = json.loads(DATA.read_text())
ARGS0 = "$.programs.decode.calls[0].args"


def mutated(change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    return mutate(BASE, change)


def call_args(o: dict[str, Any], i: int = 0) -> dict[str, Any]:
    return o["programs"]["decode"]["calls"][i]["args"]


def test_pages_of_parses_into_the_model_and_round_trips() -> None:
    m = parse_manifest(BASE)
    verify(m)
    calls = m.programs["decode"].calls
    assert calls[0].args["num_pages"] == PagesOf(state="kv.0")
    assert calls[1].args["num_pages"] == PagesOf(state="kv.1")
    assert calls[0].args["num_pages"].vars == frozenset()
    assert calls[0].to_json()["args"]["num_pages"] == {"pages_of": "kv.0"}
    assert m.to_json() == BASE
    assert parse_manifest(m.to_json()) == m
    assert parse_manifest(json.dumps(m.to_json(), indent=1)) == m


def test_pages_of_reads_no_var_so_the_capture_key_is_the_grid_alone() -> None:
    m = parse_manifest(BASE)
    assert m.programs["decode"].vars_read(m) == frozenset({"seqs"})
    # the same call with an expression instead reads what the expression reads
    m2 = parse_manifest(mutated(lambda o: call_args(o).update(num_pages="tokens * 4")))
    verify(m2)
    assert m2.programs["decode"].vars_read(m2) == frozenset({"seqs", "tokens"})
    assert m2.programs["decode"].calls[0].args["num_pages"] == Expr("tokens * 4")


def test_pages_of_is_part_of_the_digest_and_the_family_digest() -> None:
    m = parse_manifest(BASE)
    other_state = parse_manifest(mutated(lambda o: call_args(o).update(num_pages={"pages_of": "kv.1"})))
    literal = parse_manifest(mutated(lambda o: call_args(o).update(num_pages=64)))
    verify(other_state)
    verify(literal)
    assert len({m.digest, other_state.digest, literal.digest}) == 3
    assert len({m.family_digest, other_state.family_digest, literal.family_digest}) == 3
    assert m.digest == parse_manifest(copy.deepcopy(BASE)).digest
    declared = mutated(lambda o: o.update(digest=m.digest))
    verify(parse_manifest(declared))  # a generator's digest over the JSON it wrote matches


# (id, mutation, expected path, words the message must contain)
PARSE_CASES: list[tuple[str, Callable[[dict[str, Any]], Any], str, str]] = [
    ("state-name-not-a-string", lambda o: call_args(o).update(num_pages={"pages_of": 5}),
     f"{ARGS0}.num_pages.pages_of", "expected a string, got an integer"),
    ("state-name-a-list", lambda o: call_args(o).update(num_pages={"pages_of": ["kv.0"]}),
     f"{ARGS0}.num_pages.pages_of", "expected a string, got an array"),
    ("state-name-null", lambda o: call_args(o).update(num_pages={"pages_of": None}),
     f"{ARGS0}.num_pages.pages_of", "expected a string, got null"),
    ("misspelt-key", lambda o: call_args(o).update(num_pages={"page_of": "kv.0"}),
     f"{ARGS0}.num_pages", "{\"pages_of\": state}; found an object with keys ['page_of']"),
    ("with-a-buffer-key", lambda o: call_args(o).update(num_pages={"pages_of": "kv.0", "buffer": "q"}),
     f"{ARGS0}.num_pages", "an int argument is an integer, an expression string or"),
    ("a-list", lambda o: call_args(o).update(num_pages=["kv.0"]),
     f"{ARGS0}.num_pages", "expected an integer or an expression string, got an array"),
]


@pytest.mark.parametrize("change, path, words", [c[1:] for c in PARSE_CASES], ids=[c[0] for c in PARSE_CASES])
def test_malformed_pages_of_is_a_parse_error(change: Callable[[dict[str, Any]], Any], path: str, words: str) -> None:
    assert_parse_fault(json.dumps(mutated(change)), path, words)


# (id, mutation, expected fault paths (exactly these), words the first message must contain)
VERIFY_CASES: list[tuple[str, Callable[[dict[str, Any]], Any], list[str], str]] = [
    ("unknown-state", lambda o: call_args(o).update(num_pages={"pages_of": "kv.9"}),
     [f"{ARGS0}.num_pages.pages_of"], "unknown state 'kv.9'; pages_of names a paged state (declared: kv.0, kv.1)"),
    ("a-buffer-not-a-state", lambda o: call_args(o).update(num_pages={"pages_of": "block_table"}),
     [f"{ARGS0}.num_pages.pages_of"], "unknown state 'block_table'"),
    ("per-seq-state", lambda o: call_args(o).update(num_pages={"pages_of": "conv.0"}),
     [f"{ARGS0}.num_pages.pages_of"], "state 'conv.0' is per_seq, not paged"),
    ("fixed-state", lambda o: call_args(o).update(num_pages={"pages_of": "flags"}),
     [f"{ARGS0}.num_pages.pages_of"], "state 'flags' is fixed, not paged"),
    ("no-states-at-all", lambda o: (o.pop("states"), call_args(o).update(kv="q"), call_args(o, 1).update(kv="q"),
                                    call_args(o, 1).update(num_pages=1)),
     [f"{ARGS0}.num_pages.pages_of"], "(declared: none)"),
    ("unknown-key-beside-it", lambda o: call_args(o).update(num_pages={"pages_of": "kv.0", "offset": 4}),
     [f"{ARGS0}.num_pages.offset"], "unknown key 'offset'; allowed here: pages_of"),
    ("given-to-a-ptr-arg", lambda o: call_args(o).update(kv={"pages_of": "kv.0"}),
     [f"{ARGS0}.kv"], "'kv' is a ptr argument; pass a buffer or state name"),
    ("given-to-an-unknown-arg", lambda o: call_args(o).update(pages={"pages_of": "kv.0"}),
     [f"{ARGS0}.pages"], "op 'attn' has no argument 'pages'"),
    ("missing-where-needed", lambda o: call_args(o).pop("num_pages"),
     [ARGS0], "missing argument 'num_pages' of op 'attn'"),
]


@pytest.mark.parametrize("change, paths, words", [c[1:] for c in VERIFY_CASES], ids=[c[0] for c in VERIFY_CASES])
def test_inconsistent_pages_of_is_a_verify_error(change: Callable[[dict[str, Any]], Any], paths: list[str],
                                                 words: str) -> None:
    assert_verify_faults(mutated(change), paths, words)


def test_every_pages_of_fault_is_reported() -> None:
    def two(o: dict[str, Any]) -> None:
        call_args(o, 0).update(num_pages={"pages_of": "conv.0"})
        call_args(o, 1).update(num_pages={"pages_of": "kv"})

    faults = find_faults(parse_manifest(mutated(two)))
    assert [f.path for f in faults] == [f"{ARGS0}.num_pages.pages_of",
                                        "$.programs.decode.calls[1].args.num_pages.pages_of"]
