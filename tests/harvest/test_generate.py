"""The generator: the manifest verifies (kern-manifest check passes), is written whole or not at all, pins the
captured cubins in the specification's layout, and replayed by kern_runtime on the fake driver passes every kernel
the captured parameter bytes, with each pointer moved to the buffer, state or workspace slot it was mined into."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kern_manifest import load_manifest
from kern_run.harvest.capture_format import Launch, write_capture
from kern_run.harvest.errors import HarvestRefusal
from kern_run.harvest.generate import WORKSPACE, build_manifest, generate
from kern_run.harvest.mine import PointerArg, mine
from kern_run.harvest.workspace import Lifetime, pack
from tests.harvest.harvest_testkit import HIDDEN, VOCAB, synthetic_capture, u64, with_param
from tests.runtime.fake_cuda import OK, FakeDriver, fake_cuda  # noqa: F401 - the fixture
from tests.runtime.runtime_helpers import write_bf16_file


@pytest.fixture
def capture_dir(tmp_path: Path) -> Path:
    write_capture(tmp_path / "capture", synthetic_capture())
    return tmp_path / "capture"


def test_generate_writes_a_manifest_that_verifies(capture_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    manifest, mined = generate(capture_dir, out, "synthetic")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == sorted(
        ["manifest.json"] + [f"kernels/{m}-{sha[:12]}.cubin" for m, sha in manifest["modules"].items()])
    for module, sha in manifest["modules"].items():
        assert (out / "kernels" / f"{module}-{sha[:12]}.cubin").read_bytes() == mined.cubins[sha]
    m = load_manifest(out / "manifest.json")
    assert m.digest == manifest["digest"]
    proc = subprocess.run([sys.executable, "-m", "kern_manifest", "check", str(out / "manifest.json")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "decode [run]: graph (5 calls -> 1 graph launch), capture key: tokens" in proc.stdout
    assert manifest["vars"] == {"tokens": {"min": 1, "max": 2}}
    assert manifest["states"] == {"kv.0": {"kind": "fixed", "bytes": 2048}}
    assert manifest["buffers"]["model.norm.weight"]["bind"] == [{"tensor": "model.norm.weight", "shape": [64]}]
    embed = manifest["ops"]["kern_embed_gather"]  # called twice with hidden 64 and 32: an int argument
    assert [a["name"] for a in embed["args"]] == ["p0", "p1", "p2", "s4"]
    calls = manifest["programs"]["decode"]["calls"]
    assert [c["args"].get("s4") for c in calls if c["op"] == "kern_embed_gather"] == [64, 32]
    assert calls[2]["args"]["p0"] == {"buffer": "logits", "offset": "128 * tokens - 128"}
    assert calls[3]["args"]["p3"] == "next_token"


def test_same_named_kernels_of_other_layouts_become_separate_ops() -> None:
    capture = synthetic_capture()
    mined = mine(capture)
    twin = mined.launches[4]
    other = type(twin)(5, twin.function, twin.module, twin.params, twin.grid, (twin.block[1],) * 3, twin.shared_mem,
                       twin.args)  # another configuration (block 1x1x1) of the same entry
    manifest = build_manifest(type(mined)(**{**mined.__dict__, "launches": mined.launches + (other,)}), "x")
    assert sorted(n for n in manifest["ops"] if n.startswith("kern_embed_gather")) == ["kern_embed_gather",
                                                                                       "kern_embed_gather.2"]


def test_refusals_write_nothing(capture_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    write_capture(bad, with_param(synthetic_capture(), 0, 1, 0, u64(0x7E00_0000_0000)))
    with pytest.raises(HarvestRefusal, match=r"run 0 launch 1 param 0: 0x7e0000000000 points into no tensor"):
        generate(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    (tmp_path / "taken").mkdir()
    with pytest.raises(FileExistsError):
        generate(capture_dir, tmp_path / "taken")
    assert list((tmp_path / "taken").iterdir()) == []
    two = tmp_path / "two"
    write_capture(two, synthetic_capture((2, 3)))
    with pytest.raises(HarvestRefusal, match=r"no run at 1 token \(runs at \[2, 3\]\)"):
        generate(two, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "capture", "taken", "two"]  # no temporary left


# ---------------------------------------------------------------- replay on the fake driver


def _checkpoint(path: Path) -> None:
    rng = np.random.default_rng(0)
    write_bf16_file(path, {"model.embed_tokens.weight": rng.integers(0, 1 << 16, (VOCAB, HIDDEN), dtype=np.uint16),
                           "model.norm.weight": rng.integers(0, 1 << 16, (HIDDEN,), dtype=np.uint16)})


def _launched(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[int, ...], bytes]]:
    """Every cuLaunchKernel from now on as (entry, grid, parameter buffer read through kernelParams)."""
    seen: list[tuple[str, tuple[int, ...], bytes]] = []

    def launch(self: FakeDriver, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra) -> tuple:  # type: ignore[no-untyped-def]
        layout = self.entries[f.entry]
        pointers = (ctypes.c_void_p * len(layout)).from_address(int(params))
        buf = bytearray(max(o + s for o, s in layout))
        for i, (o, s) in enumerate(layout):
            buf[o:o + s] = ctypes.string_at(pointers[i], s)
        seen.append((f.entry, (int(gx), int(gy), int(gz)), bytes(buf)))
        return (OK,)

    monkeypatch.setattr(FakeDriver, "_cuLaunchKernel", launch, raising=False)
    return seen


@pytest.mark.parametrize(("tokens", "run"), [(1, 0), (2, 1)])
def test_replay_passes_the_captured_bytes_relocated(fake_cuda: FakeDriver, monkeypatch: pytest.MonkeyPatch,
                                                    capture_dir: Path, tmp_path: Path, tokens: int, run: int) -> None:
    from kern_runtime import Runtime, SafetensorsTensors

    out = tmp_path / "out"
    manifest, mined = generate(capture_dir, out, "synthetic")
    capture = synthetic_capture()
    fake_cuda.entries = {ml.function: ml.params for ml in mined.launches}
    _checkpoint(tmp_path / "model.safetensors")
    seen = _launched(fake_cuda, monkeypatch)
    with Runtime.load(out / "manifest.json", out / "kernels", SafetensorsTensors.open(tmp_path / "model.safetensors")) as rt:
        del seen[:]
        rt.issue("decode", {"tokens": tokens}, eager=True)
        rt.synchronize()
        offsets, _ = pack([Lifetime(f"#{a.ordinal}", a.nbytes_max, a.first, a.last) for a in mined.allocations])
        captured = [e for e in capture.runs[run].events if isinstance(e, Launch)]
        assert [(entry, grid) for entry, grid, _ in seen] == [(e.function, e.grid) for e in captured]
        for i, ((_, _, got), want, ml) in enumerate(zip(seen, captured, mined.launches)):
            for j, arg in enumerate(ml.args):
                o, s = want.params[j]
                if isinstance(arg, PointerArg):
                    base = rt.address_of(WORKSPACE) + offsets[arg.target] if arg.kind == "workspace" \
                        else rt.address_of(arg.target)
                    assert got[o:o + s] == u64(base + arg.offset.at(tokens)), (i, j)
                else:
                    assert got[o:o + s] == want.data[o:o + s], (i, j)  # literals and fits: the captured bytes
        rt.write_input("token_ids", np.array([5] * tokens, dtype=np.int64))
        rt.issue("decode", {"tokens": 1})  # the decode graph: one capture, replayed
        rt.issue("decode", {"tokens": 1})
        assert fake_cuda.called("cuGraphLaunch") == 2


def test_replayed_workspace_slots_alive_together_are_disjoint(capture_dir: Path, tmp_path: Path) -> None:
    manifest, mined = generate(capture_dir, tmp_path / "out")
    offsets, total = pack([Lifetime(f"#{a.ordinal}", a.nbytes_max, a.first, a.last) for a in mined.allocations])
    assert manifest["buffers"][WORKSPACE]["shape"] == [total]
    spans = {f"#{a.ordinal}": (offsets[f"#{a.ordinal}"], offsets[f"#{a.ordinal}"] + a.nbytes_max, a.first, a.last)
             for a in mined.allocations}
    for launch in range(len(mined.launches)):
        alive = sorted((o, e) for o, e, first, last in spans.values() if first <= launch <= last)
        assert all(e <= o2 for (_, e), (o2, _) in zip(alive, alive[1:])), launch
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["meta"]["harvest"]["exact_on_domain"] is True
