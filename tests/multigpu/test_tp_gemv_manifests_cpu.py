"""Tensor-parallel manifests on the GEMV decode (kern_run.models.qwen3.tp, the default of `kern manifest build --tp N`).

For the Qwen3 8B / 14B / 32B shapes at TP 2 / 4 / 8: every rank's manifest verifies, the ranks share one family
digest, the decode is one graph whose layers are gemv_qkv, q/k norm + rope + KV, attention, the row-parallel o
GEMV into `hidden`, allreduce_add, gemv_gate_up_act, the row-parallel down GEMV, allreduce_add; the one-shot
all-reduce is declared like any kernel (module pinned, params from kernels.json, peer table of an export buffer,
a host-placed status word). The split itself is checked with numpy on a small model of the same structure:
each rank's weight buffers are filled by executing its bind plans on a random checkpoint, and the rank
projections must reproduce the full ones (column-parallel slices equal, row-parallel partials summing to the
whole).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from mg_helpers import REPO

from kern_manifest import parse_manifest, verify
from kern_run.errors import ManifestBuildError
from kern_run.models import qwen3 as g
from kern_runtime import HostTensors, plan_bind

ABI = g.KernelAbi.from_json(json.loads((REPO / "kernels" / "kernels.json").read_text()))
LAYER_OPS = ["gemv_qkv", "qk_norm_rope_kv", "attn_decode", "gemv_rows", "allreduce_add", "gemv_gate_up_act",
             "gemv_rows", "allreduce_add"]


def build(shape: str, tp: int, **options) -> tuple[g.Qwen3Config, list[dict]]:
    cfg = g.Qwen3Config.from_name(shape)
    return cfg, g.build_rank_manifests(cfg, ABI, g.BuildOptions(shape, max_context=4096, **options), tp)


@pytest.mark.parametrize("shape", ["qwen3-8b", "qwen3-14b", "qwen3-32b"])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_rank_manifests_build_verify_and_decode_on_gemvs(shape: str, tp: int) -> None:
    cfg, ms = build(shape, tp)
    parsed = [parse_manifest(m) for m in ms]
    for p in parsed:
        verify(p)
    assert len({p.family_digest for p in parsed}) == 1 and len({p.digest for p in parsed}) == tp
    H, D = cfg.hidden, cfg.head_dim
    q_shard, i_shard = cfg.q_heads // tp * D, cfg.intermediate // tp
    for rank, m in enumerate(ms):
        assert m["meta"]["tp"]["rank"] == rank and m["meta"]["caller"]["decode"] == "gemv"
        calls = m["programs"]["decode"]["calls"]
        assert m["programs"]["decode"]["graph"] is True
        ops = [c["op"] for c in calls]
        assert ops[0] == "embed" and ops[-5:-3] == ["gemv_lm_head", "allgather"]
        body = ops[1:1 + len(LAYER_OPS) * cfg.layers]
        assert [o if not o.startswith("gemv_rows_") else "gemv_rows" for o in body] == LAYER_OPS * cfg.layers
        assert {o for o in body if o.startswith("gemv_rows_")} == {f"gemv_rows_{H}x{q_shard}", f"gemv_rows_{H}x{i_shard}"}
        adds = [c for c in calls if c["op"] == "allreduce_add"]
        assert len(adds) == 2 * cfg.layers
        assert all(c["args"] == {"x": "hidden", "residual": "residual", "count": f"seqs * {H}", "peers": "ar_peers",
                                 "status": "ar_status"} for c in adds)
        assert "gemv_o" not in m["ops"] and "gemv_down_act" not in m["ops"]
        (launch,) = m["ops"][f"gemv_rows_{H}x{i_shard}"]["launches"]
        assert launch["entry"] == "kern_gemv_rows" and launch["args"][3:] == [{"i32": H}, {"i32": i_shard}]
        (add,) = m["ops"]["allreduce_add"]["launches"]
        assert add["module"] == "allreduce" and add["entry"] == "kern_allreduce_add_bf16"
        assert add["params"] == ABI.entries["kern_allreduce_add_bf16"][1]
        assert add["args"][1] == {"rank": "tp", "type": "i32"} and add["args"][2] == {"i32": tp}
        assert m["modules"]["allreduce"] == ABI.modules["allreduce"]
        assert m["buffers"]["ar"]["export"] is True
        assert m["buffers"]["ar_peers"]["peers"] == {"of": "ar", "group": "tp"}
        assert m["buffers"]["ar_status"] == {"kind": "output", "dtype": "i32", "shape": [4], "placement": "host"}
        meta = m["meta"]["tp"]["allreduce"]
        assert meta["oneshot_tokens"] == (256 * 1024) // (2 * H) and meta["capacity"] >= H
        assert m["buffers"]["ar"]["shape"][0] * 8 >= 2 * tp * meta["capacity"] * 2
        # the vocabulary-parallel lm_head: the rank's rows of lm_head.weight (151936 = tp x slice at 2 / 4 / 8)
        V, n = cfg.vocab, cfg.vocab // tp
        assert m["buffers"]["lm_head"] == {"kind": "weight", "dtype": "bf16", "shape": [n, H], "bind": [
            {"tensor": "lm_head.weight", "rows": [rank * n, (rank + 1) * n], "shape": [V, H]}]}
        assert m["buffers"]["embed"]["bind"] == [{"tensor": "model.embed_tokens.weight"}]
        assert calls[-5] == {"op": "gemv_lm_head", "args": {"w": "lm_head", "residual": "residual",
                                                            "norm_w": "final_norm", "y": "lm_logits"}}
        assert calls[-4] == {"op": "allgather", "args": {"x": "lm_logits", "out": "logits", "rows": "seqs",
                                                         "peers": "ag_peers", "status": "ar_status"}}
        assert m["buffers"]["lm_logits"]["shape"] == ["seqs", n] and m["buffers"]["logits"]["shape"] == ["seqs", V]
        (lm,) = m["ops"]["gemv_lm_head"]["launches"]
        assert lm["entry"] == "kern_gemv_rmsnorm" and lm["args"][4:6] == [{"i32": n}, {"i32": H}]
        (gather,) = m["ops"]["allgather"]["launches"]
        assert gather["module"] == "allreduce" and gather["entry"] == "kern_allgather_bf16"
        assert gather["params"] == ABI.entries["kern_allgather_bf16"][1]
        assert gather["args"] == [{"arg": "peers"}, {"rank": "tp", "type": "i32"}, {"i32": tp}, {"arg": "x"},
                                  {"arg": "out"}, {"arg": "rows", "type": "i32"}, {"i32": V}, {"i32": n},
                                  {"i32": n}, {"i32": 32}, {"arg": "status"}, {"i64": 1_000_000_000}]
        assert gather["grid"] == [32, 1, 1] and gather["block"] == [256, 1, 1]
        assert m["buffers"]["ag"]["export"] is True and m["buffers"]["ag_peers"]["peers"] == {"of": "ag", "group": "tp"}
        assert m["buffers"]["ag"]["shape"][0] * 8 >= 2 * tp * n * 2
        assert m["meta"]["tp"]["lm_head"] == {"split": "vocab", "slice": n, "status": "ar_status", "blocks": 32,
                                              "capacity": n, "timeout_ns": 1_000_000_000,
                                              "window": [rank * n, (rank + 1) * n],
                                              "columns": [rank * n, (rank + 1) * n]}


def test_the_peer_launches_are_the_all_reduce_ops() -> None:
    """What the runtime's multicast scan will disassemble: exactly the ops whose calls pass the peer table."""
    _, ms = build("qwen3-8b", 2)
    m = parse_manifest(ms[0])
    sensitive = {"ar", "ar_peers", "ag", "ag_peers"}
    scanned = {site_op for prog in m.programs.values() for c in prog.calls
               if any(getattr(a, "name", None) in sensitive for a in c.args.values()) for site_op in [c.op]}
    assert scanned == {"allreduce", "allreduce_add", "allgather"}


