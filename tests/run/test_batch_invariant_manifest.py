"""`kern manifest build --batch-invariant` (docs/caller.md "Batch-invariant decode"): the decode program runs the
same launches at every bucket, 1 included, with only the row counts (`tokens` / `seqs` expressions) changing;
the projections on pinned cuBLASLt algorithms, the decode rows' layer projections on the prefill ops themselves.
Checked on the built JSON and on the committed manifests; the fast manifests serve as the negative control."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kern_run.models import qwen3 as gq
from tools import make_checkpoint as mc
from tools import regen_manifests as rm

ROOT = Path(__file__).resolve().parents[2]
STUB = gq.KernelAbi.from_json(gq.stub_kernels_json())
BUCKETS = (1, 2, 4, 8, 16, 32, 64)
TINY_EN = gq.Qwen3Config.from_json(json.loads((ROOT / "models" / "qwen3-tiny-en" / "config.json").read_text()))
PIN = {"id": 66, "tile": 20, "stages": 35, "split_k": 1}
PIN_SPLIT = {"id": 66, "tile": 393, "stages": 35, "split_k": 3, "reduction": 2}


def decode_launches(manifest: dict[str, Any], bucket: int) -> list[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    """(op, call args, the launches whose `when` holds) of every decode call at tokens = seqs = `bucket`: what the
    runtime issues for that bucket (expressions left unevaluated, so they compare equal across buckets)."""
    env = {"tokens": bucket, "seqs": bucket}
    out = []
    for call in manifest["programs"]["decode"]["calls"]:
        op = manifest["ops"][call["op"]]
        picked = [launch for launch in op["launches"]
                  if all(lo <= env[var] <= hi for var, (lo, hi) in launch.get("when", {}).items())]
        out.append((call["op"], call["args"], picked))
    return out


def differing_buckets(manifest: dict[str, Any]) -> list[int]:
    """The buckets up to the seqs max whose decode launches differ from bucket 1's."""
    top = manifest["vars"]["seqs"]["max"]
    one = decode_launches(manifest, 1)
    return [b for b in BUCKETS if b <= top and decode_launches(manifest, b) != one]


def _pins(tmp_path: Path, cfg: gq.Qwen3Config, lm_head: dict[str, int] | None = PIN,
          lm_head_in: str = "decode_pins", invariant_decode: dict[tuple[int, int], dict[str, int]] | None = None,
          inv_m_max: int = 64) -> Path:
    """A pins file pinning cfg's four prefill shapes (and its lm_head in `lm_head_in`, None: not at all), and the
    shapes of `invariant_decode` in invariant_decode_pins (proven up to `inv_m_max`)."""
    H, I, D = cfg.hidden, cfg.intermediate, cfg.head_dim
    shapes = [((cfg.q_heads + 2 * cfg.kv_heads) * D, H), (H, cfg.q_heads * D), (2 * I, H), (H, I)]
    doc: dict[str, Any] = {"format": "kern-cublaslt-pins/1", "device": "NVIDIA H200", "cublaslt_version": 130100,
                           "m_max": 2048, "pins": [{"n": n, "k": k, "algo": PIN} for n, k in shapes],
                           "decode_pins": []}
    if lm_head is not None:
        doc[lm_head_in].append({"n": cfg.vocab, "k": H, "algo": lm_head})
    if invariant_decode is not None:
        doc["invariant_decode_pins"] = [{"n": n, "k": k, "algo": algo, "us_1": 5.0, "us_8": 6.0, "us_64": 9.0,
                                         "m_max": inv_m_max, "candidates": 9}
                                        for (n, k), algo in invariant_decode.items()]
    path = tmp_path / "pins.json"
    path.write_text(json.dumps(doc))
    return path


def _build(tmp_path: Path, cfg: gq.Qwen3Config = TINY_EN, pins: Path | None = None, **opts: Any) -> dict[str, Any]:
    path = pins or _pins(tmp_path, cfg)
    algos, decode_algos, source = gq.load_algos(path, 512)
    invariant = gq.invariant_decode_from_doc(path, json.loads(path.read_text()))
    fields = {"seqs_max": 64, "max_context": 2048, "decode": "gemm", "batch_invariant": True, **opts}
    return gq.build_manifest(cfg, STUB, gq.BuildOptions("inv", algos=algos, decode_algos=decode_algos,
                                                        invariant_decode_algos=invariant, algos_source=source,
                                                        **fields))


