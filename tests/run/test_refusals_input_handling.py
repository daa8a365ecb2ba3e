"""Inputs that used to crash with a traceback or slip through to a misleading error after the weight load: a prompt
that is not UTF-8 text, `kern test --seed -1` and `--steps` past the context, a manifest's `meta.caller` of the wrong
shape, a NUL in a kern.toml path, a manifest file that is not a regular file or is too large. Each is one stderr line
naming what is wrong and where, exit 2, no traceback, before the device probe / the load (docs/caller.md "Refusals").
Also: `kern inspect` counts the calls and launches of inlined programs as `kern manifest check` does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kern_run.session as session
from kern_run import preflight
from kern_run.cli import app
from kern_run.config import load_targets
from kern_run.errors import ConfigError, InputError
from kern_run.generate import Generator
from kern_run.prefix_cache import read_prompts
from kern_run_testutil import PROBED, FakeRuntime, refused_line

pytestmark = pytest.mark.usefixtures("stub_device_probe")  # kern_run_testutil: the probe is exit 3

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "manifest" / "data" / "example.json"


_refused = refused_line


def _target(manifest: Path, kernels: Path, weights: Path) -> list[str]:
    return ["--manifest", str(manifest), "--kernels", str(kernels), "--weights", str(weights)]


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch, fake_runtime: list[FakeRuntime]) -> list[FakeRuntime]:
    """A device that probes fine and a fake runtime load (the runtimes made, to tell whether anything loaded)."""
    monkeypatch.setattr(session, "probe_device", lambda gpu: 1)
    return fake_runtime


# ---------------------------------------------------------------- 1. a prompt that is not UTF-8 text


@pytest.mark.parametrize("prompt, fault", [
    ("caf\udce9 au lait", "byte 0xe9 at character 3"),  # a Latin-1 byte of argv, as Python's surrogateescape gives it
    ("\ud800", "a lone surrogate U+D800 at character 0"),
])
def test_prompt_not_utf8_is_refused_before_the_probe(tiny_manifest: Path, kernels_dir: Path, tiny_ckpt: Path,
                                                     prompt: str, fault: str) -> None:
    _refused(["run", *_target(tiny_manifest, kernels_dir, tiny_ckpt), "--prompt", prompt],
             "the prompt is not UTF-8 text", fault, "--prompt")


def test_prompt_not_utf8_from_the_real_command_line(tiny_manifest: Path, kernels_dir: Path, tiny_ckpt: Path) -> None:
    """The reported case: `kern run --prompt $'caf\\xe9 au lait'` (argv bytes that are not UTF-8)."""
    env = {**os.environ, "KERN_TOML": os.environ["KERN_TOML"]}  # the empty kern.toml of stub_device_probe
    args = [os.fsencode(a) for a in (sys.executable, "-m", "kern_run.cli", "run",
                                     *_target(tiny_manifest, kernels_dir, tiny_ckpt), "--prompt")]
    proc = subprocess.run([*args, b"caf\xe9 au lait"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "kern run: the prompt is not UTF-8 text (byte 0xe9 at character 3): pass a UTF-8 --prompt"], proc.stderr


def test_prompts_jsonl_lone_surrogate_names_file_and_line(tiny_manifest: Path, kernels_dir: Path, tiny_ckpt: Path,
                                                          tmp_path: Path, loads: list[FakeRuntime]) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "fine"}\n\n{"prompt": "x\\ud800"}\n')
    _refused(["run", *_target(tiny_manifest, kernels_dir, tiny_ckpt), "--prompts", str(prompts)],
             f"--prompts {prompts}:3:", '"prompt" string is not UTF-8 text', "U+D800 at character 1")
    assert loads == []
    with pytest.raises(InputError, match=r":3: .*lone surrogate U\+D800"):
        read_prompts(prompts)
    prompts.write_text('{"prompt": "caf\\u00e9 \\ud83d\\ude00"}\n')  # an escaped surrogate pair is fine
    assert read_prompts(prompts) == ["café 😀"]


# ---------------------------------------------------------------- 2. and 3. kern test --seed / --steps


def _test_args(tiny_manifest: Path, kernels_dir: Path, tiny_ckpt: Path, *extra: str) -> list[str]:
    return ["test", *_target(tiny_manifest, kernels_dir, tiny_ckpt), "--prompts", "2", *extra]


def test_kern_test_negative_seed_refused_before_loading(tiny_manifest: Path, kernels_dir: Path, tiny_ckpt: Path,
                                                        loads: list[FakeRuntime]) -> None:
    _refused(_test_args(tiny_manifest, kernels_dir, tiny_ckpt, "--seed", "-1", "--steps", "2"), "--seed -1", ">= 0")
    assert loads == []
    ok = CliRunner().invoke(app, _test_args(tiny_manifest, kernels_dir, tiny_ckpt, "--seed", "0", "--steps", "2"))
    assert ok.exit_code == 0, ok.stderr


def test_kern_test_steps_past_the_manifest_context_refused_before_the_probe(tiny_manifest: Path, kernels_dir: Path,
                                                                             tiny_ckpt: Path) -> None:
    """The tiny manifest holds 1024 positions: --steps 1024 leaves none for a prompt."""
    for steps in ("1024", "5000"):
        _refused(_test_args(tiny_manifest, kernels_dir, tiny_ckpt, "--steps", steps), f"--steps {steps}",
                 "1024 positions", "the manifest's max context 1024", "--steps <= 1023")
    _refused(_test_args(tiny_manifest, kernels_dir, tiny_ckpt, "--steps", "100", "--capacity", "64"),
             "--steps 100", "64 positions", "--capacity 64")
    result = CliRunner().invoke(app, _test_args(tiny_manifest, kernels_dir, tiny_ckpt, "--steps", "1023"))
    assert result.exit_code == 3 and PROBED in result.stderr, result.stderr  # valid: on to the device


def test_kern_test_steps_at_the_edge_of_the_context(tiny_manifest: Path, kernels_dir: Path, tiny_ckpt: Path,
                                                    loads: list[FakeRuntime]) -> None:
    """The most steps the context allows run (prompts cut to 1 token); a KV pool the load made smaller than
    --capacity is named after loading instead of an "empty prompt"."""
    result = CliRunner().invoke(app, _test_args(tiny_manifest, kernels_dir, tiny_ckpt, "--steps", "1023"))
    assert result.exit_code == 0, result.stderr
    assert [r.split()[1:3] for r in result.stdout.strip().splitlines()[2:]] == [["1", "1023"]] * 2
    # the fake runtime's pool holds capacity - 16 positions (page 0 is scratch): 48 of --capacity 64
    _refused(_test_args(tiny_manifest, kernels_dir, tiny_ckpt, "--steps", "50", "--capacity", "64", "--log-level",
                        "warning"), "--steps 50", "48 positions", "the loaded KV pool", "--steps <= 47")
    assert len(loads) == 2 and all(rt.closed for rt in loads)


# ---------------------------------------------------------------- 4. meta.caller of the manifest


def _with_meta(tiny_manifest: Path, tmp_path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    raw = json.loads(tiny_manifest.read_text())
    raw.pop("digest", None)  # meta is outside the digest anyway; leave the computed one
    edit(raw)
    path = tmp_path / "meta.json"
    path.write_text(json.dumps(raw))
    return path


def _set_caller(key: str, value: object):  # type: ignore[no-untyped-def]
    return lambda raw: raw["meta"]["caller"].__setitem__(key, value)


@pytest.mark.parametrize("meta", [[], None])
def test_meta_that_is_not_an_object_is_a_manifest_fault(tiny_manifest: Path, kernels_dir: Path, tiny_ckpt: Path,
                                                        tmp_path: Path, meta) -> None:
    """kern_manifest's parser refuses it at $.meta (the format types `meta` as an object)."""
    path = _with_meta(tiny_manifest, tmp_path, lambda raw: raw.__setitem__("meta", meta))
    line = _refused(["run", *_target(path, kernels_dir, tiny_ckpt)], "$.meta")
    assert "expected an object" in line
    with pytest.raises(ConfigError, match=r"\$\.meta.*expected an object"):
        preflight.read_manifest(path)


