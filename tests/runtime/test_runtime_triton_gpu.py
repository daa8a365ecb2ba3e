"""Triton instances of one entry, resolved by parameter layout (issue 5, point 7). Needs a GPU and triton.

What "same-named instances" are in kern: a manifest module is one cubin pinned by sha256, and Triton
writes one cubin per compiled instance (constexpr values and argument types), every instance's kernel
carrying the `@triton.jit` function's name. Two instances of one entry are therefore two modules with
the same entry name; each launch names its module, and the runtime takes the function of that name
whose `cuFuncGetParamInfo` layout equals the launch's `params` (modules.resolve_function). The test
compiles `kern_axpb` ahead of time, at test time, into two instances whose layouts differ (`n` as i32
or i64; BLOCK 128 or 64, which the outputs show), checks each cubin holds exactly one function of that
name, writes both as `<module>-<sha12>.cubin`, runs a manifest with one launch per instance against
numpy (eager and as a graph), and checks that params matching neither instance, or the other
instance's params, are refused with KernelArtifactError.

Triton's extra trailing pointer parameters (global / profile scratch, newer Triton) are probed from the
loaded cubin and wired as null pointers (or an op scratch when the metadata asks for global scratch).
Run on the H200: KERN_REQUIRE_GPU=1 python3 -m pytest tests/runtime/test_runtime_triton_gpu.py -q
"""

from __future__ import annotations

import hashlib
import inspect
import re
from typing import Any

import numpy as np
import pytest

from kern_runtime import KernelArtifactError, Runtime

pytestmark = pytest.mark.gpu

try:  # a module-level @triton.jit function: Triton reads its source and resolves `tl` from its globals
    import triton
    import triton.language as tl

    TRITON_MISSING = ""
except Exception as exc:  # noqa: BLE001 - any failure to import is a skip with its reason
    triton = tl = None  # type: ignore[assignment]
    TRITON_MISSING = f"triton cannot be imported: {type(exc).__name__}: {exc}"

if triton is not None:

    @triton.jit
    def kern_axpb(x_ptr, y_ptr, n, a, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        tl.store(y_ptr + offs, x * a + BLOCK, mask=mask)


A = 2.5  # the `a` argument of every launch
TOKENS = 777  # not a multiple of either BLOCK: the masks matter
# (module, type of n, BLOCK, the user parameters' layout: x, y, n, a with natural alignment)
INSTANCES = {
    "axpb_n32": ("i32", 128, ((0, 8), (8, 8), (16, 4), (20, 4))),
    "axpb_n64": ("i64", 64, ((0, 8), (8, 8), (16, 8), (24, 4))),
}


def triton_version() -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", getattr(triton, "__version__", "0.0"))
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def ast_source(fn: Any, signature: dict[str, str], constexprs: dict[str, Any]) -> Any:
    """`ASTSource` across Triton 3.x: 3.3+ takes `constexprs` and wants constexpr arguments in the
    signature typed "constexpr"; 3.1 / 3.2 take `constants` keyed by name, constexprs left out of the
    signature; 3.0 keys both by argument index."""
    from triton.compiler import ASTSource

    params = inspect.signature(ASTSource.__init__).parameters
    if "constexprs" in params:
        full = {name: ("constexpr" if name in constexprs else signature[name]) for name in fn.arg_names}
        return ASTSource(fn=fn, signature=full, constexprs=dict(constexprs))
    if triton_version() >= (3, 1):
        return ASTSource(fn=fn, signature=dict(signature), constants=dict(constexprs))
    index = {name: i for i, name in enumerate(fn.arg_names)}
    return ASTSource(fn=fn, signature={index[k]: v for k, v in signature.items()},
                     constants={index[k]: v for k, v in constexprs.items()})


def meta_get(metadata: Any, key: str, default: Any = None) -> Any:
    if isinstance(metadata, dict):
        return metadata.get(key, default)
    return getattr(metadata, key, default)


def device_arch() -> int:
    from kern_runtime.cuda.driver import call, cu

    call("cuInit", 0)
    device = call("cuDeviceGet", 0)
    attr = cu().CUdevice_attribute
    major = int(call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device))
    minor = int(call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device))
    return major * 10 + minor


