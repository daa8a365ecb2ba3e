"""The builder's sampler (`kern manifest build --sampler gpu|argmax --hist-cap N`, models/qwen3/sampling.py): the
decode program's end, the sampler's buffers and ops, the load-time init, the `top_logprobs` program,
meta.caller.sampling, the option refusals, the CLI, verification by kern_manifest and the runtime's record
compiler; and `--sampler argmax`, byte for byte the manifest of the builder before the sampler (digests recorded
at the branch point, fc55bad, against the stub ABI)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kern_run import sampling as host_sampling
from kern_run.models import qwen3 as gq
from kern_run_testutil import ROOT, kern_manifest_build
from tools import make_checkpoint as mc

STUB = gq.KernelAbi.from_json(gq.stub_kernels_json())
KERNELS = ROOT / "kernels"


def _cfg(shape: str = "qwen3-4b", tied: bool = True, **over: object) -> gq.Qwen3Config:
    doc = {**mc.config_json(mc.SHAPES[shape]), "tie_word_embeddings": tied, **over}
    return gq.Qwen3Config.from_json(doc)


def _manifest(shape: str = "qwen3-4b", tied: bool = True, abi: gq.KernelAbi = STUB, **opts) -> dict:
    return gq.build_manifest(_cfg(shape, tied), abi, gq.BuildOptions(shape, **opts))


def _sha(manifest: dict) -> str:
    return hashlib.sha256(gq.dumps(manifest).encode()).hexdigest()


# ---------------------------------------------------------------- --sampler argmax: the previous builder's bytes

# sha256 of gq.dumps(build_manifest(...)) at the branch point (fc55bad, before the sampler existed), stub ABI:
# (shape, tied, options). A deliberate change of the argmax wiring updates these, and says so.
BRANCH_POINT = {
    ("tiny", True, (("max_context", 4096),)):
        "e12d09f0622b98671493fc867cf3724e99f72a4e392e6b0712e351e1282269e9",
    ("qwen3-4b", True, ()): "3d7e869c427cb0f313bee1c666bacf16791b916d3733630f878b3706fc48cab7",
    ("qwen3-4b", True, (("decode", "gemm"),)): "3698ba44fe5e3696aacb7903c68b0f75518f3f7988c30e47bc49d6884bae98bb",
    ("qwen3-4b", True, (("gemv", "v2"), ("chunk_max", 2048))):
        "a73cac5b8c2b7a21397d65c5bb20d8c0e14543cab0d5fea587444bf52852f030",
    ("qwen3-0.6b", False, (("decode", "gemm"), ("m1_gemv", True), ("decode_attn", "split"))):
        "9580665460eef45856ddd7ffe6382bbf40fc38e1fdf9f85d59c2bbee9aa25cc9",
}


# Deliberate changes since the branch point, undone before the digest is compared: the twenty-fifth session launched
# kern_add_rmsnorm and kern_silu_mul with PDL (they wait for their predecessor since); nothing else moved.
PDL_SINCE = ("kern_add_rmsnorm", "kern_silu_mul")


def _as_at_branch_point(manifest: dict) -> dict:
    """`manifest` with the `pdl` of PDL_SINCE's launches taken off (asserting that each had it), its digest
    recomputed."""
    from kern_run.models.qwen3.jsonio import manifest_digest

    out = json.loads(gq.dumps(manifest))
    for op in out["ops"].values():
        for launch in op["launches"]:
            if launch.get("entry") in PDL_SINCE:
                assert launch.pop("pdl") is True, launch["entry"]
    del out["digest"]
    out["digest"] = manifest_digest(out)
    return out


@pytest.mark.parametrize("key", sorted(BRANCH_POINT, key=repr))
def test_argmax_manifest_is_the_branch_points_byte_for_byte(key) -> None:
    shape, tied, opts = key
    m = _manifest(shape, tied, sampler="argmax", **dict(opts))
    assert _sha(_as_at_branch_point(m)) == BRANCH_POINT[key]
    assert "sampling" not in m["meta"]["caller"]  # its absence says: next_token and the ring hold plain token ids
    # ... and --hist-cap changes nothing there
    assert gq.dumps(_manifest(shape, tied, sampler="argmax", hist_cap=7, **dict(opts))) == gq.dumps(m)


@pytest.mark.parametrize("decode", [None, "gemm"])
def test_argmax_tp_ranks_differ_from_the_sampler_ranks_only_at_the_step_end(decode: str | None) -> None:
    """The rank manifests' digests at the branch point were retired when the TP builder itself changed (the GEMV
    decode and the one-shot all-reduce, branch tp-procs); what --sampler argmax must still hold for the ranks: the
    same manifest up to the step's end, which is argmax + decode_advance instead of the sampler's three calls."""
    opts = {} if decode is None else {"decode": decode}
    am = gq.build_rank_manifests(_cfg(), STUB, gq.BuildOptions("qwen3-4b", sampler="argmax", **opts), 2)
    gpu = gq.build_rank_manifests(_cfg(), STUB, gq.BuildOptions("qwen3-4b", **opts), 2)
    for a, g in zip(am, gpu):
        a_calls, g_calls = a["programs"]["decode"]["calls"], g["programs"]["decode"]["calls"]
        assert [c["op"] for c in a_calls[-2:]] == ["argmax", "decode_advance"]
        assert g_calls[-3:] == TAIL and a_calls[:-2] == g_calls[:-3]
        assert "sampling" not in a["meta"]["caller"] and "sample" not in a["modules"]


def test_the_default_is_the_sampler() -> None:
    assert gq.BuildOptions("x").sampler == "gpu" and gq.BuildOptions("x").hist_cap == 1024
    assert gq.dumps(_manifest()) == gq.dumps(_manifest(sampler="gpu", hist_cap=1024))
    assert gq.dumps(_manifest()) != gq.dumps(_manifest(sampler="argmax"))


# ---------------------------------------------------------------- the decode program's end

TAIL = [
    {"op": "sample", "args": {"logits": "logits", "params": "sample_params", "positions": "positions",
                              "hist_tokens": "hist_tokens", "hist_counts": "hist_counts", "token": "sample_token",
                              "logprob": "sample_logprob", "stats": "sample_stats", "work": "sample_work"}},
    {"op": "sample_history_append", "args": {"hist_tokens": "hist_tokens", "hist_counts": "hist_counts",
                                             "tokens": "sample_token"}},
    {"op": "decode_advance_packed", "args": {"token": "sample_token", "logprob": "sample_logprob",
                                             "next_token": "next_token", "token_ids": "token_ids",
                                             "positions": "positions", "seq_lens": "seq_lens",
                                             "slot_mapping": "slot_mapping", "block_table": "block_table",
                                             "ring": "token_ring"}},
]


@pytest.mark.parametrize("opts,lm_head", [({}, "gemv_lm_head"), ({"gemv": "v2"}, "gemv_lm_head"),
                                          ({"decode": "gemm", "seqs_max": 64}, "gemm"),
                                          ({"decode": "gemm", "m1_gemv": True}, "gemv_m1_151936x2560")])
def test_decode_ends_lm_head_sample_history_advance(opts: dict, lm_head: str) -> None:
    m = _manifest(**opts)
    calls = m["programs"]["decode"]["calls"]
    assert calls[-3:] == TAIL
    assert calls[-4]["op"] == lm_head and "logits" in calls[-4]["args"].values()
    ops = [c["op"] for c in calls]
    assert "argmax" not in ops and "decode_advance" not in ops
    assert "argmax" not in m["ops"] and "decode_advance" not in m["ops"]
    assert "argmax" not in m["modules"]  # nothing launches kern_argmax_* any more
    assert {"sample", "step"} <= set(m["modules"])
    # the argmax build's end, for contrast
    am = _manifest(sampler="argmax", **opts)["programs"]["decode"]["calls"]
    assert [c["op"] for c in am[-2:]] == ["argmax", "decode_advance"]
    assert am[:-2] == calls[:-3]  # everything before the step's end is the same


def test_tensor_parallel_ranks_sample_the_same_full_logits() -> None:
    """Every rank holds the full logits, gathered from the ranks' vocab slices (the TP default: `allgather` right
    after each rank's lm_head slice) or from a replicated lm_head after the all-reduced hidden: each rank samples
    them with the same params, so the ranks agree; the sampler's calls carry no collective."""
    def ranks(**kw):
        return gq.build_rank_manifests(_cfg(), STUB, gq.BuildOptions("qwen3-4b", **kw), 2)

    cases = [(m, ["gemv_lm_head", "allgather"]) for m in ranks()]
    cases += [(m, ["gemm", "allgather"]) for m in ranks(decode="gemm")]
    cases += [(m, ["gemv_lm_head"]) for m in ranks(tp_lm_head="replicated")]
    cases += [(m, ["gemm"]) for m in ranks(decode="gemm", tp_lm_head="replicated")]
    for m, head in cases:  # the GEMV decode (the TP default) and the cuBLASLt one, vocab-parallel and replicated
        calls = m["programs"]["decode"]["calls"]
        assert calls[-3:] == TAIL and [c["op"] for c in calls[-3 - len(head):-3]] == head
        assert m["programs"]["top_logprobs"]["calls"] == [TOP_CALL]
        assert m["meta"]["caller"]["sampling"] == SAMPLING_META


