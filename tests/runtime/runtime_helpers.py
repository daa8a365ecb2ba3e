"""Small manifests and checkpoints for the runtime tests (CPU and GPU)."""

from __future__ import annotations

import copy
import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

KERNELS_DIR = Path(__file__).parent / "kernels"


def write_bf16_file(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors file with BF16 tensors given as uint16 bits (numpy has no bfloat16)."""
    header, blobs, offset = {}, [], 0
    for name, bits in tensors.items():
        raw = np.ascontiguousarray(bits, dtype="<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(bits.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


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


# ---------------------------------------------------------------- kern_manifest objects, built short


def seg(tensor: str, rows: tuple[int, int] | None = None, shape: tuple[int, ...] | None = None,
        cols: tuple[int, int] | None = None) -> Any:
    """A bind segment of checkpoint tensor `tensor`: its rows `[rows[0], rows[1])` (a kern_manifest
    `RowsSegment`) or all of it (`TensorSegment`), optionally a column range."""
    from kern_manifest import RowsSegment, TensorSegment

    if rows is None:
        return TensorSegment(tensor=tensor, shape=shape, cols=cols)
    return RowsSegment(tensor=tensor, start=rows[0], stop=rows[1], shape=shape, cols=cols)


def interleave(tensors: tuple[str, ...], rows: int) -> Any:
    """kern_manifest `InterleaveSegment`: blocks of `rows` rows of each of `tensors` in turn."""
    from kern_manifest import InterleaveSegment

    return InterleaveSegment(tensors=tuple(tensors), rows=rows)


def buffer_of(name: str, kind: str, dtype: str, shape: tuple[Any, ...], placement: str = "device",
              export: bool = False, bind: tuple[Any, ...] | None = None) -> Any:
    """kern_manifest `Buffer` (shape: ints, expression strings or Exprs)."""
    from kern_manifest import Buffer, Expr

    dims = tuple(d if isinstance(d, Expr) else Expr(d) for d in shape)
    return Buffer(name=name, kind=kind, dtype=dtype, shape=dims, placement=placement, export=export,
                  bind=tuple(bind) if bind is not None else None)


def state_of(name: str, kind: str, **sizes: int) -> Any:
    """kern_manifest `State` (`bytes`, `bytes_per_token` + `page_tokens`, or `bytes_per_seq`)."""
    from kern_manifest import State

    return State(name=name, kind=kind, **sizes)
