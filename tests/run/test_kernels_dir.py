"""tools/kernels_dir.py: kernels/ holds only cubins the tree names; an older commit's come back from git."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from tools import kernels_dir as kd

ROOT = Path(__file__).resolve().parents[2]


def test_every_cubin_in_kernels_is_named_and_every_named_one_is_there() -> None:
    """The tree the GPU machine receives carries no cubin only an older manifest used (prune before committing),
    and every cubin kernels.json or a manifest names is present. Both sides are the working tree, so a rebuild
    that is pruned but not yet committed passes too."""
    on_disk = {p.name for p in (ROOT / "kernels").glob("*.cubin")}
    named = kd.named_in_tree()
    assert on_disk
    assert sorted(on_disk - named) == []
    assert sorted(named - on_disk) == []


def _repo(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A git repository with a kernels.json naming one cubin, a manifest naming another, a third cubin nothing
    names, committed once; then the first two deleted in a second commit. Returns (repo, name -> bytes)."""
    repo = tmp_path / "repo"
    (repo / "kernels").mkdir(parents=True)
    (repo / "manifests").mkdir()
    blobs = {}
    for module, payload in (("norm", b"norm cubin"), ("rope", b"rope cubin"), ("old", b"unnamed cubin")):
        sha = hashlib.sha256(payload).hexdigest()
        blobs[f"{module}-{sha[:12]}.cubin"] = payload
        (repo / "kernels" / f"{module}-{sha[:12]}.cubin").write_bytes(payload)
    norm, rope = sorted(n for n in blobs if n.startswith(("norm", "rope")))
    (repo / "kernels" / "kernels.json").write_text(json.dumps(
        {"format": "kern-kernels/1", "modules": {"norm": {"file": norm}}}))
    (repo / "manifests" / "m.json").write_text(json.dumps(
        {"modules": {"rope": hashlib.sha256(b"rope cubin").hexdigest()}}))

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)
    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "first")
    git("rm", "-q", f"kernels/{norm}", f"kernels/{rope}")
    git("commit", "-q", "-m", "second")
    return repo, blobs


def test_restore_writes_exactly_the_cubins_a_revision_named(tmp_path: Path) -> None:
    repo, blobs = _repo(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    written = kd.restore("HEAD~1", out, repo)
    assert sorted(p.name for p in written) == sorted(n for n in blobs if not n.startswith("old"))
    for path in written:
        assert path.read_bytes() == blobs[path.name]
    assert kd.restore("HEAD~1", out, repo) == []  # nothing twice
    damaged = written[0]
    damaged.write_bytes(b"truncated")
    assert kd.restore("HEAD~1", out, repo) == [damaged]  # a file whose bytes do not match its name is rewritten
    assert damaged.read_bytes() == blobs[damaged.name]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in written)  # no temporary left


def test_restore_of_an_unknown_revision_is_refused(tmp_path: Path) -> None:
    repo, _ = _repo(tmp_path)
    with pytest.raises(kd.KernelsDirError, match="git show no-such-rev:kernels/kernels.json"):
        kd.restore("no-such-rev", tmp_path, repo)


def test_unused_lists_an_extra_cubin(tmp_path: Path) -> None:
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
