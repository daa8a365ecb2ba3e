"""`--weights` repeated / a kern.toml `weights` list: several .safetensors files as one checkpoint.

The list is carried from the flags or kern.toml through resolve_config and preflight (every file's header, each
refusal naming its file) down to kern_runtime's `SafetensorsTensors.open` in the runtime load call; one path (a
directory or a file) behaves as before lists existed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kern_runtime
from kern_run import preflight
from kern_run.abtest import AbRequest, check_request
from kern_run.cli import app
from kern_run.config import RunConfig, normalize_weights, resolve_config, runtime_weights, weights_label
from kern_run.errors import ConfigError, InputError, RefusalError, WeightsError
from kern_run.generate import Generator
from kern_run.text import checkpoint_dir, load_codec
from kern_run_testutil import PROBED, ROOT, FakeRuntime, make_checkpoint, make_manifest

SIDE_FILES = ("tokenizer.json", "config.json", "generation_config.json")


@pytest.fixture(scope="module")
def sharded_ckpt(tmp_path_factory: pytest.TempPathFactory, tiny_ckpt: Path) -> Path:
    """The tiny checkpoint (seed 0) in two shards (embedding, the rest) with tiny_ckpt's tokenizer and configs."""
    out = tmp_path_factory.mktemp("sharded") / "qwen3-tiny-2"
    make_checkpoint.write_checkpoint(out, make_checkpoint.SHAPES["tiny"], seed=0, max_shard_bytes=16 << 20,
                                     with_tokenizer=False, log=lambda *_: None)
    for name in SIDE_FILES:
        shutil.copyfile(tiny_ckpt / name, out / name)
    assert len(_shards(out)) == 2
    return out


def _shards(ckpt: Path) -> list[Path]:
    return sorted(ckpt.glob("model-*.safetensors"))


