"""Extern GEMMs through cuBLASLt (nvmath-python's low-level `nvmath.bindings.cublasLt`).

Row-major to column-major: the manifest's `C[m, n] = A[m, k] @ W[n, k]^T` (row-major, C row stride
`ldc`, A row stride `lda`, in elements) is computed as the column-major product

    C^T (n x m, ld = ldc)  =  op(W) (n x k)  x  A^T (k x m, ld = lda)

where W, row-major [n, k], is read as a column-major k x n matrix with ld = k and transposed
(transa = T), and A, row-major [m, k] with row stride lda, is a column-major k x m matrix with
ld = lda (transb = N). This is also the layout cuBLASLt requires for fp8 (A transposed, B not).

Descriptors, layouts and the algorithm are chosen once per shape key (extern, m, n, k, ldc, lda,
pointer alignments, scale pointers) - at load for pinned algorithms, on first use otherwise - so a
replay does no heuristic query and no host synchronisation. The 32 MiB workspace is allocated once,
which makes the calls capturable. Every cuBLASLt call goes through `blas_call`, raising `BlasError`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import ApiError, BlasError, KernelArtifactError, ManifestError

WORKSPACE_BYTES = 32 * 1024 * 1024

ALGO_KEYS: dict[str, str] = {
    "id": "ID", "tile": "TILE_ID", "stages": "STAGES_ID", "split_k": "SPLITK_NUM", "reduction": "REDUCTION_SCHEME",
    "swizzle": "CTA_SWIZZLING", "custom": "CUSTOM_OPTION", "inner_shape": "INNER_SHAPE_ID",
    "cluster_shape": "CLUSTER_SHAPE_ID",
}


@dataclass(frozen=True)
class ExternKind:
    """Element types of one extern GEMM: cudaDataType names for A/B (inputs) and C/D (output)."""

    name: str
    ab: str  # "bf16" | "fp8_e4m3"
    cd: str  # "bf16" | "f32"
    beta: float
    fp8: bool


EXTERN_GEMMS: dict[str, ExternKind] = {
    "cublaslt_bf16_tn": ExternKind("cublaslt_bf16_tn", "bf16", "bf16", 0.0, False),
    "cublaslt_bf16_tn_acc": ExternKind("cublaslt_bf16_tn_acc", "bf16", "bf16", 1.0, False),
    "cublas_bf16_tn_f32": ExternKind("cublas_bf16_tn_f32", "bf16", "f32", 0.0, False),
    "cublaslt_fp8_tn": ExternKind("cublaslt_fp8_tn", "fp8_e4m3", "bf16", 0.0, True),
    "cublaslt_fp8_tn_f32": ExternKind("cublaslt_fp8_tn_f32", "fp8_e4m3", "f32", 0.0, True),
}


@dataclass(frozen=True)
class GemmCall:
    """One GEMM's operands: device addresses and sizes in elements (row-major view)."""

    kind: ExternKind
    a: int
    w: int
    c: int
    m: int
    n: int
    k: int
    ldc: int
    lda: int
    a_scale: int = 0
    w_scale: int = 0


def gemm_call(extern: str, args: tuple[int, ...], where: str) -> GemmCall:
    """Interpret an extern record's integer args. Raises ApiError for sizes that cannot be a GEMM
    (non-positive n/k, negative m, strides shorter than a row, fp8 k not a multiple of 16)."""
    kind = EXTERN_GEMMS.get(extern)
    if kind is None:
        raise ManifestError(f"{where}: {extern!r} is not a GEMM extern")
    if kind.fp8:
        a, w, c, a_scale, w_scale, m, n, k = args[:8]
        ldc = args[8] if len(args) > 8 else n
        lda = k
    else:
        a, w, c, m, n, k = args[:6]
        ldc = args[6] if len(args) > 6 else n
        lda = args[7] if len(args) > 7 else k
        a_scale = w_scale = 0
    if m < 0 or n <= 0 or k <= 0:
        raise ApiError(f"{where}: GEMM sizes m={m} n={n} k={k} (need m >= 0, n > 0, k > 0)")
    if ldc < n or lda < k:
        raise ApiError(f"{where}: row strides ldc={ldc} (>= n={n}) and lda={lda} (>= k={k}) are too short")
    if kind.fp8 and k % 16:
        raise ApiError(f"{where}: fp8 GEMM needs k % 16 == 0, got k={k}")
    return GemmCall(kind, a, w, c, m, n, k, ldc, lda, a_scale, w_scale)


@dataclass(frozen=True)
class LtShape:
    """cuBLASLt (column-major) view of a GemmCall: matrix A_lt = W (rows k, cols n, ld k, transposed),
    B_lt = activation (rows k, cols m, ld lda), C_lt = D_lt = output (rows n, cols m, ld ldc)."""

    a_rows: int
    a_cols: int
    a_ld: int
    b_rows: int
    b_cols: int
    b_ld: int
    c_rows: int
    c_cols: int
    c_ld: int


