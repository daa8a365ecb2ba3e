"""`kern` CLI: targets, refusals (one line, non-zero exit, no traceback), and a full run on a fake runtime."""

from __future__ import annotations

import json

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kern_run.session as session
from kern_run import preflight
from kern_run.cli import app
from kern_run.config import resolve_config
from kern_run.errors import ConfigError, NoDeviceError, WeightsError
from kern_run.text import load_codec
from kern_run_testutil import FakeRuntime, make_manifest


@pytest.fixture(autouse=True)
def no_repo_targets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Isolate from the repository's kern.toml: an empty one (no default target)."""
    empty = tmp_path / "empty-kern.toml"
    empty.write_text("")
    monkeypatch.setenv("KERN_TOML", str(empty))


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def _refused(result, code: int, *needles: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def with_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session, "probe_device", lambda gpu: 1)


def _base(tiny_manifest: Path, kernels_dir: Path, tiny_ckpt: Path) -> list[str]:
    return ["run", "--manifest", str(tiny_manifest), "--kernels", str(kernels_dir), "--weights", str(tiny_ckpt),
            "--log-level", "info"]


def test_no_cuda_device(monkeypatch: pytest.MonkeyPatch, tiny_manifest: Path, kernels_dir: Path,
                        tiny_ckpt: Path) -> None:
    """Host-side refusals come first (a CPU machine still learns what is wrong with its inputs); a valid
    target then stops at the device probe with exit 3."""
    def no_device(gpu: int) -> int:
        raise NoDeviceError("no CUDA device: the CUDA driver library cannot be loaded; kern needs an NVIDIA GPU")

    monkeypatch.setattr(session, "probe_device", no_device)
    _refused(_invoke("run", "--prompt", "hi", "--manifest", "m.json", "--kernels", "k", "--weights", "w"), 2,
             "m.json")
    _refused(_invoke(*_base(tiny_manifest, kernels_dir, tiny_ckpt), "--prompt", "hi"), 3, "no CUDA device")
    # prompt checks are host-only too: an empty or too long prompt is named before the device probe
    _refused(_invoke(*_base(tiny_manifest, kernels_dir, tiny_ckpt), "--prompt", ""), 2, "empty")
    _refused(_invoke(*_base(tiny_manifest, kernels_dir, tiny_ckpt), "--prompt", "word " * 3000, "--capacity", "256"),
             2, "capacity")


