"""The Qwen3 builder (kern_run.models.qwen3, `kern manifest build`) against the stub ABI (and the committed manifests against kernels/kernels.json)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from kern_run.models import qwen3 as gq
from tools import make_checkpoint as mc
from kern_run_testutil import ROOT, kern_manifest_build, make_manifest

from kern_run.preflight import check_weights, checkpoint_tensors, read_manifest
from kern_run.errors import WeightsError


def _manifest(shape: str = "qwen3-4b", tied: bool = True, **opts) -> dict:
    cfg_json = mc.config_json(mc.SHAPES[shape])
    cfg_json["tie_word_embeddings"] = tied
    abi = gq.KernelAbi.from_json(gq.stub_kernels_json())
    return gq.build_manifest(gq.Qwen3Config.from_json(cfg_json), abi, gq.BuildOptions(shape, **opts))


def test_verifies_with_kern_manifest() -> None:
    km = pytest.importorskip("kern_manifest")
    for shape in ("qwen3-4b", "tiny"):
        km.verify(km.parse_manifest(gq.dumps(_manifest(shape))))


def test_deterministic_bytes() -> None:
    assert gq.dumps(_manifest()) == gq.dumps(_manifest())
    assert gq.dumps(_manifest()) != gq.dumps(_manifest(chunk_max=256))


def _at_one_token(op: dict) -> list[dict]:
    """The launches of `op` that apply at tokens = 1 (no `when`, or a tokens range holding 1)."""
    return [l for l in op["launches"] if l.get("when", {}).get("tokens", [1, 1])[0] <= 1]


def test_decode_has_seven_launches_per_layer() -> None:
    m = _manifest()
    calls = m["programs"]["decode"]["calls"]
    assert sum(len(_at_one_token(m["ops"][c["op"]])) for c in calls) == 1 + 36 * 7 + 1 + 2 + 1
    ops = Counter(c["op"] for c in calls)
    assert ops["qk_norm_rope_kv"] == 36 and ops["attn_decode"] == 36
    assert m["meta"]["caller"]["decode_attention"] == "wide"
    # the partial reads slot_mapping (the row it reloads after its PDL wait); `split` keeps the older entries
    assert all(c["args"]["slots"] == "slot_mapping" for c in calls if c["op"] == "attn_decode")
    assert m["ops"]["attn_decode"]["launches"][0]["entry"] == "kern_attn_decode_partial_wide"
    assert _manifest(decode_attn="early")["ops"]["attn_decode"]["launches"][0]["entry"] == (
        "kern_attn_decode_partial_early")
    assert _manifest(decode_attn="split")["ops"]["attn_decode"]["launches"][0]["entry"] == "kern_attn_decode_partial"
    assert _manifest(decode_attn="split", gemv="v2")["ops"]["attn_decode"]["launches"][0]["entry"] == (
        "kern_attn_decode_partial_fast")
    rope = [c for c in calls if c["op"] == "qk_norm_rope_kv"]
    assert [c["args"]["kv"] for c in rope] == [f"kv.{i}" for i in range(36)]
    with pytest.raises(gq.ManifestBuildError, match="decode_attn"):
        _manifest(decode_attn="fused")  # the one-launch experiment, removed (docs/perf.md "Decode, fourth session")


def test_decode_gemm_path_keeps_ten_launches_per_layer() -> None:
    m = _manifest(decode="gemm")
    launches = [len(_at_one_token(m["ops"][c["op"]])) for c in m["programs"]["decode"]["calls"]]
    assert sum(launches) == 1 + 36 * 10 + 1 + 1 + 2 + 1
    assert not any(op.startswith("gemv_") for op in m["ops"])
    with pytest.raises(gq.ManifestBuildError, match="seqs"):
        _manifest(seqs_max=2)
    assert _manifest(decode="gemm", seqs_max=2)["vars"]["seqs"]["max"] == 2


def test_m1_gemv_runs_the_gemm_wiring_s_decode_projections_on_kern_gemv_rows() -> None:
    """--decode gemm --m1-gemv: the same call table as --decode gemm (ten launches per layer), each decode projection
    a `gemv_m1_<n>x<k>` op: kern_gemv_rows at tokens = 1 (rows launch shape, c = W a), cuBLASLt for the rest of the
    tokens range; prefill keeps its cuBLASLt ops."""
    km = pytest.importorskip("kern_manifest")
    m = _manifest(decode="gemm", m1_gemv=True)
    km.verify(km.parse_manifest(gq.dumps(m)))
    calls = m["programs"]["decode"]["calls"]
    gemm = _manifest(decode="gemm")["programs"]["decode"]["calls"]
    assert [c["args"] for c in calls] == [c["args"] for c in gemm]
    projections = [c for c in calls if c["op"].startswith("gemv_m1_")]
    assert len(projections) == 36 * 4 + 1
    # Qwen3-4B's qkv, o, gate_up, down and the tied lm_head
    assert {(c["args"]["n"], c["args"]["k"]) for c in projections} == {(6144, 2560), (2560, 4096), (19456, 2560),
                                                                      (2560, 9728), (151936, 2560)}
    for name in {c["op"] for c in projections}:
        gemv, rest = m["ops"][name]["launches"]
        n, k = (int(x) for x in name.removeprefix("gemv_m1_").split("x"))
        assert (gemv["entry"], gemv["when"], gemv["pdl"]) == ("kern_gemv_rows", {"tokens": [1, 1]}, True)
        assert gemv["args"] == [{"arg": "w"}, {"arg": "a"}, {"arg": "c"}, {"i32": n}, {"i32": k}]
        assert gemv["shared_mem"] == 16 * (k // 8)
        assert (rest["extern"], rest["when"]) == ("cublaslt_bf16_tn", {"tokens": [2, 512]})
    assert not any(c["op"].startswith("gemv_m1_") for c in m["programs"]["prefill"]["calls"])
    with pytest.raises(gq.ManifestBuildError, match="--m1-gemv is an option of --decode gemm"):
        _manifest(m1_gemv=True)


def test_gemv_launches_and_pdl() -> None:
    m = _manifest(sampler="argmax")
    o = m["ops"]
    assert [a["name"] for a in o["gemv_qkv"]["args"]] == ["w", "residual", "norm_w", "y"]
    qkv = o["gemv_qkv"]["launches"][0]
    assert (qkv["entry"], qkv["grid"], qkv["block"], qkv["shared_mem"], qkv["pdl"]) == (
        "kern_gemv_rmsnorm", [264, 1, 1], [512, 1, 1], 16 * 320, True)
    assert qkv["args"][4:] == [{"i32": 6144}, {"i32": 2560}, {"f32": 1e-6}]
    down = o["gemv_down"]["launches"][0]
    assert (down["entry"], down["shared_mem"], down["args"][3:]) == (
        "kern_gemv_silu_residual", 16 * 1216, [{"i32": 2560}, {"i32": 9728}])
    assert o["gemv_lm_head"]["launches"][0]["args"][4] == {"i32": 151936}
    pdl = {l["entry"] for op in o.values() for l in op["launches"] if l.get("pdl")}
    small = {"kern_embed_gather", "kern_qk_norm_rope_kv", "kern_qk_norm_rope_kv_warp", "kern_argmax_partial",
             "kern_argmax_final", "kern_decode_advance", "kern_add_rmsnorm", "kern_silu_mul"}
    assert pdl == {"kern_gemv_rmsnorm", "kern_gemv_residual", "kern_gemv_silu_residual",
                   "kern_attn_decode_partial_wide", "kern_attn_decode_reduce"} | small
    assert pdl <= gq.PDL_ENTRIES
    assert not any(l.get("pdl") for op in _manifest(pdl=False)["ops"].values() for l in op["launches"])
    no_small = {l["entry"] for op in _manifest(pdl_small=False, sampler="argmax")["ops"].values()
                for l in op["launches"] if l.get("pdl")}
    assert no_small == pdl - small
    # the sampler's launches are small ones too: PDL with pdl_small, none without (top logprobs and the load-time
    # init run outside the decode graph: never)
    sampled = {l["entry"] for op in _manifest()["ops"].values() for l in op["launches"] if l.get("pdl")}
    step_end = {"kern_sample_bf16", "kern_sample_history_append", "kern_decode_advance_packed"}
    assert sampled == (pdl - {"kern_argmax_partial", "kern_argmax_final", "kern_decode_advance"}) | step_end
    assert sampled <= gq.PDL_ENTRIES
    assert not {l["entry"] for op in _manifest(pdl_small=False)["ops"].values() for l in op["launches"]
                if l.get("pdl")} & step_end
    # decode attention: a fixed split count, one wave of blocks (8 kv heads x 16 <= 132 SMs), minimum split
    # length 64 (one partial tile at head_dim 128)
    part = o["attn_decode"]["launches"][0]
    assert part["grid"] == [8, 16, "seqs"] and part["args"][13:15] == [{"i32": 64}, {"i32": 16}]
    assert gq.decode_num_splits(gq.Qwen3Config.from_json(mc.config_json(mc.SHAPES["qwen3-4b"])),
                                gq.BuildOptions("x", sms=264)) == 32
    assert _manifest("tiny", max_context=4096)["ops"]["attn_decode"]["launches"][0]["grid"][1] == 64
    assert _manifest(decode_splits=8)["ops"]["attn_decode"]["launches"][0]["grid"][1] == 8


def test_wide_decode_attention() -> None:
    """--decode-attn wide: kern_attn_decode_partial_wide on 256 threads with the early entry's arguments (the
    slot row it reloads included), PDL; refused for head_dim > 128, the entry's limit."""
    early = _manifest(gemv="v2")["ops"]["attn_decode"]
    wide = _manifest(gemv="v2", decode_attn="wide")["ops"]["attn_decode"]
    part_e, part_w = early["launches"][0], wide["launches"][0]
    assert (part_w["entry"], part_w["block"], part_w["pdl"]) == ("kern_attn_decode_partial_wide", [256, 1, 1], True)
    assert part_w["args"] == part_e["args"] and part_w["grid"] == part_e["grid"]
    assert wide["launches"][1] == early["launches"][1] and wide["args"] == early["args"]
    cfg = gq.Qwen3Config.from_json({**mc.config_json(mc.SHAPES["qwen3-4b"]), "head_dim": 256})
    with pytest.raises(gq.ManifestBuildError, match="head_dim 256 > 128"):
        gq.build_manifest(cfg, gq.KernelAbi.from_json(gq.stub_kernels_json()), gq.BuildOptions("x", decode_attn="wide"))


