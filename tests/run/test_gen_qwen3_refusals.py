"""Hostile inputs to the Qwen3 builder (kern_run.models.qwen3, `kern manifest build`; tools/gen_qwen3_tp.py, its
`--out-dir` wrapper) and tools/regen_manifests.py: a config.json or
kernels.json of the wrong types or ranges, head dims the attention kernels do not cover, options out of range,
pins that match nothing. One stderr line naming the file / key / option, exit 1, no traceback, nothing written
(and no earlier output touched)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from kern_manifest import ManifestError

from kern_run.files import NotRegularFileError, write_files
from kern_run.models import qwen3 as gq
from kern_run.models.qwen3 import command
from kern_run_testutil import ROOT, kern_manifest_build
from tools import gen_qwen3_tp as gtp
from tools import make_checkpoint as mc
from tools import regen_manifests as rm

KERNELS = ROOT / "kernels" / "kernels.json"
STUB = gq.KernelAbi.from_json(gq.stub_kernels_json())


def _cfg(shape: str = "tiny", **over: object) -> dict:
    return {**mc.config_json(mc.SHAPES[shape]), **over}


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The single stderr line of a refusal (no traceback), without its newline."""
    err = capsys.readouterr().err
    assert err.endswith("\n") and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err[:-1]


# ---------------------------------------------------------------- 1. head_dim limits of the attention kernels


@pytest.mark.parametrize(("head_dim", "attn", "decode", "message"), [
    # kern_attn_prefill: a multiple of 16, at most 128 (PF_MAX_D), whatever the decode attention
    (256, "split", "gemv", "head_dim 256: kern_attn_prefill needs a multiple of 16 and at most 128"),
    (256, "early", "gemm", "head_dim 256: kern_attn_prefill needs a multiple of 16 and at most 128"),
    (144, "split", "gemm", "head_dim 144: kern_attn_prefill needs a multiple of 16 and at most 128"),
    (33, "split", "gemm", "head_dim 33: kern_attn_prefill needs a multiple of 16 and at most 128"),
    (40, "wide", "gemm", "head_dim 40: kern_attn_prefill needs a multiple of 16 and at most 128"),
    # the decode partials: DEC_MAX_D 256 (split / early), 128 (wide)
    (384, "split", "gemm", "decode_attn 'split': head_dim 384 > 256 (the decode partial's limit)"),
    (272, "early", "gemm", "decode_attn 'early': head_dim 272 > 256 (the decode partial's limit)"),
    (256, "wide", "gemm", "decode_attn 'wide': head_dim 256 > 128 (kern_attn_decode_partial_wide's limit)"),
])
def test_head_dims_the_attention_kernels_do_not_cover_are_refused(head_dim: int, attn: str, decode: str,
                                                                   message: str) -> None:
    cfg = gq.Qwen3Config.from_json(_cfg(head_dim=head_dim))
    with pytest.raises(gq.ManifestBuildError) as err:
        gq.build_manifest(cfg, STUB, gq.BuildOptions("x", max_context=4096, decode_attn=attn, decode=decode))
    assert str(err.value) == message


@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_head_dims_within_the_limits_still_build(head_dim: int) -> None:
    cfg = gq.Qwen3Config.from_json(_cfg(head_dim=head_dim))
    for attn in ("split", "early", "wide"):
        m = gq.build_manifest(cfg, STUB, gq.BuildOptions("x", max_context=4096, decode_attn=attn))
        prefill = m["ops"]["attn_prefill"]["launches"][0]
        assert prefill["args"][8] == {"i32": head_dim} and m["meta"]["model"]["head_dim"] == head_dim


def test_cli_head_dim_256_split_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(_cfg(head_dim=256)))
    out = tmp_path / "m.json"
    assert kern_manifest_build(["--config", str(config), "--kernels", str(KERNELS), "--out", str(out),
                    "--decode-attn", "split"]) == 1
    assert _one_line(capsys) == "kern manifest build: head_dim 256: kern_attn_prefill needs a multiple of 16 and at most 128"
    assert not out.exists()


# ---------------------------------------------------------------- 2. --decode-split-tokens


@pytest.mark.parametrize("split_tokens", [0, -16])
def test_split_tokens_below_one_are_refused(split_tokens: int) -> None:
    cfg = gq.Qwen3Config.from_json(_cfg())
    with pytest.raises(gq.ManifestBuildError) as err:
        gq.build_manifest(cfg, STUB, gq.BuildOptions("x", max_context=4096, split_tokens=split_tokens))
    assert str(err.value) == (f"split_tokens (--decode-split-tokens) {split_tokens}: the minimum context tokens "
                              "per decode split must be >= 1")


