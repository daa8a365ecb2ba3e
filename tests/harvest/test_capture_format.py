"""The capture directory format: written whole, read back equal, and every way a file can break it refused with
the file and line or key named (docs/harvest.md "Capture directory")."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kern_run.harvest.capture_format import FORMAT, capture_files, read_capture, write_capture
from kern_run.harvest.errors import CaptureFormatError
from tests.harvest.harvest_testkit import synthetic_capture


@pytest.fixture
def written(tmp_path: Path) -> Path:
    target = tmp_path / "capture"
    write_capture(target, synthetic_capture())
    return target


def test_round_trip(written: Path) -> None:
    assert read_capture(written) == synthetic_capture()
    assert sorted(p.relative_to(written).as_posix() for p in written.rglob("*") if p.is_file()) == sorted(
        capture_files(synthetic_capture()))
    assert json.loads((written / "meta.json").read_text())["format"] == FORMAT


def test_write_refuses_an_existing_target_and_leaves_no_temporary(written: Path) -> None:
    with pytest.raises(FileExistsError):
        write_capture(written, synthetic_capture())
    assert sorted(p.name for p in written.parent.iterdir()) == ["capture"]


def _edit_line(path: Path, number: int, edit) -> None:  # type: ignore[no-untyped-def]
    lines = path.read_text().splitlines()
    obj = json.loads(lines[number - 1])
    edit(obj)
    lines[number - 1] = json.dumps(obj)
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(("line", "edit", "message"), [
    (2, lambda o: o.update(gird=[1, 1, 1]), r"launches.jsonl:2: unknown key 'gird'"),
    (2, lambda o: o.pop("block"), r"launches.jsonl:2: missing key 'block'"),
    (2, lambda o: o.update(bytes=o["bytes"][:-2]), r"launches.jsonl:2.bytes: not 36 bytes in lowercase hex"),
    (2, lambda o: o.update(grid=[0, 1, 1]), r"launches.jsonl:2.grid: \[0, 1, 1\] is not a list of 3 integers"),
    (2, lambda o: o.update(module="ABC"), r"launches.jsonl:2.module: \"ABC\" is not a sha256"),
    (2, lambda o: o.update(params=[[0, 8], [4, 8]]), r"launches.jsonl:2.params\[1\]: \[4, 8\] is not an \[offset, size\]"),
    (2, lambda o: o.update(run=5), r"launches.jsonl:2.run: 5 is not an integer in \[0, 1\]"),
    (1, lambda o: o.update(event="memcpy"), r"launches.jsonl:1.event: \"memcpy\" is not one of launch, alloc, free, api"),
    (1, lambda o: o.update(bytes=True), r"launches.jsonl:1.bytes: true is not an integer"),
])
def test_a_bad_event_names_its_line_and_key(written: Path, line: int, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    _edit_line(written / "launches.jsonl", line, edit)
    with pytest.raises(CaptureFormatError, match=message):
        read_capture(written)


def test_bad_tensors_and_meta(written: Path) -> None:
    tensors = json.loads((written / "tensors.json").read_text())
    tensors["runs"][0][0]["shape"] = [256, 65]
    (written / "tensors.json").write_text(json.dumps(tensors))
    with pytest.raises(CaptureFormatError, match=r"tensors.json.runs\[0\]\[0\]: shape \[256, 65\] of bf16 is 33280 "
                                                 r"bytes, not the 32768 recorded"):
        read_capture(written)
    tensors["runs"][0][0]["shape"] = [256, 64]
    tensors["runs"][0][0]["kind"] = "constant"
    (written / "tensors.json").write_text(json.dumps(tensors))
    with pytest.raises(CaptureFormatError, match=r"kind: \"constant\" is not one of weight, state, input, output"):
        read_capture(written)
    (written / "tensors.json").write_text(json.dumps({"runs": [[]]}))
    with pytest.raises(CaptureFormatError, match=r"tensors.json.runs: expected 2 lists of tensors"):
        read_capture(written)
    meta = json.loads((written / "meta.json").read_text())
    (written / "meta.json").write_text(json.dumps({**meta, "format": "kern-harvest-capture/2"}))
    with pytest.raises(CaptureFormatError, match=r"meta.json.format: \"kern-harvest-capture/2\", expected"):
        read_capture(written)
    (written / "meta.json").write_text(json.dumps({**meta, "runs": [{"tokens": 1}, {"tokens": 1}]}))
    with pytest.raises(CaptureFormatError, match=r"token counts \[1, 1\] repeat"):
        read_capture(written)
    (written / "meta.json").write_text('{"format": 1, "format": 2}')
    with pytest.raises(CaptureFormatError, match=r"meta.json: not JSON|duplicate key 'format'"):
        read_capture(written)


def test_files_that_are_not_regular_or_too_large(written: Path) -> None:
    (written / "launches.jsonl").unlink()
    os.mkfifo(written / "launches.jsonl")  # never opened for reading: refused from its stat
    with pytest.raises(CaptureFormatError, match=r"launches.jsonl: not a regular file \(a FIFO\)"):
        read_capture(written)
    (written / "launches.jsonl").unlink()
    with open(written / "launches.jsonl", "wb") as f:
        f.truncate((256 << 20) + 1)  # sparse: past the bound without writing it
    with pytest.raises(CaptureFormatError, match=r"launches.jsonl: too large"):
        read_capture(written)
    (written / "launches.jsonl").write_bytes(b"{" + b" " * (1 << 20) + b"}\n")
    with pytest.raises(CaptureFormatError, match=r"launches.jsonl:1: a line of 1048578 bytes"):
        read_capture(written)


def test_cubins_must_match_their_names(written: Path) -> None:
    path = next((written / "cubins").iterdir())
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(CaptureFormatError, match=rf"{path.name}: has sha256 [0-9a-f]{{64}}, not the one its name gives"):
        read_capture(written)
    path.rename(path.with_name("notasha.cubin"))
    with pytest.raises(CaptureFormatError, match=r"notasha.cubin: not named <sha256>.cubin"):
        read_capture(written)


def test_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(CaptureFormatError, match=r"not a directory"):
        read_capture(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CaptureFormatError, match=r"meta.json: No such file"):
        read_capture(tmp_path / "empty")
