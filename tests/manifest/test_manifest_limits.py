"""Inputs at and past the format's size limits get typed errors with paths, never a Python exception
(RecursionError, OverflowError, ValueError) from deep inside the parser: huge integers, long expression
chains, deep free-form values, long chains of inlined programs (found by a break-it review)."""

from __future__ import annotations

import copy
import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
from manifest_testkit import assert_parse_fault, assert_verify_faults, mutate

from kern_manifest import Expr, ExprError, ManifestParseError, parse_manifest, verify
from kern_manifest import MAX_MANIFEST_BYTES, read_manifest_bytes
from kern_manifest.cli import main as manifest_cli
from kern_manifest.parse import MAX_FREE_DEPTH

EXAMPLE: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "example.json").read_text())
EPS_ARG = "$.ops.rmsnorm.launches[0].args[6].f32"


def _set_eps(value: Any) -> dict[str, Any]:
    return mutate(EXAMPLE, lambda o: o["ops"]["rmsnorm"]["launches"][0]["args"].__setitem__(6, {"f32": value}))


def test_number_too_large_for_a_double() -> None:
    text = json.dumps(EXAMPLE).replace('{"f32": 1e-06}', '{"f32": 1' + "0" * 400 + "}")
    assert_parse_fault(text, EPS_ARG, "an integer of 1329 bits")
    assert_parse_fault(json.dumps(_set_eps(10**400)), EPS_ARG, "finite number")
    with pytest.raises(ManifestParseError) as info:  # the decoded object too
        parse_manifest(_set_eps(10**400))
    assert info.value.path == EPS_ARG


def test_integer_past_pythons_digit_limit_in_json_text() -> None:
    text = json.dumps(EXAMPLE).replace('"shape": ["tokens", 64]', '"shape": [' + "9" * 5000 + ", 64]", 1)
    assert '[9999' in text
    assert_parse_fault(text, "$", "more than 4300 digits")


def test_integer_outside_i64_as_a_decoded_object() -> None:
    obj = mutate(EXAMPLE, lambda o: o["buffers"]["hidden"].__setitem__("shape", [10**5000, 64]))
    with pytest.raises(ManifestParseError) as info:
        parse_manifest(obj)
    assert info.value.path == "$.buffers.hidden.shape[0]"
    assert "~2^16610 is outside the signed 64-bit range" in info.value.message
    with pytest.raises(ManifestParseError, match="9223372036854775808 is outside"):
        Expr(2**63)
    assert Expr(2**63 - 1).eval({}) == 2**63 - 1


def test_long_flat_expression_chains_are_fine() -> None:
    """4096 characters may hold ~2000 operators at one parenthesis level: a left-deep tree far deeper than
    Python's recursion limit, evaluated without recursion."""
    plus = Expr("+".join(["tokens"] * 585))  # 585 * 7 - 1 = 4094 characters
    assert len(plus.source) <= 4096 and plus.vars == {"tokens"}
    assert plus.eval({"tokens": 3}) == 3 * 585
    assert Expr("*".join(["1"] * 2048)).eval({}) == 1
    assert Expr("1" + "-1" * 2047).eval({}) == 1 - 2047
    with pytest.raises(ExprError, match=f"intermediate value {2**80} is outside"):  # the first one past i64
        Expr("*".join(["big"] * 600)).eval({"big": 2**40})
    obj = mutate(EXAMPLE, lambda o: o["buffers"]["hidden"].__setitem__("shape", ["+".join(["1"] * 2000), 64]))
    verify(parse_manifest(obj))


def test_free_form_values_nest_at_most_max_free_depth() -> None:
    def nested(depth: int) -> Any:
        x: Any = []
        for _ in range(depth):
            x = [x]
        return x

    ok = mutate(EXAMPLE, lambda o: o["meta"].__setitem__("x", nested(MAX_FREE_DEPTH - 1)))
    verify(parse_manifest(ok))
    for depth in (MAX_FREE_DEPTH + 1, 5000):
        deep = mutate(EXAMPLE, lambda o, d=depth: o["meta"].__setitem__("x", nested(d)))
        with pytest.raises(ManifestParseError, match=f"nested deeper than {MAX_FREE_DEPTH} levels") as info:
            parse_manifest(deep)
        assert info.value.path.startswith("$.meta.x[0][0]")
    extra = mutate(EXAMPLE, lambda o: o["buffers"]["hidden"].__setitem__("zzz", nested(5000)))
    with pytest.raises(ManifestParseError, match="nested deeper"):
        parse_manifest(extra)


def _program_chain(n: int, back_to: str | None) -> dict[str, Any]:
    def change(o: dict[str, Any]) -> None:
        for i in range(n):
            o["programs"][f"p{i}"] = {"calls": [{"program": f"p{i + 1}"}]}
        o["programs"][f"p{n}"] = {"calls": [{"program": back_to or "step"}]}

    return mutate(EXAMPLE, change)