def test_carveout_on_every_kernel_launch() -> None:
    """`carveout` (default 100) on every kernel launch of the manifest, prefill and decode alike (one value per
    function, as kern_manifest requires); None writes none; out of 0..100 is refused."""
    for opts in ({}, {"gemv": "v2"}, {"decode": "gemm"}):
        m = _manifest(**opts)
        kernel_launches = [l for op in m["ops"].values() for l in op["launches"] if "entry" in l]
        assert kernel_launches and all(l["carveout"] == 100 for l in kernel_launches), opts
        assert not any("carveout" in l for op in m["ops"].values() for l in op["launches"] if "extern" in l)
    plain = _manifest(carveout=None)
    assert not any("carveout" in l for op in plain["ops"].values() for l in op["launches"])
    km = pytest.importorskip("kern_manifest")
    km.verify(km.parse_manifest(gq.dumps(_manifest(gemv="v2", carveout=50))))
    with pytest.raises(gq.ManifestBuildError, match=re.escape("carveout (--carveout) 101")):
        _manifest(carveout=101)


# (op, entry, index of num_pages among the kernel's parameters; the one before it is bt_stride, 2560, except for
# the rope, whose previous parameter is max_pos, 40960)
NUM_PAGES_AT = {"kern_attn_decode_partial": 11, "kern_attn_decode_partial_fast": 11, "kern_attn_prefill": 11,
                "kern_attn_prefill_r32": 11, "kern_attn_prefill_wg": 11,
                "kern_attn_decode_partial_early": 12, "kern_attn_decode_partial_wide": 12, "kern_qk_norm_rope_kv": 14}