def lt_shape(g: GemmCall) -> LtShape:
    """The column-major mapping of `C[m,n] = A[m,k] @ W[n,k]^T` (module docstring)."""
    return LtShape(g.k, g.n, g.k, g.k, g.m, g.lda, g.n, g.m, g.ldc)


def alignment_bytes(address: int, cap: int = 256) -> int:
    """Largest power of two dividing `address`, capped at `cap` (cuBLASLt's MIN_ALIGNMENT_*)."""
    if address == 0:
        return cap
    return min(address & -address, cap)


def shape_key(g: GemmCall) -> tuple:
    """What a plan depends on: everything but the pointers' values beyond their alignment."""
    return (g.kind.name, g.m, g.n, g.k, g.ldc, g.lda, alignment_bytes(g.a), alignment_bytes(g.w),
            alignment_bytes(g.c), g.a_scale, g.w_scale)


def check_algo_keys(algo: Mapping[str, Any], where: str) -> None:
    unknown = sorted(set(algo) - set(ALGO_KEYS))
    if unknown:
        raise ManifestError(f"{where}.algo: unknown keys {unknown}; expected some of {sorted(ALGO_KEYS)}")
    if "id" not in algo:
        raise ManifestError(f"{where}.algo: an algorithm pin needs at least 'id'")


# ---------------------------------------------------------------- cuBLASLt side


def _lt():
    return importlib.import_module("nvmath.bindings.cublasLt")