def test_load_program_sets_every_row_greedy() -> None:
    m = _manifest(decode="gemm", seqs_max=8, hist_cap=100)
    assert m["programs"]["load"] == {"kind": "once", "calls": [
        {"op": "rope_table", "args": {"table": "rope"}},
        {"op": "sample_inputs_init", "args": {"params": "sample_params", "hist_tokens": "hist_tokens",
                                              "hist_counts": "hist_counts"}}]}
    (init,) = m["ops"]["sample_inputs_init"]["launches"]
    # seqs_max rows as a constant: a once program runs at every var's min (seqs = 1)
    assert (init["module"], init["entry"], init["grid"], init["block"]) == (
        "step", "kern_sample_inputs_init", [8, 1, 1], [256, 1, 1])
    assert init["args"] == [{"arg": "params"}, {"arg": "hist_tokens"}, {"arg": "hist_counts"}, {"i32": 8},
                            {"i32": 100}]
    assert "pdl" not in init


TOP_CALL = {"op": "top_logprobs", "args": {"logits": "logits", "stats": "sample_stats", "ids": "top_ids",
                                           "logprobs": "top_logprobs"}}


def test_top_logprobs_program() -> None:
    m = _manifest()
    assert m["programs"]["top_logprobs"] == {"kind": "run", "calls": [TOP_CALL]}  # no graph: run on request
    (top,) = m["ops"]["top_logprobs"]["launches"]
    assert (top["module"], top["entry"], top["grid"], top["block"], top["shared_mem"]) == (
        "sample", "kern_sample_top_logprobs_bf16", ["seqs", 1, 1], [1024, 1, 1], 0)
    assert top["args"] == [{"arg": "logits"}, {"arg": "stats"}, {"i32": 151936},
                           {"i32": host_sampling.MAX_TOP_LOGPROBS}, {"arg": "ids"}, {"arg": "logprobs"}]
    assert host_sampling.MAX_TOP_LOGPROBS == 20
    assert "top_logprobs" not in _manifest(sampler="argmax")["programs"]


