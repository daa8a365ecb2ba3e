"""Names that do not exist, found without running the code (ruff's pyflakes rules F821-F823).

Many tests run only on the GPU machine (`@pytest.mark.gpu`, skipped in CI), and the tools and bench scripts
run only there: a name that is not defined in them shows up only when that code runs. Sessions 9-10 lost
154 decode-attention GPU tests to one such NameError (docs/perf.md "Prefill, eleventh session"). This check
reads every Python file of the repository's code and fails on an undefined name (F821), an undefined name in
`__all__` (F822) or a local read before it is assigned (F823). ruff is a dev dependency (pyproject.toml), so
tools/test.sh has it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("packages", "tests", "tools", "bench", "examples")


def test_no_undefined_names() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    assert Path(ruff).is_file(), "ruff not installed: it is a dev dependency (uv sync --all-packages)"
    proc = subprocess.run([ruff, "check", "--no-cache", "--isolated", "--select", "F821,F822,F823",
                           "--output-format", "concise", *CHECKED], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"ruff found undefined names:\n{proc.stdout}{proc.stderr}"
