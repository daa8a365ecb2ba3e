"""The weight preflight is the runtime's own bind plan (kern_runtime `plan_bind`) over the checkpoint's tensor list.

docs/caller.md "Refusals": everything the host can check comes before the device probe. So a checkpoint the
runtime would refuse is refused here (exit 2, one line naming the tensor and the buffer), with or without
`--tp`; and one the runtime would load (a tensor-parallel rank's column slice, a scalar tensor bound to a
`[1]` buffer) passes preflight and reaches the (stubbed) device probe, exit 3.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kern_run.cli import app
from kern_run_testutil import PROBED, kern_manifest_build

pytestmark = pytest.mark.usefixtures("stub_device_probe")  # kern_run_testutil: exit 3 and PROBED


def _run(manifest: Path, kernels: Path, weights: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["run", "--manifest", str(manifest), "--kernels", str(kernels),
                                      "--weights", str(weights), "--prompt", "hi", "--log-level", "info", *extra])
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, (result.exit_code, result.stderr)
    assert result.stdout == ""
    return result.exit_code, lines[0]


@pytest.fixture
def tp_dir(tmp_path: Path, kernels_dir: Path, tiny_manifest: Path) -> Path:
    """`kern manifest build --tp 2`'s tiny rank manifests beside a copy of the TP=1 manifest `tiny.json`."""
    out = tmp_path / "tp"
    assert kern_manifest_build(["--shape", "tiny", "--tp", "2", "--kernels", str(kernels_dir),
                                "--out", str(out / "tiny.json"), "--chunk-max", "64", "--max-context", "1024"]) == 0
    shutil.copyfile(tiny_manifest, out / "tiny.json")
    return out


@pytest.fixture
def ckpt(tmp_path: Path, tiny_ckpt: Path) -> Path:
    """A copy of the tiny checkpoint the test may break."""
    return Path(shutil.copytree(tiny_ckpt, tmp_path / "ckpt"))


