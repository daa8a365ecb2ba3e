"""tools/build_kernels.py's command line with fake nvcc / cuobjdump scripts: a tool that cannot run, an nvcc
without a version, a cuobjdump dump that is not a consistent ABI, a missing committed kernels.json. One stderr
line, exit 2, no traceback, and --out untouched (no cubin copied before every module is described)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kern_run.cli import app
from tools import build_kernels as bk

VERSION = "Cuda compilation tools, release 99.0, V99.0.1"
# nvcc: --version prints VERSION; a compile copies the source (the last argument, relative to the cwd) to -o
NVCC = f"""#!/bin/sh
if [ "$1" = "--version" ]; then echo "nvcc: fake"; echo "{VERSION}"; exit 0; fi
out=""
while [ $# -gt 1 ]; do
    if [ "$1" = "-o" ]; then out="$2"; fi
    shift
done
cp "$1" "$out"
"""
# cuobjdump: one entry kern_<stem> with two 8-byte params; a cubin containing "BAD" lists ordinal 0 twice
CUOBJDUMP = """#!/bin/sh
name=$(basename "$2" .cubin)
case "$1" in
-elf)
    echo ".nv.info.kern_$name"
    echo "  Attribute: EIATTR_KPARAM_INFO  Ordinal : 0x1 Offset : 0x8 Size : 0x8"
    if grep -q BAD "$2"; then
        echo "  Attribute: EIATTR_KPARAM_INFO  Ordinal : 0x1 Offset : 0x10 Size : 0x8"
    fi
    echo "  Attribute: EIATTR_KPARAM_INFO  Ordinal : 0x0 Offset : 0x0 Size : 0x8"
    ;;
-res-usage)
    echo " Function kern_$name:"
    echo "  REG:12 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:368 TEXTURE:0 SURFACE:0 SAMPLER:0"
    ;;
esac
"""


def _script(path: Path, text: str, mode: int = 0o755) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Fake NVCC / CUOBJDUMP in the environment, a source dir with modules `a` (good) and `b`, an empty --out."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    paths = {"nvcc": _script(bin_dir / "nvcc", NVCC), "cuobjdump": _script(bin_dir / "cuobjdump", CUOBJDUMP)}
    monkeypatch.setenv("NVCC", str(paths["nvcc"]))
    monkeypatch.setenv("CUOBJDUMP", str(paths["cuobjdump"]))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.cu").write_text("// module a\n")
    (src / "b.cu").write_text("// module b\n")
    out = tmp_path / "out"
    out.mkdir()
    return {**paths, "src": src, "out": out}


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.endswith("\n") and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err[:-1]


def test_fake_toolchain_builds(tools: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """The fakes make a real build: both cubins copied under their hash, kernels.json with the parsed ABI."""
    assert bk.main(["--src", str(tools["src"]), "--out", str(tools["out"])]) == 0
    doc = json.loads((tools["out"] / "kernels.json").read_text())
    digest = hashlib.sha256(b"// module a\n").hexdigest()
    assert doc["toolchain"] == VERSION
    assert doc["modules"]["a"]["file"] == f"a-{digest[:12]}.cubin" and doc["modules"]["a"]["sha256"] == digest
    assert doc["modules"]["a"]["entries"] == {"kern_a": {"params": [[0, 8], [8, 8]], "registers": 12, "shared": 0,
                                                         "local": 0, "constants": {}}}
    assert sorted(p.name for p in tools["out"].iterdir()) == sorted(
        [doc["modules"]["a"]["file"], doc["modules"]["b"]["file"], "kernels.json"])
    capsys.readouterr()


def test_a_bad_abi_dump_copies_no_cubin(tools: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    (tools["src"] / "b.cu").write_text("// BAD module\n")
    assert bk.main(["--src", str(tools["src"]), "--out", str(tools["out"])]) == 2
    assert _err(capsys) == (f"build_kernels: b.cubin: {tools['cuobjdump']} -elf: kern_b: parameter ordinal 1 "
                            "listed twice")
    assert list(tools["out"].iterdir()) == []  # not even module a's good cubin


def test_a_nvcc_that_cannot_run(tools: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    tools["nvcc"].chmod(0o644)
    assert bk.main(["--src", str(tools["src"]), "--out", str(tools["out"])]) == 2
    assert _err(capsys) == f"build_kernels: {tools['nvcc']} cannot be run: Permission denied"
    assert list(tools["out"].iterdir()) == []


def test_a_nvcc_without_a_version(tools: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _script(tools["nvcc"], "#!/bin/sh\nexit 0\n")
    assert bk.main(["--src", str(tools["src"]), "--out", str(tools["out"])]) == 2
    assert _err(capsys) == (f"build_kernels: {tools['nvcc']} --version printed nothing (is NVCC a CUDA "
                            "compiler?)")


def test_check_without_a_committed_kernels_json(tools: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    missing = tools["out"].parent / "nonexistent"
    assert bk.main(["--src", str(tools["src"]), "--out", str(missing), "--check"]) == 2
    assert _err(capsys) == (f"build_kernels: {missing / 'kernels.json'}: the committed kernels.json --check "
                            "compares with: No such file or directory")
    (tools["out"] / "kernels.json").write_text("[1")
    assert bk.main(["--src", str(tools["src"]), "--out", str(tools["out"]), "--check"]) == 2
    assert _err(capsys).startswith(f"build_kernels: {tools['out'] / 'kernels.json'}: the committed kernels.json "
                                   "--check compares with: not JSON (")
    assert not missing.exists()


def test_check_passes_on_its_own_build(tools: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert bk.main(["--src", str(tools["src"]), "--out", str(tools["out"])]) == 0
    assert bk.main(["--src", str(tools["src"]), "--out", str(tools["out"]), "--check"]) == 0
    assert f"kernels: check ok ({VERSION})" in capsys.readouterr().out


def test_modules_build_checks_the_committed_file_first(tools: dict[str, Path],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    (tools["out"] / "kernels.json").write_text('{"toolchain": "other", "modules": {}}')
    assert bk.main(["--src", str(tools["src"]), "--out", str(tools["out"]), "--modules", "a"]) == 2
    assert _err(capsys) == (f"build_kernels: {tools['out'] / 'kernels.json'} was built with 'other', this "
                            f"toolchain is '{VERSION}': rebuild every module (omit --modules)")
    assert sorted(p.name for p in tools["out"].iterdir()) == ["kernels.json"]  # no cubin of module a


def test_an_out_that_is_a_file(tools: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    out = tools["out"] / "file"
    out.write_text("keep")
    assert bk.main(["--src", str(tools["src"]), "--out", str(out)]) == 2
    assert _err(capsys) == f"build_kernels: --out {out} exists and is not a directory"
    assert out.read_text() == "keep"


def test_kern_kernels_outside_the_checkout_says_it_needs_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed kern-run away from the checkout: `kern kernels` is one line naming what is missing (the build
    needs kernels-src/ and tools/), exit 2, no traceback, nothing run."""
    (tmp_path / "kern.toml").write_text('default = "x"\n')
    monkeypatch.setenv("KERN_TOML", str(tmp_path / "kern.toml"))
    result = CliRunner().invoke(app, ["kernels", "--check"])
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert result.stderr == (f"kern kernels: building kernels needs the kern checkout (kernels-src/ and "
                             f"tools/build_kernels.py); {tmp_path / 'tools' / 'build_kernels.py'} not found: run it "
                             "inside the kern repository\n")
