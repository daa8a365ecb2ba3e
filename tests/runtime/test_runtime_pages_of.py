"""`{"pages_of": state}` int call arguments in the runtime (pure parts): the pool's reserved page counts,
their resolution into launch records (staged once at load, never read per step, never in a graph key),
and the refusals."""

from __future__ import annotations

from typing import Any

import pytest
from runtime_helpers import base_manifest

from kern_pool.blocks import PAGES, Blocks
from kern_runtime import ApiError, Capacity, ManifestError, plan_pool
from kern_runtime.program.params import encode_pointer, encode_scalar
from kern_runtime.program.records import AddressBook, ExternRecord, KernelRecord, compile_program, program_reads
from kern_runtime.runtime import Runtime, load_spec
from kern_manifest import PagesOf
from runtime_helpers import state_of

SHA = "ab" * 32
MiB = 1 << 20


def bound_op(pages_type: str = "i32") -> dict[str, Any]:
    """op `attn(kv ptr, num_pages int)`: a launch of constant geometry taking the page bound as its 2nd param."""
    size = 4 if pages_type in ("i32", "u32") else 8
    return {
        "args": [{"name": "kv", "kind": "ptr"}, {"name": "num_pages", "kind": "int"}],
        "launches": [{
            "module": "toy", "entry": "kern_attn", "grid": [4, 1, 1], "block": [128, 1, 1],
            "params": [[0, 8], [8, size]],
            "args": [{"arg": "kv"}, {"arg": "num_pages", "type": pages_type}],
        }],
    }


def manifest(pages_type: str = "i32", **call_args: Any) -> dict[str, Any]:
    args = {"kv": "kv.0", "num_pages": {"pages_of": "kv.0"}, **call_args}
    return base_manifest(
        modules={"toy": SHA},
        states={"kv.0": {"kind": "paged", "bytes_per_token": 4096, "page_tokens": 16},
                "kv.1": {"kind": "paged", "bytes_per_token": 1024, "page_tokens": 16},
                "conv": {"kind": "per_seq", "bytes_per_seq": 65536}},
        ops={"attn": bound_op(pages_type)},
        programs={"decode": {"graph": True, "calls": [{"op": "attn", "args": args}]}},
    )


def compile_decode(m: dict[str, Any], book: AddressBook) -> list[Any]:
    return compile_program(load_spec(m), "decode", book, lambda op, li: (op, li))[0]


STATES = {
    "kv.0": state_of("kv.0", "paged", bytes_per_token=4096, page_tokens=16),  # 64 KiB pages
    "kv.1": state_of("kv.1", "paged", bytes_per_token=1024, page_tokens=16),  # 16 KiB pages
    "conv": state_of("conv", "per_seq", bytes_per_seq=65536),
}


def test_reserved_pages_fill_each_paged_state_range_and_bound_every_page_the_pool_can_hand_out() -> None:
    pool = plan_pool(STATES, Capacity(tokens=4100, seqs=3), 2 * MiB)
    assert pool is not None
    assert set(pool.reserved_pages) == {"kv.0", "kv.1"}  # per-seq states have no pages
    for name, page_bytes in (("kv.0", 16 * 4096), ("kv.1", 16 * 1024)):
        pages = pool.reserved_pages[name]
        assert pages == pool.reserve_bytes // page_bytes
        # page ids 0..pages-1 lie inside the reserved range, id `pages` does not
        assert pages * page_bytes <= pool.reserve_bytes < (pages + 1) * page_bytes
        assert pages >= pool.num_pages
    assert pool.reserved_pages["kv.1"] == 4 * pool.reserved_pages["kv.0"]
    # kern_pool never maps a page past the smallest reserved range, whatever remaps move where
    assert Blocks(pool.layout).max_objects(PAGES) == min(pool.reserved_pages.values())