@pytest.mark.parametrize("fname", ["qwen3-tiny-en-inv.json", "qwen3-4b-inv.json"])
def test_committed_invariant_manifests_run_one_launch_list_at_every_bucket(fname: str) -> None:
    m = json.loads((ROOT / "manifests" / fname).read_text())
    assert m["vars"]["seqs"] == {"min": 1, "max": 64}
    assert differing_buckets(m) == []
    caller = m["meta"]["caller"]
    assert caller["decode_batch_invariant"] is True and caller["prefill_batch_invariant"] is True
    assert caller["decode"] == "gemm" and caller["decode_attention"] == "stream"
    # the lm_head pin: a proven one when the pins file pins the lm_head shape (pick_algos --lm-head), else its
    # decode pin, listed as unproven
    cfg = TINY_EN if "tiny" in fname else gq.Qwen3Config.from_name("qwen3-4b")
    proven = {(n, k) for n, k, _ in gq.load_algos(rm.ALGOS, 512)[0]}
    lm_head = [] if (cfg.vocab, cfg.hidden) in proven else [f"{cfg.vocab}x{cfg.hidden}"]
    assert caller.get("decode_batch_invariant_unproven", []) == lm_head
    # no launch anywhere in the decode program is chosen by row count: a `when` (an invariant decode pin's op keeps
    # its prefill pin for more than 64 tokens) holds at every decode bucket, 1 .. 64 rows
    for op, _, launches in decode_launches(m, 1):
        for launch in m["ops"][op]["launches"]:
            for var, (low, high) in launch.get("when", {}).items():
                assert var in ("tokens", "seqs") and (low, high) != (None, None), (op, launch["when"])
                chosen = [low <= rows <= high for rows in range(1, 65)]
                assert all(chosen) or not any(chosen), (op, launch["when"])
    # the committed pins file proves an invariant decode pin for each 4B decode projection and the lm_head
    if "4b" in fname:
        assert sorted(caller["decode_batch_invariant_pins"]["invariant_decode"]) == [
            "151936x2560", "19456x2560", "2560x4096", "2560x9728", "6144x2560"]


@pytest.mark.parametrize("fname", ["qwen3-tiny-en.json", "qwen3-4b-v2.json"])
def test_the_fast_batched_manifests_differ_between_one_row_and_two(fname: str) -> None:
    """The negative control: the GEMV manifests run other launches at bucket 1 than at 2..64, and the helper sees
    it (so the assertion above can fail)."""
    m = json.loads((ROOT / "manifests" / fname).read_text())
    assert differing_buckets(m) == [2, 4, 8, 16, 32, 64]
    assert "decode_batch_invariant" not in m["meta"]["caller"]


def test_decode_projections_are_the_prefill_ops_and_every_gemm_is_pinned(tmp_path: Path) -> None:
    m = _build(tmp_path)
    prefill = {c["op"] for c in m["programs"]["prefill"]["calls"] if c["op"].startswith("gemm")}
    decode = {c["op"] for c in m["programs"]["decode"]["calls"] if c["op"].startswith("gemm")}
    lm_head = f"gemm_{TINY_EN.vocab}x{TINY_EN.hidden}"
    assert prefill == {"gemm_768x384", "gemm_384x512", "gemm_2048x384", "gemm_384x1024"}
    assert decode == prefill | {lm_head}
    for name in decode:
        (launch,) = m["ops"][name]["launches"]
        assert launch["extern"] == "cublaslt_bf16_tn" and launch["algo"] == PIN and "when" not in launch
    assert m["meta"]["caller"]["decode_batch_invariant_unproven"] == [f"{TINY_EN.vocab}x{TINY_EN.hidden}"]
    assert differing_buckets(m) == []
    (rope,) = m["ops"]["qk_norm_rope_kv"]["launches"]
    assert rope["entry"] == "kern_qk_norm_rope_kv_warp" and "when" not in rope
    entries = [launch["entry"] for launch in m["ops"]["attn_decode"]["launches"]]
    assert entries == ["kern_attn_decode_partial_stream", "kern_attn_decode_reduce"]
    km = pytest.importorskip("kern_manifest")
    km.verify(km.parse_manifest(gq.dumps(m)))


