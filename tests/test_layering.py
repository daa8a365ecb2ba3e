"""Layering is checked, not hoped for (STYLE.md habit 11).

Every `.py` file under `packages/*/src` is parsed with `ast`; each absolute import is classified:

- stdlib (`sys.stdlib_module_names`, plus `__future__`): always allowed;
- a kern package: allowed only when it is strictly below the importer (or the importer itself);
  kern-manifest and kern-pool are both at the bottom and independent of each other;
- anything else: a third-party import. kern-manifest and kern-pool take none at import time: the only
  third-party imports they may hold are of an optional extra they declare (`kern-pool[plot]`), made
  lazily inside a function, so `pip install kern-pool` alone still works. Upper packages may import the
  third-party distributions their pyproject.toml declares (dependencies or optional extras), or that a
  kern package they depend on declares as a dependency (installed with it, so always present).
  `LAZY_UNDECLARED` lists the few reviewed exceptions: undeclared modules an upper package may import
  only inside a function (parity references that exist on the GPU machine only).
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# import name -> level; a package may import kern packages of a strictly lower level only.
KERN_LEVELS = {"kern_manifest": 0, "kern_pool": 0, "kern_runtime": 1, "kern_run": 2}
BOTTOM = {name for name, level in KERN_LEVELS.items() if level == 0}

# Distribution name (normalised) -> the top-level modules it provides, where they differ from the name.
DIST_MODULES = {
    "cuda-bindings": {"cuda"},
    "cuda-python": {"cuda"},
    "cuda-core": {"cuda"},
    "nvmath-python": {"nvmath"},
    "cupy-cuda12x": {"cupy", "cupyx", "cupy_backends"},
    "cupy-cuda13x": {"cupy", "cupyx", "cupy_backends"},
    "pyyaml": {"yaml"},
    "pillow": {"PIL"},
    "scikit-learn": {"sklearn"},
    "typer": {"typer"},
    "rich": {"rich"},
    "structlog": {"structlog"},
    "tokenizers": {"tokenizers"},
    "matplotlib": {"matplotlib", "mpl_toolkits"},
}


# package -> undeclared third-party modules it may import lazily (inside a function), never at import time.
LAZY_UNDECLARED = {
    "kern_run": {"torch", "transformers"},  # kern_run.reference: the HF parity reference (GPU machine only)
}


@dataclass(frozen=True)
class Import:
    module: str  # top-level module name
    file: Path
    line: int
    lazy: bool  # inside a function body (not executed at import time)


def _dist_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, f"cannot read requirement {requirement!r}"
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def _modules_of(dist: str) -> set[str]:
    return DIST_MODULES.get(dist, {dist.replace("-", "_")})


def imports_in(path: Path) -> list[Import]:
    """Absolute imports of one source file (relative imports stay inside the package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            child_lazy = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend(Import(a.name.split(".")[0], path, child.lineno, lazy) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append(Import(child.module.split(".")[0], path, child.lineno, lazy))
            visit(child, child_lazy)

    visit(tree, False)
    return found


@dataclass(frozen=True)
class Package:
    dist: str  # kern-manifest
    module: str  # kern_manifest
    src: Path
    deps: frozenset[str]  # top-level modules of declared third-party dependencies
    extras: frozenset[str]  # top-level modules of optional extras


def discover(root: Path) -> list[Package]:
    projects = {}
    for pyproject in sorted(root.glob("packages/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        projects[project["name"]] = (pyproject, project)

    def closure(dist: str, seen: frozenset[str] = frozenset()) -> set[str]:
        """Declared dependencies of `dist` plus, through kern packages, theirs (cycles are cut)."""
        deps = {_dist_name(r) for r in projects[dist][1].get("dependencies", [])}
        for d in list(deps):
            if d in projects and d not in seen:
                deps |= closure(d, seen | {dist})
        return deps

    packages = []
    for dist, (pyproject, project) in projects.items():
        deps = closure(dist)
        extras = {_dist_name(r) for reqs in project.get("optional-dependencies", {}).values() for r in reqs}
        for src in sorted((pyproject.parent / "src").iterdir()):
            if src.is_dir() and (src / "__init__.py").exists():
                packages.append(Package(
                    dist=project["name"], module=src.name, src=src,
                    deps=frozenset(m for d in deps if not d.startswith("kern-") for m in _modules_of(d)),
                    extras=frozenset(m for d in extras if not d.startswith("kern-") for m in _modules_of(d)),
                ))
    return packages


def violations(pkg: Package) -> list[str]:
    """Every import of `pkg` that breaks the layering, as 'file:line: message'."""
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    out = []
    level = KERN_LEVELS.get(pkg.module)
    for file in sorted(pkg.src.rglob("*.py")):
        for imp in imports_in(file):
            where = f"{file.relative_to(pkg.src.parent.parent.parent.parent)}:{imp.line}"
            if imp.module in stdlib or imp.module == pkg.module:
                continue
            if imp.module in KERN_LEVELS:
                if level is None or KERN_LEVELS[imp.module] >= level:
                    out.append(f"{where}: {pkg.module} imports {imp.module}, which is not below it")
                continue
            if imp.module.startswith("kern"):
                out.append(f"{where}: {pkg.module} imports unknown kern package {imp.module}")
            elif pkg.module in BOTTOM:
                if not (imp.lazy and imp.module in pkg.extras):
                    out.append(f"{where}: {pkg.module} must use the standard library only, but imports {imp.module}"
                               + (" at import time (import an optional extra inside a function)"
                                  if imp.module in pkg.extras else ""))
            elif imp.lazy and imp.module in LAZY_UNDECLARED.get(pkg.module, ()):
                continue
            elif imp.module not in pkg.deps | pkg.extras:
                out.append(f"{where}: {pkg.module} imports {imp.module}, which neither {pkg.dist} nor a kern package "
                           "below it declares")
    return out


PACKAGES = discover(ROOT)


def test_all_four_packages_are_found() -> None:
    assert sorted(p.module for p in PACKAGES) == ["kern_manifest", "kern_pool", "kern_run", "kern_runtime"]


@pytest.mark.parametrize("pkg", PACKAGES, ids=lambda p: p.module)
def test_package_respects_layering(pkg: Package) -> None:
    assert violations(pkg) == []


def _fake_tree(tmp_path: Path, files: dict[str, str], pyprojects: dict[str, str]) -> list[Package]:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for dist, text in pyprojects.items():
        (tmp_path / "packages" / dist / "pyproject.toml").write_text(text)
    return discover(tmp_path)


def test_checker_catches_each_kind_of_violation(tmp_path: Path) -> None:
    pkgs = _fake_tree(tmp_path, {
        "packages/kern-manifest/src/kern_manifest/__init__.py": "import json\nimport numpy\nfrom kern_pool import x\n",
        "packages/kern-pool/src/kern_pool/__init__.py": (
            "from . import sim\nimport matplotlib\ndef plot():\n    import matplotlib.pyplot\n"),
        "packages/kern-runtime/src/kern_runtime/__init__.py": (
            "import numpy\nfrom cuda.bindings import driver\nimport torch\nimport kern_run\nimport kern_manifest\n"),
        "packages/kern-run/src/kern_run/__init__.py": (
            "import typer\nimport kern_runtime\nimport numpy\nimport yaml\nimport torch\n"
            "def ref():\n    import transformers\n"),
    }, {
        "kern-manifest": '[project]\nname = "kern-manifest"\ndependencies = []\n',
        "kern-pool": '[project]\nname = "kern-pool"\ndependencies = []\n'
                     '[project.optional-dependencies]\nplot = ["matplotlib>=3.7"]\n',
        "kern-runtime": '[project]\nname = "kern-runtime"\ndependencies = ["kern-manifest", "numpy>=1.26", '
                        '"cuda-bindings>=12.8"]\n',
        "kern-run": '[project]\nname = "kern-run"\ndependencies = ["kern-runtime", "typer>=0.12"]\n',
    })
    got = {p.module: [v.split(": ", 1)[1] for v in violations(p)] for p in pkgs}
    assert got == {
        "kern_manifest": ["kern_manifest must use the standard library only, but imports numpy",
                          "kern_manifest imports kern_pool, which is not below it"],
        "kern_pool": ["kern_pool must use the standard library only, but imports matplotlib at import time "
                      "(import an optional extra inside a function)"],
        "kern_runtime": ["kern_runtime imports torch, which neither kern-runtime nor a kern package below it declares",
                         "kern_runtime imports kern_run, which is not below it"],
        # numpy comes with kern-runtime (a declared kern dependency); yaml comes with nothing.
        # torch is allowed to kern_run only lazily (LAZY_UNDECLARED); transformers is imported lazily.
        "kern_run": ["kern_run imports yaml, which neither kern-run nor a kern package below it declares",
                     "kern_run imports torch, which neither kern-run nor a kern package below it declares"],
    }