@pytest.mark.parametrize("edit, json_path, shown", [
    (lambda raw: raw["meta"].__setitem__("caller", 5), "$.meta.caller", "5"),
    (lambda raw: raw["meta"].__setitem__("caller", ["x"]), "$.meta.caller", '["x"]'),
    (_set_caller("prefill_batch_invariant", "no"), "$.meta.caller.prefill_batch_invariant", '"no"'),
    (_set_caller("prefill_batch_invariant", 1), "$.meta.caller.prefill_batch_invariant", "1"),
    (_set_caller("decode_batch_invariant", "yes"), "$.meta.caller.decode_batch_invariant", '"yes"'),
    (_set_caller("decode_advance", 5), "$.meta.caller.decode_advance", "5"),
    (_set_caller("decode_advance", {"ring": 5}), "$.meta.caller.decode_advance.ring", "5"),
    (_set_caller("decode_advance", {"ring": "no_such_buffer"}), "$.meta.caller.decode_advance.ring",
     '"no_such_buffer"'),
])
def test_meta_caller_of_the_wrong_shape_is_refused(tiny_manifest: Path, kernels_dir: Path, tiny_ckpt: Path,
                                                   tmp_path: Path, edit, json_path: str, shown: str) -> None:
    path = _with_meta(tiny_manifest, tmp_path, edit)
    line = _refused(["run", *_target(path, kernels_dir, tiny_ckpt)], f"manifest {path}: {json_path} = {shown} must")
    assert "regenerate" in line
    with pytest.raises(ConfigError, match=json_path.replace("$", r"\$").replace(".", r"\.") + " = "):
        preflight.read_manifest(path)


