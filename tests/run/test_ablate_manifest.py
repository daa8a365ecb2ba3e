"""tools/ablate_manifest.py: decode-call removal for timing ablations (docs/perf.md "Decode, sixth session")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import ablate_manifest as am
from kern_run.models import qwen3 as gq
from kern_run_testutil import ROOT

V2 = ROOT / "manifests" / "qwen3-4b-v2.json"


def _manifest() -> dict:
    return json.loads(V2.read_text())


def test_drops_every_call_of_the_ops_and_only_those() -> None:
    m = _manifest()
    out = am.ablate(m, ["qk_norm_rope_kv", "attn_decode"])
    before = [c["op"] for c in m["programs"]["decode"]["calls"]]
    after = [c["op"] for c in out["programs"]["decode"]["calls"]]
    assert after == [op for op in before if op not in ("qk_norm_rope_kv", "attn_decode")]
    assert len(before) - len(after) == 2 * 36
    assert out["programs"]["prefill"] == m["programs"]["prefill"]  # prefill untouched
    assert out["ops"] == m["ops"]
    assert out["name"] == "qwen3-4b-v2-without-qk_norm_rope_kv-attn_decode"
    assert out["meta"]["ablation"]["dropped_decode_ops"] == ["qk_norm_rope_kv", "attn_decode"]
    assert out["digest"] == gq.manifest_digest(out) != m["digest"]
    assert m["programs"]["decode"]["calls"][1]["op"] == before[1]  # the input is not modified


def test_drop_entry_removes_that_launch_from_the_decode_ops() -> None:
    m = _manifest()
    out = am.ablate(m, [], ["kern_attn_decode_reduce"])
    assert [l["entry"] for l in out["ops"]["attn_decode"]["launches"]] == [
        "kern_attn_decode_partial_wide", "kern_attn_decode_partial_stream"]  # one row / 2..64 rows
    assert out["programs"] == m["programs"]
    assert out["meta"]["ablation"]["dropped_entries"] == ["kern_attn_decode_reduce"]
    assert out["name"].endswith("-without-kern_attn_decode_reduce")
    km = pytest.importorskip("kern_manifest")
    km.verify(km.parse_manifest(gq.dumps(out)))


def test_ablated_manifest_verifies() -> None:
    km = pytest.importorskip("kern_manifest")
    out = am.ablate(_manifest(), ["gemv_qkv", "gemv_o", "gemv_gate_up_act", "gemv_down_act"])
    km.verify(km.parse_manifest(gq.dumps(out)))


@pytest.mark.parametrize(("mutate", "drop", "match"), [
    (lambda m: m["programs"].pop("decode"), ["gemv_o"], "no programs.decode.calls"),
    (lambda m: None, ["gemv_o", "no_such_op"], r"\['no_such_op'\] are not called"),
    (lambda m: m["programs"]["decode"].update(calls=[{"op": "gemv_o", "args": {}}]), ["gemv_o"], "empty decode program"),
])
def test_refusals(mutate, drop: list[str], match: str) -> None:
    m = _manifest()
    mutate(m)
    with pytest.raises(am.AblationError, match=match):
        am.ablate(m, drop)


@pytest.mark.parametrize(("drop", "entries", "match"), [
    ([], [], "nothing to drop"),
    ([], ["kern_attn_prefill"], "no op the decode program calls launches kern_attn_prefill"),
    # the committed v2 manifest takes 1..64 rows: the GEMV is gemv_qkv's launch for seqs = 1 of a `when`-group
    ([], ["kern_gemv_rows_rmsnorm"], r"covers \{'seqs': \[1, 1\]\} of a `when`-group"),
    (["qk_norm_rope_kv", "attn_decode"], ["kern_attn_decode_reduce"], "no op the decode program calls launches"),
    # qk_norm_rope_kv is a `when`-group (block entry at one token, warp entry for 2..chunk_max): either gone
    # would leave part of the tokens range without a launch
    ([], ["kern_qk_norm_rope_kv_warp"], r"covers \{'tokens': \[2, 512\]\} of a `when`-group"),
    ([], ["kern_qk_norm_rope_kv"], r"covers \{'tokens': \[1, 1\]\} of a `when`-group"),
])
def test_drop_entry_refusals(drop: list[str], entries: list[str], match: str) -> None:
    with pytest.raises(am.AblationError, match=match):
        am.ablate(_manifest(), drop, entries)


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a.json"
    assert am.main([str(V2), "--drop", "gemv_o", "--out", str(out)]) == 0
    assert "36 removed" in capsys.readouterr().out
    assert all(c["op"] != "gemv_o" for c in json.loads(out.read_text())["programs"]["decode"]["calls"])
    assert am.main([str(V2), "--drop", "nope", "--out", str(out)]) == 1
    assert "not called by the decode program" in capsys.readouterr().err


@pytest.mark.parametrize(("out", "reason"), [("missing/a.json", "No such file or directory"), (".", "Is a directory")])
def test_cli_unwritable_out_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], out: str,
                                        reason: str) -> None:
    target = tmp_path / out
    assert am.main([str(V2), "--drop", "gemv_o", "--out", str(target)]) == 1
    captured = capsys.readouterr()
    assert captured.err == f"ablate_manifest: --out {target}: {reason}\n" and captured.out == ""


@pytest.mark.parametrize(("calls", "match"), [
    ([1, 2], r"^programs\.decode\.calls\[0\] is not a call object with an op name: 1$"),
    ("gemv_o", r"^programs\.decode\.calls is a JSON str, expected a list of calls$"),
    ({"op": "gemv_o"}, r"^programs\.decode\.calls is a JSON dict, expected a list of calls$"),
    ([{"op": "gemv_o", "args": {}}, {"op": ["gemv_o"]}],
     r"^programs\.decode\.calls\[1\] is not a call object with an op name: \{\"op\": \[\"gemv_o\"\]\}$"),
])
def test_malformed_decode_calls_are_refused(calls: object, match: str) -> None:
    m = _manifest()
    m["programs"]["decode"]["calls"] = calls
    with pytest.raises(am.AblationError, match=match):
        am.ablate(m, ["gemv_o"])


def test_malformed_ops_under_drop_entry_are_refused() -> None:
    m = _manifest()
    m["ops"]["attn_decode"]["launches"] = [1]
    with pytest.raises(am.AblationError, match=r"^ops\.attn_decode\.launches is not a list of launch objects$"):
        am.ablate(m, [], ["kern_attn_decode_reduce"])
    m["ops"] = []
    with pytest.raises(am.AblationError, match=r"^ops is a JSON list, expected an object$"):
        am.ablate(m, [], ["kern_attn_decode_reduce"])


def test_cli_unreadable_inputs_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a.json"
    out.write_text("keep")
    bad = tmp_path / "m.json"
    for content, reason in ((b'{"name": "\xff"}', "not UTF-8 text (byte 0xff at offset 10)"),
                            (b'{"programs": {"decode": {"calls": [1]}}}',
                             "programs.decode.calls[0] is not a call object with an op name: 1"),
                            (b'{"programs": {"decode": {"calls": "gemv_o"}}}',
                             "programs.decode.calls is a JSON str, expected a list of calls")):
        bad.write_bytes(content)
        assert am.main([str(bad), "--drop", "gemv_o", "--out", str(out)]) == 1
        captured = capsys.readouterr()
        assert captured.err == f"ablate_manifest: {bad}: {reason}\n" and captured.out == ""
    assert am.main([str(tmp_path / "none.json"), "--drop", "gemv_o", "--out", str(out)]) == 1
    assert capsys.readouterr().err == f"ablate_manifest: {tmp_path / 'none.json'}: No such file or directory\n"
    assert out.read_text() == "keep" and sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "m.json"]
