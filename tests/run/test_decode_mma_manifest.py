"""The batched decode's projections in the Qwen3 builder (kern_run.models.qwen3.mma, gemv.add_gemv_v2_ops;
docs/kernels-gemv.md "Small-M MMA entries"): with `--gemv v2 --seqs-max N` each of the five projection ops keeps its
M = 1 GEMV launch under `when: {"seqs": [1, 1]}` and adds one small-M MMA launch per token-row tile; seqs_max = 1
builds the same projection ops as the branch point did; the refusals name option, flag and value."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kern_run.models import qwen3 as gq
from kern_run.models.qwen3 import mma
from kern_run_testutil import kern_manifest_build, stub_kernels
from tools import make_checkpoint as mc

STUB = gq.KernelAbi.from_json(gq.stub_kernels_json())
OPS = ("gemv_qkv", "gemv_o", "gemv_gate_up_act", "gemv_down_act", "gemv_lm_head")
SEQS = {"expr": "seqs", "type": "i32"}


def _manifest(shape: str = "qwen3-4b", **opts: object) -> dict:
    cfg = gq.Qwen3Config.from_json(mc.config_json(mc.SHAPES[shape]))
    return gq.build_manifest(cfg, STUB, gq.BuildOptions(shape, **opts))


def _ptrs(*names: str) -> list[dict]:
    return [{"arg": n} for n in names]


# Qwen3-4B: op -> (entry kind, pointer wiring, outputs per row, k, eps?, cluster, clusters)
# clusters = min(tiles, resident): tiles = ceil(n / 16), SwiGLU ceil(inter / 8); resident 66 of 2, 30 of 4, 15 of 8
EXPECTED_4B = {
    "gemv_qkv": ("rmsnorm", ("w", "residual", "norm_w", "y"), 6144, 2560, True, 2, 66),
    "gemv_o": ("residual", ("w", "x", "residual"), 2560, 4096, False, 4, 30),
    "gemv_gate_up_act": ("rmsnorm_swiglu", ("w", "residual", "norm_w", "y"), 9728, 2560, True, 2, 66),
    "gemv_down_act": ("residual", ("w", "x", "residual"), 2560, 9728, False, 8, 15),
    "gemv_lm_head": ("rmsnorm", ("w", "residual", "norm_w", "y"), 151936, 2560, True, 2, 66),
}


def test_seqs_max_64_adds_one_mma_launch_per_tile_after_the_bs1_launch() -> None:
    km = pytest.importorskip("kern_manifest")
    m = _manifest(gemv="v2", seqs_max=64, batch_proj="mma")
    km.verify(km.parse_manifest(gq.dumps(m)))
    assert m["vars"]["seqs"] == {"min": 1, "max": 64}
    bs1 = _manifest(gemv="v2")["ops"]
    for op, (kind, ptrs, rows, k, eps, cluster, clusters) in EXPECTED_4B.items():
        first, *rest = m["ops"][op]["launches"]
        assert first == {**bs1[op]["launches"][0], "when": {"seqs": [1, 1]}}, op
        assert m["ops"][op]["args"] == bs1[op]["args"]
        assert [(l["entry"], l["when"]) for l in rest] == [
            (f"kern_mma_{kind}_m8", {"seqs": [2, 8]}), (f"kern_mma_{kind}_m16", {"seqs": [9, 16]}),
            (f"kern_mma_{kind}_m32", {"seqs": [17, 32]}), (f"kern_mma_{kind}_m64", {"seqs": [33, 64]})], op
        for launch, tile in zip(rest, (8, 16, 32, 64)):
            want_args = _ptrs(*ptrs) + [SEQS, {"i32": rows}, {"i32": k}] + ([{"f32": 1e-6}] if eps else [])
            assert launch["args"] == want_args, (op, tile)
            assert launch["module"] == "gemv_mma" and launch["block"] == [256, 1, 1] and launch["pdl"] is True
            assert launch["cluster"] == [cluster, 1, 1] and launch["grid"] == [cluster * clusters, 1, 1], (op, tile)
            # the block's X slice, ceil(ceil(k / 32) / cluster) chunks of 32 x tile rows x 2 bytes, then the round
            # partials (2 x 8 warps x 16 rows x tile f32; the norm weight's slice, smaller, shares their place)
            cpr = -(-(-(-k // 32)) // cluster)
            assert launch["shared_mem"] == cpr * 32 * tile * 2 + max(cpr * 64, 2 * 8 * 16 * tile * 4), (op, tile)
            assert launch["carveout"] == 100
    assert "gemv_mma" in m["modules"]


@pytest.mark.parametrize(("seqs_max", "ranges"), [
    (2, [(2, 2, 8)]),
    (8, [(2, 8, 8)]),
    (9, [(2, 8, 8), (9, 9, 16)]),
    (12, [(2, 8, 8), (9, 12, 16)]),
    (32, [(2, 8, 8), (9, 16, 16), (17, 32, 32)]),
    (33, [(2, 8, 8), (9, 16, 16), (17, 32, 32), (33, 33, 64)]),
])
def test_the_tiles_stop_at_seqs_max(seqs_max: int, ranges: list[tuple[int, int, int]]) -> None:
    km = pytest.importorskip("kern_manifest")
    m = _manifest("tiny", gemv="v2", seqs_max=seqs_max, batch_proj="mma")
    km.verify(km.parse_manifest(gq.dumps(m)))
    for op in OPS:
        launches = m["ops"][op]["launches"]
        assert launches[0]["when"] == {"seqs": [1, 1]}
        assert [(l["when"]["seqs"][0], l["when"]["seqs"][1], int(l["entry"].rsplit("_m", 1)[1])) for l in launches[1:]] \
            == ranges, op


# sha256 of the five projection ops (canonical JSON) built at the branch point (fc55bad, before the MMA wiring) with
# seqs_max 1, stub ABI: the bs = 1 launches are unchanged byte for byte. (The whole committed manifests are held to a
# fresh build by tests/run/test_caller_manifest.py test_committed_manifest_is_current.)
BRANCH_POINT_OPS = {
    ("qwen3-4b", False): "052d14e637dcdf4dce013f850e50069bf4a307c5907fb2e749c44bca7c9d51ec",
    ("qwen3-4b", True): "b331b3683dbefbf4d369f89ef544ae6154826ef2c95e51e89ca4eba29dd44467",
    ("qwen3-0.6b", False): "832e79f0b0496afd87f4f1941c396b4050ce53ed385bff2e75c5ad069a16f186",
    ("qwen3-0.6b", True): "6ddaf4cccdde311c8ce1171cbe124ceddf53091bc03747fc34e3271332a742c7",
    ("tiny", False): "0a44d951e3b9c3621d5b5c13357d004242c3d73c505b2b87e42fa0f66aa7cc20",
    ("tiny", True): "70d86b02163a0d196b2e420b9c43845455269432479c7e9cc924948fbe012637",
}


@pytest.mark.parametrize(("shape", "variant"), sorted(BRANCH_POINT_OPS))
def test_seqs_max_1_projection_ops_are_the_branch_point_s(shape: str, variant: bool) -> None:
    opts = {"gemv": "v2", **({"pdl": False, "sms": 114} if variant else {})}
    m = _manifest(shape, **opts)
    text = json.dumps({k: m["ops"][k] for k in OPS}, sort_keys=True, separators=(",", ":"))
    assert hashlib.sha256(text.encode()).hexdigest() == BRANCH_POINT_OPS[(shape, variant)]
    assert "gemv_mma" not in m["modules"]
    assert not any("when" in l and "seqs" in l["when"] for op in m["ops"].values() for l in op["launches"])


def test_the_rest_of_the_decode_step_is_already_per_row() -> None:
    """What the batched step relies on outside the projections: every decode op's grid and scratch scale with the
    rows (`seqs`, or `tokens`, which equals seqs in decode), the activations have `tokens` rows, logits `seqs`."""
    m = _manifest(gemv="v2", seqs_max=64)
    ops, bufs = m["ops"], m["buffers"]
    attn = ops["attn_decode"]
    assert [l["grid"][2] for l in attn["launches"][:-1]] == ["seqs", "seqs"]  # the wide and the stream partials
    assert attn["launches"][-1]["entry"] == "kern_attn_decode_reduce" and attn["launches"][-1]["grid"][1] == "seqs"
    assert all(expr.startswith("seqs * ") for expr in attn["scratch"].values())
    assert all(l["grid"][1] == "seqs" for l in ops["sample"]["launches"])  # (slices of the vocabulary, rows)
    argmax = _manifest(gemv="v2", seqs_max=64, sampler="argmax")["ops"]["argmax"]
    assert argmax["launches"][0]["grid"][1] == "seqs" and argmax["launches"][1]["grid"][0] == "seqs"
    assert all(expr.startswith("seqs * ") for expr in argmax["scratch"].values())
    assert SEQS in ops["decode_advance_packed"]["launches"][0]["args"]
    assert ops["embed"]["launches"][0]["grid"][0] == "tokens"
    assert all(l["grid"][0] == "tokens" for l in ops["qk_norm_rope_kv"]["launches"])
    for name in ("residual", "qkv", "q", "attn_out", "act"):
        assert bufs[name]["shape"][0] == "tokens", name
    assert bufs["logits"]["shape"][0] == "seqs" and bufs["next_token"]["shape"] == ["seqs"]
    assert bufs["block_table"]["shape"][0] == "seqs" and bufs["seq_lens"]["shape"] == ["seqs"]


@pytest.mark.parametrize(("opts", "needles"), [
    ({"gemv": "v2", "seqs_max": 65}, ("seqs_max (--seqs-max) 65", "'gemv'", "at most 64 rows", "--decode gemm")),
    ({"gemv": "v2", "seqs_max": 1000}, ("seqs_max (--seqs-max) 1000", "at most 64")),
    ({"seqs_max": 2}, ("seqs_max (--seqs-max) 2", "gemv (--gemv) 'v1'", "--gemv v2")),
    ({"seqs_max": 64}, ("seqs_max (--seqs-max) 64", "gemv (--gemv) 'v1'")),
    ({"gemv": "v2", "seqs_max": 0}, ("seqs_max (--seqs-max) 0", ">= 1")),
    ({"decode": "gemm", "seqs_max": -3}, ("seqs_max (--seqs-max) -3", ">= 1")),
])
def test_refusals_name_option_flag_and_value(opts: dict, needles: tuple[str, ...]) -> None:
    with pytest.raises(gq.ManifestBuildError) as err:
        _manifest(**opts)
    for needle in needles:
        assert needle in str(err.value), str(err.value)


def test_gemm_decode_keeps_any_seqs_max() -> None:
    assert _manifest(decode="gemm", seqs_max=128)["vars"]["seqs"]["max"] == 128


def test_a_tile_past_the_shared_memory_limit_is_refused() -> None:
    """Qwen3-8B's down projection (k = 12288: 384 chunks, cluster 8, 48 per rank): the m64 tile's X slice is 192 KiB,
    with the static reductions past the 227 KiB a block may have; m32 fits."""
    with pytest.raises(gq.ManifestBuildError) as err:
        _manifest("qwen3-8b", gemv="v2", seqs_max=64, batch_proj="mma")
    msg = str(err.value)
    assert "seqs_max (--seqs-max) 64" in msg and "kern_mma_residual_m64" in msg and "k = 12288" in msg, msg
    m = _manifest("qwen3-8b", gemv="v2", seqs_max=32, batch_proj="mma")
    assert m["ops"]["gemv_down_act"]["launches"][-1]["entry"] == "kern_mma_residual_m32"


def test_geometry_helpers() -> None:
    assert [mma.mma_cluster(k) for k in (8, 1280, 1312, 2560, 4096, 9728, 10240, 10272, 50000)] == \
        [1, 1, 2, 2, 4, 8, 8, 8, 8]
    assert mma.x_slice_bytes(2560, 2, 64) == 40 * 64 * 64 and mma.x_slice_bytes(520, 1, 8) == 17 * 8 * 64
    assert mma.seqs_buckets(1) == [] and mma.seqs_buckets(64)[-1] == (33, 64, 64)
    # the H200's driver: 30 clusters of 4, 15 of 8 (cuOccupancyMaxActiveClusters, docs/perf.md)
    assert [mma.resident_clusters(c, 132) for c in (1, 2, 4, 8)] == [132, 66, 30, 15]
    assert [mma.resident_clusters(c, 114) for c in (1, 2, 4, 8)] == [114, 57, 26, 13]
    assert mma.static_smem(64) + mma.SMEM_RESERVED == 1280  # cuobjdump -res-usage of kern_mma_*_m64
    assert mma.static_smem(8) + mma.SMEM_RESERVED == 1056
    assert mma.dynamic_smem(2560, 2, 64) == 40 * 64 * 64 + 65536
    assert mma.dynamic_smem(9728, 1, 8) == 304 * 8 * 64 + 19456  # the norm slice outgrows the m8 partials
    # warps per tile (gemv_mma.cu warps_per_tile): the 4B shapes on the builder's grids
    assert [mma.mma_geometry(n, k, 132, swiglu=s).warps_per_tile(k) for n, k, s in
            ((6144, 2560, False), (2560, 4096, False), (9728, 2560, True), (2560, 9728, False), (151936, 2560, False))
            ] == [1, 1, 2, 2, 1]
    assert [mma.warps_per_tile(t, 1, 17) for t in (1, 2, 100)] == [8, 4, 1] and mma.warps_per_tile(9, 1, 40) == 2
    geo = mma.mma_geometry(333, 520, 132)
    assert (geo.tiles, geo.cluster, geo.grid) == (21, 1, 21)
    geo = mma.mma_geometry(9728, 2560, 132, swiglu=True)
    assert (geo.tiles, geo.cluster, geo.grid) == (1216, 2, 132)


def test_cli_seqs_max(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kernels = stub_kernels(tmp_path / "kernels")
    out = tmp_path / "tiny.json"
    assert kern_manifest_build(["--shape", "tiny", "--gemv", "v2", "--seqs-max", "16", "--batch-proj", "mma",
                                "--kernels", str(kernels), "--out", str(out)]) == 0
    m = json.loads(out.read_text())
    assert m["vars"]["seqs"]["max"] == 16
    assert [l["entry"] for l in m["ops"]["gemv_o"]["launches"]] == [
        "kern_gemv_rows_residual", "kern_mma_residual_m8", "kern_mma_residual_m16"]
    capsys.readouterr()
    assert kern_manifest_build(["--shape", "tiny", "--seqs-max", "4", "--kernels", str(kernels),
                                "--out", str(tmp_path / "v1.json")]) != 0
    err = capsys.readouterr().err
    assert "seqs_max (--seqs-max) 4 with gemv (--gemv) 'v1'" in err and not (tmp_path / "v1.json").exists()


def test_every_mma_entry_waits_before_it_can_exit() -> None:
    """The MMA entries are PDL entries: in the committed cubin's SASS each holds an ACQBULK and no path of its
    control-flow graph reaches an EXIT without passing one (tools/sass_paths.py, as tests/run/test_decode_pdl_sass.py
    does for the committed manifests' launches; skipped without cuobjdump / nvdisasm)."""
    from kern_runtime.cuda.sass import find_cuobjdump
    from kern_run_testutil import ROOT
    from tools import sass_paths

    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump: cannot read the SASS")
    module = json.loads((ROOT / "kernels" / "kernels.json").read_text())["modules"]["gemv_mma"]
    try:
        sass = sass_paths.cubin_functions(ROOT / "kernels" / module["file"], tool)
    except sass_paths.SassPathError as exc:
        pytest.skip(f"cuobjdump -sass failed (nvdisasm missing?): {str(exc)[:200]}")
    entries = sorted(e for e in gq.KERNEL_SIGNATURES if e.startswith("kern_mma_"))
    assert len(entries) == 12 and set(entries) <= gq.PDL_ENTRIES and set(entries) == set(module["entries"])
    for entry in entries:
        body = sass[entry]
        assert any(i.op.startswith("ACQBULK") for i in body), f"{entry}: no ACQBULK"
        assert sass_paths.unwaited_exits(body) == [], f"{entry}: an EXIT reachable without the wait"


def test_seqs_max_64_cublaslt_projections_follow_the_bs1_launch() -> None:
    """The default batch_proj "cublaslt": after the bs = 1 GEMV launch (seqs [1, 1]) each op runs, at seqs [2, 64],
    the RMSNorm prologue into its scratch `normed`, the cuBLASLt GEMM (m = seqs), and for gate_up kern_silu_mul from
    scratch `gate_up` into act; o and down accumulate into the residual (beta = 1). The manifest verifies (each
    multi-launch alternative is a run of launches with one `when` box)."""
    km = pytest.importorskip("kern_manifest")
    m = _manifest(gemv="v2", seqs_max=64)
    km.verify(km.parse_manifest(gq.dumps(m)))
    bs1 = _manifest(gemv="v2")["ops"]
    two = {"seqs": [2, 64]}
    for op, kinds in (("gemv_qkv", ["kern_add_rmsnorm", "cublaslt_bf16_tn"]),
                      ("gemv_lm_head", ["kern_add_rmsnorm", "cublaslt_bf16_tn"]),
                      ("gemv_gate_up_act", ["kern_add_rmsnorm", "cublaslt_bf16_tn", "kern_silu_mul"]),
                      ("gemv_o", ["cublaslt_bf16_tn_acc"]), ("gemv_down_act", ["cublaslt_bf16_tn_acc"])):
        first, *rest = m["ops"][op]["launches"]
        assert first == {**bs1[op]["launches"][0], "when": {"seqs": [1, 1]}}, op
        assert [l.get("entry", l.get("extern")) for l in rest] == kinds, op
        assert all(l["when"] == two for l in rest), op
        gemm = next(l for l in rest if "extern" in l)
        assert gemm["args"][3] == {"expr": "seqs", "type": "i64"}, op
    qkv = m["ops"]["gemv_qkv"]
    assert qkv["scratch"] == {"normed": "seqs * 5120"}
    assert qkv["launches"][2]["args"][:3] == [{"scratch": "normed"}, {"arg": "w"}, {"arg": "y"}]
    gate_up = m["ops"]["gemv_gate_up_act"]
    assert gate_up["scratch"] == {"normed": "seqs * 5120", "gate_up": f"seqs * {2 * 9728 * 2}"}
    assert gate_up["launches"][3]["args"][:2] == [{"scratch": "gate_up"}, {"arg": "y"}]
    assert m["ops"]["gemv_o"]["launches"][1]["args"][:3] == [{"arg": "x"}, {"arg": "w"}, {"arg": "residual"}]
    assert "gemv_mma" not in m["modules"]
