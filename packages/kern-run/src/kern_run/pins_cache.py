"""Batch-invariant cuBLASLt pins for `kern run --weights DIR`: found, or picked on first use, per GPU name and
cuBLASLt version (docs/caller.md "Your own checkpoint").

`ensure_pins` looks for a pins file (format kern-cublaslt-pins/1) serving the model's prefill shapes (n, k) at M
up to the chunk maximum, in this order:
- the user's cache, `user_cache_dir("kern")/pins/<gpu>-cublaslt<version>.json` (platformdirs), which must carry
  this GPU's name and cuBLASLt version;
- the committed pins (`kern_run.package_data.committed_pins_dir()`: the wheel's `kern_run/algos/`, the checkout's
  `manifests/algos/`), which must carry this GPU's name (the runtime checks each pinned algorithm against this
  cuBLASLt at load, cublasLtMatmulAlgoCheck);
- else it picks the shapes the cache lacks, in-process on this GPU (kern_runtime.gemm_pins: the batch-invariant
  search tools/pick_algos.py runs too), printing one progress line, and merges them into the cache file
  (written whole, kern_run.files), so the next run picks nothing. With no usable cache file, a committed file
  of this GPU and this cuBLASLt version serving the prefill shapes seeds it (its rows kept, only what it lacks
  picked).
A batch-invariant request (`invariant_decode`: its decode projection shapes) also needs their invariant decode
pins (`invariant_decode_pins`, split-K allowed, kern_runtime.gemm_pins.pick_invariant_decode_pin): a file
serves it only with them, and the missing ones are picked with the others (the same progress line).
A cache file that is not a usable pins file of this GPU (unreadable, past 64 MiB, not UTF-8 JSON, another format,
another GPU's or cuBLASLt's stamp, a malformed pin) is named in one line and replaced by the picks; one that
cannot be replaced (a directory, FIFO, device or symbolic link) is refused, naming it.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path
from typing import Any, Callable, TextIO

from kern_manifest import file_kind

from .errors import NoDeviceError, RefusalError
from .models.qwen3 import ManifestBuildError, pins_from_doc, read_json_file
from .package_data import committed_pins_dir

DEFAULT_M_MAX = 2048  # the M up to which picked pins are proven (tools/pick_algos.py's --m-max default)
Shape = tuple[int, int]
# (gpu, shapes, m_max) -> (device name, cuBLASLt version, one pins row per shape): `pick_on_device`, or a test's
Picker = Callable[[int, list[Shape], int], tuple[str, int, list[dict[str, Any]]]]
# (gpu, shapes) -> (device name, cuBLASLt version, one invariant_decode_pins row per shape):
# `pick_invariant_on_device`, or a test's
InvariantPicker = Callable[[int, list[Shape], dict[Shape, dict[str, int]]], tuple[str, int, list[dict[str, Any]]]]


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


def _shapes_text(shapes: set[Shape] | list[Shape]) -> str:
    return ", ".join(f"{n}x{k}" for n, k in sorted(shapes))


def _pinned(doc: dict[str, Any] | None, key: str) -> set[Shape]:
    """The (n, k) shapes list `key` ("pins" or "invariant_decode_pins") of a checked pins document pins (none for
    no document or no such list)."""
    return {(p["n"], p["k"]) for p in doc.get(key, [])} if doc else set()


def _serves(doc: dict[str, Any], shapes: set[Shape], chunk_max: int,
            invariant_decode: frozenset[Shape] | set[Shape] = frozenset()) -> bool:
    """A checked pins document (pins_from_doc) pins every shape of `shapes`, proven up to M >= `chunk_max`, and
    has an invariant decode pin for every shape of `invariant_decode`."""
    return (doc["m_max"] >= chunk_max and shapes <= _pinned(doc, "pins")
            and set(invariant_decode) <= _pinned(doc, "invariant_decode_pins"))


def read_pins(path: Path) -> dict[str, Any]:
    """The pins document of `path`, checked as the builder checks it (models.qwen3.pins_from_doc: format, stamp,
    every pin). Raises ManifestBuildError naming the file and the fault (unreadable, not a regular file, past
    64 MiB, not UTF-8 JSON, not a pins file)."""
    doc = read_json_file(path, "not a pins file: ")[0]
    pins_from_doc(path, doc, 1)
    return doc


def cached_pins(path: Path, device: str, cublaslt_version: int) -> tuple[dict[str, Any] | None, str | None]:
    """The cache file `path` of (`device`, `cublaslt_version`): (its document, None) when it is a pins file of
    that GPU and cuBLASLt; (None, None) when there is none; (None, why it is unusable) otherwise."""
    if not os.path.lexists(path):
        return None, None
    try:
        doc = read_pins(path)
    except ManifestBuildError as exc:
        return None, str(exc)
    if (doc["device"], doc["cublaslt_version"]) != (device, cublaslt_version):
        return None, (f"{path}: pins of {doc['device']} with cuBLASLt {doc['cublaslt_version']}, not of this "
                      f"{device} with cuBLASLt {cublaslt_version}")
    return doc, None


def _committed(device: str) -> list[tuple[Path, dict[str, Any]]]:
    """(path, document) of each committed pins file of `device`, sorted by name; files that do not read as pins
    files are passed over."""
    committed = committed_pins_dir()
    out = []
    for path in sorted(committed.glob("*.json")) if committed is not None else []:
        try:
            doc = read_pins(path)
        except ManifestBuildError:
            continue
        if doc["device"] == device:
            out.append((path, doc))
    return out


def committed_pins(shapes: set[Shape], device: str, chunk_max: int,
                   invariant_decode: frozenset[Shape] | set[Shape] = frozenset()) -> Path | None:
    """The first committed pins file (sorted by name) of `device` serving `shapes` up to `chunk_max` (and
    `invariant_decode`, `_serves`); files that do not read as pins files are passed over."""
    return next((path for path, doc in _committed(device) if _serves(doc, shapes, chunk_max, invariant_decode)),
                None)


def find_pins(shapes: set[Shape], device: str, cublaslt_version: int, chunk_max: int,
              invariant_decode: frozenset[Shape] | set[Shape] = frozenset()) -> Path | None:
    """The cache file, else the first committed pins file, that serves `shapes` (and `invariant_decode`) on
    `device` at M up to `chunk_max`; None when neither does (ensure_pins then picks)."""
    cached = pins_cache_path(device, cublaslt_version)
    doc, _ = cached_pins(cached, device, cublaslt_version)
    if doc is not None and _serves(doc, shapes, chunk_max, invariant_decode):
        return cached
    return committed_pins(shapes, device, chunk_max, invariant_decode)


def pick_on_device(gpu: int, shapes: list[Shape], m_max: int) -> tuple[str, int, list[dict[str, Any]]]:
    """Pick the batch-invariant pin of each shape up to M = `m_max` on CUDA device `gpu`
    (kern_runtime.gemm_pins.PinPicker; each candidate logged at debug level). Returns (device name, cuBLASLt
    version, the pins rows in `shapes` order). Raises kern_runtime.KernError (PinSearchError: no invariant
    candidate; DriverError, BlasError, CudaError)."""
    import structlog
    from kern_runtime.gemm_pins import PinPicker

    log = structlog.get_logger("kern")
    with PinPicker(gpu) as picker:
        rows = [picker.prefill(n, k, m_max, lambda msg: log.debug("pin search", candidate=msg.strip()))
                for n, k in shapes]
        return picker.device, picker.cublaslt_version, rows


def pick_invariant_on_device(gpu: int, shapes: list[Shape], fallbacks: dict[Shape, dict[str, int]]
                             ) -> tuple[str, int, list[dict[str, Any]]]:
    """Pick the invariant decode pin of each shape (split-K allowed, proven over M = 1 .. 64) on CUDA device `gpu`
    (PinPicker.invariant_decode; each candidate logged at debug level; `fallbacks`: each shape's prefill pin, a
    candidate too, so a shape without an invariant split-K configuration keeps the prefill pin's decode). Returns
    (device name, cuBLASLt version, the rows in `shapes` order). Raises kern_runtime.KernError as `pick_on_device`
    does."""
    import structlog
    from kern_runtime.gemm_pins import PinPicker

    log = structlog.get_logger("kern")
    with PinPicker(gpu) as picker:
        rows = [picker.invariant_decode(n, k, lambda msg: log.debug("pin search", candidate=msg.strip()),
                                        fallbacks.get((n, k)))
                for n, k in shapes]
        return picker.device, picker.cublaslt_version, rows


def _merged(device: str, version: int, m_max: int, kept: dict[str, Any] | None,
            rows: list[dict[str, Any]], invariant_rows: list[dict[str, Any]] | None = None) -> str:
    """The cache file's new text: the kept document's pins (and decode pins, invariant decode pins) with `rows`
    (and `invariant_rows`) added, each list sorted by (n, k)."""
    from kern_runtime.gemm_pins import pins_document, pins_text

    def by_shape(p: dict[str, Any]) -> tuple[int, int]:
        return p["n"], p["k"]

    pins = sorted([*(kept["pins"] if kept else []), *rows], key=by_shape)
    decode = kept.get("decode_pins") if kept else None
    invariant = kept.get("invariant_decode_pins") if kept else None
    if invariant_rows:
        invariant = sorted([*(invariant or []), *invariant_rows], key=by_shape)
    return pins_text(pins_document(device, version, m_max, pins, decode, invariant))


def _unreplaceable(path: Path) -> str | None:
    """What `path` is when it exists and is not a regular file (a symbolic link, never followed: "a directory",
    "a FIFO", ...), which writing the cache would have to replace; None for a regular file or none."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    return "a symbolic link" if stat.S_ISLNK(mode) else file_kind(path)


def _shapes_phrase(shapes: list[Shape], what: str) -> str:
    return f"{len(shapes)} {what}{'s' if len(shapes) != 1 else ''} ({_shapes_text(shapes)})"


def ensure_pins(shapes: set[Shape], gpu: int, chunk_max: int, stamp: Callable[[int], tuple[str, int]] | None = None,
                pick: Picker | None = None, err: TextIO | None = None, command: str = "run",
                invariant_decode: frozenset[Shape] | set[Shape] = frozenset(),
                pick_invariant: InvariantPicker | None = None) -> Path:
    """A pins file serving `shapes` at M up to `chunk_max` on CUDA device `gpu`, with an invariant decode pin for
    each shape of `invariant_decode` (a batch-invariant request's decode projections; module docstring: the
    cache, the committed pins, else picked now into the cache). Picking prints one progress line on `err`
    (stderr): `kern COMMAND: picking batch-invariant cuBLASLt pins for N GEMM shapes (..) [and M invariant decode
    shapes (..)] on GPU (cuBLASLt V), first use: cached in PATH`, and one line before it when an unusable cache
    file is replaced. `stamp`: (GPU name, cuBLASLt version) of a device (default device_stamp); `pick` /
    `pick_invariant`: the searches (default pick_on_device / pick_invariant_on_device); tests pass their own.
    Raises RefusalError (a cache file that cannot be replaced or written; no invariant candidate, naming
    --no-pins), NoDeviceError, kern_runtime.KernError (the device failed)."""
    from kern_runtime import PinSearchError

    from .files import write_files

    err = err if err is not None else sys.stderr
    invariant_decode = set(invariant_decode)
    device, version = (stamp or device_stamp)(gpu)
    cached = pins_cache_path(device, version)
    doc, unusable = cached_pins(cached, device, version)
    if doc is not None and _serves(doc, shapes, chunk_max, invariant_decode):
        return cached
    committed = committed_pins(shapes, device, chunk_max, invariant_decode)
    if committed is not None:
        return committed
    kept = doc if doc is not None and doc["m_max"] >= chunk_max else None  # pins proven for a smaller M: re-picked
    if kept is None:  # a committed file of this GPU and cuBLASLt serving the prefill shapes seeds the cache
        kept = next((d for _, d in _committed(device) if d["cublaslt_version"] == version
                     and _serves(d, shapes, chunk_max)), None)
    m_max = kept["m_max"] if kept else max(DEFAULT_M_MAX, chunk_max)
    missing = sorted(shapes - _pinned(kept, "pins"))
    missing_invariant = sorted(invariant_decode - _pinned(kept, "invariant_decode_pins"))
    kind = _unreplaceable(cached)
    if kind is not None:
        raise RefusalError(f"the cuBLASLt pins cache {cached} is {kind}, not a file kern can replace: remove it "
                           "(kern writes the pins it picks on this GPU there), or pass --no-pins")
    if unusable is not None:
        print(f"kern {command}: {unusable}: replacing it with pins picked now", file=err)
    elif doc is not None and doc["m_max"] < chunk_max:
        print(f"kern {command}: {cached}: pins proven up to M = {doc['m_max']}, below the chunk maximum "
              f"{chunk_max}: replacing them with pins proven up to M = {m_max}", file=err)
    what = [_shapes_phrase(missing, "GEMM shape")] if missing else []
    what += [_shapes_phrase(missing_invariant, "invariant decode shape")] if missing_invariant else []
    print(f"kern {command}: picking batch-invariant cuBLASLt pins for {' and '.join(what)} on {device} (cuBLASLt "
          f"{version}), first use: cached in {cached}", file=err, flush=True)
    rows: list[dict[str, Any]] = []
    invariant_rows: list[dict[str, Any]] = []
    try:
        picks = []
        if missing:
            picked_device, picked_version, rows = (pick or pick_on_device)(gpu, missing, m_max)
            picks.append((picked_device, picked_version))
        if missing_invariant:
            prefill = {(p["n"], p["k"]): p["algo"] for p in [*(kept["pins"] if kept else []), *rows]}
            picked_device, picked_version, invariant_rows = (pick_invariant or pick_invariant_on_device)(
                gpu, missing_invariant, prefill)
            picks.append((picked_device, picked_version))
    except PinSearchError as exc:
        raise RefusalError(f"{exc} on {device}: pass --no-pins (prefill then not batch-invariant)") from None
    for picked_device, picked_version in picks:
        if (picked_device, picked_version) != (device, version):
            raise RefusalError(f"--gpu {gpu}: the pins were picked on {picked_device} with cuBLASLt "
                               f"{picked_version}, but the device reads as {device} with cuBLASLt {version}: not "
                               "cached")
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_files({cached: _merged(device, version, m_max, kept, rows, invariant_rows)})
    except OSError as exc:
        raise RefusalError(f"the cuBLASLt pins cache {exc.filename or cached}: {exc.strerror or exc}: the pins "
                           "were picked but cannot be cached (fix the cache directory, or pass --no-pins)") from None
    return cached


def device_stamp(gpu: int) -> tuple[str, int]:
    """(the name of CUDA device `gpu`, the cuBLASLt version) as pins files are stamped. Raises NoDeviceError (no
    device) or RefusalError (no cuBLASLt binding: nvmath-python)."""
    from .preflight import probe_device

    probe_device(gpu)  # cuInit done, `gpu` in range
    from cuda.bindings import driver
    from kern_runtime import CudaError
    from kern_runtime.gemm_pins import cublaslt_version, device_name

    err, device = driver.cuDeviceGet(gpu)
    if err == driver.CUresult.CUDA_SUCCESS:
        err, raw = driver.cuDeviceGetName(256, device)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise NoDeviceError(f"--gpu {gpu}: cuDeviceGet / cuDeviceGetName returned {err.name}")
    try:
        return device_name(raw), cublaslt_version()
    except CudaError as exc:
        raise RefusalError(f"{exc}, or pass --no-pins") from None