@pytest.mark.parametrize("edit, invariant, ring, decode_invariant", [
    (lambda raw: raw.pop("meta"), False, None, False),
    (lambda raw: raw.__setitem__("meta", {}), False, None, False),
    (lambda raw: raw["meta"].pop("caller"), False, None, False),
    (lambda raw: None, False, "token_ring", False),
    (_set_caller("prefill_batch_invariant", True), True, "token_ring", False),
    (_set_caller("prefill_batch_invariant", False), False, "token_ring", False),
    (_set_caller("decode_batch_invariant", True), False, "token_ring", True),
])
def test_meta_caller_absent_or_well_formed(tiny_manifest: Path, kernels_dir: Path, tiny_ckpt: Path, tmp_path: Path,
                                           edit, invariant: bool, ring: str | None, decode_invariant: bool) -> None:
    """No meta or no meta.caller: today's defaults (no batch invariance, no decode on the device)."""
    path = _with_meta(tiny_manifest, tmp_path, edit)
    facts = preflight.read_manifest(path)
    assert facts.prefill_batch_invariant is invariant
    assert facts.decode_batch_invariant is decode_invariant
    assert (facts.decode_advance or {}).get("ring") == ring
    assert Generator(FakeRuntime(), facts).can_pipeline is False  # the fake has no events: the synchronous loop
    result = CliRunner().invoke(app, ["run", *_target(path, kernels_dir, tiny_ckpt)])
    assert result.exit_code == 3 and PROBED in result.stderr, result.stderr


# ---------------------------------------------------------------- 5. kern inspect counts inlined programs


def test_inspect_counts_the_calls_of_inlined_programs() -> None:
    """example.json's `decode` is `{"program": "step"}` (5 calls, 6 launches), as `kern manifest check` counts it."""
    result = CliRunner().invoke(app, ["inspect", str(EXAMPLE)])
    assert result.exit_code == 0, result.stderr
    lines = {ln.split(" (")[0]: ln for ln in result.stdout.splitlines() if ln.startswith("program ")}
    assert lines["program step"].startswith("program step (run): 5 calls, 6 launches at seqs=4, tokens=64, eager")
    assert lines["program decode"] == ("program decode (run): 5 calls, 6 launches at seqs=1, tokens=1, "
                                       "graph: 6 launches -> 1 graph launch per step")
    # a once program runs at its vars' min (Runtime.load), and is counted there, not at the vars' max
    assert lines["program load"] == "program load (once): 1 call, 1 launch at seqs=1, tokens=1, eager"
    check = CliRunner().invoke(app, ["manifest", "check", str(EXAMPLE)])
    assert "decode [run]: graph (5 calls -> 1 graph launch)" in check.stdout


# ---------------------------------------------------------------- 6. kern.toml path with a NUL


@pytest.mark.parametrize("key", ["manifest", "kernels", "weights"])
def test_kern_toml_path_with_nul_is_refused(tmp_path: Path, key: str) -> None:
    toml = tmp_path / "kern.toml"
    fields = {"manifest": '"m.json"', "kernels": '"k"', "weights": '"w"', key: '"m\\u0000x"'}
    toml.write_text('default = "a"\n[targets.a]\n' + "".join(f"{k} = {v}\n" for k, v in fields.items()))
    _refused(["run", "--config", str(toml)], str(toml), f"[targets.a] {key} = 'm\\x00x'", "NUL character")
    with pytest.raises(ConfigError, match="NUL"):
        load_targets(toml)


# ---------------------------------------------------------------- 7. a manifest that is not a regular file


@pytest.mark.parametrize("command", ["inspect", "run"])
def test_manifest_not_a_regular_file(command: str, kernels_dir: Path, tiny_ckpt: Path, tmp_path: Path) -> None:
    for path, kind in (("/dev/zero", "a character device"), (str(tmp_path), "a directory")):
        args = ["inspect", path] if command == "inspect" else ["run", *_target(Path(path), kernels_dir, tiny_ckpt)]
        _refused(args, f"manifest {path}: not a regular file ({kind})")


def test_kern_manifest_check_not_a_regular_file() -> None:
    """`kern manifest check` reports it as an unreadable file: one line, exit 1 (kern_manifest.cli.check)."""
    result = CliRunner().invoke(app, ["manifest", "check", "/dev/zero"])
    assert result.exit_code == 1 and result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == ["/dev/zero: cannot read: not a regular file (a character device); a manifest "
                                          "is a JSON file"]


def test_manifest_fifo_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "m.json"
    os.mkfifo(fifo)  # opening it for reading would block until a writer came
    _refused(["inspect", str(fifo)], f"manifest {fifo}: not a regular file (a FIFO)")


def test_manifest_larger_than_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernels_dir: Path,
                                        tiny_ckpt: Path) -> None:
    from kern_manifest import MAX_MANIFEST_BYTES

    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(MAX_MANIFEST_BYTES + 1)  # sparse: no 64 MiB written
    _refused(["inspect", str(big)], f"manifest {big}: too large", "at most 64.0 MiB")
    _refused(["run", *_target(big, kernels_dir, tiny_ckpt)], f"manifest {big}: too large")
    assert MAX_MANIFEST_BYTES == 64 * 2**20
