"""bench/decode_batch.py (`bench/decode.py --batch`) on the CPU: the pure parts (batch and context parsing, the
floor, the caller-contract rows, the greedy sampler inputs, the check's judge, the table and targets), kern's
batched rows over a fake runtime whose decode advances its own inputs in fake device memory, and the
orchestration with a fake worker. The GPU run itself is the lead's (the report gives the command)."""

from __future__ import annotations

import itertools
import json
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from bench import decode as bench_decode
from bench import decode_batch as bb

ROOT = Path(__file__).resolve().parents[2]
QWEN3_4B_KV = 2 * 36 * 8 * 128 * 2  # K and V, 36 layers, 8 kv heads, head_dim 128, bf16


# ---------------------------------------------------------------- parsing


def test_parse_batches_keeps_order() -> None:
    assert bb.parse_batches("1,8,32,64") == [1, 8, 32, 64]
    assert bb.parse_batches(" 64, 1 ") == [64, 1]
    assert bb.parse_batches("1") == [1]


@pytest.mark.parametrize(("text", "said"), [
    ("0", "--batch 0 is outside [1, 64]"),
    ("65", "--batch 65 is outside [1, 64]"),
    ("1,65", "--batch 65 is outside [1, 64]"),
    ("-1", "--batch -1 is outside [1, 64]"),
    ("x", "--batch 'x' is not an integer (allowed: [1, 64])"),
    ("1.5", "--batch '1.5' is not an integer"),
    ("", "give a comma list of integers"),
    ("1,,8", "an empty entry"),
    ("8,8", "--batch 8 is given twice"),
])
def test_parse_batches_refuses(text: str, said: str) -> None:
    with pytest.raises(bb.BatchSpecError) as info:
        bb.parse_batches(text)
    assert said in str(info.value)
    assert isinstance(info.value, ValueError)


def test_parse_contexts() -> None:
    assert bb.parse_contexts("128,2048") == [128, 2048]
    with pytest.raises(bb.BatchSpecError, match="--contexts 0 is outside >= 1"):
        bb.parse_contexts("128,0")
    with pytest.raises(bb.BatchSpecError, match="'2k' is not an integer"):
        bb.parse_contexts("2k")


def test_batches_must_fit_the_manifest() -> None:
    bb.check_batches_fit([1], 1, "m.json")
    bb.check_batches_fit([1, 8, 32, 64], 64, "m.json")
    with pytest.raises(bb.BatchSpecError, match=r"--batch 8: manifest m.json takes at most 1 row\(s\)"):
        bb.check_batches_fit([1, 8, 32], 1, "m.json")


# ---------------------------------------------------------------- floor


def test_kv_bytes_per_token_of_qwen3_4b() -> None:
    cfg = json.loads((ROOT / "tests" / "data" / "configs" / "Qwen3-4B.json").read_text())
    assert bb.kv_bytes_per_token(cfg) == QWEN3_4B_KV == 147456
    # no head_dim key: hidden / heads
    assert bb.kv_bytes_per_token({"num_key_value_heads": 2, "hidden_size": 512, "num_attention_heads": 8,
                                  "num_hidden_layers": 3}) == 2 * 3 * 2 * 64 * 2


def test_floor_is_weights_plus_every_rows_kv_at_4_3_tb_s() -> None:
    w = 8_050_000_000
    assert bb.floor_ms(w, 1, 0, QWEN3_4B_KV) == pytest.approx(1e3 * 8.05e9 / 4.3e12)  # 1.872 ms: docs/perf.md
    assert bb.floor_ms(w, 1, 0, QWEN3_4B_KV) == pytest.approx(1.8721, abs=1e-4)
    # bs 32 at 2048: 32 * 2048 * 147456 = 9_663_676_416 bytes of KV on top of the weights
    assert bb.floor_ms(w, 32, 2048, QWEN3_4B_KV) == pytest.approx(1e3 * (8.05e9 + 9_663_676_416) / 4.3e12)
    assert bb.floor_ms(w, 32, 2048, QWEN3_4B_KV) == pytest.approx(4.1195, abs=1e-4)
    assert bb.floor_ms(w, 8, 128, QWEN3_4B_KV, hbm=1e12) == pytest.approx(1e3 * (8.05e9 + 8 * 128 * 147456) / 1e12)


def test_peer_cache_and_check_lengths() -> None:
    assert [bb.cache_size(c) for c in (0, 15, 16, 128, 2048)] == [16, 16, 32, 144, 2064]
    assert bb.check_lengths(32, 6) == [32, 37, 42, 47, 32, 37]


# ---------------------------------------------------------------- the rows of a step


