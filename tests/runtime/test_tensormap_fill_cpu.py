"""A tensor map's fill dim in the runtime (docs/manifest.md, "pack"): the outermost dim written as 0 is
resolved at compile time to the whole outermost rows of the pooled state's reserved range
(`AddressBook.reserve`), and that is what cuTensorMapEncodeTiled gets. The driver is `FakeDriver` with
`cuTensorMapEncodeTiled` answered (below); the pure helpers are tested without it."""

from __future__ import annotations

import struct
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
from fake_cuda import OK, FakeDriver, install
from runtime_helpers import base_manifest

from kern_runtime import ApiError, Capacity, ManifestError, ManifestVerifyError, plan_pool
from kern_runtime.program.records import AddressBook, KernelRecord, compile_program
from kern_runtime.runtime import load_spec
from kern_runtime.cuda.tensormaps import MAX_TENSORMAP_DIM, encode_tiled, fill_dim, resolve_fill, tiled_args

SHA = "cd" * 32
MiB = 1 << 20
PAGE = 16 * 4096  # kv: 16 tokens x 4096 bytes
SLOT = 65536  # conv: bytes_per_seq
KV_BASE, CONV_BASE, X_BASE = 0x7000_0000_0000, 0x7100_0000_0000, 0x5000


class TensorMapDriver(FakeDriver):
    """FakeDriver that encodes tensor maps: the 128-byte image is 16 little-endian u64 words
    (address, rank, dims..., strides..., box...), zero-padded, so a test can read back what was encoded."""

    def _cuTensorMapEncodeTiled(self, dtype: Any, rank: int, address: int, dims: list[int], strides: list[int],
                                box: list[int], elem: list[int], *enums: Any) -> tuple:
        words = [address, rank, *dims, *strides, *box]
        return (OK, SimpleNamespace(opaque=words + [0] * (16 - len(words))))


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> Iterator[TensorMapDriver]:
    yield install(monkeypatch, TensorMapDriver())


def encoded(driver: TensorMapDriver) -> list[tuple[int, list[int], list[int]]]:
    """(address, dims, strides) of every cuTensorMapEncodeTiled call so far."""
    return [(args[2], list(args[3]), list(args[4])) for name, args in driver.calls if name == "cuTensorMapEncodeTiled"]


def decode(image: bytes) -> list[int]:
    return list(struct.unpack("<16Q", image))


def tma_op(dims: list[Any], strides: list[Any], offset: Any = None) -> dict[str, Any]:
    """op `tma(src ptr, n int)`: one launch, params (a 128-byte pack holding a map over `src`, n as i32)."""
    tm: dict[str, Any] = {"arg": "src", "dtype": "bf16", "dims": dims, "strides": strides, "box": [64] + [1] * (len(dims) - 1)}
    if offset is not None:
        tm["offset"] = offset
    return {
        "args": [{"name": "src", "kind": "ptr"}, {"name": "n", "kind": "int"}],
        "launches": [{
            "module": "toy", "entry": "kern_tma", "grid": [1, 1, 1], "block": [128, 1, 1],
            "params": [[0, 128], [128, 4]],
            "args": [{"pack": {"size": 128, "fields": [{"offset": 0, "tensormap": tm}]}}, {"arg": "n", "type": "i32"}],
        }],
    }


def manifest(src: Any = "kv", dims: list[Any] | None = None, strides: list[Any] | None = None,
             offset: Any = None) -> dict[str, Any]:
    """A paged kv map [64 elems, 16 tokens, fill pages] (rows of one page) unless told otherwise."""
    dims = [64, 16, 0] if dims is None else dims
    strides = [4096, PAGE] if strides is None else strides
    return base_manifest(
        modules={"toy": SHA},
        buffers={"x": {"kind": "workspace", "dtype": "bf16", "shape": [64, 64]}},
        states={"kv": {"kind": "paged", "bytes_per_token": 4096, "page_tokens": 16},
                "conv": {"kind": "per_seq", "bytes_per_seq": SLOT},
                "flags": {"kind": "fixed", "bytes": 4096}},
        ops={"tma": tma_op(dims, strides, offset)},
        programs={"decode": {"graph": True, "calls": [{"op": "tma", "args": {"src": src, "n": 1}}]}},
    )


def book(reserve: int | dict[str, int] = 1 << 30, **overrides: Any) -> AddressBook:
    """Fake addresses; `reserve`: bytes of each pooled state's range (one int for both) or the mapping itself."""
    if isinstance(reserve, int):
        reserve = {"kv": reserve, "conv": reserve}
    return AddressBook(**{"targets": {"kv": KV_BASE, "conv": CONV_BASE, "x": X_BASE, "flags": 0x6000},
                          "reserve": reserve, **overrides})