@pytest.fixture
def load_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, object]]:
    """kern_runtime's real `SafetensorsTensors.open` (headers only), then a `Runtime.load` that records what it
    was given and returns a FakeRuntime with the DeviceSteps a Runtime has (test_caller_pipeline's
    AdvancingFakeRuntime): [(the argument of SafetensorsTensors.open, the tensors Runtime.load got)]."""
    from test_caller_pipeline import AdvancingFakeRuntime

    calls: list[tuple[object, object]] = []
    real_open = kern_runtime.SafetensorsTensors.open

    def open_tensors(path):
        tensors = real_open(path)
        calls.append((path, tensors))
        return tensors

    def load(manifest, kernels, tensors, gpu=0, capacity=None, progress=None, **extra):
        assert calls and calls[-1][1] is tensors
        return AdvancingFakeRuntime(num_pages=capacity.tokens // 16)

    monkeypatch.setattr(kern_runtime.SafetensorsTensors, "open", staticmethod(open_tensors))
    monkeypatch.setattr(kern_runtime.Runtime, "load", staticmethod(load))
    return calls


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def _target(manifest: Path, kernels: Path, *weights: Path) -> list[str]:
    args = ["--manifest", str(manifest), "--kernels", str(kernels)]
    for w in weights:
        args += ["--weights", str(w)]
    return args


def _refused(result, code: int, *needles: str) -> str:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# ---------------------------------------------------------------- config


def test_normalize_weights(tmp_path: Path) -> None:
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert normalize_weights(tmp_path) == tmp_path and normalize_weights(str(a)) == a
    assert normalize_weights([a]) == a  # a list of one is that path
    assert normalize_weights([a, b]) == (a, b)
    # the same path twice (another spelling included) counts once, in the order first given
    assert normalize_weights([b, a, tmp_path / "x" / ".." / "b.safetensors", Path(str(a) + "/")]) == (b, a)
    assert normalize_weights([a, a]) == a
    with pytest.raises(ConfigError, match="empty list"):
        normalize_weights([])
    assert runtime_weights(a) == str(a) and runtime_weights((a, b)) == [str(a), str(b)]
    assert weights_label(a) == str(a) and weights_label((a, b)) == f"[{a}, {b}]"


def test_kern_toml_weights_list(tmp_path: Path) -> None:
    toml = tmp_path / "kern.toml"
    head = 'default = "a"\n[targets.a]\nmanifest = "m.json"\nkernels = "k"\n'
    toml.write_text(head + 'weights = ["w/a.safetensors", "/abs/b.safetensors", "w/./a.safetensors"]\n')
    cfg = resolve_config(toml, None, {})
    assert cfg.weights == (tmp_path / "w" / "a.safetensors", Path("/abs/b.safetensors"))  # relative to the toml
    toml.write_text(head + 'weights = ["w"]\n')  # a list of one: that path, a directory allowed
    assert resolve_config(toml, None, {}).weights == tmp_path / "w"
    toml.write_text(head + 'weights = "w"\n')  # a string: as before
    assert resolve_config(toml, None, {}).weights == tmp_path / "w"
    # the flags replace the target's whole list
    toml.write_text(head + 'weights = ["w/a.safetensors", "w/b.safetensors"]\n')
    assert resolve_config(toml, None, {"weights": [Path("x.safetensors")]}).weights == Path("x.safetensors")
    assert resolve_config(toml, None, {"weights": [Path("x.safetensors"), Path("y.safetensors")]}).weights == (
        Path("x.safetensors"), Path("y.safetensors"))
    assert resolve_config(toml, None, {"weights": None}).weights == (tmp_path / "w" / "a.safetensors",
                                                                     tmp_path / "w" / "b.safetensors")


@pytest.mark.parametrize("value, needles", [
    ("[]", ["weights = []", "at least one path"]),
    ('["a.safetensors", 2]', ["weights = ['a.safetensors', 2]", "entry 2 (2)", "path string"]),
    ('["a.safetensors", "b\\u0000.safetensors"]', ["entry 2", "NUL"]),
    ('["", "a.safetensors"]', ["entry 1 is an empty path"]),
    ("5", ["weights = 5", "must be a path string or a list"]),
])
def test_kern_toml_bad_weights_list(tmp_path: Path, value: str, needles: list[str]) -> None:
    toml = tmp_path / "kern.toml"
    toml.write_text(f'default = "a"\n[targets.a]\nmanifest = "m.json"\nkernels = "k"\nweights = {value}\n')
    with pytest.raises(ConfigError) as err:
        resolve_config(toml, None, {})
    assert str(toml) in str(err.value) and "[targets.a]" in str(err.value), err.value
    for needle in needles:
        assert needle in str(err.value), err.value


# ---------------------------------------------------------------- preflight


def test_checkpoint_tensors_of_a_list_reads_every_file(sharded_ckpt: Path) -> None:
    shards = _shards(sharded_ckpt)
    whole = preflight.checkpoint_tensors(sharded_ckpt)
    listed = preflight.checkpoint_tensors(tuple(shards))
    assert listed == whole and len(listed) > 2
    assert set(listed.found_in.values()) == set(shards)
    assert listed.found_in["model.embed_tokens.weight"] == shards[0]
    assert preflight.checkpoint_tensors((shards[1], shards[0], shards[1])) == whole  # order and duplicates
    assert preflight.checkpoint_tensors([shards[0]]) == preflight.checkpoint_tensors(shards[0])
    assert checkpoint_dir(tuple(shards)) == sharded_ckpt


def test_list_refusals_name_the_entry(sharded_ckpt: Path, tmp_path: Path) -> None:
    one, two = _shards(sharded_ckpt)
    other = tmp_path / "model.bin"
    other.write_bytes(b"x")
    cases = [
        ((one, sharded_ckpt), [f"entry 2 of 2 ({sharded_ckpt})", "is a directory", "only allowed alone"]),
        ((other, one), [f"entry 1 of 2 ({other})", "not a .safetensors file"]),
        ((one, tmp_path / "gone.safetensors"), [f"({tmp_path / 'gone.safetensors'}) does not exist"]),
    ]
    for weights, needles in cases:
        with pytest.raises(WeightsError) as err:
            preflight.checkpoint_tensors(weights)
        for needle in needles:
            assert needle in str(err.value), err.value
    # a tensor in two of the files: both named
    copy = tmp_path / "copy.safetensors"
    shutil.copyfile(two, copy)
    with pytest.raises(WeightsError, match=f"appears in two --weights files: {two} and {copy}"):
        preflight.checkpoint_tensors((one, two, copy))
    # a bad header in the second file: that file is named
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x10\0\0\0\0\0\0\0{not json at all")
    with pytest.raises(WeightsError, match=str(broken)):
        preflight.checkpoint_tensors((one, broken))


def test_check_weights_names_the_file_of_a_list(sharded_ckpt: Path, tiny_manifest: Path) -> None:
    facts = preflight.read_manifest(tiny_manifest)
    shards = tuple(_shards(sharded_ckpt))
    tensors = preflight.checkpoint_tensors(shards)
    preflight.check_weights(facts, tensors, shards)
    tensors["model.norm.weight"] = ("f32", tensors["model.norm.weight"][1])
    with pytest.raises(WeightsError, match=f"'model.norm.weight' \\(in {shards[1]}\\) is f32"):
        preflight.check_weights(facts, tensors, shards)
    # only the embedding's file: the missing tensors are named with the list
    with pytest.raises(WeightsError, match=r"checkpoint \[.*\] has no tensor"):
        preflight.check_weights(facts, preflight.checkpoint_tensors((shards[0], shards[0])), (shards[0],) * 2)


# ---------------------------------------------------------------- the CLI down to the runtime load


def test_repeated_weights_reach_the_runtime_load(with_device, load_calls, sharded_ckpt: Path, tiny_manifest: Path,
                                                 kernels_dir: Path) -> None:
    one, two = _shards(sharded_ckpt)
    dup = sharded_ckpt / ".." / sharded_ckpt.name / two.name  # the same file, spelled differently: counts once
    result = _invoke("run", *_target(tiny_manifest, kernels_dir, one, two, dup), "--prompt", "hi", "--steps", "3")
    assert result.exit_code == 0, result.stderr
    assert result.stdout != ""
    (arg, tensors), = load_calls
    assert arg == [str(one), str(two)]
    assert tensors.files == (str(one), str(two)) and len(tensors) == len(preflight.checkpoint_tensors(sharded_ckpt))
    # once, with the directory: as before lists existed (the path as a string; the runtime reads the index)
    load_calls.clear()
    result = _invoke("run", *_target(tiny_manifest, kernels_dir, sharded_ckpt), "--prompt", "hi", "--steps", "3")
    assert result.exit_code == 0, result.stderr
    (arg, tensors), = load_calls
    assert arg == str(sharded_ckpt) and tensors.files == (str(one), str(two))


def test_kern_test_with_repeated_weights(with_device, load_calls, sharded_ckpt: Path, tiny_manifest: Path,
                                         kernels_dir: Path) -> None:
    shards = _shards(sharded_ckpt)
    result = _invoke("test", *_target(tiny_manifest, kernels_dir, *shards), "--against", "eager", "--prompts", "2",
                     "--steps", "4")
    assert result.exit_code == 0, result.stderr
    assert [arg for arg, _ in load_calls] == [[str(s) for s in shards]]


def test_kern_toml_list_reaches_the_runtime_load(monkeypatch: pytest.MonkeyPatch, load_calls, sharded_ckpt: Path,
                                                 tiny_manifest: Path, kernels_dir: Path, tmp_path: Path) -> None:
    import kern_run.session as session

    monkeypatch.setattr(session, "probe_device", lambda gpu: 1)
    one, two = _shards(sharded_ckpt)
    toml = sharded_ckpt.parent / "kern.toml"  # paths relative to it
    toml.write_text(f'default = "split"\n[targets.split]\nmanifest = "{tiny_manifest}"\nkernels = "{kernels_dir}"\n'
                    f'weights = ["{sharded_ckpt.name}/{one.name}", "{sharded_ckpt.name}/{two.name}"]\n')
    result = _invoke("run", "--config", str(toml), "--prompt", "hi", "--steps", "2")
    assert result.exit_code == 0, result.stderr
    assert [arg for arg, _ in load_calls] == [[str(one), str(two)]]


def test_generator_open_passes_the_list(load_calls, sharded_ckpt: Path, tiny_manifest: Path) -> None:
    facts = preflight.read_manifest(tiny_manifest)
    shards = tuple(_shards(sharded_ckpt))
    with Generator.open(tiny_manifest, "kernels", shards, facts, capacity_tokens=256) as gen:
        assert isinstance(gen.rt, FakeRuntime)
    assert [arg for arg, _ in load_calls] == [[str(s) for s in shards]]


def test_cli_refusals_of_a_list(stub_device_probe, sharded_ckpt: Path, tiny_manifest: Path, kernels_dir: Path,
                                tmp_path: Path) -> None:
    """Each a one-line exit 2 naming the entry, before the device probe (exit 3)."""
    one, two = _shards(sharded_ckpt)
    base = ("run", "--prompt", "hi")
    _refused(_invoke(*base, *_target(tiny_manifest, kernels_dir, one, sharded_ckpt)), 2, str(sharded_ckpt),
             "is a directory")
    text = tmp_path / "notes.txt"
    text.write_text("x")
    _refused(_invoke(*base, *_target(tiny_manifest, kernels_dir, text, one)), 2, str(text), "not a .safetensors")
    gone = tmp_path / "gone.safetensors"
    _refused(_invoke(*base, *_target(tiny_manifest, kernels_dir, one, gone)), 2, str(gone), "does not exist")
    # one file of the two: the tensors of the other are missing
    _refused(_invoke(*base, *_target(tiny_manifest, kernels_dir, one, one)), 2, "has no tensor")
    # duplicates count once: the list passes preflight and stops at the (stub) device probe
    _refused(_invoke(*base, *_target(tiny_manifest, kernels_dir, one, two, one)), 3, PROBED)
    _refused(_invoke("test", *_target(tiny_manifest, kernels_dir, one, gone)), 2, str(gone))
    # the tokenizer is read beside the first file
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / one.name).symlink_to(one)
    _refused(_invoke(*base, *_target(tiny_manifest, kernels_dir, elsewhere / one.name, two)), 2,
             str(elsewhere / "tokenizer.json"))


def test_tokenizer_beside_the_first_file(sharded_ckpt: Path, tmp_path: Path) -> None:
    one, two = _shards(sharded_ckpt)
    assert load_codec((one, two)).eos_ids == {256}
    (tmp_path / one.name).symlink_to(one)
    with pytest.raises(InputError, match=str(tmp_path / "tokenizer.json")):
        load_codec((tmp_path / one.name, two))


def test_against_transformers_needs_config_beside_the_first_file(sharded_ckpt: Path, tmp_path: Path) -> None:
    one, two = _shards(sharded_ckpt)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / one.name).symlink_to(one)
    cfg = RunConfig(manifest=tmp_path / "m.json", kernels=tmp_path, weights=(elsewhere / one.name, two))
    req = AbRequest(against="transformers")
    with pytest.raises(WeightsError) as err:
        check_request(req, cfg)
    assert str(elsewhere / "config.json") in str(err.value) and "beside the first file" in str(err.value)
    with pytest.raises(WeightsError, match="is a directory"):
        check_request(req, RunConfig(manifest=tmp_path / "m.json", kernels=tmp_path, weights=(one, sharded_ckpt)))
    # config.json there: this check passes (then torch and transformers must be installed)
    (elsewhere / "config.json").write_text(json.dumps(json.loads((sharded_ckpt / "config.json").read_text())))
    try:
        assert check_request(req, cfg) is None
    except RefusalError as exc:
        assert not isinstance(exc, WeightsError) and "pip install torch transformers" in str(exc)


