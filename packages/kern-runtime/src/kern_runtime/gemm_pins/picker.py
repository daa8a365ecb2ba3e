"""`PinPicker`: the pin searches of kern_runtime.gemm_pins.search on one CUDA device, through cuBLASLt."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from ..cuda import WORKSPACE_BYTES, Blas, call
from ..cuda.driver import init_driver
from ..errors import CudaError
from .bench import DeviceBench
from .search import INVARIANT_DECODE_M_MAX, Log, pick_decode_pin, pick_invariant_decode_pin, pick_prefill_pin


def device_name(raw: Any) -> str:
    """cuDeviceGetName's buffer as text: bytes up to the first NUL (undecodable bytes replaced)."""
    return (raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)).split("\x00")[0]


def cublaslt_version() -> int:
    """cublasLtGetVersion() (e.g. 130100 for 13.1.0). Raises CudaError when nvmath-python is not installed."""
    try:
        from nvmath.bindings import cublasLt
    except ImportError as exc:
        raise CudaError(f"cuBLASLt pins need nvmath-python ({exc}): install kern-runtime's cu12 / cu13 "
                        "extra") from None
    return int(cublasLt.get_version())


class PinPicker:
    """Pin searches on CUDA device `gpu`: its primary context (retained and made current), a WORKSPACE_BYTES
    workspace and a `Blas`, all released by `close()` (or leaving a `with` block). `device` (cuDeviceGetName)
    and `cublaslt_version` are what a pins file is stamped with. Raises CudaError (no driver library, no
    nvmath-python), DriverError, BlasError; what was acquired before the failure is released."""

    def __init__(self, gpu: int = 0) -> None:
        init_driver()
        with ExitStack() as undo:
            handle = call("cuDeviceGet", gpu)
            context = call("cuDevicePrimaryCtxRetain", handle)
            undo.callback(call, "cuDevicePrimaryCtxRelease", handle)
            call("cuCtxSetCurrent", context)
            self.device = device_name(call("cuDeviceGetName", 256, handle))
            self.cublaslt_version = cublaslt_version()
            workspace = int(call("cuMemAlloc", WORKSPACE_BYTES))
            undo.callback(call, "cuMemFree", workspace)
            self.blas = Blas(workspace)
            undo.callback(self.blas.close)
            self._undo = undo.pop_all()

    def prefill(self, n: int, k: int, m_max: int, log: Log | None = None) -> dict[str, Any]:
        """The batch-invariant pin of the (n, k) GEMM up to M = `m_max` (search.pick_prefill_pin's row). Raises
        PinSearchError when no candidate is invariant, DriverError / BlasError."""
        bench = DeviceBench(self.blas, n, k, m_max, seed=n * 131 + k)
        try:
            return pick_prefill_pin(bench, log)
        finally:
            bench.close()

    def decode(self, n: int, k: int, log: Log | None = None) -> dict[str, Any]:
        """The fastest M = 1 pin of the (n, k) GEMM (search.pick_decode_pin's row). Raises PinSearchError,
        DriverError / BlasError."""
        bench = DeviceBench(self.blas, n, k, 1, seed=n * 131 + k)
        try:
            return pick_decode_pin(bench, log)
        finally:
            bench.close()

    def invariant_decode(self, n: int, k: int, log: Log | None = None,
                         fallback: dict[str, int] | None = None) -> dict[str, Any]:
        """The batch-invariant decode pin of the (n, k) GEMM, split-K allowed, proven over M = 1 .. 64
        (search.pick_invariant_decode_pin's row; `fallback`: the shape's prefill pin, a candidate too). Raises
        PinSearchError when no candidate is invariant, DriverError / BlasError."""
        bench = DeviceBench(self.blas, n, k, INVARIANT_DECODE_M_MAX, seed=n * 131 + k)
        try:
            return pick_invariant_decode_pin(bench, log, fallback)
        finally:
            bench.close()

    def close(self) -> None:
        self._undo.close()

    def __enter__(self) -> PinPicker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
