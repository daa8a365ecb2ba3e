"""The persistent decode manifest (kern_run.models.qwen3.persistent.manifest) against the committed kernels.json: it
verifies, its decode program is embed -> one cooperative launch -> decode_advance, the table it materialises is the
schedule's, the pack parameters hold what the kernel's structs expect, and bad inputs are refused by name."""

from __future__ import annotations

import base64
import dataclasses
import json
import struct
from pathlib import Path

import pytest

from kern_manifest import parse_manifest, verify
from kern_run.errors import ManifestBuildError
from kern_run.models.qwen3.abi import KernelAbi, read_kernel_abi
from kern_run.models.qwen3.config import Qwen3Config
from kern_run.models.qwen3.options import BuildOptions
from kern_run.models.qwen3.persistent.isa import (FLAG_EVICT_FIRST, FLAG_FENCES, FLAG_L2_PREFETCH, FLAG_TABLE_AHEAD,
                                                   NO_COUNTER, Op, unpack)
from kern_run.models.qwen3.persistent.manifest import (
    LAYER_FIELDS,
    LAYER_SLOTS,
    MAX_SHARED_BYTES,
    PARAM_SIZES,
    POINTERS,
    RING_STEP_BYTES,
    build_persistent_manifest,
    ring_stages,
    scratch_bytes,
    shared_bytes,
)

ROOT = Path(__file__).parents[2]
CONFIGS = ROOT / "tests" / "data" / "configs"


def config(name: str) -> Qwen3Config:
    return Qwen3Config.from_json(json.loads((CONFIGS / f"{name}.json").read_text()))


@pytest.fixture(scope="module")
def abi() -> KernelAbi:
    return read_kernel_abi(ROOT / "kernels")


@pytest.fixture(scope="module", params=["Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B"])
def built(request: pytest.FixtureRequest, abi: KernelAbi):
    cfg = config(request.param)
    m, sched = build_persistent_manifest(cfg, abi, BuildOptions(name=f"{request.param.lower()}-persistent"))
    return cfg, m, sched


def test_it_verifies_and_the_decode_program_is_one_cooperative_launch(built) -> None:
    cfg, m, _ = built
    manifest = parse_manifest(json.dumps(m))
    verify(manifest)
    assert [c["op"] for c in m["programs"]["decode"]["calls"]] == ["embed", "persistent_decode", "decode_advance"]
    launch = manifest.ops["persistent_decode"].launches[0]
    assert launch.cooperative and launch.entry == "kern_persistent_decode"
    assert [e.eval({}) for e in launch.grid] == [132, 1, 1] and [e.eval({}) for e in launch.block] == [256, 1, 1]
    assert launch.shared_mem.eval({}) == shared_bytes(cfg) <= 227 * 1024
    # the default 4-stage ring (4 x 16 KiB) after the scratch, at 1.7B / 4B / 8B
    assert shared_bytes(cfg) == scratch_bytes(cfg) + 4 * 16384 and m["meta"]["persistent"]["ring_stages"] == 4
    assert not m["meta"]["persistent"]["l2_prefetch"] and not m["meta"]["persistent"]["fences"]
    assert m["meta"]["persistent"]["evict_first"] and not m["meta"]["persistent"]["table_ahead"]
    assert tuple(size for _, size in launch.params) == PARAM_SIZES
    assert m["modules"]["persistent_decode"] == json.loads((ROOT / "kernels" / "kernels.json").read_text())[
        "modules"]["persistent_decode"]["sha256"]
    assert "gemv" not in m["modules"]  # the replaced decode ops and their module are gone
    assert m["programs"]["prefill"]["calls"][0]["op"] == "embed"  # prefill is the base manifest's


def test_the_materialised_table_is_the_schedules(built) -> None:
    _, m, sched = built
    table = m["buffers"]["persist_table"]
    data = base64.b64decode(table["init"]["base64"])
    assert len(data) == 4 * table["shape"][0]
    assert unpack(data) == sched.table
    counters = m["buffers"]["persist_counters"]
    assert counters["zero_each_run"] and counters["shape"] == [sched.table.num_counters]
    error = m["buffers"]["persist_error"]
    assert error["placement"] == "host" and set(error["error"]["codes"]) == {"1", "2", "3", "4", "5"}
    assert m["meta"]["persistent"]["instructions"] == len(sched.table.instrs)


