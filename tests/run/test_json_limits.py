"""JSON that json.loads refuses without a JSONDecodeError: nesting past the recursion limit (RecursionError) and an
integer literal past Python's digit limit (a plain ValueError). Every JSON file `kern run` reads (the manifest,
config.json, generation_config.json, the safetensors index, a shard header, the --prompts JSONL) and kern.toml
must refuse them as any other malformed input: one stderr line naming the file, exit 2, before the device probe
(docs/caller.md "Refusals")."""

from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kern_run.cli import app
from kern_run_testutil import PROBED

DEEP = "[" * 100_000 + "]" * 100_000
DIGITS = (sys.get_int_max_str_digits() or 4300) + 700  # over the limit (0: no limit, then the test is moot)


pytestmark = pytest.mark.usefixtures("stub_device_probe")  # kern_run_testutil: the probe is exit 3


@pytest.fixture
def ckpt(tmp_path: Path, tiny_ckpt: Path) -> Path:
    return Path(shutil.copytree(tiny_ckpt, tmp_path / "ckpt"))


def _refused(args: list[str], *needles: str) -> str:
    result = CliRunner().invoke(app, args)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1, (result.exit_code, result.stderr[-2000:])
    assert "Traceback" not in result.stderr and result.stdout == ""
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _run(manifest: Path, kernels: Path, weights: Path, *extra: str) -> list[str]:
    return ["run", "--manifest", str(manifest), "--kernels", str(kernels), "--weights", str(weights),
            "--log-level", "info", *extra]


def _why(body: str) -> str:
    """The reason kern_manifest.json_text_fault gives for the `body` case."""
    return "not usable JSON (nested too deeply)" if body == "deep" else \
        f"not usable JSON (an integer literal has more than {sys.get_int_max_str_digits()} digits"


def _big_int() -> str:
    if not sys.get_int_max_str_digits():
        pytest.skip("this Python has no integer digit limit")
    return "1" * DIGITS


def test_valid_target_reaches_the_stubbed_probe(tiny_manifest: Path, kernels_dir: Path, ckpt: Path) -> None:
    """The control: the untouched copy passes preflight (so each refusal below is the edited file's)."""
    result = CliRunner().invoke(app, _run(tiny_manifest, kernels_dir, ckpt))
    assert result.exit_code == 3 and PROBED in result.stderr, result.stderr


@pytest.mark.parametrize("body", ["deep", "bigint"])
def test_generation_config(body: str, tiny_manifest: Path, kernels_dir: Path, ckpt: Path) -> None:
    text = DEEP if body == "deep" else '{"eos_token_id": ' + _big_int() + "}"
    (ckpt / "generation_config.json").write_text(text)
    _refused(_run(tiny_manifest, kernels_dir, ckpt), "generation_config.json", _why(body))


@pytest.mark.parametrize("body", ["deep", "bigint"])
def test_config_json(body: str, tiny_manifest: Path, kernels_dir: Path, ckpt: Path) -> None:
    (ckpt / "config.json").write_text(DEEP if body == "deep" else '{"eos_token_id": ' + _big_int() + "}")
    _refused(_run(tiny_manifest, kernels_dir, ckpt), "config.json", _why(body))


@pytest.mark.parametrize("body", ["deep", "bigint"])
def test_prompts_jsonl(body: str, tiny_manifest: Path, kernels_dir: Path, ckpt: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    bad = DEEP if body == "deep" else '{"prompt": "a", "n": ' + _big_int() + "}"
    prompts.write_text('{"prompt": "fine"}\n' + bad + "\n")
    _refused(_run(tiny_manifest, kernels_dir, ckpt, "--prompts", str(prompts)), f"{prompts}:2", _why(body))


@pytest.mark.parametrize("body", ["deep", "bigint"])
def test_manifest(body: str, kernels_dir: Path, ckpt: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text(DEEP if body == "deep" else '{"format": ' + _big_int() + "}")
    _refused(_run(manifest, kernels_dir, ckpt), str(manifest), _why(body))


@pytest.mark.parametrize("body", ["deep", "bigint"])
def test_safetensors_index(body: str, tiny_manifest: Path, kernels_dir: Path, ckpt: Path) -> None:
    index = ckpt / "model.safetensors.index.json"
    raw = json.loads(index.read_text())
    index.write_text(DEEP if body == "deep" else json.dumps(raw)[:-1] + ', "n": ' + _big_int() + "}")
    _refused(_run(tiny_manifest, kernels_dir, ckpt), str(index), _why(body))


@pytest.mark.parametrize("body", ["deep", "bigint"])
def test_shard_header(body: str, tiny_manifest: Path, kernels_dir: Path, ckpt: Path) -> None:
    shard = ckpt / sorted(set(json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"].values()))[0]
    header = DEEP.encode() if body == "deep" else (
        b'{"w": {"dtype": "F32", "shape": [' + _big_int().encode() + b'], "data_offsets": [0, 4]}}')
    shard.write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
    _refused(_run(tiny_manifest, kernels_dir, ckpt), shard.name, "header", _why(body))


def test_kern_toml_nested_too_deeply(tmp_path: Path) -> None:
    toml = tmp_path / "kern.toml"
    toml.write_text("default = " + DEEP + "\n")
    _refused(["run", "--config", str(toml)], str(toml), "nested too deeply")