@pytest.mark.parametrize("options, message", [
    ({"seqs_max": 4, "gemv": "v2"}, "the tensor-parallel GEMV decode computes one row"),
    ({"allreduce_oneshot_bytes": -1}, "allreduce_oneshot_bytes .* bytes >= 0"),
    ({"allreduce_timeout_ms": 0}, "allreduce_timeout_ms"),
    ({"allreduce_blocks": 65}, "allreduce_blocks 65"),
    ({"tp_lm_head": "rows"}, r"tp_lm_head \(--tp-lm-head\) 'rows': one of vocab, replicated"),
])
def test_refusals_name_the_option(options: dict, message: str) -> None:
    with pytest.raises(ManifestBuildError, match=message):
        build("qwen3-8b", 2, **options)


@pytest.mark.parametrize("oneshot_bytes", [0, 4096])
def test_gemv_decode_on_nccl_below_one_row(oneshot_bytes: int) -> None:
    """A threshold below one decode row (8B: 8 KiB): every all-reduce on NCCL; the GEMV decode's row-parallel
    GEMVs are then followed by the NCCL allreduce of `hidden` and add_rmsnorm with the next norm's weight."""
    cfg, ms = build("qwen3-8b", 2, allreduce_oneshot_bytes=oneshot_bytes)
    m = ms[0]
    verify(parse_manifest(m))
    assert "ar" not in m["buffers"] and "allreduce_add" not in m["ops"]
    # the allreduce module is there for the vocabulary-parallel lm_head's all-gather alone
    assert {o for o, op in m["ops"].items() for launch in op["launches"] if launch.get("module") == "allreduce"} == {
        "allgather"}
    calls = m["programs"]["decode"]["calls"]
    rows = [i for i, c in enumerate(calls) if c["op"].startswith("gemv_rows_")]
    assert len(rows) == 2 * cfg.layers
    norms = []
    for i in rows:
        assert calls[i + 1] == {"op": "allreduce", "args": {"x": "hidden", "count": f"seqs * {cfg.hidden}"}}
        assert calls[i + 2]["op"] == "add_rmsnorm" and calls[i + 2]["args"]["delta"] == "hidden"
        norms.append(calls[i + 2]["args"]["w"])
    want = [n for layer in range(cfg.layers) for n in (f"ln_post.{layer}", f"ln_in.{layer + 1}")]
    assert norms == want[:-1] + ["final_norm"]