def test_an_lm_head_pinned_for_prefill_is_proven_and_used(tmp_path: Path) -> None:
    other = {**PIN, "tile": 21}
    m = _build(tmp_path, pins=_pins(tmp_path, TINY_EN, other, lm_head_in="pins"))
    (launch,) = m["ops"][f"gemm_{TINY_EN.vocab}x{TINY_EN.hidden}"]["launches"]
    assert launch["algo"] == other
    assert "decode_batch_invariant_unproven" not in m["meta"]["caller"]


def test_decode_attn_batch_empty_keeps_decode_attn_for_every_row(tmp_path: Path) -> None:
    m = _build(tmp_path, decode_attn="wide", decode_attn_batch="")
    assert m["ops"]["attn_decode"]["launches"][0]["entry"] == "kern_attn_decode_partial_wide"
    assert m["meta"]["caller"]["decode_attention"] == "wide" and differing_buckets(m) == []


def test_the_4b_shape_builds_invariant_too(tmp_path: Path) -> None:
    cfg = gq.Qwen3Config.from_json(mc.config_json(mc.SHAPES["qwen3-4b"]))
    m = _build(tmp_path, cfg, max_context=4096)
    assert differing_buckets(m) == []
    ops = [c["op"] for c in m["programs"]["decode"]["calls"]]
    assert ops.count("gemm_6144x2560") == 36 and ops.count("gemm_151936x2560") == 1


@pytest.mark.parametrize("lm_head, why", [
    (None, "the pins file pins it neither for prefill nor, without split-K, for decode"),
    (PIN_SPLIT, "the pins file pins it neither for prefill nor, without split-K, for decode"),
])
def test_refuses_an_lm_head_without_an_invariant_pin(tmp_path: Path, lm_head: dict[str, int] | None,
                                                     why: str) -> None:
    with pytest.raises(gq.ManifestBuildError) as err:
        _build(tmp_path, pins=_pins(tmp_path, TINY_EN, lm_head))
    assert str(err.value) == (f"batch_invariant (--batch-invariant): the decode projection 8192x384 has no "
                              f"batch-invariant cuBLASLt pin ({why}); pass --algos with one, e.g. from "
                              "tools/pick_algos.py --lm-head")


def test_refuses_without_pins() -> None:
    with pytest.raises(gq.ManifestBuildError, match=r"decode projection 768x384 has no batch-invariant cuBLASLt pin "
                                                    r"\(no --algos given\)"):
        gq.build_manifest(TINY_EN, STUB, gq.BuildOptions("x", seqs_max=64, max_context=2048, decode="gemm",
                                                         batch_invariant=True))


@pytest.mark.parametrize("opts, given", [({"decode": "gemv", "gemv": "v2"},
                                          "--decode gemv --gemv v2 --batch-proj cublaslt"),
                                         ({"decode": "gemv", "gemv": "v1", "batch_proj": "mma"},
                                          "--decode gemv --gemv v1 --batch-proj mma"),
                                         ({"decode": "gemm", "m1_gemv": True}, "--m1-gemv")])
def test_refuses_the_gemv_decode(tmp_path: Path, opts: dict[str, Any], given: str) -> None:
    with pytest.raises(gq.ManifestBuildError) as err:
        _build(tmp_path, **opts)
    assert str(err.value).startswith(f"batch_invariant (--batch-invariant) with {given}: the M = 1 GEMVs sum a row")


@pytest.mark.parametrize("seqs_max", [1, 8, 64])
def test_the_mma_decode_runs_the_mma_entries_at_every_bucket(tmp_path: Path, seqs_max: int) -> None:
    """--decode gemv --gemv v2 --batch-proj mma: every projection op, lm_head included, is the small-M MMA entries
    from seqs 1 (no M = 1 GEMV launch), one launch list at every bucket but the entry's tile, on one geometry
    (grid, cluster) per op whatever the tile, so every bucket sums a row in one order (gemv_mma.cu
    warps_per_tile); the manifest verifies and says it is batch-invariant."""
    km = pytest.importorskip("kern_manifest")
    m = _build(tmp_path, decode="gemv", gemv="v2", batch_proj="mma", seqs_max=seqs_max)
    km.verify(km.parse_manifest(gq.dumps(m)))
    assert m["meta"]["caller"]["decode_batch_invariant"] is True
    tiles = [t for t in (8, 16, 32, 64) if t <= max(8, seqs_max)]
    for op in ("gemv_qkv", "gemv_o", "gemv_gate_up_act", "gemv_down_act", "gemv_lm_head"):
        launches = m["ops"][op]["launches"]
        assert [l["entry"].rsplit("_m", 1)[1] for l in launches] == [str(t) for t in tiles], op
        assert all(l["entry"].startswith("kern_mma_") for l in launches), op
        assert launches[0]["when"] == {"seqs": [1, min(8, seqs_max)]}, op
        assert len({(tuple(l["grid"]), tuple(l.get("cluster", [1, 1, 1]))) for l in launches}) == 1, op
    entries = {launch["entry"] for _, _, picked in decode_launches(m, 1) for launch in picked}
    assert not any(e.startswith("kern_gemv_") for e in entries), entries
    # buckets differ only in the projections' tile entry (and the row counts)
    def shape(bucket: int) -> list[tuple[str, list[str]]]:
        return [(op, [l["entry"].rsplit("_m", 1)[0] if l["entry"].startswith("kern_mma_") else l["entry"]
                      for l in picked]) for op, _, picked in decode_launches(m, bucket)]
    assert all(shape(b) == shape(1) for b in BUCKETS if b <= seqs_max)


