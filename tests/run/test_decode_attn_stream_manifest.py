"""--decode-attn stream (kern_attn_decode_partial_stream, kernels-src/attention_decode.cu) in the Qwen3 builder: the
wide partial's launch and arguments under another entry, module and block; the default stays wide."""

from __future__ import annotations

import pytest

from kern_run.models import qwen3 as gq
from tools import make_checkpoint as mc

STUB = gq.KernelAbi.from_json(gq.stub_kernels_json())


def _manifest(head_dim: int | None = None, **opts) -> dict:
    cfg_json = mc.config_json(mc.SHAPES["qwen3-4b"])
    if head_dim is not None:
        cfg_json["head_dim"] = head_dim
    return gq.build_manifest(gq.Qwen3Config.from_json(cfg_json), STUB, gq.BuildOptions("qwen3-4b", **opts))


def test_stream_is_registered_with_the_early_contract() -> None:
    assert "stream" in gq.DECODE_ATTN
    assert gq.EARLY_PARTIALS["stream"] == ("kern_attn_decode_partial_stream", 64, 128)
    assert gq.BuildOptions("x").decode_attn == "wide", "the builder's default decode attention changed"


@pytest.mark.parametrize("gemv", ["v1", "v2"])
def test_stream_launch_is_the_wide_launch_on_64_threads(gemv: str) -> None:
    """The same grid (kv heads, splits, seqs), arguments (slot_mapping included), PDL, reduce launch, scratch and
    op interface as wide; entry kern_attn_decode_partial_stream of module attention_decode, block (64, 1, 1), no
    dynamic shared memory (its 36,864 bytes are static)."""
    wide = _manifest(gemv=gemv, decode_attn="wide")
    stream = _manifest(gemv=gemv, decode_attn="stream")
    op_w, op_s = wide["ops"]["attn_decode"], stream["ops"]["attn_decode"]
    part_w, part_s = op_w["launches"][0], op_s["launches"][0]
    assert (part_s["module"], part_s["entry"], part_s["block"], part_s["shared_mem"], part_s["pdl"]) == (
        "attention_decode", "kern_attn_decode_partial_stream", [64, 1, 1], 0, True)
    assert part_s["args"] == part_w["args"] and part_s["grid"] == part_w["grid"]
    assert part_s["params"] == part_w["params"]
    assert op_s["launches"][1] == op_w["launches"][1] and op_s["launches"][1]["entry"] == "kern_attn_decode_reduce"
    assert op_s["args"] == op_w["args"] and op_s["scratch"] == op_w["scratch"]
    calls = [c for c in stream["programs"]["decode"]["calls"] if c["op"] == "attn_decode"]
    assert len(calls) == 36 and all(c["args"]["slots"] == "slot_mapping" for c in calls)
    assert stream["meta"]["caller"]["decode_attention"] == "stream"
    assert "attention_decode" in stream["modules"] and "attention_decode" not in wide["modules"]


def test_stream_verifies_with_kern_manifest() -> None:
    km = pytest.importorskip("kern_manifest")
    km.verify(km.parse_manifest(gq.dumps(_manifest(decode_attn="stream"))))


def test_stream_refuses_head_dims_past_128() -> None:
    with pytest.raises(gq.ManifestBuildError) as err:
        _manifest(head_dim=256, decode_attn="stream")
    assert str(err.value) == "decode_attn 'stream': head_dim 256 > 128 (kern_attn_decode_partial_stream's limit)"
    for head_dim in (64, 128):
        assert _manifest(head_dim=head_dim, decode_attn="stream")["ops"]["attn_decode"]["launches"][0]["entry"] == (
            "kern_attn_decode_partial_stream")