@pytest.mark.parametrize("value", ["0", "-16"])
def test_cli_split_tokens_below_one(tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str) -> None:
    out = tmp_path / "m.json"
    assert kern_manifest_build(["--shape", "tiny", "--kernels", str(KERNELS), "--out", str(out),
                    "--decode-split-tokens", value]) == 1
    assert _one_line(capsys).startswith(f"kern manifest build: split_tokens (--decode-split-tokens) {value}: ")
    assert not out.exists()


@pytest.mark.parametrize(("opts", "message"), [
    ({"sms": 0}, "sms (--sms) 0: the target GPU's multiprocessor count must be >= 1"),
    ({"decode_splits": -2}, "decode_splits (--decode-splits) -2: use >= 1, or 0 for the automatic count"),
])
def test_other_launch_geometry_options_out_of_range(opts: dict, message: str) -> None:
    with pytest.raises(gq.ManifestBuildError) as err:
        gq.build_manifest(gq.Qwen3Config.from_json(_cfg()), STUB, gq.BuildOptions("x", max_context=4096, **opts))
    assert str(err.value) == message


# ---------------------------------------------------------------- 3. pins that match no GEMM shape


PIN = (("id", 66), ("split_k", 1))
SOURCE = (("device", "NVIDIA H200"), ("cublaslt_version", 130100), ("m_max", 2048))


def test_pins_for_another_model_are_refused() -> None:
    """tiny's GEMMs are 1024x256 (qkv, gate_up) and 256x512 (o, down); pins of the 4B shapes only apply to none."""
    cfg = gq.Qwen3Config.from_json(_cfg())
    opts = gq.BuildOptions("x", max_context=4096, algos=((6144, 2560, PIN), (9728, 2560, PIN)), algos_source=SOURCE)
    with pytest.raises(gq.ManifestBuildError) as err:
        gq.build_manifest(cfg, STUB, opts)
    assert str(err.value) == ("the cuBLASLt pins (--algos) match none of this model's GEMM shapes (256x512, "
                              "1024x256); they pin 6144x2560, 9728x2560: pick pins for this model with "
                              "tools/pick_algos.py")
    # decode pins only count where the decode program uses cuBLASLt
    only_decode = gq.BuildOptions("x", max_context=4096, decode_algos=((1024, 256, PIN),), algos_source=SOURCE)
    with pytest.raises(gq.ManifestBuildError, match=r"\(256x512, 1024x256\); the file has decode pins only"):
        gq.build_manifest(cfg, STUB, only_decode)
    m = gq.build_manifest(cfg, STUB, gq.BuildOptions("x", max_context=4096, decode="gemm", decode_algos=(
        (1024, 256, PIN),), algos_source=SOURCE))
    assert "gemm_m1_1024x256" in m["ops"] and "cublaslt_pins" not in m["meta"]


def test_pins_matching_some_shapes_keep_the_current_behaviour() -> None:
    cfg = gq.Qwen3Config.from_json(_cfg())
    opts = gq.BuildOptions("x", max_context=4096, algos=((1024, 256, PIN), (6144, 2560, PIN)), algos_source=SOURCE)
    m = gq.build_manifest(cfg, STUB, opts)
    assert m["meta"]["cublaslt_pins"] == {"device": "NVIDIA H200", "cublaslt_version": 130100, "m_max": 2048}
    assert m["ops"]["gemm_1024x256"]["launches"] == [
        {"extern": "cublaslt_bf16_tn", "algo": {"id": 66, "split_k": 1},
         "args": m["ops"]["gemm"]["launches"][0]["args"]}]
    assert "prefill_batch_invariant" not in m["meta"]["caller"]


def test_cli_pins_of_another_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps({"format": "kern-cublaslt-pins/1", "device": "NVIDIA H200",
                                "cublaslt_version": 130100, "m_max": 2048,
                                "pins": [{"n": 6144, "k": 2560, "algo": {"id": 66}}]}))
    out = tmp_path / "m.json"
    assert kern_manifest_build(["--shape", "tiny", "--kernels", str(KERNELS), "--out", str(out), "--algos", str(pins)]) == 1
    assert "match none of this model's GEMM shapes (256x512, 1024x256)" in _one_line(capsys)
    assert not out.exists()
    # the TP generator: rank shards of tiny at tp 2 are 512x256 / 256x256, decode (cuBLASLt) adds the lm_head
    assert gtp.main(["--shape", "tiny", "--kernels", str(KERNELS), "--out-dir", str(tmp_path / "tp"),
                     "--algos", str(pins), "--decode", "gemm"]) == 1
    assert "match none of this model's GEMM shapes (256x256, 512x256, 151936x256); they pin 6144x2560" in (
        _one_line(capsys))
    assert not (tmp_path / "tp").exists()


# ---------------------------------------------------------------- 4. config.json types and ranges