@pytest.mark.parametrize("opts", [{}, {"gemv": "v2"}, {"decode": "gemm"}, {"decode_attn": "split"},
                                  {"decode_attn": "split", "gemv": "v2"}, {"decode_attn": "early"},
                                  {"prefill_attn": "r16"}, {"prefill_attn": "r32"}])
def test_attention_bounds_page_ids_by_the_pages_of_its_layer_state(opts: dict) -> None:
    """Every attention and K/V-writing launch takes `num_pages` from its call's {"pages_of": "kv.<layer>"}: the
    bound of the page ids it reads and (rope) of the slots it writes."""
    m = _manifest(**opts)
    attn = opts.get("decode_attn", "wide")
    partial = {"wide": "kern_attn_decode_partial_wide", "early": "kern_attn_decode_partial_early",
               "split": "kern_attn_decode_partial_fast"
               if opts.get("gemv") == "v2" else "kern_attn_decode_partial"}[attn]
    decode_ops = (("qk_norm_rope_kv", "kern_qk_norm_rope_kv"), ("attn_decode", partial))
    prefill = gq.PREFILL_ATTN[opts.get("prefill_attn", "wg")][0]
    for op, entry in (*decode_ops, ("attn_prefill", prefill), ("qk_norm_rope_kv", "kern_qk_norm_rope_kv")):
        index = NUM_PAGES_AT[entry]
        assert {"name": "num_pages", "kind": "int"} in m["ops"][op]["args"]
        launch = m["ops"][op]["launches"][0]
        assert launch["entry"] == entry
        before = {"i32": 40960} if entry == "kern_qk_norm_rope_kv" else {"i32": 2560}
        assert launch["args"][index - 1:index + 1] == [before, {"arg": "num_pages", "type": "i32"}]
        assert gq.KERNEL_SIGNATURES[entry][1][index] == "i32"
    progs = [("decode", op) for op, _ in decode_ops] + [("prefill", "attn_prefill"), ("prefill", "qk_norm_rope_kv")]
    for prog, op in progs:
        calls = [c for c in m["programs"][prog]["calls"] if c["op"] == op]
        assert len(calls) == (35 if op == "attn_prefill" else 36)
        assert all(c["args"]["num_pages"] == {"pages_of": c["args"]["kv"]} for c in calls)
        assert [c["args"]["kv"] for c in calls] == [f"kv.{i}" for i in range(len(calls))]


