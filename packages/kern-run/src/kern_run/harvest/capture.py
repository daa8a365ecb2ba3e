"""The capture (GPU machine only): one model step under torch.compile, recorded through CUPTI.

`capture(step, options, out_dir)`:

1. subscribes a CUPTI callback (cupti-python) before anything is compiled, so every module load is seen: the
   resource callback `MODULE_LOADED` hands over each cubin (saved by sha256), and the exit of the
   `cuModuleLoadData(Ex)` or `cuModuleLoad` call that made it gives its `CUmodule`;
2. runs the step `options.warmup` times at every token count (compilation and max-autotune benchmarking happen
   here, outside any recording);
3. per token count, records one step: every kernel launch (`cuLaunchKernel`, `cuLaunchKernelEx` and their
   per-thread-stream forms: function name, module through `cuFuncGetModule`, grid, block, dynamic shared memory,
   the parameter buffer read with the layout from `cuFuncGetParamInfo`: launch_params.py), every device
   allocation and free (`cuMemAlloc_v2` / `cuMemFree_v2`; PYTORCH_NO_CUDA_MEMORY_CACHING=1 makes each torch
   tensor its own allocation, so the order of these events says which allocation a pointer belongs to), every
   memcpy / memset, and a runtime `cudaLaunchKernel` / `cudaMalloc` that reached no driver callback (reported so
   nothing is silently missed); then the named tensors alive: the step's weights (checkpoint names), states,
   inputs and outputs;
4. writes the capture directory whole (capture_format.py): only the cubins that a recorded launch ran (or, for a
   launch whose module was not recorded, every cubin that holds its function).

Callbacks never raise into CUPTI: a failure inside one is kept and raised as CaptureError when the step ends.
Imports of torch, cupti and cuda.bindings happen inside the functions, so this module imports on any machine.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .capture_format import Alloc, Api, Capture, Event, Free, Launch, Run, Tensor, write_capture
from .cubin import CubinError, cubin_entries
from .errors import CaptureError
from .launch_params import (
    LaunchKernelExParams,
    LaunchKernelParams,
    MemAllocParams,
    MemFreeParams,
    ModuleResourceData,
    OutInParams,
    read_config,
    read_elf_image,
    read_params,
    read_u64,
)

NO_CACHING = "PYTORCH_NO_CUDA_MEMORY_CACHING"
_DRIVER_LAUNCHES = ("cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz")
# the module loads: from memory (Triton's own launcher), and from a file (inductor's static CUDA launcher, torch
# 2.11: cuModuleLoad of the cubin path; on the H200 every module of the tiny-en and 4B captures came this way)
_DRIVER_LOADS = ("cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoad")
CUBIN_FILE_MAX = 64 << 20  # bytes of a cubin read from the path cuModuleLoad was handed
# handle-pairing calls, watched beside the loads (rare: one per kernel a program looks up), each (OUT *out, IN in,
# ...): the library load, a module's or library's function or kernel, a kernel's function, a library's module
_DRIVER_HANDLES = ("cuLibraryLoadData", "cuModuleGetFunction", "cuLibraryGetKernel", "cuKernelGetFunction",
                   "cuLibraryGetModule")
_RUNTIME_WATCHED = ("cudaLaunchKernel", "cudaLaunchKernel_ptsz", "cudaLaunchKernelExC", "cudaLaunchKernelExC_ptsz",
                    "cudaMalloc", "cudaFree")
TORCH_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "float64": "f64", "int8": "i8",
                "uint8": "u8", "int16": "i16", "int32": "i32", "int64": "i64", "bool": "u8",
                "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}


class HarvestStep(Protocol):
    """A model step to capture. `weights()`: checkpoint name -> tensor, `states()`: name -> tensor kept across
    steps (zero before the first), `inputs(tokens)`: name -> fresh input tensors for a step of `tokens` tokens,
    `step(inputs)`: run it (compiled), returning name -> output tensor. Every tensor is contiguous on the GPU."""

    def weights(self) -> dict[str, Any]: ...

    def states(self) -> dict[str, Any]: ...

    def inputs(self, tokens: int) -> dict[str, Any]: ...

    def step(self, inputs: dict[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class CaptureOptions:
    """`tokens`: the token count of each recorded run (distinct, >= 1; include 1 for a decode program);
    `warmup`: unrecorded steps per token count before recording (compilation, autotuning)."""

    tokens: tuple[int, ...] = (1, 2)
    warmup: int = 2


def _check(result: Any, what: str) -> Any:
    """cuda.bindings returns (CUresult, value...): the value(s), or CaptureError naming the call."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise CaptureError(f"{what} failed: {err}")
    return rest[0] if len(rest) == 1 else tuple(rest)


