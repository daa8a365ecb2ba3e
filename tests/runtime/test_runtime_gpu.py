"""kern-runtime on a GPU: small manifests written here, cubins from tests/runtime/kernels/*.cu.

Run on the H200:  KERN_REQUIRE_GPU=1 python3 -m pytest tests/runtime -q   (after `source tools/gpu-env.sh`)
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from runtime_helpers import KERNELS_DIR, base_manifest, write_bf16_file

from kern_runtime import (
    ApiError, Capacity, KernelArtifactError, Runtime, SafetensorsTensors, WeightArtifactError,
)

pytestmark = pytest.mark.gpu


# ---------------------------------------------------------------- helpers


def kernels_dir(tmp_path: Path, **modules: str) -> tuple[Path, dict[str, str]]:
    """Copy `<file>.cubin` of tests/runtime/kernels as `<module>-<sha12>.cubin`; return (dir, pins)."""
    out = tmp_path / "kernels"
    out.mkdir(exist_ok=True)
    pins = {}
    for module, stem in modules.items():
        data = (KERNELS_DIR / f"{stem}.cubin").read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        shutil.copyfile(KERNELS_DIR / f"{stem}.cubin", out / f"{module}-{digest[:12]}.cubin")
        pins[module] = digest
    return out, pins


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)


def from_bf16_bits(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


SCALE = {
    "args": [{"name": "x", "kind": "ptr"}, {"name": "y", "kind": "ptr"}, {"name": "n", "kind": "int"}],
    "launches": [{"module": "toy", "entry": "kern_scale", "grid": ["cdiv(tokens * 4, 128)", 1, 1], "block": [128, 1, 1],
                  "params": [[0, 8], [8, 8], [16, 4], [20, 4]],
                  "args": [{"arg": "x"}, {"arg": "y"}, {"arg": "n", "type": "i32"}, {"f32": 2.0}]}],
}
ADD = {
    "args": [{"name": "p", "kind": "ptr"}, {"name": "q", "kind": "ptr"}, {"name": "out", "kind": "ptr"},
             {"name": "n", "kind": "int"}],
    "launches": [{"module": "toy", "entry": "kern_add", "grid": ["cdiv(tokens * 4, 128)", 1, 1], "block": [128, 1, 1],
                  "params": [[0, 8], [8, 8], [16, 8], [24, 4]],
                  "args": [{"arg": "p"}, {"arg": "q"}, {"arg": "out"}, {"arg": "n", "type": "i32"}]}],
}


def two_kernel_manifest(pins: dict[str, str], graph: bool = True) -> dict:
    return {
        "format": "kern-manifest/1", "name": "two-kernels",
        "vars": {"tokens": {"min": 1, "max": 64}, "seqs": {"min": 1, "max": 4}},
        "modules": pins,
        "buffers": {
            "x": {"kind": "input", "dtype": "f32", "shape": ["tokens", 4]},
            "t": {"kind": "workspace", "dtype": "f32", "shape": ["tokens", 4]},
            "y": {"kind": "output", "dtype": "f32", "shape": ["tokens", 4]},
        },
        "ops": {"scale": SCALE, "add": ADD},
        "programs": {"step": {"graph": graph, "calls": [
            {"op": "scale", "args": {"x": "x", "y": "t", "n": "tokens * 4"}},
            {"op": "add", "args": {"p": "t", "q": "x", "out": "y", "n": "tokens * 4"}},
        ]}},
    }


# ---------------------------------------------------------------- kernels, graphs, ABI


def test_two_kernel_program_eager_and_graph_are_bit_identical(tmp_path: Path) -> None:
    kdir, pins = kernels_dir(tmp_path, toy="toy")
    with Runtime.load(two_kernel_manifest(pins), kdir, None) as rt:
        x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
        rt.write_input("x", x)
        rt.run("step", {"tokens": 5})
        eager = rt.read_output("y", rows=5)
        np.testing.assert_allclose(eager, 2 * x + 1 + x, rtol=1e-6)
        rt.issue("step", {"tokens": 5})
        graph = rt.read_output("y", rows=5)
        assert eager.tobytes() == graph.tobytes()
        assert rt.graph_keys == [("step", (("tokens", 5),))]
        rt.issue("step", {"tokens": 5, "seqs": 3})  # seqs is not read: same graph
        assert len(rt.graph_keys) == 1
        d = rt.describe()
        assert d["programs"]["step"]["calls"] == 2 and d["programs"]["step"]["vars_read"] == ["tokens"]
        assert {l["entry"] for l in d["launches"]} == {"kern_scale", "kern_add"}


def test_capture_leaves_other_threads_free_to_allocate(tmp_path: Path) -> None:
    """The graph capture is thread-local: another thread's cuMemAlloc during it succeeds (global mode refuses it
    and invalidates the capture), and the captured graph still replays what was enqueued."""
    import threading

    from cuda.bindings import driver as cu

    from kern_runtime.cuda.graphs import GraphCache

    kdir, pins = kernels_dir(tmp_path, toy="toy")
    with Runtime.load(two_kernel_manifest(pins), kdir, None) as rt:
        rt.write_input("x", np.ones((5, 4), np.float32))
        address = int(rt.address_of("x"))
        seen: list[Any] = []

        def allocate() -> None:
            cu.cuCtxSetCurrent(rt.context)
            err, ptr = cu.cuMemAlloc(1 << 20)
            seen.append(err)
            if err == cu.CUresult.CUDA_SUCCESS:
                cu.cuMemFree(ptr)

        def enqueue() -> None:
            (err,) = cu.cuMemsetD8Async(address, 0, 5 * 4 * 4, rt.stream)
            assert err == cu.CUresult.CUDA_SUCCESS
            other = threading.Thread(target=allocate)
            other.start()
            other.join()

        cache = GraphCache()
        try:
            assert cache.replay(("memset", ()), enqueue, rt.stream) is True
            rt.synchronize()
        finally:
            cache.close()
        assert seen == [cu.CUresult.CUDA_SUCCESS]
        assert not rt.read_buffer("x", rows=5).any()  # the captured memset ran


def test_graph_keys_follow_read_vars(tmp_path: Path) -> None:
    kdir, pins = kernels_dir(tmp_path, toy="toy")
    fill = {"args": [{"name": "y", "kind": "ptr"}],
            "launches": [{"module": "toy", "entry": "kern_fill", "grid": [1, 1, 1], "block": [64, 1, 1],
                          "params": [[0, 8], [8, 4], [12, 4]],
                          "args": [{"arg": "y"}, {"expr": "tokens", "type": "i32"}, {"i32": 8}]}]}
    m = two_kernel_manifest(pins)
    m["ops"] = {"fill": fill}
    m["programs"] = {"fill": {"graph": True, "calls": [{"op": "fill", "args": {"y": "y"}}]}}
    with Runtime.load(m, kdir, None) as rt:
        expected = lambda v: np.array([v * 1000 + i for i in range(8)], np.float32)  # noqa: E731
        for tokens, seqs in [(3, 1), (3, 4), (5, 1), (3, 2)]:
            rt.issue("fill", {"tokens": tokens, "seqs": seqs})
            np.testing.assert_array_equal(rt.read_output("y").reshape(-1)[:8], expected(tokens))
        assert sorted(rt.graph_keys) == [("fill", (("tokens", 3),)), ("fill", (("tokens", 5),))]
        rt.issue("fill", {"tokens": 7}, eager=True)
        np.testing.assert_array_equal(rt.read_output("y").reshape(-1)[:8], expected(7))
        assert len(rt.graph_keys) == 2


def test_abi_mismatch_is_refused_at_load(tmp_path: Path) -> None:
    kdir, pins = kernels_dir(tmp_path, toy="toy")
    m = two_kernel_manifest(pins)
    bad = json.loads(json.dumps(ADD))
    bad["launches"][0]["params"] = [[0, 8], [8, 8], [16, 8], [24, 8]]
    bad["launches"][0]["args"][3] = {"arg": "n", "type": "i64"}
    m["ops"]["add"] = bad
    with pytest.raises(KernelArtifactError, match=r"entry 'kern_add'.*ABI mismatch.*\[\[0, 8\], \[8, 8\], \[16, 8\], \[24, 4\]\]"):
        Runtime.load(m, kdir, None)


def test_missing_and_mismatched_cubins(tmp_path: Path) -> None:
    kdir, pins = kernels_dir(tmp_path, toy="toy")
    m = two_kernel_manifest({"toy": "0" * 64})
    with pytest.raises(KernelArtifactError, match="module 'toy'.*missing"):
        Runtime.load(m, kdir, None)


def test_same_named_entries_resolve_by_layout(tmp_path: Path) -> None:
    kdir, pins = kernels_dir(tmp_path, sa="same_a", sb="same_b")
    def op(module, params, args):
        return {"args": [{"name": "y", "kind": "ptr"}],
                "launches": [{"module": module, "entry": "kern_same", "grid": [1, 1, 1], "block": [32, 1, 1],
                              "params": params, "args": args}]}
    m = two_kernel_manifest(pins)
    m["buffers"]["z"] = {"kind": "output", "dtype": "f32", "shape": [8]}
    m["ops"] = {"a": op("sa", [[0, 8], [8, 4]], [{"arg": "y"}, {"i32": 8}]),
                "b": op("sb", [[0, 8], [8, 8], [16, 4]], [{"arg": "y"}, {"i64": 8}, {"f32": 7.0}])}
    m["programs"] = {"p": {"calls": [{"op": "a", "args": {"y": "z"}}, {"op": "b", "args": {"y": "y"}}]}}
    with Runtime.load(m, kdir, None) as rt:
        rt.run("p")
        np.testing.assert_array_equal(rt.read_output("z"), np.ones(8, np.float32))
        np.testing.assert_array_equal(rt.read_output("y").reshape(-1)[:8], np.full(8, 7.0, np.float32))
    m["ops"]["a"]["launches"][0]["module"] = "sb"  # variant A's layout against module B
    with pytest.raises(KernelArtifactError, match="ABI mismatch"):
        Runtime.load(m, kdir, None)


def test_dynamic_shared_memory_above_48k(tmp_path: Path) -> None:
    kdir, pins = kernels_dir(tmp_path, toy="toy")
    m = two_kernel_manifest(pins)
    m["ops"]["big"] = {"args": [{"name": "x", "kind": "ptr"}, {"name": "y", "kind": "ptr"}],
                       "launches": [{"module": "toy", "entry": "kern_big_shared", "grid": ["cdiv(tokens * 4, 128)", 1, 1],
                                     "block": [128, 1, 1], "shared_mem": 65536, "params": [[0, 8], [8, 8], [16, 4]],
                                     "args": [{"arg": "x"}, {"arg": "y"}, {"expr": "tokens * 4", "type": "i32"}]}]}
    m["programs"]["big"] = {"calls": [{"op": "big", "args": {"x": "x", "y": "y"}}]}
    with Runtime.load(m, kdir, None) as rt:
        x = np.arange(40, dtype=np.float32).reshape(10, 4)
        rt.write_input("x", x)
        rt.run("big", {"tokens": 10})
        np.testing.assert_array_equal(rt.read_output("y", rows=10), x)


@pytest.mark.parametrize("graph", [False, True])
def test_shared_memory_limit_is_the_largest_over_ops_of_one_function(tmp_path: Path, graph: bool) -> None:
    """One function launched by two ops with different dynamic shared memory above 48 KiB: the limit must
    be the larger (the op with 100 KiB comes first, the 64 KiB op last: raising the limit per launch would
    leave 64 KiB and the 100 KiB launch would fail with CUDA_ERROR_INVALID_VALUE)."""
    kdir, pins = kernels_dir(tmp_path, toy="toy")
    m = two_kernel_manifest(pins, graph=graph)
    for name, smem in (("big", 100 * 1024), ("small", 65536)):
        m["ops"][name] = {"args": [{"name": "x", "kind": "ptr"}, {"name": "y", "kind": "ptr"}],
                          "launches": [{"module": "toy", "entry": "kern_big_shared",
                                        "grid": ["cdiv(tokens * 4, 128)", 1, 1], "block": [128, 1, 1],
                                        "shared_mem": smem, "params": [[0, 8], [8, 8], [16, 4]],
                                        "args": [{"arg": "x"}, {"arg": "y"}, {"expr": "tokens * 4", "type": "i32"}]}]}
        m["programs"][name] = {"calls": [{"op": name, "args": {"x": "x", "y": "y"}}], "graph": graph}
    with Runtime.load(m, kdir, None) as rt:
        x = np.arange(40, dtype=np.float32).reshape(10, 4)
        rt.write_input("x", x)
        for name in ("big", "small", "big"):
            rt.run(name, {"tokens": 10})
            np.testing.assert_array_equal(rt.read_output("y", rows=10), x)


def function_carveout(fn: Any) -> int:
    from cuda.bindings import driver

    err, value = driver.cuFuncGetAttribute(
        driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, fn)
    assert err == driver.CUresult.CUDA_SUCCESS, err
    return int(value)


def test_preferred_carveout_is_set_on_the_function_at_load(tmp_path: Path) -> None:
    """`carveout` sets the function's CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT at load: kern_scale,
    launched by two ops of which one gives 100 and one gives none, gets 100; kern_add (none) keeps the driver's
    default; kern_big_shared gets its 50 beside its raised shared memory limit. Results are unchanged."""
    kdir, pins = kernels_dir(tmp_path, toy="toy")
    default = two_kernel_manifest(pins, graph=False)
    m = copy.deepcopy(default)
    m["ops"]["scale"]["launches"][0]["carveout"] = 100
    m["ops"]["scale_again"] = copy.deepcopy(default["ops"]["scale"])
    m["programs"]["again"] = {"calls": [{"op": "scale_again", "args": {"x": "x", "y": "t", "n": "tokens * 4"}}]}
    m["ops"]["big"] = {"args": [{"name": "x", "kind": "ptr"}, {"name": "y", "kind": "ptr"}],
                       "launches": [{"module": "toy", "entry": "kern_big_shared", "grid": ["cdiv(tokens * 4, 128)", 1, 1],
                                     "block": [128, 1, 1], "shared_mem": 100 * 1024, "carveout": 50,
                                     "params": [[0, 8], [8, 8], [16, 4]],
                                     "args": [{"arg": "x"}, {"arg": "y"}, {"expr": "tokens * 4", "type": "i32"}]}]}
    m["programs"]["big"] = {"calls": [{"op": "big", "args": {"x": "x", "y": "y"}}]}
    with Runtime.load(default, kdir, None) as rt:
        driver_default = function_carveout(rt._functions[("add", 0)])
    assert driver_default not in (50, 100)
    with Runtime.load(m, kdir, None) as rt:
        assert function_carveout(rt._functions[("scale", 0)]) == 100
        assert function_carveout(rt._functions[("scale_again", 0)]) == 100
        assert function_carveout(rt._functions[("add", 0)]) == driver_default
        assert function_carveout(rt._functions[("big", 0)]) == 50
        x = np.arange(40, dtype=np.float32).reshape(10, 4)
        rt.write_input("x", x)
        rt.run("big", {"tokens": 10})
        np.testing.assert_array_equal(rt.read_output("y", rows=10), x)
        rt.run("step", {"tokens": 10})
        np.testing.assert_allclose(rt.read_output("y", rows=10), 2 * x + 1 + x, rtol=1e-6)


@pytest.mark.parametrize("graph", [False, True])
def test_cluster_launch_through_cuLaunchKernelEx(tmp_path: Path, graph: bool) -> None:
    """`cluster: [c, 1, 1]` launches thread-block clusters (cuLaunchKernelEx): each block reads its cluster
    size and rank from %cluster_nctarank / %cluster_ctarank; without the field, clusters of one."""
    kdir, pins = kernels_dir(tmp_path, toy="toy")
    m = base_manifest(modules=pins, buffers={"out": {"kind": "output", "dtype": "i32", "shape": [16]}})

    def op(cluster: list[Any] | None) -> dict[str, Any]:
        launch = {"module": "toy", "entry": "kern_cluster_rank", "grid": ["tokens", 1, 1], "block": [32, 1, 1],
                  "params": [[0, 8], [8, 4]], "args": [{"arg": "out"}, {"expr": "tokens", "type": "i32"}]}
        if cluster is not None:
            launch["cluster"] = cluster
        return {"args": [{"name": "out", "kind": "ptr"}], "launches": [launch]}

    m["vars"] = {"tokens": {"min": 4, "max": 16}}
    m["ops"] = {"c4": op([4, 1, 1]), "c2": op([2, 1, 1]), "c1": op(None)}
    m["programs"] = {name: {"graph": graph, "calls": [{"op": name, "args": {"out": "out"}}]} for name in m["ops"]}
    with Runtime.load(m, kdir, None) as rt:
        for name, c in (("c4", 4), ("c2", 2), ("c1", 1)):
            rt.issue(name, {"tokens": 16})
            got = rt.read_output("out")
            np.testing.assert_array_equal(got, 100 * c + np.arange(16) % c, err_msg=f"cluster {c}")


def test_api_errors(tmp_path: Path) -> None:
    kdir, pins = kernels_dir(tmp_path, toy="toy")
    with Runtime.load(two_kernel_manifest(pins), kdir, None) as rt:
        with pytest.raises(ApiError, match="unknown program 'nope'"):
            rt.issue("nope", {"tokens": 1})
        with pytest.raises(ApiError, match="outside"):
            rt.issue("step", {"tokens": 65})
        with pytest.raises(ApiError, match="unknown buffer"):
            rt.read_buffer("nope")
        with pytest.raises(ApiError, match="is an input buffer, expected output"):
            rt.read_output("x")
        with pytest.raises(ApiError, match="is f32"):
            rt.write_input("x", np.zeros((2, 4), np.float64))
        with pytest.raises(ApiError, match="holds up to"):
            rt.write_input("x", np.zeros((65, 4), np.float32))


def test_async_readback(tmp_path: Path) -> None:
    kdir, pins = kernels_dir(tmp_path, toy="toy")
    with Runtime.load(two_kernel_manifest(pins, graph=False), kdir, None) as rt:
        x = np.ones((3, 4), np.float32)
        rt.write_input("x", x)
        rt.issue("step", {"tokens": 3})
        handle = rt.read_output_async("y", rows=3)
        np.testing.assert_array_equal(handle.wait(), np.full((3, 4), 4.0, np.float32))
        assert handle.ready()


def test_pooled_and_fixed_states(tmp_path: Path) -> None:
    kdir, pins = kernels_dir(tmp_path, toy="toy")
    m = two_kernel_manifest(pins, graph=False)
    m["states"] = {"kv": {"kind": "paged", "bytes_per_token": 4096, "page_tokens": 16},
                   "rec": {"kind": "per_seq", "bytes_per_seq": 1 << 20}, "flags": {"kind": "fixed", "bytes": 256}}
    m["programs"]["via_state"] = {"calls": [
        {"op": "scale", "args": {"x": "x", "y": "kv", "n": "tokens * 4"}},
        {"op": "scale", "args": {"x": "kv", "y": "y", "n": "tokens * 4"}}]}
    with Runtime.load(m, kdir, None, capacity=Capacity(tokens=1000, seqs=2)) as rt:
        assert rt.page_tokens == 16 and rt.num_pages >= 1000 // 16 + 1 and rt.scratch_page_id == 0
        assert rt.describe()["states"]["kv"]["bytes"] >= rt.num_pages * 16 * 4096
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        rt.write_input("x", x)
        rt.run("via_state", {"tokens": 2})
        np.testing.assert_array_equal(rt.read_output("y", rows=2), 2 * (2 * x + 1) + 1)


def test_pages_of_is_resolved_at_load_and_captured_as_a_constant(tmp_path: Path) -> None:
    """{"pages_of": "kv"} reaches the kernel as the pages of kv's reserved range (kern_fill writes v * 1000 + i),
    in a graph whose key reads no var."""
    kdir, pins = kernels_dir(tmp_path, toy="toy")
    fill = {"args": [{"name": "y", "kind": "ptr"}, {"name": "v", "kind": "int"}],
            "launches": [{"module": "toy", "entry": "kern_fill", "grid": [1, 1, 1], "block": [64, 1, 1],
                          "params": [[0, 8], [8, 4], [12, 4]],
                          "args": [{"arg": "y"}, {"arg": "v", "type": "i32"}, {"i32": 8}]}]}
    m = two_kernel_manifest(pins)
    m["states"] = {"kv": {"kind": "paged", "bytes_per_token": 4096, "page_tokens": 16},
                   "kv2": {"kind": "paged", "bytes_per_token": 1024, "page_tokens": 16}}
    m["ops"] = {"fill": fill}
    m["programs"] = {"fill": {"graph": True, "calls": [{"op": "fill", "args": {"y": "y", "v": {"pages_of": "kv"}}}]},
                     "fill2": {"calls": [{"op": "fill", "args": {"y": "y", "v": {"pages_of": "kv2"}}}]}}
    with Runtime.load(m, kdir, None, capacity=Capacity(tokens=1000, seqs=1)) as rt:
        pages = rt.reserved_pages
        assert pages["kv"] == rt.pool.reserve_bytes // (16 * 4096) >= rt.num_pages
        assert pages["kv2"] == rt.pool.reserve_bytes // (16 * 1024) == 4 * pages["kv"]
        assert pages["kv2"] * 1000 + 8 < 2**24  # exact in float32
        expected = lambda v: np.array([v * 1000 + i for i in range(8)], np.float32)  # noqa: E731
        for tokens in (1, 5):
            rt.issue("fill", {"tokens": tokens})
            np.testing.assert_array_equal(rt.read_output("y").reshape(-1)[:8], expected(pages["kv"]))
        assert rt.graph_keys == [("fill", ())]
        rt.run("fill2", {"tokens": 1})
        np.testing.assert_array_equal(rt.read_output("y").reshape(-1)[:8], expected(pages["kv2"]))


# ---------------------------------------------------------------- GEMMs


def gemm_manifest(extern: str, n: int, k: int, ldc: int, lda: int, col_offset: int, out_dtype: str, graph: bool) -> dict:
    args = [{"arg": "a"}, {"arg": "w"}, {"arg": "c", "offset": col_offset * (4 if out_dtype == "f32" else 2)},
            {"expr": "tokens", "type": "i32"}, {"i32": n}, {"i32": k}, {"i32": ldc}]
    if extern != "cublas_bf16_tn_f32":
        args.append({"i32": lda})
    return {
        "format": "kern-manifest/1", "name": "gemm", "vars": {"tokens": {"min": 1, "max": 128}}, "modules": {},
        "buffers": {"a": {"kind": "input", "dtype": "bf16", "shape": ["tokens", lda]},
                    "w": {"kind": "input", "dtype": "bf16", "shape": [n, k]},
                    "c": {"kind": "input", "dtype": out_dtype, "shape": ["tokens", ldc]}},
        "ops": {"gemm": {"args": [{"name": "a", "kind": "ptr"}, {"name": "w", "kind": "ptr"}, {"name": "c", "kind": "ptr"}],
                         "launches": [{"extern": extern, "args": args}]}},
        "programs": {"mm": {"graph": graph, "calls": [{"op": "gemm", "args": {"a": "a", "w": "w", "c": "c"}}]}},
    }


@pytest.mark.parametrize(
    ("extern", "m", "n", "k", "ldc_extra", "lda_extra", "col_offset"),
    [
        ("cublaslt_bf16_tn", 1, 64, 32, 0, 0, 0),
        ("cublaslt_bf16_tn", 7, 128, 96, 0, 0, 0),
        ("cublaslt_bf16_tn", 33, 256, 64, 64, 16, 32),  # strided output columns + strided A
        ("cublaslt_bf16_tn", 128, 80, 48, 0, 0, 0),
        ("cublaslt_bf16_tn_acc", 9, 64, 64, 32, 0, 16),
        ("cublas_bf16_tn_f32", 17, 96, 32, 8, 0, 8),
    ],
)
@pytest.mark.parametrize("graph", [False, True])
def test_gemm_against_numpy(tmp_path: Path, extern, m, n, k, ldc_extra, lda_extra, col_offset, graph) -> None:
    out_dtype = "f32" if extern.endswith("_f32") else "bf16"
    ldc, lda = n + ldc_extra + col_offset, k + lda_extra
    rng = np.random.default_rng(m * 1000 + n)
    # small integers: every product and sum is exact in fp32, only the final rounding remains
    a = rng.integers(-3, 4, (m, lda)).astype(np.float32)
    w = rng.integers(-3, 4, (n, k)).astype(np.float32)
    c0 = rng.integers(-50, 50, (m, ldc)).astype(np.float32)
    with Runtime.load(gemm_manifest(extern, n, k, ldc, lda, col_offset, out_dtype, graph), tmp_path, None) as rt:
        rt.write_input("a", to_bf16_bits(a))
        rt.write_input("w", to_bf16_bits(w))
        rt.write_input("c", c0 if out_dtype == "f32" else to_bf16_bits(c0))
        rt.issue("mm", {"tokens": m})
        got = rt.read_buffer("c", rows=m)
    product = a[:, :k] @ w.T
    want = c0.copy()
    band = slice(col_offset, col_offset + n)
    want[:, band] = product + (c0[:, band] if extern.endswith("_acc") else 0)
    if out_dtype == "f32":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_array_equal(got, to_bf16_bits(want))


E4M3_OF_INT = {0: 0x00, 1: 0x38, 2: 0x40, 3: 0x44}  # e4m3 (bias 7): 1 = 2^0, 2 = 2^1, 3 = 1.5 x 2^1


def to_e4m3_bits(x: np.ndarray) -> np.ndarray:
    """Integers in [-3, 3] as fp8 e4m3 bit patterns (exact)."""
    mag = np.vectorize(lambda v: E4M3_OF_INT[abs(int(v))])(x).astype(np.uint8)
    return np.where(x < 0, mag | 0x80, mag).astype(np.uint8)


@pytest.mark.parametrize("extern", ["cublaslt_fp8_tn", "cublaslt_fp8_tn_f32"])
@pytest.mark.parametrize("m", [16, 48])
@pytest.mark.parametrize("graph", [False, True])
def test_fp8_gemm_with_device_scales_against_numpy(tmp_path: Path, extern: str, m: int, graph: bool) -> None:
    """C = (a_scale * A) @ (w_scale * W)^T with e4m3 operands and the scales read from device memory
    (changing a scale buffer between replays changes the result without a reload)."""
    n, k = 64, 64
    out = "f32" if extern.endswith("_f32") else "bf16"
    args = [{"arg": n_} for n_ in ("a", "w", "c", "sa", "sw")] + [{"expr": "tokens", "type": "i32"}, {"i32": n}, {"i32": k}]
    manifest = {
        "format": "kern-manifest/1", "name": "fp8", "vars": {"tokens": {"min": 1, "max": 64}}, "modules": {},
        "buffers": {"a": {"kind": "input", "dtype": "fp8_e4m3", "shape": ["tokens", k]},
                    "w": {"kind": "input", "dtype": "fp8_e4m3", "shape": [n, k]},
                    "sa": {"kind": "input", "dtype": "f32", "shape": [1]},
                    "sw": {"kind": "input", "dtype": "f32", "shape": [1]},
                    "c": {"kind": "output", "dtype": out, "shape": ["tokens", n]}},
        "ops": {"gemm": {"args": [{"name": x, "kind": "ptr"} for x in ("a", "w", "c", "sa", "sw")],
                         "launches": [{"extern": extern, "args": args}]}},
        "programs": {"mm": {"graph": graph, "calls": [{"op": "gemm", "args": {x: x for x in ("a", "w", "c", "sa", "sw")}}]}},
    }
    rng = np.random.default_rng(m)
    a = rng.integers(-3, 4, (m, k)).astype(np.float32)
    w = rng.integers(-3, 4, (n, k)).astype(np.float32)
    with Runtime.load(manifest, tmp_path, None) as rt:
        rt.write_input("a", to_e4m3_bits(a))
        rt.write_input("w", to_e4m3_bits(w))
        for sa, sw in ((1.0, 1.0), (0.5, 4.0), (2.0, 0.25)):
            rt.write_input("sa", np.asarray([sa], np.float32))
            rt.write_input("sw", np.asarray([sw], np.float32))
            rt.issue("mm", {"tokens": m})
            got = rt.read_output("c", rows=m)
            want = (sa * sw) * (a @ w.T)  # exact in fp32; a bf16 result is its round-to-nearest-even
            if out == "f32":
                np.testing.assert_array_equal(got, want)
            else:
                np.testing.assert_array_equal(got, to_bf16_bits(want))


def test_gemm_eager_and_graph_bit_identical(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    outs = []
    for graph in (False, True):
        with Runtime.load(gemm_manifest("cublaslt_bf16_tn", 256, 512, 256, 512, 0, "bf16", graph), tmp_path, None) as rt:
            rng = np.random.default_rng(5)
            rt.write_input("a", to_bf16_bits(rng.standard_normal((16, 512)).astype(np.float32)))
            rt.write_input("w", to_bf16_bits(rng.standard_normal((256, 512)).astype(np.float32)))
            rt.issue("mm", {"tokens": 16})
            outs.append(rt.read_buffer("c", rows=16))
    assert outs[0].tobytes() == outs[1].tobytes()


def test_inapplicable_algo_pin_is_refused(tmp_path: Path) -> None:
    m = gemm_manifest("cublaslt_bf16_tn", 64, 32, 64, 32, 0, "bf16", False)
    m["ops"]["gemm"]["launches"][0]["algo"] = {"id": 100000}
    with pytest.raises(KernelArtifactError, match="pinned cuBLASLt algo"):
        Runtime.load(m, tmp_path, None)


# ---------------------------------------------------------------- weights


def weights_manifest() -> dict:
    return {
        "format": "kern-manifest/1", "name": "weights", "vars": {"tokens": {"min": 1, "max": 4}}, "modules": {},
        "buffers": {
            "w_gate_up": {"kind": "weight", "dtype": "bf16", "shape": [2 * 4096, 256],
                          "bind": [{"interleave": ["gate", "up"], "rows": 64}]},
            "w_qkv": {"kind": "weight", "dtype": "bf16", "shape": [96 + 32 + 32, 256],
                      "bind": [{"tensor": "q"}, {"tensor": "k"}, {"tensor": "v"}]},
            "emb_part": {"kind": "weight", "dtype": "bf16", "shape": [100, 256],
                         "bind": [{"tensor": "emb", "rows": [50, 150]}]},
            "host_w": {"kind": "weight", "dtype": "bf16", "shape": [32, 256], "placement": "host",
                       "bind": [{"tensor": "k"}]},
        },
        "ops": {}, "programs": {"noop": {"calls": []}},
    }


def test_weights_from_sharded_checkpoint_byte_for_byte(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    t = {name: rng.integers(0, 2**16, shape, dtype=np.uint16) for name, shape in
         {"gate": (4096, 256), "up": (4096, 256), "q": (96, 256), "k": (32, 256), "v": (32, 256), "emb": (200, 256)}.items()}
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    write_bf16_file(ckpt / "model-00001-of-00002.safetensors", {"gate": t["gate"], "q": t["q"], "emb": t["emb"]})
    write_bf16_file(ckpt / "model-00002-of-00002.safetensors", {"up": t["up"], "k": t["k"], "v": t["v"]})
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "gate": "model-00001-of-00002.safetensors", "q": "model-00001-of-00002.safetensors",
        "emb": "model-00001-of-00002.safetensors", "up": "model-00002-of-00002.safetensors",
        "k": "model-00002-of-00002.safetensors", "v": "model-00002-of-00002.safetensors"}}))
    tensors = SafetensorsTensors.open(ckpt)
    progress = []
    rt = Runtime.load(weights_manifest(), tmp_path, tensors, progress=lambda d, n: progress.append((d, n)))
    gate_up = np.concatenate([np.concatenate([t["gate"][i:i + 64], t["up"][i:i + 64]]) for i in range(0, 4096, 64)])
    np.testing.assert_array_equal(rt.read_buffer("w_gate_up"), gate_up)
    np.testing.assert_array_equal(rt.read_buffer("w_qkv"), np.concatenate([t["q"], t["k"], t["v"]]))
    np.testing.assert_array_equal(rt.read_buffer("emb_part"), t["emb"][50:150])
    np.testing.assert_array_equal(rt.read_buffer("host_w"), t["k"])
    total = (2 * 4096 + 160 + 100 + 32) * 256 * 2
    assert rt.weight_load_stats[0] == total and progress[-1] == (total, total)
    # reuse between two manifests on the same GPU
    address = rt.address_of("w_gate_up")
    resident = rt.into_resident()
    m2 = weights_manifest()
    m2["buffers"]["w_qkv"]["bind"] = [{"tensor": "q"}, {"tensor": "v"}, {"tensor": "k"}]  # differs: reloaded
    with Runtime.load_over(resident, m2, tmp_path, tensors) as rt2:
        assert rt2.address_of("w_gate_up") == address
        np.testing.assert_array_equal(rt2.read_buffer("w_gate_up"), gate_up)
        np.testing.assert_array_equal(rt2.read_buffer("w_qkv"), np.concatenate([t["q"], t["v"], t["k"]]))
        # reloaded: w_qkv (bind differs, 160 rows) and host_w (host placement never reuses, 32 rows);
        # w_gate_up and emb_part are claimed from the resident set
        assert rt2.weight_load_stats[0] == (160 + 32) * 256 * 2


def test_weight_mismatch_names_the_tensor(tmp_path: Path) -> None:
    write_bf16_file(tmp_path / "m.safetensors", {"q": np.zeros((96, 128), np.uint16)})
    m = weights_manifest()
    m["buffers"] = {"w": {"kind": "weight", "dtype": "bf16", "shape": [96, 256], "bind": [{"tensor": "q"}]}}
    with pytest.raises(WeightArtifactError, match=r"tensor 'q' has shape \[96, 128\]"):
        Runtime.load(m, tmp_path, SafetensorsTensors.open(tmp_path / "m.safetensors"))


def segments_checkpoint(root: Path, big: bool) -> dict[str, np.ndarray]:
    """Two shards with the tensors `segments_manifest` binds (bf16 bits)."""
    rng = np.random.default_rng(11)
    shapes = {"g": (1536, 256), "u": (1536, 256), "x": (1536, 256), "o": (512, 3000), "down": (300, 4099),
              "emb": (200, 256)}
    if big:
        shapes["big"] = (2048, 4096)  # 16 MiB: a column slice larger than one staging buffer
    t = {name: rng.integers(0, 2**16, shape, dtype=np.uint16) for name, shape in shapes.items()}
    root.mkdir()
    first = [n for n in t if n in ("g", "o", "emb", "big")]
    second = [n for n in t if n not in first]
    write_bf16_file(root / "model-00001-of-00002.safetensors", {n: t[n] for n in first})
    write_bf16_file(root / "model-00002-of-00002.safetensors", {n: t[n] for n in second})
    weight_map = {n: "model-00001-of-00002.safetensors" for n in first}
    weight_map.update({n: "model-00002-of-00002.safetensors" for n in second})
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return t


def segments_manifest(t: dict[str, np.ndarray]) -> tuple[dict, dict[str, np.ndarray]]:
    """Weight buffers of every segment kind, with numpy's slicing of the checkpoint for each."""
    def interleave(names: list[str], r: int) -> np.ndarray:
        return np.concatenate([t[n][b:b + r] for b in range(0, t[names[0]].shape[0], r) for n in names])

    buffers: dict[str, dict] = {}
    want: dict[str, np.ndarray] = {}

    def add(name: str, bind: list[dict], expected: np.ndarray, **extra) -> None:
        buffers[name] = {"kind": "weight", "dtype": "bf16", "shape": list(expected.shape), "bind": bind, **extra}
        want[name] = expected

    add("w_gux", [{"interleave": ["g", "u", "x"], "rows": 64}], interleave(["g", "u", "x"], 64))
    add("w_gu1", [{"interleave": ["g", "u"], "rows": 1}], interleave(["g", "u"], 1))
    add("w_o_end", [{"tensor": "o", "cols": [1500, 3000], "shape": [512, 3000]}], t["o"][:, 1500:3000])
    add("w_o_mid", [{"tensor": "o", "rows": [100, 400], "cols": [37, 1037]}], t["o"][100:400, 37:1037])
    add("w_down", [{"tensor": "down", "cols": [2049, 4099]}, {"tensor": "down", "rows": [7, 8], "cols": [0, 2050]}],
        np.concatenate([t["down"][:, 2049:4099], t["down"][7:8, 0:2050]]))
    add("w_mix", [{"tensor": "emb", "rows": [50, 150]}, {"interleave": ["g", "x"], "rows": 512},
                  {"tensor": "u", "rows": [3, 5]}],
        np.concatenate([t["emb"][50:150], interleave(["g", "x"], 512), t["u"][3:5]]))
    add("h_cols", [{"tensor": "o", "rows": [1, 9], "cols": [2990, 3000]}], t["o"][1:9, 2990:3000], placement="host")
    if "big" in t:
        add("w_big", [{"tensor": "big", "cols": [1024, 3072]}], t["big"][:, 1024:3072])
    manifest = {"format": "kern-manifest/1", "name": "segments", "vars": {"tokens": {"min": 1, "max": 4}},
                "modules": {}, "buffers": buffers, "ops": {}, "programs": {"noop": {"calls": []}}}
    return manifest, want


