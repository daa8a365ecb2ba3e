"""tools/sass_paths.py on hand-written SASS: which EXITs a path reaches without passing ACQBULK."""

from __future__ import annotations

import pytest

import sass_paths as sp  # tools/ (on sys.path through conftest.py)


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