class Recorder:
    """The CUPTI subscriber (module docstring). `begin()` / `end()` bracket one recorded step."""

    def __init__(self) -> None:
        from cuda.bindings import driver
        from cupti import cupti

        self.cupti, self.driver = cupti, driver
        self.cubins: dict[str, bytes] = {}
        self.module_sha: dict[int, str] = {}  # CUmodule handle -> cubin sha256
        self.layouts: dict[int, tuple[tuple[int, int], ...]] = {}
        self.function_module: dict[int, str | None] = {}
        self.events: list[Event] | None = None
        self.live: set[int] = set()
        self.errors: list[str] = []
        self.load_errors: list[str] = []  # callback failures outside a recorded step (kept: stats())
        self.load_stats = {"loads": 0, "by_resource": 0, "by_image": 0, "late": 0, "unmapped": 0, "by_lookup": 0}
        self.launch_misses = {"cuFuncGetModule failed": 0, "module load not seen": 0}
        self.function_sha: dict[int, str] = {}  # CUfunction / CUkernel handle -> cubin sha256 (_paired)
        self.handle_calls: dict[str, int] = {}  # handle-pairing calls seen, by name
        self.local = threading.local()  # per thread: cubins loaded inside the current module-load call, nesting
        self.handle: Any = None
        driver_names = _callback_names(cupti, "DriverApiTraceCbid", cupti.CallbackDomain.DRIVER_API)
        self.driver_cbids = {cbid: name for cbid, name in driver_names.items()
                             if name in _DRIVER_LAUNCHES + _DRIVER_LOADS + _DRIVER_HANDLES
                             + ("cuMemAlloc_v2", "cuMemFree_v2")
                             or name.startswith(("cuMemcpy", "cuMemset"))}
        runtime_names = _callback_names(cupti, "RuntimeApiTraceCbid", cupti.CallbackDomain.RUNTIME_API)
        self.runtime_cbids = {cbid: name for cbid, name in runtime_names.items()
                              if name.split("_v")[0] in _RUNTIME_WATCHED}
        missing = [n for n in _DRIVER_LAUNCHES + _DRIVER_LOADS if n not in self.driver_cbids.values()]
        if missing:
            raise CaptureError(f"CUPTI names no callback for {', '.join(missing)}")

    # ------------------------------------------------------------ subscription

    def subscribe(self) -> None:
        """Module loads are watched from here on (every cubin, and which CUmodule holds it); launches, copies,
        allocations and frees only between `begin()` and `end()`. A callback on every launch of torch.compile's
        autotuning (thousands of benchmark launches, from many threads, each into Python) kept the tiny-en
        capture compiling past 140 s on the H200 (2026-12-02); the step recorded is the only one that needs them."""
        cupti = self.cupti
        self.handle = cupti.subscribe(self._callback, None)
        cupti.enable_callback(1, self.handle, cupti.CallbackDomain.RESOURCE, cupti.CallbackIdResource.MODULE_LOADED)
        for cbid in self._load_cbids():
            cupti.enable_callback(1, self.handle, cupti.CallbackDomain.DRIVER_API, cbid)

    def _load_cbids(self) -> list[int]:
        return [cbid for cbid, name in self.driver_cbids.items() if name in _DRIVER_LOADS + _DRIVER_HANDLES]

    def _recorded(self, enable: int) -> None:
        """Enable (1) or disable (0) the callbacks of a recorded step: every watched call but the module loads."""
        cupti, loads = self.cupti, set(self._load_cbids())
        for cbid in self.driver_cbids:
            if cbid not in loads:
                cupti.enable_callback(enable, self.handle, cupti.CallbackDomain.DRIVER_API, cbid)
        for cbid in self.runtime_cbids:
            cupti.enable_callback(enable, self.handle, cupti.CallbackDomain.RUNTIME_API, cbid)

    def unsubscribe(self) -> None:
        if self.handle is not None:
            self.cupti.unsubscribe(self.handle)
            self.handle = None

    def begin(self) -> None:
        self.events, self.live, self.errors = [], set(), []
        if self.handle is not None:
            self._recorded(1)

    def end(self) -> list[Event]:
        if self.handle is not None:
            self._recorded(0)
        events, self.events = self.events, None
        if self.errors:
            raise CaptureError(f"{len(self.errors)} callback failure(s) while recording: {self.errors[0]}")
        return events or []

    # ------------------------------------------------------------ callbacks

    def _callback(self, userdata: Any, domain: int, cbid: int, data: Any) -> None:
        try:
            cupti = self.cupti
            if domain == cupti.CallbackDomain.RESOURCE:
                self._module_loaded(data)
            elif domain == cupti.CallbackDomain.DRIVER_API:
                self._driver(self.driver_cbids[int(cbid)], data)
            elif domain == cupti.CallbackDomain.RUNTIME_API:
                self._runtime(self.runtime_cbids[int(cbid)], data)
        except Exception as exc:  # noqa: BLE001 - never into CUPTI; reported at end() or by stats()
            (self.errors if self.events is not None else self.load_errors).append(f"{type(exc).__name__}: {exc}")

    def _module_loaded(self, data: Any) -> None:
        descriptor = int(getattr(data, "resource_descriptor", 0) or
                         self.cupti.ResourceData.from_ptr(int(data)).resource_descriptor)
        module = ModuleResourceData.from_address(descriptor)
        image = ctypes.string_at(module.pCubin, int(module.cubinSize))
        sha = hashlib.sha256(image).hexdigest()
        self.cubins.setdefault(sha, image)
        pending = getattr(self.local, "pending", None)
        if pending is not None:  # the load call returned before CUPTI reported its module (see _driver)
            self.local.pending = None
            if pending not in self.module_sha:
                self.module_sha[pending] = sha
                self.load_stats["late"] += 1
                self.load_stats["unmapped"] -= 1
            return
        getattr(self.local, "loaded", []).append(sha)

    def _entered(self, data: Any) -> bool:
        return data.callback_site == self.cupti.ApiCallbackSite.API_ENTER

    @staticmethod
    def _failed(data: Any) -> bool:
        """Whether the call returned an error: CUpti_CallbackData.functionReturnValue points at its CUresult /
        cudaError_t (valid at API_EXIT; cupti-python gives the pointer)."""
        pointer = int(data.function_return_value or 0)
        return bool(pointer) and ctypes.c_int.from_address(pointer).value != 0

    @staticmethod
    def _params(data: Any) -> int:
        """CUpti_CallbackData.functionParams: cupti-python 13.4's field, or read at byte 16 of the struct (after
        callbackSite and functionName) for releases without it."""
        params = getattr(data, "function_params", None)
        return int(params) if params is not None else read_u64(int(data.ptr) + 16)

    def _driver(self, name: str, data: Any) -> None:
        entering = self._entered(data)
        if name in _DRIVER_HANDLES:
            if entering:
                self.local.loaded = []
            elif not self._failed(data):
                self._paired(name, OutInParams.from_address(self._params(data)))
            return
        if name in _DRIVER_LOADS:
            if entering:
                self.local.loaded = []
                return
            params = OutInParams.from_address(self._params(data))
            loaded, self.local.loaded = getattr(self.local, "loaded", []), []
            if not self._failed(data):
                given = int(params.given or 0)
                image = (lambda: _read_cubin_file(given)) if name == "cuModuleLoad" else (lambda: read_elf_image(given))
                self._module_returned(read_u64(params.out), loaded, image)
            return
        self.local.driver_seen = True
        if self.events is None:
            return
        if name in _DRIVER_LAUNCHES:
            if entering:
                self.events.append(self._launch(name, data))
        elif name == "cuMemAlloc_v2":
            if not entering and not self._failed(data):
                params = MemAllocParams.from_address(self._params(data))
                self._alloc(read_u64(params.dptr), int(params.bytesize))
        elif name == "cuMemFree_v2":
            if entering:
                self._free(MemFreeParams.from_address(self._params(data)).dptr)
        elif entering:
            self.events.append(Api(name))

    def _module_returned(self, handle: int, loaded: list[str], image: Callable[[], bytes | None]) -> None:
        """A module load returned `handle`: pair it with its cubin. First the one cubin CUPTI reported inside the
        call (MODULE_LOADED); else `image()`, the ELF image the call was handed (in memory, or the file it named),
        read and hashed here (kept as a cubin: it is what the module runs); else the next cubin CUPTI reports on
        this thread. The tiny-en capture of 2026-12-02 recorded no module for any launch, so the callback order is
        not taken on trust."""
        stats = self.load_stats
        stats["loads"] += 1
        if len(loaded) == 1:
            self.module_sha[handle] = loaded[0]
            stats["by_resource"] += 1
            return
        elf = image()
        if elf is not None:
            sha = hashlib.sha256(elf).hexdigest()
            self.cubins.setdefault(sha, elf)
            self.module_sha[handle] = sha
            stats["by_image"] += 1
            return
        stats["unmapped"] += 1
        if not loaded:
            self.local.pending = handle

    def _paired(self, name: str, params: OutInParams) -> None:
        """A handle-pairing call returned: `params.out` points at its output handle, `params.given` is its
        input (the code image of cuLibraryLoadData, else the module, library or kernel handle)."""
        self.handle_calls[name] = self.handle_calls.get(name, 0) + 1
        out, given = read_u64(params.out), int(params.given or 0)
        loaded, self.local.loaded = getattr(self.local, "loaded", []), []
        if name == "cuLibraryLoadData":
            self._module_returned(out, loaded, lambda: read_elf_image(given))
            return
        if name == "cuModuleGetFunction" and given not in self.module_sha and len(loaded) == 1:
            # the module's cubin reported inside its first function lookup (loaded lazily): the H200 run of
            # 2026-12-02 saw 366 cuModuleGetFunction calls and no cuModuleLoadData callback at all
            self.module_sha[given] = loaded[0]
            self.load_stats["by_lookup"] += 1
        if name in ("cuModuleGetFunction", "cuLibraryGetKernel") and given in self.module_sha:
            self.function_sha[out] = self.module_sha[given]
        elif name == "cuKernelGetFunction" and given in self.function_sha:
            self.function_sha[out] = self.function_sha[given]
        elif name == "cuLibraryGetModule" and given in self.module_sha:
            self.module_sha[out] = self.module_sha[given]

    def stats(self) -> dict[str, Any]:
        """How module loads were paired with cubins, and launches with modules (written to the capture's
        source.recorder, for the miner's report): counts, and the first callback failures outside a step."""
        return {"module_loads": dict(self.load_stats), "launch_modules_missing": dict(self.launch_misses),
                "handle_calls": dict(self.handle_calls),
                "load_errors": self.load_errors[:5], "load_error_count": len(self.load_errors)}

    def _runtime(self, name: str, data: Any) -> None:
        """A runtime launch / malloc / free that no driver callback saw between its enter and exit: a malloc or
        free is recorded from the runtime's own parameters (cudaMalloc_v3020_params: `void **devPtr; size_t
        size`; cudaFree_v3020_params: `void *devPtr`), a launch as an Api event (the miner refuses it)."""
        if self._entered(data):
            self.local.driver_seen = False
            return
        if self.events is None or getattr(self.local, "driver_seen", True):
            return
        base, params = name.split("_v")[0], self._params(data)
        if base == "cudaMalloc" and not self._failed(data):
            malloc = MemAllocParams.from_address(params)
            self._alloc(read_u64(malloc.dptr), int(malloc.bytesize))
        elif base == "cudaFree":
            self._free(MemFreeParams.from_address(params).dptr)
        elif base != "cudaMalloc":
            self.events.append(Api(base))

    def _alloc(self, address: int, nbytes: int) -> None:
        if address not in self.live:
            self.live.add(address)
            self.events.append(Alloc(address, nbytes))  # type: ignore[union-attr]

    def _free(self, address: int) -> None:
        if address in self.live:
            self.live.discard(address)
            self.events.append(Free(address))  # type: ignore[union-attr]

    def _layout(self, function: int) -> tuple[tuple[int, int], ...]:
        if function not in self.layouts:
            driver, layout = self.driver, []
            f = driver.CUfunction(function)
            while True:
                err, offset, size = driver.cuFuncGetParamInfo(f, len(layout))
                if int(err) == int(driver.CUresult.CUDA_ERROR_INVALID_VALUE):
                    break
                _check((err,), "cuFuncGetParamInfo")
                layout.append((int(offset), int(size)))
            self.layouts[function] = tuple(layout)
            module = driver.cuFuncGetModule(f)
            handle = int(module[1]) if int(module[0]) == 0 else None
            self.function_module[function] = (self.function_sha.get(function) or
                                              (self.module_sha.get(handle) if handle is not None else None))
            if self.function_module[function] is None:
                self.launch_misses["cuFuncGetModule failed" if handle is None else "module load not seen"] += 1
        return self.layouts[function]

    def _launch(self, name: str, data: Any) -> Launch:
        if name.startswith("cuLaunchKernelEx"):
            ex = LaunchKernelExParams.from_address(self._params(data))
            grid, block, smem = read_config(ex.config)
            function, kernel_params, extra = ex.f, ex.kernelParams, ex.extra
        else:
            p = LaunchKernelParams.from_address(self._params(data))
            grid, block = (p.gridDimX, p.gridDimY, p.gridDimZ), (p.blockDimX, p.blockDimY, p.blockDimZ)
            smem, function, kernel_params, extra = p.sharedMemBytes, p.f, p.kernelParams, p.extra
        function = int(function or 0)
        layout = self._layout(function)
        symbol = data.symbol_name or _check(self.driver.cuFuncGetName(self.driver.CUfunction(function)),
                                            "cuFuncGetName").decode()
        return Launch(symbol, self.function_module[function], tuple(map(int, grid)), tuple(map(int, block)),  # type: ignore[arg-type]
                      int(smem), layout, read_params(int(kernel_params or 0), int(extra or 0), layout))


