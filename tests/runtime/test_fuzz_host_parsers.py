"""A fuzz pass kept in the suite (issue 29): hypothesis mutates the committed manifests and safetensors headers,
and every host-side parser must answer in bounded time with its package's typed errors only.

- Manifests: a committed manifest (manifests/*.json) with random edits (a value replaced by hostile JSON, a key
  dropped or renamed, an array item repeated) and hostile grafts found by the fuzz pass (a doubling chain of
  inlined programs, many `when` launches over many vars, a u64 literal past i64, a long expression over many
  vars, wide free-form `meta`). Each goes through kern_manifest (parse, verify, expansion of every program) and,
  when accepted, the runtime's intake (`load_spec`). Only `kern_manifest.ManifestError` and
  `kern_runtime.KernError` may escape.
- Weight files: a small valid safetensors file whose header JSON is edited the same way, or whose bytes are
  cut, flipped or given another header length, read from memory (`SafetensorsTensors.parse`) and from a file
  (`SafetensorsTensors.open`). Only `WeightArtifactError` and `ApiError` may escape.

Each example has a deadline (hypothesis fails an example that overruns it): an accepted committed manifest
costs about 0.1 s, so the deadline is a margin of 20x over the slowest, not a benchmark.
"""

from __future__ import annotations

import copy
import json
import struct
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kern_manifest import ManifestError, parse_manifest, verify
from kern_runtime import KernError
from kern_runtime.errors import ApiError, WeightArtifactError
from kern_runtime.runtime import load_spec
from kern_runtime.weights import SafetensorsTensors

ROOT = Path(__file__).resolve().parents[2]
# without their `digest`, so that a mutant can be accepted (a digest that no longer matches is a fault by itself)
COMMITTED = {name: {k: v for k, v in json.loads((ROOT / "manifests" / name).read_text()).items() if k != "digest"}
             for name in ("qwen3-tiny.json", "qwen3-tiny-en-gemm.json", "qwen3-0.6b.json", "qwen3-4b.json")}

HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70), st.sampled_from([-(2**63) - 1, 2**63, 2**64 - 1, 2**64, 10**30]),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6),
    st.sampled_from(["tokens", "seqs", "tokens * 4611686018427387904", "cdiv(tokens, 0)", "(((", "decode", "load",
                     "\ud800", "1//0", "x" * 5000]),
)
JSON = st.recursive(HOSTILE, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                    max_leaves=6)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, (*prefix, i))
    return out


def _edit(obj: Any, kind: str, pick: int, value: Any) -> None:
    """One random edit of the JSON value `obj`, in place."""
    paths = _paths(obj)
    if not paths:
        return
    path = paths[pick % len(paths)]
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    if kind == "replace":
        parent[key] = value
    elif kind == "delete":
        del parent[key]
    elif kind == "repeat" and isinstance(parent, list):
        parent.insert(key, copy.deepcopy(parent[key]))
    elif kind == "rename" and isinstance(parent, dict):
        parent[value if isinstance(value, str) else f"{key}_"] = parent.pop(key)


EDITS = st.lists(st.tuples(st.sampled_from(["replace", "delete", "repeat", "rename"]), st.integers(0, 1 << 20), JSON),
                 max_size=3)


def _graft(obj: dict[str, Any], kind: str, n: int, k: int) -> None:
    """A hostile piece the fuzz pass found expensive, sized by `n` and `k`."""
    if kind == "chain":  # n programs, each inlining the next k times: k^n calls
        for i in range(n):
            obj["programs"][f"fz{i}"] = {"calls": [{"program": f"fz{i + 1}"}] * k}
        obj["programs"][f"fz{n}"] = {"calls": [{"program": next(iter(obj["programs"]))}]}
    elif kind == "when":  # n one-point launches of the first op over k fresh 0..1 vars
        names = [f"fzv{j}" for j in range(k)]
        obj["vars"].update({v: {"min": 0, "max": 1} for v in names})
        op = next(iter(obj["ops"].values()))
        base = op["launches"][0]
        op["launches"] = [dict(base, when={v: [(i >> j) & 1, (i >> j) & 1] for j, v in enumerate(names)})
                          for i in range(n)]
    elif kind == "u64":  # a u64 literal past i64 in the first launch's wirings
        op = next(iter(obj["ops"].values()))
        if op["launches"][0].get("args"):
            op["launches"][0]["args"][n % len(op["launches"][0]["args"])] = {"u64": 2**64 - 1}
    elif kind == "expr":  # a long expression over k fresh vars as the first buffer's first dimension
        obj["vars"].update({f"fze{j}": {"min": 1, "max": 2} for j in range(k)})
        buf = next(iter(obj["buffers"].values()))
        buf["shape"][0] = "+".join(f"fze{i % max(k, 1)}" for i in range(40 * n))[:4096]
    elif kind == "meta":  # wide and deep free-form meta
        obj["meta"] = {"fz": [[{}] * n] * k}