def probe(cubin: bytes, entry: str) -> tuple[int, tuple[tuple[int, int], ...]]:
    """(functions named `entry` in the cubin, the first one's cuFuncGetParamInfo layout)."""
    from kern_runtime.cuda.driver import call
    from kern_runtime.cuda.modules import functions_named, param_layout

    call("cuInit", 0)
    device = call("cuDeviceGet", 0)
    context = call("cuDevicePrimaryCtxRetain", device)
    try:
        call("cuCtxSetCurrent", context)
        module = call("cuModuleLoadData", cubin)
        try:
            functions = functions_named(module, entry)
            return len(functions), (param_layout(functions[0]) if functions else ())
        finally:
            call("cuModuleUnload", module)
    finally:
        call("cuDevicePrimaryCtxRelease", device)


@pytest.fixture(scope="module")
def instances(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Both instances compiled ahead of time for this GPU, written to a kernels directory."""
    if triton is None:
        pytest.skip(TRITON_MISSING)
    if triton_version() < (3, 0):
        pytest.skip(f"triton {triton.__version__}: ahead-of-time compile needs Triton 3.x (ASTSource + GPUTarget)")
    from triton.backends.compiler import GPUTarget

    root = tmp_path_factory.mktemp("triton")
    kernels = root / "kernels"
    kernels.mkdir()
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_CACHE_DIR", str(root / "cache"))  # keep the user's cache out of it
    try:
        target = GPUTarget("cuda", device_arch(), 32)
        out: dict[str, dict[str, Any]] = {}
        for module, (n_type, block, user_layout) in INSTANCES.items():
            src = ast_source(kern_axpb, {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": n_type, "a": "fp32"}, {"BLOCK": block})
            compiled = triton.compile(src, target=target)
            cubin = compiled.asm["cubin"]
            cubin = cubin if isinstance(cubin, bytes) else bytes(cubin)
            md = compiled.metadata
            name = meta_get(md, "name")
            digest = hashlib.sha256(cubin).hexdigest()
            (kernels / f"{module}-{digest[:12]}.cubin").write_bytes(cubin)
            count, layout = probe(cubin, name)
            out[module] = {
                "n_type": n_type, "block": block, "user_layout": user_layout, "name": name, "sha256": digest,
                "count": count, "layout": layout, "num_warps": int(meta_get(md, "num_warps", 4)),
                "shared": int(meta_get(md, "shared", 0) or 0),
                "num_ctas": int(meta_get(md, "num_ctas", 1) or 1),
                "scratch": [int(meta_get(md, "global_scratch_size", 0) or 0),
                            int(meta_get(md, "profile_scratch_size", 0) or 0)],
                "kernels": kernels,
            }
    finally:
        mp.undo()
    names = {v["name"] for v in out.values()}
    if len(names) != 1:
        pytest.skip(f"this Triton names its instances differently ({sorted(names)}): no same-named instances to test")
    return out


def op(inst: dict[str, Any], module: str, params=None, args=None) -> dict[str, Any]:
    """The op `axpb(x, y, n)` launching `inst` from `module`: params and wirings from the probed
    layout, Triton's trailing scratch pointers null (or this op's scratch when the metadata sizes it)."""
    block = inst["block"]
    user = len(inst["user_layout"])
    scratch: dict[str, str] = {}
    if args is None:
        args = [{"arg": "x"}, {"arg": "y"}, {"arg": "n", "type": inst["n_type"]}, {"f32": A}]
        for i, _ in enumerate(inst["layout"][user:]):
            size = inst["scratch"][i] if i < len(inst["scratch"]) else 0
            if size:  # Triton's launcher allocates size bytes per program (x num_ctas)
                scratch[f"triton{i}"] = f"cdiv(tokens, {block}) * {inst['num_ctas'] * size}"
                args.append({"scratch": f"triton{i}"})
            else:
                args.append({"null": 8})
    launch = {"module": module, "entry": inst["name"], "grid": [f"cdiv(tokens, {block})", 1, 1],
              "block": [32 * inst["num_warps"], 1, 1], "shared_mem": inst["shared"],
              "params": [list(p) for p in (params if params is not None else inst["layout"])], "args": args}
    body: dict[str, Any] = {"args": [{"name": "x", "kind": "ptr"}, {"name": "y", "kind": "ptr"},
                                     {"name": "n", "kind": "int"}], "launches": [launch]}
    if scratch:
        body["scratch"] = scratch
    return body


def manifest(instances: dict[str, dict[str, Any]], ops: dict[str, dict[str, Any]]) -> dict[str, Any]:
    calls = [{"op": name, "args": {"x": "x", "y": f"y_{name}", "n": "tokens"}} for name in ops]
    return {
        "format": "kern-manifest/1", "name": "triton-instances",
        "vars": {"tokens": {"min": 1, "max": 1024}},
        "modules": {m: inst["sha256"] for m, inst in instances.items()},
        "buffers": {"x": {"kind": "input", "dtype": "f32", "shape": ["tokens"]},
                    **{f"y_{name}": {"kind": "output", "dtype": "f32", "shape": ["tokens"]} for name in ops}},
        "ops": ops,
        "programs": {"p": {"calls": calls}, "g": {"graph": True, "calls": [{"program": "p"}]}},
    }


def test_instances_are_one_function_each_with_distinct_layouts(instances) -> None:
    a, b = instances["axpb_n32"], instances["axpb_n64"]
    assert a["name"] == b["name"] and a["sha256"] != b["sha256"]
    for inst in (a, b):
        assert inst["count"] == 1  # one function of the entry's name per Triton cubin
        user = len(inst["user_layout"])
        assert inst["layout"][:user] == inst["user_layout"]  # BLOCK (constexpr) is not a parameter
        assert all(size == 8 for _, size in inst["layout"][user:])  # trailing scratch pointers, if any
    assert a["layout"] != b["layout"]


def test_same_named_instances_resolved_by_layout_run_against_numpy(instances) -> None:
    kdir = instances["axpb_n32"]["kernels"]
    ops = {m: op(inst, m) for m, inst in instances.items()}
    x = np.random.default_rng(0).integers(-100, 101, TOKENS).astype(np.float32)  # x * 2.5 + BLOCK is exact
    with Runtime.load(manifest(instances, ops), kdir, None) as rt:
        launches = rt.describe()["launches"]
        assert {launch["entry"] for launch in launches} == {instances["axpb_n32"]["name"]}
        rt.write_input("x", x)
        rt.run("p", {"tokens": TOKENS})
        eager = {m: rt.read_output(f"y_{m}", rows=TOKENS) for m in instances}
        for m, inst in instances.items():
            np.testing.assert_array_equal(eager[m], x * np.float32(A) + np.float32(inst["block"]), err_msg=m)
        rt.write_input("x", np.zeros(TOKENS, np.float32))
        rt.run("p", {"tokens": TOKENS})  # overwrite the outputs (y = BLOCK); the graph must write them again
        rt.write_input("x", x)
        rt.issue("g", {"tokens": TOKENS})
        for m in instances:
            assert rt.read_output(f"y_{m}", rows=TOKENS).tobytes() == eager[m].tobytes()


def test_params_matching_neither_instance_are_refused(instances) -> None:
    kdir = instances["axpb_n32"]["kernels"]
    a, b = instances["axpb_n32"], instances["axpb_n64"]
    three = [[0, 8], [8, 8], [16, 4]]  # x, y, n: no instance has this layout
    neither = op(a, "axpb_n32", params=three, args=[{"arg": "x"}, {"arg": "y"}, {"arg": "n", "type": "i32"}])
    with pytest.raises(KernelArtifactError, match=r"ABI mismatch.*match none of the 1 instance"):
        Runtime.load(manifest(instances, {"axpb_n32": neither}), kdir, None)
    # each instance's layout against the other instance's module: the layout decides, not the name
    crossed = op(b, "axpb_n32")  # n64's params and wirings, launched from the n32 module
    with pytest.raises(KernelArtifactError, match=rf"entry '{re.escape(a['name'])}'.*ABI mismatch"):
        Runtime.load(manifest(instances, {"axpb_n32": crossed}), kdir, None)
    crossed = op(a, "axpb_n64")
    with pytest.raises(KernelArtifactError, match="ABI mismatch"):
        Runtime.load(manifest(instances, {"axpb_n64": crossed}), kdir, None)