@pytest.mark.parametrize(("over", "message"), [
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings = 'false' must be a JSON boolean (true or false)"),
    ({"tie_word_embeddings": 0}, "tie_word_embeddings = 0 must be a JSON boolean (true or false)"),
    ({"hidden_size": 256.7}, "hidden_size = 256.7 must be a JSON integer >= 1"),
    ({"hidden_size": 256.0}, "hidden_size = 256.0 must be a JSON integer >= 1"),
    ({"hidden_size": "abc"}, "hidden_size = 'abc' must be a JSON integer >= 1"),
    ({"hidden_size": [256]}, "hidden_size = [256] must be a JSON integer >= 1"),
    ({"hidden_size": True}, "hidden_size = True must be a JSON integer >= 1"),
    ({"num_hidden_layers": 0}, "num_hidden_layers = 0 must be a JSON integer >= 1"),
    ({"num_hidden_layers": -1}, "num_hidden_layers = -1 must be a JSON integer >= 1"),
    ({"num_key_value_heads": 0}, "num_key_value_heads = 0 must be a JSON integer >= 1"),
    ({"num_attention_heads": 0}, "num_attention_heads = 0 must be a JSON integer >= 1"),
    ({"intermediate_size": None}, "intermediate_size = None must be a JSON integer >= 1"),
    ({"vocab_size": -151936}, "vocab_size = -151936 must be a JSON integer >= 1"),
    ({"max_position_embeddings": 0}, "max_position_embeddings = 0 must be a JSON integer >= 1"),
    ({"head_dim": 0}, "head_dim = 0 must be a JSON integer >= 1"),
    ({"head_dim": "128"}, "head_dim = '128' must be a JSON integer >= 1"),
    ({"rms_norm_eps": 0}, "rms_norm_eps = 0 must be a finite number > 0"),
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps = -1e-06 must be a finite number > 0"),
    ({"rms_norm_eps": "1e-6"}, "rms_norm_eps = '1e-6' must be a finite number > 0"),
    ({"rope_theta": 0}, "rope_theta = 0 must be a finite number > 0"),
    ({"rope_theta": -1.0}, "rope_theta = -1.0 must be a finite number > 0"),
    ({"rope_theta": float("nan")}, "rope_theta = nan must be a finite number > 0"),
    ({"rope_theta": float("inf")}, "rope_theta = inf must be a finite number > 0"),
    ({"rope_theta": None}, "rope_theta = None must be a finite number > 0"),
    ({"num_attention_heads": 3}, "num_attention_heads 3 is not a multiple of num_key_value_heads 2"),
])
def test_config_values_are_type_and_range_checked(over: dict, message: str) -> None:
    with pytest.raises(gq.ManifestBuildError) as err:
        gq.Qwen3Config.from_json(_cfg(**over), "models/x/config.json")
    assert str(err.value) == f"models/x/config.json: {message}"


@pytest.mark.parametrize(("key", "value", "bound"), [
    ("num_hidden_layers", 10**9, 1024), ("num_hidden_layers", 1025, 1024), ("num_attention_heads", 1025, 1024),
    ("num_key_value_heads", 2048, 1024), ("head_dim", 1040, 1024), ("hidden_size", 65537, 65536),
    ("intermediate_size", 262145, 262144), ("vocab_size", 4194305, 4194304),
    ("max_position_embeddings", 16777217, 16777216),
])
def test_config_sizes_above_their_bound_are_refused_before_building(key: str, value: int, bound: int) -> None:
    """A huge num_hidden_layers ran for minutes (1e5) or forever (1e9) before the verifier refused it."""
    with pytest.raises(gq.ManifestBuildError) as err:
        gq.Qwen3Config.from_json(_cfg(**{key: value}), "models/x/config.json")
    assert str(err.value) == (f"models/x/config.json: {key} = {value} is above {bound} (the largest this builder "
                              "accepts)")


def test_config_sizes_at_their_bounds_build_a_manifest_that_verifies() -> None:
    cfg = gq.Qwen3Config.from_json(_cfg(num_hidden_layers=1024, num_attention_heads=512, num_key_value_heads=512,
                                        head_dim=128, hidden_size=1 << 16, intermediate_size=1 << 18,
                                        vocab_size=1 << 22, max_position_embeddings=1 << 24))
    text = command.dumps(gq.build_manifest(cfg, gq.read_kernel_abi(KERNELS), gq.BuildOptions("x", max_context=4096,
                                                                                              sampler="argmax")))
    command.verify_manifest_text(text, "the largest manifest")
    # the sampler's vocabulary limit (kern_sample_bf16 writes nothing past 2^20): the default build names the flag
    with pytest.raises(gq.ManifestBuildError) as err:
        gq.build_manifest(cfg, gq.read_kernel_abi(KERNELS), gq.BuildOptions("x", max_context=4096))
    assert str(err.value) == ("sampler (--sampler) 'gpu': vocab_size 4194304 > 1048576 (the sampler's limit); use "
                              "--sampler argmax")


