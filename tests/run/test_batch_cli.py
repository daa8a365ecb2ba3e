"""`kern run` over the batched caller on a fake batched runtime: one prompt and a prompts file decoded together,
the sampling flags, kern.toml sampling defaults under the flags, --stop, --max-tokens / --steps, the warm-up
line, and the refusals (one stderr line, exit 2, before the device probe)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_rows_runtime import BatchFakeRuntime, batched_manifest, expected_tokens
from typer.testing import CliRunner

from kern_run.cli import app
from kern_run.text import load_codec


@pytest.fixture(scope="module")
def manifest64(tmp_path_factory: pytest.TempPathFactory, kernels_dir: Path) -> Path:
    return batched_manifest(tmp_path_factory.mktemp("m") / "tiny-64.json", kernels_dir)


@pytest.fixture(scope="module")
def manifest_argmax(tmp_path_factory: pytest.TempPathFactory, kernels_dir: Path) -> Path:
    return batched_manifest(tmp_path_factory.mktemp("m") / "tiny-64-argmax.json", kernels_dir, sampler=False)


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch, with_device: None) -> list[BatchFakeRuntime]:
    """`Generator.open` builds a BatchFakeRuntime (with DeviceSteps) over the manifest's facts; the runtimes made."""
    from kern_run.generate import Generator

    made: list[BatchFakeRuntime] = []

    def open_fake(manifest, kernels, weights, facts, gpu=0, capacity_tokens=4096, eos_ids=frozenset(),  # type: ignore[no-untyped-def]
                  progress=None, resident=None):
        rt = BatchFakeRuntime(facts, num_pages=capacity_tokens // 16)
        made.append(rt)
        return Generator(rt, facts, eos_ids, steps=rt)

    monkeypatch.setattr(Generator, "open", staticmethod(open_fake))
    return made


def _args(manifest: Path, kernels: Path, ckpt: Path, *more: str) -> list[str]:
    return ["run", "--manifest", str(manifest), "--kernels", str(kernels), "--weights", str(ckpt), "--log-level",
            "info", "--ignore-eos", *more]


def _ok(args: list[str]):  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.stderr[-3000:]
    return result


def _refused(args: list[str], line: str, code: int = 2) -> None:
    result = CliRunner().invoke(app, args)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == code and lines == [line], (result.exit_code, result.stderr[-2000:])
    assert result.stdout == ""


def test_one_prompt_streams_and_warms_up(loads, manifest64: Path, kernels_dir: Path, tiny_ckpt: Path) -> None:
    codec = load_codec(tiny_ckpt)
    ids = codec.encode("Hello, kern")
    for flag in ("--max-tokens", "--steps", "-n"):
        result = _ok(_args(manifest64, kernels_dir, tiny_ckpt, "--prompt", "Hello, kern", flag, "12"))
        assert result.stdout == codec.decode(expected_tokens(ids, 12)[0]) + "\n"
    assert "warm-up " in result.stderr and "decode at 1 rows" in result.stderr
    assert "12 tokens generated (stop: steps)" in result.stderr and "ms/token" in result.stderr
    rt = loads[-1]
    assert [c[1]["seqs"] for c in rt.calls if c[0] == "decode"][1:] == [1] * 12  # after the warm-up's step


def test_a_prompts_file_decodes_together_in_prompt_order(loads, manifest64: Path, kernels_dir: Path,
                                                         tiny_ckpt: Path, tmp_path: Path) -> None:
    codec = load_codec(tiny_ckpt)
    texts = ["The capital of France is", "a", "Once upon a time, in a land far away", "kern", "x" * 40]
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(texts) + "\n")
    result = _ok(_args(manifest64, kernels_dir, tiny_ckpt, "--prompts", str(prompts), "--max-tokens", "9"))
    want = [codec.decode(expected_tokens(codec.encode(t), 9)[0]) for t in texts]
    assert result.stdout == "".join(w + "\n" for w in want)
    assert "5 prompt(s) in 1 wave(s)" in result.stderr and "decode at 1, 2, 4, 8 rows" in result.stderr
    assert "rows:steps 8:9" in result.stderr
    assert [c[1]["seqs"] for c in loads[-1].calls if c[0] == "decode"][4:] == [8] * 9


