"""The import rule of the repository's scripts (README "Imports in tools/, bench/ and tests/"): no `sys.path`
edits anywhere outside packages/, and repository code outside the packages imported by its dotted path from the
root (`tools.x`, `bench.x`, `tests.kernels.gpu_helpers`), never as a bare sibling name that works only when the
importer's own directory happens to be on the path."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("tools", "bench", "tests")
# modules bench/ and tests/kernels share: one module object each, so always imported as tests.kernels.*
SHARED_TEST_HELPERS = {"gpu_helpers", "gemv_gpu_helpers"}


def _files() -> list[Path]:
    return sorted(p for d in CHECKED for p in (ROOT / d).rglob("*.py"))


def _sys_path_edits(tree: ast.AST) -> list[int]:
    """Lines that call a method of sys.path or assign to it."""
    lines = []
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        if (isinstance(target, ast.Attribute) and target.attr == "path" and isinstance(target.value, ast.Name)
                and target.value.id == "sys"):
            lines.append(node.lineno)
    return sorted(lines)


def _bare_imports(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every absolute import whose top-level name is one of `names`."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] in names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in names:
                out.append((node.lineno, node.module))
    return out


def test_no_sys_path_edits() -> None:
    edits = [f"{p.relative_to(ROOT)}:{line}" for p in _files() for line in _sys_path_edits(ast.parse(p.read_text()))]
    assert edits == []


def test_tools_and_bench_modules_are_imported_by_their_dotted_path() -> None:
    scripts = {p.stem for d in ("tools", "bench") for p in (ROOT / d).glob("*.py")} - {"__init__"}
    bare = [f"{p.relative_to(ROOT)}:{line} imports {mod}" for p in _files()
            for line, mod in _bare_imports(ast.parse(p.read_text()), scripts | SHARED_TEST_HELPERS)]
    assert bare == []


@pytest.mark.parametrize("source, lines", [
    ("import sys\nsys.path.insert(0, 'x')\n", [2]),
    ("import sys\nsys.path.append('x')\nsys.path = []\n", [2, 3]),
    ("import sys\nsys.path += ['x']\nprint(sys.path)\n", [2]),
])
def test_the_sys_path_check_sees_each_kind_of_edit(source: str, lines: list[int]) -> None:
    assert _sys_path_edits(ast.parse(source)) == lines
