"""cuBLASLt pins files (tools/pick_algos.py, format kern-cublaslt-pins/1): the batch-invariant prefill algorithms
(`pins`), the M = 1 decode ones (`decode_pins`) and the batch-invariant decode ones (`invariant_decode_pins`,
split-K allowed, proven over M = 1 .. 64) the builder writes into GEMM ops (docs/caller.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...errors import ManifestBuildError
from .jsonio import read_json_file
from .options import Pins

# the cublasLtMatmulAlgoConfigAttributes_t a pin may set: the manifest model's Algo keys (kern_manifest.model
# ALGO_KEYS, not exported; tests/run/test_gen_qwen3_refusals.py checks the two agree)
ALGO_ATTRS = ("id", "tile", "stages", "split_k", "reduction", "swizzle", "custom", "inner_shape", "cluster_shape")
# the M up to which an invariant decode pin must be proven: the batched decode's largest bucket
# (kern_runtime.gemm_pins.INVARIANT_DECODE_M_MAX; tests/run/test_batch_invariant_manifest.py checks the two agree)
INVARIANT_DECODE_M_MAX = 64


def _count(value: Any, low: int = 0) -> bool:
    """A JSON integer >= low (true/false are not integers here)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _algo(path: Path, shape: str, algo: Any) -> tuple[tuple[str, int], ...]:
    """One pin's algo object as sorted (attribute, value) pairs; `shape` names the pin in refusals."""
    if not isinstance(algo, dict) or "id" not in algo:
        raise ManifestBuildError(f"{path}: {shape}: \"algo\" must be an object with at least \"id\", got {algo!r}")
    for a, v in algo.items():
        if a not in ALGO_ATTRS:
            raise ManifestBuildError(f"{path}: {shape}: algo key {a!r} is not a cuBLASLt algo attribute "
                                     f"(known: {', '.join(ALGO_ATTRS)})")
        if not _count(v):
            raise ManifestBuildError(f"{path}: {shape}: algo {a} = {v!r} must be an integer >= 0")
    return tuple(sorted(algo.items()))


def _table(path: Path, doc: dict[str, Any], key: str) -> Pins:
    """The pins list `key` of a pins document, sorted by (n, k); one pin per shape."""
    rows = doc.get(key, [])
    if not isinstance(rows, list):
        raise ManifestBuildError(f"{path}: {key} is a JSON {type(rows).__name__}, expected a list of pins")
    out: dict[tuple[int, int], tuple[tuple[str, int], ...]] = {}
    for i, p in enumerate(rows):
        if not (isinstance(p, dict) and _count(p.get("n"), 1) and _count(p.get("k"), 1)):
            raise ManifestBuildError(f"{path}: {key}[{i}] needs integer \"n\" and \"k\" >= 1, got "
                                     f"{json.dumps(p)[:120]}")
        shape = f"{key}[{i}] (n={p['n']}, k={p['k']})"
        if (p["n"], p["k"]) in out:
            raise ManifestBuildError(f"{path}: {shape} pins the shape {p['n']}x{p['k']} a second time")
        if key == "invariant_decode_pins" and not (_count(p.get("m_max")) and p["m_max"] >= INVARIANT_DECODE_M_MAX):
            raise ManifestBuildError(f"{path}: {shape}: m_max = {p.get('m_max')!r}, expected an integer >= "
                                     f"{INVARIANT_DECODE_M_MAX} (the batched decode's largest bucket): rerun "
                                     "tools/pick_algos.py --invariant-decode")
        out[(p["n"], p["k"])] = _algo(path, shape, p.get("algo"))
    return tuple(sorted((n, k, algo) for (n, k), algo in out.items()))


def _check_stamp(path: Path, doc: Any, chunk_max: int) -> None:
    if not isinstance(doc, dict):
        raise ManifestBuildError(f"{path}: not a pins file (a JSON {type(doc).__name__}, expected an object)")
    if doc.get("format") != "kern-cublaslt-pins/1":
        raise ManifestBuildError(f"{path}: format {doc.get('format')!r}, expected 'kern-cublaslt-pins/1'")
    for key, ok in (("device", isinstance(doc.get("device"), str)), ("m_max", _count(doc.get("m_max"), 1)),
                    ("cublaslt_version", _count(doc.get("cublaslt_version"))), ("pins", "pins" in doc)):
        if not ok:
            raise ManifestBuildError(f"{path}: not a pins file ({key} = {doc.get(key)!r})")
    if doc["m_max"] < chunk_max:
        raise ManifestBuildError(f"{path}: pins were checked up to M = {doc['m_max']}, below --chunk-max {chunk_max}")


def pins_from_doc(path: Path, doc: Any, chunk_max: int) -> tuple[Pins, Pins, tuple[tuple[str, Any], ...]]:
    """A parsed pins document (read from `path`, which refusals name) as (algos, decode_algos, algos_source) for
    BuildOptions (its invariant_decode_pins checked too; `invariant_decode_from_doc` gives them). Raises
    ManifestBuildError when it is malformed (naming the list, the (n, k) shape and the key),
    holds no pin, or its pins were proven for a smaller M than `chunk_max`."""
    _check_stamp(path, doc, chunk_max)
    algos, decode_algos = _table(path, doc, "pins"), _table(path, doc, "decode_pins")
    invariant = invariant_decode_from_doc(path, doc)  # checked here too: every reader refuses a malformed row
    if not algos and not decode_algos and not invariant:
        raise ManifestBuildError(f"{path}: no pins (pins, decode_pins and invariant_decode_pins are empty): rerun "
                                 "tools/pick_algos.py with --shape")
    source = (("device", doc["device"]), ("cublaslt_version", doc["cublaslt_version"]), ("m_max", doc["m_max"]))
    return algos, decode_algos, source


def invariant_decode_from_doc(path: Path, doc: dict[str, Any]) -> Pins:
    """The `invariant_decode_pins` of a pins document whose stamp `pins_from_doc` checked (none: ()), sorted by
    (n, k), for BuildOptions.invariant_decode_algos. Raises ManifestBuildError for a malformed row (as for `pins`,
    and an m_max below INVARIANT_DECODE_M_MAX)."""
    return _table(path, doc, "invariant_decode_pins")


def load_algos(path: Path, chunk_max: int) -> tuple[Pins, Pins, tuple[tuple[str, Any], ...]]:
    """Read a pins file: (algos, decode_algos, algos_source) for BuildOptions. Raises ManifestBuildError naming
    the file when it cannot be read (kern_manifest.read_regular_file: a regular file of at most 64 MiB), is not
    UTF-8 JSON, or `pins_from_doc` refuses it."""
    return pins_from_doc(path, read_json_file(path, "not a pins file: ")[0], chunk_max)

