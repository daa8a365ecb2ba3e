"""Launch records against fake addresses: pointer arithmetic, var-driven grids, `when`, packs, keys."""

from __future__ import annotations

import struct

import pytest
from runtime_helpers import base_manifest, scale_op

from kern_manifest import var_max, var_min
from kern_runtime import ApiError, ManifestVerifyError
from kern_runtime.cuda.graphs import graph_key, normalise_vars
from kern_runtime.program.params import encode_pointer, encode_scalar
from kern_runtime.program.records import AddressBook, ExternRecord, KernelRecord, args_at_range_ends, compile_program as compile_call_table, program_reads
from kern_runtime.runtime import load_spec

SHA = "ab" * 32


def compile_program(manifest: dict, program: str, book: AddressBook):
    spec = load_spec(manifest)
    records, _ = compile_call_table(spec, program, book, lambda op, li: (op, li))
    return spec, records


def test_pointer_offsets_and_dynamic_ints() -> None:
    m = base_manifest(modules={"toy": SHA}, ops={"scale": scale_op()}, programs={"step": {"calls": [
        {"op": "scale", "args": {"x": {"buffer": "x", "offset": "tokens * 16"}, "y": "y", "n": "tokens - 1"}}]}})
    _, (rec,) = compile_program(m, "step", AddressBook({"x": 0x1000, "y": 0x8000}))
    assert isinstance(rec, KernelRecord)
    assert rec.function == ("scale", 0)
    assert rec.reads == frozenset({"tokens"})
    assert [i for i, _ in rec.dynamic] == [0, 2]  # x (offset reads tokens) and n
    assert rec.params.read(1) == encode_pointer(0x8000)  # constant: staged at compile
    assert rec.params.read(3) == struct.pack("<f", 2.0)
    rec.patch({"tokens": 33})
    assert rec.params.read(0) == encode_pointer(0x1000 + 33 * 16)
    assert rec.params.read(2) == encode_scalar("i32", 32)
    assert rec.grid == (2, 1, 1)  # cdiv(33 * 4, 128)
    assert rec.block == (128, 1, 1)


def test_when_selects_one_launch_per_value() -> None:
    op = scale_op()
    small = dict(op["launches"][0], when={"tokens": [1, 16]}, block=[32, 1, 1])
    large = dict(op["launches"][0], when={"tokens": [17, 64]}, block=[256, 1, 1])
    op["launches"] = [small, large]
    m = base_manifest(modules={"toy": SHA}, ops={"scale": op}, programs={"step": {"calls": [
        {"op": "scale", "args": {"x": "x", "y": "y", "n": "tokens"}}]}})
    _, records = compile_program(m, "step", AddressBook({"x": 1 << 20, "y": 2 << 20}))
    for tokens, active in [(1, [True, False]), (16, [True, False]), (17, [False, True]), (64, [False, True])]:
        for rec in records:
            rec.patch({"tokens": tokens})
        assert [r.active for r in records] == active
    records[1].patch({"tokens": 64})
    assert records[1].block == (256, 1, 1)


def test_pack_and_null_and_scratch_wirings() -> None:
    op = {
        "args": [{"name": "x", "kind": "ptr"}],
        "scratch": {"tmp": "tokens * 8"},
        "launches": [{
            "module": "toy", "entry": "k", "grid": [1, 1, 1], "block": [32, 1, 1],
            "params": [[0, 32], [32, 8], [40, 8]],
            "args": [
                {"pack": {"size": 32, "fields": [{"offset": 0, "arg": "x"}, {"offset": 8, "i32": 5},
                                                  {"offset": 16, "f32": 0.25}]}},
                {"null": 8},
                {"scratch": "tmp"},
            ],
        }],
    }
    m = base_manifest(modules={"toy": SHA}, ops={"p": op}, programs={"step": {"calls": [
        {"op": "p", "args": {"x": {"buffer": "x", "offset": "tokens * 16"}}}]}})
    _, (rec,) = compile_program(m, "step", AddressBook({"x": 0x5000}, scratch={("p", "tmp"): 0x9000}))
    rec.patch({"tokens": 5})
    expected = encode_pointer(0x5000 + 80) + encode_scalar("i32", 5) + bytes(4) + struct.pack("<f", 0.25) + bytes(12)
    assert rec.params.read(0) == expected
    assert rec.params.read(1) == bytes(8)
    assert rec.params.read(2) == encode_pointer(0x9000)
    assert rec.reads == frozenset({"tokens"})


