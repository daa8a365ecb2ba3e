"""tools/make_checkpoint.py never destroys what it did not write, and a failed run leaves --out as it was."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from tools import make_checkpoint as mc


def _snapshot(d: Path) -> dict[str, str]:
    """name -> sha256 of every entry of `d`, hidden files included."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def _make(out: Path, *args: str) -> int:
    return mc.main(["--shape", "tiny", "--out", str(out), "--threads", "4", *args])


def test_a_real_checkpoint_dir_is_refused_and_untouched(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real = tmp_path / "realhf"
    real.mkdir()
    (real / "model-00001-of-00002.safetensors").write_bytes(b"REAL\n")
    (real / "model-00002-of-00002.safetensors").write_bytes(b"REAL2\n")
    (real / "config.json").write_text('{"model_type":"llama"}\n')
    before = _snapshot(real)
    assert _make(real, "--no-tokenizer") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"make_checkpoint: {real}: not empty and not written by "
                                                   "make_checkpoint")
    assert "config.json, model-00001-of-00002.safetensors, model-00002-of-00002.safetensors" in err
    assert _snapshot(real) == before


@pytest.mark.parametrize("stamp", ["", "{not json", '{"format": "someone-else/1"}'])
def test_an_invalid_stamp_is_no_licence_to_overwrite(tmp_path: Path, stamp: str) -> None:
    out = tmp_path / "x"
    out.mkdir()
    (out / "kern_checkpoint.json").write_text(stamp)
    (out / "model-00001-of-00001.safetensors").write_bytes(b"mine")
    before = _snapshot(out)
    assert _make(out, "--no-tokenizer") == 1
    assert _snapshot(out) == before


def test_a_bad_tokenizer_source_leaves_a_good_checkpoint_as_it_was(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    keep = tmp_path / "keep"
    assert _make(keep, "--seed", "1") == 0
    before = _snapshot(keep)
    missing = tmp_path / "nonexistent"
    assert _make(keep, "--seed", "2", "--tokenizer-source", str(missing)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"looked at: {missing}" in err
    assert "pass --tokenizer-source" in err and "--source /" not in err.replace("--tokenizer-source", "")
    bad = tmp_path / "qwen.tiktoken"
    bad.write_bytes(b"IQ== 0\n@@@ 1\n")
    assert _make(keep, "--seed", "2", "--tokenizer-source", str(bad)) == 1
    assert _snapshot(keep) == before


def test_a_failure_mid_write_leaves_a_good_checkpoint_as_it_was(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    keep = tmp_path / "keep"
    assert _make(keep, "--seed", "1", "--no-tokenizer") == 0
    before = _snapshot(keep)
    real = mc.tensor_chunk_bf16

    def chunk(seed: int, name: str, numel: int, c: int) -> np.ndarray:
        if name == "model.layers.3.mlp.down_proj.weight":
            raise OSError(28, "No space left on device", str(keep))
        return real(seed, name, numel, c)

    monkeypatch.setattr(mc, "tensor_chunk_bf16", chunk)
    assert _make(keep, "--seed", "2", "--no-tokenizer", "--max-shard-gb", "0.03") == 1
    assert _snapshot(keep) == before


def test_rerunning_into_its_own_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    assert _make(out, "--seed", "1", "--no-tokenizer", "--max-shard-gb", "0.03") == 0
    assert len(list(out.glob("model-*.safetensors"))) == 2
    assert _make(out, "--seed", "1", "--no-tokenizer", "--max-shard-gb", "0.03") == 0
    assert "nothing to do" in capsys.readouterr().out
    # another seed and shard count: rewritten in place, the old shards gone, as a fresh directory would be
    assert _make(out, "--seed", "2", "--no-tokenizer") == 0
    assert _make(fresh, "--seed", "2", "--no-tokenizer") == 0
    assert _snapshot(out) == _snapshot(fresh)
    assert json.loads((out / "kern_checkpoint.json").read_text())["seed"] == 2


def test_a_killed_first_run_can_be_rerun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run killed while writing shards (no Python cleanup) leaves its "writing" stamp: the rerun may rewrite."""
    out, fresh = tmp_path / "out", tmp_path / "fresh"

    def killed(*_args: object) -> dict:
        (out / ".model-00001-of-00001.safetensors.tmp").write_bytes(b"half")
        raise SystemExit("killed")

    with monkeypatch.context() as m:
        m.setattr(mc, "_write_shard_temps", killed)
        m.setattr(mc.Path, "unlink", lambda *a, **k: None)  # as if no cleanup ran
        m.setattr(mc.Path, "rmdir", lambda *a, **k: None)
        with pytest.raises(SystemExit):
            _make(out, "--no-tokenizer")
    assert json.loads((out / "kern_checkpoint.json").read_text())["format"] == mc.STAMP_FORMAT
    assert _make(out, "--no-tokenizer") == 0
    assert _make(fresh, "--no-tokenizer") == 0
    assert _snapshot(out) == _snapshot(fresh)