def test_row_inputs_follow_the_caller_contract() -> None:
    pages = [[3, 4], [9], [5, 6, 7]]
    positions = [17, 0, 40]
    out = bb.row_inputs(pages, positions, [11, 12, 13], page_tokens=16, width=4, scratch_page=0)
    assert all(a.dtype == np.int32 for a in out.values())
    assert out["token_ids"].tolist() == [11, 12, 13]
    assert out["positions"].tolist() == positions
    assert out["seq_lens"].tolist() == [18, 1, 41]
    # slot = page_ids[p // 16] * 16 + p % 16, written out by hand
    assert out["slot_mapping"].tolist() == [4 * 16 + 1, 9 * 16 + 0, 7 * 16 + 8]
    assert out["cu_seqlens_q"].tolist() == [0, 1, 2, 3]
    assert out["block_table"].tolist() == [[3, 4, 0, 0], [9, 0, 0, 0], [5, 6, 7, 0]]
    with pytest.raises(ValueError, match="row 0: position 32 is not inside its 2 pages of 16"):
        bb.row_inputs([[3, 4]], [32], [1], 16, 4)
    with pytest.raises(ValueError, match="row 0: 3 pages, the block table has room for 2"):
        bb.row_inputs([[1, 2, 3]], [0], [1], 16, 2)
    with pytest.raises(ValueError, match="2 page rows, 1 positions"):
        bb.row_inputs([[1], [2]], [0], [1, 2], 16, 2)


def _batched_manifest(tmp_path: Path, sampling: object = {"params": "sample_params"}, hist_cap: int = 8,
                      params_buffer: bool = True) -> Path:
    """The tiny manifest of the argmax wiring, with seqs max 64 and the sampler's per-row inputs added by hand (digest
    dropped: it verifies)."""
    m = _argmax_tiny()
    m.pop("digest", None)
    m["vars"]["seqs"]["max"] = 64
    if params_buffer:
        m["buffers"]["sample_params"] = {"kind": "input", "dtype": "u32", "shape": ["seqs", 12]}
    if hist_cap:
        m["buffers"]["hist_tokens"] = {"kind": "input", "dtype": "i32", "shape": ["seqs", hist_cap]}
        m["buffers"]["hist_counts"] = {"kind": "input", "dtype": "i32", "shape": ["seqs", hist_cap]}
    if sampling is not None:
        m["meta"]["caller"]["sampling"] = sampling
    path = tmp_path / "qwen3-tiny-b64.json"
    path.write_text(json.dumps(m))
    return path


def _argmax_tiny() -> dict:
    from kern_run.models import qwen3 as gq

    built = gq.build_manifest(gq.Qwen3Config.from_name("tiny"), gq.read_kernel_abi(ROOT / "kernels"),
                              gq.BuildOptions("qwen3-tiny", max_context=4096, sampler="argmax"))
    return json.loads(gq.dumps(built))


def _parsed(path: Path):
    from kern_manifest import parse_manifest

    return parse_manifest(json.loads(path.read_text()))


def test_greedy_sampling_inputs(tmp_path: Path) -> None:
    manifest = _parsed(_batched_manifest(tmp_path))
    assert bb.seqs_max(manifest) == 64
    assert bb.sampling_names(manifest) == {"params": "sample_params", "hist_tokens": "hist_tokens",
                                           "hist_counts": "hist_counts"}
    out = bb.sampling_inputs(manifest, 3)
    params = out["sample_params"]
    assert params.dtype == np.uint32 and params.shape == (3, 12)
    one = struct.unpack("<I", struct.pack("<f", 1.0))[0]  # 0x3f800000
    # temperature 0, top_k 0, top_p 1, min_p 0, repetition 1, presence 0, frequency 0, then zero words
    assert params.tolist() == [[0, 0, one, 0, one, 0, 0, 0, 0, 0, 0, 0]] * 3
    assert out["hist_tokens"].dtype == np.int32 and out["hist_tokens"].tolist() == [[-1] * 8] * 3
    assert out["hist_counts"].tolist() == [[0] * 8] * 3


def test_sampling_inputs_absent_or_misdeclared(tmp_path: Path) -> None:
    argmax = tmp_path / "argmax.json"
    argmax.write_text(json.dumps(_argmax_tiny()))
    today = _parsed(argmax)
    assert bb.seqs_max(today) == 1 and bb.sampling_names(today) == {} and bb.sampling_inputs(today, 1) == {}
    # an input named sample_params without meta.caller.sampling still gets greedy rows; no history buffers
    bare = _parsed(_batched_manifest(tmp_path, sampling=None, hist_cap=0))
    assert sorted(bb.sampling_inputs(bare, 2)) == ["sample_params"]
    broken = _parsed(_batched_manifest(tmp_path, sampling=True, params_buffer=False))
    with pytest.raises(ValueError, match="no input buffer 'sample_params'"):
        bb.sampling_names(broken)