def test_sampler_launches() -> None:
    m = _manifest(hist_cap=333)
    (s,) = m["ops"]["sample"]["launches"]
    # one 512-thread block per 8192 logits of a row: 19 slices of the 151936-token vocabulary, whatever the batch
    assert (s["module"], s["entry"], s["grid"], s["block"], s["shared_mem"], s["pdl"]) == (
        "sample", "kern_sample_bf16", [19, "seqs", 1], [512, 1, 1], 0, True)
    assert s["args"] == [{"arg": "logits"}, {"arg": "params"}, {"arg": "positions"}, {"arg": "hist_tokens"},
                         {"arg": "hist_counts"}, {"i32": 333}, {"i32": 151936}, {"arg": "token"},
                         {"arg": "logprob"}, {"arg": "stats"}, {"arg": "work"}]
    assert _manifest("tiny")["ops"]["sample"]["launches"][0]["grid"][0] == host_sampling.sampler_splits(
        _cfg("tiny").vocab)
    (h,) = m["ops"]["sample_history_append"]["launches"]
    assert (h["entry"], h["grid"], h["block"], h["pdl"]) == ("kern_sample_history_append", ["seqs", 1, 1],
                                                             [32, 1, 1], True)
    assert h["args"] == [{"arg": "hist_tokens"}, {"arg": "hist_counts"}, {"arg": "tokens"}, {"i32": 333},
                         {"i32": 151936}]
    (a,) = m["ops"]["decode_advance_packed"]["launches"]
    assert (a["module"], a["entry"], a["grid"], a["block"], a["pdl"]) == (
        "step", "kern_decode_advance_packed", [1, 1, 1], [32, 1, 1], True)
    assert a["args"] == [{"arg": n} for n in ("token", "logprob", "next_token", "token_ids", "positions", "seq_lens",
                                              "slot_mapping", "block_table", "ring")] + [
        {"expr": "seqs", "type": "i32"}, {"i32": 16}, {"i32": 2560}, {"i32": 40960}, {"i32": 64}]
    # no PDL at all: none of the sampler's launches carries it
    flat = [l for op in _manifest(pdl=False)["ops"].values() for l in op["launches"]]
    assert not any(l.get("pdl") for l in flat)