def test_probe_device_branches(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    class Result:
        def __init__(self, name: str) -> None:
            self.name = name

    ok, no_dev = Result("CUDA_SUCCESS"), Result("CUDA_ERROR_NO_DEVICE")
    fake = types.SimpleNamespace(CUresult=types.SimpleNamespace(CUDA_SUCCESS=ok))
    bindings = pytest.importorskip("cuda.bindings")
    monkeypatch.setattr(bindings, "driver", fake, raising=False)
    monkeypatch.setitem(__import__("sys").modules, "cuda.bindings.driver", fake)
    fake.cuInit = lambda flags: (no_dev,)
    with pytest.raises(NoDeviceError, match="CUDA_ERROR_NO_DEVICE"):
        preflight.probe_device(0)
    fake.cuInit = lambda flags: (ok,)
    fake.cuDeviceGetCount = lambda: (ok, 2)
    assert preflight.probe_device(1) == 2
    with pytest.raises(NoDeviceError, match="--gpu 2 but 2"):
        preflight.probe_device(2)


def test_missing_and_mismatched_cubin(with_device, tiny_manifest: Path, kernels_dir: Path, tiny_ckpt: Path,
                                      tmp_path: Path) -> None:
    broken = tmp_path / "kernels"
    shutil.copytree(kernels_dir, broken)
    victim = sorted(broken.glob("attention-*.cubin"))[0]
    victim.unlink()
    args = _base(tiny_manifest, broken, tiny_ckpt)
    _refused(_invoke(*args), 2, victim.name, "kern kernels")
    victim.write_bytes(b"something else")
    _refused(_invoke(*args), 2, victim.name, "sha256")


def test_weights_that_do_not_match(with_device, kernels_dir: Path, tiny_ckpt: Path, tmp_path: Path) -> None:
    untied = make_manifest(tmp_path / "untied.json", kernels_dir, untied=True)
    _refused(_invoke(*_base(untied, kernels_dir, tiny_ckpt)), 2, "lm_head.weight")
    bigger = make_manifest(tmp_path / "big.json", kernels_dir, shape="qwen3-0.6b")
    _refused(_invoke(*_base(bigger, kernels_dir, tiny_ckpt)), 2, "wrong model")
    _refused(_invoke(*_base(bigger, kernels_dir, tmp_path / "nowhere")), 2, "make_checkpoint.py")


def test_wrong_dtype(tiny_manifest: Path, tiny_ckpt: Path) -> None:
    facts = preflight.read_manifest(tiny_manifest)
    tensors = preflight.checkpoint_tensors(tiny_ckpt)
    tensors["model.norm.weight"] = ("f32", tensors["model.norm.weight"][1])
    with pytest.raises(WeightsError, match="model.norm.weight.*f32.*bf16"):
        preflight.check_weights(facts, tensors, tiny_ckpt)


def test_prompt_longer_than_capacity(with_device, fake_runtime, tiny_manifest: Path, kernels_dir: Path,
                                     tiny_ckpt: Path) -> None:
    result = _invoke(*_base(tiny_manifest, kernels_dir, tiny_ckpt), "--capacity", "16", "--prompt", "x" * 40)
    _refused(result, 2, "40 tokens", "--capacity")
    assert fake_runtime == []  # refused before loading


def test_chunk_larger_than_tokens_var(with_device, tiny_manifest: Path, kernels_dir: Path, tiny_ckpt: Path) -> None:
    result = _invoke(*_base(tiny_manifest, kernels_dir, tiny_ckpt), "--chunk", "65")
    _refused(result, 2, "chunk 65 (--chunk", "tokens var max 64")


def test_run_streams_only_text(with_device, fake_runtime, tiny_manifest: Path, kernels_dir: Path,
                               tiny_ckpt: Path) -> None:
    result = _invoke(*_base(tiny_manifest, kernels_dir, tiny_ckpt), "--prompt", "Hello, kern", "--steps", "12",
                     "--chunk", "4")
    assert result.exit_code == 0, result.stderr
    rt = fake_runtime[0]
    decodes = [c for c in rt.calls if c[0] == "decode"]
    prefills = [c[1]["tokens"] for c in rt.calls if c[0] == "prefill"]
    assert prefills == [4, 4, 2] and len(decodes) == 12
    codec = load_codec(tiny_ckpt)
    prompt = codec.encode("Hello, kern")
    tokens, tok = [], prompt[-1]
    for pos in range(len(prompt) - 1, len(prompt) + 11):
        tok = FakeRuntime.predict(tok, pos)
        tokens.append(tok)
    assert result.stdout == codec.decode(tokens) + "\n"
    assert "ms/token" in result.stderr and "12 tokens generated" in result.stderr
    assert "graph: 33 launches -> 1 graph launch per step" in result.stderr


def test_targets_and_overrides(tmp_path: Path) -> None:
    toml = tmp_path / "kern.toml"
    toml.write_text('default = "a"\n[targets.a]\nmanifest = "m.json"\nkernels = "k"\nweights = "/w"\ncapacity = 100\n'
                    '[targets.b]\nmanifest = "n.json"\nkernels = "k"\nweights = "w2"\ngpu = 1\nchunk = 8\n')
    cfg = resolve_config(toml, None, {"chunk": None})
    assert (cfg.target, cfg.manifest, cfg.weights, cfg.capacity_tokens, cfg.chunk) == (
        "a", tmp_path / "m.json", Path("/w"), 100, None)
    cfg = resolve_config(toml, "b", {"chunk": 16, "weights": Path("x")})
    assert (cfg.gpu, cfg.chunk, cfg.weights, cfg.capacity_tokens) == (1, 16, Path("x"), 4096)
    with pytest.raises(ConfigError, match="'c' is not in"):
        resolve_config(toml, "c", {})
    with pytest.raises(ConfigError, match="--manifest"):
        resolve_config(None, None, {"kernels": Path("k"), "weights": Path("w")})
    toml.write_text('[targets.a]\nmanifest = "m"\nbogus = 1\n')
    with pytest.raises(ConfigError, match="bogus"):
        resolve_config(toml, "a", {})


def test_inspect_prints_summary(tiny_manifest: Path) -> None:
    result = _invoke("inspect", str(tiny_manifest))
    assert result.exit_code == 0
    assert "kern_attn_decode_partial_wide in attention" in result.stdout
    assert "program decode (run): 29 calls, 33 launches" in result.stdout
    assert "program top_logprobs (run): 1 call, 1 launch" in result.stdout
    _refused(_invoke("inspect", "/nonexistent.json"), 2, "/nonexistent.json", "No such file")


def test_inspect_any_manifest_verified_with_computed_digest(tmp_path: Path) -> None:
    """Not only the Qwen3 contract: the format's own example; a stale declared digest is a fault."""
    from kern_manifest import parse_manifest

    example = Path(__file__).resolve().parents[1] / "manifest" / "data" / "example.json"
    raw = json.loads(example.read_text())
    result = _invoke("inspect", str(example))
    assert result.exit_code == 0, result.stderr
    assert f"digest {parse_manifest(raw).digest[:12]}" in result.stdout.splitlines()[0]
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps({**raw, "digest": "0" * 64}))
    _refused(_invoke("inspect", str(stale)), 2, "fails verification at $.digest")