def test_decode_vars(tmp_path: Path) -> None:
    assert bb.decode_vars(_parsed(_batched_manifest(tmp_path)), 8) == {"tokens": 8, "seqs": 8}


# ---------------------------------------------------------------- the check's judge


def _logits(rows: int, vocab: int = 4096, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3, size=(rows, vocab)).astype(np.float32)


def test_judge_passes_a_faithful_step() -> None:
    ref = _logits(5)
    noisy = ref + np.random.default_rng(1).normal(0, 0.01, size=ref.shape).astype(np.float32)
    got = bb.judge(noisy, ref, 0.25, tokens=np.argmax(noisy, axis=1))
    assert got["ok"] and got["failures"] == [] and got["top1"] == 1.0 and got["max_rel"] < 0.02


def test_judge_catches_swapped_rows() -> None:
    ref = _logits(4)
    swapped = ref[[0, 2, 1, 3]]
    got = bb.judge(swapped, ref, 10.0)  # a tolerance that lets everything else through
    assert not got["ok"] and got["mixed"] == [1, 2]
    assert any("nearer another row's reference" in f for f in got["failures"])


def test_judge_catches_garbage_and_wrong_tokens() -> None:
    ref = _logits(3)
    garbage = _logits(3, seed=9)
    got = bb.judge(garbage, ref, 0.25)
    assert not got["ok"] and got["max_rel"] > 0.25 and "max relative logit error" in got["failures"][0]
    tokens = np.argmax(ref, axis=1)
    tokens[2] = (tokens[2] + 1) % ref.shape[1]
    got = bb.judge(ref, ref, 0.25, tokens=tokens)
    assert not got["ok"] and got["token_vs_argmax"] == [2] and got["max_rel"] == 0.0


def test_judge_reports_top1_and_refuses_bad_shapes() -> None:
    ref = _logits(4)
    a = ref.copy()
    top = int(np.argmax(ref[3]))
    a[3, top] = ref[3].min() - 1.0  # row 3's top-1 moves; still nearest its own row, error within a loose bound
    got = bb.judge(a, ref, 10.0)
    assert got["ok"] and got["top1"] == 0.75 and got["mixed"] == []
    with pytest.raises(ValueError, match=r"logits \[rows, vocab\] expected"):
        bb.judge(ref[0], ref[0], 0.1)
    with pytest.raises(ValueError, match=r"got \[4, 4096\] and \[3, 4096\]"):
        bb.judge(ref, ref[:3], 0.1)


# ---------------------------------------------------------------- the table


def _rec(side: str, batch: int, ctx: int, ms: float, **kw) -> dict:
    return {"side": side, "batch": batch, "ctx": ctx, "ms_per_step": ms, "steps": 320,
            "label": "torch batched step (torch.compile(default)), one CUDA graph" if side == "torch" else "kern", **kw}


def _results() -> list[dict]:
    rows = []
    for c in (128, 2048):
        for b in (1, 8, 32, 64):
            rows.append(_rec("kern", b, c, {1: 2.5, 8: 2.6, 32: 3.0, 64: 4.0}[b] + (2.0 if c == 2048 else 0.0)))
            rows.append(_rec("torch", b, c, {1: 3.4, 8: 3.6, 32: 4.2, 64: 5.5}[b] + (1.5 if c == 2048 else 0.0)))
    rows.append({"side": "check", "batch": 8, "ok": True,
                 "kern": {"ok": True, "max_rel": 0.051, "top1": 1.0, "failures": []},
                 "torch": {"ok": True, "max_rel": 0.012, "top1": 1.0, "failures": []}})
    return rows


