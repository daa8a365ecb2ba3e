"""Hostile inputs to the tools: the builder's pins file (`load_algos`), tp_parity and pick_algos without a GPU
or with a bad pins file. One line naming the file, shape and key; exit 2 before anything touches a device."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from kern_run.models import qwen3 as gq
from kern_run_testutil import ROOT, kern_manifest_build

from tools import pick_algos
from tools import tp_parity
from kern_run.errors import NoDeviceError

PIN = {"id": 66, "tile": 20, "stages": 12, "split_k": 1, "swizzle": 1}


def _doc(**over: object) -> dict:
    doc = {"format": "kern-cublaslt-pins/1", "device": "NVIDIA H200", "cublaslt_version": 130100, "m_max": 2048,
           "pins": [{"n": 1024, "k": 256, "algo": dict(PIN)}, {"n": 256, "k": 512, "algo": dict(PIN)}],
           "decode_pins": [{"n": 1024, "k": 256, "algo": {"id": 21, "split_k": 4}, "us_1": 1.0,
                            "heuristic_us_1": 2.0}]}
    doc.update(over)
    return doc


def _write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "pins.json"
    path.write_text(json.dumps(doc))
    return path


# ---------------------------------------------------------------- 6. kern_run.models.qwen3.load_algos


def _pin(n: int, k: int, **algo: object) -> dict:
    return {"n": n, "k": k, "algo": algo}


@pytest.mark.parametrize("doc, needles", [
    ([1, 2], ["not a pins file", "list"]),
    ("pins", ["not a pins file"]),
    (_doc(pins={"n": 1}), ["pins is a JSON dict"]),
    (_doc(pins=[{"n": 1024, "k": 256, "algo": "x"}]), ["pins[0] (n=1024, k=256)", "\"algo\" must be an object"]),
    (_doc(pins=[_pin(1024, 256, id=1), _pin(1024, 256, id=2)]), ["pins[1] (n=1024, k=256)", "1024x256 a second time"]),
    (_doc(pins=[_pin(1024, 256, id=True)]), ["pins[0] (n=1024, k=256)", "algo id = True"]),
    (_doc(pins=[_pin(1024, 256, id=-1)]), ["pins[0] (n=1024, k=256)", "algo id = -1"]),
    (_doc(pins=[_pin(1024, 256, id=1, tyle=3)]), ["pins[0] (n=1024, k=256)", "algo key 'tyle'", "cluster_shape"]),
    (_doc(pins=[_pin(1024, 256, tile=3)]), ["pins[0] (n=1024, k=256)", "at least \"id\""]),
    (_doc(pins=[_pin(1024, 256, id=1, stages="12")]), ["algo stages = '12'"]),
    (_doc(pins=[{"n": "1024", "k": 256, "algo": PIN}]), ["pins[0] needs integer \"n\" and \"k\""]),
    (_doc(pins=[{"n": True, "k": 256, "algo": PIN}]), ["pins[0] needs integer \"n\" and \"k\""]),
    (_doc(decode_pins=[_pin(1024, 256, id=1), _pin(1024, 256, id=1)]), ["decode_pins[1] (n=1024, k=256)",
                                                                          "second time"]),
    (_doc(decode_pins=[_pin(6, 7, id=1, split=2)]), ["decode_pins[0] (n=6, k=7)", "algo key 'split'"]),
    (_doc(decode_pins={"a": 1}), ["decode_pins is a JSON dict"]),
    (_doc(invariant_decode_pins=[_pin(6, 7, id=1)]), ["invariant_decode_pins[0] (n=6, k=7)", "m_max = None",
                                                      "--invariant-decode"]),
    (_doc(invariant_decode_pins=[{**_pin(6, 7, id=1, split=2), "m_max": 64}]), ["invariant_decode_pins[0] (n=6, k=7)",
                                                                                 "algo key 'split'"]),
    (_doc(m_max=True), ["m_max = True"]),
    (_doc(cublaslt_version="13.1"), ["cublaslt_version = '13.1'"]),
    (_doc(device=None), ["device = None"]),
    (_doc(pins=[], decode_pins=[]), ["no pins"]),
])
def test_load_algos_refusals_name_file_shape_and_key(tmp_path: Path, doc: object, needles: list[str]) -> None:
    path = _write(tmp_path, doc)
    with pytest.raises(gq.ManifestBuildError) as err:
        gq.load_algos(path, chunk_max=512)
    assert str(err.value).startswith(f"{path}: "), err.value
    for needle in needles:
        assert needle in str(err.value), err.value


def test_load_algos_non_utf8(tmp_path: Path) -> None:
    path = tmp_path / "pins.json"
    path.write_bytes(b'{"format": "\xff"}')
    with pytest.raises(gq.ManifestBuildError, match="not a pins file"):
        gq.load_algos(path, chunk_max=512)


def test_load_algos_good_file(tmp_path: Path) -> None:
    algos, decode, source = gq.load_algos(_write(tmp_path, _doc()), chunk_max=512)
    assert algos == ((256, 512, tuple(sorted(PIN.items()))), (1024, 256, tuple(sorted(PIN.items()))))
    assert decode == ((1024, 256, (("id", 21), ("split_k", 4))),)
    assert source == (("device", "NVIDIA H200"), ("cublaslt_version", 130100), ("m_max", 2048))


def test_gen_main_refuses_bad_pins_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, [1, 2])
    rc = kern_manifest_build(["--shape", "tiny", "--kernels", str(ROOT / "kernels"), "--out", str(tmp_path / "m.json"),
                              "--algos", str(path)])
    err = capsys.readouterr().err
    assert rc == 1 and str(path) in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_committed_pins_file_loads() -> None:
    algos, decode, _ = gq.load_algos(ROOT / "manifests" / "algos" / "h200.json", chunk_max=2048)
    assert algos and decode


# ---------------------------------------------------------------- 7. tp_parity, pick_algos


def _no_device(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    probed: list[int] = []

    def probe(gpu: int) -> int:
        probed.append(gpu)
        raise NoDeviceError("no CUDA device: the CUDA driver library cannot be loaded")

    monkeypatch.setattr("kern_run.preflight.probe_device", probe)
    return probed


def _one_line(capsys: pytest.CaptureFixture[str], *needles: str) -> None:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


def test_tp_parity_without_a_gpu(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                 tmp_path: Path) -> None:
    probed = _no_device(monkeypatch)
    ckpt = tmp_path / "ckpt"
    assert tp_parity.main(["--shape", "tiny", "--ckpt", str(ckpt), "--tp", "2", "--gpu", "1"]) == 2
    _one_line(capsys, "tp_parity: no CUDA device")
    assert probed == [2] and not ckpt.exists()  # the last GPU of the TP group probed; no checkpoint written


def test_tp_parity_explicit_algos_must_exist(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    probed = _no_device(monkeypatch)
    missing = tmp_path / "nope.json"
    assert tp_parity.main(["--shape", "tiny", "--ckpt", str(tmp_path / "c"), "--algos", str(missing)]) == 2
    _one_line(capsys, f"--algos {missing}: no such file")
    assert probed == []
    assert tp_parity.main(["--shape", "tiny", "--ckpt", str(tmp_path / "c"), "--tp", "1"]) == 2
    _one_line(capsys, "--tp >= 2")


def test_tp_parity_removes_its_manifest_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tools import make_checkpoint

    monkeypatch.setattr("kern_run.preflight.probe_device", lambda gpu: 4)
    monkeypatch.setattr(make_checkpoint, "write_checkpoint", lambda *a, **k: None)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen: list[Path] = []

    def failing_gen(args: list[str]) -> None:
        out = Path(args[args.index("--out") + 1])
        seen.append(out.parent)
        out.write_text("{}")
        assert "--algos" not in args or Path(args[args.index("--algos") + 1]).is_file()
        raise SystemExit("tp_parity: kern manifest build failed")

    monkeypatch.setattr(tp_parity, "_gen", failing_gen)
    with pytest.raises(SystemExit):
        tp_parity.main(["--shape", "tiny", "--ckpt", str(tmp_path / "c")])
    assert seen and seen[0].parent == tmp_path and not seen[0].exists()


def test_pick_algos_without_a_gpu(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    probed = _no_device(monkeypatch)
    assert pick_algos.main(["--shape", "tiny", "--gpu", "0"]) == 2
    _one_line(capsys, "pick_algos: no CUDA device")
    assert probed == [0]


@pytest.mark.parametrize("doc, needle", [
    (_doc(format="other/1"), "format 'other/1'"),
    (_doc(pins={"n": 1}), "pins is a JSON dict"),
    ([1], "not a pins file"),
    (_doc(pins=[_pin(1024, 256, id=1, tyle=2)]), "algo key 'tyle'"),
])
def test_pick_algos_checks_keep_pins_before_the_device(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                       doc: object, needle: str) -> None:
    probed = _no_device(monkeypatch)
    path = _write(tmp_path, doc)
    assert pick_algos.main(["--shape", "tiny", "--keep-pins", str(path), "--decode"]) == 2
    _one_line(capsys, f"--keep-pins: {path}", needle)
    assert probed == []
    assert pick_algos.main(["--shape", "tiny", "--keep-pins", str(tmp_path / "missing.json")]) == 2
    _one_line(capsys, "missing.json")


def test_pick_algos_host_checks(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                tmp_path: Path) -> None:
    probed = _no_device(monkeypatch)
    assert pick_algos.main(["--shape", "qwen3-5b"]) == 2
    _one_line(capsys, "--shape 'qwen3-5b'")
    assert pick_algos.main([]) == 2
    _one_line(capsys, "pass --shape or --config")
    bad = tmp_path / "config.json"
    bad.write_text("[1]")
    assert pick_algos.main(["--config", str(bad)]) == 2
    _one_line(capsys, f"--config {bad}")
    assert probed == []


def test_pick_algos_refuses_bad_config_values_before_the_device(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 tmp_path: Path) -> None:
    from tools.make_checkpoint import SHAPES, config_json

    probed = _no_device(monkeypatch)
    config = tmp_path / "config.json"
    for over, reason in (({"num_key_value_heads": 0}, "num_key_value_heads = 0 must be a JSON integer >= 1"),
                         ({"hidden_size": "abc"}, "hidden_size = 'abc' must be a JSON integer >= 1"),
                         ({"tie_word_embeddings": "false"}, "tie_word_embeddings = 'false' must be a JSON boolean")):
        config.write_text(json.dumps({**config_json(SHAPES["tiny"]), **over}))
        assert pick_algos.main(["--config", str(config)]) == 2
        _one_line(capsys, f"pick_algos: --config {config}: {reason}")
    config.write_bytes(b"\xff")
    assert pick_algos.main(["--config", str(config)]) == 2
    _one_line(capsys, f"pick_algos: --config {config}: not UTF-8 text (byte 0xff at offset 0)")
    assert probed == []


@pytest.mark.parametrize(("args", "needle"), [
    (["--tp", "0"], "pick_algos: --tp 0: a tensor-parallel degree is >= 1"),
    (["--tp", "-1"], "pick_algos: --tp -1: a tensor-parallel degree is >= 1"),
    (["--tp", "2", "--tp", "3"], "pick_algos: --tp 3: num_attention_heads 4 of --shape tiny is not divisible by it"),
    (["--tp", "4"], "pick_algos: --tp 4: num_key_value_heads 2 of --shape tiny is not divisible by it"),
    (["--m-max", "0"], "pick_algos: --m-max 0: the largest M must be >= 1"),
])
def test_pick_algos_refuses_a_tp_that_cannot_split_the_shapes(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str],
                                                              args: list[str], needle: str) -> None:
    probed = _no_device(monkeypatch)
    assert pick_algos.main(["--shape", "tiny", *args]) == 2
    _one_line(capsys, needle)
    assert probed == []
    assert pick_algos.main(["--shape", "tiny", "--tp", "2"]) == 2  # tiny splits in 2: on to the device probe
    _one_line(capsys, "pick_algos: no CUDA device")
    assert probed == [0]


@pytest.fixture
def fake_device(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """pick_algos's device side faked: the device name and cuBLASLt version kern_runtime.gemm_pins.PinPicker
    reports are `state`'s; its decode search records the shapes in "picked", its prefill search (n, k, m_max) in
    "prefill", its invariant decode search the shapes in "invariant"."""
    state: dict[str, object] = {"name": "NVIDIA H200", "version": 130100, "picked": [], "prefill": [],
                                "invariant": []}
    monkeypatch.setattr("kern_run.preflight.probe_device", lambda gpu: 1)

    class Picker:
        def __init__(self, gpu: int) -> None:
            self.device, self.cublaslt_version = state["name"], state["version"]

        def __enter__(self) -> "Picker":
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def prefill(self, n: int, k: int, m_max: int, log: object) -> dict:
            state["prefill"].append((n, k, m_max))
            return {"n": n, "k": k, "algo": {"id": 66, "tile": 9}, "us_512": 1.0, "us_max": 2.0,
                    "heuristic_us_512": 1.0, "heuristic_us_max": 2.0, "heuristic_invariant": False, "candidates": 3}

        def decode(self, n: int, k: int, log: object) -> dict:
            state["picked"].append((n, k))
            return {"n": n, "k": k, "algo": {"id": 7}, "us_1": 1.0, "heuristic_us_1": 2.0, "candidates": 1}

        def invariant_decode(self, n: int, k: int, log: object, fallback: dict | None = None) -> dict:
            state["invariant"].append((n, k))
            state.setdefault("fallbacks", []).append(fallback)
            return {"n": n, "k": k, "algo": {"id": 8, "split_k": 3, "reduction": 2}, "us_1": 1.0, "us_8": 1.5,
                    "us_64": 4.0, "m_max": 64, "candidates": 6}

    monkeypatch.setattr("kern_runtime.gemm_pins.PinPicker", Picker)  # what tools/pick_algos.py imports
    return state


def test_pick_algos_keeps_the_kept_files_stamp_and_decode_pins(fake_device: dict, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    fake_device.update(name="NVIDIA A100", version=120000)
    kept = _write(tmp_path, _doc())
    out = tmp_path / "out.json"
    assert pick_algos.main(["--shape", "tiny", "--keep-pins", str(kept), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert (doc["device"], doc["cublaslt_version"]) == ("NVIDIA H200", 130100)  # not this device's stamp
    assert doc["pins"] == _doc()["pins"] and doc["decode_pins"] == _doc()["decode_pins"]  # nothing dropped
    capsys.readouterr()


def test_pick_algos_refuses_decode_pins_from_another_device(fake_device: dict, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    kept = _write(tmp_path, _doc())
    out = tmp_path / "out.json"
    for name, version in (("NVIDIA A100", 130100), ("NVIDIA H200", 120900)):
        fake_device.update(name=name, version=version)
        assert pick_algos.main(["--shape", "tiny", "--keep-pins", str(kept), "--decode", "--out", str(out)]) == 2
        _one_line(capsys, f"--keep-pins {kept} was picked on NVIDIA H200 with cuBLASLt 130100", f"this is {name}")
    assert fake_device["picked"] == [] and not out.exists()
    fake_device.update(name="NVIDIA H200", version=130100)
    assert pick_algos.main(["--shape", "tiny", "--keep-pins", str(kept), "--decode", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["pins"] == _doc()["pins"] and {(p["n"], p["k"]) for p in doc["decode_pins"]} == set(
        fake_device["picked"])
    assert (doc["device"], doc["cublaslt_version"]) == ("NVIDIA H200", 130100)
    capsys.readouterr()


def test_pick_algos_lm_head_adds_the_lm_head_pins_after_the_kept_ones(fake_device: dict, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """--lm-head --keep-pins: the kept pins stay as they are (order and all), and the lm_head shape (vocab x hidden)
    is picked like a prefill pin (PinPicker.prefill, proven across M) and appended; nothing is picked on another
    device."""
    from kern_run.models import qwen3 as gq

    picked = fake_device["prefill"]
    kept = _write(tmp_path, _doc())
    out = tmp_path / "out.json"
    fake_device.update(name="NVIDIA A100")
    assert pick_algos.main(["--shape", "tiny", "--keep-pins", str(kept), "--lm-head", "--out", str(out)]) == 2
    _one_line(capsys, f"--keep-pins {kept} was picked on NVIDIA H200 with cuBLASLt 130100", "this is NVIDIA A100")
    assert picked == [] and not out.exists()
    fake_device.update(name="NVIDIA H200")
    assert pick_algos.main(["--shape", "tiny", "--keep-pins", str(kept), "--lm-head", "--out", str(out)]) == 0
    cfg = gq.Qwen3Config.from_name("tiny")
    assert picked == [(cfg.vocab, cfg.hidden, 2048)]  # the kept file's m_max
    doc = json.loads(out.read_text())
    assert doc["pins"][:2] == _doc()["pins"] and [(p["n"], p["k"]) for p in doc["pins"][2:]] == [(cfg.vocab,
                                                                                                   cfg.hidden)]
    assert doc["decode_pins"] == _doc()["decode_pins"]
    # the builder reads it: the lm_head pin is now a proven one
    algos, _, _ = gq.load_algos(out, 512)
    assert (cfg.vocab, cfg.hidden) in {(n, k) for n, k, _ in algos}
    capsys.readouterr()


def test_pick_algos_invariant_decode_adds_rows_and_keeps_the_rest(fake_device: dict, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """--invariant-decode --keep-pins: the kept pins and decode pins stay; every shape of the config (prefill
    projections and the lm_head) gets an invariant decode row, picked anew where the kept file had one; the kept
    file's rows of other shapes stay; the builder reads them. Nothing is picked on another device."""
    from kern_run.models import qwen3 as gq

    other = {"n": 7, "k": 9, "algo": {"id": 5}, "us_1": 1.0, "us_8": 1.0, "us_64": 1.0, "m_max": 64, "candidates": 1}
    cfg = gq.Qwen3Config.from_name("tiny")
    stale = {**other, "n": cfg.vocab, "k": cfg.hidden, "algo": {"id": 4}}
    kept = _write(tmp_path, _doc(invariant_decode_pins=[other, stale]))
    out = tmp_path / "out.json"
    fake_device.update(version=120000)
    assert pick_algos.main(["--shape", "tiny", "--keep-pins", str(kept), "--invariant-decode", "--out", str(out)]) == 2
    _one_line(capsys, f"--keep-pins {kept} was picked on NVIDIA H200 with cuBLASLt 130100", "cuBLASLt 120000")
    assert fake_device["invariant"] == [] and not out.exists()
    fake_device.update(version=130100)
    assert pick_algos.main(["--shape", "tiny", "--keep-pins", str(kept), "--invariant-decode", "--out", str(out)]) == 0
    shapes = sorted(set(pick_algos.gemm_shapes(cfg, 1)) | {(cfg.vocab, cfg.hidden)})
    assert fake_device["invariant"] == shapes and fake_device["prefill"] == [] and fake_device["picked"] == []
    prefill = {(p["n"], p["k"]): p["algo"] for p in _doc()["pins"]}  # each shape's kept prefill pin, its fallback
    assert fake_device["fallbacks"] == [prefill.get(s) for s in shapes] and any(fake_device["fallbacks"])
    doc = json.loads(out.read_text())
    assert doc["pins"] == _doc()["pins"] and doc["decode_pins"] == _doc()["decode_pins"]
    assert [(p["n"], p["k"]) for p in doc["invariant_decode_pins"]] == sorted([(7, 9), *shapes])
    assert doc["invariant_decode_pins"][0] == other
    lm = next(p for p in doc["invariant_decode_pins"] if (p["n"], p["k"]) == (cfg.vocab, cfg.hidden))
    assert lm["algo"] == {"id": 8, "split_k": 3, "reduction": 2}  # the stale row replaced
    inv = gq.invariant_decode_from_doc(out, doc)
    assert {(n, k) for n, k, _ in inv} == {(7, 9), *shapes}
    capsys.readouterr()


def test_pick_algos_keeps_invariant_decode_pins_without_the_flag(fake_device: dict, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    row = {"n": 7, "k": 9, "algo": {"id": 5}, "us_1": 1.0, "us_8": 1.0, "us_64": 1.0, "m_max": 64, "candidates": 1}
    kept = _write(tmp_path, _doc(invariant_decode_pins=[row]))
    out = tmp_path / "out.json"
    assert pick_algos.main(["--shape", "tiny", "--keep-pins", str(kept), "--decode", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["invariant_decode_pins"] == [row] and fake_device["invariant"] == []
    capsys.readouterr()