def test_config_shape_refusals_name_the_file() -> None:
    for doc, message in (([1, 2], "a JSON list, expected a config.json object"),
                         ("qwen3", "a JSON str, expected a config.json object"),
                         ({**_cfg(), "model_type": "llama"}, "model_type is 'llama'; Qwen3ForCausalLM has "
                                                             "model_type 'qwen3'")):
        with pytest.raises(gq.ManifestBuildError) as err:
            gq.Qwen3Config.from_json(doc, "c.json")
        assert str(err.value) == f"c.json: {message}"
    no_vocab = _cfg()
    del no_vocab["vocab_size"]
    with pytest.raises(gq.ManifestBuildError) as err:
        gq.Qwen3Config.from_json(no_vocab, "c.json")
    assert str(err.value) == "c.json lacks 'vocab_size'"
    params = _cfg(rope_parameters=[1e6])
    del params["rope_theta"]
    with pytest.raises(gq.ManifestBuildError) as err:
        gq.Qwen3Config.from_json(params, "c.json")
    assert str(err.value) == "c.json: rope_parameters = [1000000.0] must be a JSON object"
    with pytest.raises(gq.ManifestBuildError) as err:
        gq.Qwen3Config.from_json(_cfg(head_dim=None), "c.json")
    assert str(err.value) == ("c.json: head_dim is null; expected a JSON integer (transformers' Qwen3Config default, "
                              "when the key is absent, is 128)")


def test_valid_configs_keep_their_values_and_defaults() -> None:
    cfg = gq.Qwen3Config.from_json(json.loads((ROOT / "models" / "qwen3-tiny-en" / "config.json").read_text()))
    assert cfg.hidden > 0 and cfg.head_dim % 16 == 0 and isinstance(cfg.rope_theta, float)
    four_b = gq.Qwen3Config.from_json(_cfg("qwen3-4b"))
    assert four_b == gq.Qwen3Config(hidden=2560, layers=36, q_heads=32, kv_heads=8, head_dim=128, intermediate=9728,
                                    vocab=151936, tied=True, rope_theta=1e6, eps=1e-6, max_position_embeddings=40960)
    doc = _cfg(rope_parameters={"rope_theta": 5e5}, tie_word_embeddings=True, num_key_value_heads=None)
    for key in ("rope_theta", "max_position_embeddings", "head_dim", "rms_norm_eps"):
        del doc[key]
    cfg = gq.Qwen3Config.from_json(doc)
    # transformers' Qwen3Config defaults (configuration_qwen3.py): head_dim 128, max_position_embeddings 32768,
    # rms_norm_eps 1e-6; a null num_key_value_heads is num_attention_heads
    assert (cfg.head_dim, cfg.rope_theta, cfg.tied, cfg.max_position_embeddings, cfg.eps, cfg.kv_heads) == (
        128, 500000.0, True, 32768, 1e-6, 4)
    del doc["tie_word_embeddings"], doc["rope_parameters"]
    cfg = gq.Qwen3Config.from_json(doc)
    assert (cfg.tied, cfg.rope_theta) == (False, 10000.0)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size"):
        missing = _cfg()
        del missing[key]
        with pytest.raises(gq.ManifestBuildError) as err:
            gq.Qwen3Config.from_json(missing, "c.json")
        assert str(err.value) == f"c.json lacks {key!r}"


@pytest.mark.parametrize(("content", "reason"), [
    (b"\xff{}", "not UTF-8 text (byte 0xff at offset 0)"),
    (b"[1, 2]", "a JSON list, expected a config.json object"),
    (b'{"model_type": ', "not JSON (Expecting value at line 1 column 16)"),
    (json.dumps(_cfg(num_key_value_heads=0)).encode(), "num_key_value_heads = 0 must be a JSON integer >= 1"),
    (json.dumps(_cfg(hidden_size="abc")).encode(), "hidden_size = 'abc' must be a JSON integer >= 1"),
])
def test_cli_bad_config_is_one_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   content: bytes, reason: str) -> None:
    config = tmp_path / "config.json"
    config.write_bytes(content)
    out = tmp_path / "m.json"
    assert kern_manifest_build(["--config", str(config), "--kernels", str(KERNELS), "--out", str(out)]) == 1
    assert _one_line(capsys) == f"kern manifest build: {config}: {reason}"
    assert not out.exists()
    assert gtp.main(["--config", str(config), "--kernels", str(KERNELS), "--out-dir", str(tmp_path / "tp")]) == 1
    assert _one_line(capsys) == f"kern manifest build: {config}: {reason}"
    assert not (tmp_path / "tp").exists()