def test_gqa_is_the_stream_launch_on_one_warp() -> None:
    """--decode-attn gqa (kern_attn_decode_partial_gqa, the same module): stream's grid, arguments, PDL, reduce and
    scratch, on a block of 32 threads; as the batch entry of a 64-row manifest it serves steps of 2.. rows, and
    --batch-invariant makes it the one decode entry at every row count."""
    assert gq.EARLY_PARTIALS["gqa"] == ("kern_attn_decode_partial_gqa", 32, 128)
    stream, gqa = _manifest(decode_attn="stream"), _manifest(decode_attn="gqa")
    op_s, op_g = stream["ops"]["attn_decode"], gqa["ops"]["attn_decode"]
    part_s, part_g = op_s["launches"][0], op_g["launches"][0]
    assert (part_g["module"], part_g["entry"], part_g["block"], part_g["pdl"]) == (
        "attention_decode", "kern_attn_decode_partial_gqa", [32, 1, 1], True)
    assert {k: v for k, v in part_g.items() if k not in ("entry", "block")} == \
        {k: v for k, v in part_s.items() if k not in ("entry", "block")}
    assert op_g["launches"][1:] == op_s["launches"][1:] and op_g["scratch"] == op_s["scratch"]
    batched = _manifest(gemv="v2", decode_attn="wide", decode_attn_batch="gqa", seqs_max=64)["ops"]["attn_decode"]["launches"]
    assert [(launch["entry"], launch.get("when")) for launch in batched[:2]] == [
        ("kern_attn_decode_partial_wide", {"seqs": [1, 1]}), ("kern_attn_decode_partial_gqa", {"seqs": [2, 64]})]
    from kern_run.models.qwen3.options import _invariant_options

    invariant = _invariant_options(gq.BuildOptions("x", decode="gemm", decode_attn="wide", decode_attn_batch="gqa",
                                                   seqs_max=64))
    assert (invariant.decode_attn, invariant.decode_attn_batch) == ("gqa", "")
    with pytest.raises(gq.ManifestBuildError, match="head_dim 256 > 128"):
        _manifest(head_dim=256, decode_attn="gqa")


def test_gqa_fused_has_no_reduce_and_passes_the_tickets() -> None:
    """--decode-attn gqa-fused: one launch (kern_attn_decode_gqa_fused) with gqa's arguments plus the tickets and
    the op's `out` after part_ml; the fixed state attn_tickets (int32 per (row, kv head)); every decode call passes
    it. Beside a non-fused entry of the other row count, the reduce runs only for that one."""
    gqa, fused = _manifest(decode_attn="gqa"), _manifest(decode_attn="gqa-fused")
    (launch,) = fused["ops"]["attn_decode"]["launches"]
    part = gqa["ops"]["attn_decode"]["launches"][0]
    assert (launch["entry"], launch["block"]) == ("kern_attn_decode_gqa_fused", [32, 1, 1])
    assert launch["args"] == part["args"][:7] + [{"arg": "tickets"}, {"arg": "out"}] + part["args"][7:]
    assert fused["states"]["attn_tickets"] == {"kind": "fixed", "bytes": 1 * 8 * 4}
    assert "attn_tickets" not in gqa["states"]
    names = [a["name"] for a in fused["ops"]["attn_decode"]["args"]]
    assert names == ["q", "kv", "block_table", "seq_lens", "slots", "tickets", "out", "num_pages"]
    calls = [c for c in fused["programs"]["decode"]["calls"] if c["op"] == "attn_decode"]
    assert len(calls) == 36 and all(c["args"]["tickets"] == "attn_tickets" for c in calls)
    batched = _manifest(gemv="v2", decode_attn="gqa-fused", decode_attn_batch="gqa-fused", seqs_max=64)
    assert batched["states"]["attn_tickets"]["bytes"] == 64 * 8 * 4
    assert [x["entry"] for x in batched["ops"]["attn_decode"]["launches"]] == ["kern_attn_decode_gqa_fused"]
    km = pytest.importorskip("kern_manifest")
    for manifest in (fused, batched):
        km.verify(km.parse_manifest(gq.dumps(manifest)))
    # a fused entry beside one that needs the reduce: refused, naming both
    with pytest.raises(gq.ManifestBuildError) as err:
        _manifest(gemv="v2", decode_attn="wide", decode_attn_batch="gqa-fused", seqs_max=64)
    assert str(err.value).startswith("decode_attn_batch (--decode-attn-batch) 'gqa-fused' with decode_attn "
                                     "(--decode-attn) 'wide': 'gqa-fused' merges its own splits and 'wide' needs")
