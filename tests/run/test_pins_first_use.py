"""`kern run --weights DIR` picks the batch-invariant cuBLASLt pins a shape lacks on first use (kern_run.pins_cache.
ensure_pins), with a fake device: `stamp` gives the GPU's name and cuBLASLt version, `FakePick` stands in for the
search (kern_runtime.gemm_pins, tested on the CPU in tests/runtime/test_gemm_pins_cpu.py). The cache file is keyed
by GPU name and cuBLASLt version, reused (a second run picks nothing), merged across models, rebuilt when it is
unusable and refused when it cannot be replaced; the picked pins feed the manifest build."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_any_checkpoint import _checkpoint_dir
from typer.testing import CliRunner

import kern_run.session as session
from kern_run import pins_cache
from kern_run.auto_manifest import AutoRequest, auto_config
from kern_run.cli import app
from kern_run.errors import RefusalError
from kern_runtime import PinSearchError
from kern_runtime.gemm_pins import pins_document, pins_text

H200 = ("NVIDIA H200", 130100)
SHAPES_1_7B = [(2048, 2048), (2048, 6144), (4096, 2048), (12288, 2048)]
SHAPES_8B = [(4096, 4096), (4096, 12288), (6144, 4096), (24576, 4096)]


def _row(n: int, k: int) -> dict[str, Any]:
    """The pins row the fake search returns for (n, k): an algo of its own per shape."""
    return {"n": n, "k": k, "algo": {"id": 66, "tile": 18 + n % 7, "stages": 8, "split_k": 1}, "us_512": 10.0,
            "us_max": 40.0, "heuristic_us_512": 9.0, "heuristic_us_max": 38.0, "heuristic_invariant": False,
            "candidates": 12}


def _inv_row(n: int, k: int) -> dict[str, Any]:
    """The invariant decode row the fake search returns for (n, k): split-K, an algo of its own per shape."""
    return {"n": n, "k": k, "algo": {"id": 67, "tile": 18 + n % 5, "split_k": 4, "reduction": 2}, "us_1": 5.0,
            "us_8": 6.0, "us_64": 12.0, "m_max": 64, "candidates": 20}


class FakePick:
    """pins_cache's search (gpu, shapes, m_max) -> (device, version, rows), and as `invariant` its invariant decode
    search (gpu, shapes) -> (device, version, rows); records each call."""

    def __init__(self, stamp: tuple[str, int] = H200, fail: Exception | None = None) -> None:
        self.stamp, self.fail, self.calls, self.invariant_calls = stamp, fail, [], []

    def invariant(self, gpu: int, shapes: list[tuple[int, int]], fallbacks: dict) -> tuple[str, int, list[dict]]:
        self.invariant_calls.append((gpu, list(shapes)))
        self.fallbacks = dict(fallbacks)
        if self.fail is not None:
            raise self.fail
        return (*self.stamp, [_inv_row(n, k) for n, k in shapes])

    def __call__(self, gpu: int, shapes: list[tuple[int, int]], m_max: int) -> tuple[str, int, list[dict]]:
        self.calls.append((gpu, list(shapes), m_max))
        if self.fail is not None:
            raise self.fail
        return (*self.stamp, [_row(n, k) for n, k in shapes])


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "kern"


def _auto(ckpt: Path, pick: FakePick, stamp: tuple[str, int] = H200, **req: Any) -> tuple[Any, list[str]]:
    """auto_config on the fake device: (the RunConfig, the lines it printed)."""
    err = io.StringIO()
    cfg = auto_config(AutoRequest(ckpt, **req), err=err, stamp=lambda gpu: stamp, pick=pick,
                      pick_invariant=pick.invariant)
    return cfg, err.getvalue().splitlines()


def _progress(shapes: list[tuple[int, int]], cached: Path, device: str = "NVIDIA H200",
              version: int = 130100) -> str:
    listed = ", ".join(f"{n}x{k}" for n, k in sorted(shapes))
    return (f"kern run: picking batch-invariant cuBLASLt pins for {len(shapes)} GEMM shapes ({listed}) on {device} "
            f"(cuBLASLt {version}), first use: cached in {cached}")


def _cached(cache: Path, device: str = "nvidia-h200", version: int = 130100) -> Path:
    return cache / "pins" / f"{device}-cublaslt{version}.json"


# ---------------------------------------------------------------- the key


def test_the_cache_file_is_keyed_by_gpu_name_and_cublaslt_version(cache: Path) -> None:
    paths = {pins_cache.pins_cache_path(d, v) for d, v in [H200, ("NVIDIA H200", 130000),
                                                           ("NVIDIA H100 80GB HBM3", 130100)]}
    assert paths == {_cached(cache), _cached(cache, version=130000), _cached(cache, "nvidia-h100-80gb-hbm3")}
    # whatever the driver says, the name stays one file name under <cache>/pins/
    assert pins_cache.pins_cache_path("../../etc/passwd", 1) == cache / "pins" / "etc-passwd-cublaslt1.json"
    assert pins_cache.pins_cache_path("\x00\n", 1) == cache / "pins" / "gpu-cublaslt1.json"


# ---------------------------------------------------------------- first use, reuse, merge


def test_first_use_picks_caches_and_feeds_the_manifest(tmp_path: Path, cache: Path) -> None:
    ckpt, pick = _checkpoint_dir(tmp_path, "Qwen3-1.7B"), FakePick()
    cfg, lines = _auto(ckpt, pick)
    cached = _cached(cache)
    assert pick.calls == [(0, SHAPES_1_7B, 2048)]  # the shapes the H200's committed pins lack, proven to 2048
    assert lines == [_progress(SHAPES_1_7B, cached),
                     f"kern run: built manifest {cfg.manifest} (from {ckpt / 'config.json'}, pins {cached})"]
    assert cached.read_text() == pins_text(pins_document(*H200, 2048, [_row(n, k) for n, k in SHAPES_1_7B]))
    manifest = json.loads(cfg.manifest.read_text())
    assert manifest["meta"]["cublaslt_pins"] == {"device": "NVIDIA H200", "cublaslt_version": 130100, "m_max": 2048}
    assert manifest["meta"]["caller"]["prefill_batch_invariant"] is True
    for n, k in SHAPES_1_7B:  # each prefill projection its own op, pinned to the picked algorithm at every M
        assert manifest["ops"][f"gemm_{n}x{k}"]["launches"] == [
            {"extern": "cublaslt_bf16_tn", "algo": _row(n, k)["algo"],
             "args": [{"arg": "a"}, {"arg": "w"}, {"arg": "c"}, {"arg": "m", "type": "i64"},
                      {"arg": "n", "type": "i64"}, {"arg": "k", "type": "i64"}]}]

    again, lines = _auto(ckpt, pick)
    assert pick.calls == [(0, SHAPES_1_7B, 2048)]  # the second run picks nothing
    assert lines == [f"kern run: reused manifest {cfg.manifest} (from {ckpt / 'config.json'}, pins {cached})"]
    assert again.manifest == cfg.manifest


def test_models_share_the_cache_and_the_manifest_follows_the_pins(tmp_path: Path, cache: Path) -> None:
    pick = FakePick()
    small = _checkpoint_dir(tmp_path, "Qwen3-1.7B")
    first, _ = _auto(small, pick)
    other = tmp_path / "other"  # the 1.7B's shapes with another vocabulary: nothing to pick
    shutil.copytree(small, other)
    (other / "config.json").write_text(json.dumps({**json.loads((small / "config.json").read_text()),
                                                   "vocab_size": 151000}))
    _, lines = _auto(other, pick)
    assert len(pick.calls) == 1 and lines[0].startswith("kern run: built manifest ")
    _, lines = _auto(_checkpoint_dir(tmp_path, "Qwen3-8B"), pick)
    assert pick.calls[1:] == [(0, SHAPES_8B, 2048)] and lines[0] == _progress(SHAPES_8B, _cached(cache))
    doc = json.loads(_cached(cache).read_text())
    assert [(p["n"], p["k"]) for p in doc["pins"]] == sorted(SHAPES_1_7B + SHAPES_8B)
    rebuilt, lines = _auto(small, pick)  # the pins file grew: the 1.7B's manifest key (its digest) changed
    assert len(pick.calls) == 2 and rebuilt.manifest != first.manifest
    assert lines == [f"kern run: built manifest {rebuilt.manifest} (from {small / 'config.json'}, pins "
                     f"{_cached(cache)})"]
    assert json.loads(rebuilt.manifest.read_text())["ops"] == json.loads(first.manifest.read_text())["ops"]


def test_committed_pins_are_not_picked_again(tmp_path: Path, cache: Path) -> None:
    pick = FakePick()
    _, lines = _auto(_checkpoint_dir(tmp_path, "Qwen3-4B"), pick)
    assert pick.calls == [] and lines[0].endswith(f"pins {pins_cache.committed_pins_dir() / 'h200.json'})")
    assert not (cache / "pins").exists()


def test_no_pins_neither_stamps_nor_picks(tmp_path: Path, cache: Path) -> None:
    def no_device(gpu: int) -> tuple[str, int]:
        raise AssertionError("--no-pins stamped the device")

    pick = FakePick()
    err = io.StringIO()
    cfg = auto_config(AutoRequest(_checkpoint_dir(tmp_path, "Qwen3-1.7B"), pins=False), err=err, stamp=no_device,
                      pick=pick)
    assert pick.calls == [] and not (cache / "pins").exists()
    assert err.getvalue().endswith("--no-pins: prefill not batch-invariant)\n") and err.getvalue().count("\n") == 1
    assert "cublaslt_pins" not in json.loads(cfg.manifest.read_text())["meta"]


def test_pins_proven_for_a_smaller_chunk_are_picked_anew(tmp_path: Path, cache: Path) -> None:
    cached = _cached(cache)
    cached.parent.mkdir(parents=True)
    cached.write_text(pins_text(pins_document(*H200, 512, [_row(n, k) for n, k in SHAPES_1_7B + SHAPES_8B])))
    pick = FakePick()
    _, lines = _auto(_checkpoint_dir(tmp_path, "Qwen3-1.7B"), pick, chunk=1024)
    assert pick.calls == [(0, SHAPES_1_7B, 2048)]
    assert lines[:2] == [f"kern run: {cached}: pins proven up to M = 512, below the chunk maximum 1024: replacing "
                         "them with pins proven up to M = 2048", _progress(SHAPES_1_7B, cached)]
    doc = json.loads(cached.read_text())
    assert doc["m_max"] == 2048 and [(p["n"], p["k"]) for p in doc["pins"]] == SHAPES_1_7B


# ---------------------------------------------------------------- unusable and hostile cache files


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


UNUSABLE = [
    (b"\xff\xfe", "not a pins file: not UTF-8 text (byte 0xff at offset 0)"),
    (b'{"format": ', "not a pins file: not JSON (Expecting value at line 1 column 12)"),
    (b"[1, 2]", "not a pins file (a JSON list, expected an object)"),
    (json.dumps({**pins_document(*H200, 2048, []), "format": "other/9"}).encode(), "format 'other/9'"),
    (json.dumps(pins_document(*H200, 2048, [{"n": 2048, "k": 2048, "algo": {"id": 1, "tiles": 2}}])).encode(),
     "algo key 'tiles' is not a cuBLASLt algo attribute"),
    (json.dumps(pins_document(*H200, 2048, [{"n": -1, "k": 2048, "algo": {"id": 1}}])).encode(),
     "needs integer \"n\" and \"k\" >= 1"),
    (json.dumps(pins_document(*H200, 2048, [])).encode(), "no pins (pins, decode_pins and invariant_decode_pins are empty)"),
    (json.dumps(pins_document("NVIDIA H100 80GB HBM3", 130100, 2048, [_row(2048, 2048)])).encode(),
     "pins of NVIDIA H100 80GB HBM3 with cuBLASLt 130100, not of this NVIDIA H200 with cuBLASLt 130100"),
    (json.dumps(pins_document("NVIDIA H200", 120900, 2048, [_row(2048, 2048)])).encode(),
     "pins of NVIDIA H200 with cuBLASLt 120900, not of this NVIDIA H200 with cuBLASLt 130100"),
    (_deep(100_000).encode(), "not a pins file: "),
    (b'{"m_max": ' + b"9" * 100_000 + b"}", "not a pins file: "),
]


@pytest.mark.parametrize("content, reason", UNUSABLE)
def test_an_unusable_cache_file_is_named_and_replaced(content: bytes, reason: str, tmp_path: Path,
                                                      cache: Path) -> None:
    cached = _cached(cache)
    cached.parent.mkdir(parents=True)
    cached.write_bytes(content)
    pick = FakePick()
    cfg, lines = _auto(_checkpoint_dir(tmp_path, "Qwen3-1.7B"), pick)
    assert len(lines) == 3 and lines[0].startswith(f"kern run: {cached}") and reason in lines[0], lines[0]
    assert lines[0].endswith(": replacing it with pins picked now")
    assert lines[1:] == [_progress(SHAPES_1_7B, cached), f"kern run: built manifest {cfg.manifest} (from "
                                                         f"{tmp_path / 'Qwen3-1.7B' / 'config.json'}, pins {cached})"]
    assert pick.calls == [(0, SHAPES_1_7B, 2048)]
    assert pins_cache.read_pins(cached)["pins"] == [_row(n, k) for n, k in SHAPES_1_7B]


def test_a_cache_file_past_64_mib_is_replaced_unread(tmp_path: Path, cache: Path) -> None:
    cached = _cached(cache)
    cached.parent.mkdir(parents=True)
    with cached.open("wb") as f:
        f.truncate(65 * 2**20)  # sparse: nothing to read, and nothing is read
    _, lines = _auto(_checkpoint_dir(tmp_path, "Qwen3-1.7B"), FakePick())
    assert lines[0] == (f"kern run: {cached}: too large (65.0 MiB; a JSON file may hold at most 64.0 MiB): replacing "
                        "it with pins picked now")
    assert cached.stat().st_size < 4096


def _make_dir(path: Path) -> str:
    path.mkdir()
    return "a directory"


def _make_fifo(path: Path) -> str:
    os.mkfifo(path)  # never opened: reading it would wait for a writer
    return "a FIFO"


def _make_link_to_dev_zero(path: Path) -> str:
    path.symlink_to("/dev/zero")
    return "a symbolic link"


@pytest.mark.parametrize("make", [_make_dir, _make_fifo, _make_link_to_dev_zero])
def test_a_cache_path_that_cannot_be_replaced_is_refused(make, tmp_path: Path, cache: Path) -> None:
    cached = _cached(cache)
    cached.parent.mkdir(parents=True)
    kind = make(cached)
    pick = FakePick()
    with pytest.raises(RefusalError) as exc:
        _auto(_checkpoint_dir(tmp_path, "Qwen3-1.7B"), pick)
    assert str(exc.value) == (f"the cuBLASLt pins cache {cached} is {kind}, not a file kern can replace: remove it "
                              "(kern writes the pins it picks on this GPU there), or pass --no-pins")
    assert pick.calls == [] and not (cache / "manifests").exists()


def test_a_linked_cache_file_that_serves_is_used(tmp_path: Path, cache: Path) -> None:
    elsewhere = tmp_path / "pins.json"
    elsewhere.write_text(pins_text(pins_document(*H200, 2048, [_row(n, k) for n, k in SHAPES_1_7B])))
    cached = _cached(cache)
    cached.parent.mkdir(parents=True)
    cached.symlink_to(elsewhere)
    pick = FakePick()
    _, lines = _auto(_checkpoint_dir(tmp_path, "Qwen3-1.7B"), pick)
    assert pick.calls == [] and lines[0].endswith(f"pins {cached})")


# ---------------------------------------------------------------- the search failing


def test_no_invariant_candidate_names_no_pins(tmp_path: Path, cache: Path) -> None:
    pick = FakePick(fail=PinSearchError("no batch-invariant cuBLASLt configuration for n=2048 k=2048 up to M = "
                                        "2048 (7 candidates, 5 applicable)"))
    with pytest.raises(RefusalError) as exc:
        _auto(_checkpoint_dir(tmp_path, "Qwen3-1.7B"), pick)
    assert str(exc.value) == ("no batch-invariant cuBLASLt configuration for n=2048 k=2048 up to M = 2048 (7 "
                              "candidates, 5 applicable) on NVIDIA H200: pass --no-pins (prefill then not "
                              "batch-invariant)")
    assert not (cache / "pins").exists() and not (cache / "manifests").exists()


def test_pins_picked_on_another_device_are_not_cached(tmp_path: Path, cache: Path) -> None:
    with pytest.raises(RefusalError) as exc:
        _auto(_checkpoint_dir(tmp_path, "Qwen3-1.7B"), FakePick(stamp=("NVIDIA H100 80GB HBM3", 130100)))
    assert str(exc.value) == ("--gpu 0: the pins were picked on NVIDIA H100 80GB HBM3 with cuBLASLt 130100, but the "
                              "device reads as NVIDIA H200 with cuBLASLt 130100: not cached")
    assert not (cache / "pins").exists()


# ---------------------------------------------------------------- the command line: kern run, kern serve


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> FakePick:
    """An H100 (whose pins nothing commits) behind pins_cache's device_stamp and search."""
    pick = FakePick(stamp=("NVIDIA H100 80GB HBM3", 130100))
    monkeypatch.setattr(pins_cache, "device_stamp", lambda gpu: pick.stamp)
    monkeypatch.setattr(pins_cache, "pick_on_device", pick)
    monkeypatch.setattr(pins_cache, "pick_invariant_on_device", pick.invariant)
    monkeypatch.setattr(session, "probe_device", lambda gpu: 1)
    return pick