def test_reserved_pages_when_the_pool_fills_free_memory() -> None:
    states = {"kv": state_of("kv", "paged", bytes_per_token=256 * 1024, page_tokens=16)}  # 4 MiB pages
    pool = plan_pool(states, Capacity(tokens=None, seqs=1), 2 * MiB, free_bytes=(1 << 30) + 400 * MiB)
    assert pool is not None
    assert pool.reserved_pages == {"kv": pool.reserve_bytes // (4 * MiB)}
    assert pool.reserved_pages["kv"] == pool.num_pages  # one paged state: its range is exactly its pages


def test_manifest_reads_pages_of_as_a_pages_of_arg() -> None:
    spec = load_spec(manifest())
    (call,) = spec.programs["decode"].calls
    assert call.args["num_pages"] == PagesOf(state="kv.0")


def test_pages_of_is_a_constant_staged_once_and_reads_no_var() -> None:
    book = AddressBook({"kv.0": 0x7000_0000, "kv.1": 0x8000_0000}, pages={"kv.0": 1234, "kv.1": 4936})
    (rec,) = compile_decode(manifest(), book)
    assert isinstance(rec, KernelRecord)
    assert rec.dynamic == []  # nothing to patch per step
    assert rec.reads == frozenset()  # the decode graph's key stays empty
    assert program_reads([rec]) == frozenset()
    assert rec.params.read(0) == encode_pointer(0x7000_0000)
    assert rec.params.read(1) == encode_scalar("i32", 1234)
    rec.patch({"tokens": 7})
    assert rec.params.read(1) == encode_scalar("i32", 1234)
    # the same op reading the other layer's state gets that state's count
    (rec1,) = compile_decode(manifest(kv="kv.1", num_pages={"pages_of": "kv.1"}), book)
    assert rec1.params.read(1) == encode_scalar("i32", 4936)
    # an expression in its place is patched per step and enters the key
    (rec2,) = compile_decode(manifest(num_pages="tokens * 2"), book)
    assert [i for i, _ in rec2.dynamic] == [1] and rec2.reads == frozenset({"tokens"})


@pytest.mark.parametrize("pages_type, pages", [("i64", 2**40), ("u32", 2**32 - 1), ("u64", 2**40)])
def test_pages_of_encodes_as_the_wiring_type(pages_type: str, pages: int) -> None:
    (rec,) = compile_decode(manifest(pages_type), AddressBook({"kv.0": 0x1000}, pages={"kv.0": pages}))
    assert rec.params.read(1) == encode_scalar(pages_type, pages)


def test_pages_of_that_does_not_fit_the_type_is_refused_at_compile() -> None:
    book = AddressBook({"kv.0": 0x1000}, pages={"kv.0": 2**31})
    with pytest.raises(ApiError, match=r"pages_of 'kv\.0' is 2147483648 pages, which does not fit i32 "
                                       r"\(at most 2147483647\); load with a smaller capacity"):
        compile_decode(manifest(), book)
    (rec,) = compile_decode(manifest(), AddressBook({"kv.0": 0x1000}, pages={"kv.0": 2**31 - 1}))
    assert rec.params.read(1) == encode_scalar("i32", 2**31 - 1)


def test_pages_of_a_state_the_pool_does_not_page_is_a_manifest_error() -> None:
    with pytest.raises(ManifestError, match=r"ops\.attn\.launches\[0\]\.args\[1\]: pages_of 'kv\.0': not a paged "
                                            r"state of this runtime's pool \(paged: kv\.1\)"):
        compile_decode(manifest(), AddressBook({"kv.0": 0x1000}, pages={"kv.1": 8}))


def test_pages_of_forwarded_to_an_extern_is_an_integer() -> None:
    op = {"args": [{"name": "a", "kind": "ptr"}, {"name": "m", "kind": "int"}],
          "launches": [{"extern": "cublaslt_bf16_tn", "args": [
              {"arg": "a"}, {"arg": "a"}, {"arg": "a"}, {"arg": "m", "type": "i64"}, {"i32": 8}, {"i32": 8}]}]}
    m = manifest()
    m["ops"]["gemm"] = op
    m["buffers"]["a"] = {"kind": "workspace", "dtype": "bf16", "shape": [4096, 8]}
    m["programs"]["decode"]["calls"] = [{"op": "gemm", "args": {"a": "a", "m": {"pages_of": "kv.1"}}}]
    (rec,) = compile_decode(m, AddressBook({"a": 0x2000}, pages={"kv.1": 77}))
    assert isinstance(rec, ExternRecord)
    rec.patch({"tokens": 1})
    assert rec.args == (0x2000, 0x2000, 0x2000, 77, 8, 8)


def test_runtime_address_book_carries_the_pool_reserved_pages() -> None:
    """Runtime._address_book (what every program compiles against at load) takes the counts from the pool
    it planned: a pages_of argument compiles to the reserved page count of its state."""
    rt = Runtime()  # no CUDA: only the pure parts are used
    rt._set_manifest(load_spec(manifest()))
    rt.pool = plan_pool(rt.manifest.states, Capacity(tokens=4100, seqs=3), 2 * MiB)
    assert rt._address_book().pages == rt.pool.reserved_pages
    # and every pooled state's reserved bytes, which a tensor map's fill dim spans
    assert rt._address_book().reserve == {name: rt.pool.reserve_bytes for name in rt.pool.layout.states}
    assert rt._address_book().reserve and all(v > 0 for v in rt._address_book().reserve.values())
    assert rt.reserved_pages == dict(rt.pool.reserved_pages)
    book = AddressBook({"kv.0": 0x4000_0000}, pages=rt._address_book().pages)
    (rec,) = compile_decode(manifest(), book)
    assert rec.params.read(1) == encode_scalar("i32", rt.pool.reserved_pages["kv.0"])
    assert Runtime().reserved_pages == {}