def compile_decode(m: dict[str, Any], address_book: AddressBook) -> KernelRecord:
    spec = load_spec(m)
    (rec,), _ = compile_program(spec, "decode", address_book, lambda op, li: (op, li), encode_tiled)
    assert isinstance(rec, KernelRecord)
    return rec


# ---------------------------------------------------------------- pure helpers


def test_fill_dim_is_the_outermost_constant_zero() -> None:
    assert fill_dim({"dims": [64, 16, 0]}) == 2
    assert fill_dim({"dims": [0]}) == 0
    assert fill_dim({"dims": [64, "2 - 2"]}) == 1
    assert fill_dim({"dims": [64, 16, 8]}) is None
    assert fill_dim({"dims": [0, 16, 8]}) is None  # an inner 0 is no fill (the verifier refuses it)
    assert fill_dim({"dims": [64, "tokens - 1"]}) is None  # a var-driven dim never is, whatever its value
    assert fill_dim({"dims": []}) is None


def test_resolve_fill_counts_whole_rows_of_the_outermost_stride() -> None:
    tm = {"dtype": "bf16", "dims": [64, 16, 0], "strides": [4096, PAGE], "box": [64, 1, 1]}
    assert resolve_fill(tm, 10 * PAGE, {})["dims"] == [64, 16, 10]
    assert resolve_fill(tm, 10 * PAGE + PAGE - 1, {})["dims"] == [64, 16, 10]  # a partial row is not a row
    assert tm["dims"] == [64, 16, 0]  # the field's JSON is not changed
    # the stride may read vars
    tm_var = dict(tm, strides=[4096, "tokens * 4096"])
    # (a 32 KiB stride under rows of 16 x 4096 bytes: rows overlap, the last one must end inside the 1 MiB)
    extent = 2 + 63 * 2 + 15 * 4096
    assert resolve_fill(tm_var, 1 << 20, {"tokens": 8})["dims"] == [64, 16, ((1 << 20) - extent) // (8 * 4096) + 1]
    assert resolve_fill(tm_var, 1 << 20, {"tokens": 16})["dims"] == [64, 16, (1 << 20) // (16 * 4096)]
    # rank 1: a row is one element
    assert resolve_fill({"dtype": "f32", "dims": [0], "strides": [], "box": [64]}, 1 << 20, {})["dims"] == [1 << 18]
    # without a fill dim the map is unchanged
    assert resolve_fill(dict(tm, dims=[64, 16, 3]), 10 * PAGE, {})["dims"] == [64, 16, 3]
    # overlapping rows (a row of 64 bf16 = 128 bytes every 64 bytes): the last row must end inside the span,
    # so 15 rows in 1024 bytes (row 14 ends at 14 * 64 + 128 = 1024), not 1024 // 64 = 16
    overlap = {"dtype": "bf16", "dims": [64, 0], "strides": [64], "box": [64, 1]}
    assert resolve_fill(overlap, 1024, {})["dims"] == [64, 15]
    assert resolve_fill(overlap, 1023, {})["dims"] == [64, 14]


def test_resolve_fill_refuses_less_than_a_row_and_more_than_the_driver_takes() -> None:
    tm = {"dtype": "bf16", "dims": [64, 16, 0], "strides": [4096, PAGE], "box": [64, 1, 1]}
    with pytest.raises(ApiError, match=r"at\.dims\[2\]: the fill dim spans 65535 bytes of 'kv''s reserved range, less "
                                       r"than one 65536-byte row; load with a larger capacity"):
        resolve_fill(tm, PAGE - 1, {}, "at.dims[2]", "'kv'")
    with pytest.raises(ApiError, match="less than one"):
        resolve_fill(tm, -16, {})
    one_byte_rows = {"dtype": "u8", "dims": [0], "strides": [], "box": [16]}
    assert resolve_fill(one_byte_rows, MAX_TENSORMAP_DIM, {})["dims"] == [MAX_TENSORMAP_DIM]
    with pytest.raises(ApiError, match=r"4294967297 rows of 1 bytes .* more than cuTensorMapEncodeTiled's 4294967296; "
                                       r"load with a smaller capacity"):
        resolve_fill(one_byte_rows, MAX_TENSORMAP_DIM + 1, {})


def test_tiled_args_refuses_an_unresolved_fill_dim() -> None:
    tm = {"arg": "x", "dtype": "bf16", "dims": [128, 0], "strides": [256], "box": [64, 16]}
    with pytest.raises(ManifestError, match=r"dims\[1\] is 0; a tensor map dim must be >= 1 \(a fill dim: resolve it "):
        tiled_args(tm, {})
    with pytest.raises(ManifestError, match=r"dims\[0\] is 0; a tensor map dim must be >= 1$"):
        tiled_args(dict(tm, dims=[0, 8]), {})


# ---------------------------------------------------------------- records


def test_a_paged_fill_encodes_the_pages_of_the_reserved_range_once(driver: TensorMapDriver) -> None:
    reserve = 3 * 64 * MiB  # e.g. three 64 MiB blocks
    rec = compile_decode(manifest(), book(reserve))
    assert encoded(driver) == [(KV_BASE, [64, 16, reserve // PAGE], [4096, PAGE])]
    assert rec.dynamic == [] and rec.reads == frozenset()  # staged once: nothing per step, nothing in the graph key
    image = decode(rec.params.read(0))
    assert image[:5] == [KV_BASE, 3, 64, 16, reserve // PAGE]
    rec.patch({"tokens": 5})
    assert len(encoded(driver)) == 1


def test_a_per_seq_fill_counts_slots_past_the_call_offset(driver: TensorMapDriver) -> None:
    reserve = 64 * MiB
    m = manifest(src={"state": "conv", "offset": 2 * SLOT}, dims=[64, 0], strides=[SLOT])
    compile_decode(m, book(reserve))
    assert encoded(driver) == [(CONV_BASE + 2 * SLOT, [64, reserve // SLOT - 2], [SLOT])]


def test_a_fill_under_a_var_offset_is_resolved_per_value(driver: TensorMapDriver) -> None:
    reserve = 64 * MiB
    rec = compile_decode(manifest(src="conv", dims=[64, 0], strides=[SLOT], offset="tokens * 65536"), book(reserve))
    assert rec.reads == frozenset({"tokens"}) and [i for i, _ in rec.dynamic] == [0]
    for tokens in (1, 7):
        rec.patch({"tokens": tokens})
        assert encoded(driver)[-1] == (CONV_BASE + tokens * SLOT, [64, reserve // SLOT - tokens], [SLOT])
        assert decode(rec.params.read(0))[:4] == [CONV_BASE + tokens * SLOT, 2, 64, reserve // SLOT - tokens]


def test_the_fill_matches_pages_of_for_a_pool_the_runtime_plans(driver: TensorMapDriver) -> None:
    spec = load_spec(manifest())
    pool = plan_pool(spec.states, Capacity(tokens=4100, seqs=3), 2 * MiB)
    assert pool is not None
    reserve = {name: pool.reserve_bytes for name in pool.layout.states}
    compile_decode(manifest(), book(reserve=reserve, pages=pool.reserved_pages))
    # rows of one page: the fill spans exactly the page ids pages_of bounds, the ids any remap can map
    assert encoded(driver)[-1][1] == [64, 16, pool.reserved_pages["kv"]]
    compile_decode(manifest(src="conv", dims=[64, 0], strides=[SLOT]), book(reserve=reserve))
    assert encoded(driver)[-1][1] == [64, pool.reserve_bytes // SLOT]
    assert pool.reserve_bytes // SLOT >= pool.num_slots


def test_a_map_without_fill_is_encoded_as_written(driver: TensorMapDriver) -> None:
    compile_decode(manifest(src="x", dims=[64, 16, 4], strides=[128, 2048]), book())
    assert encoded(driver) == [(X_BASE, [64, 16, 4], [128, 2048])]


def test_a_fill_over_a_state_the_book_has_no_reserve_for_is_a_manifest_error(driver: TensorMapDriver) -> None:
    with pytest.raises(ManifestError, match=r"ops\.tma\.launches\[0\]\.args\[0\]\.pack\.fields\[0\]\.tensormap\.dims\[2\]: "
                                            r"a fill dim \(0\) spans the reserved range of a pooled state, but "
                                            r".*args\.src passes 'kv', not a pooled state of this runtime "
                                            r"\(pooled: none\)"):
        compile_decode(manifest(), book(reserve={}))
    assert encoded(driver) == []


def test_a_reserve_smaller_than_a_row_is_an_api_error(driver: TensorMapDriver) -> None:
    with pytest.raises(ApiError, match=r"less than one 65536-byte row; load with a larger capacity"):
        compile_decode(manifest(), book(PAGE - 16))


@pytest.mark.parametrize("src", ["x", "flags"])
def test_the_verifier_refuses_a_fill_over_a_buffer_or_fixed_state_before_the_records(src: str) -> None:
    with pytest.raises(ManifestVerifyError) as info:
        load_spec(manifest(src=src))
    assert info.value.paths == ["$.programs.decode.calls[0].args.src"]
