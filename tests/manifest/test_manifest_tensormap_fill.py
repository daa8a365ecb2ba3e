"""A tensor map's fill dim: the outermost dim written as 0 spans the reserved range of a pooled state
(docs/manifest.md, "pack"). Allowed over paged and per-seq states; refused over buffers, fixed states,
derive sources and as an inner dim."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from manifest_testkit import assert_verify_faults, mutate

from kern_manifest import Expr, ManifestVerifyError, find_faults, parse_manifest, verify

SHA = "7" * 64
TM = "$.ops.tma.launches[0].args[0].pack.fields[0].tensormap"
ARGS0 = "$.programs.decode.calls[0].args"


def tensormap(dims: list[Any], strides: list[Any], arg: str = "src") -> dict[str, Any]:
    return {"arg": arg, "dtype": "bf16", "dims": dims, "strides": strides, "box": [64] + [1] * (len(dims) - 1)}


def fill_op(dims: list[Any] | None = None, strides: list[Any] | None = None) -> dict[str, Any]:
    """op `tma(src ptr, dst ptr)`: one launch whose only param is a pack holding a tensor map over `src`
    (default: a [64, 16, fill] bf16 map, rows of 2048 bytes: pages of 16 tokens x 128 bytes)."""
    dims = [64, 16, 0] if dims is None else dims
    strides = [128, 2048] if strides is None else strides
    return {
        "args": [{"name": "src", "kind": "ptr"}, {"name": "dst", "kind": "ptr"}],
        "launches": [{
            "module": "tma", "entry": "kern_tma", "grid": ["seqs", 1, 1], "block": [128, 1, 1],
            "params": [[0, 136]],
            "args": [{"pack": {"size": 136, "fields": [{"offset": 0, "tensormap": tensormap(dims, strides)},
                                                       {"offset": 128, "arg": "dst"}]}}],
        }],
    }


BASE: dict[str, Any] = {
    "format": "kern-manifest/1",
    "name": "tensormap-fill",
    "vars": {"seqs": {"min": 1, "max": 4}},
    "modules": {"tma": SHA},
    "buffers": {"out": {"kind": "output", "dtype": "bf16", "shape": ["seqs", 64]},
                "w": {"kind": "workspace", "dtype": "bf16", "shape": [64, 64]}},
    "states": {
        "kv": {"kind": "paged", "bytes_per_token": 128, "page_tokens": 16},
        "conv": {"kind": "per_seq", "bytes_per_seq": 8192},
        "flags": {"kind": "fixed", "bytes": 4096},
    },
    "ops": {"tma": fill_op()},
    "programs": {"decode": {"graph": True, "calls": [
        {"op": "tma", "args": {"src": "kv", "dst": "out"}},
        {"op": "tma", "args": {"src": {"state": "conv", "offset": 4096}, "dst": "out"}},
    ]}},
}


def mutated(change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    return mutate(BASE, change)


def call_args(o: dict[str, Any], i: int = 0) -> dict[str, Any]:
    return o["programs"]["decode"]["calls"][i]["args"]


def the_map(o: dict[str, Any]) -> dict[str, Any]:
    return o["ops"]["tma"]["launches"][0]["args"][0]["pack"]["fields"][0]["tensormap"]


def test_fill_over_paged_and_per_seq_states_verifies_and_round_trips() -> None:
    m = parse_manifest(BASE)
    verify(m)
    tm = m.ops["tma"].launches[0].args[0].fields[0].tensormap
    assert tm.dims == (Expr(64), Expr(16), Expr(0))
    assert m.to_json() == BASE
    assert parse_manifest(json.dumps(m.to_json())) == m
    # a fill dim reads no var: the capture key is the grid's alone
    assert m.programs["decode"].vars_read(m) == frozenset({"seqs"})


@pytest.mark.parametrize("src", ["kv", "conv", {"state": "kv"}, {"state": "conv", "offset": "seqs * 8192"}])
def test_fill_accepts_every_spelling_of_a_pooled_state(src: Any) -> None:
    verify(parse_manifest(mutated(lambda o: call_args(o).update(src=src))))


@pytest.mark.parametrize("dims, strides", [([0], []), ([64, 0], [128]), (["seqs * 8", 4, 2, 2, "0"], [16, 64, 128, 256])])
def test_fill_is_the_outermost_dim_of_any_rank(dims: list[Any], strides: list[Any]) -> None:
    def change(o: dict[str, Any]) -> None:
        o["ops"]["tma"] = fill_op(dims, strides)
        the_map(o)["box"] = [8] * len(dims)
    verify(parse_manifest(mutated(change)))


@pytest.mark.parametrize("src, what", [
    ("out", "'out' is a buffer"),
    ({"buffer": "w", "offset": 128}, "'w' is a buffer"),
    ("flags", "'flags' is a fixed state (4096 bytes)"),
    ({"state": "flags"}, "'flags' is a fixed state (4096 bytes)"),
])
def test_fill_over_a_buffer_or_a_fixed_state_is_a_fault_at_the_call_argument(src: Any, what: str) -> None:
    obj = mutated(lambda o: call_args(o, 1).update(src=src))
    assert_verify_faults(obj, ["$.programs.decode.calls[1].args.src"], what)
    (fault,) = find_faults(parse_manifest(obj))
    # the message names the op, the launch, the argument, the tensor map's dim and why
    assert fault.message.startswith(f"op 'tma' launch 0 maps argument 'src' with a fill dim ({TM}.dims[2] is 0), "
                                    "which spans the reserved range of a pooled (paged or per_seq) state; ")
    assert fault.message.endswith("whose size the manifest knows: pass a pooled state or write the dim out")


def test_each_bad_call_is_one_fault_however_many_fill_maps_read_the_argument() -> None:
    def change(o: dict[str, Any]) -> None:
        pack = o["ops"]["tma"]["launches"][0]["args"][0]["pack"]
        pack["size"] = 320
        pack["fields"].append({"offset": 192, "tensormap": tensormap([64, 0], [128])})
        o["ops"]["tma"]["launches"][0]["params"] = [[0, 320]]
        o["programs"]["decode"]["calls"] = [
            {"op": "tma", "args": {"src": "out", "dst": "out"}},
            {"op": "tma", "args": {"src": "kv", "dst": "out"}},
            {"op": "tma", "args": {"src": "flags", "dst": "out"}},
        ]
    assert_verify_faults(mutated(change), [f"{ARGS0}.src", "$.programs.decode.calls[2].args.src"], "'out' is a buffer")


def test_fill_over_a_derive_source_is_a_fault() -> None:
    def change(o: dict[str, Any]) -> None:
        o["programs"]["derive_w"] = {"kind": "derive", "sources": {"raw": "model.w"},
                                     "calls": [{"op": "tma", "args": {"src": "raw", "dst": "w"}}]}
    assert_verify_faults(mutated(change), ["$.programs.derive_w.calls[0].args.src"],
                         "'raw' is a derive source (a staging buffer)")


@pytest.mark.parametrize("dims, j", [([0, 16, 8], 0), ([64, 0, 8], 1), ([64, 0, 0], 1), (["0", 16, 8], 0)])
def test_an_inner_fill_dim_is_a_fault_at_the_dim(dims: list[Any], j: int) -> None:
    obj = mutated(lambda o: the_map(o).update(dims=dims))
    assert_verify_faults(obj, [f"{TM}.dims[{j}]"], f"tensor map dimension {j} is 0, an inner dim: only the outermost "
                                                   "dim (dims[2]) may be 0")


def test_only_the_constant_zero_is_a_fill() -> None:
    # a dim that reaches 0 through a var is a size below its floor, as before
    obj = mutated(lambda o: the_map(o)["dims"].__setitem__(2, "seqs - 1"))
    assert_verify_faults(obj, [f"{TM}.dims[2]"], "tensor map dimension 'seqs - 1' is 0 at seqs=1; it must be >= 1")
    # a negative constant is no fill either
    obj = mutated(lambda o: the_map(o)["dims"].__setitem__(2, -1))
    assert_verify_faults(obj, [f"{TM}.dims[2]"], "tensor map dimension '-1' is -1; it must be >= 1")
    # a constant expression worth 0 is (the written form is kept for the digest)
    m = parse_manifest(mutated(lambda o: the_map(o)["dims"].__setitem__(2, "2 - 2")))
    verify(m)
    assert m.to_json()["ops"]["tma"]["launches"][0]["args"][0]["pack"]["fields"][0]["tensormap"]["dims"][2] == "2 - 2"


def test_a_map_without_fill_over_a_buffer_still_verifies() -> None:
    def change(o: dict[str, Any]) -> None:
        the_map(o)["dims"][2] = 2
        call_args(o, 1)["src"] = "w"
    verify(parse_manifest(mutated(change)))


def test_fill_faults_are_reported_with_every_other_fault() -> None:
    def change(o: dict[str, Any]) -> None:
        call_args(o)["src"] = "flags"
        the_map(o)["box"][0] = 512
    with pytest.raises(ManifestVerifyError) as info:
        verify(parse_manifest(mutated(change)))
    assert sorted(info.value.paths) == sorted([f"{TM}.box[0]", f"{ARGS0}.src"])


def test_the_base_is_not_mutated_by_the_tests() -> None:
    assert copy.deepcopy(BASE) == BASE and the_map(BASE)["dims"] == [64, 16, 0]


@pytest.mark.parametrize("value, ok", [(0, True), (3, True), (2**32 - 1, True), (2**32, False), (-1, False),
                                       (2**70, False), ("CU_TENSOR_MAP_SWIZZLE_128B", True)])
def test_tensormap_enum_integers_are_32_bit(value: Any, ok: bool) -> None:
    obj = mutated(lambda o: the_map(o).update(swizzle=value))
    if ok:
        verify(parse_manifest(obj))
    else:
        assert_verify_faults(obj, ["$.ops.tma.launches[0].args[0].pack.fields[0].tensormap.swizzle"], "0..2^32-1")
