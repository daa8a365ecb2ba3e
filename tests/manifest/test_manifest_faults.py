"""Hand-written malformed manifests: each is rejected with the right error class and the right path."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from manifest_testkit import assert_parse_fault, assert_verify_faults, mutate

from kern_manifest import (
    Fault,
    ManifestVerifyError,
    parse_manifest,
    verify,
)

EXAMPLE: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "example.json").read_text())


def mutated(change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    return mutate(EXAMPLE, change)


def text_of(change: Callable[[dict[str, Any]], Any]) -> str:
    return json.dumps(mutated(change))


def ops(o: dict[str, Any]) -> dict[str, Any]:
    return o["ops"]


def step_calls(o: dict[str, Any]) -> list[dict[str, Any]]:
    return o["programs"]["step"]["calls"]


QKV = '$.buffers["w_qkv.0"]'

# (id, input (JSON text or a mutation of the example), expected path, a word the message must contain)
PARSE_CASES: list[tuple[str, Any, str, str]] = [
    ("not-json", "{\"format\": ", "$", "not JSON"),
    ("duplicate-key", '{"name": "a", "name": "b"}', "$", "duplicate key 'name'"),
    ("nan-literal", text_of(lambda o: None).replace("1e-06", "NaN"), "$", "NaN"),
    ("top-level-array", "[1, 2]", "$", "expected an object"),
    ("vars-not-object", lambda o: o.update(vars=[]), "$.vars", "expected an object"),
    ("bool-as-int", lambda o: o["vars"]["tokens"].update(min=True), "$.vars.tokens.min", "expected an integer"),
    ("shape-not-list", lambda o: o["buffers"]["hidden"].update(shape="tokens"), "$.buffers.hidden.shape",
     "expected an array"),
    ("slash-division", lambda o: ops(o)["embed"]["launches"][0]["grid"].__setitem__(0, "tokens / 2"),
     "$.ops.embed.launches[0].grid[0]", "position 7"),
    ("import-injection", lambda o: ops(o)["embed"]["launches"][0]["grid"].__setitem__(0, "__import__(os)"),
     "$.ops.embed.launches[0].grid[0]", "unknown function '__import__'"),
    ("two-wiring-keys", lambda o: ops(o)["rmsnorm"]["launches"][0]["args"].__setitem__(0, {"arg": "x", "i32": 1}),
     "$.ops.rmsnorm.launches[0].args[0]", "exactly one of"),
    ("missing-launches", lambda o: ops(o)["embed"].pop("launches"), "$.ops.embed", "missing required key 'launches'"),
    ("param-not-pair", lambda o: ops(o)["embed"]["launches"][0]["params"].__setitem__(0, [0]),
     "$.ops.embed.launches[0].params[0]", "[offset, size]"),
    ("int-arg-given-object", lambda o: step_calls(o)[0]["args"].update(n_tokens={"buffer": "hidden"}),
     "$.programs.step.calls[0].args.n_tokens", "an int argument is an integer, an expression string or"),
    ("f32-literal-string", lambda o: ops(o)["rmsnorm"]["launches"][0]["args"].__setitem__(6, {"f32": "1e-6"}),
     "$.ops.rmsnorm.launches[0].args[6].f32", "expected a number"),
]


def _add_state(o: dict[str, Any], name: str, state: dict[str, Any]) -> None:
    o["states"][name] = state


# (id, mutation, expected fault paths (exactly these), a word the first message must contain)
VERIFY_CASES: list[tuple[str, Callable[[dict[str, Any]], Any], list[str], str]] = [
    ("unknown-top-key", lambda o: o.update(extras=1), ["$.extras"], "unknown key 'extras'"),
    ("typo-in-launch-key", lambda o: ops(o)["embed"]["launches"][0].update(gird=[1, 1, 1]),
     ["$.ops.embed.launches[0].gird"], "unknown key 'gird'"),
    ("wrong-format", lambda o: o.update(format="kern-manifest/2"), ["$.format"], "kern-manifest/1"),
    ("unknown-module", lambda o: ops(o)["embed"]["launches"][0].update(module="embedding"),
     ["$.ops.embed.launches[0].module"], "unknown module 'embedding'"),
    ("bad-module-hash", lambda o: o["modules"].update(embed="ABC"), ["$.modules.embed"], "64 lowercase hex"),
    ("unknown-buffer-in-call", lambda o: step_calls(o)[0]["args"].update(table="embeddings"),
     ["$.programs.step.calls[0].args.table"], "unknown buffer or state 'embeddings'"),
    ("unknown-op-in-call", lambda o: step_calls(o)[1].update(op="layernorm"),
     ["$.programs.step.calls[1].op"], "unknown op 'layernorm'"),
    ("missing-call-arg", lambda o: step_calls(o)[0]["args"].pop("ids"),
     ["$.programs.step.calls[0].args"], "missing argument 'ids'"),
    ("extra-call-arg", lambda o: step_calls(o)[0]["args"].update(bogus="hidden"),
     ["$.programs.step.calls[0].args.bogus"], "no argument 'bogus'"),
    ("unknown-dtype", lambda o: o["buffers"]["hidden"].update(dtype="bfloat16"), ["$.buffers.hidden.dtype"],
     "unknown dtype 'bfloat16'"),
    ("param-size-mismatch", lambda o: ops(o)["rmsnorm"]["launches"][0]["params"].__setitem__(3, [24, 4]),
     ["$.ops.rmsnorm.launches[0].args[3]"], "wiring is 8 bytes but param 3 is 4 bytes"),
    ("params-overlap", lambda o: ops(o)["embed"]["launches"][0]["params"].__setitem__(1, [4, 8]),
     ["$.ops.embed.launches[0].params[1]"], "ascending"),
    ("wiring-count", lambda o: ops(o)["embed"]["launches"][0]["args"].pop(),
     ["$.ops.embed.launches[0].args"], "5 wirings for 6 params"),
    ("int-wiring-without-type", lambda o: ops(o)["embed"]["launches"][0]["args"].__setitem__(3, {"arg": "n_tokens"}),
     ["$.ops.embed.launches[0].args[3]"], "'type'"),
    ("i32-literal-overflow", lambda o: ops(o)["embed"]["launches"][0]["args"].__setitem__(4, {"i32": 2**31}),
     ["$.ops.embed.launches[0].args[4].i32"], "does not fit i32"),
    ("bind-gap", lambda o: o["buffers"]["w_qkv.0"].update(shape=[160, 64]), [f"{QKV}.bind"],
     "gap: the segments fill 128 rows of the buffer's 160"),
    ("bind-overfill", lambda o: o["buffers"]["w_qkv.0"]["bind"][0].update(shape=[96, 64]), [f"{QKV}.bind"],
     "overlap: the segments fill 160 rows"),
    ("bind-row-width", lambda o: o["buffers"]["w_qkv.0"]["bind"][1].update(shape=[32, 32]), [f"{QKV}.bind[1].shape"],
     "row width mismatch"),
    ("derived-not-alone", lambda o: o["buffers"]["rope"]["bind"].append({"tensor": "x"}),
     ['$.buffers.rope.bind[0]'], "only segment"),
    ("weight-without-bind", lambda o: o["buffers"]["embed"].pop("bind"), ["$.buffers.embed"], "needs 'bind'"),
    ("bind-on-workspace", lambda o: o["buffers"]["hidden"].update(bind=[{"derived": True}]),
     ["$.buffers.hidden.bind"], "only weight buffers"),
    ("when-overlap", lambda o: ops(o)["gemm"]["launches"][1].update(when={"tokens": [1, 64]}),
     ["$.ops.gemm.launches[1].when"], "overlaps launch 0 at tokens=[1, 1]"),
    ("when-hole", lambda o: ops(o)["gemm"]["launches"][1].update(when={"tokens": [3, 64]}),
     ["$.ops.gemm.launches[0].when"], "leave tokens=2 uncovered"),
    ("when-undeclared-var", lambda o: ops(o)["gemm"]["launches"][0].update(when={"rows": [1, 1]}),
     ["$.ops.gemm.launches[0].when.rows", "$.ops.gemm.launches[1].when"], "undeclared var 'rows'"),
    ("undeclared-var", lambda o: ops(o)["embed"]["launches"][0]["grid"].__setitem__(0, "ntok"),
     ["$.ops.embed.launches[0].grid[0]"], "undeclared var(s) ntok"),
    ("negative-size", lambda o: o["buffers"]["hidden"]["shape"].__setitem__(0, "tokens - 2"),
     ["$.buffers.hidden.shape[0]"], "is -1 at tokens=1"),
    ("not-largest-at-max", lambda o: o["buffers"]["hidden"]["shape"].__setitem__(0, "65 - tokens"),
     ["$.buffers.hidden.shape[0]"], "must be largest there"),
    ("i64-overflow", lambda o: ops(o)["argmax"]["scratch"].update(part_val="tokens * 9223372036854775807"),
     ["$.ops.argmax.scratch.part_val"], "outside the signed 64-bit range"),
    ("zero-divisor-at-extreme", lambda o: ops(o)["embed"]["launches"][0]["grid"].__setitem__(0, "tokens // (seqs - 1)"),
     ["$.ops.embed.launches[0].grid[0]"], "divisor is 0"),
    ("block-too-large", lambda o: ops(o)["embed"]["launches"][0].update(block=[2048, 1, 1]),
     ["$.ops.embed.launches[0].block"], "CUDA allows 1024"),
    ("int-arg-overflows-i32", lambda o: step_calls(o)[0]["args"].update(n_tokens="tokens * 100000000"),
     ["$.programs.step.calls[0].args.n_tokens"], "to fit i32"),
    ("offset-past-end", lambda o: step_calls(o)[3]["args"].update(w={"buffer": "embed", "offset": 40000}),
     ["$.programs.step.calls[3].args.w.offset"], "must be in [0, 32768]"),
    ("unknown-scratch", lambda o: ops(o)["argmax"]["launches"][0]["args"].__setitem__(3, {"scratch": "partials"}),
     ["$.ops.argmax.launches[0].args[3].scratch"], "unknown scratch 'partials'"),
    ("unknown-rank-group", lambda o: ops(o)["embed"]["launches"][0]["args"].__setitem__(4, {"rank": "tp", "type": "i32"}),
     ["$.ops.embed.launches[0].args[4].rank"], "unknown topology group 'tp'"),
    ("extern-arg-count", lambda o: ops(o)["gemm"]["launches"][0]["args"].pop(),
     ["$.ops.gemm.launches[0].args"], "takes 6 to 8 arguments, got 5"),
    ("unknown-extern", lambda o: ops(o)["gemm"]["launches"][0].update(extern="cublaslt_f16_tn"),
     ["$.ops.gemm.launches[0].extern"], "unknown extern op"),
    ("algo-on-cublas", lambda o: ops(o)["gemm"]["launches"][0].update(extern="cublas_bf16_tn_f32"),
     ["$.ops.gemm.launches[0].algo"], "not a cuBLASLt extern"),
    ("program-cycle", lambda o: step_calls(o).append({"program": "decode"}),
     ["$.programs.decode.calls[0].program"], "program cycle step -> decode -> step"),
    ("missing-program", lambda o: o["programs"]["decode"]["calls"].__setitem__(0, {"program": "forward"}),
     ["$.programs.decode.calls[0].program"], "unknown program 'forward'"),
    ("graph-on-once", lambda o: o["programs"]["load"].update(graph=True), ["$.programs.load.graph"],
     "only run programs are captured"),
    ("derive-without-sources", lambda o: o["programs"]["load"].update(kind="derive"), ["$.programs.load"],
     "needs 'sources'"),
    ("digest-mismatch", lambda o: o.update(digest="0" * 64), ["$.digest"], "recompute it"),
    ("page-tokens-differ", lambda o: _add_state(o, "kv.1", {"kind": "paged", "bytes_per_token": 128,
                                                             "page_tokens": 32}),
     ['$.states["kv.1"].page_tokens'], "share one page_tokens"),
    ("paged-state-missing-field", lambda o: o["states"]["kv.0"].pop("page_tokens"), ['$.states["kv.0"]'],
     "needs 'page_tokens'"),
    ("fixed-field-on-paged", lambda o: o["states"]["kv.0"].update(bytes=64), ['$.states["kv.0"].bytes'],
     "does not belong to a paged state"),
    ("buffer-state-same-name", lambda o: _add_state(o, "hidden", {"kind": "fixed", "bytes": 64}),
     ["$.buffers.hidden"], "names both a buffer and a state"),
    ("var-min-above-max", lambda o: o["vars"]["seqs"].update(min=8), ["$.vars.seqs"], "min 8 > max 4"),
    ("var-name-with-dash", lambda o: o["vars"].update({"n-seqs": {"min": 1, "max": 2}}), ['$.vars["n-seqs"]'],
     "must match"),
]


@pytest.mark.parametrize("source, path, words", [c[1:] for c in PARSE_CASES], ids=[c[0] for c in PARSE_CASES])
def test_malformed_manifest_is_a_parse_error(source: Any, path: str, words: str) -> None:
    assert_parse_fault(source if isinstance(source, str) else text_of(source), path, words)


@pytest.mark.parametrize("change, paths, words", [c[1:] for c in VERIFY_CASES], ids=[c[0] for c in VERIFY_CASES])
def test_inconsistent_manifest_is_a_verify_error(change: Callable[[dict[str, Any]], Any], paths: list[str],
                                                 words: str) -> None:
    assert_verify_faults(mutated(change), paths, words)


def test_every_fault_is_reported_not_only_the_first() -> None:
    def three(o: dict[str, Any]) -> None:
        o["buffers"]["hidden"]["dtype"] = "bfloat16"
        ops(o)["embed"]["launches"][0]["module"] = "nope"
        o["programs"]["decode"]["calls"][0] = {"program": "gone"}

    with pytest.raises(ManifestVerifyError) as info:
        verify(parse_manifest(mutated(three)))
    assert info.value.faults == [
        Fault("$.buffers.hidden.dtype", "unknown dtype 'bfloat16'; use one of bf16, f16, f32, f64, i8, u8, i16, i32, "
                                        "u32, i64, u64, fp8_e4m3, fp8_e5m2"),
        Fault("$.ops.embed.launches[0].module", "unknown module 'nope'; declare it in $.modules (known: embed, norm, "
                                                "rope, argmax)"),
        Fault("$.programs.decode.calls[0].program", "unknown program 'gone'"),
    ]
    assert str(info.value).splitlines()[0] == "manifest has 3 fault(s):"


def test_there_are_at_least_25_distinct_malformed_manifests() -> None:
    assert len(PARSE_CASES) + len(VERIFY_CASES) >= 25
    assert len({c[0] for c in PARSE_CASES + VERIFY_CASES}) == len(PARSE_CASES) + len(VERIFY_CASES)


def test_verify_remembers_a_passed_manifest_object_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """verify() of a Manifest object that already passed returns without checking again (manifests are frozen);
    an equal but distinct object is checked, and a failing one is checked (and fails) every time."""
    import sys

    module = sys.modules["kern_manifest.verify"]
    calls: list[int] = []
    real = module.find_faults
    monkeypatch.setattr(module, "find_faults", lambda m: calls.append(id(m)) or real(m))
    good = parse_manifest(json.dumps(EXAMPLE))
    verify(good)
    verify(good)
    assert calls == [id(good)]
    other = parse_manifest(json.dumps(EXAMPLE))
    verify(other)
    assert len(calls) == 2
    bad = parse_manifest(text_of(lambda o: ops(o).pop("argmax")))  # a call to an op that is gone
    for _ in range(2):
        with pytest.raises(ManifestVerifyError):
            verify(bad)
    assert len(calls) == 4


def test_group_sizes_and_rank_encodings_are_bounded() -> None:
    """A topology group of 2^40 ranks is a fault at its size (at most 65,536, so a rank fits every wiring type)."""
    def group(size: int):
        def change(o: dict) -> None:
            o["topology"] = {"tp": {"size": size}}
            ops(o)["embed"]["launches"][0]["args"][4] = {"rank": "tp", "type": "i32"}
        return change
    assert_verify_faults(mutate(EXAMPLE, group(2**40)), ["$.topology.tp.size"], "it must be 1..65536")
    obj = mutate(EXAMPLE, group(4))
    verify(parse_manifest(obj))  # the same wiring in a group of 4 verifies


def test_a_launch_with_the_box_of_the_one_before_continues_it() -> None:
    """[A(1..1), B(2..64), B2(2..64)] verifies: B2 continues B (one alternative of two launches); a third range
    after it that overlaps is still an overlap, and a continuation of a launch two places back is not one."""
    def add(launches: list[dict[str, Any]], *whens: list[int]) -> None:
        for w in whens:
            launches.append({**launches[1], "when": {"tokens": w}})

    verify(parse_manifest(json.dumps(mutated(lambda o: add(ops(o)["gemm"]["launches"], [2, 64])))))
    verify(parse_manifest(json.dumps(mutated(lambda o: add(ops(o)["gemm"]["launches"], [2, 64], [2, 64])))))
    assert_verify_faults(mutated(lambda o: add(ops(o)["gemm"]["launches"], [2, 64], [1, 1], [2, 64], [2, 3])),
                         ["$.ops.gemm.launches[5].when"], "leave tokens=1 uncovered")
    assert_verify_faults(mutated(lambda o: add(ops(o)["gemm"]["launches"], [1, 1], [2, 64], [3, 64])),
                         ["$.ops.gemm.launches[4].when"], "uncovered")
