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
    "kern_run": {"torch", "transformers", "cupti"},  # kern_run.reference: the HF parity reference; kern_run.harvest
    # .capture: the CUPTI subscriber (cupti-python, a wheel carried to the GPU machine)
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


# ---------------------------------------------------------------- public names only, no private reads
#
# (a) kern-run, tools/ and bench/ import from kern_runtime, kern_manifest and kern_pool only the names their
#     `__all__` lists, and only from the modules in PUBLIC_MODULES (each package's top level, plus the few
#     submodules that declare a public API of their own). `import kern_runtime` followed by
#     `kern_runtime.X` counts as importing X.
# (b) No package (nor tools/, bench/) reads another package's private names. The scan (ast, no import) flags:
#     `from X import _y`; a dotted import through a private module (`kern_pool._x`); `M._y` where M is a
#     module of another kern package; and `<anything>._y` where `_y` is a private attribute that another kern
#     package defines (assigns as `self._y`, or lists in `__slots__`) and the reading package never defines
#     itself: that is how a read of a handle's internals (`lease.inner._pool`, `parked._host`) shows up when
#     the object's type is not visible to a static scan. Dunders (`__x__`) are not private. Reach: attribute
#     names only; a private name that both packages happen to define is not caught.
# (c) The package order: test_package_respects_layering above.

KERN_MODULES = ("kern_runtime", "kern_manifest", "kern_pool")
PUBLIC_MODULES = {
    "kern_runtime": "packages/kern-runtime/src/kern_runtime/__init__.py",
    "kern_runtime.cuda": "packages/kern-runtime/src/kern_runtime/cuda/__init__.py",  # driver / cuBLASLt / SASS for tools
    # the cuBLASLt pin searches: kern run's first use (kern_run.pins_cache), tools/pick_algos.py
    "kern_runtime.gemm_pins": "packages/kern-runtime/src/kern_runtime/gemm_pins/__init__.py",
    "kern_manifest": "packages/kern-manifest/src/kern_manifest/__init__.py",
    "kern_manifest.cli": "packages/kern-manifest/src/kern_manifest/cli.py",  # `kern manifest check` runs its `check`
    "kern_pool": "packages/kern-pool/src/kern_pool/__init__.py",
}
CALLERS = ("packages/kern-run/src", "tools", "bench", "examples")


def exported_names(path: Path) -> frozenset[str]:
    """The strings of a module's literal `__all__` (empty when it has none)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
                return frozenset(ast.literal_eval(node.value))
    return frozenset()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def public_import_violations(files: list[Path], root: Path, public: dict[str, frozenset[str]]) -> list[str]:
    """(a) for `files`: every name imported from a kern package (or read off its module) must be exported."""
    out = []
    for file in files:
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
        where = lambda node: f"{file.relative_to(root)}:{node.lineno}"  # noqa: E731
        aliases: dict[str, str] = {}  # local name -> kern module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    node.module.split(".")[0] in KERN_MODULES:
                if node.module not in public:
                    out.append(f"{where(node)}: imports from {node.module}, which is not a public module "
                               f"({', '.join(sorted(public))})")
                    continue
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    if alias.name not in public[node.module] and sub not in public:
                        out.append(f"{where(node)}: {node.module} does not export {alias.name!r}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] not in KERN_MODULES:
                        continue
                    if alias.name not in public:
                        out.append(f"{where(node)}: imports {alias.name}, which is not a public module")
                    aliases[alias.asname or alias.name.split(".")[0]] = alias.asname and alias.name or \
                        alias.name.split(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                module = aliases[node.value.id]
                if module in public and node.attr not in public[module] and f"{module}.{node.attr}" not in public:
                    out.append(f"{where(node)}: {module} does not export {node.attr!r}")
    return out


def _defined_privates(files: list[Path]) -> set[str]:
    """Private attribute names a package defines: `self._x = ...` targets, `__slots__` entries and private
    methods (`def _x`)."""
    names: set[str] = set()
    for file in files:
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr):
                names.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name):
                names.add(node.name)
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                       for t in node.targets):
                try:
                    names.update(n for n in ast.literal_eval(node.value) if _private(n))
                except ValueError:
                    pass
    return names


def private_read_violations(groups: dict[str, list[Path]], root: Path) -> list[str]:
    """(b) for each group (a kern package, or a caller folder): reads of another package's private names."""
    defined = {name: _defined_privates(files) for name, files in groups.items()}
    out = []
    for name, files in groups.items():
        foreign = set().union(*(d for other, d in defined.items() if other != name and other in KERN_MODULES))
        foreign -= defined[name]
        for file in files:
            tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
            where = lambda node: f"{file.relative_to(root)}:{node.lineno}"  # noqa: E731
            modules: set[str] = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    top = node.module.split(".")[0]
                    if top in KERN_MODULES and top != name:
                        if any(_private(part) for part in node.module.split(".")):
                            out.append(f"{where(node)}: imports from private module {node.module}")
                        for alias in node.names:
                            if _private(alias.name):
                                out.append(f"{where(node)}: imports private {node.module}.{alias.name}")
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        top = alias.name.split(".")[0]
                        if top in KERN_MODULES and top != name:
                            modules.add(alias.asname or top)
            for node in ast.walk(tree):
                if not isinstance(node, ast.Attribute) or not _private(node.attr) or isinstance(node.ctx, ast.Store):
                    continue
                if isinstance(node.value, ast.Name) and node.value.id in modules:
                    out.append(f"{where(node)}: reads private {node.value.id}.{node.attr}")
                elif node.attr in foreign:
                    out.append(f"{where(node)}: reads {node.attr}, a private attribute of another kern package")
    return out