def test_manifest_check(tiny_manifest: Path) -> None:
    pytest.importorskip("kern_manifest")
    result = _invoke("manifest", "check", str(tiny_manifest))
    assert result.exit_code == 0, result.stdout + result.stderr


@pytest.mark.parametrize("against", ["eager", "chunk1"])
def test_kern_test_same_runtime(with_device, fake_runtime, tiny_manifest: Path, kernels_dir: Path,
                                tiny_ckpt: Path, against: str) -> None:
    result = _invoke("test", "--manifest", str(tiny_manifest), "--kernels", str(kernels_dir), "--weights",
                     str(tiny_ckpt), "--against", against, "--prompts", "5", "--steps", "6")
    assert result.exit_code == 0, result.stderr
    rows = result.stdout.strip().splitlines()
    assert rows[0].startswith(f"A = qwen3-tiny.json (graph, chunk 64), B = {against}")
    assert len(rows) == 2 + 5 and all(r.split()[-3:] == ["100.0%", "-", "0"] for r in rows[2:])
    rt = fake_runtime[0]
    assert rt.closed
    if against == "chunk1":
        assert any(c[0] == "prefill" and c[1]["tokens"] == 1 for c in rt.calls)
    else:
        assert any(c[0] == "decode" and c[2] for c in rt.calls)


def test_prompts_with_tp_refused(tiny_manifest: Path, kernels_dir: Path, tiny_ckpt: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("a\nb\n")
    _refused(_invoke(*_base(tiny_manifest, kernels_dir, tiny_ckpt), "--prompts", str(prompts), "--tp", "2"),
             2, "--prompts")


def test_manifest_that_fails_verification(tiny_manifest: Path, kernels_dir: Path, tiny_ckpt: Path,
                                          tmp_path: Path) -> None:
    raw = json.loads(tiny_manifest.read_text())
    raw["buffers"]["hidden"]["dtype"] = "bf17"
    raw["programs"]["decode"]["calls"][0]["op"] = "no_such_op"
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(raw))
    _refused(_invoke(*_base(broken, kernels_dir, tiny_ckpt)), 2, "broken.json fails verification at $.buffers.hidden.dtype",
             "unknown dtype 'bf17'", "more: kern-manifest check")


def test_unknown_log_level_is_a_usage_error() -> None:
    result = _invoke("run", "--log-level", "bogus")
    assert result.exit_code == 2
    assert "'bogus' is not one of debug, info, warning, error" in result.output


