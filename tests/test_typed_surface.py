"""What an engine's type checker sees of kern_runtime (it ships py.typed): the Runtime façade's methods and
properties, and the device handles' read-through facts, with their parts' real signatures (kern_runtime.parts).
Before, `parts.delegates` set them at import, and mypy reported `"Runtime" has no attribute "read_output"` on
every use (a kern-runtime user's audit, 2026-12-03). mypy checks an engine-like script: the right calls pass, and
each wrong call is reported at its line with the part's parameter type (and nothing else is)."""

from __future__ import annotations

import inspect
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

ENGINE = textwrap.dedent('''\
    from __future__ import annotations

    import numpy as np
    from kern_pool import Pool
    from kern_runtime import Runtime


    def step(rt: Runtime) -> tuple[np.ndarray, int, bool]:
        lease = rt.lease(40)
        rt.write_input("token_ids", np.zeros(1, np.int32))
        rt.issue("decode", {"tokens": 1})
        out = rt.read_output("next_token", 1)
        pool: Pool = rt.kern_pool
        pages: int = lease.num_pages + len(lease.page_ids())
        kept = rt.checkpoint(lease, 32)
        tokens: int = kept.num_tokens
        lease.close()
        kept.close()
        return out, pages + tokens + pool.free_pages, rt.peers_ready


    def wrong(rt: Runtime) -> None:
        rt.lease("forty")  # line 23
        rt.read_output(3)  # line 24
        rt.no_such_method()  # line 25
        flag: str = rt.peers_ready  # line 26
''')


def test_mypy_checks_the_facade_with_its_parts_signatures(tmp_path: Path) -> None:
    mypy = shutil.which("mypy") or str(Path(sys.executable).parent / "mypy")
    assert Path(mypy).is_file(), "mypy not installed: it is a dev dependency (uv sync --all-packages)"
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    proc = subprocess.run([mypy, "--no-incremental", "--follow-imports=silent", "--python-executable", sys.executable,
                           "--hide-error-context", "--no-error-summary", str(script)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    errors = sorted(line.split(": error: ")[0].rsplit(":", 1)[1] + ": " + line.split(": error: ")[1]
                    for line in proc.stdout.splitlines() if ": error: " in line)
    assert errors == [
        '23: Argument 1 has incompatible type "str"; expected "int"  [arg-type]',  # DevicePool.lease's num_tokens
        '24: Argument 1 has incompatible type "int"; expected "str"  [arg-type]',  # BufferIO.read_output's name
        '25: "Runtime" has no attribute "no_such_method"  [attr-defined]',
        '26: Incompatible types in assignment (expression has type "bool", variable has type "str")  [assignment]',
    ], proc.stdout + proc.stderr


def test_the_facade_shows_its_parts_signatures_and_refuses_writes() -> None:
    from kern_runtime import Runtime
    from kern_runtime.buffer_io import BufferIO
    from kern_runtime.kv.device_pool import DevicePool
    from kern_runtime.kv.handles import DeviceLease

    assert inspect.signature(Runtime.lease) == inspect.signature(DevicePool.lease)
    assert Runtime.read_output.__doc__ == BufferIO.read_output.__doc__
    assert Runtime.kern_pool is DevicePool.kern_pool  # read on the class: the part's own property
    rt = Runtime()
    with pytest.raises(AttributeError, match="read-only"):
        rt.lease = None  # type: ignore[assignment,method-assign]
    with pytest.raises(TypeError, match="no property or __slots__ member"):
        from kern_runtime.parts import attribute

        attribute("kv", DevicePool.lease)
    assert "closed" in vars(DeviceLease) and "seq_slot_id" in vars(DeviceLease)