@pytest.mark.parametrize("value", ["0", "-5"])
def test_cli_max_context_below_one_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str) -> None:
    out = tmp_path / "m.json"
    assert kern_manifest_build(["--shape", "tiny", "--kernels", str(KERNELS), "--out", str(out), "--max-context", value]) == 1
    assert _one_line(capsys) == f"kern manifest build: --max-context {value}: positions per sequence must be >= 1"
    assert not out.exists()
    assert gtp.main(["--shape", "tiny", "--kernels", str(KERNELS), "--out-dir", str(tmp_path), "--max-context",
                     value]) == 1
    assert _one_line(capsys) == f"kern manifest build: --max-context {value}: positions per sequence must be >= 1"
    # no flag: the default (tiny: 4096)
    assert kern_manifest_build(["--shape", "tiny", "--kernels", str(KERNELS), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["meta"]["caller"]["max_context"] == 4096
    capsys.readouterr()


# ---------------------------------------------------------------- 5. kernels.json, --out


def _stub_with(mutate) -> dict:
    raw = gq.stub_kernels_json()
    mutate(raw)
    return raw


@pytest.mark.parametrize(("raw", "message"), [
    ([1], "k.json: a JSON list, expected a kernels.json object"),
    (_stub_with(lambda r: r.update(modules=[1])), "k.json: modules is a JSON list, expected an object"),
    (_stub_with(lambda r: r["modules"]["act"].pop("sha256")),
     "k.json: modules.act.sha256 is null, expected the cubin's sha256 string"),
    (_stub_with(lambda r: r["modules"]["act"].update(sha256=12)),
     "k.json: modules.act.sha256 is 12, expected the cubin's sha256 string"),
    (_stub_with(lambda r: r["modules"].update(act=7)), "k.json: modules.act is a JSON int, expected an object"),
    (_stub_with(lambda r: r["modules"]["act"].update(entries=[])), "k.json: modules.act.entries is a JSON list, "
                                                                   "expected an object"),
    (_stub_with(lambda r: r["modules"]["act"]["entries"]["kern_silu_mul"].pop("params")),
     "k.json: modules.act.entries.kern_silu_mul.params must be a list of [offset, size] integer pairs, got null"),
    (_stub_with(lambda r: r["modules"]["act"]["entries"].update(kern_silu_mul=3)),
     "k.json: modules.act.entries.kern_silu_mul.params must be a list of [offset, size] integer pairs, got null"),
    (_stub_with(lambda r: r["modules"]["act"]["entries"]["kern_silu_mul"].update(params=[[0, 8, 1]])),
     "k.json: modules.act.entries.kern_silu_mul.params must be a list of [offset, size] integer pairs, "
     "got [[0, 8, 1]]"),
    (_stub_with(lambda r: r["modules"]["act"]["entries"]["kern_silu_mul"].update(params=[["0", 8]])),
     "k.json: modules.act.entries.kern_silu_mul.params must be a list of [offset, size] integer pairs, "
     "got [[\"0\", 8]]"),
    (_stub_with(lambda r: r["modules"]["act"]["entries"]["kern_silu_mul"].update(params=[[0, 8.0]])),
     "k.json: modules.act.entries.kern_silu_mul.params must be a list of [offset, size] integer pairs, "
     "got [[0, 8.0]]"),
    (_stub_with(lambda r: r["modules"]["act"]["entries"]["kern_silu_mul"].update(params="0,8")),
     "k.json: modules.act.entries.kern_silu_mul.params must be a list of [offset, size] integer pairs, got \"0,8\""),
])
def test_malformed_kernels_json_names_the_file_and_entry(raw: object, message: str) -> None:
    with pytest.raises(gq.ManifestBuildError) as err:
        gq.KernelAbi.from_json(raw, "k.json")
    assert str(err.value) == message


def _without(entry: str) -> dict:
    """The stub kernels.json with `entry` removed from its module."""
    module = gq.KERNEL_SIGNATURES[entry][0]
    return _stub_with(lambda r: r["modules"][module]["entries"].pop(entry))


def test_an_entry_the_options_do_not_use_may_be_missing() -> None:
    """kernels.json without kern_attn_prefill_wg still builds an r32 manifest (and one without the r32 entry a wg
    one), the same bytes as with the full kernels.json; the option that needs the missing entry is refused, naming
    the file, the entry and its module."""
    cfg = gq.Qwen3Config.from_json(_cfg())
    for missing, ok, needs in (("kern_attn_prefill_wg", "r32", "wg"), ("kern_attn_prefill_r32", "wg", "r32")):
        abi = gq.KernelAbi.from_json(_without(missing), "k.json")
        assert missing not in abi.entries
        full = gq.build_manifest(cfg, gq.KernelAbi.from_json(gq.stub_kernels_json(), "k.json"),
                                 gq.BuildOptions("tiny", prefill_attn=ok))
        assert gq.build_manifest(cfg, abi, gq.BuildOptions("tiny", prefill_attn=ok)) == full
        with pytest.raises(gq.ManifestBuildError) as err:
            gq.build_manifest(cfg, abi, gq.BuildOptions("tiny", prefill_attn=needs))
        module = gq.KERNEL_SIGNATURES[missing][0]
        assert str(err.value) == (f"k.json has no entry {missing!r} (expected in module {module!r}), which these "
                                  "options use; rebuild with tools/build_kernels.py")


def test_an_entry_with_the_wrong_param_sizes_is_refused_even_unused() -> None:
    raw = _stub_with(lambda r: r["modules"]["attention_wg"]["entries"]["kern_attn_prefill_wg"].update(
        params=[[0, 8]]))
    with pytest.raises(gq.ManifestBuildError, match=r"k.json entry 'kern_attn_prefill_wg' has param sizes \[8\]"):
        gq.KernelAbi.from_json(raw, "k.json")


def test_cli_bad_kernels_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.json"
    kernels = tmp_path / "kernels.json"
    for content, reason in ((b"[1]", "a JSON list, expected a kernels.json object"),
                            (b"{", "not JSON (Expecting property name enclosed in double quotes at line 1 "
                                   "column 2)"),
                            (b"\xfe", "not UTF-8 text (byte 0xfe at offset 0)")):
        kernels.write_bytes(content)
        assert kern_manifest_build(["--shape", "tiny", "--kernels", str(kernels), "--out", str(out)]) == 1
        assert _one_line(capsys) == f"kern manifest build: {kernels}: {reason}"
    kernels.write_text(json.dumps(_stub_with(lambda r: r["modules"]["norm"].pop("sha256"))))
    assert kern_manifest_build(["--shape", "tiny", "--kernels", str(kernels), "--out", str(out)]) == 1
    assert _one_line(capsys) == f"kern manifest build: {kernels}: modules.norm.sha256 is null, expected the cubin's sha256 string"
    assert kern_manifest_build(["--shape", "tiny", "--kernels", str(tmp_path / "none.json"), "--out", str(out)]) == 1
    assert _one_line(capsys) == f"kern manifest build: {tmp_path / 'none.json'}: No such file or directory"
    assert not out.exists()


def test_cli_out_that_is_a_directory_or_below_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert kern_manifest_build(["--shape", "tiny", "--kernels", str(KERNELS), "--out", str(tmp_path)]) == 1
    assert _one_line(capsys) == f"kern manifest build: --out {tmp_path} is a directory"
    parent = tmp_path / "file"
    parent.write_text("keep")
    assert kern_manifest_build(["--shape", "tiny", "--kernels", str(KERNELS), "--out", str(parent / "m.json")]) == 1
    assert _one_line(capsys) == f"kern manifest build: --out {parent / 'm.json'}: Not a directory"
    assert parent.read_text() == "keep" and sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_write_files_refuses_a_fifo_or_a_symlink_target(tmp_path: Path) -> None:
    """A FIFO or a symbolic link is never renamed over (as root, `--out /dev/null` replaced the device)."""
    fifo, real, link = tmp_path / "pipe", tmp_path / "real.json", tmp_path / "link.json"
    os.mkfifo(fifo)
    real.write_text("old")
    link.symlink_to(real)
    with pytest.raises(NotRegularFileError) as err:
        write_files({real: "new", fifo: "x"})
    assert (err.value.filename, err.value.strerror) == (str(fifo), "is a FIFO, not a regular file; refusing to replace it")
    with pytest.raises(NotRegularFileError) as err:
        write_files({link: "new"})
    assert (err.value.filename, err.value.strerror) == (
        str(link), "is a symbolic link; refusing to replace it (give the link's target)")
    assert link.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode) and real.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "pipe", "real.json"]