def test_params_come_from_kernels_json() -> None:
    raw = gq.stub_kernels_json()
    raw["modules"]["step"]["entries"]["kern_decode_advance_packed"]["params"] = [
        [o * 8, 8] for o in range(9)] + [[80 + 4 * i, 4] for i in range(5)]
    m = _manifest("tiny", abi=gq.KernelAbi.from_json(raw), max_context=4096)
    assert m["ops"]["decode_advance_packed"]["launches"][0]["params"][-1] == [96, 4]


# ---------------------------------------------------------------- buffers

def test_sampler_buffers() -> None:
    b = _manifest(decode="gemm", seqs_max=64, hist_cap=512)["buffers"]
    assert b["sample_params"] == {"kind": "input", "dtype": "u32", "shape": ["seqs", 12]}
    assert 12 * 4 == host_sampling.PARAM_ROW_BYTES  # pack_params' 48-byte rows, one per row of the buffer
    assert b["hist_tokens"] == {"kind": "input", "dtype": "i32", "shape": ["seqs", 512]}
    assert b["hist_counts"] == {"kind": "input", "dtype": "i32", "shape": ["seqs", 512]}
    assert b["sample_token"] == {"kind": "workspace", "dtype": "i32", "shape": ["seqs"]}
    assert b["sample_logprob"] == {"kind": "workspace", "dtype": "f32", "shape": ["seqs"]}
    assert b["sample_stats"] == {"kind": "workspace", "dtype": "f32", "shape": ["seqs", 4]}
    assert 4 * 4 == host_sampling.STATS_BYTES_PER_ROW
    assert b["top_ids"] == {"kind": "output", "dtype": "i32", "shape": ["seqs", 20]}
    assert b["top_logprobs"] == {"kind": "output", "dtype": "f32", "shape": ["seqs", 20]}
    # unchanged: next_token i64 [seqs] and the host-mapped ring (their entries are packed now)
    assert b["next_token"] == {"kind": "output", "dtype": "i64", "shape": ["seqs"]}
    assert b["token_ring"] == {"kind": "output", "dtype": "i64", "shape": ["seqs", 64], "placement": "host"}
    assert b["logits"] == {"kind": "workspace", "dtype": "bf16", "shape": ["seqs", 151936]}
    # the sampler's work area: a fixed state (zeroed at load: the rows' tickets start at 0), seqs_max rows
    assert _manifest(decode="gemm", seqs_max=64)["states"]["sample_work"] == {
        "kind": "fixed", "bytes": 64 * host_sampling.WORK_BYTES_PER_ROW}
    assert _manifest()["states"]["sample_work"]["bytes"] == host_sampling.WORK_BYTES_PER_ROW
    assert "sample_work" not in _manifest(sampler="argmax")["states"]
    am = _manifest(sampler="argmax")["buffers"]
    assert not {"sample_params", "hist_tokens", "hist_counts", "sample_token", "sample_logprob", "sample_stats",
                "top_ids", "top_logprobs"} & set(am)


def test_hist_cap_sizes_the_history_only() -> None:
    small, large = _manifest("tiny", hist_cap=1), _manifest("tiny", hist_cap=65536)
    assert large["buffers"]["hist_tokens"]["shape"] == ["seqs", 65536]
    assert small["buffers"]["hist_counts"]["shape"] == ["seqs", 1]
    assert small["meta"]["caller"]["sampling"]["hist_cap"] == 1
    diff = {k for k in large["buffers"] if large["buffers"][k] != small["buffers"][k]}
    assert diff == {"hist_tokens", "hist_counts"}
    diff_ops = {k for k in large["ops"] if large["ops"][k] != small["ops"][k]}
    assert diff_ops == {"sample", "sample_history_append", "sample_inputs_init"}


# ---------------------------------------------------------------- meta.caller.sampling

SAMPLING_META = {
    "sampler": "gpu",
    "params": "sample_params",
    "hist_tokens": "hist_tokens",
    "hist_counts": "hist_counts",
    "hist_cap": 1024,
    "packing": "packed",
    "init": "greedy",
    "top_logprobs": {"program": "top_logprobs", "n_top": 20, "ids": "top_ids", "logprobs": "top_logprobs"},
}


