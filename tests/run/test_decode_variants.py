"""tools/decode_variants.py's command line: a bad --out is one stderr line and exit 1, before any generation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import decode_variants as dv
from tools import gen_qwen3 as gq


@pytest.fixture
def no_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gq, "main", lambda argv: pytest.fail(f"kern manifest build ran: {argv}"))


def test_out_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], no_generation: None) -> None:
    out = tmp_path / "variants"
    out.write_text("keep")
    assert dv.main(["--out", str(out), "--only", "v2"]) == 1
    assert capsys.readouterr().err == f"decode_variants: --out {out} exists and is not a directory\n"
    assert out.read_text() == "keep"


def test_out_below_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], no_generation: None) -> None:
    parent = tmp_path / "file"
    parent.write_text("")
    assert dv.main(["--out", str(parent / "variants")]) == 1
    assert capsys.readouterr().err == f"decode_variants: --out {parent / 'variants'}: Not a directory\n"


def test_writes_one_manifest_per_variant_and_the_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[list[str]] = []

    def fake_gen(argv: list[str]) -> int:
        calls.append(argv)
        Path(argv[argv.index("--out") + 1]).write_text("{}")
        return 0

    monkeypatch.setattr(gq, "main", fake_gen)
    out = tmp_path / "new" / "variants"
    names = list(dv.VARIANTS)[-2:]
    assert dv.main(["--out", str(out), "--only", ",".join(names)]) == 0
    paths = [str(out / f"qwen3-4b-{name}.json") for name in names]
    assert (out / "list").read_text() == ",".join(paths)
    assert [c[c.index("--name") + 1] for c in calls] == [f"qwen3-4b-{name}" for name in names]
    assert [c[-len(dv.VARIANTS[name]):] for c, name in zip(calls, names)] == [list(dv.VARIANTS[n]) for n in names]
    assert all(Path(p).read_text() == "{}" for p in paths)
    assert f"{len(names)} manifests in {out}" in capsys.readouterr().out


def test_inv_is_the_committed_serve_manifest_and_ablate_writes_each_op_out(tmp_path: Path) -> None:
    """`inv` rebuilds manifests/qwen3-4b-inv.json byte for byte; `--ablate inv-gqa` lists inv-gqa's seven timing
    ablations after the variants, each without exactly the calls (or the reduce launches) its suffix names."""
    import json

    from kern_run_testutil import ROOT

    out = tmp_path / "v"
    assert dv.main(["--out", str(out), "--only", "inv", "--ablate", "inv-gqa"]) == 0
    assert (out / "qwen3-4b-inv.json").read_bytes() == (ROOT / "manifests" / "qwen3-4b-inv.json").read_bytes()
    listed = (out / "list").read_text().split(",")
    assert [Path(p).name for p in listed] == ["qwen3-4b-inv.json", "qwen3-4b-inv-gqa.json",
                                              *(f"qwen3-4b-inv-gqa-{s}.json" for s in dv.ABLATIONS)]
    base = json.loads((out / "qwen3-4b-inv-gqa.json").read_text())
    base_ops = [c["op"] for c in base["programs"]["decode"]["calls"]]
    for suffix, (ops, entries) in dv.ABLATIONS.items():
        m = json.loads((out / f"qwen3-4b-inv-gqa-{suffix}.json").read_text())
        assert [c["op"] for c in m["programs"]["decode"]["calls"]] == [op for op in base_ops if op not in ops], suffix
        launched = [x["entry"] for x in m["ops"]["attn_decode"]["launches"]]
        assert ("kern_attn_decode_reduce" in launched) == ("kern_attn_decode_reduce" not in entries), suffix
        assert m["meta"]["ablation"], suffix
