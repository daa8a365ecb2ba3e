"""`kern run --weights DIR` without a manifest (kern_run.auto_manifest): every published Qwen3 dense size builds and
inspects, the refusals name the field and its value before anything loads, the built manifest is cached and
reused, the cuBLASLt pins are looked up per GPU and cuBLASLt version (kern_run.pins_cache; picked on first use:
tests/run/test_pins_first_use.py), and the cubins come from kern_run.kernels_dir()."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kern_run
import kern_run.session as session
from kern_run import auto_manifest, pins_cache
from kern_run.auto_manifest import AutoRequest, auto_config
from kern_run.cli import app
from kern_run.errors import ManifestBuildError
from kern_run.models import qwen3
from kern_run.models.qwen3.command import BuildRequest, default_name

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "data" / "configs"
# published name -> (shape key, weight buffers: 8 per layer + embedding, final norm, rope table and the untied
# lm_head; decode calls: embed + 6 per layer + lm_head + the sampler's 3; paged KV bytes per token: layers x 2 x
# kv_heads x head_dim x 2)
SIZES = {
    "Qwen3-0.6B": ("qwen3-0.6b", 227, 173, 114688),
    "Qwen3-1.7B": ("qwen3-1.7b", 227, 173, 114688),
    "Qwen3-4B": ("qwen3-4b", 291, 221, 147456),
    "Qwen3-8B": ("qwen3-8b", 292, 221, 147456),
    "Qwen3-14B": ("qwen3-14b", 324, 245, 163840),
    "Qwen3-32B": ("qwen3-32b", 516, 389, 262144),
}


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def _one_line(result) -> str:
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, (result.exit_code, result.stderr)
    return lines[0]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """user_cache_dir("kern") under tmp_path (platformdirs reads XDG_CACHE_HOME on Linux)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert pins_cache.cache_root() == tmp_path / "xdg" / "kern"
    return tmp_path / "xdg" / "kern"


# ---------------------------------------------------------------- the published sizes


@pytest.mark.parametrize("name", SIZES)
def test_the_shapes_table_writes_the_published_config(name: str) -> None:
    """SHAPES[key]'s config.json is the published file, key for key (the test data holds the published values)."""
    published = json.loads((CONFIGS / f"{name}.json").read_text())
    assert qwen3.config_json(qwen3.SHAPES[SIZES[name][0]]) == published


@pytest.mark.parametrize("name", SIZES)
def test_every_published_size_builds_and_inspects(name: str, tmp_path: Path) -> None:
    _, weights, calls, per_token = SIZES[name]
    out = tmp_path / "m.json"
    built = _invoke("manifest", "build", "--config", str(CONFIGS / f"{name}.json"), "--out", str(out))
    assert built.exit_code == 0, built.output
    assert built.stdout.startswith(f"kern manifest build: wrote {out} (")
    assert built.stdout.endswith(f"decode {calls} calls, verified)\n")
    shown = _invoke("inspect", str(out))
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    cfg = json.loads((CONFIGS / f"{name}.json").read_text())
    assert lines[0].startswith(f"manifest {name} (kern-manifest/1), digest ")
    # a KV state per layer and the sampler's work area (fixed)
    layers = cfg["num_hidden_layers"]
    assert lines[2] == f"states: {layers + 1} (1 fixed, {layers} paged); paged: {per_token} " \
                       "bytes/token in all, page_tokens [16]"
    # inputs: the 6 of the caller contract + the sampler's params and history; outputs: next_token, the ring, top
    # logprobs' ids and values
    assert lines[3].startswith(f"buffers: input 9 (0.02 MiB), output 4 (0.00 MiB), weight {weights} (")
    manifest = json.loads(out.read_text())
    assert manifest["meta"]["config_sha256"] == qwen3.jsonio.sha256_text((CONFIGS / f"{name}.json").read_text())
    assert ("lm_head" in manifest["buffers"]) == (not cfg["tie_word_embeddings"])


# ---------------------------------------------------------------- refusals


def _config(tmp_path: Path, base: str = "Qwen3-8B", **over: object) -> Path:
    cfg = {**json.loads((CONFIGS / f"{base}.json").read_text()), **over}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