@pytest.mark.parametrize(("staging", "threads", "big"), [(None, None, True), (None, 3, False), (10_000, 4, False),
                                                          (1 << 20, 1, False)])
def test_interleave_cols_rows_byte_for_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, staging, threads,
                                            big: bool) -> None:
    """interleave (3 tensors, rows 64 / 1 / 512), cols (row end, row range + odd offset, odd pitch,
    larger than a staging buffer) and rows segments, through 2-D copies from pinned staging, compared
    byte for byte with numpy slicing of the checkpoint; small staging sizes split the 2-D copies by
    rows and rows into 1-D pieces."""
    from kern_runtime.weights import loader

    if staging is not None:
        monkeypatch.setattr(loader, "STAGING_BYTES", staging)
    t = segments_checkpoint(tmp_path / "ckpt", big)
    tensors = SafetensorsTensors.open(tmp_path / "ckpt")
    manifest, want = segments_manifest(t)
    with Runtime.load(manifest, tmp_path, tensors, threads=threads) as rt:
        for name, expected in want.items():
            got = rt.read_buffer(name)
            assert got.dtype == np.uint16 and got.shape == expected.shape, name
            assert got.tobytes() == expected.tobytes(), f"buffer {name} differs from the checkpoint slice"
        assert rt.weight_load_stats[0] == sum(w.nbytes for w in want.values())
        assert {"read", "staging_alloc", "wall"} <= set(rt.weight_load_timings)
