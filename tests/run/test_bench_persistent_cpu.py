"""bench/persistent.py's pure parts on the CPU: the table from bench/decode.py summaries (floors, ratios against v2,
the best variant, the ctx-128 targets) and the options it refuses before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import persistent


def _summary(floor_ms: float, kv_bytes_per_token: int, ms: dict[tuple[str, int], float]) -> dict:
    return {"floor_ms_weights": floor_ms, "kv_bytes_per_token": kv_bytes_per_token,
            "results": [{"peer": f"{mode} [{v}]", "variant": v, "ctx": ctx, "ms_per_token": t + extra}
                        for (v, ctx), t in ms.items()
                        for mode, extra in (("kern (graph)", 0.0), ("kern (graph, sync loop)", 0.3),
                                            ("kern (eager)", 0.6))]
            + [{"peer": "kern breakdown", "variant": "v2", "ctx": 128}]}


def test_the_table_gives_floors_ratios_and_targets() -> None:
    summaries = {
        "qwen3-4b": _summary(1.875, 147456, {("v2", 128): 2.5, ("split", 128): 3.0, ("fused", 128): 2.0,
                                             ("v2", 4096): 2.8, ("split", 4096): 3.5}),
        "qwen3-1.7b": _summary(0.80, 114688, {("v2", 128): 1.4, ("split", 128): 1.2}),
    }
    rows, text = persistent.table(summaries, ["split", "fused"], [128, 4096])
    by = {(r["shape"], r["ctx"]): r for r in rows}
    r = by[("qwen3-4b", 128)]
    assert r["floor_ms"] == pytest.approx(1.875 + 1e3 * 128 * 147456 / 4.3e12)
    assert r["best"] == "fused" and r["best_vs_v2"] == pytest.approx(0.8) and r["target_ms"] == 2.00
    r = by[("qwen3-4b", 4096)]
    assert r["best"] == "split" and r["best_vs_v2"] == pytest.approx(3.5 / 2.8) and r["target_ms"] is None
    assert r["ms"] == {"v2": 2.8, "split": 3.5}  # fused not measured at 4096: absent, not zero
    r = by[("qwen3-1.7b", 4096)]
    assert r["best"] is None and r["best_vs_v2"] is None and r["ms"] == {}
    lines = text.splitlines()
    assert "best / v2" in lines[2] and "target" in lines[2]
    row = next(line for line in lines if line.startswith("qwen3-4b") and " 128 " in line)
    assert "2.000 (" in row and "0.800" in row and row.rstrip().endswith("2.00")
    assert len([line for line in lines if line.startswith("qwen3-")]) == 4


@pytest.mark.parametrize(("argv", "words"), [
    (["--shapes", "qwen3-3b"], "--shapes qwen3-3b: known shapes are qwen3-1.7b, qwen3-4b, qwen3-8b"),
    (["--shapes", ","], "--shapes (none)"),
    (["--variants", "fused,bogus"], "--variants bogus: known variants are split, fused"),
    (["--contexts", "128,x"], "--contexts '128,x': a comma list of positive integers"),
    (["--contexts", "0"], "--contexts '0'"),
    (["--steps", "-3"], "--steps '-3'"),
])
def test_bad_options_are_refused_in_one_line(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert persistent.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench/persistent.py: ") and words in err and err.count("\n") == 1, err


def test_every_variant_is_options_gen_persistent_takes(capsys: pytest.CaptureFixture[str]) -> None:
    from tools import gen_persistent

    for name, options in persistent.VARIANTS.items():
        code = gen_persistent.main(["--config", "tests/data/configs/Qwen3-1.7B.json", "--out", "/dev/null/x",
                                    *options])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("gen_persistent: --out /dev/null/x"), (name, err)  # built, not written


def test_a_run_builds_every_manifest_and_benches_each_shape(tmp_path, monkeypatch, capsys) -> None:
    """main() with the subprocesses stood in for: per shape the v2 manifest and one persistent manifest per variant
    from the checkpoint's config, then bench/decode.py over all of them; the summaries make the table and the JSON."""
    import json
    import shutil
    from pathlib import Path

    configs = Path(__file__).parents[1] / "data" / "configs"
    for shape, name in (("qwen3-1.7b", "Qwen3-1.7B"), ("qwen3-4b", "Qwen3-4B")):
        (tmp_path / shape).mkdir()
        shutil.copy(configs / f"{name}.json", tmp_path / shape / "config.json")
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], notes: list[str], what: str, timeout: float) -> bool:
        calls.append(cmd)
        if cmd[1].endswith("decode.py"):
            manifests = cmd[cmd.index("--variants") + 1].split(",")
            results = [{"peer": f"kern (graph) [{Path(m).stem}]", "variant": Path(m).stem, "ctx": 128,
                        "ms_per_token": 2.0 + i / 10} for i, m in enumerate(manifests)]
            Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps(
                {"floor_ms_weights": 1.0, "results": results, "notes": []}))
        return True

    monkeypatch.setattr(persistent, "_run", fake_run)
    out = tmp_path / "out.json"
    code = persistent.main(["--shapes", "qwen3-1.7b,qwen3-4b", "--contexts", "128", "--variants", "split,fused",
                            "--weights", str(tmp_path), "--json", str(out)])
    assert code == 0, capsys.readouterr()
    tools = [Path(c[1]).name for c in calls]
    assert tools == ["gen_qwen3.py", "gen_persistent.py", "gen_persistent.py", "decode.py"] * 2
    v2, split, fused, bench = calls[:4]
    assert v2[v2.index("--config") + 1] == str(tmp_path / "qwen3-1.7b" / "config.json") and "--gemv" in v2
    assert "--attn" not in split and fused[fused.index("--attn") + 1] == "fused"
    assert [Path(m).stem for m in bench[bench.index("--variants") + 1].split(",")] == ["v2", "split", "fused"]
    assert bench[bench.index("--ckpt") + 1] == str(tmp_path / "qwen3-1.7b") and "--only" in bench
    doc = json.loads(out.read_text())
    rows = {(r["shape"], r["ctx"]): r for r in doc["rows"]}
    assert rows[("qwen3-4b", 128)]["ms"] == {"v2": 2.0, "split": 2.1, "fused": 2.2}
    assert rows[("qwen3-4b", 128)]["best"] == "split" and rows[("qwen3-4b", 128)]["target_ms"] == 2.00
    assert "qwen3-1.7b" in capsys.readouterr().out