@pytest.mark.parametrize("lm_head", ["vocab", "replicated"])
def test_nccl_only_with_the_cublaslt_decode(lm_head: str) -> None:
    """--allreduce-oneshot-bytes 0: every all-reduce on NCCL; the vocabulary-parallel lm_head's all-gather stays
    one-shot (its own `ag`, the status words `ar_status`, which meta.tp.lm_head names); replicated: no kern
    collective at all."""
    cfg, ms = build("qwen3-8b", 2, decode="gemm", allreduce_oneshot_bytes=0, tp_lm_head=lm_head)
    m = ms[0]
    verify(parse_manifest(m))
    assert "ar" not in m["buffers"]
    assert [launch["extern"] for launch in m["ops"]["allreduce"]["launches"]] == ["nccl_allreduce_bf16"]
    assert m["meta"]["tp"]["allreduce"] == {"oneshot_bytes": 0}
    if lm_head == "replicated":
        assert "allreduce" not in m["modules"] and "ar_status" not in m["buffers"] and "allgather" not in m["ops"]
        assert m["meta"]["tp"]["lm_head"] == {"split": "replicated"}
        return
    assert m["buffers"]["ar_status"] == {"kind": "output", "dtype": "i32", "shape": [4], "placement": "host"}
    assert m["meta"]["tp"]["lm_head"]["status"] == "ar_status" and "ag" in m["buffers"]


# ---------------------------------------------------------------- the split, with numpy


SMALL = g.Qwen3Shape(hidden_size=64, num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=8, head_dim=16,
                     intermediate_size=128, vocab_size=1024, tie_word_embeddings=False)