REFUSALS = [
    ({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe"},
     "architectures = ['Qwen3MoeForCausalLM'] is not supported: mixture-of-experts layers have no kernels (dense "
     "Qwen3 only)"),
    ({"architectures": ["LlamaForCausalLM"], "model_type": "qwen3"},
     "model_type is 'qwen3'; LlamaForCausalLM has model_type 'llama'"),
    ({"architectures": ["MistralForCausalLM"]}, "architectures = ['MistralForCausalLM'] is not supported (kern "
                                                "builds Qwen3ForCausalLM and LlamaForCausalLM manifests)"),
    ({"use_sliding_window": True, "sliding_window": 4096},
     "use_sliding_window is true; sliding-window attention is not supported"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     "rope_scaling.rope_type = 'yarn' is not supported (plain RoPE only)"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}},
     "rope_scaling.type = 'linear' is not supported (plain RoPE only)"),
    ({"rope_scaling": {"rope_type": "yarn", "type": "default"}},
     "rope_scaling.rope_type = 'yarn' is not supported (plain RoPE only)"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}},
     "rope_scaling.rope_type = 'llama3' is not supported (plain RoPE only)"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}},
     "rope_parameters.rope_type = 'llama3' is not supported (plain RoPE only)"),
    ({"attention_bias": True}, "attention_bias is true; Qwen3 projections without bias only"),
    ({"torch_dtype": "float16"}, "torch_dtype = 'float16' is not supported (kern's kernels and weight binds are "
                                 "bfloat16)"),
    ({"dtype": "float32"}, "dtype = 'float32' is not supported (kern's kernels and weight binds are bfloat16)"),
    ({"hidden_act": "gelu"}, "hidden_act = 'gelu' is not supported (the MLP kernels compute SiLU)"),
]


@pytest.mark.parametrize("scaling", [{"rope_type": "default"}, {"type": "default"}, {}, None])
def test_a_default_rope_scaling_is_plain_rope(scaling: object, tmp_path: Path) -> None:
    """transformers reads `{"rope_type": "default"}` as plain RoPE; it was refused as not plain."""
    plain = _invoke("manifest", "build", "--config", str(_config(tmp_path)), "--out", str(tmp_path / "plain.json"))
    config = _config(tmp_path, rope_scaling=scaling)
    result = _invoke("manifest", "build", "--config", str(config), "--out", str(tmp_path / "m.json"))
    assert (plain.exit_code, result.exit_code) == (0, 0), result.output
    plain_doc, doc = (json.loads((tmp_path / n).read_text()) for n in ("plain.json", "m.json"))
    assert doc["programs"] == plain_doc["programs"] and doc["buffers"] == plain_doc["buffers"]


@pytest.mark.parametrize("over, message", REFUSALS)
def test_manifest_build_refuses_in_one_line(over: dict, message: str, tmp_path: Path) -> None:
    config = _config(tmp_path, **over)
    result = _invoke("manifest", "build", "--config", str(config), "--out", str(tmp_path / "m.json"))
    assert result.exit_code == 1
    assert _one_line(result) == f"kern manifest build: {config}: {message}"
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize("over, message", REFUSALS)
def test_kern_run_refuses_before_anything_loads(over: dict, message: str, tmp_path: Path, cache: Path,
                                                stub_device_probe: None) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    config = _config(tmp_path, **over)
    shutil.move(config, ckpt / "config.json")
    result = _invoke("run", "--weights", str(ckpt), "--no-pins")
    assert result.exit_code == 1
    assert _one_line(result) == f"kern run: {ckpt / 'config.json'}: {message}"
    assert not cache.exists()  # nothing built, no device probed (the stub probe would say so)


def _header_only_checkpoint(path: Path, names: list[str]) -> Path:
    """A .safetensors file holding `names` (1-element bf16 tensors): enough for checkpoint_tensors."""
    header, offset = {}, 0
    for name in names:
        header[name] = {"dtype": "BF16", "shape": [1], "data_offsets": [offset, offset + 2]}
        offset += 2
    blob = json.dumps(header).encode()
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + b"\0" * offset)
    return path


@pytest.mark.parametrize("tied, names, message", [
    (True, ["model.embed_tokens.weight", "lm_head.weight"],
     "tie_word_embeddings = true, but the checkpoint {ckpt} holds lm_head.weight (an untied checkpoint): the config "
     "and the weights disagree"),
    (False, ["model.embed_tokens.weight"],
     "tie_word_embeddings = false, but the checkpoint {ckpt} has no lm_head.weight (a tied checkpoint): the config "
     "and the weights disagree"),
])
def test_a_tie_mismatch_with_the_checkpoint_is_refused(tied: bool, names: list[str], message: str, tmp_path: Path,
                                                       cache: Path, stub_device_probe: None) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({**json.loads((CONFIGS / "Qwen3-8B.json").read_text()),
                                                  "tie_word_embeddings": tied}))
    _header_only_checkpoint(ckpt / "model.safetensors", names)
    result = _invoke("run", "--weights", str(ckpt), "--no-pins")
    assert result.exit_code == 1
    assert _one_line(result) == f"kern run: {ckpt / 'config.json'}: {message.format(ckpt=ckpt)}"
    assert not cache.exists()