def test_a_hostile_config_is_one_note_not_a_hang(tmp_path, monkeypatch, capsys) -> None:
    """A checkpoint whose config.json is a FIFO (would block a plain read), a directory, or JSON without the model's
    fields: that shape is skipped with one note naming the file, no subprocess runs for it, and the run exits 1."""
    import os
    import time

    (tmp_path / "qwen3-1.7b").mkdir()
    os.mkfifo(tmp_path / "qwen3-1.7b" / "config.json")
    (tmp_path / "qwen3-4b" / "config.json").mkdir(parents=True)
    (tmp_path / "qwen3-8b").mkdir()
    (tmp_path / "qwen3-8b" / "config.json").write_text("[1, 2]")
    ran: list[list[str]] = []
    monkeypatch.setattr(persistent, "_run", lambda cmd, *a: ran.append(cmd) or False)

    class NoCheckpoint:  # the FIFO and the directory are not regular files: the run would make checkpoints
        def __init__(self, cmd, **kw):
            ran.append(cmd)
            self.returncode = 1

        def communicate(self):
            return "", "make_checkpoint stood in for"

    monkeypatch.setattr(persistent.subprocess, "Popen", NoCheckpoint)
    start = time.perf_counter()
    assert persistent.main(["--weights", str(tmp_path), "--contexts", "128"]) == 1
    assert time.perf_counter() - start < 10
    out = capsys.readouterr().out
    assert all(Path(c[1]).name == "make_checkpoint.py" for c in ran) and len(ran) == 2, ran
    assert "qwen3-8b:" in out and "config.json" in out
    for shape in ("qwen3-1.7b", "qwen3-4b"):
        assert f"{shape}: make_checkpoint exit 1" in out