def _shards(ckpt: Path) -> list[str]:
    return sorted(set(json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"].values()))


def test_tp_rank_manifest_with_column_slices_passes_preflight(tp_dir: Path, kernels_dir: Path, ckpt: Path) -> None:
    """Rank 0's row-parallel w_down binds columns [0, 256) of a [256, 512] tensor into a [256, 256] buffer: the
    runtime loads that; preflight used to ignore `cols` and refuse it ("wants rows of [256]")."""
    rank0 = tp_dir / "tiny-tp2-r0.json"
    assert any("cols" in seg for b in json.loads(rank0.read_text())["buffers"].values() for seg in b.get("bind", []))
    code, line = _run(rank0, kernels_dir, ckpt)
    assert code == 3 and PROBED in line, line


def test_tp_valid_checkpoint_reaches_the_device_probe(tp_dir: Path, kernels_dir: Path, ckpt: Path) -> None:
    code, line = _run(tp_dir / "tiny.json", kernels_dir, ckpt, "--tp", "2")
    assert code == 3 and PROBED in line and "gpu 0" in line, line


def test_tp_missing_shard_is_refused_before_the_device_probe(tp_dir: Path, kernels_dir: Path, ckpt: Path) -> None:
    """At --tp 1 a deleted shard is exit 2 naming it; --tp 2 used to skip the checkpoint and report no device."""
    shard = _shards(ckpt)[0]
    (ckpt / shard).unlink()
    for args in ((tp_dir / "tiny.json", "--tp", "2"), (tp_dir / "tiny.json",)):
        code, line = _run(args[0], kernels_dir, ckpt, *args[1:])
        assert code == 2 and shard in line and PROBED not in line, line


def test_tp_every_rank_manifest_is_checked(tp_dir: Path, kernels_dir: Path, ckpt: Path) -> None:
    """A bind fault only in rank 1's manifest is refused, naming the rank, its file, the tensor and the buffer."""
    rank1 = tp_dir / "tiny-tp2-r1.json"
    raw = json.loads(rank1.read_text())
    raw.pop("digest", None)
    raw["buffers"]["w_down.0"]["bind"][0]["tensor"] = "model.layers.0.mlp.no_such.weight"
    rank1.write_text(json.dumps(raw))
    code, line = _run(tp_dir / "tiny.json", kernels_dir, ckpt, "--tp", "2")
    assert code == 2, line
    for needle in ("rank 1", rank1.name, "model.layers.0.mlp.no_such.weight", "w_down.0"):
        assert needle in line, line


def _edited_manifest(tiny_manifest: Path, out: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    raw = json.loads(tiny_manifest.read_text())
    raw.pop("digest", None)
    edit(raw)
    out.write_text(json.dumps(raw))
    return out


def test_rows_outside_the_tensor_are_refused(tiny_manifest: Path, kernels_dir: Path, ckpt: Path, tmp_path: Path) -> None:
    """`rows` [1, 257) of the 256-row final norm: the right count (verification passes, the old row count did
    too), but past the tensor's end: the runtime refuses it at load, so preflight must."""
    def edit(raw: dict) -> None:
        buf = raw["buffers"]["final_norm"]
        rows = buf["shape"][0]
        buf["bind"] = [{"tensor": "model.norm.weight", "rows": [1, rows + 1]}]

    manifest = _edited_manifest(tiny_manifest, tmp_path / "rows.json", edit)
    code, line = _run(manifest, kernels_dir, ckpt)
    assert code == 2, line
    for needle in ("rows [1, 257)", "model.norm.weight", "final_norm", "wrong model"):
        assert needle in line, line


def test_scalar_tensor_into_a_one_element_buffer(tiny_manifest: Path, kernels_dir: Path, ckpt: Path,
                                                 tmp_path: Path) -> None:
    """A shape [] tensor bound to a [1] buffer (the runtime's plan: one 4-byte copy) used to crash preflight
    with an IndexError traceback."""
    def edit(raw: dict) -> None:
        raw["buffers"]["w_scalar"] = {"kind": "weight", "dtype": "f32", "shape": [1], "bind": [{"tensor": "scale"}]}

    manifest = _edited_manifest(tiny_manifest, tmp_path / "scalar.json", edit)
    header = json.dumps({"scale": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}).encode()
    (ckpt / "extra.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<f", 1.0))
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    index["weight_map"]["scale"] = "extra.safetensors"
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    code, line = _run(manifest, kernels_dir, ckpt)
    assert code == 3 and PROBED in line, line


def test_shard_named_with_a_dot_slash_is_the_same_file(tiny_manifest: Path, kernels_dir: Path, ckpt: Path) -> None:
    """An index naming one shard as both "a.safetensors" and "./a.safetensors" names one file: read once, not
    refused as a tensor "in two shards" (the message named the same file twice)."""
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "./" + index["weight_map"][first]
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    code, line = _run(tiny_manifest, kernels_dir, ckpt)
    assert code == 3 and PROBED in line, line


def test_tensor_in_two_distinct_shards_names_both(tiny_manifest: Path, kernels_dir: Path, ckpt: Path) -> None:
    shard = _shards(ckpt)[0]
    shutil.copyfile(ckpt / shard, ckpt / "copy.safetensors")
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = "copy.safetensors"
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    code, line = _run(tiny_manifest, kernels_dir, ckpt)
    assert code == 2 and "two shards" in line, line
    assert "copy.safetensors" in line and shard in line, line


def test_tp_weights_never_made_are_said_not_to_exist(tp_dir: Path, kernels_dir: Path, tmp_path: Path) -> None:
    """--tp 2 used to read the tokenizer first and say `no tokenizer.json next to the weights (.../tokenizer.json)`,
    naming the parent folder; at --tp 1 the same case says the weights do not exist."""
    weights = tmp_path / "weights" / "qwen3-tiny"
    want = (f"kern run: weights {weights} do not exist: make them with `python tools/make_checkpoint.py --shape "
            f"<shape> --out {weights}`, or point --weights at an existing checkpoint")
    for extra in (("--tp", "2"), ()):
        assert _run(tp_dir / "tiny.json", kernels_dir, weights, *extra) == (2, want)


def test_tp_capacity_above_the_max_context_is_refused(tp_dir: Path, kernels_dir: Path, ckpt: Path) -> None:
    code, line = _run(tp_dir / "tiny.json", kernels_dir, ckpt, "--tp", "2", "--capacity", "8000")
    assert (code, line) == (2, "kern run: --capacity 8000 is more than the manifest's max context (1024 tokens), "
                               "which is all one sequence can use: pass --capacity <= 1024")


def test_tp_too_many_ranks_lists_a_few_missing_manifests(tp_dir: Path, kernels_dir: Path, ckpt: Path) -> None:
    code, line = _run(tp_dir / "tiny.json", kernels_dir, ckpt, "--tp", "100000")
    assert code == 2 and line.endswith(f"'... (100000 in all)'] not found: kern manifest build --tp 100000 "
                                       f"--out {tp_dir / 'tiny.json'} ..."), line
    assert len(line) < 600
