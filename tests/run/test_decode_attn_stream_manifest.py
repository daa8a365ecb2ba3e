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
