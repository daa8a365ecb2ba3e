"""SafetensorsTensors.parse: safetensors files held in memory (runtime.md "权重来源": open takes files, parse
takes bytes). The same header checks and WeightArtifactErrors as the file path, naming "bytes #i"; tensor bytes
are read-only HostBlob views of the caller's buffers (no copy); wrong argument types are ApiErrors. No GPU."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save, save_file

from kern_runtime import ApiError, HostBlob, SafetensorsTensors, TensorMeta, WeightArtifactError, plan_bind
from runtime_helpers import buffer_of, interleave, seg
from kern_runtime.weights import parse_safetensors_header
from kern_runtime.weights.loader import Target, WeightLoader
from kern_runtime.weights.safetensors import read_safetensors_header
from kern_manifest import Expr


def _raw(header: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header)) + header + data


def _st(header: object, data: bytes = b"") -> bytes:
    return _raw(json.dumps(header).encode(), data)


def _values(tensors: SafetensorsTensors, name: str, dtype: np.dtype) -> np.ndarray:
    meta = tensors.meta(name)
    blob = tensors.blob(name)
    assert isinstance(blob, HostBlob) and blob.nbytes == meta.nbytes
    return blob.data.view(dtype).reshape(meta.shape)


ARRAYS = {
    "f32": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    "f16": np.linspace(-2, 2, 10, dtype=np.float16).reshape(2, 5),
    "f64": np.array([1.5, -2.25], dtype=np.float64),
    "i64": np.arange(-3, 3, dtype=np.int64).reshape(2, 1, 3),
    "i32": np.array([7], dtype=np.int32),
    "u8": np.arange(5, dtype=np.uint8),
    "i8": np.array([-128, 0, 127], dtype=np.int8),
    "scalar": np.array(3.0, dtype=np.float32),
    "empty": np.zeros((0, 4), dtype=np.float32),
}
META = {"f32": "f32", "f16": "f16", "f64": "f64", "i64": "i64", "i32": "i32", "u8": "u8", "i8": "i8",
        "scalar": "f32", "empty": "f32"}


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview, lambda b: np.frombuffer(b, np.uint8).copy()])
def test_round_trip_through_safetensors_numpy_save(wrap) -> None:
    data = wrap(save(ARRAYS, metadata={"format": "np"}))
    t = SafetensorsTensors.parse(data)
    assert sorted(t.names()) == sorted(ARRAYS) and len(t) == len(ARRAYS)
    assert t.files == () and len(t.buffers) == 1
    for name, array in ARRAYS.items():
        assert t.meta(name) == TensorMeta(META[name], array.shape)
        got = _values(t, name, array.dtype)
        assert got.dtype == array.dtype and got.shape == array.shape
        np.testing.assert_array_equal(got, array)
    assert t.meta("nope") is None
    assert t.total_bytes == sum(a.nbytes for a in ARRAYS.values())
    with pytest.raises(WeightArtifactError, match="checkpoint has no tensor 'nope'"):
        t.blob("nope")


def test_parse_agrees_with_open_on_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file(ARRAYS, str(path))
    raw = path.read_bytes()
    assert parse_safetensors_header(raw) == read_safetensors_header(path)
    opened, parsed = SafetensorsTensors.open(path), SafetensorsTensors.parse(raw)
    assert list(opened.names()) == list(parsed.names())
    for name in opened.names():
        assert opened.meta(name) == parsed.meta(name)
        fb, hb = opened.blob(name), parsed.blob(name)
        assert raw[fb.offset : fb.offset + fb.nbytes] == hb.data.tobytes()


def test_blobs_are_read_only_views_of_the_callers_buffer_and_keep_it_alive() -> None:
    buf = bytearray(save({"w": np.arange(4, dtype=np.float32)}))
    t = SafetensorsTensors.parse(buf)
    blob = t.blob("w")
    assert np.shares_memory(blob.data, np.frombuffer(buf, np.uint8))  # no copy
    assert not blob.data.flags.writeable
    with pytest.raises(ValueError):
        blob.data[0] = 1  # the runtime never writes into the caller's bytes
    with pytest.raises(BufferError):
        buf.extend(b"x")  # exported while parsed: cannot be resized under the views
    # the object holds the bytes: the original name may go away
    t2 = SafetensorsTensors.parse(bytes(save({"v": np.full(3, 2.5, np.float32)})))
    np.testing.assert_array_equal(_values(t2, "v", np.float32), [2.5, 2.5, 2.5])
    assert blob.slice(4, 8).data.view(np.float32)[0] == 1.0


def test_several_shards_as_a_list_or_tuple() -> None:
    a = save({"a": np.ones((2, 2), np.float32), "ids": np.arange(3, dtype=np.int32)})
    b = save({"b": np.full(5, 9, np.int64)})
    for data in ([a, b], (bytearray(a), memoryview(b))):
        t = SafetensorsTensors.parse(data)
        assert sorted(t.names()) == ["a", "b", "ids"] and len(t.buffers) == 2
        np.testing.assert_array_equal(_values(t, "a", np.float32), np.ones((2, 2)))
        np.testing.assert_array_equal(_values(t, "ids", np.int32), [0, 1, 2])
        np.testing.assert_array_equal(_values(t, "b", np.int64), [9] * 5)


def test_a_tensor_in_two_shards_names_both() -> None:
    one = save({"x": np.zeros(2, np.float32)})
    two = save({"y": np.zeros(1, np.float32), "x": np.ones(2, np.float32)})
    with pytest.raises(WeightArtifactError, match=r"tensor 'x' is present in two shards: bytes #0 and bytes #2"):
        SafetensorsTensors.parse([one, save({"z": np.zeros(1, np.float32)}), two])
    with pytest.raises(WeightArtifactError, match="present in two shards: bytes #0 and bytes #1"):
        SafetensorsTensors.parse([one, one])  # the same object twice is two shards (no identity dedup)


GOOD = _st({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(8))
PAST = _st({"t": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(8))


@pytest.mark.parametrize("data, needle", [
    (b"", "not safetensors data (shorter than 8 bytes)"),
    (b"\x03", "not safetensors data (shorter than 8 bytes)"),
    (struct.pack("<Q", 1000) + b"{}", "header truncated (2 of 1000 bytes)"),  # header length past the end
    (struct.pack("<Q", 2**63) + b"{}", f"header length {2**63} exceeds"),
    (GOOD[:-1], f"tensor 't' ends at byte {len(GOOD)}, past the buffer end {len(GOOD) - 1}"),  # truncated data
    (PAST, f"tensor 't' ends at byte {len(PAST) + 4}, past the buffer end {len(PAST)}"),  # an offset past the data
    (_raw(b'{"t": {"dtype": "F32", '), "header is not JSON"),
    (_raw(b"[1, 2]"), "header is JSON list, not an object"),
    (_raw('{"t": 1}'.encode("utf-16")), "header is not UTF-8"),
    (_raw(b'{"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
          b'"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', bytes(4)), "the key 't' twice in one object"),
    (_st({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}, bytes(12)), "spans 12 bytes, expected 16"),
    (_st({"t": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 4]}}, bytes(4)), "unsupported dtype 'Q7'"),
    (_st({"t": {"dtype": ["BF16"], "shape": [2], "data_offsets": [0, 4]}}, bytes(4)), "unsupported dtype"),
    (_st({"t": {"dtype": "BF16", "shape": [True, 2], "data_offsets": [0, 4]}}, bytes(4)), "malformed header entry"),
    (_st({"t": {"dtype": "BF16", "shape": ["x"], "data_offsets": [0, 4]}}, bytes(4)), "malformed header entry"),
    (_st({"t": {"dtype": "BF16", "shape": [2], "data_offsets": [-4, 0]}}, bytes(4)), "malformed header entry"),
    (_st({"t": {"dtype": "BF16", "shape": [2], "data_offsets": [4, 0]}}, bytes(4)), "malformed header entry"),
    (_st({"t": {"dtype": "BF16", "shape": [2]}}, bytes(4)), "malformed header entry"),
    (_st({"a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
          "b": {"dtype": "BF16", "shape": [4], "data_offsets": [6, 14]}}, bytes(14)),
     "tensors 'a' and 'b' overlap in the buffer (bytes 6..8 of the data section)"),
], ids=lambda v: None if isinstance(v, bytes) else v[:40])
def test_malformed_bytes_are_refused_like_files(tmp_path: Path, data: bytes, needle: str) -> None:
    """Each refusal of the file path, for bytes: the same WeightArtifactError text with "bytes #i" for the
    file name (and "buffer" for "file"); the file path still says what it said."""
    for arg, where in ((data, "bytes #0"), ([GOOD, data], "bytes #1")):
        with pytest.raises(WeightArtifactError) as err:
            SafetensorsTensors.parse(arg)
        assert str(err.value).startswith(f"{where}: ") and needle in str(err.value), err.value
    path = tmp_path / "x.safetensors"
    path.write_bytes(data)
    with pytest.raises(WeightArtifactError) as err:
        SafetensorsTensors.open(path)
    file_needle = needle.replace("not safetensors data", "not a safetensors file").replace("buffer", "file")
    assert str(err.value).startswith(f"{path}: ") and file_needle in str(err.value), err.value


@pytest.mark.parametrize("kind", ["deep", "bigint"])
def test_json_the_parser_refuses_without_a_decode_error(kind: str) -> None:
    if kind == "deep":
        header = b"[" * 100_000 + b"]" * 100_000
    else:
        if not sys.get_int_max_str_digits():
            pytest.skip("this Python has no integer digit limit")
        header = b'{"w": {"dtype": "F32", "shape": [' + b"1" * (sys.get_int_max_str_digits() + 700) + b'], "data_offsets": [0, 4]}}'
    with pytest.raises(WeightArtifactError, match="bytes #0: header is not usable JSON"):
        SafetensorsTensors.parse(_raw(header, bytes(4)))


def test_empty_tensors_may_share_an_offset_and_metadata_is_skipped() -> None:
    t = SafetensorsTensors.parse(_st({
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
        "e": {"dtype": "BF16", "shape": [0], "data_offsets": [4, 4]},
        "b": {"dtype": "BF16", "shape": [4], "data_offsets": [8, 16]}}, bytes(range(16))))
    assert sorted(t.names()) == ["a", "b", "e"]
    assert t.blob("e").nbytes == 0 and t.blob("b").data.tobytes() == bytes(range(8, 16))


@pytest.mark.parametrize("bad, kind", [
    ("model.safetensors", "str"), (Path("model.safetensors"), type(Path()).__name__), (3, "int"), (None, "NoneType"),
    (3.5, "float"), ({"t": b""}, "dict"), (iter([GOOD]), "list_iterator"),
])
def test_wrong_argument_types_are_api_errors(bad: object, kind: str) -> None:
    article = "an" if kind[0] in "aeiou" else "a"
    with pytest.raises(ApiError, match=rf"bytes #0 is {article} {kind}, not") as err:
        SafetensorsTensors.parse(bad)
    if isinstance(bad, (str, Path)):
        assert "SafetensorsTensors.open takes a path" in str(err.value)
    with pytest.raises(ApiError, match=rf"bytes #1 is {article} {kind}, not"):
        SafetensorsTensors.parse([GOOD, bad])


def test_non_contiguous_buffers_and_an_empty_list() -> None:
    strided = np.frombuffer(GOOD * 2, np.uint8)[::2]
    with pytest.raises(ApiError, match="bytes #0 is a non-contiguous ndarray"):
        SafetensorsTensors.parse(strided)
    with pytest.raises(ApiError, match="non-contiguous memoryview"):
        SafetensorsTensors.parse(memoryview(GOOD * 2)[::2])
    with pytest.raises(WeightArtifactError, match="no safetensors bytes given"):
        SafetensorsTensors.parse([])
    # an object array's buffer is Python object pointers, not file bytes
    with pytest.raises(ApiError, match="holds Python object pointers"):
        SafetensorsTensors.parse(np.array([GOOD], dtype=object))
    # any contiguous buffer is its raw bytes, whatever its numpy dtype or shape
    padded = np.frombuffer(GOOD + bytes(-len(GOOD) % 8), np.uint8).copy()  # trailing bytes are allowed
    t = SafetensorsTensors.parse(padded.view(np.uint32).reshape(2, -1))
    assert t.meta("t") == TensorMeta("f32", (2,))


def test_host_placement_load_binds_from_parsed_shards() -> None:
    """The loader's CPU path (host-placement buffer) over parsed bytes: an interleave across two shards and
    a whole tensor, checked byte for byte, with staging sizes that split the copies."""
    rng = np.random.default_rng(3)
    gate, up = (rng.integers(0, 2**16, (6, 8), dtype=np.uint16) for _ in range(2))
    emb = rng.integers(0, 2**16, (5, 8), dtype=np.uint16)

    def bf16(tensors: dict[str, np.ndarray]) -> bytes:
        header, blobs, offset = {}, [], 0
        for name, bits in tensors.items():
            raw = bits.astype("<u2").tobytes()
            header[name] = {"dtype": "BF16", "shape": list(bits.shape), "data_offsets": [offset, offset + len(raw)]}
            blobs.append(raw)
            offset += len(raw)
        return _st(header, b"".join(blobs))

    tensors = SafetensorsTensors.parse([bf16({"gate": gate, "emb": emb}), bytearray(bf16({"up": up}))])
    buf = buffer_of("gate_up", "weight", "bf16", (Expr(17), Expr(8)), placement="host",
                     bind=(seg("emb", (0, 5)), interleave(("gate", "up"), 2)))
    want = np.concatenate([emb, gate[0:2], up[0:2], gate[2:4], up[2:4], gate[4:6], up[4:6]])
    for staging in (None, 48, 7):
        host = np.zeros(17 * 8, dtype=np.uint16)
        nbytes, _ = WeightLoader(tensors, None, staging_bytes=staging).run(
            [Target(plan_bind(buf, tensors.meta), 0, host.ctypes.data)])
        np.testing.assert_array_equal(host.reshape(17, 8), want)
        assert nbytes == 17 * 8 * 2

