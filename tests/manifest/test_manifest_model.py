"""Valid manifests: round trip, digest, helpers the runtime uses, the CLI, and docs/manifest.md in sync."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from kern_manifest import (
    ArgWiring,
    Buffer,
    Expr,
    ExternLaunch,
    InterleaveSegment,
    Launch,
    ManifestError,
    ManifestParseError,
    ManifestVerifyError,
    RowsSegment,
    TensorSegment,
    canonical_json,
    dtype_size,
    find_faults,
    load_manifest,
    parse_manifest,
    verify,
)
from kern_manifest.cli import check, main

DATA = Path(__file__).parent / "data"
EXAMPLE_PATH = DATA / "example.json"
EXAMPLE: dict[str, Any] = json.loads(EXAMPLE_PATH.read_text())
DOC = Path(__file__).resolve().parents[2] / "docs" / "manifest.md"


def canonical_sha(obj: dict[str, Any]) -> str:
    body = {k: v for k, v in obj.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
                          .encode()).hexdigest()


def valid_manifests() -> list[tuple[str, dict[str, Any]]]:
    out = [("example", EXAMPLE)]
    for path in sorted(DATA.glob("valid_*.json")):
        out.append((path.stem, json.loads(path.read_text())))
    return out


@pytest.mark.parametrize("obj", [v for _, v in valid_manifests()], ids=[n for n, _ in valid_manifests()])
def test_valid_manifest_round_trips(obj: dict[str, Any]) -> None:
    m = parse_manifest(json.dumps(obj))
    verify(m)
    assert find_faults(m) == []
    assert m.to_json() == obj  # the JSON value comes back exactly, explicit defaults included
    assert parse_manifest(m.to_json()) == m
    assert parse_manifest(json.dumps(m.to_json(), indent=1)) == m
    assert m.digest == canonical_sha(obj)


def test_digest_is_sha256_of_canonical_json_and_is_checked() -> None:
    obj = copy.deepcopy(EXAMPLE)
    digest = canonical_sha(obj)
    obj["digest"] = digest
    m = parse_manifest(obj)
    verify(m)
    assert (m.digest, m.declared_digest, m.to_json()["digest"]) == (digest, digest, digest)
    assert canonical_json(m.to_json(with_digest=False)) == json.dumps(
        EXAMPLE, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    obj["meta"]["hidden"] = 65  # any change moves the digest
    with pytest.raises(ManifestVerifyError) as info:
        verify(parse_manifest(obj))
    assert info.value.paths == ["$.digest"]


def test_explicit_defaults_and_key_order_do_not_change_the_digest_or_equality() -> None:
    obj = copy.deepcopy(EXAMPLE)
    obj["buffers"]["hidden"]["placement"] = "device"
    obj["buffers"]["hidden"]["export"] = False
    obj["programs"]["step"]["kind"] = "run"
    m = parse_manifest(obj)
    assert m.to_json() == obj  # written back although they are defaults
    assert m == parse_manifest(EXAMPLE)  # equality is semantic
    assert m.digest != parse_manifest(EXAMPLE).digest  # the digest hashes what was written
    reordered = dict(reversed(list(EXAMPLE.items())))
    assert parse_manifest(reordered).digest == parse_manifest(EXAMPLE).digest


def test_typed_model_of_the_example() -> None:
    m = load_manifest(EXAMPLE_PATH)
    assert (m.vars["tokens"].min, m.vars["tokens"].max) == (1, 64)
    assert m.modules["norm"].cubin_filename == "norm-222222222222.cubin"
    hidden = m.buffers["hidden"]
    assert (hidden.kind, hidden.dtype, hidden.shape, hidden.placement, hidden.export) == (
        "workspace", "bf16", (Expr("tokens"), Expr(64)), "device", False)
    # hidden: bf16[tokens=64, 64] -> 64 * 64 * 2 bytes
    assert hidden.nbytes_at_max(m.vars) == 8192
    assert m.buffers["next_token"].nbytes_at_max(m.vars) == 64 * 8
    assert m.buffers["final_norm"].nbytes_at_max(m.vars) == 128
    assert m.buffers["w_qkv.0"].bind == (
        TensorSegment(tensor="model.layers.0.self_attn.q_proj.weight", shape=(64, 64)),
        TensorSegment(tensor="model.layers.0.self_attn.k_proj.weight", shape=(32, 64)),
        TensorSegment(tensor="model.layers.0.self_attn.v_proj.weight", shape=(32, 64)),
    )
    kv = m.states["kv.0"]
    assert (kv.kind, kv.pooled, kv.page_bytes) == ("paged", True, 2048)
    rms = m.ops["rmsnorm"].launches[0]
    assert isinstance(rms, Launch)
    assert rms.params[3] == (24, 8) and rms.args[3] == ArgWiring(arg="out")
    assert rms.vars_read == frozenset({"tokens"})
    gemm = m.ops["gemm"].launches[0]
    assert isinstance(gemm, ExternLaunch) and gemm.name == "cublaslt_bf16_tn" and gemm.algo is not None
    assert (gemm.algo.id, gemm.algo.tile, gemm.algo.split_k) == (21, 18, None)
    assert gemm.vars_read == frozenset({"tokens"})  # through its `when`
    assert m.ops["argmax"].scratch_nbytes_at_max(m.vars) == {"part_val": 1024, "part_idx": 1024}
    assert m.programs["decode"].vars_read(m) == frozenset({"tokens"})
    assert m.programs["load"].vars_read(m) == frozenset()
    assert [c.op for c in m.programs["decode"].flat_calls(m)] == ["embed", "rmsnorm", "gemm", "gemm", "argmax"]


def test_program_vars_read_follows_forwarded_int_args_and_offsets() -> None:
    obj = copy.deepcopy(EXAMPLE)
    obj["programs"]["step"]["calls"][3]["args"]["w"] = {"buffer": "embed", "offset": "seqs * 0"}
    obj["programs"]["load"]["calls"][0]["args"]["table"] = {"buffer": "rope", "offset": "seqs - 1"}
    m = parse_manifest(obj)
    verify(m)
    assert m.programs["decode"].vars_read(m) == frozenset({"tokens", "seqs"})
    assert m.programs["load"].vars_read(m) == frozenset({"seqs"})


@pytest.mark.parametrize("dtype, size", [("bf16", 2), ("f16", 2), ("f32", 4), ("f64", 8), ("i8", 1), ("u8", 1),
                                         ("i16", 2), ("i32", 4), ("u32", 4), ("i64", 8), ("u64", 8),
                                         ("fp8_e4m3", 1), ("fp8_e5m2", 1)])
def test_dtype_size(dtype: str, size: int) -> None:
    assert dtype_size(dtype) == size


def test_dtype_size_unknown() -> None:
    with pytest.raises(ManifestError, match="unknown dtype 'bfloat16'"):
        dtype_size("bfloat16")


def test_rows_and_interleave_segments_tile_exactly() -> None:
    obj = copy.deepcopy(EXAMPLE)
    obj["buffers"]["w_gate_up.0"] = {"kind": "weight", "dtype": "bf16", "shape": [96, 64], "bind": [
        {"interleave": ["gate", "up"], "rows": 16, "shape": [32, 64]},
        {"tensor": "extra", "rows": [8, 40], "shape": [40, 64]},
    ]}
    obj["buffers"]["w_one_unknown"] = {"kind": "weight", "dtype": "bf16", "shape": [96, 64], "bind": [
        {"tensor": "a", "rows": [0, 32]}, {"interleave": ["gate", "up"], "rows": 16}]}
    m = parse_manifest(obj)
    verify(m)
    seg = m.buffers["w_gate_up.0"].bind
    assert isinstance(seg[0], InterleaveSegment) and seg[0].known_rows() == 64
    assert isinstance(seg[1], RowsSegment) and (seg[1].start, seg[1].stop, seg[1].known_rows()) == (8, 40, 32)
    assert m.to_json() == obj
    obj["buffers"]["w_one_unknown"]["bind"][0]["rows"] = [0, 40]  # leaves 56 rows: not a multiple of 16 x 2
    with pytest.raises(ManifestVerifyError) as info:
        verify(parse_manifest(obj))
    assert info.value.paths == ['$.buffers.w_one_unknown.bind[1]']


def test_pack_tensormap_and_rank_wirings_verify() -> None:
    obj = copy.deepcopy(EXAMPLE)
    obj["topology"] = {"tp": {"size": 2}}
    obj["ops"]["tma_copy"] = {
        "args": [{"name": "src", "kind": "ptr"}, {"name": "dst", "kind": "ptr"}],
        "launches": [{
            "module": "norm", "entry": "kern_tma_copy", "grid": ["tokens", 1, 1], "block": [128, 1, 1],
            "cluster": [2, 1, 1], "pdl": True,
            "params": [[0, 192], [192, 4]],
            "args": [{"pack": {"size": 192, "fields": [
                        {"offset": 0, "tensormap": {"arg": "src", "dtype": "bf16", "dims": [64, "tokens"],
                                                    "strides": [128], "box": [64, 16], "elem_strides": [1, 1],
                                                    "swizzle": "128B"}},
                        {"offset": 128, "arg": "dst"}, {"offset": 136, "i32": 7}]}},
                     {"rank": "tp", "type": "i32"}],
        }],
    }
    obj["programs"]["copy"] = {"graph": True, "calls": [{"op": "tma_copy", "args": {"src": "hidden", "dst": "normed"}}]}
    m = parse_manifest(obj)
    verify(m)
    assert m.to_json() == obj
    assert m.programs["copy"].vars_read(m) == frozenset({"tokens"})
    obj["ops"]["tma_copy"]["launches"][0]["args"][0]["pack"]["fields"][2]["offset"] = 132  # overlaps the pointer
    with pytest.raises(ManifestVerifyError) as info:
        verify(parse_manifest(obj))
    assert info.value.paths == ["$.ops.tma_copy.launches[0].args[0].pack.fields[2].offset"]


def test_load_manifest_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ManifestParseError, match="cannot read manifest"):
        load_manifest(tmp_path / "nope.json")


def test_frozen() -> None:
    m = parse_manifest(EXAMPLE)
    with pytest.raises(AttributeError):
        m.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        m.vars["x"] = m.vars["tokens"]  # type: ignore[index]
    assert isinstance(m.buffers["hidden"], Buffer) and hash(m.ops["rmsnorm"]) == hash(parse_manifest(EXAMPLE).ops["rmsnorm"])


# ------------------------------------------------------------------------------------------- CLI


def test_cli_check_prints_summary() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert check(str(EXAMPLE_PATH), out, err) == 0
    assert err.getvalue() == ""
    lines = out.getvalue().splitlines()
    digest = parse_manifest(EXAMPLE).digest
    assert lines[0] == f"tiny-lm  (kern-manifest/1, digest {digest[:12]})"
    assert lines[1] == "vars: tokens=[1, 64], seqs=[1, 4]"
    assert "  weight       4 buffer(s)   56.1 KiB   embed, final_norm, rope, w_qkv.0" in lines  # natural order
    assert "  kv.0: paged, 128 B/token, 16 tokens/page" in lines and "states (1):" in lines
    assert "  decode [run]: graph (5 calls -> 1 graph launch), capture key: tokens" in lines
    assert "  load [once]: 1 call(s)" in lines


def test_cli_check_lists_faults_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    obj = copy.deepcopy(EXAMPLE)
    obj["buffers"]["hidden"]["dtype"] = "bfloat16"
    obj["ops"]["embed"]["launches"][0]["module"] = "nope"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(obj))
    assert main(["check", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines()[:3] == [
        f"{path}: 2 fault(s)",
        "  $.buffers.hidden.dtype: unknown dtype 'bfloat16'; use one of bf16, f16, f32, f64, i8, u8, i16, i32, u32, "
        "i64, u64, fp8_e4m3, fp8_e5m2",
        "  $.ops.embed.launches[0].module: unknown module 'nope'; declare it in $.modules (known: embed, norm, rope, "
        "argmax)",
    ]
    path.write_text("{")
    assert main(["check", str(path)]) == 1
    assert capsys.readouterr().err.startswith(f"{path}: parse error at $: not JSON")


# ------------------------------------------------------------------------------------------- docs


def doc_example() -> dict[str, Any]:
    text = DOC.read_text()
    match = re.search(r"<!-- example: tests/manifest/data/example.json -->\s*```json\n(.*?)\n```", text, re.S)
    assert match, "docs/manifest.md lost its worked example block"
    return json.loads(match.group(1))


def test_doc_worked_example_is_the_tested_example_and_verifies() -> None:
    obj = doc_example()
    assert obj == EXAMPLE
    verify(parse_manifest(obj))