def _read_cubin_file(fname: int) -> bytes | None:
    """The ELF file whose NUL-terminated path `cuModuleLoad` was handed at address `fname` (None: no path, not
    readable, not ELF, or past CUBIN_FILE_MAX bytes)."""
    from kern_manifest import read_regular_file  # bounded, and never blocks on a FIFO (inside a CUPTI callback)

    if not fname:
        return None
    try:
        data = read_regular_file(os.fsdecode(ctypes.string_at(fname)), CUBIN_FILE_MAX, noun="a cubin")
    except (OSError, ValueError):
        return None
    return data if data[:4] == b"\x7fELF" else None


def _callback_names(cupti: Any, enum_name: str, domain: Any) -> dict[int, str]:
    """cbid -> API name of a callback domain: cupti-python's enum where it has one (13.4), else CUPTI's own
    `cuptiGetCallbackName` for every id below 4096 (it fails past the last)."""
    table = getattr(cupti, enum_name, None)
    if table is not None:
        return {int(m): m.name for m in table}
    names: dict[int, str] = {}
    for cbid in range(1, 4096):
        try:
            names[cbid] = str(cupti.get_callback_name(domain, cbid))
        except Exception:  # noqa: BLE001 - an id CUPTI does not know
            continue
    return names


# ---------------------------------------------------------------- the step


