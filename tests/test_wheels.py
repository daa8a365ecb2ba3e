"""The `pip install kern-pool` / `pip install kern-manifest` / `pip install kern-run` user's path: `uv build
--all-packages` makes four wheels carrying LICENSE, py.typed and their metadata; the two standard-library wheels,
each installed alone into a fresh venv, run their command lines away from this checkout; the four wheels together
in a fresh venv run `kern manifest build` and `kern inspect` for every published config (tests/data/configs).

No registry and no uv cache are needed: the build uses this environment's hatchling (a dev dependency;
`--no-build-isolation`), and the two standard-library wheels have no dependencies. kern-run's third-party
dependencies (typer, tokenizers, numpy, ...) cannot be resolved offline, so the four kern wheels go in with
`--no-deps --no-index` and the fresh venv reaches this environment's site-packages through one `.pth` line: a
path line of a .pth file is appended to sys.path as it is, and only site directories have their own .pth files
processed (CPython's site.addpackage appends the path; site.addsitedir, which reads .pth files, runs for site
directories alone), so this checkout's editable-install .pth files (packages/*/src, the repository root) stay
off sys.path. The tests check that claim, that every Requires-Dist the wheels declare is installed at a version
it allows, and that the kern packages import from the fresh venv. uv is on PATH wherever tools/test.sh ran.
"""

from __future__ import annotations

import io
import json
import os
import sysconfig
import shutil
import subprocess
import sys
import zipfile
from contextlib import redirect_stdout
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

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


def _fresh_venv(tmp_path: Path, *wheels: Path, no_deps: bool = False) -> Path:
    """A new venv holding only `wheels` (with their declared dependencies, offline; `no_deps`: the wheels alone,
    no index consulted); its bin/."""
    venv = tmp_path / "venv"
    _run(_uv(), "venv", "--offline", "--python", sys.executable, venv)
    _run(_uv(), "pip", "install", "--offline", *(["--no-deps", "--no-index"] if no_deps else []), "--python",
         venv / "bin" / "python", *wheels)
    return venv / "bin"


def _site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


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
    # the wheel's copy, not this checkout's
    assert Path(where.strip()) == _site_packages(tmp_path / "venv") / "kern_pool" / "__init__.py"
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


# ---------------------------------------------------------------- the four wheels together: kern-run's path

CONFIGS = ROOT / "tests" / "data" / "configs"
THIS_SITE = Path(sysconfig.get_paths()["purelib"])  # this environment's site-packages: the third-party deps

# run in the fresh venv: where each kern distribution and module comes from, each declared requirement (markers
# of no extra) with the version installed, and sys.path
PROBE = """
import json, sys
from importlib import metadata
from packaging.requirements import Requirement
import kern_manifest, kern_pool, kern_run, kern_runtime
import kern_run.pins_cache, kern_runtime.gemm_pins  # the first-use pin search is in the installed packages
out = {"sys_path": sys.path, "modules": {m.__name__: m.__file__ for m in (kern_manifest, kern_pool, kern_runtime,
                                                                          kern_run, kern_runtime.gemm_pins)},
       "dists": {}}
for name in ("kern-manifest", "kern-pool", "kern-runtime", "kern-run"):
    dist = metadata.distribution(name)
    requires = []
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            try:
                installed = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                installed = None
            requires.append([text, installed, installed is not None and req.specifier.contains(installed, True)])
    out["dists"][name] = {"site": str(dist.locate_file("")), "version": dist.version, "requires": requires}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def kern_venv(dist_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the four kern wheels (--no-deps --no-index) and one .pth line naming this
    environment's site-packages (module docstring); the venv's directory."""
    root = tmp_path_factory.mktemp("kern-venv")
    _fresh_venv(root, *(_wheel(dist_dir, d) for d in PACKAGES), no_deps=True)
    venv = root / "venv"
    (_site_packages(venv) / "_third_party.pth").write_text(f"{THIS_SITE}\n")
    return venv


def test_the_kern_wheels_import_from_the_fresh_venv_with_every_requirement_met(kern_venv: Path,
                                                                               tmp_path: Path) -> None:
    assert any(THIS_SITE.glob("_editable_impl_kern_*.pth"))  # what must not be processed (uv's editable installs)
    probe = json.loads(_run(kern_venv / "bin" / "python", "-c", PROBE, cwd=tmp_path, env=_away_env()).stdout)
    site = _site_packages(kern_venv)
    assert probe["modules"] == {**{m: str(site / m / "__init__.py") for m in PACKAGES.values()},
                                "kern_runtime.gemm_pins": str(site / "kern_runtime" / "gemm_pins" / "__init__.py")}
    paths = [Path(p) for p in probe["sys_path"] if p]
    assert THIS_SITE in paths and paths.index(site) < paths.index(THIS_SITE)  # the wheels' copies come first
    # the checkout's editable .pth files were not processed: no source tree and no repository root on sys.path
    assert [p for p in paths if p == ROOT or ROOT / "packages" in p.parents] == []
    declared = {d: sorted(str(Requirement(r)) for r in pyproject(d)["project"]["dependencies"]) for d in PACKAGES}
    for dist, facts in probe["dists"].items():
        assert (facts["site"], facts["version"]) == (str(site), versions()[dist])
        # every dependency pyproject.toml declares, none of the extras
        assert sorted(str(Requirement(text)) for text, _, _ in facts["requires"]) == declared[dist]
        unmet = [(text, installed) for text, installed, ok in facts["requires"] if not ok]
        assert unmet == [], f"{dist}: declared requirements not met in the fresh venv: {unmet}"


def _in_checkout(*args: str) -> str:
    """`kern ARGS` in this process (the checkout's packages): its stdout."""
    from typer.testing import CliRunner

    from kern_run.cli import app

    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("config", sorted(p.name for p in CONFIGS.glob("*.json")))
def test_kern_manifest_build_and_inspect_from_the_wheels(kern_venv: Path, config: str, tmp_path: Path) -> None:
    """From a temporary directory, with the wheel's kernels (kern_run/kernels/): the same manifest, byte for byte,
    and the same `kern inspect` as the checkout's packages with the checkout's kernels/."""
    kern, env, out = kern_venv / "bin" / "kern", _away_env(), tmp_path / "m.json"
    built = _run(kern, "manifest", "build", "--config", CONFIGS / config, "--out", out, cwd=tmp_path, env=env).stdout
    assert built.startswith(f"kern manifest build: wrote {out} (") and built.endswith(", verified)\n")
    reference = tmp_path / "checkout" / "m.json"
    reference.parent.mkdir()
    assert _in_checkout("manifest", "build", "--config", str(CONFIGS / config), "--out", str(reference)) == \
        built.replace(str(out), str(reference))
    assert out.read_bytes() == reference.read_bytes()
    shown = _run(kern, "inspect", out, cwd=tmp_path, env=env).stdout
    assert shown.startswith(f"manifest {Path(config).stem} (kern-manifest/1), digest ")
    assert shown == _in_checkout("inspect", str(out))
