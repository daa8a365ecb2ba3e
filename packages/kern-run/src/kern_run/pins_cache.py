"""Batch-invariant cuBLASLt pins for `kern run --weights DIR`: found per GPU name and cuBLASLt version.

Pins (tools/pick_algos.py's kern-cublaslt-pins/1 files) are looked up, in this order, in
- the user's cache: `user_cache_dir("kern")/pins/<gpu>-cublaslt<version>.json` (platformdirs), which must carry
  this GPU's name and cuBLASLt version;
- the committed pins (`kern_run.package_data.committed_pins_dir()`: the wheel's `kern_run/algos/`, the checkout's
  `manifests/algos/`), which must carry this GPU's name (the runtime checks each pinned algorithm against this
  cuBLASLt at load, cublasLtMatmulAlgoCheck).
A file serves when it pins every prefill shape (n, k) of the model and was proven up to M >= the chunk maximum.
Picking pins on first use is not done here: the refusal names the tools/pick_algos.py command that writes the
cache file, and --no-pins.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from .errors import NoDeviceError, RefusalError
from .package_data import committed_pins_dir


def cache_root() -> Path:
    """`user_cache_dir("kern")` (platformdirs: $XDG_CACHE_HOME/kern, else ~/.cache/kern on Linux). Where
    platformdirs is not importable (the GPU machine's PYTHONPATH setup, tools/gpu-env.sh, installs no
    dependencies), the directory it gives on Linux."""
    try:
        from platformdirs import user_cache_dir
    except ImportError:
        xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
        return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "kern"
    return Path(user_cache_dir("kern"))


def pins_cache_path(device: str, cublaslt_version: int) -> Path:
    """Where the pins of (`device`, `cublaslt_version`) are cached: `<cache>/pins/<device slug>-cublaslt<V>.json`."""
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "gpu"
    return cache_root() / "pins" / f"{slug}-cublaslt{cublaslt_version}.json"


def _serves(doc: Any, device: str, version: int | None, shapes: set[tuple[int, int]], chunk_max: int) -> bool:
    if not isinstance(doc, dict) or doc.get("format") != "kern-cublaslt-pins/1" or doc.get("device") != device:
        return False
    if version is not None and doc.get("cublaslt_version") != version:
        return False
    m_max = doc.get("m_max")
    if not isinstance(m_max, int) or m_max < chunk_max or not isinstance(doc.get("pins"), list):
        return False
    pinned = {(p.get("n"), p.get("k")) for p in doc["pins"] if isinstance(p, dict)}
    return shapes <= pinned


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def find_pins(shapes: set[tuple[int, int]], device: str, cublaslt_version: int, chunk_max: int) -> Path:
    """The first pins file (the cache's, then the committed ones, sorted by name) that serves `shapes` on `device`
    at M up to `chunk_max`. Raises RefusalError naming the GPU, the shapes without pins, where it looked and the
    command that picks them (or --no-pins)."""
    cached = pins_cache_path(device, cublaslt_version)
    looked = [cached]
    if cached.is_file() and _serves(_read(cached), device, cublaslt_version, shapes, chunk_max):
        return cached
    committed = committed_pins_dir()
    for path in sorted(committed.glob("*.json")) if committed is not None else []:
        looked.append(path)
        if _serves(_read(path), device, None, shapes, chunk_max):
            return path
    wanted = ", ".join(f"{n}x{k}" for n, k in sorted(shapes))
    raise RefusalError(f"no batch-invariant cuBLASLt pins for the GEMM shapes {wanted} on {device} (cuBLASLt "
                       f"{cublaslt_version}, M up to {chunk_max}) in {', '.join(map(str, looked))}: pick them on this "
                       f"GPU with `python tools/pick_algos.py --config CONFIG.JSON --m-max {max(chunk_max, 2048)} "
                       f"--out {cached}` (the kern checkout's tool), or pass --no-pins (prefill then not "
                       "batch-invariant)")


def device_stamp(gpu: int) -> tuple[str, int]:
    """(the name of CUDA device `gpu`, the cuBLASLt version) as tools/pick_algos.py stamps pins files. Raises
    NoDeviceError (no device) or RefusalError (no cuBLASLt binding: nvmath-python)."""
    from .preflight import probe_device

    probe_device(gpu)  # cuInit done, `gpu` in range
    from cuda.bindings import driver

    err, device = driver.cuDeviceGet(gpu)
    if err == driver.CUresult.CUDA_SUCCESS:
        err, raw = driver.cuDeviceGetName(256, device)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise NoDeviceError(f"--gpu {gpu}: cuDeviceGet / cuDeviceGetName returned {err.name}")
    name = (raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)).split("\x00")[0]
    try:
        from nvmath.bindings import cublasLt
    except ImportError as exc:
        raise RefusalError(f"cuBLASLt pins need nvmath-python ({exc}): install kern-runtime's cu12 / cu13 extra, or "
                           "pass --no-pins") from None
    return name, int(cublasLt.get_version())