@pytest.mark.parametrize("prefill_attn", ["auto", "wg", "r32", "r16"])
def test_prefill_attention_launch_shape(prefill_attn: str) -> None:
    """The prefill attention launch: wg (the default, "auto" at head_dim 128) covers 32 query rows per grid.x step
    with 384 threads (a producer and two consumer warpgroups) and 169,024 bytes of dynamic shared memory (4 ring
    stages of (K, V) tiles of 64 rows x 256 bytes, 128 staged Q rows x 256 bytes, 4 address tables of 64 x 8
    bytes, 2 x 4 mbarriers of 8 bytes, 256 x 8 bytes of sink and 1 KiB of alignment slack); r32 32 rows with its
    105,472 bytes (sizeof(PrefillSmemR32): 128 Q rows + 2 x (K, V) tiles of 64 rows at 272 bytes, 1 KiB of row
    tables); r16 16 rows and static shared memory only."""
    m = _manifest(**({} if prefill_attn == "auto" else {"prefill_attn": prefill_attn}))
    (launch,) = m["ops"]["attn_prefill"]["launches"]
    name = "wg" if prefill_attn == "auto" else prefill_attn
    rows, smem, threads = {"wg": (32, 8 * 64 * 256 + 128 * 256 + 4 * 64 * 8 + 8 * 8 + 256 * 8 + 1024, 384),
                           "r32": (32, 128 * 272 + 4 * 64 * 272 + 2 * 64 * 8, 128), "r16": (16, 0, 128)}[name]
    assert launch["entry"] == gq.PREFILL_ATTN[name][0]
    assert launch["grid"][0] == f"cdiv(tokens, {rows})"
    assert launch["block"] == [threads, 1, 1]
    assert launch["shared_mem"] == smem
    assert m["meta"]["caller"]["prefill_attention"] == name


@pytest.mark.parametrize(("q_heads", "kv_heads", "scale"), [(2, 2, 4), (4, 2, 2), (8, 2, 1), (6, 2, 1), (16, 2, 1)])
@pytest.mark.parametrize("prefill_attn", ["wg", "r32", "r16"])
def test_prefill_attention_grid_follows_the_group(q_heads: int, kv_heads: int, scale: int, prefill_attn: str) -> None:
    """A block of every prefill entry covers 4 / hpb times the rows it covers at a GQA group of 4 (hpb = the group
    when it divides 4, else 4 heads per pass): groups 1 and 2 launch a quarter and a half of the blocks that a
    group of 4 would (before, their extra blocks only exited), groups 3 and 8 as many."""
    cfg_json = {**mc.config_json(mc.SHAPES["tiny"]), "num_attention_heads": q_heads, "num_key_value_heads": kv_heads,
                "head_dim": 128}
    m = gq.build_manifest(gq.Qwen3Config.from_json(cfg_json), gq.KernelAbi.from_json(gq.stub_kernels_json()),
                          gq.BuildOptions("tiny", prefill_attn=prefill_attn))
    (launch,) = m["ops"]["attn_prefill"]["launches"]
    rows = gq.PREFILL_ATTN[prefill_attn][1]
    assert launch["grid"] == [f"cdiv(tokens, {rows * scale})", kv_heads, "seqs"]


def test_committed_manifests_launch_the_prefill_attention_per_group() -> None:
    """qwen3-0.6b and the tiny shape (16 / 8 and 4 / 2 heads: groups of 2) cover 64 rows per wg block; the 4B and
    tiny-en (groups of 4) 32."""
    want = {"qwen3-0.6b": 64, "qwen3-tiny": 64, "qwen3-tiny-v2": 64, "qwen3-4b": 32, "qwen3-4b-v2": 32,
            "qwen3-4b-c2048": 32, "qwen3-tiny-en": 32, "qwen3-tiny-en-gemm": 32}
    for name, rows in want.items():
        m = json.loads((ROOT / "manifests" / f"{name}.json").read_text())
        (launch,) = m["ops"]["attn_prefill"]["launches"]
        assert (launch["entry"], launch["grid"][0]) == ("kern_attn_prefill_wg", f"cdiv(tokens, {rows})"), name


