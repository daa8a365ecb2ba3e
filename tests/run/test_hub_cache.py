"""`--weights ORG/NAME` resolves in the local Hugging Face cache (kern_run.hub), never over the network: refs/main
present, absent, dangling; HF_HUB_CACHE, HF_HOME and the default; a missing model names where it looked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kern_run import hub
from kern_run.cli import app
from kern_run.errors import ConfigError


def _model(cache: Path, repo: str = "models--Qwen--Qwen3-8B", revs: tuple[str, ...] = ("a1b2c3",),
           main: str | None = "a1b2c3") -> Path:
    root = cache / repo
    for rev in revs:
        (root / "snapshots" / rev).mkdir(parents=True)
    if main is not None:
        (root / "refs").mkdir(parents=True)
        (root / "refs" / "main").write_text(main)  # huggingface_hub writes it without a newline
    return root


@pytest.fixture
def hf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "hub"


def test_refs_main_names_the_snapshot(hf: Path) -> None:
    root = _model(hf, revs=("a1b2c3", "d4e5f6"), main="d4e5f6\n")
    assert hub.resolve_weights_arg("Qwen/Qwen3-8B") == root / "snapshots" / "d4e5f6"


def test_without_refs_main_the_one_snapshot(hf: Path) -> None:
    root = _model(hf, main=None)
    assert hub.snapshot_dir("Qwen/Qwen3-8B") == root / "snapshots" / "a1b2c3"
    (root / "snapshots" / "zzz").mkdir()
    with pytest.raises(ConfigError) as exc:
        hub.snapshot_dir("Qwen/Qwen3-8B")
    assert str(exc.value) == (f"--weights Qwen/Qwen3-8B: {root} has no refs/main and 2 snapshots (a1b2c3, zzz): pass "
                              "one snapshot directory")


def test_a_dangling_refs_main_is_named(hf: Path) -> None:
    root = _model(hf, main="ffff00")
    with pytest.raises(ConfigError) as exc:
        hub.snapshot_dir("Qwen/Qwen3-8B")
    assert str(exc.value) == (f"--weights Qwen/Qwen3-8B: {root / 'refs' / 'main'} names revision 'ffff00', but "
                              f"{root / 'snapshots' / 'ffff00'} does not exist (an interrupted download?)")


@pytest.mark.parametrize("revision", ["../../..", "a1b2c3/../../..", "/etc", ".hidden", "main branch"])
def test_a_refs_main_that_is_not_a_plain_revision_is_refused(hf: Path, revision: str) -> None:
    """`../../..` was followed out of the cache (snapshots/../../.. is the cache's parent, a directory)."""
    root = _model(hf, main=revision)
    with pytest.raises(ConfigError) as exc:
        hub.snapshot_dir("Qwen/Qwen3-8B")
    assert str(exc.value) == (f"--weights Qwen/Qwen3-8B: {root / 'refs' / 'main'} names revision {revision!r}: "
                              "expected a commit hash or a plain name (letters, digits, '.', '_', '-'; no slash, no "
                              "leading dot)")


def test_a_plain_named_revision_is_taken(hf: Path) -> None:
    root = _model(hf, revs=("v1.0_rc-2",), main="v1.0_rc-2")
    assert hub.snapshot_dir("Qwen/Qwen3-8B") == root / "snapshots" / "v1.0_rc-2"


def test_an_absent_model_names_where_it_looked(hf: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        hub.snapshot_dir("Qwen/Qwen3-8B")
    assert str(exc.value) == (f"--weights Qwen/Qwen3-8B: no such directory, and not in the Hugging Face cache: no "
                              f"models--Qwen--Qwen3-8B in {hf} (HF_HUB_CACHE) (kern never downloads: fetch it with "
                              "`huggingface-cli download Qwen/Qwen3-8B`, or pass the checkpoint directory)")


def test_the_cache_directory_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hub.hub_cache() == (tmp_path / "home" / ".cache" / "huggingface" / "hub", "default")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.hub_cache() == (tmp_path / "xdg" / "huggingface" / "hub", "XDG_CACHE_HOME")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hub.hub_cache() == (tmp_path / "hf" / "hub", "HF_HOME")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c"))
    assert hub.hub_cache() == (tmp_path / "c", "HF_HUB_CACHE")


def test_an_existing_path_is_never_a_hub_id(hf: Path) -> None:
    _model(hf)
    Path("Qwen/Qwen3-8B").mkdir(parents=True)  # a relative directory of that name wins
    assert hub.resolve_weights_arg("Qwen/Qwen3-8B") == Path("Qwen/Qwen3-8B")
    assert not hub.is_hub_id("/abs/path") and not hub.is_hub_id("a/b/c") and not hub.is_hub_id("./x")
    assert hub.is_hub_id("meta-llama/Llama-3.2-1B")


def test_kern_run_takes_a_hub_id(hf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot's config.json is what the builder reads: a refusal of it names the snapshot's file."""
    root = _model(hf)
    config = root / "snapshots" / "a1b2c3" / "config.json"
    config.write_text(json.dumps({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe"}))
    result = CliRunner().invoke(app, ["run", "--weights", "Qwen/Qwen3-8B", "--no-pins"])
    assert result.exit_code == 1
    assert result.stderr.strip() == (f"kern run: {config}: architectures = ['Qwen3MoeForCausalLM'] is not supported: "
                                     "mixture-of-experts layers have no kernels (dense Qwen3 only)")
    absent = CliRunner().invoke(app, ["run", "--weights", "Qwen/Qwen3-32B"])
    assert absent.exit_code == 2 and absent.stderr.count("\n") == 1
    assert "no models--Qwen--Qwen3-32B in" in absent.stderr