def test_table_values() -> None:
    w = 8_050_000_000
    text = bb.table(_results(), [1, 8, 32, 64], [128, 2048], w, QWEN3_4B_KV, ["a note"])
    lines = text.splitlines()
    row = next(ln for ln in lines if ln.split()[:2] == ["8", "128"])
    fl = bb.floor_ms(w, 8, 128, QWEN3_4B_KV)
    cells = row.replace("|", " ").split()
    assert float(cells[2]) == pytest.approx(fl, abs=1e-3)
    assert float(cells[3]) == 2.6 and int(cells[4]) == round(8 / 2.6e-3) and float(cells[5]) == pytest.approx(2.6 / fl, abs=0.01)
    assert float(cells[6]) == 3.6 and int(cells[7]) == round(8 / 3.6e-3)
    assert float(cells[9]) == pytest.approx(2.6 / 3.6, abs=0.005)
    assert "peer: torch batched step (torch.compile(default)), one CUDA graph" in text
    assert "over 320 steps" in text
    assert "bs=8 / bs=1 step at ctx 128, kern: 1.040x (target <= 1.10: met)" in text
    pct = 100 * bb.floor_ms(w, 32, 2048, QWEN3_4B_KV) / 5.0
    assert f"bs=32 at ctx 2048, kern: {pct:.1f}% of floor (target >= 80%: met)" in text
    assert "kern faster than the peer at every measured batch and context: met (8 of 8" in text
    assert "check bs=8: ok: kern max rel 5.10e-02, top-1 100%; torch max rel 1.20e-02" in text
    assert lines[-1] == "note: a note"


def test_targets_missed_and_unmeasured() -> None:
    rows = [r for r in _results() if r.get("side") != "check"]
    slow = next(r for r in rows if r["side"] == "kern" and r["batch"] == 64 and r["ctx"] == 2048)
    slow["ms_per_step"] = 7.35  # the peer: 7.0
    k8 = next(r for r in rows if r["side"] == "kern" and r["batch"] == 8 and r["ctx"] == 128)
    k8["ms_per_step"] = 2.9  # 1.16 x bs=1
    floors = {(32, 2048): 4.5}
    lines = bb.targets(rows, floors)
    assert "bs=8 / bs=1 step at ctx 128, kern: 1.160x (target <= 1.10: MISSED)" in lines
    assert "bs=32 at ctx 2048, kern: 90.0% of floor (target >= 80%: met)" in lines
    assert lines[-1].startswith("kern faster than the peer at every measured batch and context: MISSED; slower at "
                                "bs=64 ctx 2048 (1.05x)")
    only_one = [r for r in rows if r["batch"] == 1]
    lines = bb.targets(only_one, {})
    assert "bs=8 / bs=1 step at ctx 128, kern: - (target <= 1.10: not measured)" in lines
    assert "bs=32 at ctx 2048, kern: - (target >= 80%: not measured)" in lines
    text = bb.table(only_one, [1, 8], [128], 8_050_000_000, QWEN3_4B_KV)
    row8 = next(ln for ln in text.splitlines() if ln.split()[:2] == ["8", "128"])
    assert row8.replace("|", " ").split()[3:] == ["-", "-", "-"]


def test_variants_table_compares_each_variant_with_kern() -> None:
    w = 8_050_000_000
    rows = _results() + [{"side": "variant", "tag": "qwen3-4b-gqa", "batch": 64, "ctx": 128, "ms_per_step": 3.0,
                          "steps": 320}]
    text = bb.table(rows, [1, 64], [128], w, QWEN3_4B_KV)
    lines = text.splitlines()
    at = lines.index("===== variants (interleaved with kern's rounds in the same process; median ms per step)")
    assert "qwen3-4b-gqa" in lines[at + 1]
    fl = bb.floor_ms(w, 64, 128, QWEN3_4B_KV)
    row = next(ln for ln in lines[at:] if ln.split()[:2] == ["64", "128"]).replace("|", " ").split()
    assert float(row[3]) == 4.0 and row[4] == f"{100 * fl / 4.0:.1f}%"
    assert float(row[5]) == 3.0 and row[6] == "0.750" and row[7] == f"{100 * fl / 3.0:.1f}%"
    row1 = next(ln for ln in lines[at:] if ln.split()[:2] == ["1", "128"]).replace("|", " ").split()
    assert row1[5:] == ["-"]  # the variant was not measured at one row
    assert "===== variants" not in bb.table(_results(), [1, 64], [128], w, QWEN3_4B_KV)


# ---------------------------------------------------------------- kern's rows over a fake runtime


class FakeDevice:
    """Device memory as bytearrays by base address, and the driver calls the batched bench makes."""

    CUresult = SimpleNamespace(CUDA_SUCCESS=0)

    def __init__(self) -> None:
        self.mem: dict[int, bytearray] = {}
        self.next = itertools.count(0x1000, 0x1000)
        self.clock = itertools.count()
        self.times: dict[int, float] = {}
        self.events = itertools.count(1)
        self.copies = 0

    def alloc(self, n: int) -> int:
        address = next(self.next)
        self.mem[address] = bytearray(n)
        return address

    def cuMemAlloc(self, n): return (0, self.alloc(n))
    def cuMemFree(self, a):
        del self.mem[a]
        return (0,)
    def cuMemcpyDtoDAsync(self, dst, src, n, stream):
        self.copies += 1
        self.mem[dst][:n] = self.mem[src][:n]
        return (0,)
    def cuEventCreate(self, flags): return (0, next(self.events))
    def cuEventDestroy(self, e): return (0,)
    def cuEventRecord(self, e, stream):
        self.times[e] = float(next(self.clock))
        return (0,)
    def cuEventSynchronize(self, e): return (0,)
    def cuEventElapsedTime(self, a, b): return (0, self.times[b] - self.times[a])
    def cuCtxSetCurrent(self, ctx): return (0,)
    def cuModuleLoadData(self, image): return (0, 0xA0)
    def cuModuleGetFunction(self, module, name): return (0, 0xF0)
    def cuLaunchKernel(self, f, *rest):
        self.spins = getattr(self, "spins", 0) + 1
        return (0,)


