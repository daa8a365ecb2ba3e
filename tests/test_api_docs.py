"""tools/api_docs.py builds the pdoc API reference of the four packages on the CPU (so CI builds it), and its
reference check fails on a docstring reference that does not resolve."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kern_pool
import kern_runtime

from tools.api_docs import broken_references

ROOT = Path(__file__).resolve().parent.parent


def test_the_reference_builds_clean_without_cuda(tmp_path: Path) -> None:
    out = tmp_path / "api"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "api_docs.py"), "--out", str(out)],
                          check=False, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no pdoc warning, no broken reference, no CUDA import
    pages = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.html"))
    assert proc.stdout == f"API reference: {out / 'index.html'} ({len(pages)} pages)\n"
    assert {"index.html", "kern_manifest.html", "kern_pool.html", "kern_runtime.html", "kern_run.html"} <= set(pages)
    runtime = (out / "kern_runtime.html").read_text(encoding="utf-8")
    assert 'id="Runtime.load"' in runtime and 'id="Runtime.write_input"' in runtime  # the class, documented
    assert 'id="HostTensors"' in runtime


def test_broken_references_are_named() -> None:
    namespace = vars(kern_runtime)
    docs = [
        ("kern_runtime.Runtime", "see `Runtime.load` and `Runtime.write_input(name, array)`", namespace),
        ("kern_runtime.X", "see `Runtime.lod` and `kern_pool.Pool.lease`", namespace),
        ("kern_runtime.Y", "`kern_pool.Pol` and `kern_runtime.nothere.x` and `Unknown.attr`", namespace),
    ]
    assert broken_references(docs) == [
        "kern_runtime.X: `Runtime.lod`: Runtime has no attribute 'lod'",
        "kern_runtime.Y: `kern_pool.Pol` does not resolve",
        "kern_runtime.Y: `kern_runtime.nothere.x` does not resolve",
    ]
    assert broken_references([("kern_pool", "`Pool.lease` `Prefix.lookup`", vars(kern_pool))]) == []


def test_an_out_path_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_text("")
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "api_docs.py"), "--out", str(target)],
                          check=False, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"api_docs.py: --out {target}: exists and is not a directory\n"
