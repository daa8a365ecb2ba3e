"""capture.Recorder's callback logic on the CPU, fed the callbacks CUPTI would make, with a stand-in for
cupti-python whose callback ids from its enums (13.4) or from `get_callback_name` (earlier releases); the parameter structs are
launch_params.py's (checked against cupti-python 13.4's classes over the same bytes):
a module load pairs its cubin with its CUmodule, a launch is recorded with its function, module, grid, block and
parameter bytes, allocations and frees once each (a runtime cudaMalloc only when no driver call was seen), and a
runtime launch that reached no driver callback becomes an Api event the miner refuses."""

from __future__ import annotations

import ctypes
import enum
import hashlib
import sys
import types
from pathlib import Path

import pytest

from kern_run.harvest.capture_format import Alloc, Api, Free, Launch
from kern_run.harvest.errors import CaptureError
from kern_run.harvest.launch_params import (
    LaunchKernelExParams, LaunchKernelParams, MemAllocParams, MemFreeParams, OutInParams, ModuleResourceData,
)


ROOT = Path(__file__).resolve().parents[2]
Params, ExParams, LoadParams = LaunchKernelParams, LaunchKernelExParams, OutInParams
AllocParams, FreeParams, ModuleData = MemAllocParams, MemFreeParams, ModuleResourceData


def fake_cupti(enums: bool = True) -> types.SimpleNamespace:
    names = ["cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz", "cuModuleLoadData",
             "cuModuleLoadDataEx", "cuModuleLoad", "cuMemAlloc_v2", "cuMemFree_v2", "cuMemcpyDtoDAsync_v2",
             "cuMemsetD8Async",
             "cuCtxGetCurrent", "cuLibraryLoadData", "cuModuleGetFunction", "cuLibraryGetKernel", "cuKernelGetFunction",
             "cuLibraryGetModule"]
    runtime = ["cudaLaunchKernel_v7000", "cudaMalloc_v3020", "cudaFree_v3020", "cudaMemcpy_v3020"]
    domains = enum.IntEnum("CallbackDomain", {"DRIVER_API": 1, "RUNTIME_API": 2, "RESOURCE": 3})
    ids = {1: {i + 10: n for i, n in enumerate(names)}, 2: {i + 100: n for i, n in enumerate(runtime)}}

    def get_callback_name(domain: int, cbid: int) -> str:  # cuptiGetCallbackName: an error past the known ids
        return ids[int(domain)][cbid]

    fake = types.SimpleNamespace(
        CallbackDomain=domains, CallbackIdResource=enum.IntEnum("CallbackIdResource", {"MODULE_LOADED": 6}),
        ApiCallbackSite=enum.IntEnum("ApiCallbackSite", {"API_ENTER": 0, "API_EXIT": 1}),
        get_callback_name=get_callback_name,
        subscribe=lambda callback, userdata: 1, enable_callback=lambda *a: None, unsubscribe=lambda handle: None)
    if enums:  # cupti-python 13.4; earlier releases have get_callback_name only
        fake.DriverApiTraceCbid = enum.IntEnum("DriverApiTraceCbid", {n: i for i, n in ids[1].items()})
        fake.RuntimeApiTraceCbid = enum.IntEnum("RuntimeApiTraceCbid", {n: i for i, n in ids[2].items()})
    return fake


LAYOUTS = {0xF1: ((0, 8), (8, 4)), 0xF2: ((0, 8),)}


def fake_driver() -> types.SimpleNamespace:
    invalid = 1
    return types.SimpleNamespace(
        CUresult=types.SimpleNamespace(CUDA_ERROR_INVALID_VALUE=invalid), CUfunction=int,
        cuFuncGetParamInfo=lambda f, i: (0, *LAYOUTS[f][i]) if i < len(LAYOUTS[f]) else (invalid, 0, 0),
        cuFuncGetModule=lambda f: (0, 0xAA if f == 0xF1 else 0xBB),
        cuFuncGetName=lambda f: (0, f"fn_{f:x}".encode()))


