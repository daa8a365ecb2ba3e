"""Control-flow check of a kernel's SASS: can it exit without executing `griddepcontrol.wait` (ACQBULK)?

A kernel launched with programmatic dependent launch must wait on every path before it exits
(docs/kernels.md "Programmatic dependent launch"): a grid that completes before its predecessor lets the
kernel after it overtake that predecessor. A SASS-level `ACQBULK` somewhere in the function
(tests/run/test_decode_pdl_sass.py's first check) does not show that every path reaches it; this module
builds the function's control-flow graph from `cuobjdump -sass` text and lists the EXIT instructions that
some path from the entry reaches without passing an ACQBULK.

The graph is syntactic: every branch may go either way, whatever the data, so a listed exit may be
unreachable in practice; an empty list proves that no path exits unwaited. Instructions: `BRA` (with a
guard predicate `@P` or a condition operand: both ways, else only to its target), `EXIT` (with a guard:
exits and falls through), `ACQBULK` (ends a path: the wait has happened), `BPT` / `RET` (end a path without
an exit); everything else falls through. Indirect jumps (`BRX`, `JMX`, `JMP`) cannot be followed and raise
SassPathError; `CALL` is taken to return (its callee is not searched for a wait).

Options: -h / --help prints this text. Exit 0 when every listed function waits on every path, 1 when some
function has an unwaited exit, 2 on an error (one line on stderr): no cuobjdump, a cubin that is missing or
does not disassemble, a disassembly with no functions, an entry the cubin does not define (the line lists the
ones it does), SASS whose control flow cannot be followed (naming the function).

    python3 tools/sass_paths.py kernels/attention-<sha12>.cubin [entry ...]   # unwaited exits per entry
"""

from __future__ import annotations

import re
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from kern_runtime import sass  # cuobjdump discovery, disassembly and the SASS line format

ROOT = Path(__file__).resolve().parents[1]

_TARGET = re.compile(r"0x([0-9a-f]+)\s*$")


class SassPathError(ValueError):
    """The SASS cannot be analysed (an indirect jump, a branch to no instruction, no instructions)."""


@dataclass(frozen=True)
class Instr:
    addr: int
    guard: str  # "@P0", "@!UP1", ... or "" (always executes)
    op: str  # opcode with its modifiers, e.g. "BRA", "EXIT", "LDG.E.128"
    operands: str


def _instr(addr: int, text: str) -> Instr:
    guard = ""
    if text.startswith("@"):
        guard, _, text = text.partition(" ")
    op, _, operands = text.strip().partition(" ")
    return Instr(addr, guard, op, operands.strip())


def parse_functions(text: str) -> dict[str, list[Instr]]:
    """`cuobjdump -sass` output -> {function name: instructions in address order}."""
    return {fn: [_instr(a, t) for a, t in instrs] for fn, instrs in sass.parse_sass_addressed(text).items()}


def _kind(op: str) -> str:
    return op.split(".", 1)[0]


def unwaited_exits(instrs: list[Instr]) -> list[int]:
    """Addresses of the EXIT instructions reachable from the first instruction without passing an ACQBULK
    (empty: every path waits before it exits). Raises SassPathError when the graph cannot be built."""
    if not instrs:
        raise SassPathError("no instructions")
    index = {ins.addr: i for i, ins in enumerate(instrs)}

    def successors(i: int) -> list[int]:
        ins = instrs[i]
        kind = _kind(ins.op)
        nxt = [i + 1] if i + 1 < len(instrs) else []
        if kind in ("BRX", "JMX", "JMP"):
            raise SassPathError(f"indirect jump at {ins.addr:#06x}: {ins.op} {ins.operands}")
        if kind == "BRA":
            m = _TARGET.search(ins.operands)
            if m is None or int(m.group(1), 16) not in index:
                raise SassPathError(f"branch at {ins.addr:#06x} to no instruction: {ins.operands}")
            target = [index[int(m.group(1), 16)]]
            conditional = bool(ins.guard) or "," in ins.operands
            return target + nxt if conditional else target
        if kind == "EXIT":
            return nxt if ins.guard else []
        if kind in ("BPT", "RET") and not ins.guard:
            return []
        return nxt

    exits: list[int] = []
    seen = {0}
    todo = deque([0])
    while todo:
        i = todo.popleft()
        ins = instrs[i]
        if _kind(ins.op) == "ACQBULK":
            continue  # the wait: every path through here has waited
        if _kind(ins.op) == "EXIT":
            exits.append(ins.addr)
        for j in successors(i):
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return sorted(exits)


def cubin_functions(cubin: Path, cuobjdump: str) -> dict[str, list[Instr]]:
    """Every function of a cubin, disassembled with `cuobjdump -sass` (kern_runtime.sass.disassemble: nvdisasm
    beside cuobjdump, on NVDISASM_PATH or from the wheels). Raises SassPathError when the cubin is not a file,
    the disassembly fails or lists no function (nothing to prove: never "every path waits")."""
    if not cubin.is_file():
        raise SassPathError(f"{cubin}: no such file")
    out = sass.disassemble(cubin, cuobjdump)
    if out.returncode != 0:
        raise SassPathError(f"cuobjdump -sass {cubin}: {' '.join(out.stderr.split())[:300]}")
    functions = parse_functions(out.stdout)
    if not functions:
        raise SassPathError(f"cuobjdump -sass {cubin}: no functions in the disassembly (not a cubin with code?)")
    return functions


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    tool = sass.find_cuobjdump()
    if not tool:
        print("sass_paths: no cuobjdump (set CUOBJDUMP, put it on PATH or install the nvidia-cuda-cuobjdump wheel)",
              file=sys.stderr)
        return 2
    try:
        functions = cubin_functions(Path(argv[0]), tool)
        names = argv[1:] or sorted(functions)
        unknown = [name for name in names if name not in functions]
        if unknown:
            raise SassPathError(f"{argv[0]} has no function {', '.join(unknown)} "
                                f"(it has: {', '.join(sorted(functions))})")
        results = {}
        for name in names:  # every function analysed before anything is printed
            try:
                results[name] = unwaited_exits(functions[name])
            except SassPathError as exc:
                raise SassPathError(f"{argv[0]}: {name}: {exc}") from None
    except SassPathError as exc:
        print(f"sass_paths: {exc}", file=sys.stderr)
        return 2
    for name, exits in results.items():
        print(f"{name}: " + (", ".join(f"{a:#06x}" for a in exits) + " exit(s) without a wait" if exits
                             else "every path waits"))
    return 1 if any(results.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
