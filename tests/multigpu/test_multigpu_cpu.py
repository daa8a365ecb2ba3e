"""Multi-GPU pieces that need no GPU: offers, handle bookkeeping, the SASS multicast scanner, peer-table
and column-range manifest verification, NCCL extern argument checks, the runtime's refusals before
connect, column-range bind plans, and the tensor-parallel manifest generator."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from mg_helpers import FIXTURES, REPO, barrier_manifest, nccl_manifest, reference

from kern_manifest import ManifestVerifyError, find_faults, parse_manifest, verify
from kern_runtime import ApiError, KernelArtifactError, ManifestError
from kern_runtime.cuda import sass
from kern_runtime.cuda.memory import Allocation
from kern_runtime.cuda.nccl import NCCL_ENV_DEFAULTS, check_extent, element_counts, nccl_call, pin_nccl_env, split_extern
from kern_runtime.multigpu.peers import Offer, PeerBlock, PeerHandle, check_offers, export_handle, missing_peer_tables
from kern_runtime.program.records import AddressBook, compile_program
from kern_runtime.program.replay import ProgramState
from kern_manifest import var_max, var_min
from kern_runtime.multigpu.connect import Peers
from kern_runtime.runtime import load_spec
from kern_manifest import Buffer, Expr, RowsSegment
from kern_runtime.weights.plan import plan_bind
from kern_runtime.weights.tensors import TensorMeta

# ---------------------------------------------------------------- offers and handles


def fabric_handle(name: str, blocks: int = 2, nbytes: int = 4 << 20) -> PeerHandle:
    step = nbytes // blocks
    return PeerHandle(name, "fabric", nbytes,
                      tuple(PeerBlock(i * step, step, bytes([i + 1]) * 64) for i in range(blocks)), gpu=1, pid=4242)


def test_offer_round_trip() -> None:
    offer = Offer("a" * 64, "b" * 64, {"tp": 1}, {"flags": fabric_handle("flags"), "kv.0": fabric_handle("kv.0", 3, 6 << 20)},
                  {"tp": bytes(range(128))})
    wire = offer.to_bytes()
    assert wire.startswith(b"KERN-OFFER/1\n")
    back = Offer.from_bytes(wire)
    assert back == offer
    assert back.handles["kv.0"].blocks[2] == PeerBlock(4 << 20, 2 << 20, bytes([3]) * 64)


def test_offer_with_local_handle_has_no_wire_form() -> None:
    local = PeerHandle("flags", "local", 2 << 20, (PeerBlock(0, 2 << 20, object()),), gpu=0, pid=os.getpid())
    with pytest.raises(ApiError, match="local handle.*connect_local"):
        Offer("a" * 64, "b" * 64, {"tp": 0}, {"flags": local}).to_bytes()


@pytest.mark.parametrize("data", [b"nonsense", b"KERN-OFFER/1\n{}", b"KERN-OFFER/1\n{\"family_digest\": 1"])
def test_malformed_offers_refused(data: bytes) -> None:
    with pytest.raises(ApiError):
        Offer.from_bytes(data)


def test_fabric_handle_must_be_64_bytes() -> None:
    obj = fabric_handle("flags").to_json()
    obj["blocks"][0][2] = "AAAA"
    with pytest.raises(ApiError, match="64 bytes"):
        PeerHandle.from_json(obj)


def test_check_offers_digest_order_count() -> None:
    good = [Offer("f" * 64, "x", {"tp": 0}, {}), Offer("f" * 64, "y", {"tp": 1}, {})]
    check_offers("tp", 2, good, "f" * 64, 0)  # full digests may differ (per-rank binds)
    with pytest.raises(ApiError, match="family digest"):
        check_offers("tp", 2, [good[0], Offer("e" * 64, "y", {"tp": 1}, {})], "f" * 64, 0)
    with pytest.raises(ApiError, match="member order"):
        check_offers("tp", 2, good[::-1], "f" * 64, 0)
    with pytest.raises(ApiError, match="2 members, connect got 1"):
        check_offers("tp", 2, good[:1], "f" * 64, 0)


def test_export_handle_bookkeeping_local() -> None:
    blocks = [(0, 2 << 20, "h0"), (2 << 20, 2 << 20, "h1")]
    alloc = Allocation("state kv.0", 0x7000_0000, 4 << 20, blocks=blocks, fabric=False, gpu=1)
    h = export_handle("kv.0", alloc)
    assert (h.kind, h.nbytes, h.gpu, h.pid) == ("local", 4 << 20, 1, os.getpid())
    assert [(b.offset, b.nbytes, b.handle) for b in h.blocks] == blocks
    with pytest.raises(ApiError, match="not a VMM allocation"):
        export_handle("x", Allocation("buffer x", 0x1000, 64))


def test_missing_peer_tables() -> None:
    tables = {"peers": ("flags", "world"), "kv_peers": ("kv.0", "tp")}
    assert missing_peer_tables(tables, {"peers"}) == ["kv_peers (peers of kv.0 in tp)"]
    assert missing_peer_tables(tables, {"peers", "kv_peers"}) == []


# ---------------------------------------------------------------- SASS multicast scanner


def test_sass_scanner_finds_ldgmc_only_where_it_is() -> None:
    funcs = sass.parse_sass((FIXTURES / "sass_multimem_sm90a.txt").read_text())
    assert set(funcs) == {"plain", "mm_st", "mm_ldred", "mm_red"}
    found = {f: sass.multicast_findings(i) for f, i in funcs.items()}
    assert found["mm_ldred"] and "LDGMC" in found["mm_ldred"][0]
    assert found["plain"] == [] and found["mm_st"] == [] and found["mm_red"] == []  # see sass.py: same encodings


def test_sass_scanner_clean_kernel() -> None:
    funcs = sass.parse_sass((FIXTURES / "sass_act_sm90.txt").read_text())
    assert "kern_silu_mul" in funcs and len(funcs["kern_silu_mul"]) > 10
    assert all(sass.multicast_findings(i) == [] for i in funcs.values())


def test_multimem_st_is_st_sys_in_sm90_sass() -> None:
    """Documented limit: multimem.st / .red assemble to the st/red.relaxed.sys encodings on sm_90."""
    text = (FIXTURES / "sass_st_sys_vs_multimem_sm90a.txt").read_text()
    funcs = sass.parse_sass(text)
    assert funcs["st_sys"] == funcs["mm_st"] and funcs["red_sys"] == funcs["mm_red"]


def test_check_peer_launch_refuses_multicast(monkeypatch: pytest.MonkeyPatch) -> None:
    image = b"fake cubin with multimem"
    funcs = sass.parse_sass((FIXTURES / "sass_multimem_sm90a.txt").read_text())
    monkeypatch.setitem(sass._cache, __import__("hashlib").sha256(image).hexdigest(),
                        {f: sass.multicast_findings(i) for f, i in funcs.items()})
    sass.check_peer_launch(image, "mm", "plain", "$.ops.x.launches[0]")
    with pytest.raises(KernelArtifactError, match="multicast.*LDGMC"):
        sass.check_peer_launch(image, "mm", "mm_ldred", "$.ops.x.launches[0]")
    with pytest.raises(KernelArtifactError, match="not in the SASS"):
        sass.check_peer_launch(image, "mm", "absent", "$.ops.x.launches[0]")


def test_missing_cuobjdump_refuses_peer_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUOBJDUMP", "/nonexistent/cuobjdump")
    with pytest.raises(KernelArtifactError, match="cuobjdump was not found.*refused"):
        sass.scan_cubin(b"never scanned before " + os.urandom(8), "m")


# ---------------------------------------------------------------- manifest: peers and cols


def test_barrier_manifest_verifies_and_round_trips() -> None:
    raw = barrier_manifest()
    m = parse_manifest(raw)
    verify(m)
    assert m.buffers["peers"].peers.of == "flags" and m.buffers["peers"].peers.group == "world"
    assert m.to_json() == raw and m.digest == raw["digest"]


@pytest.mark.parametrize("mutate, where", [
    (lambda m: m["buffers"]["peers"].update(dtype="i64"), "$.buffers.peers.dtype"),
    (lambda m: m["buffers"]["peers"].update(shape=[3]), "$.buffers.peers.shape"),
    (lambda m: m["buffers"]["peers"].update(kind="output"), "$.buffers.peers.kind"),
    (lambda m: m["buffers"]["peers"].update(placement="host"), "$.buffers.peers.placement"),
    (lambda m: m["buffers"]["peers"]["peers"].update(group="ep"), "$.buffers.peers.peers.group"),
    (lambda m: m["buffers"]["peers"]["peers"].update(of="nothing"), "$.buffers.peers.peers.of"),
    (lambda m: m["buffers"]["flags"].pop("export"), "$.buffers.peers.peers.of"),
    (lambda m: m["buffers"]["peers"]["peers"].update(typo=1), "$.buffers.peers.peers.typo"),
])
def test_peer_table_faults(mutate, where: str) -> None:
    raw = barrier_manifest()
    raw.pop("digest")
    mutate(raw)
    faults = find_faults(parse_manifest(raw))
    assert any(f.path == where for f in faults), faults


def _cols_manifest(seg: dict) -> dict:
    return {"format": "kern-manifest/1", "name": "c", "vars": {"t": {"min": 1, "max": 1}}, "modules": {},
            "buffers": {"w": {"kind": "weight", "dtype": "bf16", "shape": [4, 3], "bind": [seg]}},
            "ops": {}, "programs": {}}


def test_cols_segment_verifies() -> None:
    verify(parse_manifest(_cols_manifest({"tensor": "t", "cols": [3, 6], "shape": [4, 6]})))
    verify(parse_manifest(_cols_manifest({"tensor": "t", "rows": [2, 6], "cols": [0, 3], "shape": [8, 6]})))


@pytest.mark.parametrize("seg, msg", [
    ({"tensor": "t", "cols": [3, 5], "shape": [4, 6]}, "2 columns wide"),
    ({"tensor": "t", "cols": [4, 7], "shape": [4, 6]}, "tensor has 6 columns"),
    ({"tensor": "t", "cols": [3, 3]}, "0 <= start < stop"),
])
def test_cols_segment_faults(seg: dict, msg: str) -> None:
    with pytest.raises(ManifestVerifyError, match=msg):
        verify(parse_manifest(_cols_manifest(seg)))


def test_family_digest_ignores_binds_name_meta_only() -> None:
    a = parse_manifest(_cols_manifest({"tensor": "t", "cols": [0, 3], "shape": [4, 6]}))
    raw = _cols_manifest({"tensor": "t", "cols": [3, 6], "shape": [4, 6]})
    raw.update(name="other", meta={"tp": {"rank": 1}})
    b = parse_manifest(raw)
    assert a.digest != b.digest and a.family_digest == b.family_digest
    raw["buffers"]["w"]["shape"] = [4, 4]
    raw["buffers"]["w"]["bind"][0]["cols"] = [2, 6]
    assert parse_manifest(raw).family_digest != a.family_digest


def test_cols_bind_plan_copies_the_column_slice() -> None:
    full = np.arange(8 * 6, dtype=np.uint16).reshape(8, 6)
    buf = Buffer(name="w", kind="weight", dtype="bf16", shape=(Expr(4), Expr(3)),
                 bind=(RowsSegment(tensor="t", start=2, stop=6, shape=(8, 6), cols=(3, 6)),))
    plan = plan_bind(buf, {"t": TensorMeta("bf16", (8, 6))})
    (copy,) = plan.copies  # one 2-D copy: 3 columns of rows 2..5, source pitch = the tensor's row
    assert (copy.src_offset, copy.src_pitch, copy.dst_offset, copy.dst_pitch, copy.width, copy.height) == (
        2 * 12 + 3 * 2, 12, 0, 6, 6, 4)
    src, out = full.reshape(-1).view(np.uint8), np.zeros(4 * 3 * 2, np.uint8)
    for s, d in copy.rows():
        out[d:d + copy.width] = src[s:s + copy.width]
    assert np.array_equal(out.view(np.uint16).reshape(4, 3), full[2:6, 3:6])


# ---------------------------------------------------------------- NCCL extern arguments


def test_element_counts() -> None:
    assert element_counts("allreduce", 5, 4) == (5, 5)
    assert element_counts("allgather", 5, 4) == (5, 20)
    assert element_counts("reducescatter", 5, 4) == (20, 5)
    assert element_counts("alltoall", 5, 4) == (20, 20)


def test_nccl_call_checks() -> None:
    topo = {"tp": 2}
    c = nccl_call("nccl_allgather_bf16", (0x1000, 0x2000, 8, 1), "tp", topo, "$")
    assert (c.collective, c.dtype, c.send_bytes, c.recv_bytes, c.rank, c.size) == ("allgather", "bf16", 16, 32, 1, 2)
    with pytest.raises(ApiError, match="count is 0"):
        nccl_call("nccl_allreduce_f32", (0x1000, 0x2000, 0, 0), "tp", topo, "$")
    with pytest.raises(ApiError, match="rank 2 is outside"):
        nccl_call("nccl_allreduce_f32", (0x1000, 0x2000, 4, 2), "tp", topo, "$")
    with pytest.raises(ManifestError, match="does not declare"):
        nccl_call("nccl_allreduce_f32", (0x1000, 0x2000, 4, 0), "ep", topo, "$")
    with pytest.raises(ManifestError, match="not an NCCL extern"):
        split_extern("nccl_broadcast_f32")


def test_nccl_extent_check() -> None:
    topo = {"tp": 2}
    ranges = {"send": (0x1000, 64), "recv": (0x2000, 64)}
    check_extent(nccl_call("nccl_allgather_f32", (0x1000, 0x2000, 8, 0), "tp", topo, "$"), ranges, "$")
    with pytest.raises(ApiError, match="recv needs 128 bytes at offset 0 of 'recv', which has 64"):
        check_extent(nccl_call("nccl_allgather_f32", (0x1000, 0x2000, 16, 0), "tp", topo, "$"), ranges, "$")
    with pytest.raises(ApiError, match="lies in no buffer"):
        check_extent(nccl_call("nccl_allreduce_f32", (0x9000, 0x2000, 4, 0), "tp", topo, "$"), ranges, "$")


def test_pin_nccl_env_keeps_caller_values_but_never_nvls() -> None:
    env = {"NCCL_PROTO": "LL", "NCCL_NVLS_ENABLE": "1"}
    with pytest.warns(RuntimeWarning, match="NVLink multicast"):
        pin_nccl_env(env)
    assert env == {"NCCL_PROTO": "LL", "NCCL_RUNTIME_CONNECT": "0", "NCCL_NVLS_ENABLE": "0"}
    env = {}
    pin_nccl_env(env)
    assert env == {**NCCL_ENV_DEFAULTS, "NCCL_NVLS_ENABLE": "0"}


def test_reference_collectives() -> None:
    sends = [np.arange(4.0) + 10 * r for r in range(2)]
    assert reference("alltoall", sends, 2)[1].tolist() == [2, 3, 12, 13]
    assert reference("reducescatter", sends, 2)[1].tolist() == [14, 16]


# ---------------------------------------------------------------- runtime refusals (no GPU)


def _bare_runtime(manifest: dict, ranks: dict) -> Peers:
    """The multi-GPU part of a runtime on its own (no GPU): it checks the topology when it is made."""
    m = load_spec(manifest)
    return Peers(m, m.topology.sizes(), var_min(m.vars), var_max(m.vars), ranks, {}, 0, None, {}, {}, {},
                 lambda: None)


def test_nccl_program_refused_before_join() -> None:
    rt = _bare_runtime(nccl_manifest(), {"tp": 0})
    assert rt.nccl_groups == {"tp"}
    book = AddressBook({"send_f32": 0x1000, "recv_f32": 0x10000, "send_bf16": 0x20000, "recv_bf16": 0x30000},
                       ranks={"tp": 0})
    records, _ = compile_program(rt.manifest, "allreduce_f32", book, lambda op, li: None)
    state = ProgramState("allreduce_f32", False, "run", records, frozenset())
    with pytest.raises(ApiError, match="NCCL group 'tp' was never joined"):
        rt.require_ready(state)
    assert not rt.peers_ready


def test_ranks_required_and_checked() -> None:
    with pytest.raises(ApiError, match=r"pass ranks=\{group: index\}"):
        _bare_runtime(nccl_manifest(), {})
    with pytest.raises(ApiError, match="outside group 'tp'"):
        _bare_runtime(nccl_manifest(), {"tp": 2})


def test_run_refused_before_peer_tables_filled() -> None:
    rt = _bare_runtime(barrier_manifest(), {"world": 1})
    state = ProgramState("barrier", False, "run", [], frozenset())
    with pytest.raises(ApiError, match=r"peer table\(s\) not filled yet: peers \(peers of flags in world\)"):
        rt.require_ready(state)
    rt.peers_filled.add("peers")
    rt.require_ready(state)


def test_once_program_with_peer_table_refused() -> None:
    raw = barrier_manifest()
    raw.pop("digest")
    raw["programs"]["barrier"]["kind"] = "once"
    rt = _bare_runtime(raw, {"world": 0})
    with pytest.raises(ApiError, match="once program 'barrier' uses peer tables"):
        rt.check_once_program("barrier", ProgramState("barrier", False, "once", [], frozenset()))


# ---------------------------------------------------------------- tensor-parallel manifests


@pytest.fixture(scope="module")
def tp_manifests():
    from kern_run.models import qwen3 as g

    cfg = g.Qwen3Config.from_name("tiny")
    abi = g.KernelAbi.from_json(json.loads((REPO / "kernels" / "kernels.json").read_text()))
    return cfg, g.build_rank_manifests(cfg, abi, g.BuildOptions("tiny", 64, 4096), 2)


def test_tp_m1_gemv_keeps_an_allreduce_after_each_row_parallel_projection() -> None:
    """`kern manifest build --tp 2 --m1-gemv`: the rank's o and down projections are gemv_m1 ops writing `hidden`, each followed by the
    all-reduce of `hidden` (as the cuBLASLt gemm ops are), and the ranks still share one family digest."""
    from kern_run.models import qwen3 as g

    cfg = g.Qwen3Config.from_name("tiny")
    abi = g.KernelAbi.from_json(json.loads((REPO / "kernels" / "kernels.json").read_text()))
    ms = g.build_rank_manifests(cfg, abi, g.BuildOptions("tiny", 64, 4096, decode="gemm", m1_gemv=True), 2)
    parsed = [parse_manifest(m) for m in ms]
    for p in parsed:
        verify(p)
    assert parsed[0].family_digest == parsed[1].family_digest
    calls = ms[0]["programs"]["decode"]["calls"]
    writes_hidden = [i for i, c in enumerate(calls) if c["op"].startswith("gemv_m1_") and c["args"]["c"] == "hidden"]
    assert len(writes_hidden) == 2 * cfg.layers
    assert all(calls[i + 1]["op"] == "allreduce" and calls[i + 1]["args"]["x"] == "hidden" for i in writes_hidden)
    assert sum(c["op"] == "allreduce" for c in calls) == 2 * cfg.layers
    assert not any(c["op"].startswith("gemm") for c in calls)


@pytest.mark.parametrize(("attn", "rope"), [("wg", "warp"), ("r32", "warp"), ("r16", "block")])
def test_tp_cli_passes_the_prefill_entries(tmp_path: Path, attn: str, rope: str) -> None:
    """`kern manifest build --tp 2` (through tools/gen_qwen3_tp.py --out-dir): --prefill-attn / --prefill-rope reach
    every rank's manifest (defaults: auto, which is wg at head_dim 128, and warp)."""
    from kern_run.models import qwen3 as g
    from tools import gen_qwen3_tp as gtp

    args = ["--shape", "qwen3-4b", "--tp", "2", "--out-dir", str(tmp_path), "--kernels", str(REPO / "kernels")]
    if (attn, rope) != ("wg", "warp"):
        args += ["--prefill-attn", attn, "--prefill-rope", rope]
    assert gtp.main(args) == 0
    for rank in (0, 1):
        m = json.loads((tmp_path / f"qwen3-4b-tp2-r{rank}.json").read_text())
        assert m["ops"]["attn_prefill"]["launches"][0]["entry"] == g.PREFILL_ATTN[attn][0]
        rope_entries = [launch["entry"] for launch in m["ops"]["qk_norm_rope_kv"]["launches"]]
        assert rope_entries == (["kern_qk_norm_rope_kv", "kern_qk_norm_rope_kv_warp"] if rope == "warp"
                                else ["kern_qk_norm_rope_kv"])