GRAFTS = st.lists(st.tuples(st.sampled_from(["chain", "when", "u64", "expr", "meta"]), st.integers(1, 40),
                            st.integers(1, 24)), max_size=2)


@settings(max_examples=120, deadline=timedelta(seconds=2), suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)
@given(st.sampled_from(sorted(COMMITTED)), EDITS, GRAFTS)
def test_mutated_committed_manifests_only_raise_typed_errors(name: str, edits: list[tuple[str, int, Any]],
                                                            grafts: list[tuple[str, int, int]]) -> None:
    obj = copy.deepcopy(COMMITTED[name])
    for kind, n, k in grafts:
        try:
            _graft(obj, kind, n, k)
        except (KeyError, IndexError, TypeError, StopIteration, AttributeError):
            pass  # an edit before removed what the graft needs: the manifest stays as it is
    for kind, pick, value in edits:
        _edit(obj, kind, pick, value)
    try:
        text = json.dumps(obj)
    except (ValueError, UnicodeEncodeError):
        return
    try:
        manifest = parse_manifest(text.encode("utf-8", "surrogatepass"))
        verify(manifest)
        for program in manifest.programs.values():
            program.flat_calls(manifest)
            program.vars_read(manifest)
        load_spec(manifest)
    except (ManifestError, KernError):
        return


# ---------------------------------------------------------------- safetensors headers

_HEADER = {"__metadata__": {"format": "pt"},
           "a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
           "b": {"dtype": "F32", "shape": [4], "data_offsets": [12, 28]},
           "c": {"dtype": "I64", "shape": [0], "data_offsets": [28, 28]}}
_TMP = tempfile.TemporaryDirectory(prefix="kern-fuzz-")


def _file(header_json: bytes, data_bytes: int) -> bytes:
    return struct.pack("<Q", len(header_json)) + header_json + bytes(range(256))[:data_bytes] * 1


RAW = st.sampled_from(["none", "length", "truncate", "flip"])


@settings(max_examples=250, deadline=timedelta(seconds=1), suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)
@given(EDITS, RAW, st.integers(0, 2**64 - 1), st.integers(0, 1 << 16))
def test_mutated_safetensors_headers_only_raise_weight_errors(edits: list[tuple[str, int, Any]], raw: str,
                                                             number: int, where: int) -> None:
    header = copy.deepcopy(_HEADER)
    for kind, pick, value in edits:
        _edit(header, kind, pick, value)
    try:
        header_json = json.dumps(header).encode("utf-8", "surrogatepass")
    except (ValueError, UnicodeEncodeError):
        return
    data = bytearray(_file(header_json, 28))
    if raw == "length":
        data[:8] = struct.pack("<Q", number)
    elif raw == "truncate":
        del data[where % (len(data) + 1):]
    elif raw == "flip":
        data[where % len(data)] ^= 1 + number % 255
    path = Path(_TMP.name) / "model.safetensors"
    path.write_bytes(bytes(data))
    for read in (lambda: SafetensorsTensors.parse(bytes(data)), lambda: SafetensorsTensors.open(path)):
        try:
            tensors = read()
        except (WeightArtifactError, ApiError):
            continue
        for name in tensors.names():  # accepted: every tensor's bytes lie inside the data
            meta = tensors.meta(name)
            assert meta is not None and tensors.blob(name).nbytes == meta.nbytes
