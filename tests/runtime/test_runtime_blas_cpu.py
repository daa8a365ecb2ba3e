"""cuBLASLt mapping arithmetic (row-major manifest view -> column-major cuBLASLt view)."""

from __future__ import annotations

import numpy as np
import pytest

from kern_runtime import ApiError, ManifestError
from kern_runtime.cuda.blas import alignment_bytes, check_algo_keys, gemm_call, lt_shape, shape_key


def test_default_strides_and_mapping() -> None:
    g = gemm_call("cublaslt_bf16_tn", (0x1000, 0x2000, 0x3000, 5, 48, 32), "x")
    assert (g.m, g.n, g.k, g.ldc, g.lda, g.kind.beta) == (5, 48, 32, 48, 32, 0.0)
    s = lt_shape(g)
    # W[n,k] row-major == col-major k x n (ld k), transposed; A[m,k] (row stride lda) == col-major k x m
    assert (s.a_rows, s.a_cols, s.a_ld) == (32, 48, 32)
    assert (s.b_rows, s.b_cols, s.b_ld) == (32, 5, 32)
    assert (s.c_rows, s.c_cols, s.c_ld) == (48, 5, 48)


def test_strided_output_and_input() -> None:
    g = gemm_call("cublaslt_bf16_tn_acc", (0, 0, 0, 3, 16, 8, 64, 24), "x")
    assert (g.ldc, g.lda, g.kind.beta) == (64, 24, 1.0)
    s = lt_shape(g)
    assert (s.b_ld, s.c_ld) == (24, 64)


def test_column_major_mapping_reproduces_row_major_product() -> None:
    """Emulate the column-major GEMM on flat memory exactly as cuBLASLt reads and writes it."""
    rng = np.random.default_rng(0)
    m, n, k, ldc, lda = 3, 5, 4, 9, 6
    a_mem = rng.standard_normal(m * lda)  # A rows of stride lda
    w_mem = rng.standard_normal(n * k)
    c_mem = np.zeros(m * ldc)
    g = gemm_call("cublaslt_bf16_tn", (0, 0, 0, m, n, k, ldc, lda), "x")
    s = lt_shape(g)

    def col(mem, rows, cols, ld):  # a column-major view of flat memory
        return np.lib.stride_tricks.as_strided(mem, (rows, cols), (8, 8 * ld))

    lt_a = col(w_mem, s.a_rows, s.a_cols, s.a_ld)  # k x n
    lt_b = col(a_mem, s.b_rows, s.b_cols, s.b_ld)  # k x m
    col(c_mem, s.c_rows, s.c_cols, s.c_ld)[:] = lt_a.T @ lt_b  # transa = T, transb = N
    A = np.lib.stride_tricks.as_strided(a_mem, (m, k), (8 * lda, 8))
    W = w_mem.reshape(n, k)
    C = np.lib.stride_tricks.as_strided(c_mem, (m, n), (8 * ldc, 8))
    np.testing.assert_allclose(C, A @ W.T)
    # the columns between n and ldc are untouched
    assert np.all(np.lib.stride_tricks.as_strided(c_mem[n:], (m, ldc - n), (8 * ldc, 8)) == 0)


def test_fp8_args_and_k_multiple_of_16() -> None:
    g = gemm_call("cublaslt_fp8_tn", (1, 2, 3, 4, 5, 7, 32, 64), "x")
    assert (g.a_scale, g.w_scale, g.m, g.n, g.k, g.ldc, g.lda) == (4, 5, 7, 32, 64, 32, 64)
    assert g.kind.cd == "bf16" and gemm_call("cublaslt_fp8_tn_f32", (1, 2, 3, 4, 5, 7, 32, 64, 40), "x").ldc == 40
    with pytest.raises(ApiError, match="k % 16 == 0, got k=24"):
        gemm_call("cublaslt_fp8_tn", (1, 2, 3, 4, 5, 7, 32, 24), "x")


@pytest.mark.parametrize("args", [(0, 0, 0, 1, 0, 8), (0, 0, 0, -1, 8, 8), (0, 0, 0, 1, 8, 8, 4), (0, 0, 0, 1, 8, 8, 8, 4)])
def test_bad_sizes_are_api_errors(args) -> None:
    with pytest.raises(ApiError):
        gemm_call("cublaslt_bf16_tn", args, "x")


def test_alignment_and_shape_key() -> None:
    assert alignment_bytes(0x1000) == 256 and alignment_bytes(0x1010) == 16 and alignment_bytes(0x1002) == 2
    a = gemm_call("cublaslt_bf16_tn", (0x1000, 0x2000, 0x3000, 5, 48, 32), "x")
    b = gemm_call("cublaslt_bf16_tn", (0x5000, 0x6000, 0x7000, 5, 48, 32), "x")
    c = gemm_call("cublaslt_bf16_tn", (0x5000, 0x6000, 0x7010, 5, 48, 32), "x")
    assert shape_key(a) == shape_key(b) != shape_key(c)


def test_algo_keys() -> None:
    check_algo_keys({"id": 6, "tile": 18, "split_k": 1}, "x")
    with pytest.raises(ManifestError, match="unknown keys \\['tiles'\\]"):
        check_algo_keys({"id": 6, "tiles": 1}, "x")
    with pytest.raises(ManifestError, match="needs at least 'id'"):
        check_algo_keys({"tile": 1}, "x")