def test_tp_manifests_verify_and_share_family_digest(tp_manifests) -> None:
    _, ms = tp_manifests
    parsed = [parse_manifest(m) for m in ms]
    for p in parsed:
        verify(p)
    assert parsed[0].digest != parsed[1].digest
    assert parsed[0].family_digest == parsed[1].family_digest
    assert all(m["topology"] == {"tp": {"size": 2}} and m["meta"]["tp"]["rank"] == r for r, m in enumerate(ms))


def test_tp_slices_tile_every_weight_exactly(tp_manifests) -> None:
    """Across ranks, each sharded checkpoint tensor's row (qkv, gate_up, and the vocabulary-parallel lm_head's
    rows of the tied embedding) or column (o, down) ranges tile it exactly once; replicated weights bind whole
    tensors on every rank (the embedding too, for its gather)."""
    cfg, ms = tp_manifests
    covered: dict[tuple[str, str], list[tuple[int, int]]] = {}
    full: dict[str, tuple[int, ...]] = {}
    for m in ms:
        for name, buf in m["buffers"].items():
            for seg in buf.get("bind", []):
                if "cols" in seg:
                    covered.setdefault((seg["tensor"], "cols"), []).append(tuple(seg["cols"]))
                    full[seg["tensor"]] = tuple(seg["shape"])
                elif "rows" in seg:
                    covered.setdefault((seg["tensor"], "rows"), []).append(tuple(seg["rows"]))
                    full[seg["tensor"]] = tuple(seg["shape"])
    assert len(covered) == cfg.layers * 7 + 1  # q k v gate up (rows) + o down (cols), the lm_head (rows)
    assert covered[("model.embed_tokens.weight", "rows")] == [(0, cfg.vocab // 2), (cfg.vocab // 2, cfg.vocab)]
    for (tensor, axis), spans in covered.items():
        extent = full[tensor][1 if axis == "cols" else 0]
        spans.sort()
        assert spans[0][0] == 0 and spans[-1][1] == extent, (tensor, spans)
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), (tensor, spans)
        assert len(spans) == 2
    for m in ms:
        assert m["buffers"]["embed"]["bind"] == [{"tensor": "model.embed_tokens.weight"}]


@pytest.mark.parametrize("oneshot_bytes", [0, 4 * 1024])
def test_tp_allreduce_after_each_row_parallel_gemm(oneshot_bytes: int) -> None:
    """--decode gemm: an allreduce of `hidden` after every cuBLASLt projection writing it; NCCL alone with
    --allreduce-oneshot-bytes 0, else the one-shot kernel up to the threshold's tokens and NCCL above."""
    from kern_run.models import qwen3 as g

    cfg = g.Qwen3Config.from_name("tiny")
    abi = g.KernelAbi.from_json(json.loads((REPO / "kernels" / "kernels.json").read_text()))
    opts = g.BuildOptions("tiny", 64, 4096, decode="gemm", allreduce_oneshot_bytes=oneshot_bytes)
    ms = g.build_rank_manifests(cfg, abi, opts, 2)
    extra = {"peers": "ar_peers", "status": "ar_status"} if oneshot_bytes else {}
    for prog in ("decode", "prefill"):
        calls = ms[0]["programs"][prog]["calls"]
        for i, c in enumerate(calls):
            if c.get("op") == "gemm" and c["args"]["c"] == "hidden":
                assert calls[i + 1] == {"op": "allreduce", "args": {"x": "hidden", "count": f"{c['args']['m']} * {cfg.hidden}",
                                                                    **extra}}
        n = sum(1 for c in calls if c.get("op") == "allreduce")
        assert n == (2 * cfg.layers if prog == "decode" else 2 * (cfg.layers - 1))
    launches = ms[0]["ops"]["allreduce"]["launches"]
    if not oneshot_bytes:
        assert [launch["extern"] for launch in launches] == ["nccl_allreduce_bf16"] and "ar" not in ms[0]["buffers"]
        return
    tokens = oneshot_bytes // (2 * cfg.hidden)
    assert launches[0]["entry"] == "kern_allreduce_bf16" and launches[0]["when"] == {"tokens": [1, tokens]}
    assert launches[1]["extern"] == "nccl_allreduce_bf16" and launches[1]["when"] == {"tokens": [tokens + 1, 64]}
    assert ms[0]["meta"]["tp"]["allreduce"]["oneshot_tokens"] == tokens