def test_sampling_flags_and_target_defaults(loads, manifest64: Path, kernels_dir: Path, tiny_ckpt: Path,
                                            tmp_path: Path) -> None:
    codec = load_codec(tiny_ckpt)
    ids = codec.encode("Hi")

    def sampled(temperature: float, seed: int) -> str:
        return codec.decode(expected_tokens(ids, 10, temperature, seed)[0]) + "\n"

    base = ["--prompt", "Hi", "--max-tokens", "10"]
    result = _ok(_args(manifest64, kernels_dir, tiny_ckpt, *base, "--temperature", "0.8", "--top-p", "0.9",
                       "--top-k", "40", "--min-p", "0.05", "--seed", "7"))
    assert result.stdout == sampled(0.8, 7) and "seed 7" in result.stderr
    assert "temperature 0.8, top_k 40, top_p 0.9, min_p 0.05" in result.stderr
    toml = tmp_path / "kern.toml"
    toml.write_text(f'[targets.t]\nmanifest = "{manifest64}"\nkernels = "{kernels_dir}"\nweights = "{tiny_ckpt}"\n'
                    '[targets.t.sampling]\ntemperature = 0.8\nseed = 3\nrepetition_penalty = 1.0\n')
    target = ["run", "--config", str(toml), "--target", "t", "--ignore-eos", "--log-level", "info", *base]
    assert _ok(target).stdout == sampled(0.8, 3)  # the target's defaults
    assert _ok([*target, "--seed", "5"]).stdout == sampled(0.8, 5)  # a flag overrides its field only
    assert _ok([*target, "--temperature", "0"]).stdout == codec.decode(expected_tokens(ids, 10)[0]) + "\n"


def test_stop_strings_cut_the_output(loads, manifest64: Path, kernels_dir: Path, tiny_ckpt: Path,
                                     tmp_path: Path) -> None:
    codec = load_codec(tiny_ckpt)
    ids = codec.encode("Hello")
    full = codec.decode(expected_tokens(ids, 30)[0])
    stop = full[11:14]  # three tokens of the byte tokenizer: spans token boundaries
    cut = full[:full.find(stop)]
    result = _ok(_args(manifest64, kernels_dir, tiny_ckpt, "--prompt", "Hello", "--max-tokens", "30", "--stop", stop,
                       "--stop", "never-there"))
    assert result.stdout == cut + "\n" and "(stop: stop)" in result.stderr
    prompts = tmp_path / "p.txt"
    prompts.write_text("Hello\nHello again\n")
    other = codec.decode(expected_tokens(codec.encode("Hello again"), 30)[0])
    result = _ok(_args(manifest64, kernels_dir, tiny_ckpt, "--prompts", str(prompts), "--max-tokens", "30", "--stop",
                       stop))
    second = other[:other.find(stop)] if stop in other else other
    assert result.stdout == cut + "\n" + second + "\n"


def test_logprobs_go_to_stderr(loads, manifest64: Path, kernels_dir: Path, tiny_ckpt: Path) -> None:
    result = _ok(_args(manifest64, kernels_dir, tiny_ckpt, "--prompt", "Hi", "--max-tokens", "3", "--logprobs",
                       "--top-logprobs", "2"))
    assert "logprobs " in result.stderr and "token 3 top: " in result.stderr
    assert "logprob" not in result.stdout


@pytest.mark.parametrize("flags, line", [
    (["--temperature", "-1"], "kern run: --temperature: sampling: temperature = -1.0 is below 0 (allowed: >= 0; 0 is "
                              "greedy)"),
    (["--top-p", "0"], "kern run: --top-p: sampling: top_p = 0.0 is outside (0, 1] (1 is off)"),
    (["--top-p", "1.5"], "kern run: --top-p: sampling: top_p = 1.5 is outside (0, 1] (1 is off)"),
    (["--top-k", "-1"], "kern run: --top-k: sampling: top_k = -1 is below 0 (allowed: >= 0; 0 is off)"),
    (["--min-p", "2"], "kern run: --min-p: sampling: min_p = 2.0 is outside [0, 1] (0 is off)"),
    (["--seed", "-1"], "kern run: --seed: sampling: seed = -1 is outside [0, 2^64 - 1]"),
    (["--seed", str(2**64)], f"kern run: --seed: sampling: seed = {2**64} is outside [0, 2^64 - 1]"),
    (["--seed", "1.5"], "kern run: --seed: '1.5' is not a valid integer"),
    (["--repetition-penalty", "0"], "kern run: --repetition-penalty: sampling: repetition_penalty = 0.0 is not above "
                                    "0 (allowed: > 0; 1 is off)"),
    (["--presence-penalty", "3"], "kern run: --presence-penalty: sampling: presence_penalty = 3.0 is outside "
                                  "[-2, 2] (0 is off)"),
    (["--top-logprobs", "21"], "kern run: --top-logprobs: sampling: top_logprobs = 21 is outside [0, 20]"),
    (["--stop", ""], "kern run: --stop '': a stop string must be non-empty text"),
    (["--max-tokens", "-2"], "kern run: --max-tokens -2 must be >= 0"),
    (["--steps", "-2"], "kern run: --steps -2 must be >= 0"),
])
def test_bad_sampling_values_are_one_line_before_the_probe(stub_device_probe: None, manifest64: Path,
                                                           kernels_dir: Path, tiny_ckpt: Path, flags: list[str],
                                                           line: str) -> None:
    _refused(_args(manifest64, kernels_dir, tiny_ckpt, *flags), line)


