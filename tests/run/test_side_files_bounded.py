"""Side files are read bounded (issue 29, a fuzz pass): a regular file of at most a documented size, never a
device or a FIFO, each refused in one typed line before anything is read. Before, `kern run --prompts /dev/zero`
was a MemoryError, sparse config.json / index.json / tokenizer.json files were read whole, a FIFO named
`*.safetensors` hung `kern run` forever, and a UTF-16 manifest passed `kern-manifest check` but not `kern inspect`."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kern_manifest.cli import main as manifest_cli
from kern_run.cli import app
from kern_run.errors import InputError
from kern_run.jsonfile import MAX_CONFIG_BYTES, MAX_PROMPTS_BYTES, MAX_TOKENIZER_BYTES
from kern_run.prefix_cache import read_prompts
from kern_run.text import eos_ids_of, load_codec
from kern_run_testutil import FakeRuntime, refused_line
from kern_runtime.errors import ApiError, ManifestParseError, WeightArtifactError
from kern_runtime.runtime import load_spec
from kern_runtime.weights import SafetensorsTensors
from kern_runtime.weights.safetensors import MAX_INDEX_BYTES, index_shards
from typer.testing import CliRunner

pytestmark = pytest.mark.usefixtures("stub_device_probe")  # kern_run_testutil: the probe is exit 3

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "manifest" / "data" / "example.json"


def _sparse(path: Path, nbytes: int) -> Path:
    with path.open("wb") as f:
        f.truncate(nbytes)  # no blocks written: a 1 GiB file costs nothing
    return path


def _returns_within(seconds: float, fn: Callable[[], Any]) -> BaseException | None:
    """Run `fn` on a daemon thread; the exception it raised (None when it returned). Fails when it has not ended
    after `seconds` (a FIFO used to block open() forever: the test fails instead of hanging the suite)."""
    out: list[BaseException | None] = []

    def body() -> None:
        try:
            fn()
            out.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    start = time.perf_counter()
    thread.start()
    thread.join(seconds)
    assert out, f"still running after {seconds} s (started {time.perf_counter() - start:.1f} s ago)"
    return out[0]


def test_the_caps_are_the_documented_ones() -> None:
    doc = (ROOT / "docs" / "caller.md").read_text()
    assert (MAX_CONFIG_BYTES, MAX_TOKENIZER_BYTES, MAX_PROMPTS_BYTES, MAX_INDEX_BYTES) == (
        16 * 2**20, 256 * 2**20, 64 * 2**20, 64 * 2**20)
    for figure in ("16 MiB", "256 MiB", "64 MiB"):
        assert figure in doc


# ---------------------------------------------------------------- --prompts


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch, fake_runtime: list[FakeRuntime]) -> list[FakeRuntime]:
    from kern_run import session

    monkeypatch.setattr(session, "probe_device", lambda gpu: 1)
    return fake_runtime


def test_prompts_from_a_device_a_fifo_or_a_huge_sparse_file(tiny_manifest: Path, kernels_dir: Path, tiny_ckpt: Path,
                                                            tmp_path: Path, loads: list[FakeRuntime]) -> None:
    fifo = tmp_path / "p.fifo"
    os.mkfifo(fifo)
    big = _sparse(tmp_path / "p.txt", 2**30)
    target = ["--manifest", str(tiny_manifest), "--kernels", str(kernels_dir), "--weights", str(tiny_ckpt)]
    for path, why in ((Path("/dev/zero"), "not a regular file (a character device); a prompts file is a text or "
                                          "JSONL file"),
                      (fifo, "not a regular file (a FIFO)"),
                      (big, "too large (1.0 GiB; a prompts file may hold at most 64.0 MiB)")):
        start = time.perf_counter()
        line = refused_line(["run", *target, "--prompts", str(path)])
        assert f"--prompts {path}: {why}" in line, line
        assert time.perf_counter() - start < 5
        with pytest.raises(InputError, match=f"--prompts {path}: ") as info:
            read_prompts(path)
        assert why in str(info.value)
    assert loads == []


# ---------------------------------------------------------------- checkpoint configs and tokenizer


def test_a_sparse_config_or_tokenizer_is_refused_unread(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    _sparse(ckpt / "config.json", 2 * 2**30)
    with pytest.raises(InputError) as info:
        eos_ids_of(ckpt)
    assert str(info.value) == (f"checkpoint config {ckpt / 'config.json'}: too large (2.0 GiB; the file may hold at "
                               "most 16.0 MiB): fix or remove it")
    (ckpt / "config.json").unlink()
    _sparse(ckpt / "tokenizer.json", 2 * 2**30)
    with pytest.raises(InputError) as info:
        load_codec(ckpt)
    assert str(info.value) == (f"tokenizer {ckpt / 'tokenizer.json'}: too large (2.0 GiB; the file may hold at most "
                               "256.0 MiB): copy the model's tokenizer.json there")


def test_the_tokenizer_is_read_once_through_the_bounded_reader(tiny_ckpt: Path) -> None:
    codec = load_codec(tiny_ckpt)
    assert codec.eos_ids == frozenset({256})


# ---------------------------------------------------------------- weights: index, FIFOs, argument types


def test_a_sparse_index_is_refused_unread(tmp_path: Path) -> None:
    index = _sparse(tmp_path / "model.safetensors.index.json", 2 * 2**30)
    with pytest.raises(WeightArtifactError) as info:
        index_shards(index)
    assert str(info.value) == f"{index}: too large (2.0 GiB; an index may hold at most 64.0 MiB)"
    with pytest.raises(WeightArtifactError, match="too large"):
        SafetensorsTensors.open(tmp_path)


def test_a_fifo_named_safetensors_is_refused_not_waited_on(tmp_path: Path, tiny_manifest: Path, kernels_dir: Path,
                                                           loads: list[FakeRuntime]) -> None:
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    for arg in (tmp_path, fifo, [fifo]):
        exc = _returns_within(5, lambda a=arg: SafetensorsTensors.open(a))
        assert isinstance(exc, WeightArtifactError), exc
        assert str(exc) == f"{fifo}: not a regular file (a FIFO); a safetensors shard is a file"
    done: list[str] = []
    exc = _returns_within(20, lambda: done.append(refused_line(
        ["run", "--manifest", str(tiny_manifest), "--kernels", str(kernels_dir), "--weights", str(tmp_path),
         "--prompt", "hi"])))
    assert exc is None and "not a regular file (a FIFO)" in done[0], done
    assert loads == []


@pytest.mark.parametrize("arg, shown", [(5, "path is 5 (int)"), (None, "path is None (NoneType)"),
                                        ([Path("a.safetensors"), 7], "path #1 is 7 (int)")])
def test_open_takes_paths_only(arg: Any, shown: str) -> None:
    """`open(5)` and `open(None)` were TypeErrors from pathlib."""
    with pytest.raises(ApiError) as info:
        SafetensorsTensors.open(arg)
    assert str(info.value) == (f"SafetensorsTensors.open: {shown}, not a str or os.PathLike (a checkpoint directory "
                               "or .safetensors file; bytes go to parse)")


# ---------------------------------------------------------------- manifests: load_spec, one UTF-8 rule


def test_load_spec_refuses_a_device_instead_of_reading_it_whole() -> None:
    """`kern_runtime.load_spec('/dev/zero')` was a MemoryError."""
    exc = _returns_within(5, lambda: load_spec("/dev/zero"))
    assert isinstance(exc, ManifestParseError)
    assert str(exc) == ("$: cannot read manifest '/dev/zero': not a regular file (a character device); a manifest is "
                        "a JSON file")


@pytest.mark.parametrize("data, reason", [
    (EXAMPLE.read_text().encode("utf-16"), "not UTF-8 text (byte 0xff at offset 0)"),
    (b"\x00\x01\xff\xfe" * 10, "not UTF-8 text (byte 0xff at offset 2)"),
])
def test_check_and_inspect_give_one_reason(data: bytes, reason: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A UTF-16 manifest passed `kern-manifest check` while `kern inspect` refused it as not UTF-8; a binary one was
    "not JSON" in check and "not UTF-8" in inspect."""
    path = tmp_path / "m.json"
    path.write_bytes(data)
    assert manifest_cli(["check", str(path)]) == 1
    assert capsys.readouterr().err == f"{path}: parse error at $: {reason}\n"
    assert reason in refused_line(["inspect", str(path)])
    with pytest.raises(ManifestParseError) as info:
        load_spec(path)
    assert (info.value.path, info.value.message) == ("$", reason)