class BatchFakeRuntime:
    """Inputs live in FakeDevice memory; each decode step records the rows it saw, then advances positions,
    seq_lens, slot_mapping and token_ids on the "device", as kern_decode_advance does."""

    stream = "stream"
    page_tokens = 16
    scratch_page_id = 0

    def __init__(self, device: FakeDevice, manifest, pages: int = 64) -> None:
        from kern_manifest import var_max
        from kern_pool import Layout, Pool

        self.dev = device
        self.manifest = manifest
        self.pool = Pool(Layout.simple(16, pages=pages - 1))
        self.address = {name: device.alloc(b.nbytes_at(var_max(manifest.vars)))
                        for name, b in manifest.buffers.items() if b.kind == "input"}
        self.issued: list[tuple[str, dict, dict]] = []
        self.synced = 0

    def lease(self, num_tokens: int):
        return self.pool.lease(num_tokens)

    def address_of(self, name: str) -> int:
        return self.address[name]

    def _view(self, name: str, dtype=np.int32) -> np.ndarray:
        return np.frombuffer(self.dev.mem[self.address[name]], dtype=dtype)

    def write_input(self, name: str, array: np.ndarray) -> None:
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        self.dev.mem[self.address[name]][:raw.nbytes] = raw.tobytes()

    def issue(self, program: str, values: dict, eager: bool = False) -> None:
        b = values.get("seqs", 1)
        seen = {k: self._view(k)[:b].copy() for k in ("token_ids", "positions", "slot_mapping", "seq_lens")}
        seen["block_table"] = self._view("block_table").reshape(64, -1)[:b].copy()
        if "sample_params" in self.address:
            seen["sample_params"] = np.frombuffer(self.dev.mem[self.address["sample_params"]], np.uint32)[:b * 12].copy()
        self.issued.append((program, dict(values), seen))
        if program == "decode":  # the program advances its own inputs
            for k in ("positions", "slot_mapping", "seq_lens", "token_ids"):
                v = self._view(k).copy()
                v[:b] += 1
                self.write_input(k, v)

    def synchronize(self) -> None:
        self.synced += 1

    context = "context"
    OPS = ("norm", "qkv", "attention", "o_proj", "mlp")  # the fake decode program's launches, in order

    def run_hooked(self, program: str, values: dict, on_launch) -> None:  # eager: each launch after its hook
        for i, op in enumerate(self.OPS):
            on_launch(i, SimpleNamespace(op=op, launch=SimpleNamespace(entry=f"kern_{op}")))
        self.issue(program, values, eager=True)


@pytest.fixture
def fake_device(monkeypatch: pytest.MonkeyPatch) -> FakeDevice:
    dev = FakeDevice()
    monkeypatch.setattr(bench_decode, "_cu", lambda: dev)
    return dev


