"""The `pip install kern-pool` / `pip install kern-manifest` user's path: `uv build --all-packages` makes four
wheels carrying LICENSE, py.typed and their metadata; the two standard-library wheels, each installed alone
into a fresh venv, run their command lines away from this checkout.

No registry and no uv cache are needed: the build uses this environment's hatchling (a dev dependency;
`--no-build-isolation`), and the two wheels have no dependencies. uv is on PATH wherever tools/test.sh ran.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import zipfile
from contextlib import redirect_stdout
from email.parser import Parser
from pathlib import Path

import pytest

from test_packaging import PACKAGES, ROOT, pyproject, versions

TRACE = ROOT / "tests" / "pool" / "data" / "tiny.jsonl"
MANIFEST = ROOT / "manifests" / "qwen3-tiny.json"


def _uv() -> str:
    uv = os.environ.get("UV") or shutil.which("uv")  # `uv run` sets UV to its own binary
    assert uv, "uv not found: tools/test.sh installs it (pip install uv)"
    return uv


def _run(*args: str | Path, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def dist_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # sdist first, then each wheel from its sdist (uv build's default): what a release would upload
    _run(_uv(), "build", "--all-packages", "--no-build-isolation", "--offline", "--python", sys.executable,
         "--out-dir", out)
    return out


def _wheel(dist_dir: Path, dist: str) -> Path:
    return dist_dir / f"{PACKAGES[dist]}-{versions()[dist]}-py3-none-any.whl"


def test_uv_build_all_packages_makes_four_wheels(dist_dir: Path) -> None:
    v = versions()
    wheels = [f"{m}-{v[d]}-py3-none-any.whl" for d, m in PACKAGES.items()]
    sdists = [f"{m}-{v[d]}.tar.gz" for d, m in PACKAGES.items()]
    assert sorted(p.name for p in dist_dir.iterdir() if p.suffix in (".whl", ".gz")) == sorted(wheels + sdists)


@pytest.mark.parametrize("dist", PACKAGES)
def test_wheel_carries_license_py_typed_and_metadata(dist_dir: Path, dist: str) -> None:
    module, version = PACKAGES[dist], versions()[dist]
    info = f"{module}-{version}.dist-info"
    with zipfile.ZipFile(_wheel(dist_dir, dist)) as wheel:
        assert wheel.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
        assert wheel.read(f"{module}/py.typed") == b""
        meta = Parser().parsestr(wheel.read(f"{info}/METADATA").decode())
    table = pyproject(dist)["project"]
    assert (meta["Name"], meta["Version"], meta["License-Expression"]) == (dist, version, "Apache-2.0")
    assert meta["Summary"] == table["description"]
    assert meta.get_all("Classifier") == sorted(table["classifiers"])
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload() == (ROOT / "packages" / dist / "README.md").read_text()
    kern_requires = sorted(r for r in meta.get_all("Requires-Dist") or [] if r.split("=")[0] in PACKAGES)
    below = {"kern-manifest": [], "kern-pool": [], "kern-runtime": ["kern-manifest", "kern-pool"],
             "kern-run": ["kern-manifest", "kern-pool", "kern-runtime"]}[dist]
    assert kern_requires == [f"{d}=={versions()[d]}" for d in below]


def _fresh_venv(tmp_path: Path, wheel: Path) -> Path:
    """A new venv holding only `wheel` (installed with its declared dependencies, offline); its bin/."""
    venv = tmp_path / "venv"
    _run(_uv(), "venv", "--offline", "--python", sys.executable, venv)
    _run(_uv(), "pip", "install", "--offline", "--python", venv / "bin" / "python", wheel)
    return venv / "bin"


def _away_env() -> dict[str, str]:
    """The environment without this checkout's packages or venv on the import path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


def _in_process(main, argv: list[str]) -> str:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(argv) == 0
    return buf.getvalue()