def test_summary_counts_only_the_when_alternative_that_runs() -> None:
    """A graph step is counted at its smallest vars: of a `when` group only the launch selected there (the
    tiny-en cuBLASLt decode pins tokens = 1 and keeps the heuristic for 2..512 as a second launch)."""
    from kern_manifest import load_manifest

    from kern_run.summary import launches_at, manifest_lines

    root = Path(__file__).resolve().parents[2]
    manifest = load_manifest(root / "manifests" / "qwen3-tiny-en-gemm.json")
    pinned = next(op for name, op in manifest.ops.items() if name.startswith("gemm_m1_"))
    assert len(pinned.launches) == 2
    assert launches_at(pinned, {"tokens": 1, "seqs": 1}) == 1 and launches_at(pinned, {"tokens": 7, "seqs": 1}) == 1
    calls = manifest.programs["decode"].calls
    all_launches = sum(len(manifest.ops[c.op].launches) for c in calls)
    running = sum(launches_at(manifest.ops[c.op], {"tokens": 1, "seqs": 1}) for c in calls)
    assert running < all_launches
    line = next(ln for ln in manifest_lines(manifest) if ln.startswith("program decode"))
    assert f"{running} launches at seqs=1, tokens=1, graph: {running} launches -> 1 graph launch per step" in line


def test_inspect_refuses_a_non_utf8_manifest(tmp_path: Path) -> None:
    bad = tmp_path / "m.json"
    bad.write_bytes(b'{"format": "kern-manifest/1", "name": "\xff\xfe"}')
    _refused(_invoke("inspect", str(bad)), 2, "m.json", "not UTF-8")


def test_tp_run_checks_the_host_side_once_before_any_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         tiny_manifest: Path, kernels_dir: Path,
                                                         tiny_ckpt: Path) -> None:
    """`kern run --tp 2`: missing rank manifests, then the prompt, are refused before a GPU is touched, and
    rank 0's manifest is read (parsed + verified) once, not again by open_tp."""
    import shutil

    from kern_run import preflight, tp
    from kern_run.config import RunConfig
    from kern_run.errors import InputError, RefusalError

    manifest = tmp_path / "m.json"
    shutil.copyfile(tiny_manifest, manifest)
    cfg = RunConfig(manifest, kernels_dir, tiny_ckpt, capacity_tokens=64)
    loads: list[str] = []
    monkeypatch.setattr(tp, "probe_device", lambda gpu: pytest.fail("a GPU was probed"))
    with pytest.raises(RefusalError, match="rank manifest"):
        tp.run_tp(cfg, "hello", 4, False, False, 2, None)
    for r in range(2):
        shutil.copyfile(tiny_manifest, tp.rank_manifest(manifest, 2, r))
    monkeypatch.setattr(tp, "read_manifest", lambda p: loads.append(str(p)) or preflight.read_manifest(p))
    with pytest.raises(InputError, match="prompt"):
        tp.run_tp(cfg, "word " * 200, 4, False, False, 2, None)
    assert loads == [str(tp.rank_manifest(manifest, 2, 0))]

    def fake_open(cfg, n, eos, log, facts=None):  # type: ignore[no-untyped-def]
        assert facts is not None  # run_tp hands over what it read
        raise RefusalError("stop before loading")

    monkeypatch.setattr(tp, "open_tp", fake_open)
    with pytest.raises(RefusalError, match="stop before loading"):
        tp.run_tp(cfg, "hello", 4, False, False, 2, None)
    assert len(loads) == 2  # one read per run_tp


def _duplicate_key_manifest(tiny_manifest: Path, tmp_path: Path) -> Path:
    """The tiny manifest with its "format" key written twice (the same value: plain json.loads keeps the last
    and would accept it)."""
    text = tiny_manifest.read_text()
    fmt = json.loads(text)["format"]
    dup = tmp_path / "dup.json"
    dup.write_text(text.replace("{", '{"format": ' + json.dumps(fmt) + ",", 1))
    assert json.loads(dup.read_text()) == json.loads(text)  # only the duplicate-key rule can refuse it
    return dup


