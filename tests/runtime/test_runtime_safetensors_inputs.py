"""SafetensorsTensors on malformed checkpoints: every fault a WeightArtifactError naming the file (no
AttributeError, no file outside the checkpoint read)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from kern_runtime import SafetensorsTensors, WeightArtifactError
from kern_runtime.weights.safetensors import read_safetensors_header


def _shard(path: Path, header: object, data: bytes = b"") -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def _ckpt(tmp_path: Path, weight_map: object) -> Path:
    _shard(tmp_path / "model.safetensors", {"t": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return tmp_path


@pytest.mark.parametrize("weight_map, needle", [
    (["model.safetensors"], "weight_map is a JSON list"),
    ("model.safetensors", "weight_map is a JSON str"),
    ({"t": "../../../etc/passwd"}, "weight_map['t'] = '../../../etc/passwd' is not a file name inside"),
    ({"t": "/etc/passwd"}, "weight_map['t'] = '/etc/passwd' is not a file name inside"),
    ({"t": 3}, "weight_map['t'] = 3"),
])
def test_bad_weight_map_names_the_index(tmp_path: Path, weight_map: object, needle: str) -> None:
    root = _ckpt(tmp_path, weight_map)
    with pytest.raises(WeightArtifactError) as err:
        SafetensorsTensors.open(root)
    assert str(root / "model.safetensors.index.json") in str(err.value) and needle in str(err.value), err.value


def test_good_weight_map_still_opens(tmp_path: Path) -> None:
    assert list(SafetensorsTensors.open(_ckpt(tmp_path, {"t": "model.safetensors"})).names()) == ["t"]


def test_non_utf8_index(tmp_path: Path) -> None:
    root = _ckpt(tmp_path, {})
    (root / "model.safetensors.index.json").write_bytes(b'{"weight_map": "\xff"}')
    with pytest.raises(WeightArtifactError, match="is not UTF-8"):
        SafetensorsTensors.open(root)


@pytest.mark.parametrize("header, needle", [
    ([1, 2], "header is JSON list, not an object"),
    ({"t": {"dtype": "BF16", "shape": [True, 2], "data_offsets": [0, 4]}}, "malformed header entry"),
    ({"t": {"dtype": "BF16", "shape": ["x"], "data_offsets": [0, 4]}}, "malformed header entry"),
    ({"t": {"dtype": "BF16", "shape": [2], "data_offsets": [-4, 0]}}, "malformed header entry"),
    ({"t": {"dtype": ["BF16"], "shape": [2], "data_offsets": [0, 4]}}, "unsupported dtype"),
])
def test_malformed_header_entries(tmp_path: Path, header: object, needle: str) -> None:
    path = _shard(tmp_path / "x.safetensors", header, b"\0" * 4)
    with pytest.raises(WeightArtifactError) as err:
        read_safetensors_header(path)
    assert str(path) in str(err.value) and needle in str(err.value), err.value


def _raw_shard(path: Path, header: bytes, data: bytes = b"") -> Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def test_header_must_be_utf8_without_repeated_keys(tmp_path: Path) -> None:
    entry = '"t": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}'
    good = _raw_shard(tmp_path / "good.safetensors", ("{" + entry + "}").encode(), bytes(4))
    assert read_safetensors_header(good)["t"][2] == 4
    utf16 = _raw_shard(tmp_path / "u16.safetensors", ("{" + entry + "}").encode("utf-16"), bytes(4))
    with pytest.raises(WeightArtifactError, match="header is not UTF-8"):
        read_safetensors_header(utf16)  # json.loads alone would take UTF-16
    twice = _raw_shard(tmp_path / "twice.safetensors", ("{" + entry + ", " + entry + "}").encode(), bytes(4))
    with pytest.raises(WeightArtifactError, match="the key 't' twice in one object"):
        read_safetensors_header(twice)  # json.loads alone keeps the last silently


def test_overlapping_tensors_are_refused_empty_ones_may_share_an_offset(tmp_path: Path) -> None:
    overlap = _shard(tmp_path / "overlap.safetensors", {
        "a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
        "b": {"dtype": "BF16", "shape": [4], "data_offsets": [6, 14]}}, bytes(14))
    with pytest.raises(WeightArtifactError, match="tensors 'a' and 'b' overlap in the file .bytes 6..8 of the data"):
        read_safetensors_header(overlap)
    ok = _shard(tmp_path / "ok.safetensors", {
        "a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
        "e": {"dtype": "BF16", "shape": [0], "data_offsets": [4, 4]},
        "b": {"dtype": "BF16", "shape": [4], "data_offsets": [8, 16]}}, bytes(16))
    assert {k: v[2] for k, v in read_safetensors_header(ok).items()} == {"a": 8, "e": 0, "b": 8}


def test_index_with_a_repeated_tensor_name_is_refused(tmp_path: Path) -> None:
    root = _ckpt(tmp_path, {"t": "model.safetensors"})
    index = root / "model.safetensors.index.json"
    index.write_text('{"weight_map": {"t": "model.safetensors", "t": "other.safetensors"}}')
    with pytest.raises(WeightArtifactError, match="the key 't' twice"):
        SafetensorsTensors.open(root)