def test_cli_out_that_is_a_fifo_or_a_symlink(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo, real, link = tmp_path / "pipe", tmp_path / "real.json", tmp_path / "link.json"
    os.mkfifo(fifo)
    real.write_text("old")
    link.symlink_to(real)
    assert kern_manifest_build(["--shape", "tiny", "--kernels", str(KERNELS), "--out", str(fifo)]) == 1
    assert _one_line(capsys) == f"kern manifest build: --out {fifo}: is a FIFO, not a regular file; refusing to replace it"
    assert kern_manifest_build(["--shape", "tiny", "--kernels", str(KERNELS), "--out", str(link)]) == 1
    assert _one_line(capsys) == (f"kern manifest build: --out {link}: is a symbolic link; refusing to replace it "
                                 "(give the link's target)")
    assert link.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode) and real.read_text() == "old"


def test_write_files_is_all_or_nothing(tmp_path: Path) -> None:
    first, second = tmp_path / "a.json", tmp_path / "missing" / "b.json"
    first.write_text("old")
    first.chmod(0o640)
    with pytest.raises(FileNotFoundError) as err:
        write_files({first: "new", second: "new"})
    assert err.value.filename == str(second)
    assert first.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]
    with pytest.raises(IsADirectoryError):
        write_files({first: "new", tmp_path: b"x"})
    assert first.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]
    write_files({first: "new", tmp_path / "c.json": b"\x00"})
    assert first.read_text() == "new" and (tmp_path / "c.json").read_bytes() == b"\x00"
    assert first.stat().st_mode & 0o777 == 0o640  # an existing target keeps its permissions
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "c.json"]


