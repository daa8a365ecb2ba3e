"""kern_run.summary over the typed kern_manifest.Manifest: buffer bytes from the manifest's own expression
evaluation, and a shape it cannot evaluate raises instead of counting 0 bytes (the old reader fell back to a
module that does not exist, kern_runtime.exprs, behind `except Exception`, and then to 0)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kern_manifest import DTYPE_BYTES, ExprError, parse_manifest
from kern_run.summary import manifest_lines

TINY = Path(__file__).resolve().parents[2] / "manifests" / "qwen3-tiny.json"


def _buffers_line(raw: dict) -> str:
    return next(line for line in manifest_lines(parse_manifest(raw)) if line.startswith("buffers: "))


def test_buffer_bytes_at_var_max() -> None:
    raw = json.loads(TINY.read_text())
    at_max = {name: v["max"] for name, v in raw["vars"].items()}
    raw["buffers"]["act"]["shape"] = ["tokens", "tokens * 2 + 8"]  # an expression, not a bare var
    raw.pop("digest", None)
    workspace = sum(math.prod(d if isinstance(d, int) else at_max[d] for d in b["shape"]) * DTYPE_BYTES[b["dtype"]]
                    for n, b in raw["buffers"].items() if b["kind"] == "workspace" and n != "act")
    workspace += at_max["tokens"] * (2 * at_max["tokens"] + 8) * DTYPE_BYTES[raw["buffers"]["act"]["dtype"]]
    count = sum(1 for b in raw["buffers"].values() if b["kind"] == "workspace")
    assert f"workspace {count} ({workspace / 2**20:.2f} MiB)" in _buffers_line(raw)


def test_a_shape_over_an_undeclared_var_raises() -> None:
    raw = json.loads(TINY.read_text())
    raw["buffers"]["act"]["shape"] = ["tokens", "hidden_sz"]  # parsed, not verified: the verifier refuses it
    raw.pop("digest", None)
    with pytest.raises(ExprError, match="var 'hidden_sz' has no value"):
        _buffers_line(raw)