def test_the_command_defaults_to_gemm_and_refuses_tensor_parallel(tmp_path: Path) -> None:
    req = gq.BuildRequest(out=tmp_path / "m.json", config=ROOT / "models" / "qwen3-tiny-en" / "config.json",
                          kernels=ROOT / "kernels", max_context=2048, algos=rm.ALGOS,
                          options={"seqs_max": 64, "batch_invariant": True})
    (text,) = gq.build_texts(req).values()
    assert json.loads(text)["meta"]["caller"]["decode"] == "gemm"
    with pytest.raises(gq.ManifestBuildError, match=r"^--batch-invariant with --tp 2: the all-reduce's summation"):
        gq.build_texts(gq.BuildRequest(out=tmp_path / "m.json", shape="qwen3-4b", tp=2, algos=rm.ALGOS,
                                       kernels=ROOT / "kernels", options={"batch_invariant": True}))


# ---------------------------------------------------------------- invariant decode pins (split-K allowed)

O_SHAPE, DOWN_SHAPE, LM_HEAD = (384, 512), (384, 1024), (TINY_EN.vocab, TINY_EN.hidden)


def _gemm_algos(m: dict[str, Any], program: str, bucket: int) -> dict[str, Any]:
    """op -> the algo of the one cuBLASLt launch each GEMM call of `program` issues at tokens = seqs = `bucket`."""
    env = {"tokens": bucket, "seqs": bucket}
    out = {}
    for call in m["programs"][program]["calls"]:
        if call["op"].startswith("gemm"):
            (launch,) = [x for x in m["ops"][call["op"]]["launches"]
                         if all(lo <= env[var] <= hi for var, (lo, hi) in x.get("when", {}).items())]
            out[call["op"]] = launch.get("algo")
    return out


def test_the_m_max_constants_agree() -> None:
    from kern_runtime.gemm_pins import INVARIANT_DECODE_M_MAX

    assert gq.INVARIANT_DECODE_M_MAX == INVARIANT_DECODE_M_MAX == max(BUCKETS)


