"""`batch_proj` "rows" in the Qwen3 builder (kern_run.models.qwen3.rows_m, batch_proj.batched; docs/kernels-gemv.md
"Multi-row rows entries"): with `--gemv v2 --seqs-max N` the qkv / gate_up / o / down ops keep their M = 1 rows
launch at seqs 1, and lm_head its v1 kern_gemv_rmsnorm launch, run the `_m2` / `_m4` / `_m8` entry at seqs 2 / 3..4
/ 5..8 (same block, the M = 1 args then m = seqs, shared memory M x 16 x ceil(k / 8)) and cuBLASLt at 9..N."""

from __future__ import annotations

import json

import pytest

from kern_run.errors import ManifestBuildError
from kern_run.models import qwen3 as gq
from kern_run.models.qwen3 import rows_m
from kern_run_testutil import ROOT
from tools import make_checkpoint as mc

STUB = gq.KernelAbi.from_json(gq.stub_kernels_json())
SEQS = {"expr": "seqs", "type": "i32"}
# Qwen3-4B: op -> (entry stem, M = 1 block, k, groups)
EXPECTED_4B = {
    "gemv_qkv": ("kern_gemv_rows_rmsnorm", 160, 2560, 6144 // 4),
    "gemv_gate_up_act": ("kern_gemv_rmsnorm_swiglu", 160, 2560, 9728 // 2),
    "gemv_o": ("kern_gemv_rows_residual", 256, 4096, 2560 // 4),
    "gemv_down_act": ("kern_gemv_rows_residual", 320, 9728, 2560 // 4),
}
# blocks per SM: min(threads per SM at the entry's registers // block, 228 KiB // (dynamic + static + 1 KiB)),
# worked by hand from the static shared memory cuobjdump reports (m2 3392 / 3136, m4 5504 / 5248, m8 9728 / 9472)
BLOCKS_PER_SM_4B = {
    ("gemv_qkv", 2): 5, ("gemv_qkv", 4): 3, ("gemv_qkv", 8): 3,  # m8: 40 KiB + 9.5 -> 4 by smem, 3 by threads
    ("gemv_gate_up_act", 2): 5, ("gemv_gate_up_act", 4): 3, ("gemv_gate_up_act", 8): 3,
    ("gemv_o", 2): 3, ("gemv_o", 4): 2, ("gemv_o", 8): 2,  # m8: 64 KiB + 9.25 -> 3 by smem, 2 by threads
    ("gemv_down_act", 2): 2, ("gemv_down_act", 4): 1, ("gemv_down_act", 8): 1,  # m4: 76 + 5.1 KiB -> 2 by smem
    # kern_gemv_rmsnorm_mM: 86 registers -> one block of 512 per SM (smem: m8 40 KiB + 1.25 -> 5)
    ("gemv_lm_head", 2): 1, ("gemv_lm_head", 4): 1, ("gemv_lm_head", 8): 1,
}
# lm_head (Qwen3-4B): the v1 entry, a warp per W row, so its "groups" are the vocab's rows
EXPECTED_4B_ALL = {**EXPECTED_4B, "gemv_lm_head": ("kern_gemv_rmsnorm", 512, 2560, 151936)}
ALL_STEMS = (*rows_m.ROWS_ENTRY.items(), ("rmsnorm", rows_m.V1_ENTRY))


def _manifest(shape: str = "qwen3-4b", **opts: object) -> dict:
    cfg = gq.Qwen3Config.from_json(mc.config_json(mc.SHAPES[shape]))
    return gq.build_manifest(cfg, STUB, gq.BuildOptions(shape, **opts))


def test_seqs_max_64_rows_launches_after_the_bs1_launch_then_cublaslt() -> None:
    km = pytest.importorskip("kern_manifest")
    m = _manifest(gemv="v2", seqs_max=64, batch_proj="rows")
    km.verify(km.parse_manifest(gq.dumps(m)))
    bs1 = _manifest(gemv="v2")["ops"]
    cublas = _manifest(gemv="v2", seqs_max=64)["ops"]
    sms = gq.BuildOptions("qwen3-4b").sms
    for op, (stem, block, k, groups) in EXPECTED_4B_ALL.items():
        first, m2, m4, m8, *rest = m["ops"][op]["launches"]
        assert first == {**bs1[op]["launches"][0], "when": {"seqs": [1, 1]}}, op
        assert first["block"] == [block, 1, 1]
        for launch, tile, when in ((m2, 2, [2, 2]), (m4, 4, [3, 4]), (m8, 8, [5, 8])):
            assert launch["entry"] == f"{stem}_m{tile}" and launch["when"] == {"seqs": when}, (op, tile)
            assert launch["args"] == first["args"] + [SEQS], (op, tile)
            assert launch["block"] == first["block"] and launch["module"] == "gemv" and launch["pdl"] is True
            assert launch["shared_mem"] == tile * 16 * (k // 8), (op, tile)
            assert launch["grid"] == [min(groups, BLOCKS_PER_SM_4B[op, tile] * sms), 1, 1], (op, tile)
        # seqs 9..64: cuBLASLt exactly as batch_proj "cublaslt" builds it, with the box [9, 64]
        want = [{**l, "when": {"seqs": [9, 64]}} for l in cublas[op]["launches"][1:]]
        assert rest == want, op
        assert m["ops"][op].get("scratch") == cublas[op].get("scratch"), op
    assert m["ops"]["gemv_lm_head"]["launches"][1]["grid"] == [sms, 1, 1]  # 151936 rows: one block per SM


@pytest.mark.parametrize(("seqs_max", "boxes"), [
    (2, [[2, 2]]), (3, [[2, 2], [3, 3]]), (4, [[2, 2], [3, 4]]), (6, [[2, 2], [3, 4], [5, 6]]),
    (8, [[2, 2], [3, 4], [5, 8]]), (9, [[2, 2], [3, 4], [5, 8], [9, 9]]),
])
def test_the_rows_launches_stop_at_seqs_max(seqs_max: int, boxes: list[list[int]]) -> None:
    km = pytest.importorskip("kern_manifest")
    m = _manifest("tiny", gemv="v2", seqs_max=seqs_max, batch_proj="rows")
    km.verify(km.parse_manifest(gq.dumps(m)))
    for op in EXPECTED_4B_ALL:
        launches = m["ops"][op]["launches"]
        got = []
        for launch in launches[1:]:
            if not got or launch["when"]["seqs"] != got[-1]:  # a launch with the box before it continues it
                got.append(launch["when"]["seqs"])
        assert got == boxes, op
        assert all(l["entry"].endswith(f"_m{t}") for l, t in zip(launches[1:4], (2, 4, 8)) if "entry" in l)
        assert ("scratch" in m["ops"][op]) == (seqs_max >= 9 and op != "gemv_o" and op != "gemv_down_act"), op


def test_rows_buckets() -> None:
    assert rows_m.rows_buckets(2, 8) == [(2, 2, 2), (3, 4, 4), (5, 8, 8)]
    assert rows_m.rows_buckets(2, 5) == [(2, 2, 2), (3, 4, 4), (5, 5, 8)]
    assert rows_m.rows_buckets(2, 3) == [(2, 2, 2), (3, 3, 4)]
    assert rows_m.rows_buckets(2, 2) == [(2, 2, 2)]


def test_static_smem_matches_the_built_cubin() -> None:
    """rows_m.static_smem + the reserved 1 KiB is what cuobjdump reported into kernels/kernels.json."""
    entries = json.loads((ROOT / "kernels" / "kernels.json").read_text())["modules"]["gemv"]["entries"]
    for kind, stem in ALL_STEMS:
        for tile in rows_m.ROWS_TILES:
            got = entries[f"{stem}_m{tile}"]["shared"]
            want = rows_m.static_smem(kind, tile, stem == rows_m.V1_ENTRY) + rows_m.SMEM_RESERVED
            assert got == want, (stem, tile)
    assert rows_m.static_smem("rmsnorm", 8, v1=True) + rows_m.SMEM_RESERVED == 1280  # cuobjdump: kern_gemv_rmsnorm_m8


def test_the_register_counts_give_the_threads_per_sm_the_grid_assumes() -> None:
    entries = json.loads((ROOT / "kernels" / "kernels.json").read_text())["modules"]["gemv"]["entries"]
    for _, stem in ALL_STEMS:
        threads = rows_m.THREADS_PER_SM_V1_M if stem == rows_m.V1_ENTRY else rows_m.THREADS_PER_SM_M
        for tile in rows_m.ROWS_TILES:
            info = entries[f"{stem}_m{tile}"]
            regs = -(-info["registers"] // 8) * 8  # allocation unit: 8 per thread (256 per warp)
            assert info["local"] == 0, (stem, tile, info["local"])  # no spills
            assert 65536 // (regs * 32) * 32 >= threads[tile], (stem, tile, info["registers"])


def test_an_unknown_batch_proj_is_refused() -> None:
    with pytest.raises(ManifestBuildError, match=r"batch_proj \(--batch-proj\) 'row'.*'rows'"):
        _manifest("tiny", gemv="v2", seqs_max=8, batch_proj="row")


@pytest.mark.parametrize("seqs_max", [8, 64])
def test_the_built_manifest_verifies_and_compiles(seqs_max: int) -> None:
    """Against the committed kernels.json: verify, load, compile the programs, patch at seqs 1, 2, 5, 8, 9, 64
    (those <= seqs_max); the decode program's active projection launches are the M = 1 rows entry at 1, _m2 at
    2, _m8 at 5 and 8, cuBLASLt from 9."""
    from kern_manifest import parse_manifest, verify
    from kern_runtime import load_spec
    from kern_runtime.program import records

    m = gq.build_manifest(gq.Qwen3Config.from_name("qwen3-4b"), gq.read_kernel_abi(ROOT / "kernels"),
                          gq.BuildOptions("qwen3-4b", max_context=4096, gemv="v2", seqs_max=seqs_max,
                                          batch_proj="rows"))
    verify(parse_manifest(gq.dumps(m)))
    spec = load_spec(json.loads(gq.dumps(m)))
    targets = {name: 0x10000 * (i + 1) for i, name in enumerate([*spec.buffers, *spec.states])}
    scratch = {(op.name, s): 0x7000_0000 + 0x1000 * i for i, op in enumerate(spec.ops.values()) for s in op.scratch}
    pages = {name: 1000 + i for i, (name, st) in enumerate(spec.states.items()) if st.kind == "paged"}
    book = records.AddressBook(targets, scratch, pages=pages)
    recs, _ = records.compile_program(spec, "decode", book, lambda op, li: None)
    want = {1: "kern_gemv_rows_rmsnorm", 2: "kern_gemv_rows_rmsnorm_m2", 5: "kern_gemv_rows_rmsnorm_m8",
            8: "kern_gemv_rows_rmsnorm_m8", 9: "cublaslt_bf16_tn", 64: "cublaslt_bf16_tn"}
    for value, entry in want.items():
        if value > seqs_max:
            continue
        for rec in recs:
            rec.patch({"tokens": value, "seqs": value})
        qkv = [r for r in recs if r.active and "gemv_qkv" in str(r.path)]
        names = [getattr(r.launch, "entry", None) or getattr(r.launch, "extern", None) for r in qkv]
        layers = gq.Qwen3Config.from_name("qwen3-4b").layers
        assert len(names) == layers * (1 if value <= 8 else 2), (value, len(names))
        assert set(names) == ({entry} if value <= 8 else {"kern_add_rmsnorm", entry}), (value, set(names))
        if entry.startswith("kern_gemv"):
            rec = next(r for r in qkv if getattr(r.launch, "entry", None) == entry)
            tile = {1: 1, 2: 2, 5: 8, 8: 8}[value]
            assert rec.shared_mem_bytes == tile * 16 * 320, value
        head = [r for r in recs if r.active and "gemv_lm_head" in str(r.path)]
        names = [getattr(r.launch, "entry", None) or getattr(r.launch, "extern", None) for r in head]
        want_head = ({1: ["kern_gemv_rmsnorm"], 2: ["kern_gemv_rmsnorm_m2"], 5: ["kern_gemv_rmsnorm_m8"],
                      8: ["kern_gemv_rmsnorm_m8"]}.get(value) or ["kern_add_rmsnorm", "cublaslt_bf16_tn"])
        assert names == want_head, (value, names)


def test_every_rows_m_entry_waits_before_any_exit() -> None:
    """PDL: every _mM entry of the committed gemv cubin has griddepcontrol.wait (ACQBULK) and no EXIT its
    control-flow graph reaches without passing one (tools/sass_paths.py), as the M = 1 entries."""
    from tools import sass_paths
    from kern_runtime.cuda.sass import find_cuobjdump

    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump: cannot read the SASS")
    module = json.loads((ROOT / "kernels" / "kernels.json").read_text())["modules"]["gemv"]
    try:
        sass = sass_paths.cubin_functions(ROOT / "kernels" / module["file"], tool)
    except sass_paths.SassPathError as exc:
        pytest.skip(f"cuobjdump -sass failed (nvdisasm missing?): {str(exc)[:200]}")
    entries = [f"{stem}_m{t}" for _, stem in ALL_STEMS for t in rows_m.ROWS_TILES]
    assert set(entries) <= gq.PDL_ENTRIES and set(entries) <= set(module["entries"])
    for entry in entries:
        body = sass[entry]
        assert any(i.op.startswith("ACQBULK") for i in body), f"{entry}: no ACQBULK"
        assert sass_paths.unwaited_exits(body) == [], f"{entry}: an EXIT reachable without the wait"
