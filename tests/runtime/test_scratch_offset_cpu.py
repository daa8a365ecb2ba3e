"""Scratch wirings with a byte `offset` and integer pack literals, compiled into records at fake addresses.

docs/manifest.md, argument wirings: `{"scratch": s, "offset": expr}` points `offset` bytes into op scratch
`s`; a pack field `{"offset": o, "u64": v}` is a literal encoded as its type, so a u64 above 2**63 - 1 is
valid (the verifier accepts it, and so must the runtime).
"""

from __future__ import annotations

import struct

from runtime_helpers import base_manifest

from kern_runtime.cuda.graphs import graph_key
from kern_runtime.program.params import encode_pointer
from kern_runtime.program.records import AddressBook, ExternRecord, KernelRecord, compile_program, program_reads
from kern_runtime.runtime import load_spec

SHA = "ab" * 32
SCRATCH = 0x9000


def _records(op: dict, **overrides):
    m = base_manifest(modules={"toy": SHA}, ops={"p": op}, programs={"step": {"calls": [{"op": "p", "args": {}}]}},
                      **overrides)
    spec = load_spec(m)
    book = AddressBook({}, scratch={("p", "tmp"): SCRATCH})
    return compile_program(spec, "step", book, lambda o, li: (o, li))[0]


def _kernel_op(*wirings: dict) -> dict:
    return {"args": [], "scratch": {"tmp": "tokens * 8 + 64"}, "launches": [{
        "module": "toy", "entry": "k", "grid": [1, 1, 1], "block": [32, 1, 1],
        "params": [[8 * i, 8] for i in range(len(wirings))], "args": list(wirings)}]}


def test_scratch_offset_is_added_in_bytes_and_read_vars_key_the_graph() -> None:
    (rec,) = _records(
        _kernel_op({"scratch": "tmp", "offset": "seqs * 4"}, {"scratch": "tmp", "offset": 24}, {"scratch": "tmp"}),
        vars={"tokens": {"min": 1, "max": 64}, "seqs": {"min": 1, "max": 8}})
    assert isinstance(rec, KernelRecord)
    # the constant offset is staged at compile, the var one is dynamic, the plain wiring is the base
    assert rec.params.read(1) == encode_pointer(SCRATCH + 24)
    assert rec.params.read(2) == encode_pointer(SCRATCH)
    assert [i for i, _ in rec.dynamic] == [0]
    # `seqs` appears only in the scratch offset: the record (and so the graph key) must read it
    assert rec.reads == frozenset({"seqs"}) == program_reads([rec])
    for seqs in (5, 1, 8):
        rec.patch({"tokens": 1, "seqs": seqs})
        assert rec.params.read(0) == encode_pointer(SCRATCH + 4 * seqs)
    assert graph_key("step", {"tokens": 1, "seqs": 5}, rec.reads) != graph_key("step", {"tokens": 1, "seqs": 6}, rec.reads)


def test_scratch_offset_reviewer_repro() -> None:
    (rec,) = _records(_kernel_op({"scratch": "tmp", "offset": "tokens * 4"}))
    rec.patch({"tokens": 5})
    assert int.from_bytes(rec.params.read(0), "little") == SCRATCH + 20
    assert rec.reads == frozenset({"tokens"})


def test_scratch_offset_in_an_extern_launch() -> None:
    op = {"args": [{"name": "a", "kind": "ptr"}, {"name": "w", "kind": "ptr"}], "scratch": {"tmp": "tokens * 64"},
          "launches": [{"extern": "cublaslt_bf16_tn", "args": [
              {"arg": "a"}, {"arg": "w"}, {"scratch": "tmp", "offset": "tokens * 2"}, {"expr": "tokens", "type": "i32"},
              {"i32": 32}, {"i32": 16}]}]}
    m = base_manifest(
        buffers={"a": {"kind": "input", "dtype": "bf16", "shape": ["tokens", 16]},
                 "w": {"kind": "input", "dtype": "bf16", "shape": [32, 16]}},
        ops={"g": op}, programs={"step": {"calls": [{"op": "g", "args": {"a": "a", "w": "w"}}]}})
    spec = load_spec(m)
    (rec,), _ = compile_program(spec, "step", AddressBook({"a": 0x100000, "w": 0x200000}, scratch={("g", "tmp"): SCRATCH}),
                                lambda o, li: 0)
    assert isinstance(rec, ExternRecord)
    rec.patch({"tokens": 7})
    assert rec.args == (0x100000, 0x200000, SCRATCH + 14, 7, 32, 16)


def test_pack_integer_literals_encode_per_type() -> None:
    fields = [{"offset": 0, "u64": 2**64 - 1}, {"offset": 8, "i64": -(2**63)}, {"offset": 16, "u32": 2**32 - 1},
              {"offset": 20, "i32": -1}, {"offset": 24, "i64": 2**63 - 1}]
    op = {"args": [], "launches": [{"module": "toy", "entry": "k", "grid": [1, 1, 1], "block": [1, 1, 1],
                                    "params": [[0, 32]], "args": [{"pack": {"size": 32, "fields": fields}}]}]}
    (rec,) = _records(op)
    rec.patch({"tokens": 1})
    assert rec.params.read(0) == struct.pack("<QqIiq", 2**64 - 1, -(2**63), 2**32 - 1, -1, 2**63 - 1)
    assert rec.dynamic == [] and rec.reads == frozenset()