def _tensor(name: str, kind: str, t: Any) -> Tensor:
    dtype = TORCH_DTYPES.get(str(t.dtype).removeprefix("torch."))
    if dtype is None:
        raise CaptureError(f"{kind} {name}: dtype {t.dtype} has no kern dtype")
    if not t.is_cuda or not t.is_contiguous():
        raise CaptureError(f"{kind} {name}: not a contiguous CUDA tensor (the capture records address ranges)")
    return Tensor(name, kind, int(t.data_ptr()), int(t.numel() * t.element_size()), dtype, tuple(t.shape))


def named_tensors(step: HarvestStep, inputs: dict[str, Any], outputs: dict[str, Any]) -> tuple[Tensor, ...]:
    """The tensors of one recorded step, weights first (checkpoint names), then states, inputs, outputs."""
    out = [_tensor(n, "weight", t) for n, t in step.weights().items()]
    out += [_tensor(n, "state", t) for n, t in step.states().items()]
    out += [_tensor(n, "input", t) for n, t in inputs.items()]
    out += [_tensor(n, "output", t) for n, t in outputs.items()]
    return tuple(out)


def _kept_cubins(runs: list[Run], cubins: dict[str, bytes]) -> dict[str, bytes]:
    """The cubins a recorded launch ran; for a launch without a recorded module, each cubin holding its function."""
    kept = {l.module for r in runs for l in r.launches if l.module is not None}
    unknown = {l.function for r in runs for l in r.launches if l.module is None}
    if unknown:
        for sha, data in cubins.items():
            try:
                if unknown & set(cubin_entries(data)):
                    kept.add(sha)
            except CubinError:
                continue
    return {sha: cubins[sha] for sha in sorted(kept) if sha in cubins}