def test_the_packs_fill_the_kernels_structs(built) -> None:
    cfg, m, sched = built
    args = m["ops"]["persistent_decode"]["launches"][0]["args"]
    assert [a["arg"] for a in args[:len(POINTERS)]] == list(POINTERS)
    shape = {f["offset"]: f for f in args[len(POINTERS)]["pack"]["fields"]}
    ints = [shape[4 * i]["i32"] for i in range(10)]
    assert ints == [cfg.hidden, cfg.q_heads, cfg.kv_heads, cfg.head_dim, cfg.intermediate, cfg.vocab, cfg.layers,
                    16, 40960, sched.splits]
    assert shape[40]["f32"] == cfg.eps and shape[44]["f32"] == pytest.approx(cfg.head_dim ** -0.5)
    assert struct.unpack("<f", struct.pack("<f", shape[44]["f32"]))[0] == pytest.approx(1 / 128 ** 0.5)
    assert args[len(POINTERS) + 1] == {"arg": "num_pages", "type": "i32"}
    layers = args[-1]["pack"]
    assert layers["size"] == 8192
    fields = {f["offset"]: f["arg"] for f in layers["fields"]}
    for layer in (0, cfg.layers - 1):
        for slot, name in enumerate(LAYER_FIELDS):
            assert fields[(layer * LAYER_SLOTS + slot) * 8] == f"{name}.{layer}"
    assert len(fields) == cfg.layers * len(LAYER_FIELDS)
    call = m["programs"]["decode"]["calls"][1]["args"]
    assert call["lm_head"] == ("embed" if cfg.tied else "lm_head") and call["num_pages"] == {"pages_of": "kv.0"}
    assert call["kv.3"] == "kv.3" and call["table"] == "persist_table"


def test_a_model_the_kernel_does_not_cover_is_refused(abi: KernelAbi) -> None:
    cfg = config("Qwen3-1.7B")
    opts = BuildOptions(name="x")
    for bad, words in ((dataclasses.replace(cfg, layers=65), "at most 64"),
                       (dataclasses.replace(cfg, head_dim=512), "head_dim 512"),
                       (dataclasses.replace(cfg, q_heads=80, kv_heads=8), "1..8 q heads per kv head")):
        with pytest.raises(ManifestBuildError, match=words):
            build_persistent_manifest(bad, abi, opts)
    with pytest.raises(ManifestBuildError, match="num_queues 0"):
        build_persistent_manifest(cfg, abi, opts, num_queues=0)
    with pytest.raises(ManifestBuildError, match="timeout_ns 0"):
        build_persistent_manifest(cfg, abi, opts, timeout_ns=0)


def test_kernels_json_without_the_entry_or_with_another_abi_is_refused(abi: KernelAbi) -> None:
    cfg = config("Qwen3-1.7B")
    entries = {e: v for e, v in abi.entries.items() if e != "kern_persistent_decode"}
    with pytest.raises(ManifestBuildError, match="has no entry 'kern_persistent_decode'"):
        build_persistent_manifest(cfg, dataclasses.replace(abi, entries=entries), BuildOptions(name="x"))
    module, params = abi.entries["kern_persistent_decode"]
    other = {**abi.entries, "kern_persistent_decode": (module, params[:-1])}
    with pytest.raises(ManifestBuildError, match="expects"):
        build_persistent_manifest(cfg, dataclasses.replace(abi, entries=other), BuildOptions(name="x"))


def test_the_build_is_deterministic(abi: KernelAbi) -> None:
    cfg = config("Qwen3-1.7B")
    a, _ = build_persistent_manifest(cfg, abi, BuildOptions(name="x"), num_queues=16)
    b, _ = build_persistent_manifest(cfg, abi, BuildOptions(name="x"), num_queues=16)
    assert a == b and a["digest"] == b["digest"]
    assert a["ops"]["persistent_decode"]["launches"][0]["grid"] == [16, 1, 1]


def test_the_gen_persistent_tool_writes_a_manifest_that_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kern_manifest import load_manifest
    from tools import gen_persistent

    out = tmp_path / "p.json"
    assert gen_persistent.main(["--config", str(CONFIGS / "Qwen3-1.7B.json"), "--out", str(out), "--sms", "8"]) == 0
    m = load_manifest(out)
    assert m.name == "qwen3-1.7b-persistent" and m.meta["persistent"]["num_queues"] == 8
    assert "8 queues" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    assert gen_persistent.main(["--config", str(tmp_path / "bad.json"), "--out", str(tmp_path / "x.json")]) == 2
    assert capsys.readouterr().err.startswith("gen_persistent: ") and not (tmp_path / "x.json").exists()