def test_prefill_attention_auto_keeps_r32_where_wg_has_no_width() -> None:
    """head_dim 96 (a multiple of 16, not one kern_attn_prefill_wg is compiled for): "auto" picks r32, and asking
    for wg is refused with the reason."""
    cfg_json = {**mc.config_json(mc.SHAPES["tiny"]), "head_dim": 96}
    cfg = gq.Qwen3Config.from_json(cfg_json)
    abi = gq.KernelAbi.from_json(gq.stub_kernels_json())
    m = gq.build_manifest(cfg, abi, gq.BuildOptions("tiny"))
    assert m["ops"]["attn_prefill"]["launches"][0]["entry"] == "kern_attn_prefill_r32"
    assert m["meta"]["caller"]["prefill_attention"] == "r32"
    with pytest.raises(gq.ManifestBuildError, match="head_dim 96 is not one of"):
        gq.build_manifest(cfg, abi, gq.BuildOptions("tiny", prefill_attn="wg"))


def test_decode_advance_and_ring() -> None:
    m = _manifest(sampler="argmax")
    adv = m["ops"]["decode_advance"]["launches"][0]
    assert (adv["module"], adv["entry"], adv["grid"], adv["block"]) == ("step", "kern_decode_advance", [1, 1, 1],
                                                                       [32, 1, 1])
    assert adv["args"][7:] == [{"expr": "seqs", "type": "i32"}, {"i32": 16}, {"i32": 2560}, {"i32": 40960},
                               {"i32": 64}]
    assert m["buffers"]["token_ring"] == {"kind": "output", "dtype": "i64", "shape": ["seqs", 64], "placement": "host"}
    assert m["meta"]["caller"]["decode_advance"] == {"ring": "token_ring", "ring_len": 64}
    assert m["programs"]["decode"]["calls"][-1] == {"op": "decode_advance", "args": {
        "next_token": "next_token", "token_ids": "token_ids", "positions": "positions", "seq_lens": "seq_lens",
        "slot_mapping": "slot_mapping", "block_table": "block_table", "ring": "token_ring"}}


def test_gemv_refuses_unaligned_k() -> None:
    cfg_json = mc.config_json(mc.SHAPES["tiny"])
    cfg_json["intermediate_size"] = 500
    cfg = gq.Qwen3Config.from_json(cfg_json)
    abi = gq.KernelAbi.from_json(gq.stub_kernels_json())
    with pytest.raises(gq.ManifestBuildError, match="multiple of 8"):
        gq.build_manifest(cfg, abi, gq.BuildOptions("x", max_context=4096))
    gq.build_manifest(cfg, abi, gq.BuildOptions("x", max_context=4096, decode="gemm"))


def test_prefill_fills_kv_only() -> None:
    m = _manifest()
    calls = m["programs"]["prefill"]["calls"]
    assert not any(c["op"] in ("argmax", "attn_decode") for c in calls)
    assert not any(c["args"].get("c") == "logits" for c in calls)
    assert calls[-1]["op"] == "qk_norm_rope_kv" and calls[-1]["args"]["kv"] == "kv.35"
    assert sum(c["op"] == "attn_prefill" for c in calls) == 35
    assert "graph" not in m["programs"]["prefill"]


