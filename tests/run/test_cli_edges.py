"""Rough edges of `kern` met by a new user (issue 29): each is one clear line, never a traceback, and says what the
thing is (a directory, a cuBLASLt pins file, weights that were never made) and what to do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kern_run.cli import app


@pytest.fixture(autouse=True)
def no_repo_targets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty-kern.toml"
    empty.write_text("")
    monkeypatch.setenv("KERN_TOML", str(empty))


def _refusal(args: list[str], code: int = 2) -> str:
    result = CliRunner().invoke(app, args)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert (result.exit_code, len(lines)) == (code, 1), (result.exit_code, result.stderr)
    assert "Traceback" not in result.stderr
    return lines[0]


# ---------------------------------------------------------------- help


@pytest.mark.parametrize("args, flags", [
    (["run", "--help"], ("--eager", "--ignore-eos", "--help")),
    (["--help"], ("--version", "--help")),
    (["manifest", "check", "--help"], ("--help",)),
])
def test_a_flag_shows_no_value_type_in_the_help(args: list[str], flags: tuple[str, ...]) -> None:
    """`--eager <bool>` read as if it took a value, and `--eager true` is refused: the help shows none."""
    result = CliRunner().invoke(app, args, terminal_width=120)
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.stdout
    for flag in flags:
        assert re.search(rf"{flag} {{2,}}[A-Za-z]", result.stdout), (flag, result.stdout)
    if args[0] == "run":
        assert re.search(r"--steps +-n +<int> ", result.stdout)  # an option with a value keeps its type
        assert _refusal(["run", "--eager", "true"]) == "kern run: Got unexpected extra argument(s) (true)"


# ---------------------------------------------------------------- a pins file for a manifest

ROOT = Path(__file__).resolve().parents[2]
PINS_FILE = ROOT / "manifests" / "algos" / "h200.json"
PINS_IS = ("is a cuBLASLt algorithm pins file (format 'kern-cublaslt-pins/1'; tools/pick_algos.py writes it, "
           "kern manifest build --algos reads it), not a manifest: pass a manifest (kern-manifest/1, e.g. "
           "manifests/*.json)")


@pytest.mark.parametrize("args, line", [
    (["inspect", str(PINS_FILE)], f"kern inspect: manifest {PINS_FILE} {PINS_IS}"),
    (["run", "--manifest", str(PINS_FILE), "--kernels", str(ROOT), "--weights", str(ROOT)],
     f"kern run: manifest {PINS_FILE} {PINS_IS}"),
])
def test_a_pins_file_given_for_a_manifest_is_named(args: list[str], line: str) -> None:
    assert _refusal(args) == line


def test_kern_manifest_check_names_a_pins_file() -> None:
    result = CliRunner().invoke(app, ["manifest", "check", str(PINS_FILE)])
    assert (result.exit_code, result.stdout, result.stderr) == (1, "", f"{PINS_FILE} {PINS_IS}\n")


# ---------------------------------------------------------------- paths and files

def test_a_config_directory_is_said_to_be_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _refusal(["run", "--config", str(tmp_path)]) == (
        f"kern run: --config {tmp_path} is a directory: pass the kern.toml file (e.g. {tmp_path / 'kern.toml'})")
    assert _refusal(["run", "--config", str(tmp_path / "none.toml")]) == (
        f"kern run: --config {tmp_path / 'none.toml'}: no such file")
    monkeypatch.setenv("KERN_TOML", str(tmp_path))
    assert _refusal(["run"]) == (f"kern run: KERN_TOML={tmp_path} is a directory: pass the kern.toml file (e.g. "
                                 f"{tmp_path / 'kern.toml'})")


def _run_args(manifest: Path, kernels: Path, weights: Path, *extra: str) -> list[str]:
    return ["run", "--manifest", str(manifest), "--kernels", str(kernels), "--weights", str(weights), *extra]


def test_weights_never_made_are_said_not_to_exist(stub_device_probe: None, tiny_manifest: Path, kernels_dir: Path,
                                                  tmp_path: Path) -> None:
    weights = tmp_path / "weights" / "qwen3-tiny"
    line = _refusal(_run_args(tiny_manifest, kernels_dir, weights))
    assert line == (f"kern run: weights {weights} do not exist: make them with `python tools/make_checkpoint.py "
                    f"--shape <shape> --out {weights}`, or point --weights at an existing checkpoint")


def test_a_short_safetensors_file_is_said_to_be_none_once(tmp_path: Path) -> None:
    from kern_run import preflight
    from kern_run.errors import WeightsError

    path = tmp_path / "model.safetensors"
    path.write_bytes(b"abc")
    with pytest.raises(WeightsError) as err:
        preflight.read_safetensors_header(path)
    assert str(err.value) == f"weights {path}: not a safetensors file (shorter than 8 bytes) (remake the checkpoint)"


# ---------------------------------------------------------------- prompts

def test_a_prompts_file_of_blank_lines_says_so(tmp_path: Path) -> None:
    from kern_run.errors import InputError
    from kern_run.prefix_cache import read_prompts

    blank = tmp_path / "blank.txt"
    blank.write_text("\n   \n\t\n")
    with pytest.raises(InputError) as err:
        read_prompts(blank)
    assert str(err.value) == f"--prompts {blank}: no prompts (its 3 line(s) are all blank): write one prompt per line"
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(InputError) as err:
        read_prompts(empty)
    assert str(err.value) == f"--prompts {empty}: no prompts (the file is empty): write one prompt per line"


def test_prompt_and_prompts_together_are_refused(stub_device_probe: None, tiny_manifest: Path, kernels_dir: Path,
                                                 tiny_ckpt: Path, tmp_path: Path) -> None:
    from kern_run_testutil import PROBED

    prompts = tmp_path / "p.txt"
    prompts.write_text("one\ntwo\n")
    args = _run_args(tiny_manifest, kernels_dir, tiny_ckpt, "--prompts", str(prompts))
    assert _refusal([*args, "--prompt", "hi"]) == (f"kern run: --prompt with --prompts {prompts}: pass one or the "
                                                   "other (the prompts file's lines are the prompts)")
    assert PROBED in _refusal(args, 3)  # --prompts alone: on to the device probe


# ---------------------------------------------------------------- capacity

MAX_CONTEXT = 1024  # the tiny test manifest's pages_per_seq * page_tokens


def test_a_capacity_above_the_max_context_is_refused(stub_device_probe: None, tiny_manifest: Path,
                                                     kernels_dir: Path, tiny_ckpt: Path, tmp_path: Path) -> None:
    from kern_run_testutil import PROBED

    args = _run_args(tiny_manifest, kernels_dir, tiny_ckpt)
    assert _refusal([*args, "--capacity", "8000"]) == (
        "kern run: --capacity 8000 is more than the manifest's max context (1024 tokens), which is all one sequence "
        "can use: pass --capacity <= 1024")
    assert PROBED in _refusal([*args, "--capacity", str(MAX_CONTEXT)], 3)
    assert PROBED in _refusal(args, 3)  # the default 4096 is clamped to the context, not refused
    toml = tmp_path / "kern.toml"
    toml.write_text(f'[targets.t]\nmanifest = "{tiny_manifest}"\nkernels = "{kernels_dir}"\nweights = "{tiny_ckpt}"\n'
                    'capacity = 8000\n')
    assert _refusal(["run", "--config", str(toml), "--target", "t"]) == (
        "kern run: kern.toml target 't' capacity 8000 is more than the manifest's max context (1024 tokens), which "
        "is all one sequence can use: pass --capacity <= 1024")


def test_several_prompts_may_pool_more_than_one_context(stub_device_probe: None, tiny_manifest: Path,
                                                        kernels_dir: Path, tiny_ckpt: Path, tmp_path: Path) -> None:
    """--prompts keeps cached prefixes in the pool: room beyond one context is allowed, up to int32 page ids."""
    from kern_run_testutil import PROBED

    prompts = tmp_path / "p.txt"
    prompts.write_text("one\ntwo\n")
    args = _run_args(tiny_manifest, kernels_dir, tiny_ckpt, "--prompts", str(prompts))
    assert PROBED in _refusal([*args, "--capacity", "8000"], 3)
    huge = str(10**20)
    assert _refusal([*args, "--capacity", huge]) == (
        f"kern run: --capacity {huge} tokens is {10**20 // 16} pages of 16, more than the 2147483646 page ids the "
        "device block tables hold (int32)")


@pytest.mark.parametrize("capacity, prompt_bytes, line", [
    (None, 1500, "kern run: the prompt is 1500 tokens, more than the manifest's max context (1024 tokens): shorten "
                 "it, or use a manifest generated with a larger --max-context (kern manifest build)"),
    ("256", 1500, "kern run: the prompt is 1500 tokens, more than the manifest's max context (1024 tokens) and "
                  "--capacity (256): shorten it, or use a manifest generated with a larger --max-context "
                  "(kern manifest build)"),
    ("256", 300, "kern run: the prompt is 300 tokens, more than --capacity (256 tokens): shorten it or raise "
                 "--capacity (<= 1024)"),
])
def test_a_long_prompt_gets_a_hint_it_can_follow(stub_device_probe: None, tiny_manifest: Path, kernels_dir: Path,
                                                 tiny_ckpt: Path, capacity: str | None, prompt_bytes: int,
                                                 line: str) -> None:
    """The byte-level test tokenizer makes one token per byte. With the default capacity 4096 the hint used to say
    `raise --capacity (<= 1024)`, though the capacity was above that already."""
    extra = ["--prompt", "x" * prompt_bytes, *(["--capacity", capacity] if capacity else [])]
    assert _refusal(_run_args(tiny_manifest, kernels_dir, tiny_ckpt, *extra)) == line


# ---------------------------------------------------------------- values that would fail only after the probe

@pytest.mark.parametrize("args, line", [
    (["run", "--capacity", "1e20"], "kern run: --capacity: '1e20' is not a valid integer"),
    (["run", "--steps", "1e23"], "kern run: --steps: '1e23' is not a valid integer"),
    (["run", "--gpu", "1e3"], "kern run: --gpu: '1e3' is not a valid integer"),
    (["test", "--prompts", "1e12"], "kern test: --prompts: '1e12' is not a valid integer"),
    (["test", "--steps", "1e23"], "kern test: --steps: '1e23' is not a valid integer"),
])
def test_float_syntax_for_a_count_is_refused_at_parse(args: list[str], line: str) -> None:
    assert _refusal(args) == line


def _test_args(manifest: Path, kernels: Path, weights: Path, *extra: str) -> list[str]:
    return ["test", "--manifest", str(manifest), "--kernels", str(kernels), "--weights", str(weights), *extra]


def test_kern_test_bounds_before_the_probe(stub_device_probe: None, tiny_manifest: Path, kernels_dir: Path,
                                           tiny_ckpt: Path) -> None:
    from kern_run_testutil import PROBED

    base = _test_args(tiny_manifest, kernels_dir, tiny_ckpt)
    assert _refusal([*base, "--prompts", str(10**12)]) == (
        "kern test: --prompts 1000000000000: at most 10000 prompts (each is a generation and a teacher-forced pass "
        "on both sides)")
    assert _refusal([*base, "--steps", str(10**23)]) == (
        f"kern test: --steps {10**23}: the context holds 1024 positions (the manifest's max context 1024), and each "
        "prompt needs at least 1: pass --steps <= 1023")
    assert _refusal([*base, "--capacity", "8000"]) == (
        "kern test: --capacity 8000 is more than the manifest's max context (1024 tokens), which is all one "
        "sequence can use: pass --capacity <= 1024")
    assert PROBED in _refusal([*base, "--seed", str(2**70)], 3)  # numpy seeds any integer >= 0


def test_a_huge_seed_samples_prompts(tiny_ckpt: Path) -> None:
    from kern_run.abtest import sample_prompts
    from kern_run.text import load_codec

    codec = load_codec(tiny_ckpt)
    first = sample_prompts(codec, 6, 2**70, 8, 100)
    assert first == sample_prompts(codec, 6, 2**70, 8, 100)
    assert [len(p) for p in first[4:]] == [8, 16]


def test_kern_run_with_a_huge_step_count_reaches_the_probe(stub_device_probe: None, tiny_manifest: Path,
                                                           kernels_dir: Path, tiny_ckpt: Path) -> None:
    """Generation stops when the context is full, so a step count past it is no error (`--steps` is at most)."""
    from kern_run_testutil import PROBED

    assert PROBED in _refusal(_run_args(tiny_manifest, kernels_dir, tiny_ckpt, "--steps", str(10**23)), 3)
