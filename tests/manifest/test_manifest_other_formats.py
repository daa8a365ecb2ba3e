"""`kern-manifest check` given another kern JSON file (a cuBLASLt pins file, kernels.json) says what the file is,
instead of reporting it as a broken manifest (`missing required key 'name'`)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from kern_manifest.cli import check
from kern_manifest.formats import other_kern_file

ROOT = Path(__file__).resolve().parents[2]
PINS = "a cuBLASLt algorithm pins file (format 'kern-cublaslt-pins/1'; tools/pick_algos.py writes it, " \
       "kern manifest build --algos reads it), not a manifest"


def _check(path: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return check(str(path), out, err), out.getvalue(), err.getvalue()


def test_the_committed_pins_file_is_named_as_one() -> None:
    path = ROOT / "manifests" / "algos" / "h200.json"
    assert _check(path) == (1, "", f"{path} is {PINS}: pass a manifest (kern-manifest/1, e.g. manifests/*.json)\n")


def test_a_kernels_index_is_named_as_one(tmp_path: Path) -> None:
    path = tmp_path / "kernels.json"
    path.write_text(json.dumps({"format": "kern-kernels/1", "arch": "sm_90", "modules": {}}))
    assert _check(path) == (1, "", f"{path} is a kernels index (format 'kern-kernels/1'; kernels/kernels.json, "
                                   "written by `kern kernels`), not a manifest: pass a manifest (kern-manifest/1, "
                                   "e.g. manifests/*.json)\n")


@pytest.mark.parametrize("document", [
    {"format": "kern-manifest/1"},  # a manifest missing its keys: the parser's fault stands
    {"format": "other/1", "pins": []},
    {"format": 7},
    [1, 2],
])
def test_other_documents_keep_the_parse_error(tmp_path: Path, document: object) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps(document))
    code, out, err = _check(path)
    assert (code, out) == (1, "") and err.startswith(f"{path}: parse error at $")
    assert other_kern_file(document) is None


def test_other_kern_file_reads_text_bytes_and_values() -> None:
    doc = {"format": "kern-cublaslt-pins/2"}
    assert other_kern_file(doc) == other_kern_file(json.dumps(doc)) == other_kern_file(json.dumps(doc).encode())
    assert other_kern_file(doc).startswith("a cuBLASLt algorithm pins file (format 'kern-cublaslt-pins/2'")
    assert other_kern_file(b"\xff\xfe{") is None and other_kern_file("{not json") is None


def test_buffer_and_state_names_are_listed_in_natural_order() -> None:
    """The committed qwen3-4b manifest's weights used to read `k_norm.0, k_norm.1, k_norm.10` (its key order)."""
    from kern_manifest.cli import natural_key

    assert sorted(["k_norm.10", "k_norm.2", "k_norm.1", "embed", "kv.0"], key=natural_key) == [
        "embed", "k_norm.1", "k_norm.2", "k_norm.10", "kv.0"]
    code, out, _ = _check(ROOT / "manifests" / "qwen3-4b.json")
    lines = out.splitlines()
    assert code == 0
    assert any(line.endswith("embed, final_norm, k_norm.0, k_norm.1, k_norm.2, k_norm.3 ...") for line in lines), out
    assert "  kv.0, kv.1, kv.2, kv.3 ... (36): paged, 4096 B/token, 16 tokens/page" in lines
