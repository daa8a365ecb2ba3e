"""The four packages' metadata, read from the source tree: one version per package (`__version__`, which
hatchling reads), exact pins between the kern packages, the LICENSE copies, py.typed, and the `--version`
flags. tests/test_wheels.py checks the same things in built wheels."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"kern-manifest": "kern_manifest", "kern-pool": "kern_pool", "kern-runtime": "kern_runtime",
            "kern-run": "kern_run"}


def pyproject(dist: str) -> dict:
    return tomllib.loads((ROOT / "packages" / dist / "pyproject.toml").read_text())


def versions() -> dict[str, str]:
    """Each kern package's `__version__`, the one source of its version."""
    return {dist: importlib.import_module(module).__version__ for dist, module in PACKAGES.items()}


def kern_pins(projects: dict[str, dict]) -> list[tuple[str, str, str]]:
    """(package, kern dependency, its specifier) for every kern package required by another, extras included."""
    pins = []
    for dist, project in projects.items():
        table = project["project"]
        requirements = list(table.get("dependencies", []))
        for extra in table.get("optional-dependencies", {}).values():
            requirements += extra
        for text in requirements:
            req = Requirement(text)
            if req.name in PACKAGES:
                pins.append((dist, req.name, str(req.specifier)))
    return pins


def pin_faults(projects: dict[str, dict], known: dict[str, str]) -> list[str]:
    """One line per kern dependency not pinned to exactly that package's version."""
    return [f"{dist} requires {dep}{spec or ' (unpinned)'}, but {dep} is {known[dep]}: pin {dep}=={known[dep]}"
            for dist, dep, spec in kern_pins(projects) if spec != f"=={known[dep]}"]


@pytest.mark.parametrize("dist", PACKAGES)
def test_version_single_source(dist: str) -> None:
    """The version lives only in `__version__`: pyproject leaves it dynamic and points hatchling at that file,
    and the installed (editable) metadata agrees."""
    project = pyproject(dist)
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["hatch"]["version"] == {"path": f"src/{PACKAGES[dist]}/__init__.py"}
    module = importlib.import_module(PACKAGES[dist])
    assert "__version__" in module.__all__
    assert metadata.version(dist) == module.__version__, "stale editable metadata: run uv sync --all-packages"


def test_kern_pins_equal_versions() -> None:
    projects = {dist: pyproject(dist) for dist in PACKAGES}
    known = versions()
    assert kern_pins(projects) == [
        ("kern-runtime", "kern-manifest", f"=={known['kern-manifest']}"),
        ("kern-runtime", "kern-pool", f"=={known['kern-pool']}"),
        ("kern-run", "kern-manifest", f"=={known['kern-manifest']}"),
        ("kern-run", "kern-pool", f"=={known['kern-pool']}"),
        ("kern-run", "kern-runtime", f"=={known['kern-runtime']}"),
    ]
    assert pin_faults(projects, known) == []


def test_pin_faults_name_a_bump_that_left_a_pin_behind() -> None:
    projects = {dist: pyproject(dist) for dist in PACKAGES}
    bumped = {**versions(), "kern-pool": "0.2.0"}
    old = versions()["kern-pool"]
    assert pin_faults(projects, bumped) == [
        f"kern-runtime requires kern-pool=={old}, but kern-pool is 0.2.0: pin kern-pool==0.2.0",
        f"kern-run requires kern-pool=={old}, but kern-pool is 0.2.0: pin kern-pool==0.2.0",
    ]
    projects["kern-run"]["project"]["dependencies"].append("kern-manifest>=0.1")
    assert pin_faults(projects, versions())[-1] == (
        f"kern-run requires kern-manifest>=0.1, but kern-manifest is {versions()['kern-manifest']}: "
        f"pin kern-manifest=={versions()['kern-manifest']}")


def test_license_is_apache_2_and_every_package_ships_the_same_text() -> None:
    text = (ROOT / "LICENSE").read_bytes()
    assert text.split(b"\n")[1:4] == [b"                                 Apache License",
                                      b"                           Version 2.0, January 2004",
                                      b"                        http://www.apache.org/licenses/"]
    assert len(text) == 11358  # the apache.org LICENSE-2.0.txt, unchanged
    for dist in PACKAGES:
        assert (ROOT / "packages" / dist / "LICENSE").read_bytes() == text, f"packages/{dist}/LICENSE differs"
        table = pyproject(dist)["project"]
        assert (table["license"], table["license-files"]) == ("Apache-2.0", ["LICENSE"])


@pytest.mark.parametrize("dist", PACKAGES)
def test_package_metadata(dist: str) -> None:
    table = pyproject(dist)["project"]
    readme = ROOT / "packages" / dist / table["readme"]
    assert table["readme"] == "README.md" and readme.read_text().startswith(f"# {dist}\n")
    assert "License: Apache-2.0" in readme.read_text()
    assert len(table["description"]) > 40 and table["keywords"]
    assert "Typing :: Typed" in table["classifiers"]
    assert (ROOT / "packages" / dist / "src" / PACKAGES[dist] / "py.typed").is_file()


@pytest.mark.parametrize(("module", "prog"), [("kern_pool", "kern-pool"), ("kern_manifest", "kern-manifest")])
def test_stdlib_cli_version(module: str, prog: str, capsys: pytest.CaptureFixture[str]) -> None:
    main = importlib.import_module(f"{module}.cli").main
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"{prog} {importlib.import_module(module).__version__}\n"


@pytest.mark.parametrize(("module", "expected"), [
    ("kern_pool", lambda: f"kern-pool {versions()['kern-pool']}"),
    ("kern_manifest", lambda: f"kern-manifest {versions()['kern-manifest']}"),
    ("kern_run", lambda: ", ".join(f"{d} {versions()[d]}" for d in ("kern-run", "kern-runtime", "kern-manifest",
                                                                    "kern-pool"))),
])
def test_python_dash_m_version(module: str, expected) -> None:
    proc = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, expected() + "\n", "")


def test_python_dash_m_kern_run_is_named_kern() -> None:
    proc = subprocess.run([sys.executable, "-m", "kern_run", "inspect", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Usage: kern inspect" in proc.stdout
