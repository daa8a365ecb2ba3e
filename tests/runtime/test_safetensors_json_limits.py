"""SafetensorsTensors on JSON that json.loads refuses without a JSONDecodeError (nesting past the recursion
limit, an integer past Python's digit limit): a WeightArtifactError naming the file, never a RecursionError or
ValueError. And one shard file named under two spellings ("a" and "./a") is one shard, read once."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from kern_runtime import SafetensorsTensors, WeightArtifactError
from kern_runtime.weights.safetensors import index_shards, read_safetensors_header

DEEP = b"[" * 100_000 + b"]" * 100_000


def _big_int() -> bytes:
    limit = sys.get_int_max_str_digits()
    if not limit:
        pytest.skip("this Python has no integer digit limit")
    return b"1" * (limit + 700)


def _write(path: Path, header: bytes, data: bytes = b"") -> Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def _tensor(path: Path, name: str = "t") -> Path:
    return _write(path, json.dumps({name: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode(), bytes(4))


@pytest.mark.parametrize("kind", ["deep", "bigint"])
def test_shard_header(tmp_path: Path, kind: str) -> None:
    header = DEEP if kind == "deep" else b'{"w": {"dtype": "F32", "shape": [' + _big_int() + b'], "data_offsets": [0, 4]}}'
    path = _write(tmp_path / "a.safetensors", header, bytes(4))
    with pytest.raises(WeightArtifactError, match="header is not usable JSON") as err:
        read_safetensors_header(path)
    assert str(path) in str(err.value)
    assert ("nested too deeply" if kind == "deep" else "digits") in str(err.value)


@pytest.mark.parametrize("kind", ["deep", "bigint"])
def test_index(tmp_path: Path, kind: str) -> None:
    _tensor(tmp_path / "a.safetensors")
    index = tmp_path / "model.safetensors.index.json"
    index.write_bytes(DEEP if kind == "deep" else b'{"weight_map": {"t": "a.safetensors"}, "n": ' + _big_int() + b"}")
    for fn in (index_shards, lambda _: SafetensorsTensors.open(tmp_path)):
        with pytest.raises(WeightArtifactError, match="is not usable JSON") as err:
            fn(index)
        assert str(index) in str(err.value)


def test_one_shard_under_two_spellings_is_read_once(tmp_path: Path) -> None:
    _tensor(tmp_path / "a.safetensors", "t")
    _tensor(tmp_path / "b.safetensors", "u")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"t": "a.safetensors", "t2": "./a.safetensors", "u": "b.safetensors", "u2": "./b.safetensors"}}))
    assert index_shards(tmp_path / "model.safetensors.index.json") == ["a.safetensors", "b.safetensors"]
    tensors = SafetensorsTensors.open(tmp_path)
    assert sorted(tensors.names()) == ["t", "u"]
    assert SafetensorsTensors([tmp_path / "a.safetensors", f"{tmp_path}/./a.safetensors"]).files == (
        str(tmp_path / "a.safetensors"),)


def test_a_tensor_in_two_files_names_both(tmp_path: Path) -> None:
    _tensor(tmp_path / "a.safetensors")
    _tensor(tmp_path / "b.safetensors")
    with pytest.raises(WeightArtifactError, match="present in two shards") as err:
        SafetensorsTensors([tmp_path / "a.safetensors", f"{tmp_path}/./b.safetensors"])
    assert f"{tmp_path / 'a.safetensors'} and {tmp_path / 'b.safetensors'}" in str(err.value)