def test_single_path_unchanged(with_device, load_calls, tiny_ckpt: Path, tiny_manifest: Path, kernels_dir: Path,
                               tmp_path: Path) -> None:
    """One --weights: a file or a directory, as before; a missing one keeps its message."""
    shard = sorted(tiny_ckpt.glob("*.safetensors"))[0]
    result = _invoke("run", *_target(tiny_manifest, kernels_dir, shard), "--prompt", "hi", "--steps", "2")
    assert result.exit_code == 0, result.stderr
    assert [arg for arg, _ in load_calls] == [str(shard)]
    untied = make_manifest(tmp_path / "untied.json", kernels_dir, untied=True)
    line = _refused(_invoke("run", *_target(untied, kernels_dir, tiny_ckpt)), 2, "lm_head.weight")
    assert f"checkpoint {tiny_ckpt} has no tensor" in line
    _refused(_invoke("run", *_target(tiny_manifest, kernels_dir, tmp_path / "nowhere")), 2, "make_checkpoint.py")


def test_duplicates_fold_through_the_filesystem_not_the_spelling(tmp_path: Path) -> None:
    """`lnk/../a.safetensors` with lnk a symlink into another directory is that directory's a.safetensors, not
    ./a.safetensors: both stay in the list. A symlink to a listed file and the file itself fold to one entry,
    kept as first written. An empty path in a list is refused by number."""
    from kern_run.config import normalize_weights
    from kern_run.errors import ConfigError

    (tmp_path / "other" / "deep").mkdir(parents=True)
    (tmp_path / "w").mkdir()
    for d in ("other", "w"):
        (tmp_path / d / "a.safetensors").write_bytes(b"x")
    (tmp_path / "w" / "lnk").symlink_to(tmp_path / "other" / "deep")
    (tmp_path / "w" / "alias.safetensors").symlink_to(tmp_path / "w" / "a.safetensors")
    w = tmp_path / "w"
    assert normalize_weights([w / "lnk" / ".." / "a.safetensors", w / "a.safetensors"]) == (
        w / "lnk" / ".." / "a.safetensors", w / "a.safetensors")
    assert normalize_weights([w / "alias.safetensors", w / "a.safetensors"]) == w / "alias.safetensors"
    with pytest.raises(ConfigError, match="entry 2 of 2 is an empty path"):
        normalize_weights([w / "a.safetensors", ""])