# ---------------------------------------------------------------- 11. TP ranks and regen: all generated, then written


def test_tp_writes_no_rank_when_a_later_rank_does_not_verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[str] = []

    def parse(text: str) -> str:
        seen.append(json.loads(text)["meta"]["tp"]["rank"])
        if len(seen) == 2:
            raise ManifestError("buffers.w_o.0: bad bind")
        return text

    monkeypatch.setattr(command, "parse_manifest", parse)
    monkeypatch.setattr(command, "verify", lambda manifest: None)
    out_dir = tmp_path / "tp"
    assert gtp.main(["--shape", "tiny", "--kernels", str(KERNELS), "--out-dir", str(out_dir)]) == 1
    assert _one_line(capsys) == "kern manifest build: rank 1's manifest does not verify: buffers.w_o.0: bad bind"
    assert seen == [0, 1] and not out_dir.exists()


def test_tp_out_dir_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "tp"
    out_dir.write_text("keep")
    assert gtp.main(["--shape", "tiny", "--kernels", str(KERNELS), "--out-dir", str(out_dir)]) == 1
    assert _one_line(capsys) == f"kern manifest build: --out {out_dir / 'tiny.json'}: Not a directory"
    assert out_dir.read_text() == "keep"


def test_tp_writes_both_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gtp.main(["--shape", "tiny", "--kernels", str(KERNELS), "--out-dir", str(tmp_path)]) == 0
    ranks = [json.loads((tmp_path / f"tiny-tp2-r{r}.json").read_text())["meta"]["tp"]["rank"] for r in (0, 1)]
    assert ranks == [0, 1] and sorted(p.name for p in tmp_path.iterdir()) == ["tiny-tp2-r0.json", "tiny-tp2-r1.json"]
    assert capsys.readouterr().out.count("kern manifest build: wrote") == 2


def test_regen_writes_nothing_when_a_later_manifest_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Pins proven up to M = 512: the first three manifests (chunk 512) generate, qwen3-4b-c2048 (chunk 2048)
    does not. Nothing of --out-dir may change."""
    pins = json.loads(rm.ALGOS.read_text())
    pins["m_max"] = 512
    small = tmp_path / "pins.json"
    small.write_text(json.dumps(pins))
    out_dir = tmp_path / "manifests"
    out_dir.mkdir()
    for fname in rm.COMMITTED:
        (out_dir / fname).write_text("old")
    assert rm.main(["--algos", str(small), "--out-dir", str(out_dir)]) == 1
    assert _one_line(capsys) == (f"regen_manifests: qwen3-4b-c2048.json: {small}: pins were checked up to M = 512, "
                                 "below --chunk-max 2048; nothing written")
    assert {p.name: p.read_text() for p in out_dir.iterdir()} == {fname: "old" for fname in rm.COMMITTED}


def test_regen_out_dir_must_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing"
    assert rm.main(["--out-dir", str(missing)]) == 1
    assert _one_line(capsys) == f"regen_manifests: --out-dir {missing} is not a directory"
    assert not missing.exists()


def test_read_json_file_refuses_json_python_cannot_decode(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(gq.ManifestBuildError, match=r"deep.json: not usable JSON \(nested too deeply\)$"):
        gq.read_json_file(deep)
    big = tmp_path / "big.json"
    big.write_text('{"vocab_size": ' + "7" * 5000 + "}")
    with pytest.raises(gq.ManifestBuildError, match=r"big.json: not usable JSON \(an integer literal has more than "
                                          rf"{sys.get_int_max_str_digits()} digits\)$"):
        gq.read_json_file(big)


# ---------------------------------------------------------------- 12. the package's own surface


def test_cli_source_flags_and_tp_decode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Exactly one of --config / --shape; a shape outside the table is named with the known ones; the TP ranks'
    GEMV decode computes one row, so --tp with --seqs-max > 1 on it is refused (it needs --decode gemm)."""
    out = tmp_path / "m.json"
    assert kern_manifest_build(["--kernels", str(KERNELS), "--out", str(out)]) == 1
    assert _one_line(capsys) == ("kern manifest build: give exactly one of --config CONFIG.JSON and --shape "
                                 "(qwen3-4b|qwen3-0.6b|qwen3-1.7b|qwen3-8b|qwen3-14b|qwen3-32b|tiny|llama3.2-1b|"
                                 "llama3.2-3b|llama3.1-8b)")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(_cfg()))
    assert kern_manifest_build(["--config", str(config), "--shape", "tiny", "--kernels", str(KERNELS),
                                "--out", str(out)]) == 1
    assert _one_line(capsys).startswith("kern manifest build: give exactly one of --config")
    assert kern_manifest_build(["--shape", "qwen3-7b", "--kernels", str(KERNELS), "--out", str(out)]) == 1
    assert _one_line(capsys) == ("kern manifest build: --shape 'qwen3-7b': not a known shape (known: qwen3-4b, "
                                 "qwen3-0.6b, qwen3-1.7b, qwen3-8b, qwen3-14b, qwen3-32b, tiny, llama3.2-1b, "
                                 "llama3.2-3b, llama3.1-8b)")
    assert kern_manifest_build(["--shape", "tiny", "--kernels", str(KERNELS), "--out", str(out), "--tp", "2",
                                "--decode", "gemv", "--gemv", "v2", "--seqs-max", "4"]) == 1
    assert _one_line(capsys) == ("kern manifest build: --tp 2 with seqs_max (--seqs-max) 4: the tensor-parallel GEMV "
                                 "decode computes one row; use --decode gemm for batched tensor-parallel decode")
    assert not out.exists() and not (tmp_path / "m-tp2-r0.json").exists()


