"""tools/decode_variants.py's command line: a bad --out is one stderr line and exit 1, before any generation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import decode_variants as dv
from tools import gen_qwen3 as gq


@pytest.fixture
def no_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gq, "main", lambda argv: pytest.fail(f"kern manifest build ran: {argv}"))


def test_out_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], no_generation: None) -> None:
    out = tmp_path / "variants"
    out.write_text("keep")
    assert dv.main(["--out", str(out), "--only", "v2"]) == 1
    assert capsys.readouterr().err == f"decode_variants: --out {out} exists and is not a directory\n"
    assert out.read_text() == "keep"


def test_out_below_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], no_generation: None) -> None:
    parent = tmp_path / "file"
    parent.write_text("")
    assert dv.main(["--out", str(parent / "variants")]) == 1
    assert capsys.readouterr().err == f"decode_variants: --out {parent / 'variants'}: Not a directory\n"


def test_writes_one_manifest_per_variant_and_the_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[list[str]] = []

    def fake_gen(argv: list[str]) -> int:
        calls.append(argv)
        Path(argv[argv.index("--out") + 1]).write_text("{}")
        return 0

    monkeypatch.setattr(gq, "main", fake_gen)
    out = tmp_path / "new" / "variants"
    names = list(dv.VARIANTS)[-2:]
    assert dv.main(["--out", str(out), "--only", ",".join(names)]) == 0
    paths = [str(out / f"qwen3-4b-{name}.json") for name in names]
    assert (out / "list").read_text() == ",".join(paths)
    assert [c[c.index("--name") + 1] for c in calls] == [f"qwen3-4b-{name}" for name in names]
    assert [c[-len(dv.VARIANTS[name]):] for c, name in zip(calls, names)] == [list(dv.VARIANTS[n]) for n in names]
    assert all(Path(p).read_text() == "{}" for p in paths)
    assert f"{len(names)} manifests in {out}" in capsys.readouterr().out