def test_extern_gemm_record_resolves_integers() -> None:
    op = {
        "args": [{"name": "a", "kind": "ptr"}, {"name": "w", "kind": "ptr"}, {"name": "c", "kind": "ptr"}],
        "launches": [{"extern": "cublaslt_bf16_tn", "args": [
            {"arg": "a"}, {"arg": "w"}, {"arg": "c", "offset": 64}, {"expr": "tokens", "type": "i32"},
            {"i32": 32}, {"i32": 16}, {"i32": 96}]}],
    }
    m = base_manifest(
        buffers={"a": {"kind": "input", "dtype": "bf16", "shape": ["tokens", 16]},
                 "w": {"kind": "input", "dtype": "bf16", "shape": [32, 16]},
                 "c": {"kind": "output", "dtype": "bf16", "shape": ["tokens", 96]}},
        ops={"gemm": op}, programs={"step": {"calls": [{"op": "gemm", "args": {"a": "a", "w": "w", "c": "c"}}]}})
    _, (rec,) = compile_program(m, "step", AddressBook({"a": 0x100000, "w": 0x200000, "c": 0x300000}))
    assert isinstance(rec, ExternRecord)
    rec.patch({"tokens": 3})
    assert rec.args == (0x100000, 0x200000, 0x300040, 3, 32, 16, 96)
    assert program_reads([rec]) == frozenset({"tokens"})


def test_args_at_range_ends_clamp_when_vars() -> None:
    """The load-time checks (pinned algorithms, NCCL extents) see an extern's arguments at both ends of the var
    range (tokens 1..64 here), each var of the launch's `when` clamped into its interval: a launch for tokens 1..5
    is checked at 1 and 5, one for 6..64 at 6 and 64, one without `when` at 1 and 64."""
    def gemm(n: int, when: list[int] | None) -> dict:
        launch = {"extern": "cublaslt_bf16_tn", "args": [
            {"arg": "a"}, {"arg": "w"}, {"arg": "c"}, {"expr": "tokens * 2", "type": "i32"}, {"i32": n}, {"i32": 16},
            {"i32": 96}]}
        return launch if when is None else {**launch, "when": {"tokens": when}}

    ops = {"split": {"args": [{"name": n, "kind": "ptr"} for n in "awc"],
                     "launches": [gemm(32, [1, 5]), gemm(48, [6, 64])]},
           "whole": {"args": [{"name": n, "kind": "ptr"} for n in "awc"], "launches": [gemm(64, None)]}}
    m = base_manifest(
        buffers={"a": {"kind": "input", "dtype": "bf16", "shape": ["tokens", 16]},
                 "w": {"kind": "input", "dtype": "bf16", "shape": [64, 16]},
                 "c": {"kind": "output", "dtype": "bf16", "shape": ["tokens", 96]}},
        ops=ops, programs={"step": {"calls": [{"op": op, "args": {"a": "a", "w": "w", "c": "c"}}
                                              for op in ("split", "whole")]}})
    spec, recs = compile_program(m, "step", AddressBook({"a": 0x100000, "w": 0x200000, "c": 0x300000}))
    got = [list(args_at_range_ends(rec, var_min(spec.vars), var_max(spec.vars))) for rec in recs]
    ptrs = (0x100000, 0x200000, 0x300000)
    assert got == [[(*ptrs, 2 * t, n, 16, 96) for t in ends] for n, ends in ((32, (1, 5)), (48, (6, 64)), (64, (1, 64)))]


def test_graph_key_uses_only_read_vars() -> None:
    m = base_manifest(vars={"tokens": {"min": 1, "max": 8}, "seqs": {"min": 1, "max": 4}})
    spec = load_spec(m)
    reads = frozenset({"tokens"})
    a = normalise_vars({"tokens": 3, "seqs": 4}, spec.vars, reads, "step")
    b = normalise_vars({"tokens": 3}, spec.vars, reads, "step")
    c = normalise_vars({"tokens": 3, "seqs": 99}, spec.vars, reads, "step")  # unread: any value, normalised
    assert a == b == c == {"tokens": 3, "seqs": 1}
    assert graph_key("step", a, reads) == graph_key("step", b, reads) == ("step", (("tokens", 3),))
    assert graph_key("step", normalise_vars({"tokens": 4}, spec.vars, reads, "step"), reads) != graph_key("step", a, reads)


@pytest.mark.parametrize(
    ("values", "message"),
    [({"tokens": 9}, r"'tokens' = 9 is outside \[1, 8\]"), ({"nope": 1, "tokens": 1}, "unknown var 'nope'"),
     ({}, "reads var 'tokens'"), ({"tokens": 1.5}, "not an integer")],
)
def test_vars_out_of_range_are_api_errors(values, message) -> None:
    spec = load_spec(base_manifest(vars={"tokens": {"min": 1, "max": 8}}))
    with pytest.raises(ApiError, match=message):
        normalise_vars(values, spec.vars, frozenset({"tokens"}), "step")


def test_manifest_faults_surface_as_verify_errors() -> None:
    m = base_manifest(programs={"step": {"calls": [{"op": "missing", "args": {}}]}})
    with pytest.raises(ManifestVerifyError):
        load_spec(m)
