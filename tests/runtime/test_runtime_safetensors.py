"""SafetensorsTensors: headers only, layouts, duplicates; host-placement loads with pread (no GPU)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from kern_runtime import FileBlob, SafetensorsTensors, TensorMeta, WeightArtifactError, plan_bind
from runtime_helpers import buffer_of, interleave, seg, write_bf16_file
from kern_runtime.weights.loader import Target, WeightLoader
from kern_runtime.weights.safetensors import read_safetensors_header
from kern_manifest import Expr


def make_sharded(root: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    arrays = {
        "a": rng.standard_normal((3, 4)).astype(np.float32),
        "b": rng.standard_normal((5, 4)).astype(np.float32),
        "ids": np.arange(6, dtype=np.int32),
    }
    save_file({"a": arrays["a"], "ids": arrays["ids"]}, str(root / "model-00001-of-00002.safetensors"))
    save_file({"b": arrays["b"]}, str(root / "model-00002-of-00002.safetensors"))
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "ids": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    return arrays


def test_sharded_directory_reads_headers(tmp_path: Path) -> None:
    arrays = make_sharded(tmp_path)
    t = SafetensorsTensors.open(tmp_path)
    assert sorted(t.names()) == ["a", "b", "ids"]
    assert t.meta("a") == TensorMeta("f32", (3, 4))
    assert t.meta("ids") == TensorMeta("i32", (6,))
    assert t.meta("zzz") is None
    blob = t.blob("b")
    assert isinstance(blob, FileBlob) and blob.nbytes == 5 * 4 * 4
    with open(blob.path, "rb") as fh:
        fh.seek(blob.offset)
        np.testing.assert_array_equal(np.frombuffer(fh.read(blob.nbytes), np.float32).reshape(5, 4), arrays["b"])


def test_single_file_list_and_plain_directory(tmp_path: Path) -> None:
    make_sharded(tmp_path)
    files = sorted(tmp_path.glob("*.safetensors"))
    assert sorted(SafetensorsTensors.open(files[1]).names()) == ["b"]
    assert sorted(SafetensorsTensors.open(files).names()) == ["a", "b", "ids"]
    (tmp_path / "model.safetensors.index.json").unlink()
    assert sorted(SafetensorsTensors.open(tmp_path).names()) == ["a", "b", "ids"]


def test_duplicate_tensor_in_two_shards_is_refused(tmp_path: Path) -> None:
    save_file({"x": np.zeros(2, np.float32)}, str(tmp_path / "one.safetensors"))
    save_file({"x": np.ones(2, np.float32)}, str(tmp_path / "two.safetensors"))
    with pytest.raises(WeightArtifactError, match=r"tensor 'x' is present in two shards: .*one.safetensors and .*two.safetensors"):
        SafetensorsTensors.open(tmp_path)


def test_missing_shard_and_bad_files(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "gone.safetensors"}}))
    with pytest.raises(WeightArtifactError, match="missing: \\['gone.safetensors'\\]"):
        SafetensorsTensors.open(tmp_path)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x03")
    with pytest.raises(WeightArtifactError, match="shorter than 8 bytes"):
        read_safetensors_header(bad)
    with pytest.raises(WeightArtifactError, match="no such checkpoint"):
        SafetensorsTensors.open(tmp_path / "nothing")


def test_header_size_mismatch_is_refused(tmp_path: Path) -> None:
    text = json.dumps({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}).encode()
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(12))
    with pytest.raises(WeightArtifactError, match="spans 12 bytes, expected 16"):
        read_safetensors_header(path)


def test_host_placement_load_from_sharded_bf16_with_interleave(tmp_path: Path) -> None:
    """The loader's CPU path (host-placement buffer): pread + strided scatter, checked byte for byte."""
    rng = np.random.default_rng(2)
    gate = rng.integers(0, 2**16, (6, 8), dtype=np.uint16)
    up = rng.integers(0, 2**16, (6, 8), dtype=np.uint16)
    emb = rng.integers(0, 2**16, (5, 8), dtype=np.uint16)
    write_bf16_file(tmp_path / "s1.safetensors", {"gate": gate, "emb": emb})
    write_bf16_file(tmp_path / "s2.safetensors", {"up": up})
    tensors = SafetensorsTensors.open(tmp_path)
    buf = buffer_of("gate_up", "weight", "bf16", (Expr(17), Expr(8)), placement="host",
                     bind=(seg("emb", (0, 5)), interleave(("gate", "up"), 2)))
    plan = plan_bind(buf, tensors.meta)
    host = np.zeros(17 * 8, dtype=np.uint16)
    seen = []
    loader = WeightLoader(tensors, None, staging_bytes=64, progress=lambda done, total: seen.append((done, total)))
    nbytes, _ = loader.run([Target(plan, 0, host.ctypes.data)])
    want = np.concatenate([emb, gate[0:2], up[0:2], gate[2:4], up[2:4], gate[4:6], up[4:6]])
    np.testing.assert_array_equal(host.reshape(17, 8), want)
    assert nbytes == 17 * 8 * 2
    assert seen[-1] == (nbytes, nbytes)


@pytest.mark.parametrize("staging", [None, 200, 48, 7])
def test_host_placement_load_of_cols_rows_and_three_way_interleave(tmp_path: Path, staging: int | None) -> None:
    """Column slices (mid-row, at the row end, with a row range), a row range and an interleave of three
    tensors into host-placement buffers through pread, with staging sizes that split the 2-D copies by
    rows (and rows into 1-D pieces), compared with numpy slicing of the checkpoint."""
    rng = np.random.default_rng(5)
    o = rng.integers(0, 2**16, (9, 14), dtype=np.uint16)
    a, b, c = (rng.integers(0, 2**16, (6, 4), dtype=np.uint16) for _ in range(3))
    write_bf16_file(tmp_path / "s1.safetensors", {"o": o, "a": a})
    write_bf16_file(tmp_path / "s2.safetensors", {"b": b, "c": c})
    tensors = SafetensorsTensors.open(tmp_path)
    cols = buffer_of("o_cols", "weight", "bf16", (Expr(9 + 5), Expr(5)), placement="host",
                      bind=(seg("o", None, (9, 14), (9, 14)), seg("o", (2, 7), None, (4, 9))))
    tri = buffer_of("abc", "weight", "bf16", (Expr(2 + 18), Expr(4)), placement="host",
                     bind=(seg("c", (4, 6)), interleave(("a", "b", "c"), 2)))
    out_cols = np.zeros(14 * 5, dtype=np.uint16)
    out_tri = np.zeros(20 * 4, dtype=np.uint16)
    loader = WeightLoader(tensors, None, staging_bytes=staging)
    nbytes, _ = loader.run([Target(plan_bind(cols, tensors.meta), 0, out_cols.ctypes.data),
                            Target(plan_bind(tri, tensors.meta), 0, out_tri.ctypes.data)])
    np.testing.assert_array_equal(out_cols.reshape(14, 5), np.concatenate([o[:, 9:14], o[2:7, 4:9]]))
    want = np.concatenate([c[4:6]] + [t[r:r + 2] for r in range(0, 6, 2) for t in (a, b, c)])
    np.testing.assert_array_equal(out_tri.reshape(20, 4), want)
    assert nbytes == (14 * 5 + 20 * 4) * 2
