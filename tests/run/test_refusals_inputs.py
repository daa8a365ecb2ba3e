"""Hostile inputs to `kern run` (docs/caller.md "Refusals"): malformed checkpoint metadata, non-UTF-8 files,
kern.toml types and keys, mixed prompts files. Each is a typed refusal naming the file and what is wrong in
it, before the device probe; never a traceback, never a silent reinterpretation."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kern_run.session as session
from kern_run import preflight
from kern_run.cli import app
from kern_run.config import load_targets, resolve_config
from kern_run.errors import ConfigError, InputError, NoDeviceError, WeightsError
from kern_run.prefix_cache import read_prompts
from kern_run.text import eos_ids_of, load_codec

INDEX = "model.safetensors.index.json"


def _linked_ckpt(src: Path, dst: Path) -> Path:
    """A copy of checkpoint `src` whose big files are symlinks (cheap), small ones real copies to break."""
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            (dst / f.name).symlink_to(f)
        else:
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _st_file(path: Path, header: object, data: bytes = b"", header_len: int | None = None) -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if header_len is None else header_len) + text + data)
    return path


def _ckpt_with_index(tmp_path: Path, index_text: str) -> Path:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    _st_file(ckpt / "model.safetensors", {"t": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4)
    (ckpt / INDEX).write_text(index_text)
    return ckpt


# ---------------------------------------------------------------- 1. checkpoint metadata


@pytest.mark.parametrize("index_text, needle", [
    ("{not json", "is not JSON"),
    ('{"metadata": {}}', "weight_map"),
    ('{"weight_map": ["model.safetensors"]}', "weight_map"),
    ('[1, 2]', "weight_map"),
    ('{"weight_map": {"t": 5}}', "weight_map['t'] = 5"),
    ('{"weight_map": {"t": "../../../etc/passwd"}}', "'../../../etc/passwd' is not a file name inside"),
    ('{"weight_map": {"t": "/etc/passwd"}}', "'/etc/passwd' is not a file name inside"),
    ('{"weight_map": {"t": "model-2.safetensors"}}', "names shard 'model-2.safetensors'"),
])
def test_bad_index_is_refused_naming_it(tmp_path: Path, index_text: str, needle: str) -> None:
    ckpt = _ckpt_with_index(tmp_path, index_text)
    with pytest.raises(WeightsError) as err:
        preflight.checkpoint_tensors(ckpt)
    assert str(ckpt / INDEX) in str(err.value) and needle in str(err.value), err.value


def test_index_with_shard_in_a_subdirectory_is_fine(tmp_path: Path) -> None:
    ckpt = _ckpt_with_index(tmp_path, '{"weight_map": {"t": "sub/model.safetensors"}}')
    (ckpt / "sub").mkdir()
    (ckpt / "model.safetensors").rename(ckpt / "sub" / "model.safetensors")
    assert preflight.checkpoint_tensors(ckpt) == {"t": ("bf16", (2,))}


@pytest.mark.parametrize("header, data, header_len, needle", [
    ({"t": {"shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, None, "tensor 't' has a malformed header entry"),
    ({"t": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}, b"", 2 ** 62, "header length"),
    ({"t": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}, b"\0" * 4, None, "tensor 't' ends at byte"),
    ({"t": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 4, None, "spans 2 bytes"),
    ({"t": {"dtype": "BF16", "shape": ["2"], "data_offsets": [0, 4]}}, b"\0" * 4, None, "malformed header entry"),
    ({"t": {"dtype": "BF16", "shape": [2], "data_offsets": [4, 0]}}, b"\0" * 4, None, "malformed header entry"),
    ({"t": {"dtype": 7, "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, None, "unsupported dtype 7"),
    ([1, 2], b"", None, "not an object"),
])
def test_bad_safetensors_header_is_refused_naming_shard_and_tensor(tmp_path: Path, header, data: bytes,
                                                                   header_len, needle: str) -> None:
    shard = _st_file(tmp_path / "model.safetensors", header, data, header_len)
    for weights in (shard, tmp_path):  # the file itself, and a directory without an index
        with pytest.raises(WeightsError) as err:
            preflight.checkpoint_tensors(weights)
        assert str(shard) in str(err.value) and needle in str(err.value), err.value


def test_truncated_shard_of_a_real_checkpoint(tiny_ckpt: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for f in tiny_ckpt.iterdir():
        if f.suffix != ".safetensors":
            (ckpt / f.name).write_bytes(f.read_bytes())
    shard = sorted(tiny_ckpt.glob("*.safetensors"))[-1]
    with open(shard, "rb") as src, open(ckpt / shard.name, "wb") as dst:
        dst.write(src.read(shard.stat().st_size - 1000))
    for other in sorted(tiny_ckpt.glob("*.safetensors"))[:-1]:
        (ckpt / other.name).symlink_to(other)
    with pytest.raises(WeightsError, match=re.escape(str(ckpt / shard.name)) + r".*tensor '.*' ends at byte"):
        preflight.checkpoint_tensors(ckpt)


@pytest.mark.parametrize("name, text, needle", [
    ("generation_config.json", "{oops", "is not JSON"),
    ("generation_config.json", "[1, 2]", "expected a JSON object"),
    ("generation_config.json", '{"eos_token_id": ["a"]}', "eos_token_id = ['a']"),
    ("generation_config.json", '{"eos_token_id": true}', "eos_token_id = True"),
    ("generation_config.json", '{"eos_token_id": [1, -2]}', "eos_token_id = [1, -2]"),
    ("config.json", '{"eos_token_id": "2"}', "eos_token_id = '2'"),
])
def test_bad_generation_config_is_refused_naming_file(tmp_path: Path, name: str, text: str, needle: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(InputError) as err:
        eos_ids_of(tmp_path)
    assert str(tmp_path / name) in str(err.value) and needle in str(err.value), err.value


def test_eos_ids_accept_int_list_and_null(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [3, 4]}')
    (tmp_path / "config.json").write_text('{"eos_token_id": null}')
    assert eos_ids_of(tmp_path) == {3, 4}


def test_garbage_tokenizer_is_refused_naming_it(tiny_ckpt: Path, tmp_path: Path) -> None:
    ckpt = _linked_ckpt(tiny_ckpt, tmp_path / "ckpt")
    (ckpt / "tokenizer.json").write_text('{"this": "is not a tokenizer"}')
    with pytest.raises(InputError, match=re.escape(str(ckpt / "tokenizer.json")) + ".*not a usable tokenizer"):
        load_codec(ckpt)


@pytest.fixture
def no_device(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No GPU here: a refusal of the inputs must come first (exit 2, not the device's 3)."""
    def probe(gpu: int) -> int:
        raise NoDeviceError("no CUDA device")

    monkeypatch.setattr(session, "probe_device", probe)
    empty = tmp_path / "empty-kern.toml"
    empty.write_text("")
    monkeypatch.setenv("KERN_TOML", str(empty))


