"""kern-pool imports only the standard library (matplotlib lazily, inside the plotting function)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import kern_pool

SRC = Path(kern_pool.__file__).parent


def _imports(tree: ast.AST) -> list[tuple[str, bool]]:
    """(top-level module name, imported at module level?) for every absolute import."""
    out: list[tuple[str, bool]] = []
    top = {id(n) for n in getattr(tree, "body", [])}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name.split(".")[0], id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module.split(".")[0], id(node) in top))
    return out


def test_only_stdlib_imports() -> None:
    allowed = set(sys.stdlib_module_names) | {"kern_pool", "__future__"}
    for path in sorted(SRC.glob("*.py")):
        for name, at_top in _imports(ast.parse(path.read_text())):
            if name == "matplotlib":
                assert not at_top and path.name == "sweep_plot.py", f"{path.name}: matplotlib must stay lazy"
                continue
            assert name in allowed, f"{path.name} imports {name}: kern-pool is standard library only"


def test_import_pulls_in_no_third_party_module() -> None:
    code = ("import sys, kern_pool, kern_pool.cli, kern_pool.simulate, kern_pool.sweep_plot; "
            "bad = [m for m in ('numpy', 'cuda', 'cupy', 'torch', 'matplotlib', 'kern_runtime') if m in sys.modules]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
