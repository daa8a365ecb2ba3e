"""Small manifests and checkpoints for the runtime tests (CPU and GPU)."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

KERNELS_DIR = Path(__file__).parent / "kernels"


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def base_manifest(**overrides: Any) -> dict[str, Any]:
    """A minimal valid manifest: one var, an input, an output, no modules, no programs' calls."""
    m: dict[str, Any] = {
        "format": "kern-manifest/1",
        "name": "test",
        "vars": {"tokens": {"min": 1, "max": 64}},
        "modules": {},
        "buffers": {
            "x": {"kind": "input", "dtype": "f32", "shape": ["tokens", 4]},
            "y": {"kind": "output", "dtype": "f32", "shape": ["tokens", 4]},
        },
        "ops": {},
        "programs": {"step": {"calls": []}},
    }
    m.update(copy.deepcopy(overrides))
    return m


def scale_op(module: str = "toy", entry: str = "kern_scale") -> dict[str, Any]:
    """op `scale(x ptr, y ptr, n int)`: y = 2 x + 1 over n*4 floats; grid cdiv(n*4, 128)."""
    return {
        "args": [{"name": "x", "kind": "ptr"}, {"name": "y", "kind": "ptr"}, {"name": "n", "kind": "int"}],
        "launches": [{
            "module": module, "entry": entry,
            "grid": ["cdiv(tokens * 4, 128)", 1, 1], "block": [128, 1, 1],
            "params": [[0, 8], [8, 8], [16, 4], [20, 4]],
            "args": [{"arg": "x"}, {"arg": "y"}, {"arg": "n", "type": "i32"}, {"f32": 2.0}],
        }],
    }
