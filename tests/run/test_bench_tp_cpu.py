"""The host parts of the tensor-parallel benches (bench/allreduce.py, bench/decode_tp.py) and the all-reduce
manifest generator (tools/gen_allreduce.py), without a GPU: message sizes, the tables, a rank's weight bytes, the
generated manifest verifying with the one-shot and NCCL ops wired as the benches and GPU tests call them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import allreduce as bar
from bench import decode_tp
from kern_manifest import parse_manifest, verify

REPO = Path(__file__).resolve().parents[2]


def test_sizes_span_8_kb_to_64_mb() -> None:
    sizes = bar.sizes_bytes(8, 64)
    assert sizes[0] == 8 * 1024 and sizes[-1] == 64 * 2**20 and len(sizes) == 14
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:]))


def test_allreduce_table_ratio_and_wrong_marks() -> None:
    rows = [{"bytes": 16384, "oneshot_us": 4.0, "oneshot_exact": True, "nccl_us": 10.0, "nccl_close": True},
            {"bytes": 2**21, "oneshot_us": 30.0, "oneshot_exact": False, "nccl_us": 20.0, "nccl_close": True}]
    other = [{"bytes": 16384, "nccl_us": 8.0}, {"bytes": 2**21, "nccl_us": 25.0}]
    text = bar._table([("LL,LL128", {"rows": rows}), ("LL", {"rows": other})])
    lines = text.splitlines()
    assert lines[2] == "| 16 KB | 4.00 | 10.00 | 8.00 | 0.50 |"
    assert lines[3] == "| 2 MB | 30.00 (WRONG) | 20.00 | 25.00 | 1.50 |"


def test_weight_bytes_of_a_rank_and_the_decode_table() -> None:
    from kern_run.models import qwen3 as g

    abi = g.KernelAbi.from_json(json.loads((REPO / "kernels" / "kernels.json").read_text()))
    cfg = g.Qwen3Config.from_name("qwen3-8b")
    r0, _ = g.build_rank_manifests(cfg, abi, g.BuildOptions("q8", max_context=4096), 2)
    H, V, I, D = cfg.hidden, cfg.vocab, cfg.intermediate, cfg.head_dim
    per_layer = ((cfg.q_heads + 2 * cfg.kv_heads) * D // 2 * H + H * cfg.q_heads * D // 2 + 2 * I // 2 * H
                 + H * I // 2 + 2 * H + 2 * D)
    # the embedding replicated, the lm_head vocabulary-parallel (half its rows per rank)
    assert decode_tp.weight_bytes(r0) == 2 * (cfg.layers * per_layer + V * H + V // 2 * H + H)
    repl, _ = g.build_rank_manifests(cfg, abi, g.BuildOptions("q8", max_context=4096, tp_lm_head="replicated"), 2)
    assert decode_tp.weight_bytes(repl) == 2 * (cfg.layers * per_layer + 2 * V * H + H)  # embed + lm_head replicated
    assert [v[2] for v in decode_tp.VARIANTS] == [[], ["--allreduce-oneshot-bytes", "0"],
                                                  ["--tp-lm-head", "replicated"]]
    assert decode_tp.ms_per_token([0.0, 0.002, 0.004, 0.0065]) == pytest.approx(2.0)
    rows = [{"shape": "qwen3-8b", "tp": 1, "variant": "-", "ms_per_token": 4.0, "floor_ms": 3.8},
            {"shape": "qwen3-8b", "tp": 2, "variant": "one-shot", "ms_per_token": 2.4, "floor_ms": 2.0}]
    text = decode_tp.table(rows, ["qwen3-8b TP=8: skipped"])
    assert "| qwen3-8b | 2 | one-shot | 2.400 | 0.60x | 2.000 | 83% |" in text
    assert text.endswith("note: qwen3-8b TP=8: skipped")


@pytest.mark.parametrize("size", [2, 8])
def test_allreduce_manifest_verifies(size: int) -> None:
    from kern_run.models.qwen3 import read_kernel_abi
    from tools.gen_allreduce import build_manifest

    m = build_manifest(size, read_kernel_abi(REPO / "kernels"), max_elements=1 << 16, burst=5)
    verify(parse_manifest(m))
    assert m["topology"] == {"tp": {"size": size}} and m["modules"] == {"allreduce": m["modules"]["allreduce"]}
    assert "gather" not in m["programs"] and "ag" not in m["buffers"]
    g = build_manifest(size, read_kernel_abi(REPO / "kernels"), max_elements=1 << 16, burst=5, gather_vocab=1003,
                       gather_rows=3)
    verify(parse_manifest(g))
    slice_ = -(-(-(-1003 // size)) // 8) * 8
    assert g["meta"]["tp"]["lm_head"] == {"split": "vocab", "status": "ar_status", "vocab": 1003, "slice": slice_,
                                          "rows": 3, "capacity": 3 * slice_, "blocks": 32}
    assert g["programs"]["gather"]["calls"] == [{"op": "allgather", "args": {
        "x": "gx", "out": "gout", "rows": "rows", "peers": "ag_peers", "status": "ar_status"}}]
    assert len(g["programs"]["gather_g"]["calls"]) == 5 and g["vars"]["rows"] == {"min": 1, "max": 3}
    assert g["buffers"]["gout"]["shape"] == [3 * 1003] and g["buffers"]["gx"]["shape"] == [3 * slice_]
    assert len(m["programs"]["sum_g"]["calls"]) == 5 and m["programs"]["sum_g"]["graph"] is True
    (launch,) = m["ops"]["sum"]["launches"]
    assert launch["args"][4] == {"arg": "out"} and launch["args"][6] == {"i32": 1 << 16}
    assert m["ops"]["nccl"]["launches"][0]["extern"] == "nccl_allreduce_bf16"
    assert m["buffers"]["ar"]["shape"][0] * 8 >= 2 * size * (1 << 16) * 2