def test_buffers_binds_states() -> None:
    m = _manifest()
    b = m["buffers"]
    assert b["w_qkv.3"]["shape"] == [4096 + 2 * 1024, 2560]
    assert [s["tensor"] for s in b["w_qkv.3"]["bind"]] == [
        f"model.layers.3.self_attn.{x}_proj.weight" for x in "qkv"]
    assert [s["tensor"] for s in b["w_gate_up.0"]["bind"]] == [
        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"]
    assert b["rope"] == {"kind": "weight", "dtype": "f32", "shape": [40960, 128], "bind": [{"derived": True}]}
    assert b["block_table"]["shape"] == ["seqs", 2560] and b["next_token"]["dtype"] == "i64"
    assert "lm_head" not in b
    lm = [c for c in m["programs"]["decode"]["calls"] if c["args"].get("y") == "logits"]
    assert lm == [{"op": "gemv_lm_head", "args": {"w": "embed", "residual": "residual", "norm_w": "final_norm",
                                                  "y": "logits"}}]
    lm = [c for c in _manifest(decode="gemm")["programs"]["decode"]["calls"] if c["args"].get("c") == "logits"]
    assert lm == [{"op": "gemm", "args": {"a": "normed", "w": "embed", "c": "logits", "m": "seqs", "n": 151936,
                                          "k": 2560}}]
    assert m["states"]["kv.0"] == {"kind": "paged", "bytes_per_token": 2 * 8 * 128 * 2, "page_tokens": 16}
    # one KV state per layer, and the sampler's work area (a fixed state: the rows' tickets start at zero)
    assert len(m["states"]) == 37 and m["states"]["sample_work"]["kind"] == "fixed"


def test_untied_binds_lm_head() -> None:
    m = _manifest(tied=False)
    assert m["buffers"]["lm_head"]["bind"] == [{"tensor": "lm_head.weight"}]
    lm = [c for c in m["programs"]["decode"]["calls"] if c["args"].get("y") == "logits"]
    assert lm[0]["args"]["w"] == "lm_head"


def test_abi_mismatch_is_refused() -> None:
    raw = gq.stub_kernels_json()
    raw["modules"]["norm"]["entries"]["kern_add_rmsnorm"]["params"][4] = [32, 8]
    with pytest.raises(gq.ManifestBuildError, match="kern_add_rmsnorm"):
        gq.KernelAbi.from_json(raw)
    raw = gq.stub_kernels_json()
    del raw["modules"]["argmax"]["entries"]["kern_argmax_final"]  # every argmax manifest uses it: refused at its launch
    abi = gq.KernelAbi.from_json(raw)
    cfg = gq.Qwen3Config.from_json(mc.config_json(mc.SHAPES["tiny"]))
    with pytest.raises(gq.ManifestBuildError, match="kern_argmax_final"):
        gq.build_manifest(cfg, abi, gq.BuildOptions("tiny", sampler="argmax"))
    gq.build_manifest(cfg, abi, gq.BuildOptions("tiny"))  # the sampler's decode never launches it


def test_params_come_from_kernels_json() -> None:
    raw = gq.stub_kernels_json()
    raw["modules"]["act"]["entries"]["kern_silu_mul"]["params"] = [[0, 8], [16, 8], [32, 4], [40, 4]]
    m = gq.build_manifest(gq.Qwen3Config.from_json(mc.config_json(mc.SHAPES["tiny"])), gq.KernelAbi.from_json(raw),
                          gq.BuildOptions("tiny", max_context=4096))
    assert m["ops"]["silu_mul"]["launches"][0]["params"] == [[0, 8], [16, 8], [32, 4], [40, 4]]


def test_runtime_loads_the_generated_manifest() -> None:
    runtime = pytest.importorskip("kern_runtime.runtime")
    raw = _manifest("tiny", max_context=4096)
    spec = runtime.load_spec(raw)
    assert spec.digest == raw["digest"]
    assert spec.programs["decode"].num_calls(spec) == len(raw["programs"]["decode"]["calls"])


def test_manifest_matches_checkpoint(tiny_ckpt: Path, tiny_manifest: Path, tmp_path: Path, kernels_dir: Path) -> None:
    facts = read_manifest(tiny_manifest)
    tensors = checkpoint_tensors(tiny_ckpt)
    check_weights(facts, tensors, tiny_ckpt)
    wrong = read_manifest(make_manifest(tmp_path / "m.json", kernels_dir, shape="qwen3-0.6b", max_context=1024))
    with pytest.raises(WeightsError, match="shape"):
        check_weights(wrong, tensors, tiny_ckpt)


def test_cli_writes_and_rejects(tmp_path: Path, kernels_dir: Path) -> None:
    out = tmp_path / "m.json"
    assert kern_manifest_build(["--shape", "tiny", "--kernels", str(kernels_dir), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["vars"]["tokens"] == {"min": 1, "max": 512}
    bad = tmp_path / "cfg.json"
    bad.write_text(json.dumps({**mc.config_json(mc.SHAPES["tiny"]), "model_type": "llama"}))
    assert kern_manifest_build(["--config", str(bad), "--kernels", str(kernels_dir), "--out", str(out)]) == 1


from tools import regen_manifests as rm

COMMITTED = rm.COMMITTED
# every page-bounded entry of the committed manifests -> the index of its num_pages argument
PAGE_BOUND_AT = {**NUM_PAGES_AT, "kern_attn_decode_partial_stream": 12, "kern_qk_norm_rope_kv_warp": 14}


def test_every_committed_manifest_is_checked() -> None:
    assert sorted(p.name for p in (ROOT / "manifests").glob("*.json")) == sorted(COMMITTED)


@pytest.mark.parametrize("fname", sorted(COMMITTED))
def test_committed_manifest_is_current(fname: str) -> None:
    """manifests/*.json must be what the builder makes from the current kernels/kernels.json, byte for byte."""
    committed = ROOT / "manifests" / fname
    (text,) = gq.build_texts(rm.request(fname, ROOT / "kernels", rm.ALGOS)).values()
    assert text == committed.read_text(), "regenerate: python tools/regen_manifests.py"


@pytest.mark.parametrize("fname", sorted(COMMITTED))
def test_runtime_compiles_every_call(fname: str) -> None:
    """The runtime's (pure) record compiler accepts every call of the committed manifests at fake addresses,
    and the decode step reads only tokens and seqs (its graph key)."""
    records = pytest.importorskip("kern_runtime.program.records")
    from kern_runtime import load_spec

    path = ROOT / "manifests" / fname
    spec = load_spec(json.loads(path.read_text()))
    targets = {name: 0x10000 * (i + 1) for i, name in enumerate([*spec.buffers, *spec.states])}
    scratch = {(op.name, s): 0x7000_0000 + 0x1000 * i for i, op in enumerate(spec.ops.values()) for s in op.scratch}
    pages = {name: 1000 + i for i, (name, st) in enumerate(spec.states.items()) if st.kind == "paged"}
    book = records.AddressBook(targets, scratch, pages=pages)
    for pname in ("load", "prefill", "decode"):
        recs, _ = records.compile_program(spec, pname, book, lambda op, li: None)
        for rec in recs:
            rec.patch({"tokens": 1, "seqs": 1})
        if pname == "decode":
            assert records.program_reads(recs) == {"tokens", "seqs"}  # pages_of adds no var to the key
            assert len(recs) == sum(len(spec.ops[c.op].launches) for c in spec.programs[pname].calls)
        # each attention launch stages its own layer's page count after bt_stride, once, at compile
        attn = [r for r in recs if getattr(r.launch, "entry", "") in PAGE_BOUND_AT]
        assert len(attn) == sum(sum(getattr(launch, "entry", "") in PAGE_BOUND_AT for launch in spec.ops[c.op].launches)
                                for c in spec.programs[pname].flat_calls(spec))
        assert len(attn) >= sum({"attn_decode": 1, "attn_prefill": 1, "qk_norm_rope_kv": 1}.get(
            c.op, 0) for c in spec.programs[pname].flat_calls(spec))
        for r in attn:
            layer_state = spec.programs[pname].flat_calls(spec)[r.call_index].args["kv"].name
            index = PAGE_BOUND_AT[r.launch.entry]
            assert r.params.read(index) == pages[layer_state].to_bytes(4, "little")
            assert index not in [i for i, _ in r.dynamic]


# ---------------------------------------------------------------- --algos: batch-invariant prefill pins

PIN = {"id": 66, "tile": 20, "stages": 12, "split_k": 1, "swizzle": 1}
PIN_M1 = {"id": 21, "tile": 18, "stages": 8, "split_k": 4, "reduction": 1}


def _pins_file(tmp_path: Path, shapes: list[tuple[int, int]], m_max: int = 2048, fmt: str = "kern-cublaslt-pins/1",
               decode: list[tuple[int, int]] = ()) -> Path:
    doc = {"format": fmt, "device": "NVIDIA H200", "cublaslt_version": 130100, "m_max": m_max,
           "pins": [{"n": n, "k": k, "algo": PIN, "us_max": 1.0} for n, k in shapes],
           "decode_pins": [{"n": n, "k": k, "algo": PIN_M1, "us_1": 1.0} for n, k in decode]}
    path = tmp_path / "pins.json"
    path.write_text(json.dumps(doc))
    return path


def test_algos_pin_every_prefill_projection_and_mark_the_manifest_batch_invariant(tmp_path: Path) -> None:
    # qwen3-4b: qkv 6144 x 2560, o 2560 x 4096, gate_up 19456 x 2560, down 2560 x 9728
    shapes = [(6144, 2560), (2560, 4096), (19456, 2560), (2560, 9728)]
    algos, _, source = gq.load_algos(_pins_file(tmp_path, shapes), chunk_max=512)
    m = _manifest(algos=algos, algos_source=source)
    prefill_ops = Counter(c["op"] for c in m["programs"]["prefill"]["calls"] if c["op"].startswith("gemm"))
    assert prefill_ops == {"gemm_6144x2560": 36, "gemm_2560x4096": 35, "gemm_19456x2560": 35, "gemm_2560x9728": 35}
    for n, k in shapes:
        (launch,) = m["ops"][f"gemm_{n}x{k}"]["launches"]
        assert launch["extern"] == "cublaslt_bf16_tn" and launch["algo"] == PIN
    assert "gemm" not in m["ops"]  # nothing left on the heuristic
    assert m["meta"]["caller"]["prefill_batch_invariant"] is True
    assert m["meta"]["cublaslt_pins"] == {"device": "NVIDIA H200", "cublaslt_version": 130100, "m_max": 2048}
    km = pytest.importorskip("kern_manifest")
    km.verify(km.parse_manifest(gq.dumps(m)))


def test_partial_pins_leave_the_rest_on_the_heuristic_and_are_not_batch_invariant(tmp_path: Path) -> None:
    algos, _, source = gq.load_algos(_pins_file(tmp_path, [(6144, 2560)]), chunk_max=512)
    m = _manifest(algos=algos, algos_source=source)
    ops = {c["op"] for c in m["programs"]["prefill"]["calls"] if c["op"].startswith("gemm")}
    assert ops == {"gemm_6144x2560", "gemm"}
    assert "algo" not in m["ops"]["gemm"]["launches"][0]
    assert "prefill_batch_invariant" not in m["meta"]["caller"]


@pytest.mark.parametrize("mutate, match", [
    (lambda p: _pins_file(p, [(1, 2)], fmt="other/1"), "format 'other/1'"),
    (lambda p: _pins_file(p, [(1, 2)], m_max=256), "below --chunk-max 512"),
    (lambda p: (p / "pins.json").write_text('{"format": "kern-cublaslt-pins/1", "m_max": 4096}') and p / "pins.json",
     "not a pins file"),
])
def test_load_algos_refusals(tmp_path: Path, mutate, match: str) -> None:
    with pytest.raises(gq.ManifestBuildError, match=match):
        gq.load_algos(mutate(tmp_path), chunk_max=512)


def test_gen_main_with_algos_writes_pinned_manifest(tmp_path: Path) -> None:
    pins = _pins_file(tmp_path, [(1024, 256), (256, 512)])  # tiny: qkv and gate_up are 1024x256, o and down 256x512
    out = tmp_path / "m.json"
    assert kern_manifest_build(["--shape", "tiny", "--kernels", str(ROOT / "kernels"), "--out", str(out),
                                "--algos", str(pins)]) == 0
    m = json.loads(out.read_text())
    assert m["meta"]["caller"]["prefill_batch_invariant"] is True
    assert read_manifest(out).prefill_batch_invariant


def test_decode_gemm_projections_take_their_own_m1_pins_never_a_prefill_pin(tmp_path: Path) -> None:
    shapes = [(6144, 2560), (2560, 4096), (19456, 2560), (2560, 9728)]
    algos, decode_algos, source = gq.load_algos(_pins_file(tmp_path, shapes, decode=shapes[:2]), chunk_max=512)
    m = _manifest(decode="gemm", algos=algos, decode_algos=decode_algos, algos_source=source)
    decode_ops = Counter(c["op"] for c in m["programs"]["decode"]["calls"] if c["op"].startswith("gemm"))
    # qkv and o pinned at M = 1; gate_up, down and the lm_head on the heuristic (op `gemm`, no algo)
    assert decode_ops == {"gemm_m1_6144x2560": 36, "gemm_m1_2560x4096": 36, "gemm": 36 * 2 + 1}
    pinned, rest = m["ops"]["gemm_m1_6144x2560"]["launches"]
    assert pinned["algo"] == PIN_M1 and pinned["when"] == {"tokens": [1, 1]}  # checked at load at M = 1 only
    assert "algo" not in rest and rest["when"] == {"tokens": [2, 512]}
    assert "algo" not in m["ops"]["gemm"]["launches"][0]
    prefill_ops = {c["op"] for c in m["programs"]["prefill"]["calls"] if c["op"].startswith("gemm")}
    assert prefill_ops == {f"gemm_{n}x{k}" for n, k in shapes}




@pytest.mark.parametrize(("opts", "warp"), [({}, True), ({"prefill_rope": "block"}, False), ({"chunk_max": 1}, False),
                                            ({"chunk_max": 2}, True), ({"shape": "tiny"}, None)])
def test_prefill_rope_launches(opts: dict, warp: bool | None) -> None:
    """qk_norm_rope_kv: the block entry at one token (decode keeps it), the warp entry (16 heads per 256-thread
    block at head_dim 128) for 2..chunk_max tokens, as one `when`-group; --prefill-rope block or chunk_max 1: the block entry
    alone. The tiny shape's head_dim decides for itself (warp when a multiple of 64). meta.caller.prefill_rope
    names the entry used, not the option asked for."""
    shape = opts.pop("shape", "qwen3-4b")
    m = _manifest(shape=shape, **opts)
    launches = m["ops"]["qk_norm_rope_kv"]["launches"]
    if warp is None:
        d = m["meta"]["model"]["head_dim"]
        warp = d % 64 == 0 and d <= 256
    assert m["meta"]["caller"]["prefill_rope"] == ("warp" if warp else "block")
    if not warp:
        assert [(l["entry"], "when" in l) for l in launches] == [("kern_qk_norm_rope_kv", False)]
        return
    block, per_warp = launches
    heads = m["meta"]["model"]["q_heads"] + m["meta"]["model"]["kv_heads"]
    assert (block["entry"], block["when"], block["grid"]) == ("kern_qk_norm_rope_kv", {"tokens": [1, 1]},
                                                              ["tokens", heads, 1])
    assert (per_warp["entry"], per_warp["when"], per_warp["grid"], per_warp["block"]) == (
        "kern_qk_norm_rope_kv_warp", {"tokens": [2, m["vars"]["tokens"]["max"]]},
        ["tokens", -(-heads // gq.rope_warp_heads(m["meta"]["model"]["head_dim"])), 1],
        [256, 1, 1])
    assert per_warp["args"] == block["args"]
    km = pytest.importorskip("kern_manifest")
    km.verify(km.parse_manifest(gq.dumps(m)))