def test_no_config_json_is_named(tmp_path: Path, cache: Path, stub_device_probe: None) -> None:
    result = _invoke("run", "--weights", str(tmp_path), "--no-pins")
    assert result.exit_code == 2
    assert _one_line(result) == (f"kern run: --weights {tmp_path}: no config.json at {tmp_path / 'config.json'}: a "
                                 "Hugging Face checkpoint directory has one (or pass --manifest / --target)")


@pytest.mark.parametrize("missing", ["x/y/nope", "Qwen/"])
def test_a_weights_path_that_does_not_exist_is_named(missing: str, tmp_path: Path, cache: Path,
                                                     stub_device_probe: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """It said "no config.json at <the parent>/config.json" (or "at config.json" for `Qwen/`)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x").mkdir()
    result = _invoke("run", "--weights", missing, "--no-pins")
    assert result.exit_code == 2
    assert _one_line(result) == (f"kern run: --weights {Path(missing)}: no such file or directory (give a checkpoint "
                                 "directory, its .safetensors files, or a hub id ORG/NAME in the local Hugging Face "
                                 "cache)")


def test_no_pins_needs_weights_alone(tiny_manifest: Path, kernels_dir: Path, tiny_ckpt: Path) -> None:
    result = _invoke("run", "--manifest", str(tiny_manifest), "--kernels", str(kernels_dir), "--weights",
                     str(tiny_ckpt), "--no-pins")
    assert result.exit_code == 2
    assert _one_line(result) == ("kern run: --no-pins is an option of --weights DIR alone (the manifest built from "
                                 "its config.json); a --manifest or --target manifest carries its own pins")


def test_tp_with_weights_alone_names_the_build_command(tiny_ckpt: Path) -> None:
    result = _invoke("run", "--weights", str(tiny_ckpt), "--tp", "2")
    assert result.exit_code == 2
    assert _one_line(result) == ("kern run: --tp 2 with --weights alone: build the rank manifests with `kern manifest "
                                 "build --config CONFIG.JSON --tp 2 --out m.json` and pass --manifest m.json")


# ---------------------------------------------------------------- build, cache, reuse


def test_kern_run_weights_builds_then_reuses(tiny_ckpt: Path, kernels_dir: Path, cache: Path, fake_runtime,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The first run builds the manifest into the cache and generates; the second finds it and says so."""
    monkeypatch.setattr(session, "probe_device", lambda gpu: 1)
    args = ["run", "--weights", str(tiny_ckpt), "--kernels", str(kernels_dir), "--no-pins", "--steps", "4",
            "--prompt", "hi"]
    first = _invoke(*args)
    assert first.exit_code == 0, first.stderr
    built = sorted((cache / "manifests").iterdir())
    assert len(built) == 1 and built[0].name.startswith("qwen3-tiny-") and built[0].suffix == ".json"
    what = f"(from {tiny_ckpt / 'config.json'}, --no-pins: prefill not batch-invariant)"
    assert first.stderr.splitlines()[0] == f"kern run: built manifest {built[0]} {what}"
    assert len(first.stdout) > 0 and len(fake_runtime) == 1
    manifest = json.loads(built[0].read_text())
    assert manifest["name"] == "qwen3-tiny" and manifest["vars"]["tokens"]["max"] == 512
    assert "cublaslt_pins" not in manifest["meta"] and "prefill_batch_invariant" not in manifest["meta"]["caller"]
    second = _invoke(*args)
    assert second.exit_code == 0, second.stderr
    assert second.stderr.splitlines()[0] == f"kern run: reused manifest {built[0]} {what}"
    assert second.stdout == first.stdout and sorted((cache / "manifests").iterdir()) == built
    bigger = _invoke(*args[:-4], "--chunk", "1024", "--steps", "1", "--prompt", "hi")  # another chunk_max: a new key
    assert bigger.exit_code == 0, bigger.stderr
    assert len(list((cache / "manifests").iterdir())) == 2


def test_the_cache_key_covers_config_kernels_options_and_pins() -> None:
    base = auto_manifest.cache_key("{}", b"k", {"chunk_max": 512}, None)
    assert len(base) == 64
    others = {auto_manifest.cache_key("{ }", b"k", {"chunk_max": 512}, None),
              auto_manifest.cache_key("{}", b"K", {"chunk_max": 512}, None),
              auto_manifest.cache_key("{}", b"k", {"chunk_max": 1024}, None),
              auto_manifest.cache_key("{}", b"k", {"chunk_max": 512}, "pins")}
    assert base not in others and len(others) == 4


def test_a_hub_snapshot_is_named_by_its_model() -> None:
    snap = Path("/c/hub/models--Qwen--Qwen3-8B/snapshots/abc123/config.json")
    assert auto_manifest.model_name(snap) == "Qwen3-8B"
    assert auto_manifest.model_name(Path("/w/qwen3-1.7b/config.json")) == "qwen3-1.7b"


def test_a_hub_snapshot_config_that_links_into_blobs_is_named_by_its_model(tmp_path: Path) -> None:
    """config.json of a hub checkout is a link into blobs/: the manifest was named "blobs"."""
    blob = tmp_path / "models--Qwen--Qwen3-8B" / "blobs" / "0f3e"
    blob.parent.mkdir(parents=True)
    blob.write_text("{}")
    snap = tmp_path / "models--Qwen--Qwen3-8B" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to(Path("..") / ".." / "blobs" / "0f3e")
    assert auto_manifest.model_name(snap / "config.json") == "Qwen3-8B"
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").symlink_to(blob)
    assert auto_manifest.model_name(tmp_path / "ckpt" / "config.json") == "ckpt"


def test_a_config_file_not_named_config_json_is_named_by_its_stem() -> None:
    assert auto_manifest.model_name(Path("tests/data/configs/Qwen3-8B.json")) == "Qwen3-8B"
    req = BuildRequest(out=Path("m.json"), config=CONFIGS / "Qwen3-8B.json")
    assert default_name(req) == "Qwen3-8B"


# ---------------------------------------------------------------- pins


def _checkpoint_dir(tmp_path: Path, name: str) -> Path:
    """A header-only checkpoint directory with the published `name` config.json."""
    ckpt = tmp_path / name
    ckpt.mkdir()
    shutil.copyfile(CONFIGS / f"{name}.json", ckpt / "config.json")
    tied = json.loads((CONFIGS / f"{name}.json").read_text())["tie_word_embeddings"]
    _header_only_checkpoint(ckpt / "model.safetensors", ["model.embed_tokens.weight"] + ([] if tied else
                                                                                          ["lm_head.weight"]))
    return ckpt


def test_committed_h200_pins_serve_the_4b_on_an_h200(tmp_path: Path, cache: Path) -> None:
    ckpt = _checkpoint_dir(tmp_path, "Qwen3-4B")
    err = tmp_path / "err.txt"
    with err.open("w") as f:
        cfg = auto_config(AutoRequest(ckpt), err=f, stamp=lambda gpu: ("NVIDIA H200", 120000))
    committed = ROOT / "manifests" / "algos" / "h200.json"
    assert err.read_text() == f"kern run: built manifest {cfg.manifest} (from {ckpt / 'config.json'}, pins " \
                              f"{committed})\n"
    manifest = json.loads(cfg.manifest.read_text())
    assert manifest["meta"]["cublaslt_pins"] == {"device": "NVIDIA H200", "cublaslt_version": 130100, "m_max": 2048}
    assert manifest["meta"]["caller"]["prefill_batch_invariant"] is True
    gemm_ops = sorted(op for op in manifest["ops"] if op.startswith("gemm_"))
    assert gemm_ops == ["gemm_19456x2560", "gemm_2560x4096", "gemm_2560x9728", "gemm_6144x2560"]
    assert cfg.kernels == kern_run.kernels_dir() == ROOT / "kernels"


def test_cached_pins_serve_only_their_gpu_and_cublaslt(tmp_path: Path, cache: Path) -> None:
    ckpt = _checkpoint_dir(tmp_path, "Qwen3-1.7B")
    algo = {"id": 66, "tile": 18, "stages": 8, "split_k": 1, "reduction": 0, "swizzle": 0, "custom": 0}
    shapes = [(2048, 2048), (2048, 6144), (4096, 2048), (12288, 2048)]
    doc = {"format": "kern-cublaslt-pins/1", "device": "NVIDIA H100 80GB HBM3", "cublaslt_version": 120805,
           "m_max": 2048, "pins": [{"n": n, "k": k, "algo": algo} for n, k in shapes]}
    path = pins_cache.pins_cache_path("NVIDIA H100 80GB HBM3", 120805)
    assert path == cache / "pins" / "nvidia-h100-80gb-hbm3-cublaslt120805.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc))
    assert pins_cache.find_pins(set(shapes), "NVIDIA H100 80GB HBM3", 120805, 512) == path
    # another cuBLASLt (the cache file is keyed by it), M past what was proven: none found, so they are picked
    # (tests/run/test_pins_first_use.py)
    assert pins_cache.find_pins(set(shapes), "NVIDIA H100 80GB HBM3", 120900, 512) is None
    assert pins_cache.find_pins(set(shapes), "NVIDIA H100 80GB HBM3", 120805, 4096) is None
    cfg = auto_config(AutoRequest(ckpt), err=open("/dev/null", "w"), stamp=lambda gpu: ("NVIDIA H100 80GB HBM3",
                                                                                        120805))
    assert json.loads(cfg.manifest.read_text())["meta"]["cublaslt_pins"]["device"] == "NVIDIA H100 80GB HBM3"


def test_manifest_build_refusal_is_a_manifest_build_error(tmp_path: Path, cache: Path) -> None:
    ckpt = tmp_path / "c"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({**json.loads((CONFIGS / "Qwen3-8B.json").read_text()),
                                                  "attention_bias": True}))
    with pytest.raises(ManifestBuildError):
        auto_config(AutoRequest(ckpt, pins=False))