def test_invariant_decode_pins_run_at_every_bucket_and_the_prefill_keeps_its_pins(tmp_path: Path) -> None:
    """With invariant decode pins for o, down and the lm_head: those decode projections call `gemm_inv_<n>x<k>`
    (the split-K pin at tokens 1 .. 64, the prefill pin above, where the decode never runs), the others keep the
    prefill ops; the prefill program is the one built without them; meta says which shape uses which."""
    pins = _pins(tmp_path, TINY_EN, invariant_decode={O_SHAPE: PIN_SPLIT, DOWN_SHAPE: PIN_SPLIT,
                                                       LM_HEAD: PIN_SPLIT})
    m = _build(tmp_path, pins=pins)
    without = _build(tmp_path)
    assert m["programs"]["prefill"] == without["programs"]["prefill"]
    assert _gemm_algos(m, "prefill", 512) == _gemm_algos(without, "prefill", 512) == {
        "gemm_768x384": PIN, "gemm_384x512": PIN, "gemm_2048x384": PIN, "gemm_384x1024": PIN}
    expected = {"gemm_768x384": PIN, "gemm_inv_384x512": PIN_SPLIT, "gemm_2048x384": PIN,
                "gemm_inv_384x1024": PIN_SPLIT, "gemm_inv_8192x384": PIN_SPLIT}
    for bucket in BUCKETS:
        assert _gemm_algos(m, "decode", bucket) == expected, bucket
        assert _gemm_algos(without, "decode", bucket) == {
            "gemm_768x384": PIN, "gemm_384x512": PIN, "gemm_2048x384": PIN, "gemm_384x1024": PIN,
            "gemm_8192x384": PIN}, bucket
    assert differing_buckets(m) == []
    assert m["ops"]["gemm_inv_384x512"]["launches"] == [
        {"extern": "cublaslt_bf16_tn", "args": m["ops"]["gemm_inv_384x512"]["launches"][0]["args"],
         "when": {"tokens": [1, 64]}, "algo": PIN_SPLIT},
        {"extern": "cublaslt_bf16_tn", "args": m["ops"]["gemm_inv_384x512"]["launches"][0]["args"],
         "when": {"tokens": [65, 512]}, "algo": PIN}]
    # the lm_head has no prefill pin: the heuristic above 64 (never run)
    assert [x.get("algo") for x in m["ops"]["gemm_inv_8192x384"]["launches"]] == [PIN_SPLIT, None]
    caller = m["meta"]["caller"]
    assert caller["decode_batch_invariant_pins"] == {"invariant_decode": ["384x1024", "384x512", "8192x384"],
                                                     "prefill": ["2048x384", "768x384"]}
    assert "decode_batch_invariant_unproven" not in caller  # the lm_head's decode pin is not used
    assert "decode_batch_invariant_pins" not in without["meta"]["caller"]
    km = pytest.importorskip("kern_manifest")
    km.verify(km.parse_manifest(gq.dumps(m)))


def test_invariant_decode_pins_at_chunk_max_64_need_no_when(tmp_path: Path) -> None:
    m = _build(tmp_path, pins=_pins(tmp_path, TINY_EN, invariant_decode={O_SHAPE: PIN_SPLIT}), chunk_max=64)
    assert m["ops"]["gemm_inv_384x512"]["launches"][0]["algo"] == PIN_SPLIT
    assert len(m["ops"]["gemm_inv_384x512"]["launches"]) == 1 and "when" not in m["ops"]["gemm_inv_384x512"][
        "launches"][0]


def test_invariant_decode_pins_are_not_used_past_64_rows(tmp_path: Path) -> None:
    """A decode of more rows than the pins were proven for keeps the prefill pins (and no meta of them)."""
    m = _build(tmp_path, pins=_pins(tmp_path, TINY_EN, invariant_decode={O_SHAPE: PIN_SPLIT}), seqs_max=128)
    assert not any(op.startswith("gemm_inv_") for op in m["ops"])
    assert "decode_batch_invariant_pins" not in m["meta"]["caller"]


def test_the_fast_decode_ignores_invariant_decode_pins(tmp_path: Path) -> None:
    m = _build(tmp_path, pins=_pins(tmp_path, TINY_EN, invariant_decode={O_SHAPE: PIN_SPLIT}), batch_invariant=False,
               decode="gemv", gemv="v2")
    assert not any(op.startswith("gemm_inv_") for op in m["ops"])


def test_an_invariant_decode_row_proven_for_fewer_rows_is_refused(tmp_path: Path) -> None:
    path = _pins(tmp_path, TINY_EN, invariant_decode={O_SHAPE: PIN_SPLIT}, inv_m_max=32)
    with pytest.raises(gq.ManifestBuildError) as err:
        _build(tmp_path, pins=path)
    assert str(err.value) == (f"{path}: invariant_decode_pins[0] (n=384, k=512): m_max = 32, expected an integer >= "
                              "64 (the batched decode's largest bucket): rerun tools/pick_algos.py --invariant-decode")


def test_the_command_reads_invariant_decode_pins(tmp_path: Path) -> None:
    pins = _pins(tmp_path, TINY_EN, invariant_decode={O_SHAPE: PIN_SPLIT})
    req = gq.BuildRequest(out=tmp_path / "m.json", config=ROOT / "models" / "qwen3-tiny-en" / "config.json",
                          kernels=ROOT / "kernels", max_context=2048, algos=pins,
                          options={"seqs_max": 64, "batch_invariant": True})
    (text,) = gq.build_texts(req).values()
    caller = json.loads(text)["meta"]["caller"]
    assert caller["decode_batch_invariant_pins"]["invariant_decode"] == ["384x512"]