def test_kern_pool_wheel_alone(dist_dir: Path, tmp_path: Path) -> None:
    from kern_pool.cli import main

    with zipfile.ZipFile(_wheel(dist_dir, "kern-pool")) as wheel:
        requires = Parser().parsestr(wheel.read(f"kern_pool-{versions()['kern-pool']}.dist-info/METADATA").decode())
    assert requires.get_all("Requires-Dist") == ["matplotlib>=3.7; extra == 'plot'"]  # nothing without [plot]
    bin_dir, env = _fresh_venv(tmp_path, _wheel(dist_dir, "kern-pool")), _away_env()
    version = _run(bin_dir / "kern-pool", "--version", cwd=tmp_path, env=env).stdout
    assert version == f"kern-pool {versions()['kern-pool']}\n"
    where = _run(bin_dir / "python", "-c", "import kern_pool; print(kern_pool.__file__)", cwd=tmp_path, env=env).stdout
    site = tmp_path / "venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert Path(where.strip()) == site / "kern_pool" / "__init__.py"  # the wheel's copy, not this checkout's
    alone = subprocess.run([bin_dir / "python", "-c", "import kern_manifest"], cwd=tmp_path, env=env,
                           capture_output=True, text=True)
    assert alone.returncode == 1 and "No module named 'kern_manifest'" in alone.stderr
    out = _run(bin_dir / "python", "-m", "kern_pool", "simulate", TRACE, cwd=tmp_path, env=env).stdout
    assert out == _in_process(main, ["simulate", str(TRACE)])
    assert out.splitlines()[-1] == ("requests 5, input tokens 4584, hit tokens 2559 (host 0), parked drops 0, "
                                    "hits dropped under pressure 0 tokens")


def test_kern_manifest_wheel_alone(dist_dir: Path, tmp_path: Path) -> None:
    from kern_manifest.cli import main

    with zipfile.ZipFile(_wheel(dist_dir, "kern-manifest")) as wheel:
        meta = Parser().parsestr(wheel.read(f"kern_manifest-{versions()['kern-manifest']}.dist-info/METADATA").decode())
    assert meta.get_all("Requires-Dist") is None
    bin_dir, env = _fresh_venv(tmp_path, _wheel(dist_dir, "kern-manifest")), _away_env()
    version = _run(bin_dir / "kern-manifest", "--version", cwd=tmp_path, env=env).stdout
    assert version == f"kern-manifest {versions()['kern-manifest']}\n"
    alone = subprocess.run([bin_dir / "python", "-c", "import kern_pool"], cwd=tmp_path, env=env,
                           capture_output=True, text=True)
    assert alone.returncode == 1 and "No module named 'kern_pool'" in alone.stderr
    expected = _in_process(main, ["check", str(MANIFEST)])
    assert expected.startswith("qwen3-tiny  (kern-manifest/1, digest ")
    assert _run(bin_dir / "kern-manifest", "check", MANIFEST, cwd=tmp_path, env=env).stdout == expected
    assert _run(bin_dir / "python", "-m", "kern_manifest", "check", MANIFEST, cwd=tmp_path, env=env).stdout == expected


def test_kern_run_wheel_carries_exactly_the_named_cubins(dist_dir: Path) -> None:
    """kern_run/kernels/ holds kernels.json and exactly the cubins it names, each hashing to its pinned sha256
    (packages/kern-run/hatch_build.py); kern_run/algos/ the committed pins files."""
    import hashlib
    import json

    index = json.loads((ROOT / "kernels" / "kernels.json").read_text())
    with zipfile.ZipFile(_wheel(dist_dir, "kern-run")) as wheel:
        names = wheel.namelist()
        packaged = {n[len("kern_run/kernels/"):] for n in names if n.startswith("kern_run/kernels/")}
        assert packaged == {"kernels.json"} | {rec["file"] for rec in index["modules"].values()}
        assert json.loads(wheel.read("kern_run/kernels/kernels.json")) == index
        for module, rec in index["modules"].items():
            assert rec["file"] == f"{module}-{rec['sha256'][:12]}.cubin"
            assert hashlib.sha256(wheel.read(f"kern_run/kernels/{rec['file']}")).hexdigest() == rec["sha256"]
        algos = sorted(n for n in names if n.startswith("kern_run/algos/"))
        assert algos == [f"kern_run/algos/{p.name}" for p in sorted((ROOT / "manifests" / "algos").glob("*.json"))]
        assert wheel.read("kern_run/algos/h200.json") == (ROOT / "manifests" / "algos" / "h200.json").read_bytes()
    for dist in ("kern-manifest", "kern-pool", "kern-runtime"):  # the other wheels carry no cubin
        with zipfile.ZipFile(_wheel(dist_dir, dist)) as wheel:
            assert not [n for n in wheel.namelist() if n.endswith(".cubin")]