def test_meta_caller_sampling_names_everything_a_caller_needs() -> None:
    m = _manifest()
    caller = m["meta"]["caller"]
    assert caller["sampling"] == SAMPLING_META
    assert caller["decode_advance"] == {"ring": "token_ring", "ring_len": 64}
    s = caller["sampling"]
    for key in ("params", "hist_tokens", "hist_counts"):
        assert m["buffers"][s[key]]["kind"] == "input"
    assert m["buffers"][s["hist_tokens"]]["shape"] == ["seqs", s["hist_cap"]]
    top = s["top_logprobs"]
    assert top["program"] in m["programs"] and m["programs"][top["program"]]["kind"] == "run"
    for key in ("ids", "logprobs"):
        assert m["buffers"][top[key]] == {"kind": "output", "dtype": "i32" if key == "ids" else "f32",
                                          "shape": ["seqs", top["n_top"]]}


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("opts,message", [
    ({"sampler": "top_k"}, "sampler (--sampler) 'top_k': use 'gpu' (per-row sampling in the graph) or 'argmax' "
                           "(greedy only, plain token ids)"),
    ({"sampler": "GPU"}, "sampler (--sampler) 'GPU': use 'gpu'"),
    ({"hist_cap": 0}, "hist_cap (--hist-cap) 0: history slots per row must lie in [1, 65536]"),
    ({"hist_cap": -3}, "hist_cap (--hist-cap) -3: history slots per row must lie in [1, 65536]"),
    ({"hist_cap": 65537}, "hist_cap (--hist-cap) 65537: history slots per row must lie in [1, 65536]"),
    ({"hist_cap": True}, "hist_cap (--hist-cap) True: history slots per row must lie in [1, 65536]"),
    ({"hist_cap": "64"}, "hist_cap (--hist-cap) '64': history slots per row must lie in [1, 65536]"),
    ({"hist_cap": 0, "sampler": "argmax"}, "hist_cap (--hist-cap) 0"),  # checked whatever the sampler
])
def test_option_refusals_name_option_flag_and_value(opts: dict, message: str) -> None:
    with pytest.raises(gq.ManifestBuildError) as err:
        gq.validate(_cfg("tiny"), gq.BuildOptions("tiny", max_context=4096, **opts))
    assert str(err.value).startswith(message)


def test_a_vocabulary_past_the_samplers_limit_is_refused_for_the_sampler_only() -> None:
    cfg = _cfg("tiny", vocab_size=(1 << 20) + 8)
    with pytest.raises(gq.ManifestBuildError) as err:
        gq.validate(cfg, gq.BuildOptions("x", max_context=4096))
    assert str(err.value) == ("sampler (--sampler) 'gpu': vocab_size 1048584 > 1048576 (the sampler's limit); use "
                              "--sampler argmax")
    gq.validate(cfg, gq.BuildOptions("x", max_context=4096, sampler="argmax"))
    gq.validate(_cfg("tiny", vocab_size=1 << 20), gq.BuildOptions("x", max_context=4096))  # the limit itself: fine


# ---------------------------------------------------------------- the CLI

def test_cli_sampler_and_hist_cap_write_what_build_manifest_builds(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    cfg = gq.Qwen3Config.from_name("tiny")
    digest = gq.jsonio.sha256_text(gq.config_text(gq.SHAPES["tiny"]))
    for argv, opts in ((["--hist-cap", "64"], {"hist_cap": 64}), (["--sampler", "argmax"], {"sampler": "argmax"}),
                       ([], {}), (["--sampler", "gpu", "--hist-cap", "2"], {"hist_cap": 2})):
        out = tmp_path / "m.json"
        assert kern_manifest_build(["--shape", "tiny", "--kernels", str(KERNELS), "--out", str(out), *argv]) == 0
        want = gq.build_manifest(cfg, gq.read_kernel_abi(KERNELS), gq.BuildOptions("tiny", max_context=4096, **opts),
                                 digest)
        assert out.read_text() == gq.dumps(want), argv
        line = capsys.readouterr().out
        calls = 28 if opts.get("sampler") == "argmax" else 29
        assert line.endswith(f"decode {calls} calls, verified)\n"), line


@pytest.mark.parametrize("argv,line", [
    (["--sampler", "greedy"], "kern manifest build: sampler (--sampler) 'greedy': use 'gpu' (per-row sampling in "
                              "the graph) or 'argmax' (greedy only, plain token ids)"),
    (["--hist-cap", "0"], "kern manifest build: hist_cap (--hist-cap) 0: history slots per row must lie in "
                          "[1, 65536]"),
])
def test_cli_refusals_are_one_line_and_write_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     argv: list[str], line: str) -> None:
    out = tmp_path / "m.json"
    assert kern_manifest_build(["--shape", "tiny", "--kernels", str(KERNELS), "--out", str(out), *argv]) == 1
    err = capsys.readouterr().err
    assert err == line + "\n"
    assert not out.exists()