def test_the_manifest_generators_read_bounded(tmp_path: Path) -> None:
    """The manifest builder's reader of config.json / kernels.json / pins files (kern_run.models.qwen3; was
    tools/gen_qwen3.py's, which gen_qwen3_tp, pick_algos and ablate_manifest used too) read /dev/zero until memory
    ran out."""
    from kern_run.errors import ManifestBuildError
    from kern_run.models.qwen3.jsonio import read_json_file

    big = _sparse(tmp_path / "config.json", 2**30)
    for path, why in ((Path("/dev/zero"), "not a regular file (a character device); expected a JSON file"),
                      (big, "too large (1.0 GiB; a JSON file may hold at most 64.0 MiB)")):
        with pytest.raises(ManifestBuildError) as info:
            read_json_file(path)
        assert str(info.value) == f"{path}: {why}"


def test_inspect_expands_a_1000_program_chain(tmp_path: Path) -> None:
    """`kern inspect` of a verified manifest whose programs inline a chain of 1,000 programs was a RecursionError."""
    import json

    obj = json.loads(EXAMPLE.read_text())
    for i in range(1000):
        obj["programs"][f"p{i}"] = {"calls": [{"program": f"p{i + 1}"}]}
    obj["programs"]["p1000"] = {"calls": [{"program": "step"}]}
    path = tmp_path / "chain.json"
    path.write_text(json.dumps(obj))
    result = CliRunner().invoke(app, ["inspect", str(path)])
    assert result.exit_code == 0, result.stderr[-2000:]
    assert "program p0 (run): 5 calls, 6 launches at seqs=4, tokens=64, eager" in result.stdout