def capture(step_factory: Callable[[], HarvestStep], options: CaptureOptions, out_dir: str | Path,
            source: dict[str, Any] | None = None,
            progress: Callable[[str], None] = lambda line: None) -> tuple[Capture, HarvestStep]:
    """Capture the step `step_factory()` builds (module docstring) and write it to `out_dir` (which must not
    exist). The factory is called after CUPTI is subscribed, so the step's module loads are seen. Returns the
    capture and the step (compiled: a reference run in the same process uses the very kernels captured). Raises
    CaptureError (PYTORCH_NO_CUDA_MEMORY_CACHING not 1 before torch initialised CUDA, no GPU, a callback failure,
    a tensor that is not contiguous on the GPU) and OSError for the output."""
    import torch

    if os.environ.get(NO_CACHING) != "1":
        raise CaptureError(f"{NO_CACHING}=1 is needed (set before torch allocates: each tensor its own cudaMalloc)")
    if not torch.cuda.is_available():
        raise CaptureError("no CUDA device visible to torch")
    if Path(out_dir).exists():
        raise CaptureError(f"--out {out_dir}: exists; refusing to replace it")
    recorder = Recorder()
    recorder.subscribe()
    try:
        step = step_factory()
        for tokens in options.tokens:
            for i in range(options.warmup):
                progress(f"warm-up {i + 1}/{options.warmup} at {tokens} token(s)")
                step.step(step.inputs(tokens))
        torch.cuda.synchronize()
        runs = []
        for tokens in options.tokens:
            inputs = step.inputs(tokens)
            torch.cuda.synchronize()
            recorder.begin()
            outputs = step.step(inputs)
            torch.cuda.synchronize()
            events = recorder.end()
            runs.append(Run(tokens, tuple(events), named_tensors(step, inputs, outputs)))
            progress(f"recorded {len(runs[-1].launches)} launches at {tokens} token(s)")
    finally:
        recorder.unsubscribe()
    info = dict(source or {})
    info.update({"torch": torch.__version__, "device": torch.cuda.get_device_name(),
                 "triton": _version("triton"), "cupti-python": _version("cupti-python"),
                 "recorder": recorder.stats()})
    result = Capture(runs=tuple(runs), cubins=_kept_cubins(runs, recorder.cubins), source=info)
    write_capture(Path(out_dir), result)
    return result, step


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None