def _py_files(*dirs: Path) -> list[Path]:
    return sorted(f for d in dirs for f in d.rglob("*.py") if ".venv" not in f.parts)


def _public(root: Path) -> dict[str, frozenset[str]]:
    return {module: exported_names(root / rel) for module, rel in PUBLIC_MODULES.items()}


def test_every_public_module_declares_its_names() -> None:
    public = _public(ROOT)
    assert all(public[m] for m in PUBLIC_MODULES), {m for m in PUBLIC_MODULES if not public[m]}


def test_callers_import_only_exported_names() -> None:
    files = _py_files(*(ROOT / c for c in CALLERS))
    assert public_import_violations(files, ROOT, _public(ROOT)) == []


def test_no_package_reads_another_packages_private_names() -> None:
    groups = {pkg.module: _py_files(pkg.src) for pkg in PACKAGES}
    groups.update({c: _py_files(ROOT / c) for c in ("tools", "bench", "examples")})
    assert private_read_violations(groups, ROOT) == []


def test_public_and_private_checks_catch_each_kind(tmp_path: Path) -> None:
    files = {
        "pub/kern_runtime/__init__.py": '__all__ = ["Runtime"]\n',
        "pub/kern_pool/__init__.py": '__all__ = ["Pool"]\n',
        "pool/kern_pool/pool.py": "class Lease:\n    __slots__ = ('_pool',)\n    def __init__(self):\n"
                                  "        self._host = 1\n",
        "rt/kern_runtime/pooled.py": ("import kern_pool\nfrom kern_pool.host import _settle\n"
                                      "def f(lease, parked):\n    return lease.inner._pool, parked._host, "
                                      "kern_pool._hidden, lease._mine\nclass W:\n    def __init__(self):\n"
                                      "        self._mine = 0\n"),
        "run/kern_run/x.py": ("import kern_runtime\nfrom kern_runtime import Runtime, Hidden\n"
                              "from kern_runtime.cuda.driver import call\nkern_runtime.Runtime\nkern_runtime.Spec\n"),
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    public = {"kern_runtime": exported_names(tmp_path / "pub/kern_runtime/__init__.py"),
              "kern_pool": exported_names(tmp_path / "pub/kern_pool/__init__.py")}
    got = [v.split(": ", 1)[1] for v in public_import_violations([tmp_path / "run/kern_run/x.py"], tmp_path, public)]
    assert got == ["kern_runtime does not export 'Hidden'",
                   "imports from kern_runtime.cuda.driver, which is not a public module (kern_pool, kern_runtime)",
                   "kern_runtime does not export 'Spec'"]
    groups = {"kern_pool": [tmp_path / "pool/kern_pool/pool.py"], "kern_runtime": [tmp_path / "rt/kern_runtime/pooled.py"]}
    got = sorted(v.split(": ", 1)[1] for v in private_read_violations(groups, tmp_path))
    assert got == ["imports private kern_pool.host._settle",
                   "reads _host, a private attribute of another kern package",
                   "reads _pool, a private attribute of another kern package",
                   "reads private kern_pool._hidden"]


@pytest.mark.parametrize("module", sorted(PUBLIC_MODULES))
def test_every_exported_name_exists(module: str) -> None:
    """What a public module's `__all__` promises is there (importing it loads no CUDA library)."""
    import importlib

    mod = importlib.import_module(module)
    assert [name for name in mod.__all__ if not hasattr(mod, name)] == []