# ---------------------------------------------------------------- kernels_dir


def test_kernels_dir_prefers_the_packaged_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed (kern_run/kernels/kernels.json beside the package): that directory; in the checkout: kernels/;
    neither: one line naming both places."""
    from kern_run import package_data
    from kern_run.errors import KernelsError

    assert kern_run.kernels_dir() == ROOT / "kernels"
    assert package_data.committed_pins_dir() == ROOT / "manifests" / "algos"
    site = tmp_path / "site-packages" / "kern_run"
    (site / "kernels").mkdir(parents=True)
    (site / "algos").mkdir()
    monkeypatch.setattr(package_data, "_PACKAGE", site)
    with pytest.raises(KernelsError) as exc:
        kern_run.kernels_dir()
    assert str(exc.value) == (f"no kernels directory: neither {site / 'kernels'}/kernels.json (the kern-run wheel's) "
                              "nor a kern checkout's kernels/kernels.json: pass --kernels DIR")
    (site / "kernels" / "kernels.json").write_text("{}")
    assert kern_run.kernels_dir() == site / "kernels"
    assert package_data.committed_pins_dir() == site / "algos"


# ---------------------------------------------------------------- tools/make_checkpoint.py --config


@pytest.mark.parametrize("name", SIZES)
def test_make_checkpoint_takes_every_published_config(name: str) -> None:
    from tools import make_checkpoint as mc

    assert mc.shape_from_config(CONFIGS / f"{name}.json") == qwen3.SHAPES[SIZES[name][0]]


def test_make_checkpoint_config_writes_that_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tools import make_checkpoint as mc

    small = {**json.loads((CONFIGS / "Qwen3-8B.json").read_text()), "hidden_size": 256, "intermediate_size": 512,
             "num_hidden_layers": 2, "max_window_layers": 2, "num_attention_heads": 10, "num_key_value_heads": 2,
             "vocab_size": 512}
    config = tmp_path / "config.json"
    config.write_text(json.dumps(small))
    out = tmp_path / "ckpt"
    assert mc.main(["--config", str(config), "--out", str(out), "--no-tokenizer", "--threads", "1"]) == 0
    written = json.loads((out / "config.json").read_text())
    assert {k: written[k] for k in small} == small  # GQA group 5, untied, as the file says
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert "lm_head.weight" in index["weight_map"] and len(index["weight_map"]) == 2 * 11 + 3
    bad = tmp_path / "moe.json"
    bad.write_text(json.dumps({**small, "architectures": ["Qwen3MoeForCausalLM"]}))
    capsys.readouterr()
    assert mc.main(["--config", str(bad), "--out", str(tmp_path / "x")]) == 1
    assert capsys.readouterr().err == (f"make_checkpoint: --config {bad}: architectures = ['Qwen3MoeForCausalLM'] is "
                                       "not supported: mixture-of-experts layers have no kernels (dense Qwen3 only)\n")
    assert not (tmp_path / "x").exists()


def test_the_cache_root_without_platformdirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tools/gpu-env.sh puts kern on PYTHONPATH without its dependencies: the same directory as platformdirs."""
    import sys

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for xdg in (str(tmp_path / "xdg"), "", "relative/dir"):
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
        with_platformdirs = pins_cache.cache_root()
        monkeypatch.setitem(sys.modules, "platformdirs", None)  # import platformdirs raises ImportError
        assert pins_cache.cache_root() == with_platformdirs
        monkeypatch.delitem(sys.modules, "platformdirs")
    assert with_platformdirs == tmp_path / "home" / ".cache" / "kern"