def test_the_skinny_decode_runs_kern_gemm_skinny_at_every_bucket(tmp_path: Path) -> None:
    """--invariant-proj skinny: the four layer projections on kern_gemm_skinny_n128 (one launch list at every
    bucket, the Stream-K grid of the target's SMs, PDL, its tickets in the fixed state), the SiLU-mul in gate_up's
    epilogue (no silu_mul call in the decode), the lm_head on its pin; a launch for every token count (cuBLASLt,
    then kern_silu_mul for the fused op, above 64 where the decode never runs); the manifest verifies."""
    km = pytest.importorskip("kern_manifest")
    from kern_run.models.qwen3.skinny import skinny_geometry

    cfg = gq.Qwen3Config.from_json(mc.config_json(mc.SHAPES["qwen3-4b"]))
    m = _build(tmp_path, cfg, max_context=4096, invariant_proj="skinny")
    km.verify(km.parse_manifest(gq.dumps(m)))
    assert differing_buckets(m) == []
    ops = [c["op"] for c in m["programs"]["decode"]["calls"]]
    skinny = {"gemm_sk_6144x2560": (6144, 2560, False), "gemm_sk_2560x4096": (2560, 4096, False),
              "gemm_sk_19456x2560_swiglu": (19456, 2560, True), "gemm_sk_2560x9728": (2560, 9728, False)}
    assert {op: ops.count(op) for op in skinny} == dict.fromkeys(skinny, 36)
    assert "silu_mul" not in ops and ops.count("gemm_151936x2560") == 1
    gate_up = next(c for c in m["programs"]["decode"]["calls"] if c["op"] == "gemm_sk_19456x2560_swiglu")
    assert gate_up["args"]["c"] == "act" and gate_up["args"]["tickets"] == "skinny_tickets"
    tickets = 0
    for name, (n, k, swiglu) in skinny.items():
        geo = skinny_geometry(n, k, 132, swiglu)
        first, *rest = m["ops"][name]["launches"]
        assert (first["entry"], first["grid"], first["block"], first["shared_mem"], first["pdl"], first["when"]) == (
            "kern_gemm_skinny_n128", [132, 1, 1], [256, 1, 1], 197632, True, {"tokens": [1, 64]}), name
        assert first["args"][-1] == {"i32": int(swiglu)}
        assert [l.get("extern", l.get("entry")) for l in rest] == (
            ["cublaslt_bf16_tn", "kern_silu_mul"] if swiglu else ["cublaslt_bf16_tn"]), name
        assert all(l["when"] == {"tokens": [65, 512]} for l in rest), name
        assert m["ops"][name]["scratch"]["ws"] == str(geo.ws_bytes)
        tickets = max(tickets, 4 * geo.tickets)
    assert m["states"]["skinny_tickets"] == {"kind": "fixed", "bytes": tickets}
    assert "silu_mul" in [c["op"] for c in m["programs"]["prefill"]["calls"]]  # prefill keeps its layers
    assert m["meta"]["caller"]["decode_batch_invariant_skinny"] == ["19456x2560_swiglu", "2560x4096", "2560x9728",
                                                                    "6144x2560"]


@pytest.mark.parametrize("opts, message", [
    ({"invariant_proj": "skinny", "batch_invariant": False},
     "invariant_proj (--invariant-proj) 'skinny' needs batch_invariant (--batch-invariant)"),
    ({"invariant_proj": "mma"}, "invariant_proj (--invariant-proj) 'mma': use one of cublaslt, skinny"),
    ({"invariant_proj": "skinny", "decode": "gemv", "gemv": "v2"},  # named before the GEMV decode's own refusal
     "invariant_proj (--invariant-proj) skinny needs --decode gemm and seqs_max (--seqs-max) <= 64 (the kernel's "
     "64 MMA rows), got --decode gemv and 64"),
    ({"invariant_proj": "skinny", "decode": "gemv", "gemv": "v2", "batch_proj": "mma"},
     "invariant_proj (--invariant-proj) skinny needs --decode gemm and seqs_max (--seqs-max) <= 64 (the kernel's "
     "64 MMA rows), got --decode gemv and 64"),
])
def test_refuses_the_skinny_decode_outside_its_reach(tmp_path: Path, opts: dict[str, Any], message: str) -> None:
    with pytest.raises(gq.ManifestBuildError) as err:
        _build(tmp_path, **opts)
    assert str(err.value) == message