def test_kern_run_picks_once_then_reuses(tiny_ckpt: Path, kernels_dir: Path, cache: Path, fake_runtime,
                                         fake_gpu: FakePick) -> None:
    args = ["run", "--weights", str(tiny_ckpt), "--kernels", str(kernels_dir), "--steps", "4", "--prompt", "hi"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.stderr
    cached = _cached(cache, "nvidia-h100-80gb-hbm3")
    tiny = [(256, 512), (1024, 256)]  # qkv and gate_up are both 1024 x 256, o and down 256 x 512
    assert fake_gpu.calls == [(0, tiny, 2048)]
    manifest = next((cache / "manifests").iterdir())
    assert first.stderr.splitlines()[:2] == [
        _progress(tiny, cached, "NVIDIA H100 80GB HBM3"),
        f"kern run: built manifest {manifest} (from {tiny_ckpt / 'config.json'}, pins {cached})"]
    second = CliRunner().invoke(app, args)
    assert second.exit_code == 0, second.stderr
    assert len(fake_gpu.calls) == 1 and second.stdout == first.stdout
    assert second.stderr.splitlines()[0] == (f"kern run: reused manifest {manifest} (from "
                                             f"{tiny_ckpt / 'config.json'}, pins {cached})")


@pytest.mark.parametrize("no_pins", [False, True])
def test_kern_serve_weights_alone_builds_the_manifest(no_pins: bool, tiny_ckpt: Path, kernels_dir: Path,
                                                      cache: Path, fake_gpu: FakePick,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    served = []
    monkeypatch.setattr("kern_run.serve.server.serve_target", lambda cfg, opts, log: served.append(cfg))
    result = CliRunner().invoke(app, ["serve", "--weights", str(tiny_ckpt), "--kernels", str(kernels_dir),
                                      *(["--no-pins"] if no_pins else [])])
    assert result.exit_code == 0, result.stderr
    (cfg,) = served
    assert cfg.manifest.parent == cache / "manifests" and cfg.weights == tiny_ckpt
    # 64 decode rows; batch-invariant unless --no-pins (then the fast batched decode, prefill not invariant either)
    what = ("--no-pins: prefill not batch-invariant, 64 decode rows" if no_pins else
            f"pins {_cached(cache, 'nvidia-h100-80gb-hbm3')}, 64 decode rows, batch-invariant decode")
    assert result.stderr.splitlines()[-1] == (f"kern serve: built manifest {cfg.manifest} (from "
                                              f"{tiny_ckpt / 'config.json'}, {what})")
    assert len(fake_gpu.calls) == (0 if no_pins else 1)
    manifest = json.loads(cfg.manifest.read_text())
    assert manifest["vars"]["seqs"]["max"] == 64
    assert manifest["meta"]["caller"].get("decode_batch_invariant", False) is not no_pins


# ---------------------------------------------------------------- kern serve --weights: batched, batch-invariant


def test_serve_builds_a_batch_invariant_batched_decode_with_the_lm_head_pinned(tmp_path: Path, cache: Path) -> None:
    """`kern serve --weights` (seqs_max 64, batch_invariant): the lm_head shape (vocab x hidden) is picked with the
    projections, proven like them, and every decode projection's invariant decode pin (split-K allowed) is picked
    too, in the same progress line; every decode bucket runs them (nothing listed unproven)."""
    ckpt, pick = _checkpoint_dir(tmp_path, "Qwen3-1.7B"), FakePick()
    cfg, lines = _auto(ckpt, pick, seqs_max=64, batch_invariant=True)
    lm_head = (151936, 2048)
    shapes = sorted([*SHAPES_1_7B, lm_head])
    assert pick.calls == [(0, shapes, 2048)] and pick.invariant_calls == [(0, shapes)]
    # each shape's prefill pin, just picked, goes to the invariant search as its fallback candidate
    assert pick.fallbacks == {(n, k): _row(n, k)["algo"] for n, k in shapes}
    listed = ", ".join(f"{n}x{k}" for n, k in shapes)
    assert lines[0] == (f"kern run: picking batch-invariant cuBLASLt pins for 5 GEMM shapes ({listed}) and 5 "
                        f"invariant decode shapes ({listed}) on NVIDIA H200 (cuBLASLt 130100), first use: cached in "
                        f"{_cached(cache)}")
    assert lines[-1] == (f"kern run: built manifest {cfg.manifest} (from {ckpt / 'config.json'}, pins "
                         f"{_cached(cache)}, 64 decode rows, batch-invariant decode)")
    doc = json.loads(_cached(cache).read_text())
    assert doc["invariant_decode_pins"] == [_inv_row(n, k) for n, k in shapes]
    manifest = json.loads(cfg.manifest.read_text())
    caller = manifest["meta"]["caller"]
    assert manifest["vars"]["seqs"]["max"] == 64 and caller["decode_batch_invariant"] is True
    assert "decode_batch_invariant_unproven" not in caller
    assert caller["decode_batch_invariant_pins"] == {"invariant_decode": [f"{n}x{k}" for n, k in sorted(
        shapes, key=lambda s: f"{s[0]}x{s[1]}")], "prefill": []}
    assert manifest["ops"]["gemm_inv_151936x2048"]["launches"][0]["algo"] == _inv_row(*lm_head)["algo"]
    # the second run picks nothing
    again = FakePick()
    _, lines = _auto(ckpt, again, seqs_max=64, batch_invariant=True)
    assert again.calls == again.invariant_calls == [] and lines[0].startswith("kern run: reused manifest")


def test_a_cache_without_invariant_decode_pins_gets_only_those_picked(tmp_path: Path, cache: Path) -> None:
    """The prefill pins cached by a fast `kern serve`; a batch-invariant one then picks only the invariant decode
    pins (and the lm_head's prefill pin), keeping the cached rows."""
    ckpt = _checkpoint_dir(tmp_path, "Qwen3-1.7B")
    _auto(ckpt, FakePick(), seqs_max=16)
    pick = FakePick()
    _, lines = _auto(ckpt, pick, seqs_max=64, batch_invariant=True)
    lm_head = (151936, 2048)
    shapes = sorted([*SHAPES_1_7B, lm_head])
    assert pick.calls == [(0, [lm_head], 2048)] and pick.invariant_calls == [(0, shapes)]
    assert "for 1 GEMM shape (151936x2048) and 5 invariant decode shapes" in lines[0]
    doc = json.loads(_cached(cache).read_text())
    assert [(p["n"], p["k"]) for p in doc["pins"]] == shapes
    assert [(p["n"], p["k"]) for p in doc["invariant_decode_pins"]] == shapes


def test_committed_pins_seed_the_cache_with_only_invariant_decode_pins_picked(tmp_path: Path, cache: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A committed file of this GPU and cuBLASLt serving the prefill shapes (and lm_head) but no invariant decode
    pins: its rows are copied into the cache and only the invariant decode pins are picked."""
    committed = tmp_path / "committed"
    committed.mkdir()
    lm_head = (151936, 2048)
    shapes = sorted([*SHAPES_1_7B, lm_head])
    (committed / "h200.json").write_text(pins_text(pins_document(*H200, 2048, [_row(n, k) for n, k in shapes])))
    monkeypatch.setattr(pins_cache, "committed_pins_dir", lambda: committed)
    pick = FakePick()
    _, lines = _auto(_checkpoint_dir(tmp_path, "Qwen3-1.7B"), pick, seqs_max=64, batch_invariant=True)
    assert pick.calls == [] and pick.invariant_calls == [(0, shapes)]
    assert lines[0].startswith("kern run: picking batch-invariant cuBLASLt pins for 5 invariant decode shapes (")
    doc = json.loads(_cached(cache).read_text())
    assert doc["pins"] == [_row(n, k) for n, k in shapes]
    assert doc["invariant_decode_pins"] == [_inv_row(n, k) for n, k in shapes]


def test_serve_without_invariance_builds_the_fast_batched_decode(tmp_path: Path, cache: Path) -> None:
    ckpt, pick = _checkpoint_dir(tmp_path, "Qwen3-1.7B"), FakePick()
    cfg, lines = _auto(ckpt, pick, seqs_max=16)
    assert pick.calls == [(0, SHAPES_1_7B, 2048)]  # no lm_head pin: the fast decode does not run it on cuBLASLt pins
    assert lines[-1].endswith(", 16 decode rows)")
    manifest = json.loads(cfg.manifest.read_text())
    assert manifest["vars"]["seqs"]["max"] == 16 and "decode_batch_invariant" not in manifest["meta"]["caller"]


def test_a_batch_invariant_decode_needs_the_pins(tmp_path: Path, cache: Path) -> None:
    from kern_run.errors import ConfigError

    ckpt, pick = _checkpoint_dir(tmp_path, "Qwen3-1.7B"), FakePick()
    with pytest.raises(ConfigError, match="--no-pins cannot build one"):
        _auto(ckpt, pick, seqs_max=64, batch_invariant=True, pins=False)
    assert pick.calls == [] and not (cache / "manifests").exists()
