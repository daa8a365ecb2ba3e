"""The projection ops of the prefill program and of the cuBLASLt decode (`--decode gemm`): which op an (n, k)
projection calls, declared on first use. Row-major C[m, n] = A[m, k] @ W[n, k]^T through
`extern:cublaslt_bf16_tn`, or kern_gemv_rows at M = 1 (`--m1-gemv`)."""

from __future__ import annotations

from typing import Any

from .builder import Builder, int_arg, ptr
from .gemv import rows_launch
from .options import Plan

_GEMM_ARGS = ("a", "w", "c")


def _cublaslt(**extra: Any) -> dict[str, Any]:
    """One cuBLASLt launch of the (a, w, c, m, n, k) interface; `extra`: `when`, `algo`."""
    return {"extern": "cublaslt_bf16_tn",
            "args": [{"arg": "a"}, {"arg": "w"}, {"arg": "c"}, {"arg": "m", "type": "i64"},
                     {"arg": "n", "type": "i64"}, {"arg": "k", "type": "i64"}], **extra}


def _interface() -> list[dict[str, str]]:
    return [*(ptr(a) for a in _GEMM_ARGS), int_arg("m"), int_arg("n"), int_arg("k")]


class Projections:
    """Names (and declares in the Builder) the op of each projection shape; the pins come from the plan."""

    def __init__(self, b: Builder, plan: Plan) -> None:
        self.b, self.opts = b, plan.opts
        self.pins = {(n, k): dict(algo) for n, k, algo in plan.opts.algos}
        self.decode_pins = {(n, k): dict(algo) for n, k, algo in plan.opts.decode_algos}

    def op(self, n: int, k: int, decode: bool = False) -> str:
        """The op of an (n, k) projection. Prefill: `gemm_<n>x<k>` with the pinned batch-invariant algorithm for
        every M (tools/pick_algos.py; what lets a cached prefix resume at any token). Decode (M = 1, nothing
        cached from it): `gemm_m1_<n>x<k>` with the fastest M = 1 algorithm (split-K allowed) when the pins
        file has one - a prefill pin (no split-K) is 1.9x slower there (measured: 4B `--decode gemm` 6.98 vs
        3.66 ms/token). Otherwise `gemm`: cuBLASLt's heuristic per M."""
        if decode and self.opts.m1_gemv:
            return self._gemv_m1(n, k)
        table, prefix = (self.decode_pins, "gemm_m1") if decode else (self.pins, "gemm")
        name = f"{prefix}_{n}x{k}" if (n, k) in table else "gemm"
        if name not in self.b.ops:
            self.b.op(name, _interface(), self._launches(table, n, k, decode))
        return name

    def _launches(self, table: dict[tuple[int, int], dict[str, int]], n: int, k: int,
                  decode: bool) -> list[dict[str, Any]]:
        if (n, k) not in table:
            return [_cublaslt()]
        if not decode:
            return [_cublaslt(algo=table[(n, k)])]
        # the decode program runs at tokens = 1 only; the rest of the tokens range stays on the heuristic, so the
        # M = 1 pin (split-K: workspace grows with M) is checked at load where it is used
        launches = [_cublaslt(when={"tokens": [1, 1]}, algo=table[(n, k)])]
        if self.opts.chunk_max > 1:
            launches.append(_cublaslt(when={"tokens": [2, self.opts.chunk_max]}))
        return launches

    def _gemv_m1(self, n: int, k: int) -> str:
        """`--m1-gemv`: the decode projection (n, k) as `gemv_m1_<n>x<k>`, kern_gemv_rows at tokens = 1 (c = W a,
        docs/kernels-gemv.md "Rows entries") and cuBLASLt's heuristic for the rest of the tokens range (never
        used by the decode program, which runs at tokens = 1)."""
        name = f"gemv_m1_{n}x{k}"
        if name not in self.b.ops:
            gemv = rows_launch(self.b, "kern_gemv_rows", -(-n // 4), k,
                               [{"arg": "w"}, {"arg": "a"}, {"arg": "c"}, {"i32": n}, {"i32": k}], self.opts)
            launches = [{**gemv, "when": {"tokens": [1, 1]}}]
            if self.opts.chunk_max > 1:
                launches.append(_cublaslt(when={"tokens": [2, self.opts.chunk_max]}))
            self.b.op(name, _interface(), launches)
        return name
