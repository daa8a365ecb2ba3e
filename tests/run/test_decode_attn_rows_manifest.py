"""--decode-attn-rows N (kern_attn_decode_gqa_rows, kernels-src/attention_decode.cu) in the Qwen3 builder: steps of N
rows and more run one block per (kv head, row) with no reduce launch; fewer rows keep their partial and the reduce,
each pair under the same `when` range; the refusals name the flag."""

from __future__ import annotations

import pytest

from kern_run.models import qwen3 as gq
from kern_run.models.qwen3.entries import GQA_ROWS
from tools import make_checkpoint as mc

STUB = gq.KernelAbi.from_json(gq.stub_kernels_json())


def _manifest(**opts) -> dict:
    cfg = gq.Qwen3Config.from_json(mc.config_json(mc.SHAPES["qwen3-4b"]))
    return gq.build_manifest(cfg, STUB, gq.BuildOptions("qwen3-4b", **opts))


def _launches(m: dict) -> list[tuple[str, list[int] | None]]:
    return [(x["entry"], x.get("when", {}).get("seqs")) for x in m["ops"]["attn_decode"]["launches"]]


BATCH = {"gemv": "v2", "seqs_max": 64}


def test_rows_from_32_cuts_the_gqa_pair_below_it() -> None:
    m = _manifest(**BATCH, decode_attn="gqa", decode_attn_batch="", decode_attn_rows=32)
    assert _launches(m) == [("kern_attn_decode_partial_gqa", [1, 31]), ("kern_attn_decode_reduce", [1, 31]),
                            ("kern_attn_decode_gqa_rows", [32, 64])]


def test_rows_beside_a_one_row_entry_keeps_both_pairs() -> None:
    """wide at one row, gqa at 2..15, rows from 16: each partial followed by its reduce over its own range."""
    m = _manifest(**BATCH, decode_attn="wide", decode_attn_batch="gqa", decode_attn_rows=16)
    assert _launches(m) == [("kern_attn_decode_partial_wide", [1, 1]), ("kern_attn_decode_reduce", [1, 1]),
                            ("kern_attn_decode_partial_gqa", [2, 15]), ("kern_attn_decode_reduce", [2, 15]),
                            ("kern_attn_decode_gqa_rows", [16, 64])]


def test_rows_at_every_row_count_is_one_launch_without_when() -> None:
    m = _manifest(**BATCH, decode_attn="gqa", decode_attn_batch="", decode_attn_rows=1)
    assert _launches(m) == [("kern_attn_decode_gqa_rows", None)]


def test_rows_launch_geometry_and_arguments() -> None:
    """grid (kv heads, 1, seqs), 32 x warps threads, warps x 17,408 bytes of dynamic shared memory, PDL, the gqa
    partial's arguments with `out` after part_ml; the op's interface and scratch unchanged."""
    plain = _manifest(**BATCH, decode_attn="gqa", decode_attn_batch="")
    for warps in (1, 3, 4):
        m = _manifest(**BATCH, decode_attn="gqa", decode_attn_batch="", decode_attn_rows=8,
                      decode_attn_rows_warps=warps)
        op, gqa = m["ops"]["attn_decode"], plain["ops"]["attn_decode"]
        rows = op["launches"][-1]
        assert (rows["module"], rows["grid"], rows["block"], rows["shared_mem"], rows["pdl"]) == (
            "attention_decode", [8, 1, "seqs"], [32 * warps, 1, 1], warps * GQA_ROWS[1], True)
        partial_args = gqa["launches"][0]["args"]
        assert rows["args"] == partial_args[:7] + [{"arg": "out"}] + partial_args[7:]
        assert op["args"] == gqa["args"] and op["scratch"] == gqa["scratch"]


def test_rows_manifest_verifies_with_kern_manifest() -> None:
    km = pytest.importorskip("kern_manifest")
    for opts in ({"decode_attn": "gqa", "decode_attn_batch": "", "decode_attn_rows": 32},
                 {"decode_attn": "wide", "decode_attn_batch": "gqa", "decode_attn_rows": 16},
                 {"decode_attn": "gqa", "decode_attn_batch": "", "decode_attn_rows": 1}):
        km.verify(km.parse_manifest(gq.dumps(_manifest(**BATCH, **opts))))


def test_without_rows_the_launches_do_not_change() -> None:
    assert gq.BuildOptions("x").decode_attn_rows == 0
    m = _manifest(**BATCH, decode_attn="gqa", decode_attn_batch="")
    assert _launches(m) == [("kern_attn_decode_partial_gqa", None), ("kern_attn_decode_reduce", None)]


@pytest.mark.parametrize("opts,message", [
    ({"decode_attn_rows": 65}, "decode_attn_rows (--decode-attn-rows) 65: use 1..seqs_max (--seqs-max 64), or 0 "
                               "for never"),
    ({"decode_attn_rows": -1}, "decode_attn_rows (--decode-attn-rows) -1: use 1..seqs_max (--seqs-max 64), or 0 "
                               "for never"),
    ({"decode_attn_rows": 8, "decode_attn_rows_warps": 0}, "decode_attn_rows_warps (--decode-attn-rows-warps) 0: "
                                                           "use 1..4 (kern_attn_decode_gqa_rows's block)"),
    ({"decode_attn_rows": 8, "decode_attn_rows_warps": 5}, "decode_attn_rows_warps (--decode-attn-rows-warps) 5: "
                                                           "use 1..4 (kern_attn_decode_gqa_rows's block)"),
])
def test_rows_refusals_name_the_flag(opts: dict, message: str) -> None:
    with pytest.raises(gq.ManifestBuildError) as err:
        _manifest(**BATCH, decode_attn="gqa", decode_attn_batch="", **opts)
    assert str(err.value) == message


@pytest.mark.parametrize("attn,batch,rows", [("wide", "stream", 8), ("wide", "gqa", 1), ("gqa", "stream", 8),
                                             ("gqa-fused", "gqa-fused", 8)])
def test_rows_refuses_steps_without_the_gqa_entry(attn: str, batch: str, rows: int) -> None:
    with pytest.raises(gq.ManifestBuildError) as err:
        _manifest(**BATCH, decode_attn=attn, decode_attn_batch=batch, decode_attn_rows=rows)
    assert str(err.value).startswith(f"decode_attn_rows (--decode-attn-rows) {rows}: kern_attn_decode_gqa_rows has "
                                     "the gqa partial's splits")
