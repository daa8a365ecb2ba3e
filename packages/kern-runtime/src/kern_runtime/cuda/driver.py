"""The CUDA driver, imported lazily, and the one `check()` every driver call goes through.

`import kern_runtime` never loads libcuda: `cu()` imports `cuda.bindings.driver` on first use.
Every driver call is made as `call("cuMemAlloc", nbytes)`: it returns the call's outputs (a single
value, a tuple, or None) and raises `DriverError` naming the call and the result on failure.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from ..errors import CudaError, DriverError, KernError


def cu() -> ModuleType:
    """The `cuda.bindings.driver` module. Raises `CudaError` if cuda-bindings is not installed."""
    try:
        return importlib.import_module("cuda.bindings.driver")
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise CudaError(f"cuda-bindings is not importable: {exc}") from exc


def result_name(result: Any) -> tuple[str, int, str]:
    """(name, code, explanation) of a CUresult, best effort (the explanation query can fail)."""
    driver = cu()
    code = int(result)
    try:
        name = driver.CUresult(code).name
    except ValueError:
        name = f"CUresult({code})"
    explanation = ""
    try:
        err, text = driver.cuGetErrorString(driver.CUresult(code))
        if int(err) == 0 and text:
            explanation = text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # noqa: BLE001 - the explanation is decoration only
        explanation = ""
    return name, code, explanation


def check(call_name: str, outcome: Any) -> Any:
    """Unpack a cuda.bindings return value `(CUresult, *outputs)`.

    Returns None for no outputs, the output for one, the tuple otherwise.
    Raises `DriverError(call_name, result_name)` when the result is not CUDA_SUCCESS.
    """
    if isinstance(outcome, tuple):
        result, outputs = outcome[0], outcome[1:]
    else:
        result, outputs = outcome, ()
    if int(result) != 0:
        name, code, explanation = result_name(result)
        raise DriverError(call_name, name, code, explanation)
    if not outputs:
        return None
    if len(outputs) == 1:
        return outputs[0]
    return outputs


def call(call_name: str, *args: Any) -> Any:
    """Call driver function `call_name` with `args` and `check()` the result."""
    return check(call_name, getattr(cu(), call_name)(*args))


NO_DRIVER_LIBRARY = ("no CUDA device: the CUDA driver library cannot be loaded ({kind}); kern needs an NVIDIA GPU "
                     "and driver")
"""The one line `kern run` prints (kern_run.preflight.probe_device) when libcuda cannot be loaded."""


def init_driver() -> None:
    """`cuInit(0)`: the first driver call, where cuda-bindings loads libcuda. Raises `CudaError` with the
    `NO_DRIVER_LIBRARY` line when the library cannot be loaded (cuda.pathfinder's `DynamicLibNotFoundError`,
    or any other failure to load it, would otherwise escape as a non-kern exception), `DriverError` when
    cuInit itself fails (no device, driver too old)."""
    try:
        init = getattr(cu(), "cuInit")
        outcome = init(0)
    except KernError:
        raise
    except Exception as exc:  # noqa: BLE001 - no libcuda at all raises from inside cuda-bindings
        raise CudaError(NO_DRIVER_LIBRARY.format(kind=type(exc).__name__)) from exc
    check("cuInit", outcome)


def handle_int(handle: Any) -> int:
    """The integer value of a driver handle (CUdeviceptr, CUstream, CUfunction, ...)."""
    return int(handle)