def blas_call(name: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Call a cuBLASLt binding; a failure becomes BlasError(name, status name)."""
    lt = _lt()
    try:
        return fn(*args)
    except lt.cuBLASLtError as exc:
        status = getattr(exc, "status", None)
        if status is None and exc.args and isinstance(exc.args[0], int):
            status = exc.args[0]
        try:
            result = lt.get_status_name(int(status)) if status is not None else str(exc)
        except Exception:  # noqa: BLE001
            result = str(exc)
        raise BlasError(name, result, int(status) if status is not None else -1) from exc


def _cuda_type(dtype: str) -> int:
    import nvmath

    return int({"bf16": nvmath.CudaDataType.CUDA_R_16BF, "f32": nvmath.CudaDataType.CUDA_R_32F,
                "fp8_e4m3": nvmath.CudaDataType.CUDA_R_8F_E4M3}[dtype])


def _compute_32f() -> int:
    from nvmath.bindings import cublas

    return int(cublas.ComputeType.COMPUTE_32F)


def _scalar(value, dtype) -> np.ndarray:
    return np.array([value], dtype=dtype)


def algo_config(algo: np.ndarray) -> dict[str, int]:
    """Every pinnable attribute (ALGO_KEYS) of a cublasLtMatmulAlgo_t (`algo`: [1] matmul_algo_dtype), read with
    cublasLtMatmulAlgoConfigGetAttribute; the inverse of how `Blas` builds a pinned algorithm. Raises BlasError."""
    lt = _lt()
    out = {}
    for key, name in ALGO_KEYS.items():
        attr = getattr(lt.MatmulAlgoConfigAttribute, name)
        buf = np.zeros(1, dtype=lt.get_matmul_algo_config_attribute_dtype(attr))
        written = np.zeros(1, dtype=np.uint64)
        blas_call("cublasLtMatmulAlgoConfigGetAttribute", lt.matmul_algo_config_get_attribute, algo.ctypes.data,
                  int(attr), buf.ctypes.data, buf.nbytes, written.ctypes.data)
        out[key] = int(buf[0])
    return out


@dataclass
class GemmPlan:
    """Descriptors and algorithm of one shape key (owned by `Blas`)."""

    desc: int
    a_layout: int
    b_layout: int
    c_layout: int
    algo: np.ndarray  # [1] matmul_algo_dtype
    workspace_bytes: int
    beta: np.ndarray  # [1] f32, host scalar


class Blas:
    """A cuBLASLt handle, its 32 MiB workspace and the plan cache. Create with an active context.

    `workspace_address`: device address of WORKSPACE_BYTES bytes (allocated by the runtime's ledger).
    """

    def __init__(self, workspace_address: int) -> None:
        lt = _lt()
        self.handle = blas_call("cublasLtCreate", lt.create)
        self.workspace = workspace_address
        self._plans: dict[tuple, GemmPlan] = {}
        self._alpha = _scalar(1.0, np.float32)
        self._betas = {0.0: _scalar(0.0, np.float32), 1.0: _scalar(1.0, np.float32)}

    def close(self) -> None:
        lt = _lt()
        for plan in self._plans.values():
            blas_call("cublasLtMatrixLayoutDestroy", lt.matrix_layout_destroy, plan.a_layout)
            blas_call("cublasLtMatrixLayoutDestroy", lt.matrix_layout_destroy, plan.b_layout)
            blas_call("cublasLtMatrixLayoutDestroy", lt.matrix_layout_destroy, plan.c_layout)
            blas_call("cublasLtMatmulDescDestroy", lt.matmul_desc_destroy, plan.desc)
        self._plans.clear()
        if self.handle:
            blas_call("cublasLtDestroy", lt.destroy, self.handle)
            self.handle = 0

    def _set_desc(self, desc: int, attr, value, dtype) -> None:
        lt = _lt()
        buf = np.array([value], dtype=dtype)
        blas_call("cublasLtMatmulDescSetAttribute", lt.matmul_desc_set_attribute, desc, int(attr), buf.ctypes.data, buf.nbytes)

    def describe_gemm(self, g: GemmCall) -> tuple[int, int, int, int]:
        """(matmul desc, A, B, C layout) handles for `g` (row-major C[m, n] = A[m, k] @ W[n, k]^T as cuBLASLt's
        column-major TN, f32 compute); the caller destroys them. Raises BlasError."""
        lt = _lt()
        from nvmath.bindings import cublas

        desc = blas_call("cublasLtMatmulDescCreate", lt.matmul_desc_create, _compute_32f(), _cuda_type("f32"))
        a = b = c = 0
        try:
            self._set_desc(desc, lt.MatmulDescAttribute.TRANSA, int(cublas.Operation.T), np.int32)
            self._set_desc(desc, lt.MatmulDescAttribute.TRANSB, int(cublas.Operation.N), np.int32)
            if g.kind.fp8:
                # cuBLASLt's A is W here, its B the activation
                self._set_desc(desc, lt.MatmulDescAttribute.A_SCALE_POINTER, g.w_scale, np.uint64)
                self._set_desc(desc, lt.MatmulDescAttribute.B_SCALE_POINTER, g.a_scale, np.uint64)
            s = lt_shape(g)
            ab, cd = _cuda_type(g.kind.ab), _cuda_type(g.kind.cd)
            a = blas_call("cublasLtMatrixLayoutCreate", lt.matrix_layout_create, ab, s.a_rows, s.a_cols, s.a_ld)
            b = blas_call("cublasLtMatrixLayoutCreate", lt.matrix_layout_create, ab, s.b_rows, s.b_cols, s.b_ld)
            c = blas_call("cublasLtMatrixLayoutCreate", lt.matrix_layout_create, cd, s.c_rows, s.c_cols, s.c_ld)
        except BaseException:
            for layout in (a, b, c):
                if layout:
                    lt.matrix_layout_destroy(layout)
            lt.matmul_desc_destroy(desc)
            raise
        return desc, a, b, c

    def _heuristic_results(self, g: GemmCall, desc: int, a: int, b: int, c: int,
                           count: int) -> list[tuple[np.ndarray, int]]:
        lt = _lt()
        pref = blas_call("cublasLtMatmulPreferenceCreate", lt.matmul_preference_create)
        try:
            def set_pref(attr, value, dtype):
                buf = np.array([value], dtype=dtype)
                blas_call("cublasLtMatmulPreferenceSetAttribute", lt.matmul_preference_set_attribute,
                          pref, int(attr), buf.ctypes.data, buf.nbytes)

            P = lt.MatmulPreferenceAttribute
            set_pref(P.MAX_WORKSPACE_BYTES, WORKSPACE_BYTES, np.uint64)
            set_pref(P.MIN_ALIGNMENT_A_BYTES, alignment_bytes(g.w), np.uint32)
            set_pref(P.MIN_ALIGNMENT_B_BYTES, alignment_bytes(g.a), np.uint32)
            set_pref(P.MIN_ALIGNMENT_C_BYTES, alignment_bytes(g.c), np.uint32)
            set_pref(P.MIN_ALIGNMENT_D_BYTES, alignment_bytes(g.c), np.uint32)
            results = np.zeros(count, dtype=lt.matmul_heuristic_result_dtype)
            found = np.zeros(1, dtype=np.int32)
            blas_call("cublasLtMatmulAlgoGetHeuristic", lt.matmul_algo_get_heuristic, self.handle, desc, a, b, c, c,
                      pref, count, results.ctypes.data, found.ctypes.data)
        finally:
            lt.matmul_preference_destroy(pref)
        out = []
        for i in range(int(found[0])):
            algo = np.zeros(1, dtype=lt.matmul_algo_dtype)
            algo[0] = results[i]["algo"]
            out.append((algo, int(results[i]["workspace_size"])))
        return out

    def _heuristic(self, g: GemmCall, desc: int, a: int, b: int, c: int) -> tuple[np.ndarray, int]:
        results = self._heuristic_results(g, desc, a, b, c, 1)
        if not results:
            raise BlasError("cublasLtMatmulAlgoGetHeuristic", "CUBLAS_STATUS_NOT_SUPPORTED (no algorithm)", 15)
        return results[0]

    def heuristic(self, g: GemmCall, count: int) -> list[dict[str, int]]:
        """Up to `count` of cuBLASLt's heuristic choices for `g` (best first, with this planner's workspace limit
        and pointer alignments), each as its configuration (`algo_config`: every ALGO_KEYS attribute).
        kern_runtime.gemm_pins takes its candidates from here. Raises BlasError."""
        lt = _lt()
        desc, a, b, c = self.describe_gemm(g)
        try:
            return [algo_config(algo) for algo, _ in self._heuristic_results(g, desc, a, b, c, count)]
        finally:
            for layout in (a, b, c):
                lt.matrix_layout_destroy(layout)
            lt.matmul_desc_destroy(desc)

    def _pinned(self, g: GemmCall, algo_pin: Mapping[str, int], desc: int, a: int, b: int, c: int, where: str) -> tuple[np.ndarray, int]:
        lt = _lt()
        algo = np.zeros(1, dtype=lt.matmul_algo_dtype)
        ab, cd = _cuda_type(g.kind.ab), _cuda_type(g.kind.cd)
        try:
            blas_call("cublasLtMatmulAlgoInit", lt.matmul_algo_init, self.handle, _compute_32f(), _cuda_type("f32"),
                      ab, ab, cd, cd, int(algo_pin["id"]), algo.ctypes.data)
            for key, value in algo_pin.items():
                if key == "id":
                    continue
                attr = getattr(lt.MatmulAlgoConfigAttribute, ALGO_KEYS[key])
                buf = np.array([value], dtype=lt.get_matmul_algo_config_attribute_dtype(attr))
                blas_call("cublasLtMatmulAlgoConfigSetAttribute", lt.matmul_algo_config_set_attribute,
                          algo.ctypes.data, int(attr), buf.ctypes.data, buf.nbytes)
            result = np.zeros(1, dtype=lt.matmul_heuristic_result_dtype)
            blas_call("cublasLtMatmulAlgoCheck", lt.matmul_algo_check, self.handle, desc, a, b, c, c,
                      algo.ctypes.data, result.ctypes.data)
        except BlasError as exc:
            raise KernelArtifactError(
                f"{where}: pinned cuBLASLt algo {dict(algo_pin)} does not apply to m={g.m} n={g.n} k={g.k} "
                f"ldc={g.ldc} lda={g.lda}: {exc}"
            ) from exc
        workspace = int(result[0]["workspace_size"])
        if workspace > WORKSPACE_BYTES:
            raise KernelArtifactError(
                f"{where}: pinned cuBLASLt algo {dict(algo_pin)} needs {workspace} bytes of workspace at m={g.m} n={g.n} "
                f"k={g.k}, more than {WORKSPACE_BYTES}"
            )
        return algo, workspace

    def plan(self, g: GemmCall, algo_pin: Mapping[str, int] | None = None, where: str = "") -> GemmPlan:
        """The cached plan for `g`'s shape key, built on first use (heuristic, or the pinned algo
        checked with cublasLtMatmulAlgoCheck: KernelArtifactError when it does not apply)."""
        key = shape_key(g) + ((tuple(sorted(algo_pin.items())),) if algo_pin else ())
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        lt = _lt()
        desc, a, b, c = self.describe_gemm(g)
        try:
            if algo_pin:
                algo, workspace = self._pinned(g, algo_pin, desc, a, b, c, where)
            else:
                algo, workspace = self._heuristic(g, desc, a, b, c)
        except BaseException:
            for layout in (a, b, c):
                lt.matrix_layout_destroy(layout)
            lt.matmul_desc_destroy(desc)
            raise
        plan = GemmPlan(desc, a, b, c, algo, workspace, self._betas[g.kind.beta])
        self._plans[key] = plan
        return plan

    def matmul(self, g: GemmCall, stream: int, algo_pin: Mapping[str, int] | None = None, where: str = "") -> None:
        """Enqueue `g` on `stream` (capturable; no host sync). m == 0 enqueues nothing."""
        if g.m == 0:
            return
        lt = _lt()
        plan = self.plan(g, algo_pin, where)
        blas_call("cublasLtMatmul", lt.matmul, self.handle, plan.desc, self._alpha.ctypes.data,
                  g.w, plan.a_layout, g.a, plan.b_layout, plan.beta.ctypes.data, g.c, plan.c_layout,
                  g.c, plan.c_layout, plan.algo.ctypes.data, self.workspace, WORKSPACE_BYTES, stream)