def checkpoint(cfg: g.Qwen3Config, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every tensor of the small model, float32 values that are exact in bf16."""
    H, D, I, V = cfg.hidden, cfg.head_dim, cfg.intermediate, cfg.vocab
    shapes = {"model.embed_tokens.weight": (V, H), "lm_head.weight": (V, H), "model.norm.weight": (H,)}
    for layer in range(cfg.layers):
        p = f"model.layers.{layer}."
        shapes.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                       p + "self_attn.q_proj.weight": (cfg.q_heads * D, H),
                       p + "self_attn.k_proj.weight": (cfg.kv_heads * D, H),
                       p + "self_attn.v_proj.weight": (cfg.kv_heads * D, H),
                       p + "self_attn.o_proj.weight": (H, cfg.q_heads * D),
                       p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,),
                       p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                       p + "mlp.down_proj.weight": (H, I)})
    return {n: (rng.integers(-64, 64, s) / 64).astype(np.float32) for n, s in shapes.items()}


def bf16_bits(a: np.ndarray) -> np.ndarray:
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # exact: the values are bf16 already


def fill(buffer, tensors: HostTensors, raw: dict[str, np.ndarray]) -> np.ndarray:
    """The buffer's bytes after executing its bind plan on the checkpoint (float32 view of its bf16 elements)."""
    plan = plan_bind(buffer, tensors.meta)
    out = np.zeros(plan.nbytes, dtype=np.uint8)
    for c in plan.copies:
        src = bf16_bits(raw[c.tensor]).reshape(-1).view(np.uint8)
        for s, d in c.rows():
            out[d:d + c.width] = src[s:s + c.width]
    shape = buffer.shape_at({})
    bits = out.view(np.uint16).reshape(shape)
    return (bits.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_each_ranks_binds_split_the_projections_as_megatron(tp: int) -> None:
    cfg = g.Qwen3Config.from_json(g.config_json(SMALL), "small")
    ms = g.build_rank_manifests(cfg, ABI, g.BuildOptions("small", chunk_max=16, max_context=256), tp)
    rng = np.random.default_rng(tp)
    raw = checkpoint(cfg, rng)
    tensors = HostTensors({n: ("bf16", bf16_bits(a)) for n, a in raw.items()})
    H, D = cfg.hidden, cfg.head_dim
    x = rng.standard_normal(H)  # float64 activations
    for layer in range(cfg.layers):
        p = f"model.layers.{layer}."
        wq, wk, wv = (raw[p + f"self_attn.{t}_proj.weight"].astype(np.float64) for t in "qkv")
        wo = raw[p + "self_attn.o_proj.weight"].astype(np.float64)
        wg, wu = raw[p + "mlp.gate_proj.weight"].astype(np.float64), raw[p + "mlp.up_proj.weight"].astype(np.float64)
        wd = raw[p + "mlp.down_proj.weight"].astype(np.float64)
        attn = rng.standard_normal(cfg.q_heads * D)
        act = rng.standard_normal(cfg.intermediate)
        o_sum, down_sum = np.zeros(H), np.zeros(H)
        qs, kvs, i_s = cfg.q_heads * D // tp, cfg.kv_heads * D // tp, cfg.intermediate // tp
        for rank, m in enumerate(ms):
            bufs = parse_manifest(m).buffers
            qkv = fill(bufs[f"w_qkv.{layer}"], tensors, raw).astype(np.float64) @ x
            want = np.concatenate([(wq @ x)[rank * qs:(rank + 1) * qs], (wk @ x)[rank * kvs:(rank + 1) * kvs],
                                   (wv @ x)[rank * kvs:(rank + 1) * kvs]])
            np.testing.assert_allclose(qkv, want, rtol=1e-12, err_msg=f"rank {rank} qkv")
            gate_up = fill(bufs[f"w_gate_up.{layer}"], tensors, raw).astype(np.float64) @ x
            np.testing.assert_allclose(gate_up, np.concatenate([(wg @ x)[rank * i_s:(rank + 1) * i_s],
                                                                (wu @ x)[rank * i_s:(rank + 1) * i_s]]), rtol=1e-12)
            o_sum += fill(bufs[f"w_o.{layer}"], tensors, raw).astype(np.float64) @ attn[rank * qs:(rank + 1) * qs]
            down_sum += fill(bufs[f"w_down.{layer}"], tensors, raw).astype(np.float64) @ act[rank * i_s:(rank + 1) * i_s]
            for name in (f"ln_in.{layer}", f"ln_post.{layer}", f"q_norm.{layer}", f"k_norm.{layer}"):
                assert math.prod(bufs[name].shape_at({})) in (H, D)
        np.testing.assert_allclose(o_sum, wo @ attn, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(down_sum, wd @ act, rtol=1e-9, atol=1e-9)
    n = cfg.vocab // tp
    for rank, m in enumerate(ms):  # replicated on every rank; the lm_head vocabulary-parallel (its rank's rows)
        bufs = parse_manifest(m).buffers
        np.testing.assert_array_equal(fill(bufs["lm_head"], tensors, raw),
                                      raw["lm_head.weight"][rank * n:(rank + 1) * n])
        np.testing.assert_array_equal(fill(bufs["embed"], tensors, raw), raw["model.embed_tokens.weight"])
        np.testing.assert_array_equal(fill(bufs["ln_in.1"], tensors, raw), raw["model.layers.1.input_layernorm.weight"])


def test_the_allreduce_cubin_is_a_clean_peer_launch_that_waits_on_every_path() -> None:
    """The committed allreduce cubin: no multicast in any entry (the all-gather's included) (what Runtime.load's peer-launch scan refuses),
    and no path exits before griddepcontrol.wait (PDL-safe, tools/sass_paths.py). Skipped without cuobjdump /
    nvdisasm (CUOBJDUMP, or the nvidia-cuda-cuobjdump and -nvdisasm wheels)."""
    from kern_runtime.cuda import sass
    from kern_runtime.cuda.sass import find_cuobjdump
    from tools import sass_paths

    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found")
    cubin = REPO / "kernels" / json.loads((REPO / "kernels" / "kernels.json").read_text())["modules"]["allreduce"]["file"]
    try:
        funcs = sass_paths.cubin_functions(cubin, tool)
    except sass_paths.SassPathError as exc:
        pytest.skip(f"cuobjdump -sass failed (nvdisasm missing?): {str(exc)[:200]}")
    image = cubin.read_bytes()
    for entry in ("kern_allreduce_bf16", "kern_allreduce_add_bf16", "kern_allgather_bf16"):
        sass.check_peer_launch(image, "allreduce", entry, "$.ops.allreduce.launches[0]")
        assert sass_paths.unwaited_exits(funcs[entry]) == [], entry
        assert any(i.op.startswith("MEMBAR.SC.SYS") for i in funcs[entry])  # the fence before the flags


# ---------------------------------------------------------------- the vocabulary-parallel lm_head


def small(vocab: int, tied: bool) -> g.Qwen3Config:
    shape = g.Qwen3Shape(hidden_size=64, num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=8,
                         head_dim=16, intermediate_size=128, vocab_size=vocab, tie_word_embeddings=tied)
    return g.Qwen3Config.from_json(g.config_json(shape), "small")


@pytest.mark.parametrize(("vocab", "tp", "tied"), [(1024, 2, False), (1002, 4, False), (1003, 8, True),
                                                   (1002, 4, True)])
def test_vocab_parallel_lm_head_reproduces_the_full_logits(vocab: int, tp: int, tied: bool) -> None:
    """Each rank's lm_head buffer, filled by executing its bind plan on a random checkpoint, times the normed
    hidden state gives its window's logits; gathered as kern_allgather_bf16 gathers them
    (tools/reference_kernels.allgather_bf16: each column from its owner), they are the full lm_head's logits on
    every rank: vocab divisible by the ranks, not divisible (slice cdiv rounded to 8, the last rank's window
    ending at vocab and owning fewer columns), not a multiple of 8, tied (the rows of the embedding, which stays
    whole) or not."""
    from tools.reference_kernels import allgather_bf16

    cfg = small(vocab, tied)
    ms = g.build_rank_manifests(cfg, ABI, g.BuildOptions("small", chunk_max=16, max_context=256), tp)
    parsed = [parse_manifest(m) for m in ms]
    for p in parsed:
        verify(p)
    assert len({p.family_digest for p in parsed}) == 1
    n = -(-(-(-vocab // tp)) // 8) * 8
    assert (tp - 1) * n < vocab
    rng = np.random.default_rng(vocab + tp)
    raw = checkpoint(cfg, rng)
    if tied:
        del raw["lm_head.weight"]
    tensors = HostTensors({name: ("bf16", bf16_bits(a)) for name, a in raw.items()})
    full = raw["model.embed_tokens.weight" if tied else "lm_head.weight"].astype(np.float64)
    x = rng.standard_normal(cfg.hidden)
    windows, slices = [], []
    for rank, (m, p) in enumerate(zip(ms, parsed)):
        window = min(rank * n, vocab - n)
        assert m["meta"]["tp"]["lm_head"]["window"] == [window, window + n]
        assert m["meta"]["tp"]["lm_head"]["columns"] == [min(rank * n, vocab), min((rank + 1) * n, vocab)]
        w = fill(p.buffers["lm_head"], tensors, raw).astype(np.float64)
        assert w.shape == (n, cfg.hidden)
        np.testing.assert_array_equal(w, full[window:window + n])
        assert fill(p.buffers["embed"], tensors, raw).shape == (vocab, cfg.hidden)
        slices.append(w @ x)
        windows.append(np.arange(window, window + n))
        (gather,) = m["ops"]["allgather"]["launches"]
        assert gather["args"][6:9] == [{"i32": vocab}, {"i32": n}, {"i32": n}]
    # which logit each column of the gathered buffer holds: exactly column j, from its one owner
    cols = allgather_bf16(np.stack(windows).astype(np.uint16)[:, None, :], vocab)[0]
    np.testing.assert_array_equal(cols, np.arange(vocab))
    owner = np.concatenate([np.full(min((r + 1) * n, vocab) - min(r * n, vocab), r) for r in range(tp)])
    gathered = np.array([slices[owner[j]][j - min(owner[j] * n, vocab - n)] for j in range(vocab)])
    np.testing.assert_allclose(gathered, full @ x, rtol=1e-12, atol=1e-12)


def test_vocab_parallel_lm_head_on_the_cublaslt_decode() -> None:
    """--decode gemm --seqs-max 8: the lm_head projection is cuBLASLt's at n = slice into lm_logits, the gather's
    rows are `seqs` and its slots hold seqs_max rows."""
    cfg, ms = build("qwen3-8b", 2, decode="gemm", seqs_max=8)
    n = cfg.vocab // 2
    for m in ms:
        verify(parse_manifest(m))
        calls = m["programs"]["decode"]["calls"]
        i = next(i for i, c in enumerate(calls) if c["op"] == "allgather")
        assert calls[i - 1] == {"op": "gemm", "args": {"a": "normed", "w": "lm_head", "c": "lm_logits", "m": "seqs",
                                                       "n": n, "k": cfg.hidden}}
        assert calls[i]["args"]["rows"] == "seqs" and calls[i + 1]["op"] == "sample"
        assert not any(c["args"].get("c") == "logits" or c["args"].get("y") == "logits" for c in calls)
        assert m["ops"]["allgather"]["launches"][0]["args"][8] == {"i32": 8 * n}
        assert m["meta"]["tp"]["lm_head"]["capacity"] == 8 * n


def test_replicated_lm_head_is_still_built() -> None:
    """--tp-lm-head replicated: the whole lm_head on every rank into the full logits, no gather."""
    cfg, ms = build("qwen3-8b", 2, tp_lm_head="replicated")
    for m in ms:
        verify(parse_manifest(m))
        assert m["buffers"]["lm_head"]["bind"] == [{"tensor": "lm_head.weight"}]
        assert m["buffers"]["lm_head"]["shape"] == [cfg.vocab, cfg.hidden]
        calls = m["programs"]["decode"]["calls"]
        assert [c["op"] for c in calls[-4:]] == ["gemv_lm_head", "sample", "sample_history_append",
                                                 "decode_advance_packed"]
        assert calls[-4]["args"]["y"] == "logits" and calls[-4]["args"]["w"] == "lm_head"
        assert "allgather" not in m["ops"] and "ag" not in m["buffers"] and "lm_logits" not in m["buffers"]
        assert m["ops"]["gemv_lm_head"]["launches"][0]["args"][4] == {"i32": cfg.vocab}
        assert m["meta"]["tp"]["lm_head"] == {"split": "replicated"}


def test_a_vocabulary_too_small_to_split_is_refused() -> None:
    with pytest.raises(ManifestBuildError, match="vocab_size 20 over --tp 8 in slices of 8 .* replicated"):
        g.build_rank_manifests(small(20, False), ABI, g.BuildOptions("small", chunk_max=16, max_context=256), 8)
    ms = g.build_rank_manifests(small(20, False), ABI, g.BuildOptions("small", chunk_max=16, max_context=256,
                                                                      tp_lm_head="replicated"), 8)
    assert ms[7]["meta"]["tp"]["lm_head"] == {"split": "replicated"}