def test_kern_toml_list_keeps_symlinked_paths_as_written(tmp_path: Path) -> None:
    """A kern.toml list entry that is a symlink (a Hugging Face cache snapshot) stays as written, so its
    .safetensors name and the files beside it (tokenizer.json) are those of the snapshot directory."""
    from kern_run.config import resolve_config

    blobs, snap = tmp_path / "blobs", tmp_path / "snap"
    blobs.mkdir()
    snap.mkdir()
    for i in (1, 2):
        (blobs / f"sha{i}").write_bytes(b"x")
        (snap / f"model-{i}.safetensors").symlink_to(blobs / f"sha{i}")
    toml = tmp_path / "kern.toml"
    toml.write_text('[targets.t]\nmanifest = "m.json"\nkernels = "k"\n'
                    'weights = ["snap/model-1.safetensors", "snap/model-2.safetensors"]\n')
    assert resolve_config(toml, "t", {}).weights == (snap / "model-1.safetensors", snap / "model-2.safetensors")
    toml.write_text('[targets.t]\nmanifest = "m.json"\nkernels = "k"\nweights = "snap/model-1.safetensors"\n')
    assert resolve_config(toml, "t", {}).weights == snap / "model-1.safetensors"  # one path: the same rule


def test_against_transformers_single_file_needs_config_beside_it(sharded_ckpt: Path, tmp_path: Path) -> None:
    """One .safetensors file (not a directory) goes to transformers as a state dict too, so the config.json
    beside it is checked before anything loads, as for a list; a directory is passed to from_pretrained as is."""
    one, _ = _shards(sharded_ckpt)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / one.name).symlink_to(one)
    req = AbRequest(against="transformers")
    cfg = RunConfig(manifest=tmp_path / "m.json", kernels=tmp_path, weights=elsewhere / one.name)
    with pytest.raises(WeightsError) as err:
        check_request(req, cfg)
    assert "with a --weights file reads" in str(err.value) and str(elsewhere / "config.json") in str(err.value)
    # a missing path or a directory without .safetensors files is named before torch / transformers are looked for
    for bad, words in ((tmp_path / "missing.safetensors", "do not exist"), (elsewhere.parent / "void", "do not exist")):
        with pytest.raises(WeightsError, match=words):
            check_request(req, RunConfig(manifest=tmp_path / "m.json", kernels=tmp_path, weights=bad))
    for ok in (RunConfig(manifest=tmp_path / "m.json", kernels=tmp_path, weights=one),  # config.json beside it
               RunConfig(manifest=tmp_path / "m.json", kernels=tmp_path, weights=sharded_ckpt)):  # a directory
        try:
            assert check_request(req, ok) is None
        except RefusalError as exc:
            assert not isinstance(exc, WeightsError) and "pip install torch transformers" in str(exc)


