"""tools/sass_paths.py on hand-written SASS: which EXITs a path reaches without passing ACQBULK."""

from __future__ import annotations

import pytest

from tools import sass_paths as sp


def sass(*lines: str) -> list[sp.Instr]:
    """Instructions at 0x00, 0x10, ... in the `cuobjdump -sass` line format, parsed back."""
    text = "\n".join(["        Function : k"] + [f"        /*{16 * i:04x}*/   {ln} ;   /* 0x0 */" for i, ln in enumerate(lines)])
    return sp.parse_functions(text)["k"]


def test_parse_keeps_address_guard_opcode_and_operands() -> None:
    (a, b, c) = sass("LDG.E.128 R4, desc[UR4][R2.64]", "@!P1 BRA !P0, 0x0", "@P0 EXIT")
    assert (a.addr, a.guard, a.op, a.operands) == (0x00, "", "LDG.E.128", "R4, desc[UR4][R2.64]")
    assert (b.addr, b.guard, b.op, b.operands) == (0x10, "@!P1", "BRA", "!P0, 0x0")
    assert (c.addr, c.guard, c.op, c.operands) == (0x20, "@P0", "EXIT", "")


def test_wait_first_then_any_exit_is_fine() -> None:
    assert sp.unwaited_exits(sass("ACQBULK", "@P0 EXIT", "MOV R1, R2", "EXIT")) == []


def test_guarded_exit_before_the_wait_is_reported() -> None:
    # the GEMVs' old bad_launch guard: a predicated EXIT ahead of the wait
    assert sp.unwaited_exits(sass("ISETP.NE.AND P0, PT, R0, RZ, PT", "@P0 EXIT", "ACQBULK", "EXIT")) == [0x10]


def test_conditional_branch_around_the_wait_is_reported() -> None:
    code = sass("@P0 BRA 0x30", "ACQBULK", "BRA 0x40", "NOP", "EXIT")
    assert sp.unwaited_exits(code) == [0x40]
    # the same shape with an unconditional branch never skips the wait
    assert sp.unwaited_exits(sass("BRA 0x10", "ACQBULK", "BRA 0x40", "NOP", "EXIT")) == []


def test_branch_with_a_condition_operand_goes_both_ways() -> None:
    code = sass("BRA !P0, 0x30", "ACQBULK", "EXIT", "EXIT")
    assert sp.unwaited_exits(code) == [0x30]


def test_loops_terminate_and_a_loop_that_skips_the_wait_is_found() -> None:
    # a loop whose body waits, entered only when its count is positive: count 0 exits unwaited (the early
    # partial's known gap has this shape)
    code = sass("@!P0 BRA 0x40", "ACQBULK", "IADD3 R0, R0, -0x1, RZ", "@P1 BRA 0x10", "EXIT", "BRA 0x50")
    assert sp.unwaited_exits(code) == [0x40]


def test_trap_and_return_end_a_path_without_an_exit() -> None:
    assert sp.unwaited_exits(sass("@P0 BRA 0x20", "BPT.TRAP 0x1", "ACQBULK", "EXIT")) == []


@pytest.mark.parametrize("bad", ["BRX R2 -0x10", "JMX R4", "BRA 0x1230"])
def test_unfollowable_flow_is_refused(bad: str) -> None:
    with pytest.raises(sp.SassPathError):
        sp.unwaited_exits(sass("NOP", bad, "ACQBULK", "EXIT"))
    with pytest.raises(sp.SassPathError, match="no instructions"):
        sp.unwaited_exits([])


# ---------------------------------------------------------------- the command line (cuobjdump faked)


def _dump(functions: dict[str, list[str]]) -> str:
    """`cuobjdump -sass` text of functions whose instructions sit at 0x00, 0x10, ..."""
    out = []
    for name, lines in functions.items():
        out.append(f"        Function : {name}")
        out += [f"        /*{16 * i:04x}*/   {ln} ;   /* 0x0 */" for i, ln in enumerate(lines)]
    return "\n".join(out) + "\n"


@pytest.fixture
def fake_cuobjdump(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """sass_paths.main with cuobjdump present: `state["stdout"]` is what `cuobjdump -sass` prints; the cubin a
    file in tmp_path; `state["calls"]` the cubins disassembled."""
    import subprocess

    state: dict[str, object] = {"stdout": "", "calls": [], "cubin": tmp_path / "k.cubin"}
    state["cubin"].write_bytes(b"\x7fELF")
    monkeypatch.setattr(sp.sass, "find_cuobjdump", lambda: "cuobjdump")

    def disassemble(cubin, tool):
        state["calls"].append(str(cubin))
        return subprocess.CompletedProcess([tool, "-sass", str(cubin)], 0, state["stdout"], "")

    monkeypatch.setattr(sp.sass, "disassemble", disassemble)
    return state


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_usage_and_touches_no_cubin(fake_cuobjdump, capsys: pytest.CaptureFixture[str],
                                                    flag: str) -> None:
    assert sp.main([flag]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("Control-flow check of a kernel's SASS") and "python3 tools/sass_paths.py" in (
        captured.out) and captured.err == ""
    assert fake_cuobjdump["calls"] == []


def test_a_disassembly_without_functions_is_an_error(fake_cuobjdump, capsys: pytest.CaptureFixture[str]) -> None:
    cubin = fake_cuobjdump["cubin"]
    assert sp.main([str(cubin)]) == 2
    captured = capsys.readouterr()
    assert captured.err == (f"sass_paths: cuobjdump -sass {cubin}: no functions in the disassembly (not a cubin "
                            "with code?)\n") and captured.out == ""


def test_unknown_function_names_are_listed_with_the_known_ones(fake_cuobjdump,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    cubin = fake_cuobjdump["cubin"]
    fake_cuobjdump["stdout"] = _dump({"kern_a": ["ACQBULK", "EXIT"], "kern_b": ["@P0 EXIT", "ACQBULK", "EXIT"]})
    assert sp.main([str(cubin), "kern_a", "kern_c", "kern_d"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"sass_paths: {cubin} has no function kern_c, kern_d (it has: kern_a, kern_b)\n"
    assert captured.out == ""
    assert sp.main([str(cubin)]) == 1
    assert capsys.readouterr().out == "kern_a: every path waits\nkern_b: 0x0000 exit(s) without a wait\n"
    assert sp.main([str(cubin), "kern_a"]) == 0
    assert capsys.readouterr().out == "kern_a: every path waits\n"


def test_unfollowable_flow_names_the_function(fake_cuobjdump, capsys: pytest.CaptureFixture[str]) -> None:
    cubin = fake_cuobjdump["cubin"]
    fake_cuobjdump["stdout"] = _dump({"kern_a": ["ACQBULK", "EXIT"], "kern_j": ["NOP", "BRX R2 -0x10", "EXIT"]})
    assert sp.main([str(cubin)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"sass_paths: {cubin}: kern_j: indirect jump at 0x0010: BRX R2 -0x10\n"
    assert captured.out == ""  # nothing printed before the error


def test_a_missing_cubin_is_named(fake_cuobjdump, capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    assert sp.main([str(tmp_path / "none.cubin")]) == 2
    assert capsys.readouterr().err == f"sass_paths: {tmp_path / 'none.cubin'}: no such file\n"
    assert fake_cuobjdump["calls"] == []