@pytest.fixture(params=[True, False], ids=["cupti-enums", "callback-names"])
def recorder(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    import cuda.bindings

    cupti, driver = fake_cupti(request.param), fake_driver()
    monkeypatch.setitem(sys.modules, "cupti", types.SimpleNamespace(cupti=cupti))
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", driver)
    monkeypatch.setattr(cuda.bindings, "driver", driver, raising=False)
    from kern_run.harvest.capture import Recorder

    r = Recorder()
    r.subscribe()
    return r


class Site:
    """What CUPTI hands an API callback (CallbackData's fields the recorder reads)."""

    def __init__(self, site: int, params: ctypes.Structure | None, symbol: str = "", ret: int = 0) -> None:
        self.result = ctypes.c_int(ret)  # functionReturnValue points at the call's CUresult
        self.callback_site, self.function_return_value, self.symbol_name = site, ctypes.addressof(self.result), symbol
        self.keep = params
        self.function_params = ctypes.addressof(params) if params is not None else 0


def api(r, name: str, params=None, symbol: str = "", runtime: bool = False) -> None:  # type: ignore[no-untyped-def]
    cupti = r.cupti
    domain = cupti.CallbackDomain.RUNTIME_API if runtime else cupti.CallbackDomain.DRIVER_API
    table = r.runtime_cbids if runtime else r.driver_cbids
    cbid = next(i for i, n in table.items() if n == name)
    r._callback(None, domain, cbid, Site(0, params, symbol))
    r._callback(None, domain, cbid, Site(1, params, symbol))


def _id(r, name: str, runtime: bool = False) -> int:  # type: ignore[no-untyped-def]
    return next(i for i, n in (r.runtime_cbids if runtime else r.driver_cbids).items() if n == name)


def load_module(r, image: bytes, handle: int) -> None:  # type: ignore[no-untyped-def]
    out = ctypes.c_uint64(0)
    params = LoadParams(ctypes.addressof(out), 0)
    cbid = _id(r, "cuModuleLoadData")
    r._callback(None, r.cupti.CallbackDomain.DRIVER_API, cbid, Site(0, params))
    buf = ctypes.create_string_buffer(image, len(image))
    data = ModuleData(1, len(image), ctypes.addressof(buf))
    r._callback(None, r.cupti.CallbackDomain.RESOURCE, 6, types.SimpleNamespace(resource_descriptor=ctypes.addressof(data)))
    out.value = handle
    r._callback(None, r.cupti.CallbackDomain.DRIVER_API, cbid, Site(1, params))


def test_loads_launches_allocs_and_refusable_calls(recorder) -> None:  # type: ignore[no-untyped-def]
    r = recorder
    load_module(r, b"\x7fELF module a", 0xAA)
    sha = hashlib.sha256(b"\x7fELF module a").hexdigest()
    assert r.cubins == {sha: b"\x7fELF module a"} and r.module_sha == {0xAA: sha}
    r.begin()
    value_a, value_b = ctypes.c_uint64(0x7F0000001000), ctypes.c_int32(-3)
    kp = (ctypes.c_void_p * 2)(ctypes.addressof(value_a), ctypes.addressof(value_b))
    api(r, "cuLaunchKernel", Params(0xF1, 4, 1, 1, 128, 1, 1, 512, 0, ctypes.addressof(kp), 0), "kern_a")
    out = ctypes.c_uint64(0)
    alloc = AllocParams(ctypes.addressof(out), 4096)
    cbid = _id(r, "cuMemAlloc_v2")
    r._callback(None, r.cupti.CallbackDomain.DRIVER_API, cbid, Site(0, alloc))
    out.value = 0x7F0000200000
    r._callback(None, r.cupti.CallbackDomain.DRIVER_API, cbid, Site(1, alloc))
    # a runtime cudaMalloc around the same driver call: recorded once
    r._callback(None, r.cupti.CallbackDomain.RUNTIME_API, _id(r, "cudaMalloc_v3020", True), Site(0, None))
    r._callback(None, r.cupti.CallbackDomain.DRIVER_API, cbid, Site(0, alloc))
    r._callback(None, r.cupti.CallbackDomain.DRIVER_API, cbid, Site(1, alloc))
    r._callback(None, r.cupti.CallbackDomain.RUNTIME_API, _id(r, "cudaMalloc_v3020", True), Site(1, None))
    config = (ctypes.c_uint * 14)(2, 3, 1, 64, 1, 1, 0)
    ptr = ctypes.c_uint64(0x7F0000200010)
    kp2 = (ctypes.c_void_p * 1)(ctypes.addressof(ptr))
    api(r, "cuLaunchKernelEx", ExParams(ctypes.addressof(config), 0xF2, ctypes.addressof(kp2), 0))  # name from the driver
    api(r, "cuMemFree_v2", FreeParams(0x7F0000200000))
    api(r, "cuMemFree_v2", FreeParams(0x7F0000200000))  # a second free of it: not ours any more
    api(r, "cuMemcpyDtoDAsync_v2", FreeParams(0))
    runtime_launch = _id(r, "cudaLaunchKernel_v7000", True)
    r._callback(None, r.cupti.CallbackDomain.RUNTIME_API, runtime_launch, Site(0, None))
    r._callback(None, r.cupti.CallbackDomain.RUNTIME_API, runtime_launch, Site(1, None))  # no driver launch inside
    events = r.end()
    assert events == [
        Launch("kern_a", sha, (4, 1, 1), (128, 1, 1), 512, ((0, 8), (8, 4)),
               (0x7F0000001000).to_bytes(8, "little") + (-3).to_bytes(4, "little", signed=True)),
        Alloc(0x7F0000200000, 4096),
        Launch("fn_f2", None, (2, 3, 1), (64, 1, 1), 0, ((0, 8),), (0x7F0000200010).to_bytes(8, "little")),
        Free(0x7F0000200000),
        Api("cuMemcpyDtoDAsync_v2"),
        Api("cudaLaunchKernel"),
    ]


def test_failed_calls_record_nothing(recorder) -> None:  # type: ignore[no-untyped-def]
    r = recorder
    r.begin()
    out = ctypes.c_uint64(0x7F0000300000)
    alloc = AllocParams(ctypes.addressof(out), 64)
    r._callback(None, r.cupti.CallbackDomain.DRIVER_API, _id(r, "cuMemAlloc_v2"), Site(1, alloc, ret=2))  # out of memory
    assert r.end() == []


def test_a_failing_callback_fails_the_step(recorder) -> None:  # type: ignore[no-untyped-def]
    r = recorder
    r.begin()
    from kern_run.harvest.launch_params import LaunchAttribute, LaunchConfig

    attrs = (LaunchAttribute * 1)()
    attrs[0].id, attrs[0].value[0] = 4, 2  # a 2x0x0 cluster: the format cannot record it
    config = LaunchConfig(1, 1, 1, 32, 1, 1, 0, None, ctypes.addressof(attrs), 1)
    api(r, "cuLaunchKernelEx", ExParams(ctypes.addressof(config), 0xF2, 0, 0))
    with pytest.raises(CaptureError, match=r"1 callback failure\(s\) while recording: ValueError: a cuLaunchKernelEx "
                                           r"with a 2x0x0 cluster"):
        r.end()


def test_launch_callbacks_are_on_only_while_a_step_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Module loads are watched from subscribe() on; every other watched call only between begin() and end(), so
    torch.compile's autotuning launches before the recorded step never enter Python."""
    import cuda.bindings

    cupti, driver = fake_cupti(), fake_driver()
    enabled: dict[tuple[int, int], int] = {}
    cupti.enable_callback = lambda on, handle, domain, cbid: enabled.__setitem__((int(domain), int(cbid)), on)
    monkeypatch.setitem(sys.modules, "cupti", types.SimpleNamespace(cupti=cupti))
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", driver)
    monkeypatch.setattr(cuda.bindings, "driver", driver, raising=False)
    from kern_run.harvest.capture import Recorder

    r = Recorder()
    r.subscribe()
    names = {**{(1, c): n for c, n in r.driver_cbids.items()}, **{(2, c): n for c, n in r.runtime_cbids.items()},
             (3, 6): "MODULE_LOADED"}

    def on() -> set[str]:
        return {names[key] for key, value in enabled.items() if value}

    loads = {"MODULE_LOADED", "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoad", "cuLibraryLoadData",
             "cuModuleGetFunction", "cuLibraryGetKernel", "cuKernelGetFunction", "cuLibraryGetModule"}
    assert on() == loads
    r.begin()
    assert on() == set(names.values()) and "cuLaunchKernel" in on() and "cudaMalloc_v3020" in on()
    r.end()
    assert on() == loads


def _load_call(r, image: bytes, handle: int, resource: str):  # type: ignore[no-untyped-def]
    """A cuModuleLoadData of `image` returning `handle`, CUPTI's MODULE_LOADED `resource`: "inside" the call,
    "after" its exit, or "none"; the image pointer is the call's own."""
    buf = ctypes.create_string_buffer(image, len(image))
    out = ctypes.c_uint64(0)
    params = LoadParams(ctypes.addressof(out), ctypes.addressof(buf))
    cbid = _id(r, "cuModuleLoadData")
    data = ModuleData(1, len(image), ctypes.addressof(buf))
    resource_cb = types.SimpleNamespace(resource_descriptor=ctypes.addressof(data))
    r._callback(None, r.cupti.CallbackDomain.DRIVER_API, cbid, Site(0, params))
    if resource == "inside":
        r._callback(None, r.cupti.CallbackDomain.RESOURCE, 6, resource_cb)
    out.value = handle
    r._callback(None, r.cupti.CallbackDomain.DRIVER_API, cbid, Site(1, params))
    if resource == "after":
        r._callback(None, r.cupti.CallbackDomain.RESOURCE, 6, resource_cb)
    return buf


def test_a_module_reported_after_its_load_returned_is_still_paired(recorder) -> None:  # type: ignore[no-untyped-def]
    r = recorder
    _load_call(r, b"not an ELF image: a fatbin, say", 0xCC, "after")
    sha = hashlib.sha256(b"not an ELF image: a fatbin, say").hexdigest()
    assert r.module_sha == {0xCC: sha}
    assert r.stats()["module_loads"] == {"loads": 1, "by_resource": 0, "by_image": 0, "late": 1, "unmapped": 0, "by_lookup": 0}


def test_a_cubin_load_without_a_resource_callback_is_paired_by_its_image(recorder) -> None:  # type: ignore[no-untyped-def]
    cubin = sorted((ROOT / "kernels").glob("*.cubin"))[0].read_bytes()  # a committed cubin stands in for triton's
    _load_call(r := recorder, cubin, 0xDD, "none")
    sha = hashlib.sha256(cubin).hexdigest()
    assert r.module_sha == {0xDD: sha} and r.cubins[sha] == cubin
    assert r.stats()["module_loads"]["by_image"] == 1


def test_a_load_nothing_pairs_is_counted_and_named_by_the_miner(recorder) -> None:  # type: ignore[no-untyped-def]
    r = recorder
    _load_call(r, b"PTX text, no ELF", 0xEE, "none")
    assert r.module_sha == {}
    assert r.stats()["module_loads"] == {"loads": 1, "by_resource": 0, "by_image": 0, "late": 0, "unmapped": 1, "by_lookup": 0}
    r.begin()
    ptr = ctypes.c_uint64(0x7F0000200010)
    kp = (ctypes.c_void_p * 1)(ctypes.addressof(ptr))
    api(r, "cuLaunchKernel", Params(0xF2, 1, 1, 1, 32, 1, 1, 0, 0, ctypes.addressof(kp), 0), "kern_b")
    assert r.end()[0].module is None
    assert r.stats()["launch_modules_missing"] == {"cuFuncGetModule failed": 0, "module load not seen": 1}


def _handle_call(r, name: str, out_value: int, given: int) -> None:  # type: ignore[no-untyped-def]
    out = ctypes.c_uint64(0)
    params = LoadParams(ctypes.addressof(out), given)
    cbid = _id(r, name)
    r._callback(None, r.cupti.CallbackDomain.DRIVER_API, cbid, Site(0, params))
    out.value = out_value
    r._callback(None, r.cupti.CallbackDomain.DRIVER_API, cbid, Site(1, params))


def test_a_library_loaded_kernel_is_paired_through_its_handles(recorder) -> None:  # type: ignore[no-untyped-def]
    """cuLibraryLoadData -> cuLibraryGetKernel -> cuKernelGetFunction: the launched function names its cubin even
    where cuFuncGetModule gives a module no load returned (0xBB for 0xF2 in the fake driver)."""
    r = recorder
    cubin = sorted((ROOT / "kernels").glob("*.cubin"))[0].read_bytes()
    buf = ctypes.create_string_buffer(cubin, len(cubin))
    _handle_call(r, "cuLibraryLoadData", 0x11B, ctypes.addressof(buf))
    _handle_call(r, "cuLibraryGetKernel", 0x4E1, 0x11B)
    _handle_call(r, "cuKernelGetFunction", 0xF2, 0x4E1)
    sha = hashlib.sha256(cubin).hexdigest()
    r.begin()
    ptr = ctypes.c_uint64(0x7F0000200010)
    kp = (ctypes.c_void_p * 1)(ctypes.addressof(ptr))
    api(r, "cuLaunchKernel", Params(0xF2, 1, 1, 1, 32, 1, 1, 0, 0, ctypes.addressof(kp), 0), "kern_b")
    assert r.end()[0].module == sha
    assert r.stats()["handle_calls"] == {"cuLibraryLoadData": 1, "cuLibraryGetKernel": 1, "cuKernelGetFunction": 1}


def test_a_module_whose_cubin_comes_with_its_first_function_lookup(recorder) -> None:  # type: ignore[no-untyped-def]
    """Lazy loading: MODULE_LOADED inside cuModuleGetFunction, no load callback; the module pairs there."""
    r = recorder
    image = b"\x7fELF lazily loaded"
    buf = ctypes.create_string_buffer(image, len(image))
    data = ModuleData(1, len(image), ctypes.addressof(buf))
    out = ctypes.c_uint64(0)
    params = LoadParams(ctypes.addressof(out), 0xAA)  # cuModuleGetFunction(&f, module 0xAA, name)
    cbid = _id(r, "cuModuleGetFunction")
    r._callback(None, r.cupti.CallbackDomain.DRIVER_API, cbid, Site(0, params))
    r._callback(None, r.cupti.CallbackDomain.RESOURCE, 6, types.SimpleNamespace(resource_descriptor=ctypes.addressof(data)))
    out.value = 0xF1
    r._callback(None, r.cupti.CallbackDomain.DRIVER_API, cbid, Site(1, params))
    sha = hashlib.sha256(image).hexdigest()
    assert r.module_sha == {0xAA: sha} and r.function_sha == {0xF1: sha}
    assert r.stats()["module_loads"]["by_lookup"] == 1


def _file_load_call(r, path: Path, handle: int, inside: bool) -> None:  # type: ignore[no-untyped-def]
    """A cuModuleLoad(&module, path) returning `handle` (inductor's static CUDA launcher loads cubins so), with
    CUPTI's MODULE_LOADED inside the call (`inside`) or not at all."""
    name = ctypes.create_string_buffer(str(path).encode())
    out = ctypes.c_uint64(0)
    params = LoadParams(ctypes.addressof(out), ctypes.addressof(name))
    cbid = _id(r, "cuModuleLoad")
    r._callback(None, r.cupti.CallbackDomain.DRIVER_API, cbid, Site(0, params))
    if inside:
        image = path.read_bytes()
        buf = ctypes.create_string_buffer(image, len(image))
        data = ModuleData(1, len(image), ctypes.addressof(buf))
        loaded = types.SimpleNamespace(resource_descriptor=ctypes.addressof(data))
        r._callback(None, r.cupti.CallbackDomain.RESOURCE, 6, loaded)
    out.value = handle
    r._callback(None, r.cupti.CallbackDomain.DRIVER_API, cbid, Site(1, params))


@pytest.mark.parametrize("inside", [True, False], ids=["module-loaded-inside", "file-read"])
def test_a_module_loaded_from_a_file_pairs_with_its_cubin(recorder, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                           inside: bool) -> None:
    """The H200 captures of 2026-12-03: every module came through cuModuleLoad of a cubin path; the launch that runs
    its function then names that cubin, and so picks it among the autotuned cubins of the same entry and layout."""
    r = recorder
    cubin = sorted((ROOT / "kernels").glob("*.cubin"))[0].read_bytes()
    (tmp_path / "k.cubin").write_bytes(cubin)
    _file_load_call(r, tmp_path / "k.cubin", 0xAA, inside)
    sha = hashlib.sha256(cubin).hexdigest()
    assert r.module_sha == {0xAA: sha} and r.cubins[sha] == cubin
    assert r.stats()["module_loads"] == {"loads": 1, "by_resource": int(inside), "by_image": int(not inside),
                                         "late": 0, "unmapped": 0, "by_lookup": 0}
    r.begin()
    value_a, value_b = ctypes.c_uint64(0x7F0000001000), ctypes.c_int32(-3)
    kp = (ctypes.c_void_p * 2)(ctypes.addressof(value_a), ctypes.addressof(value_b))
    api(r, "cuLaunchKernel", Params(0xF1, 4, 1, 1, 128, 1, 1, 512, 0, ctypes.addressof(kp), 0), "kern_a")
    assert r.end()[0].module == sha  # 0xF1's module is 0xAA in the fake driver


def test_a_file_load_of_no_elf_is_unmapped(recorder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "k.ptx").write_bytes(b".version 8.0\n.target sm_90\n")
    _file_load_call(r := recorder, tmp_path / "k.ptx", 0xAB, False)
    assert r.module_sha == {} and r.stats()["module_loads"]["unmapped"] == 1


def test_a_file_load_of_a_fifo_or_an_oversized_file_is_unmapped(recorder, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    import kern_run.harvest.capture as capture

    os.mkfifo(tmp_path / "k.fifo")  # no writer: a plain open would wait for one inside the CUPTI callback
    _file_load_call(r := recorder, tmp_path / "k.fifo", 0xAC, False)
    monkeypatch.setattr(capture, "CUBIN_FILE_MAX", 16)
    cubin = sorted((ROOT / "kernels").glob("*.cubin"))[0].read_bytes()
    (tmp_path / "big.cubin").write_bytes(cubin)
    _file_load_call(r, tmp_path / "big.cubin", 0xAD, False)
    assert r.module_sha == {} and r.stats()["module_loads"]["unmapped"] == 2