def test_a_weights_path_that_is_neither_file_nor_directory(tmp_path: Path) -> None:
    """A character device (/dev/null) or a named pipe exists but holds no checkpoint: refused as such, not as a
    path that does not exist; a missing path still says it does not exist."""
    import os

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for odd in (Path("/dev/null"), fifo):
        with pytest.raises(WeightsError) as err:
            preflight.checkpoint_files(odd)
        assert str(err.value) == (f"weights {odd} is neither a regular file nor a directory (a device, pipe or "
                                  "socket): pass a checkpoint directory or a .safetensors file")
    with pytest.raises(WeightsError, match="do not exist"):
        preflight.checkpoint_files(tmp_path / "missing")


@pytest.mark.parametrize("command", ["run", "test"])
def test_an_empty_weights_flag_is_refused_not_read_as_the_current_directory(command: str, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`--weights ''` (an unset shell variable) is refused in one line before anything loads; a Path option would
    turn it into '.', the current directory, and load whatever checkpoint is there."""
    monkeypatch.chdir(tmp_path)
    result = _invoke(command, "--weights", "")
    assert result.exit_code == 2, result.output
    assert "--weights '': an empty path (an unset shell variable?)" in result.output
    assert "Traceback" not in result.output


def test_a_checkpoint_of_another_model_names_the_manifest(sharded_ckpt: Path) -> None:
    """`kern test --against B` prepares two manifests against one checkpoint: the wrong-model refusal names the
    manifest it was checked against."""
    from kern_run.session import prepare

    manifest = ROOT / "manifests" / "qwen3-4b.json"
    cfg = RunConfig(manifest=manifest, kernels=ROOT / "kernels", weights=sharded_ckpt)
    with pytest.raises(WeightsError) as err:
        prepare(cfg, check_device=False)
    assert "wrong model for this manifest" in str(err.value)
    assert str(err.value).endswith(f"(manifest {manifest})")


def test_a_file_that_is_not_safetensors_is_refused_with_the_reason(tmp_path: Path) -> None:
    zeros = tmp_path / "zeros.safetensors"
    zeros.write_bytes(bytes(8))
    with pytest.raises(WeightsError, match="header is not JSON .*: not a usable safetensors file"):
        preflight.read_safetensors_header(zeros)