def test_the_ring_takes_what_fits_and_refuses_what_does_not(abi: KernelAbi) -> None:
    cfg = config("Qwen3-4B")
    # 4B: x f32[9728] + 64 + 9 x 256 floats = 48,384 bytes of scratch (16-byte aligned), 16 KiB a ring step
    assert scratch_bytes(cfg) == 48384 and RING_STEP_BYTES == 16384
    assert ring_stages(cfg) == 4 and ring_stages(cfg, 8) == 8 and shared_bytes(cfg, 3) == 48384 + 3 * 16384
    for bad in (1, 9):
        with pytest.raises(ManifestBuildError, match=f"ring stages {bad}: the kernel takes 2..8"):
            ring_stages(cfg, bad)
    # an intermediate size whose x leaves room for 2 steps only: that many by default, 3 refused by name
    wide = dataclasses.replace(cfg, intermediate=(MAX_SHARED_BYTES - 2 * 16384 - 4 * (64 + 9 * 256)) // 4)
    assert ring_stages(wide) == 2
    with pytest.raises(ManifestBuildError, match=r"3-stage weight ring .* \(at most 2 stages fit\)"):
        ring_stages(wide, 3)
    wider = dataclasses.replace(cfg, intermediate=wide.intermediate + 8)
    with pytest.raises(ManifestBuildError, match="at most 1 stages fit"):
        build_persistent_manifest(wider, abi, BuildOptions(name="x"), num_queues=8)
    m, _ = build_persistent_manifest(cfg, abi, BuildOptions(name="x"), num_queues=8, stages=4)
    assert m["ops"]["persistent_decode"]["launches"][0]["shared_mem"] == 48384 + 4 * 16384
    assert m["meta"]["persistent"]["ring_stages"] == 4


def test_the_flags_and_the_ablations_are_table_data(abi: KernelAbi) -> None:
    cfg = config("Qwen3-1.7B")
    base, sched = build_persistent_manifest(cfg, abi, BuildOptions(name="x"), num_queues=16, l2_prefetch=True,
                                            fences=True)
    off, sched_off = build_persistent_manifest(cfg, abi, BuildOptions(name="x"), num_queues=16,
                                               ablate=frozenset({Op.ROPE, Op.O_PROJ}))
    table = unpack(base64.b64decode(base["buffers"]["persist_table"]["init"]["base64"]))
    table_off = unpack(base64.b64decode(off["buffers"]["persist_table"]["init"]["base64"]))
    assert table.flags == FLAG_L2_PREFETCH | FLAG_FENCES | FLAG_EVICT_FIRST and table_off.flags == FLAG_EVICT_FIRST
    hinted, _ = build_persistent_manifest(cfg, abi, BuildOptions(name="x"), num_queues=16, table_ahead=True)
    plain, _ = build_persistent_manifest(cfg, abi, BuildOptions(name="x"), num_queues=16, evict_first=False)
    assert unpack(base64.b64decode(hinted["buffers"]["persist_table"]["init"]["base64"])).flags == \
        FLAG_EVICT_FIRST | FLAG_TABLE_AHEAD  # evict-first by default
    assert unpack(base64.b64decode(plain["buffers"]["persist_table"]["init"]["base64"])).flags == 0
    assert hinted["meta"]["persistent"]["evict_first"] and hinted["meta"]["persistent"]["table_ahead"]
    assert not plain["meta"]["persistent"]["evict_first"] and not base["meta"]["persistent"]["table_ahead"]
    assert table_off == sched_off.table and off["meta"]["persistent"]["ablated"] == ["O_PROJ", "ROPE"]
    assert "ablated" not in base["meta"]["persistent"] and off["digest"] != base["digest"]
    # every ROPE and O_PROJ is a NOP with its wait and signal kept; every other instruction is unchanged
    ops = [i.op for i in table.instrs]
    assert ops.count(Op.ROPE) == cfg.layers * cfg.kv_heads and Op.NOP not in ops
    for a, b in zip(table.instrs, table_off.instrs):
        if a.op in (Op.ROPE, Op.O_PROJ):
            assert b == dataclasses.replace(a, op=Op.NOP)
        else:
            assert b == a
    assert table_off.queues == table.queues
    assert base["meta"]["persistent"]["attn"] == "split"


def test_the_fused_attention_is_table_data_at_any_counter_stride(abi: KernelAbi) -> None:
    """attn="fused": the table holds ATTN and none of the three split classes (the default holds those three and no
    ATTN). Counters respaced by a stride keep the tickets clear of every other counter: ticket signal x stride + 1 +
    g lies below the next used counter, (signal + 1 + kv_heads) x stride, at every stride."""
    cfg = config("Qwen3-1.7B")
    _, default = build_persistent_manifest(cfg, abi, BuildOptions(name="x"), num_queues=16)
    assert Op.ATTN not in {i.op for i in default.table.instrs}
    m, sched = build_persistent_manifest(cfg, abi, BuildOptions(name="x"), num_queues=16, attn="fused")
    ops = {i.op for i in sched.table.instrs}
    assert Op.ATTN in ops and not ops & {Op.ROPE, Op.ATTN_PARTIAL, Op.ATTN_REDUCE}
    assert m["meta"]["persistent"]["attn"] == "fused"
    for stride in (2, 3, cfg.kv_heads, 32):
        _, spaced = build_persistent_manifest(cfg, abi, BuildOptions(name="x"), num_queues=16, counter_stride=stride,
                                              attn="fused")  # packing runs Table.check: tickets clear of counters
        attn = next(i for i in spaced.table.instrs if i.op == Op.ATTN)
        assert attn.signal_counter % stride == 0 and spaced.table.num_counters == sched.table.num_counters * stride


def test_gen_persistent_takes_the_ring_the_flag_and_ablations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kern_manifest import load_manifest
    from tools import gen_persistent

    out = tmp_path / "p.json"
    args = ["--config", str(CONFIGS / "Qwen3-1.7B.json"), "--out", str(out), "--sms", "8"]
    assert gen_persistent.main([*args, "--stages", "3", "--fences", "--no-evict-first", "--ablate", "rope, down"]) == 0
    meta = load_manifest(out).meta["persistent"]
    assert meta["ring_stages"] == 3 and meta["fences"] is True and meta["l2_prefetch"] is False
    assert meta["evict_first"] is False and meta["table_ahead"] is False
    assert list(meta["ablated"]) == ["DOWN", "ROPE"]
    assert "a 3-stage ring, ablated rope, down" in capsys.readouterr().out
    out.unlink()
    assert gen_persistent.main([*args, "--ablate", "qkv,attention"]) == 2
    assert "no instruction class 'ATTENTION'" in capsys.readouterr().err and not out.exists()
    assert gen_persistent.main([*args, "--stages", "12"]) == 2
    assert "ring stages 12: the kernel takes 2..8" in capsys.readouterr().err and not out.exists()


def test_a_counter_stride_spreads_the_counters_and_keeps_the_schedule(abi: KernelAbi) -> None:
    cfg = config("Qwen3-1.7B")
    m1, s1 = build_persistent_manifest(cfg, abi, BuildOptions(name="x"), num_queues=16)
    m32, s32 = build_persistent_manifest(cfg, abi, BuildOptions(name="x"), num_queues=16, counter_stride=32)
    t1 = unpack(base64.b64decode(m1["buffers"]["persist_table"]["init"]["base64"]))
    t32 = unpack(base64.b64decode(m32["buffers"]["persist_table"]["init"]["base64"]))
    assert t32.num_counters == 32 * t1.num_counters == m32["buffers"]["persist_counters"]["shape"][0]
    assert t32.queues == t1.queues and m32["meta"]["persistent"]["counter_stride"] == 32
    for a, b in zip(t1.instrs, t32.instrs):
        assert b.signal_counter == 32 * a.signal_counter and b.wait_target == a.wait_target
        assert b.wait_counter == (a.wait_counter if a.wait_counter == NO_COUNTER else 32 * a.wait_counter)
    for bad in (0, 65):
        with pytest.raises(ManifestBuildError, match=f"counter_stride {bad}: 1..64"):
            build_persistent_manifest(cfg, abi, BuildOptions(name="x"), num_queues=16, counter_stride=bad)


def test_gen_persistent_takes_the_prefill_pins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kern_manifest import load_manifest
    from tools import gen_persistent

    out = tmp_path / "p.json"
    assert gen_persistent.main(["--config", str(CONFIGS / "Qwen3-4B.json"), "--out", str(out), "--sms", "8",
                                "--algos", str(ROOT / "manifests" / "algos" / "h200.json")]) == 0
    m = load_manifest(out)
    assert {"gemm_6144x2560", "gemm_19456x2560"} <= set(m.ops) and m.meta["cublaslt_pins"]["device"] == "NVIDIA H200"
    (tmp_path / "pins.json").write_text("[1, 2]")
    assert gen_persistent.main(["--config", str(CONFIGS / "Qwen3-4B.json"), "--out", str(tmp_path / "q.json"),
                                "--algos", str(tmp_path / "pins.json")]) == 2
    assert capsys.readouterr().err.startswith("gen_persistent: ") and not (tmp_path / "q.json").exists()


def test_gen_persistent_refuses_an_output_it_cannot_write_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import os

    from tools import gen_persistent

    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    args = ["--config", str(CONFIGS / "Qwen3-1.7B.json"), "--sms", "8"]
    for out, words in ((tmp_path, "Is a directory"), (fifo, "a FIFO, not a regular file"),
                       (tmp_path / "missing" / "p.json", "No such file or directory")):
        assert gen_persistent.main([*args, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"gen_persistent: --out {out}: ") and words in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.fifo"]  # nothing half-written beside them