# ---------------------------------------------------------------- verification, the runtime's compiler

@pytest.mark.parametrize("shape,opts", [("tiny", {}), ("qwen3-4b", {"decode": "gemm", "seqs_max": 64}),
                                        ("qwen3-4b", {"gemv": "v2", "seqs_max": 64}),
                                        ("qwen3-4b", {"gemv": "v2", "seqs_max": 64, "decode_attn": "stream"}),
                                        ("qwen3-0.6b", {"hist_cap": 1})])
def test_the_built_manifest_verifies_and_compiles(shape: str, opts: dict) -> None:
    from kern_manifest import parse_manifest, verify
    from kern_runtime import load_spec
    from kern_runtime.program import records

    m = gq.build_manifest(gq.Qwen3Config.from_name(shape), gq.read_kernel_abi(KERNELS),
                          gq.BuildOptions(shape, max_context=4096, **opts))
    verify(parse_manifest(gq.dumps(m)))
    spec = load_spec(json.loads(gq.dumps(m)))
    assert spec.digest == m["digest"]
    targets = {name: 0x10000 * (i + 1) for i, name in enumerate([*spec.buffers, *spec.states])}
    scratch = {(op.name, s): 0x7000_0000 + 0x1000 * i for i, op in enumerate(spec.ops.values()) for s in op.scratch}
    pages = {name: 1000 + i for i, (name, st) in enumerate(spec.states.items()) if st.kind == "paged"}
    book = records.AddressBook(targets, scratch, pages=pages)
    seqs = opts.get("seqs_max", 1)
    for pname in ("load", "prefill", "decode", "top_logprobs"):
        recs, _ = records.compile_program(spec, pname, book, lambda op, li: None)
        for value in {1, 2, seqs}:
            for rec in recs:
                rec.patch({"tokens": value, "seqs": value})
        if pname == "decode":
            assert records.program_reads(recs) == {"tokens", "seqs"}  # the graph key: the params never re-capture
    assert len(records.compile_program(spec, "top_logprobs", book, lambda op, li: None)[0]) == 1


def test_preflight_reads_the_sampler_manifest(tmp_path: Path) -> None:
    from kern_run.preflight import read_manifest

    path = tmp_path / "m.json"
    path.write_text(gq.dumps(_manifest("tiny", max_context=4096)))
    facts = read_manifest(path)
    assert facts.decode_advance == {"ring": "token_ring", "ring_len": 64}
    assert facts.manifest.meta["caller"]["sampling"] == SAMPLING_META


# ---------------------------------------------------------------- the packed entries on the host

def test_unpack_packed_and_packed_token_against_the_step_reference() -> None:
    import numpy as np

    from tools.reference_step import pack

    tokens = np.asarray([0, 1, 151935, 2**31 - 1, 7, 12, 5, 99], np.int32)
    logprobs = np.asarray([0.0, -0.0, -1e-45, -np.inf, np.nan, -3.25, np.finfo(np.float32).min, -1e-7], np.float32)
    packed = np.asarray([pack(int(t), float(v)) for t, v in zip(tokens, logprobs)], np.int64)
    got_tokens, got_lp = host_sampling.unpack_packed(packed)
    assert got_tokens.dtype == np.int32 and got_lp.dtype == np.float32
    np.testing.assert_array_equal(got_tokens, tokens)
    np.testing.assert_array_equal(got_lp.view(np.uint32), logprobs.view(np.uint32))  # bit for bit, NaN too
    assert [host_sampling.packed_token(v) for v in packed] == tokens.tolist()
    assert int(packed[5]) < 0  # a negative logprob sets bit 63: the i64 entry reads negative
    # shapes: a [seqs, ring_len] ring unpacks element-wise
    ring = packed.reshape(2, 4)
    t2, l2 = host_sampling.unpack_packed(ring)
    assert t2.shape == (2, 4) and t2.tolist() == tokens.reshape(2, 4).tolist()
    # an argmax manifest's plain ids pass through packed_token unchanged
    assert [host_sampling.packed_token(v) for v in np.asarray([0, 5, 151935], np.int64)] == [0, 5, 151935]