def _run_refused(manifest: Path, kernels: Path, weights: Path, *needles: str, extra: tuple[str, ...] = ()) -> None:
    result = CliRunner().invoke(app, ["run", "--manifest", str(manifest), "--kernels", str(kernels),
                                      "--weights", str(weights), "--log-level", "info", *extra])
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1, (result.exit_code, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == ""
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("name, text, needle", [
    (INDEX, '{"weight_map": ["x"]}', "weight_map"),
    (INDEX, '{"weight_map": {"model.norm.weight": "../../../etc/passwd"}}', "../../../etc/passwd"),
    ("generation_config.json", "[]", "expected a JSON object"),
    ("tokenizer.json", "garbage", "not a usable tokenizer"),
])
def test_cli_refuses_bad_checkpoint_metadata_before_the_device(no_device, tiny_manifest: Path, kernels_dir: Path,
                                                               tiny_ckpt: Path, tmp_path: Path, name: str,
                                                               text: str, needle: str) -> None:
    ckpt = _linked_ckpt(tiny_ckpt, tmp_path / "ckpt")
    (ckpt / name).write_text(text)
    _run_refused(tiny_manifest, kernels_dir, ckpt, str(ckpt / name), needle)


def test_cli_refuses_a_truncated_shard_before_the_device(no_device, tiny_manifest: Path, kernels_dir: Path,
                                                         tmp_path: Path) -> None:
    shard = _st_file(tmp_path / "w.safetensors", {"t": {"dtype": "BF16", "shape": [8], "data_offsets": [0, 16]}},
                     b"\0" * 3)
    _run_refused(tiny_manifest, kernels_dir, shard, str(shard), "tensor 't'", "past the file end")


# ---------------------------------------------------------------- 2. non-UTF-8 files


BAD_UTF8 = b'{"a": "\xff\xfe"}\n'


def test_non_utf8_manifest(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_bytes(BAD_UTF8)
    with pytest.raises(ConfigError, match=re.escape(str(path)) + r" is not UTF-8 text \(byte 0xff at offset 7\)"):
        preflight.read_manifest(path)


def test_non_utf8_manifest_cli(no_device, kernels_dir: Path, tiny_ckpt: Path, tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_bytes(BAD_UTF8)
    _run_refused(path, kernels_dir, tiny_ckpt, str(path), "not UTF-8")


def test_non_utf8_kern_toml(tmp_path: Path) -> None:
    path = tmp_path / "kern.toml"
    path.write_bytes(b'default = "\xff"\n')
    with pytest.raises(ConfigError, match=re.escape(str(path)) + " is not UTF-8"):
        load_targets(path)


def test_non_utf8_prompts(tmp_path: Path) -> None:
    path = tmp_path / "p.txt"
    path.write_bytes(b"hello\n\xff\n")
    with pytest.raises(InputError, match=re.escape(f"--prompts {path}") + r": not UTF-8 text \(byte 0xff at offset 6\)"):
        read_prompts(path)


def test_non_utf8_index_and_generation_config(tmp_path: Path) -> None:
    ckpt = _ckpt_with_index(tmp_path, "")
    (ckpt / INDEX).write_bytes(BAD_UTF8)
    with pytest.raises(WeightsError, match=re.escape(str(ckpt / INDEX)) + " is not UTF-8"):
        preflight.checkpoint_tensors(ckpt)
    (ckpt / "generation_config.json").write_bytes(BAD_UTF8)
    with pytest.raises(InputError, match=re.escape(str(ckpt / "generation_config.json")) + " is not UTF-8"):
        eos_ids_of(ckpt)


# ---------------------------------------------------------------- 3. kern.toml


TARGET = '[targets.a]\nmanifest = "m.json"\nkernels = "k"\nweights = "w"\n'


@pytest.mark.parametrize("text, needles", [
    ('default = "a"\ntargets = 5\n', ["targets = 5", "table"]),
    ('defualt = "a"\n' + TARGET, ["'defualt'", "['default', 'targets']"]),
    ('default = 5\n' + TARGET, ["default = 5"]),
    ('default = "a"\n' + TARGET + "gpu = true\n", ["[targets.a] gpu = True", "integer"]),
    ('default = "a"\n' + TARGET + "capacity = false\n", ["[targets.a] capacity = False"]),
    ('default = "a"\n' + TARGET + 'chunk = "512"\n', ["[targets.a] chunk = '512'"]),
    ('default = "a"\n' + TARGET + "chunk = 0\n", ["[targets.a] chunk = 0", ">= 1"]),
    ('default = "a"\n' + TARGET.replace('manifest = "m.json"', "manifest = 5"), ["[targets.a] manifest = 5", "path"]),
    ('default = "a"\n' + TARGET.replace('weights = "w"', "weights = [1]"), ["[targets.a] weights = [1]"]),
])
def test_kern_toml_refusals_name_file_and_target(tmp_path: Path, text: str, needles: list[str]) -> None:
    path = tmp_path / "kern.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        resolve_config(path, None, {})
    assert str(path) in str(err.value), err.value
    for needle in needles:
        assert needle in str(err.value), err.value


def test_kern_toml_ints_still_accepted(tmp_path: Path) -> None:
    path = tmp_path / "kern.toml"
    path.write_text('default = "a"\n' + TARGET + "gpu = 0\ncapacity = 100\nchunk = 8\n")
    cfg = resolve_config(path, None, {})
    assert (cfg.gpu, cfg.capacity_tokens, cfg.chunk, cfg.manifest) == (0, 100, 8, tmp_path / "m.json")


def test_repository_kern_toml_loads() -> None:
    default, targets = load_targets(Path(__file__).resolve().parents[2] / "kern.toml")
    assert default in targets


# ---------------------------------------------------------------- 4. prompts files


@pytest.mark.parametrize("text, line", [
    ('{"prompt": "a"}\nplain text\n', 2),
    ('plain text\n\n{"prompt": "a"}\n', 1),
    ('["a"]\n', 1),
    ('{"prompt": "a"}\n\n["b"]\n', 3),
    ('{"prompt": "a"}\n\n{"prompt": 5}\n', 3),
])
def test_prompts_file_with_any_json_line_is_jsonl(tmp_path: Path, text: str, line: int) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(InputError, match=re.escape(f"--prompts {path}:{line}:") + ".*read as JSONL"):
        read_prompts(path)


def test_plain_prompts_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "p.txt"
    path.write_text("one {brace} inside\n  two\n")
    assert read_prompts(path) == ["one {brace} inside", "  two"]