def test_an_argmax_manifest_refuses_sampling(stub_device_probe: None, manifest_argmax: Path, kernels_dir: Path,
                                             tiny_ckpt: Path) -> None:
    args = _args(manifest_argmax, kernels_dir, tiny_ckpt)
    _refused([*args, "--temperature", "0.8"],
             "kern run: --temperature 0.8: temperature = 0.8 needs the GPU sampler, and this manifest decodes greedily "
             "(argmax; no meta.caller.sampling): leave temperature at 0, or build the manifest with the sampler (kern "
             "manifest build --sampler gpu)")
    _refused([*args, "--logprobs"], "kern run: --logprobs: logprobs = 'on' needs the GPU sampler, and this "
             "manifest decodes greedily (argmax; no meta.caller.sampling): leave logprobs at off, or build the "
             "manifest with the sampler (kern manifest build --sampler gpu)")
    from kern_run_testutil import PROBED

    result = CliRunner().invoke(app, [*args, "--temperature", "0", "--stop", "x"])  # greedy and stops: allowed
    assert result.exit_code == 3 and PROBED in result.stderr


@pytest.mark.parametrize("table, needle", [
    ("temperature = -0.5\n", "[targets.t.sampling] sampling: temperature = -0.5 is below 0"),
    ("top_k = 1.5\n", "[targets.t.sampling] sampling: top_k = 1.5 is not an integer"),
    ("seed = \"x\"\n", "[targets.t.sampling] sampling: seed = 'x' is not an integer"),
    ("tempreature = 1\n", "[targets.t.sampling] has unknown keys ['tempreature'] (known: ['temperature', 'top_k', "),
    ("logprobs = true\n", "[targets.t.sampling] has unknown keys ['logprobs']"),
])
def test_bad_target_sampling_defaults(stub_device_probe: None, manifest64: Path, kernels_dir: Path, tiny_ckpt: Path,
                                      tmp_path: Path, table: str, needle: str) -> None:
    toml = tmp_path / "kern.toml"
    toml.write_text(f'[targets.t]\nmanifest = "{manifest64}"\nkernels = "{kernels_dir}"\nweights = "{tiny_ckpt}"\n'
                    f'[targets.t.sampling]\n{table}')
    result = CliRunner().invoke(app, ["run", "--config", str(toml), "--target", "t"])
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and needle in lines[0] and str(toml) in lines[0], result.stderr
    toml.write_text(f'[targets.t]\nmanifest = "{manifest64}"\nkernels = "{kernels_dir}"\nweights = "{tiny_ckpt}"\n'
                    'sampling = 3\n')
    result = CliRunner().invoke(app, ["run", "--config", str(toml), "--target", "t"])
    assert result.exit_code == 2 and "[targets.t.sampling] must be a table" in result.stderr


def test_tp_decodes_greedily(stub_device_probe: None, manifest64: Path, kernels_dir: Path, tiny_ckpt: Path) -> None:
    _refused([*_args(manifest64, kernels_dir, tiny_ckpt), "--tp", "2", "--temperature", "0.5", "--seed", "1"],
             "kern run: --tp 2 decodes greedily without stop strings or logprobs: drop --temperature 0.5, --seed 1 "
             "(--greedy drops a target's sampling defaults)")


def test_greedy_with_a_sampling_flag_is_refused(stub_device_probe: None, manifest64: Path, kernels_dir: Path,
                                                tiny_ckpt: Path) -> None:
    _refused([*_args(manifest64, kernels_dir, tiny_ckpt), "--greedy", "--top-p", "0.9"],
             "kern run: --greedy with a sampling flag: pass one or the other")