def test_kern_rows_time_the_same_step_every_replay(fake_device: FakeDevice, tmp_path: Path) -> None:
    manifest = _parsed(_batched_manifest(tmp_path))
    rt = BatchFakeRuntime(fake_device, manifest)
    facts = SimpleNamespace(manifest=manifest, pages_per_seq=manifest.buffers["block_table"].shape[-1].eval({}),
                            tokens_max=512)
    free0 = rt.pool.free_pages
    rows = bb.KernRows(rt, facts, [40, 40, 40])
    pages = rows.pages
    assert [len(p) for p in pages] == [3, 3, 3]  # 41 tokens: 3 pages of 16 each
    flat = [p for row in pages for p in row]
    assert len(set(flat)) == 9 and 0 not in flat  # distinct pages per row, never the scratch page
    rows.write([5, 6, 7])
    times = rows.time(6)
    assert times == [1.0] * 6  # one event record between each start and end
    decodes = [s for p, v, s in rt.issued if p == "decode"]
    assert len(decodes) == 6 and all(v == {"tokens": 3, "seqs": 3} for p, v, s in rt.issued)
    for seen in decodes:  # every replay saw the inputs as written, though each step advanced them
        assert seen["positions"].tolist() == [40, 40, 40] and seen["seq_lens"].tolist() == [41, 41, 41]
        assert seen["token_ids"].tolist() == [5, 6, 7]
        assert seen["slot_mapping"].tolist() == [r[40 // 16] * 16 + 40 % 16 for r in pages]
        assert seen["block_table"][:, :3].tolist() == pages and not seen["block_table"][:, 3:].any()
        assert seen["sample_params"].reshape(3, 12)[:, 2].tolist() == [0x3F800000] * 3  # greedy rows: top_p 1
    # restored before every replay: each written input but the block table (the five contract inputs, the
    # sampler's three); one snapshot copy each, then one copy each per replay
    assert sorted(a for a, _, _ in rows.snapshot.pairs) == sorted(
        rt.address[k] for k in ("token_ids", "positions", "slot_mapping", "seq_lens", "cu_seqlens_q", "sample_params",
                                "hist_tokens", "hist_counts"))
    assert fake_device.copies == 8 + 8 * 6
    snaps = [s for _, s, _ in rows.snapshot.pairs]
    rows.close()
    assert rows.leases == [] and not any(s in fake_device.mem for s in snaps)  # snapshots freed
    assert rt.pool.free_pages == free0 and rt.synced >= 1  # leases back; synchronised before freeing


def test_kern_rows_on_borrowed_leases_keep_them(fake_device: FakeDevice, tmp_path: Path) -> None:
    manifest = _parsed(_batched_manifest(tmp_path))
    rt = BatchFakeRuntime(fake_device, manifest)
    facts = SimpleNamespace(manifest=manifest, pages_per_seq=256, tokens_max=512)
    owner = bb.KernRows(rt, facts, [20, 30, 40])
    sub = bb.KernRows(rt, facts, [20, 30], leases=owner.leases[:2])
    assert sub.pages == owner.pages[:2] and sub.vars == {"tokens": 2, "seqs": 2}
    sub.write([1, 2])
    sub.issue()
    _, values, seen = rt.issued[-1]
    assert values == {"tokens": 2, "seqs": 2} and seen["positions"].tolist() == [20, 30]
    sub.close()
    assert all(not lease.closed for lease in owner.leases)
    owner.close()
    assert rt.pool.free_pages == rt.pool.leasable_pages


def test_kern_prefill_writes_one_sequence(fake_device: FakeDevice, tmp_path: Path) -> None:
    manifest = _parsed(_batched_manifest(tmp_path))
    rt = BatchFakeRuntime(fake_device, manifest)
    facts = SimpleNamespace(manifest=manifest, pages_per_seq=256, tokens_max=512)
    bb.kern_prefill(rt, facts, [7, 9, 11], list(range(100, 140)), chunk=16)
    prefills = [(v, s) for p, v, s in rt.issued if p == "prefill"]
    assert [v for v, _ in prefills] == [{"tokens": 16, "seqs": 1}, {"tokens": 16, "seqs": 1}, {"tokens": 8, "seqs": 1}]
    # the last chunk: positions 32..39 on page 11 (third page)
    assert rt._view("positions")[:8].tolist() == list(range(32, 40))
    assert rt._view("slot_mapping")[:8].tolist() == [11 * 16 + p % 16 for p in range(32, 40)]
    assert rt._view("seq_lens")[0] == 40 and rt._view("cu_seqlens_q")[:2].tolist() == [0, 8]
    assert rt._view("block_table")[:4].tolist() == [7, 9, 11, 0]


# ---------------------------------------------------------------- orchestration


def test_bad_batch_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--batch", "65"], ["--batch", "0"], ["--batch=x"]):
        with pytest.raises(SystemExit) as info:
            bench_decode.main(argv)  # bench/decode.py hands --batch to bench/decode_batch.py
        assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--batch 65 is outside [1, 64]" in err and "--batch 0 is outside [1, 64]" in err
    assert "--batch 'x' is not an integer" in err
    with pytest.raises(SystemExit):
        bb.main(["--batch", "1", "--only", "kern,vllm"])
    assert "--only 'kern,vllm': a comma list of kern, torch" in capsys.readouterr().err


def test_batch_beyond_the_manifest_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        bench_decode.main(["--batch", "1,8", "--manifest", str(ROOT / "manifests" / "qwen3-4b.json")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--batch 8: manifest" in err and "takes at most 1 row(s) per decode step" in err


def _ckpt(tmp_path: Path) -> Path:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 36,
                                                  "vocab_size": 151936}))
    return ckpt


@pytest.mark.parametrize("check_ok", [True, False, None])
def test_main_runs_one_worker_and_prints_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str], check_ok: bool | None) -> None:
    """One worker (bench/decode_batch.py --worker batch) with every flag passed on; its records make the table,
    the JSON has the floors; a failed or missing check makes the exit status 1."""
    manifest = _batched_manifest(tmp_path)
    ckpt = _ckpt(tmp_path)
    seen: list[list[str]] = []

    def fake_worker(argv, timeout, out, script=None):
        seen.append(list(argv))
        assert script is not None and script.name == "decode_batch.py" and timeout == 300
        rows = [r for r in _results() if r.get("side") != "check"]
        if check_ok is not None:
            rows.append({"side": "check", "batch": 8, "ok": check_ok,
                         "kern": {"ok": check_ok, "max_rel": 0.9, "top1": 0.2,
                                  "failures": [] if check_ok else ["max relative logit error 0.9 > 0.25"]}})
        return rows, "ok"

    monkeypatch.setattr(bench_decode, "_run_worker", fake_worker)
    monkeypatch.setattr(bench_decode, "checkpoint_bytes", lambda path: 8_050_000_000)
    out_json = tmp_path / "o.json"
    code = bench_decode.main(["--batch", "1,8,32,64", "--context", "128,2048", "--manifest", str(manifest),
                              "--weights", str(ckpt), "--budget", "300", "--json", str(out_json)])
    text = capsys.readouterr().out
    (argv,) = seen
    assert argv[:2] == ["--worker", "batch"]
    flags = dict(zip(argv[2::2], argv[3::2]))
    assert flags["--batch"] == "1,8,32,64" and flags["--contexts"] == "128,2048" and flags["--ckpt"] == str(ckpt)
    assert flags["--manifest"] == str(manifest) and flags["--compile-mode"] == "default"
    assert argv[-1] == "--check"
    summary = json.loads(out_json.read_text())
    assert summary["kv_bytes_per_token"] == QWEN3_4B_KV
    assert summary["floors_ms"]["32,2048"] == pytest.approx(bb.floor_ms(8_050_000_000, 32, 2048, QWEN3_4B_KV))
    assert "bs=8 / bs=1 step at ctx 128, kern: 1.040x" in text
    if check_ok:
        assert code == 0 and "check bs=8: ok" in text
    elif check_ok is False:
        assert code == 1 and "check bs=8: CHECK FAILED" in text and "note: CHECK FAILED at batch [8]" in text
    else:
        assert code == 1 and "note: check: no verdict" in text