def test_cli_tp_lm_head(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--tp-lm-head` reaches the rank manifests (default vocab: each rank binds its rows of the tied embedding
    as `lm_head`; replicated: no lm_head buffer, the decode reads `embed`); another value is refused in one line
    naming the flag, nothing written."""
    out = tmp_path / "m.json"
    base = ["--shape", "tiny", "--kernels", str(KERNELS), "--out", str(out), "--tp", "2"]
    assert kern_manifest_build(base) == 0
    capsys.readouterr()
    r1 = json.loads((tmp_path / "m-tp2-r1.json").read_text())
    V = gq.Qwen3Config.from_name("tiny").vocab
    assert r1["meta"]["tp"]["lm_head"]["split"] == "vocab"
    assert r1["buffers"]["lm_head"]["bind"][0]["rows"] == [V // 2, V]
    assert kern_manifest_build([*base, "--tp-lm-head", "replicated"]) == 0
    capsys.readouterr()
    r1 = json.loads((tmp_path / "m-tp2-r1.json").read_text())
    assert r1["meta"]["tp"]["lm_head"] == {"split": "replicated"} and "lm_head" not in r1["buffers"]
    for p in tmp_path.iterdir():
        p.unlink()
    assert kern_manifest_build([*base, "--tp-lm-head", "rows"]) == 1
    assert _one_line(capsys) == ("kern manifest build: tp_lm_head (--tp-lm-head) 'rows': one of vocab, replicated")
    assert not any(tmp_path.iterdir())


def test_cli_writes_what_build_manifest_builds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kern manifest build --kernels DIR` reads DIR/kernels.json; the file is build_manifest's dumps, byte for
    byte, and the summary line names it."""
    out = tmp_path / "sub" / "m.json"
    assert kern_manifest_build(["--shape", "tiny", "--kernels", str(KERNELS.parent), "--out", str(out),
                                "--gemv", "v2"]) == 0
    want = gq.build_manifest(gq.Qwen3Config.from_name("tiny"), gq.read_kernel_abi(KERNELS.parent),
                             gq.BuildOptions("tiny", max_context=4096, gemv="v2"),
                             gq.jsonio.sha256_text(gq.config_text(gq.SHAPES["tiny"])))
    assert out.read_text() == gq.dumps(want)
    assert capsys.readouterr().out == (f"kern manifest build: wrote {out} ({len(gq.dumps(want))} bytes, digest "
                                       f"{want['digest'][:12]}, decode 29 calls, verified)\n")


def test_pin_attributes_are_the_manifest_models() -> None:
    """The builder's copy of the cuBLASLt algo attributes is the manifest model's (kern_manifest.model.ALGO_KEYS),
    so a pin the builder accepts is one the verifier accepts."""
    from kern_manifest.model import ALGO_KEYS

    assert gq.ALGO_ATTRS == ALGO_KEYS


def test_from_name_is_the_shape_table_through_from_json() -> None:
    for name, shape in gq.SHAPES.items():
        assert gq.Qwen3Config.from_name(name) == gq.Qwen3Config.from_json(gq.config_json(shape))
    assert gq.Qwen3Config.from_name("qwen3-0.6b").q_heads == 16
