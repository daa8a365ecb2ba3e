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
