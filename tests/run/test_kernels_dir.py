"""tools/kernels_dir.py: kernels/ holds only cubins something at HEAD names; an older commit's come back from git."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

import kernels_dir as kd

ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def test_every_committed_cubin_is_named_at_head() -> None:
    """The tree the GPU machine receives carries no cubin only an older manifest used (prune before committing)."""
    tracked = {Path(p).name for p in _git("ls-files", "kernels/*.cubin").split()}
    named = kd.named_at_head()
    assert tracked, "no committed cubins"
    assert sorted(tracked - named) == []
    assert sorted(named - tracked) == []  # and each named one is committed


def test_restore_writes_a_commits_cubins_with_their_hashes(tmp_path: Path) -> None:
    """restore REV writes every cubin REV's kernels.json and manifests name, each with the sha256 its name pins, and
    nothing twice. HEAD stands for REV here (a CI clone may hold no older commit); an older one is the same
    `git show` of another revision."""
    written = kd.restore("HEAD", tmp_path)
    assert {p.name for p in written} == kd.named_at_head()
    for path in written:
        assert hashlib.sha256(path.read_bytes()).hexdigest()[:12] == path.stem.rsplit("-", 1)[1]
    assert kd.restore("HEAD", tmp_path) == []


def test_unused_lists_an_extra_cubin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "manifests").mkdir()
    (tmp_path / "kernels" / "kernels.json").write_text(
        '{"format": "kern-kernels/1", "modules": {"norm": {"file": "norm-0123456789ab.cubin"}}}')
    (tmp_path / "manifests" / "m.json").write_text('{"modules": {"rope": "' + "ab" * 32 + '"}}')
    for name in ("norm-0123456789ab.cubin", "rope-abababababab.cubin", "rope-0000000000aa.cubin"):
        (tmp_path / "kernels" / name).write_bytes(b"x")
    assert [p.name for p in kd.unused(tmp_path)] == ["rope-0000000000aa.cubin"]


@pytest.mark.parametrize("text", ["not json", '{"format": "kern-kernels/1"}', "[]"])
def test_an_unreadable_module_table_is_refused(tmp_path: Path, text: str) -> None:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "manifests").mkdir()
    (tmp_path / "kernels" / "kernels.json").write_text(text)
    with pytest.raises(kd.KernelsDirError, match="no readable module table"):
        kd.unused(tmp_path)


def test_restore_of_an_unknown_revision_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert kd.main(["restore", "no-such-rev-0000"]) == 2
    assert "kernels_dir: git show no-such-rev-0000:kernels/kernels.json" in capsys.readouterr().err