def test_duplicate_key_manifest_refused_like_manifest_check(tiny_manifest: Path, kernels_dir: Path, tiny_ckpt: Path,
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/manifest.md: no duplicate keys. `kern manifest check`, `kern inspect` and the run preflight all refuse
    the file, naming it and the key; the preflight before the device probe."""
    dup = _duplicate_key_manifest(tiny_manifest, tmp_path)
    check = _invoke("manifest", "check", str(dup))
    assert check.exit_code == 1 and "duplicate key 'format'" in check.output
    _refused(_invoke("inspect", str(dup)), 2, "dup.json", "duplicate key 'format'")
    monkeypatch.setattr(session, "probe_device", lambda gpu: pytest.fail("a GPU was probed"))
    _refused(_invoke(*_base(dup, kernels_dir, tiny_ckpt), "--prompt", "hi"), 2, "dup.json", "duplicate key 'format'")
    with pytest.raises(ConfigError, match=r"dup\.json: \$: duplicate key 'format' in one JSON object"):
        preflight.read_manifest(dup)
    assert preflight.read_manifest(tiny_manifest).manifest.name == json.loads(tiny_manifest.read_text())["name"]


def test_kern_test_refuses_a_bad_against_manifest_before_the_device_probe(
        monkeypatch: pytest.MonkeyPatch, tiny_manifest: Path, kernels_dir: Path, tiny_ckpt: Path,
        tmp_path: Path) -> None:
    """`kern test --against B.json` on a machine without a GPU: B's host-side refusal is reported, not the missing
    device (docs/caller.md "Refusals"); with a good B the device probe still runs, last."""
    probes: list[int] = []

    def no_device(gpu: int) -> int:
        probes.append(gpu)
        raise NoDeviceError("no CUDA device: the CUDA driver library cannot be loaded; kern needs an NVIDIA GPU")

    monkeypatch.setattr(session, "probe_device", no_device)
    raw = json.loads(tiny_manifest.read_text())
    raw["buffers"]["hidden"]["dtype"] = "bf17"
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(raw))
    args = ["test", "--manifest", str(tiny_manifest), "--kernels", str(kernels_dir), "--weights", str(tiny_ckpt)]
    _refused(_invoke(*args, "--against", str(broken)), 2, "broken.json fails verification at $.buffers.hidden.dtype")
    _refused(_invoke(*args, "--against", str(_duplicate_key_manifest(tiny_manifest, tmp_path))), 2, "dup.json",
             "duplicate key 'format'")
    assert probes == []
    good = tmp_path / "good.json"
    shutil.copyfile(tiny_manifest, good)
    _refused(_invoke(*args, "--against", str(good), "--gpu", "0"), 3, "no CUDA device")
    assert probes == [0]


def test_kernels_help_is_the_builders(monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """`kern kernels --help` passes through to tools/build_kernels.py: its options, not only typer's --help."""
    monkeypatch.setenv("KERN_TOML", str(Path(__file__).resolve().parents[2] / "kern.toml"))
    result = _invoke("kernels", "--help")
    out = capfd.readouterr().out  # the builder runs as a subprocess: its stdout is the process's, not the runner's
    assert result.exit_code == 0, out
    assert "usage: build_kernels.py" in out
    for option in ("--src", "--out", "--check", "--modules"):
        assert option in out, option


def test_version_prints_every_package(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    import kern_pool
    from kern_run import cli

    result = _invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == ", ".join(f"{d} {metadata.version(d)}" for d in
                                              ("kern-run", "kern-runtime", "kern-manifest", "kern-pool"))

    # from each module's __version__, not installed metadata: packages on PYTHONPATH only (the GPU machine) answer too
    def no_metadata(dist: str) -> str:
        raise metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(metadata, "version", no_metadata)
    monkeypatch.setattr(kern_pool, "__version__", "9.9")
    assert cli.package_versions() == "kern-run 0.1.0, kern-runtime 0.1.0, kern-manifest 0.1.0, kern-pool 9.9"
