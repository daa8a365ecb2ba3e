"""Which manifest `kern serve` runs (docs/serve.md "Which manifest"): a kern.toml target's `serve_manifest` (a
batch-invariant decode) unless --manifest or --no-invariant says otherwise; `kern run` keeps the target's
`manifest`. Also: the repository's targets name committed invariant manifests of their own model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kern_run.config import load_targets, resolve_config
from kern_run.errors import ConfigError
from kern_run.preflight import read_manifest
from kern_run.serve.server import ServeOptions, serving_config

ROOT = Path(__file__).resolve().parents[2]


def _toml(tmp_path: Path, extra: str = 'serve_manifest = "m/inv.json"\n') -> Path:
    path = tmp_path / "kern.toml"
    path.write_text('default = "t"\n[targets.t]\nmanifest = "m/fast.json"\nkernels = "k"\nweights = "w"\n' + extra)
    return path


def test_serve_manifest_resolves_beside_the_toml_and_serve_picks_it(tmp_path: Path) -> None:
    toml = _toml(tmp_path)
    _, targets = load_targets(toml)
    assert targets["t"]["serve_manifest"] == (tmp_path / "m" / "inv.json").resolve()
    cfg = resolve_config(toml, None, {"manifest": None})
    assert cfg.manifest == (tmp_path / "m" / "fast.json").resolve()  # kern run's
    assert cfg.serve_manifest == (tmp_path / "m" / "inv.json").resolve()
    served = serving_config(cfg, ServeOptions())
    assert served.manifest == cfg.serve_manifest and served.serve_manifest is None
    assert serving_config(cfg, ServeOptions(invariant=False)) == cfg  # --no-invariant: the target's manifest


def test_a_manifest_flag_wins_over_serve_manifest(tmp_path: Path) -> None:
    cfg = resolve_config(_toml(tmp_path), None, {"manifest": str(tmp_path / "mine.json")})
    assert cfg.serve_manifest is None
    assert serving_config(cfg, ServeOptions()).manifest == tmp_path / "mine.json"


def test_a_target_without_serve_manifest_serves_its_manifest(tmp_path: Path) -> None:
    cfg = resolve_config(_toml(tmp_path, ""), None, {})
    assert cfg.serve_manifest is None and serving_config(cfg, ServeOptions()) == cfg


def test_serve_manifest_must_be_a_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[targets.t\] serve_manifest = 3 must be a path string"):
        load_targets(_toml(tmp_path, "serve_manifest = 3\n"))


@pytest.mark.parametrize("target", ["tiny-en", "qwen3-4b"])
def test_the_repository_targets_serve_an_invariant_manifest_of_their_model(target: str) -> None:
    _, targets = load_targets(ROOT / "kern.toml")
    fields = targets[target]
    fast, inv = read_manifest(fields["manifest"]), read_manifest(fields["serve_manifest"])
    assert inv.decode_batch_invariant and inv.prefill_batch_invariant and not fast.decode_batch_invariant
    meta_fast = json.loads(Path(fields["manifest"]).read_text())["meta"]
    meta_inv = json.loads(Path(fields["serve_manifest"]).read_text())["meta"]
    assert meta_inv["config_sha256"] == meta_fast["config_sha256"] and meta_inv["model"] == meta_fast["model"]
    assert (inv.page_tokens, inv.pages_per_seq, inv.tokens_max) == (fast.page_tokens, fast.pages_per_seq,
                                                                    fast.tokens_max)
    assert inv.manifest.vars["seqs"].max == fast.manifest.vars["seqs"].max == 64
