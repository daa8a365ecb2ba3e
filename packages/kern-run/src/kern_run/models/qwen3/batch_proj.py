"""The projections of a batched decode step (seqs 2..seqs_max) beside the M = 1 GEMV launch of each `--gemv v2`
projection op: `batch_proj` "cublaslt" (the default) or "mma" (mma.py, kernels-src/gemv_mma.cu).

Why cuBLASLt: measured on the H200 at the Qwen3-4B shapes (bench/gemv.py --mma, docs/perf.md "Fourteenth
session"), cuBLASLt's heuristic algorithm at m = 2..64 stays within 3-17% of the M = 1 GEMV's time (lm_head m = 64:
191.5 us against 174.3), while the small-M MMA entries took 2-4x longer. The fused prologue and epilogues of the
GEMVs are then separate launches, each under `when: {"seqs": [2, seqs_max]}` so that a seqs = 1 step runs
exactly the GEMV launch:

    RMSNorm prologue (qkv, gate_up, lm_head)  kern_add_rmsnorm(residual) -> scratch `normed` [seqs, hidden] bf16
    projection                                cublaslt_bf16_tn: y[seqs, n] = normed @ W^T
    residual epilogue (o, down)               cublaslt_bf16_tn_acc: residual[seqs, hidden] += x @ W^T (beta = 1,
                                              one f32 -> bf16 rounding of residual + dot, where the GEMV rounds
                                              the dot to bf16 first)
    SwiGLU epilogue (gate_up)                 cublaslt into scratch `gate_up` [seqs, 2 * inter], then
                                              kern_silu_mul -> act

A row's values then depend on the algorithm cuBLASLt picks for each m: rows are bit-identical across batch
sizes only where it picks the same one (tests/run: the batched GPU tests state what they check).
"""

from __future__ import annotations

from typing import Any

from ...errors import ManifestBuildError
from .builder import Builder
from .mma import mma_launches
from .options import Plan

BATCH_PROJ = ("cublaslt", "mma")
_SEQS_I32 = {"expr": "seqs", "type": "i32"}
_SEQS_I64 = {"expr": "seqs", "type": "i64"}


def _when(plan: Plan) -> dict[str, list[int]]:
    return {"seqs": [2, plan.opts.seqs_max]}


def _rmsnorm(b: Builder, plan: Plan) -> dict[str, Any]:
    """kern_add_rmsnorm without a delta: scratch `normed` = RMSNorm(residual) * norm_w, one block per row."""
    cfg = plan.cfg
    return {**b.launch("kern_add_rmsnorm", ["seqs", 1, 1], [256, 1, 1],
                       [{"arg": "residual"}, {"null": 8}, {"arg": "norm_w"}, {"scratch": "normed"}, dict(_SEQS_I32),
                        {"i32": cfg.hidden}, {"f32": cfg.eps}]), "when": _when(plan)}


def _gemm(plan: Plan, a: dict[str, str], c: dict[str, str], n: int, k: int, acc: bool = False) -> dict[str, Any]:
    return {"extern": "cublaslt_bf16_tn_acc" if acc else "cublaslt_bf16_tn",
            "args": [a, {"arg": "w"}, c, dict(_SEQS_I64), {"i64": n}, {"i64": k}], "when": _when(plan)}


def _cublaslt_launches(b: Builder, plan: Plan, kind: str, n: int, k: int) -> tuple[list[dict[str, Any]],
                                                                                    dict[str, str]]:
    """(launches, scratch) of one projection op for seqs >= 2; `kind` as mma.KINDS, `n` the output rows (SwiGLU:
    inter)."""
    H = plan.cfg.hidden
    if kind == "residual":
        return [_gemm(plan, {"arg": "x"}, {"arg": "residual"}, n, k, acc=True)], {}
    scratch = {"normed": f"seqs * {H * 2}"}
    if kind == "rmsnorm":
        return [_rmsnorm(b, plan), _gemm(plan, {"scratch": "normed"}, {"arg": "y"}, n, k)], scratch
    silu = {**b.launch("kern_silu_mul", ["seqs", -(-n // 1024), 1], [256, 1, 1],
                       [{"scratch": "gate_up"}, {"arg": "y"}, dict(_SEQS_I32), {"i32": n}]), "when": _when(plan)}
    return ([_rmsnorm(b, plan), _gemm(plan, {"scratch": "normed"}, {"scratch": "gate_up"}, 2 * n, k), silu],
            {**scratch, "gate_up": f"seqs * {2 * n * 2}"})


def batched(b: Builder, plan: Plan, bs1: dict[str, Any], kind: str, n: int, k: int, args: list[dict[str, Any]],
            tail: tuple[dict[str, Any], ...] = ()) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """(launches, scratch) of a projection op: `bs1` (the M = 1 GEMV launch) alone when seqs_max is 1 (unchanged,
    no `when`), else `bs1` under `when: {"seqs": [1, 1]}` followed by the seqs >= 2 launches of plan.opts.batch_proj
    (`args` / `tail`: the op's pointer wiring and trailing scalars, for the MMA entries)."""
    opts = plan.opts
    if opts.seqs_max == 1:
        return [bs1], {}
    first = {**bs1, "when": {"seqs": [1, 1]}}
    if opts.batch_proj == "mma":
        return [first, *mma_launches(b, kind, n, k, args, opts, tail)], {}
    if opts.batch_proj != "cublaslt":
        raise ManifestBuildError(f"batch_proj (--batch-proj) {opts.batch_proj!r}: use one of "
                                 f"{', '.join(map(repr, BATCH_PROJ))}")
    launches, scratch = _cublaslt_launches(b, plan, kind, n, k)
    return [first, *launches], scratch