def test_long_chains_of_inlined_programs() -> None:
    m = parse_manifest(_program_chain(1000, None))  # deeper than the recursion limit: fine
    verify(m)
    # expanded without recursion (this used to be a RecursionError in kern-manifest check / kern inspect / kern run)
    assert [c.op for c in m.programs["p0"].flat_calls(m)] == [c["op"] for c in EXAMPLE["programs"]["step"]["calls"]]
    assert m.programs["p0"].num_calls(m) == len(EXAMPLE["programs"]["step"]["calls"])
    # the same chain closed into a cycle: one fault, at the call that closes it
    assert_verify_faults(_program_chain(1000, "p0"), ['$.programs.p1000.calls[0].program'], "program cycle p0 -> p1")
    # 1,500 programs: each one expands the rest of the chain, 1.1 M expansion steps together
    assert_verify_faults(_program_chain(1500, None), ["$.programs"], "the programs together expand to 1")


def test_cli_lists_the_fault_instead_of_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "big.json"
    path.write_text(json.dumps(EXAMPLE).replace('{"f32": 1e-06}', '{"f32": 1' + "0" * 400 + "}"))
    assert manifest_cli(["check", str(path)]) == 1
    out = capsys.readouterr()
    assert EPS_ARG in out.out + out.err and "Traceback" not in out.out + out.err


# ------------------------------------------------------------------ the manifest file itself


def _check_refuses(path: Path, capsys: pytest.CaptureFixture[str], *needles: str) -> None:
    """`kern-manifest check PATH`: one stderr line `PATH: cannot read: ...` and exit 1, as for a missing file."""
    assert manifest_cli(["check", str(path)]) == 1
    out = capsys.readouterr()
    assert out.out == "" and "Traceback" not in out.err
    lines = out.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{path}: cannot read: "), out.err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_cli_refuses_a_file_that_is_not_regular(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """/dev/zero used to be read without end (MemoryError); a FIFO would block the open."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path, kind in ((Path("/dev/zero"), "a character device"), (tmp_path, "a directory"), (fifo, "a FIFO")):
        _check_refuses(path, capsys, f"not a regular file ({kind})")
    _check_refuses(tmp_path / "missing.json", capsys, "No such file or directory")


def test_cli_refuses_a_file_past_the_size_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(MAX_MANIFEST_BYTES + 1)  # sparse
    _check_refuses(big, capsys, "too large (64.0 MiB", "at most 64.0 MiB")
    assert MAX_MANIFEST_BYTES == 64 * 2**20


def test_read_manifest_bytes(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps(EXAMPLE))
    assert read_manifest_bytes(path) == path.read_bytes()
    assert read_manifest_bytes(path, limit=path.stat().st_size) == path.read_bytes()  # the limit itself is fine
    with pytest.raises(OSError, match="too large") as info:
        read_manifest_bytes(path, limit=10)
    assert info.value.errno == errno.EFBIG
    with pytest.raises(OSError, match="not a regular file") as info:
        read_manifest_bytes("/dev/zero")
    assert info.value.errno == errno.EINVAL


@pytest.mark.parametrize("where", ["name", "meta value", "meta key", "buffer key"])
def test_a_lone_surrogate_is_a_parse_fault(where: str) -> None:
    """JSON's \\ud800 escape decodes to a lone surrogate, which no UTF-8 output carries: refused at its path
    (before, the manifest verified and `kern-manifest check` died printing its summary)."""
    lone = "\ud800"
    obj = copy.deepcopy(EXAMPLE)
    path = {"name": "$.name", "meta value": "$.meta.note", "meta key": "$.meta", "buffer key": "$.buffers"}[where]
    if where == "name":
        obj["name"] = lone
    elif where == "meta value":
        obj["meta"] = {"note": "x" + lone}
    elif where == "meta key":
        obj["meta"] = {lone: 1}
    else:
        obj["buffers"][lone] = obj["buffers"].pop(next(iter(obj["buffers"])))
    text = json.dumps(obj)  # ASCII with \ud800 escapes: valid JSON text
    for source in (obj, text):
        with pytest.raises(ManifestParseError) as info:
            parse_manifest(source)
        assert info.value.path == path
        assert "lone surrogate (U+D800" in str(info.value)


@pytest.mark.parametrize("meta", [[1, 2], None, "text", 3])
def test_meta_must_be_an_object(meta: Any) -> None:
    assert_parse_fault(json.dumps({**EXAMPLE, "meta": meta}), "$.meta", "expected an object")


@pytest.mark.parametrize("values", [{"tokens": 7.5}, {"tokens": "ab"}, {"tokens": True}, None, [("tokens", 2)]])
def test_expression_var_values_must_be_ints(values: Any) -> None:
    with pytest.raises(ExprError):
        Expr("tokens // 2").eval(values)
    assert Expr("tokens // 2").eval({"tokens": 7}) == 3