def test_main_without_check_or_measurement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = _ckpt(tmp_path)
    monkeypatch.setattr(bench_decode, "checkpoint_bytes", lambda path: 8_050_000_000)
    monkeypatch.setattr(bench_decode, "_run_worker", lambda argv, timeout, out, script=None: (
        [], "exit 1: NoDeviceError: no CUDA device"))
    argv = ["--batch", "1", "--manifest", str(ROOT / "manifests" / "qwen3-4b-v2.json"), "--ckpt", str(ckpt),
            "--no-check", "--json", str(tmp_path / "o.json")]
    assert bb.main(argv) == 1
    captured = capsys.readouterr()
    assert "note: worker: exit 1: NoDeviceError" in captured.out
    assert captured.err == "bench/decode.py --batch: no peer produced a measurement (see the notes above)\n"
    monkeypatch.setattr(bench_decode, "_run_worker", lambda argv, timeout, out, script=None: (
        [_rec("kern", 1, 128, 2.5)], "ok"))
    assert bb.main(argv) == 0


def test_worker_kern_only_over_a_fake_runtime(fake_device: FakeDevice, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's kern loop: one runtime for the largest batch, per (ctx, batch) its rows at that context,
    `rounds` x `steps` timed replays, one record each; every lease returned in the end."""
    import kern_runtime

    manifest_path = _batched_manifest(tmp_path)
    loaded: list = []

    def fake_load(cls, manifest, kernels, tensors, gpu=0, capacity=None, **kw):
        rt = BatchFakeRuntime(fake_device, manifest, pages=capacity.tokens // 16 + 1)
        rt.capacity = capacity
        rt.closed = False
        rt.close = lambda: setattr(rt, "closed", True)
        loaded.append(rt)
        return rt

    for name, value in (("cuInit", lambda f: (0,)), ("cuDeviceGet", lambda i: (0, i)),
                        ("cuDevicePrimaryCtxRetain", lambda d: (0, "ctx")), ("cuCtxSetCurrent", lambda c: (0,)),
                        ("cuMemGetInfo", lambda: (0, 100 << 30, 140 << 30))):
        setattr(fake_device, name, value)
    monkeypatch.setattr(kern_runtime.Runtime, "load", classmethod(fake_load))
    monkeypatch.setattr(kern_runtime.SafetensorsTensors, "open", staticmethod(lambda path: "tensors"))
    ckpt = _ckpt(tmp_path)
    _, args = bb.parse_args(["--worker", "batch", "--batch", "1,3", "--contexts", "20,40", "--manifest",
                             str(manifest_path), "--ckpt", str(ckpt), "--only", "kern", "--no-check", "--steps", "3",
                             "--rounds", "2"])
    out = tmp_path / "w.jsonl"
    bb.worker(args, str(out))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    setup = records[0]
    assert setup["side"] == "setup" and setup["seqs_max"] == 64
    assert setup["sampling"] == ["hist_counts", "hist_tokens", "sample_params"]
    (rt,) = loaded
    assert rt.capacity.seqs == 3 and rt.capacity.tokens >= 3 * 48  # 3 rows of 41 tokens: 3 pages each
    steps = [(r["ctx"], r["batch"], r["steps"], r["ms_per_step"]) for r in records[1:]]
    assert steps == [(20, 1, 6, 1.0), (20, 3, 6, 1.0), (40, 1, 6, 1.0), (40, 3, 6, 1.0)]
    decodes = [(v["seqs"], s["positions"].tolist()) for p, v, s in rt.issued if p == "decode"]
    # per config: 4 warm-up replays, then 2 rounds of 3, all at the config's context
    assert decodes == [(1, [20])] * 10 + [(3, [20] * 3)] * 10 + [(1, [40])] * 10 + [(3, [40] * 3)] * 10
    assert rt.pool.free_pages == rt.pool.leasable_pages and rt.closed

    # --variants: a second runtime of its own, timed in the same rounds, one "variant" record per (ctx, batch)
    loaded.clear()
    variant = tmp_path / "alt.json"
    variant.write_text(manifest_path.read_text())
    _, args = bb.parse_args(["--worker", "batch", "--batch", "2", "--contexts", "20", "--manifest", str(manifest_path),
                             "--ckpt", str(ckpt), "--only", "kern", "--no-check", "--steps", "3", "--rounds", "2",
                             "--variants", str(variant)])
    out = tmp_path / "v.jsonl"
    bb.worker(args, str(out))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["side"], r.get("tag"), r.get("steps")) for r in records[1:]] == [("variant", "alt", 6), ("kern", None, 6)]
    main_rt, alt_rt = loaded
    for one in (main_rt, alt_rt):
        assert [(v["seqs"], s["positions"].tolist()) for p, v, s in one.issued if p == "decode"] == [(2, [20, 20])] * 10
        assert one.pool.free_pages == one.pool.leasable_pages and one.closed


def test_kern_rows_breakdown_times_each_launch_of_the_same_step(fake_device: FakeDevice, tmp_path: Path) -> None:
    manifest = _parsed(_batched_manifest(tmp_path))
    rt = BatchFakeRuntime(fake_device, manifest)
    facts = SimpleNamespace(manifest=manifest, pages_per_seq=manifest.buffers["block_table"].shape[-1].eval({}),
                            tokens_max=512)
    rows = bb.KernRows(rt, facts, [40, 40])
    rows.write([5, 6])
    launches = rows.breakdown(3)
    # one event pair per launch, each stop recorded when the next launch is hooked (the fake clock ticks once a
    # record): 1 ms, so 1000 us for every launch
    assert [(r["index"], r["op"], r["what"], r["us"]) for r in launches] == [
        (i, op, f"kern_{op}", 1000.0) for i, op in enumerate(BatchFakeRuntime.OPS)]
    decodes = [(v, seen) for p, v, seen in rt.issued if p == "decode"]
    assert len(decodes) == 3 and all(v == {"tokens": 2, "seqs": 2} for v, _ in decodes)
    assert all(seen["positions"].tolist() == [40, 40] for _, seen in decodes)  # restored before every replay
    assert fake_device.spins == 3  # the stream held once a replay (5 launches < one hold's 24)
    summary = bench_decode._summarise_breakdown(launches)
    assert sum(r["share"] for r in summary) == pytest.approx(1.0) and len(summary) == 5
    lines = bb.table([{"side": "breakdown", "batch": 2, "ctx": 40, "summary": summary, "sum_us": 5000.0}], [2], [40],
                     8_000_000_000, QWEN3_4B_KV)
    assert "-- per-launch breakdown, batch 2, ctx 40 (eager, events between launches; sum 5.000 ms):" in lines
    rows.close()
