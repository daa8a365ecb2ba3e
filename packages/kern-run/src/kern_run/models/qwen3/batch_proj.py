"""The projections of a batched decode step (seqs 2..seqs_max) beside the M = 1 GEMV launch of each `--gemv v2`
projection op: `batch_proj` "cublaslt" (the default), "rows" (rows_m.py: the multi-row GEMVs for seqs 2..8,
lm_head's included, fused and PDL-launched like the M = 1 ones, a row's bits those of the M = 1 entry; cuBLASLt as
below for seqs 9..seqs_max) or "mma" (mma.py, kernels-src/gemv_mma.cu).

Why cuBLASLt: measured on the H200 at the Qwen3-4B shapes (bench/gemv.py --mma, docs/perf.md "Fourteenth
session"), cuBLASLt's heuristic algorithm at m = 2..64 stays within 3-17% of the M = 1 GEMV's time (lm_head m = 64:
191.5 us against 174.3), while the small-M MMA entries took 2-4x longer (1.7-7x after their rebuild, docs/perf.md
"Twenty-third session"). The fused prologue and epilogues of the
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
from .options import Plan, invariant_mma
from .rows_m import ROWS_ENTRY, ROWS_TILE_MAX, V1_ENTRY, rows_m_launches

BATCH_PROJ = ("cublaslt", "rows", "mma")
_SEQS_I32 = {"expr": "seqs", "type": "i32"}
_SEQS_I64 = {"expr": "seqs", "type": "i64"}


def _rmsnorm(b: Builder, plan: Plan, when: dict[str, list[int]]) -> dict[str, Any]:
    """kern_add_rmsnorm without a delta: scratch `normed` = RMSNorm(residual) * norm_w, one block per row."""
    cfg = plan.cfg
    return {**b.launch("kern_add_rmsnorm", ["seqs", 1, 1], [256, 1, 1],
                       [{"arg": "residual"}, {"null": 8}, {"arg": "norm_w"}, {"scratch": "normed"}, dict(_SEQS_I32),
                        {"i32": cfg.hidden}, {"f32": cfg.eps}], pdl=plan.opts.pdl_small_launches), "when": when}


def _gemm(a: dict[str, str], c: dict[str, str], n: int, k: int, when: dict[str, list[int]],
          acc: bool = False) -> dict[str, Any]:
    return {"extern": "cublaslt_bf16_tn_acc" if acc else "cublaslt_bf16_tn",
            "args": [a, {"arg": "w"}, c, dict(_SEQS_I64), {"i64": n}, {"i64": k}], "when": when}


def _cublaslt_launches(b: Builder, plan: Plan, kind: str, n: int, k: int,
                       lo: int = 2) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """(launches, scratch) of one projection op for seqs lo..seqs_max (each launch `when: {"seqs": [lo,
    seqs_max]}`); `kind` as mma.KINDS, `n` the output rows (SwiGLU: inter)."""
    H = plan.cfg.hidden
    when = {"seqs": [lo, plan.opts.seqs_max]}
    if kind == "residual":
        return [_gemm({"arg": "x"}, {"arg": "residual"}, n, k, when, acc=True)], {}
    scratch = {"normed": f"seqs * {H * 2}"}
    if kind == "rmsnorm":
        return [_rmsnorm(b, plan, when), _gemm({"scratch": "normed"}, {"arg": "y"}, n, k, when)], scratch
    silu = {**b.launch("kern_silu_mul", ["seqs", -(-n // 1024), 1], [256, 1, 1],
                       [{"scratch": "gate_up"}, {"arg": "y"}, dict(_SEQS_I32), {"i32": n}],
                       pdl=plan.opts.pdl_small_launches), "when": when}
    return ([_rmsnorm(b, plan, when), _gemm({"scratch": "normed"}, {"scratch": "gate_up"}, 2 * n, k, when), silu],
            {**scratch, "gate_up": f"seqs * {2 * n * 2}"})


def batched(b: Builder, plan: Plan, bs1: dict[str, Any], kind: str, n: int, k: int, args: list[dict[str, Any]],
            tail: tuple[dict[str, Any], ...] = ()) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """(launches, scratch) of a projection op: `bs1` (the M = 1 GEMV launch) alone when seqs_max is 1 (unchanged,
    no `when`), else `bs1` under `when: {"seqs": [1, 1]}` followed by the seqs >= 2 launches of plan.opts.batch_proj
    (`args` / `tail`: the op's pointer wiring and trailing scalars, for the MMA entries). "rows": where `bs1` is a
    rows-family entry (qkv, gate_up, o, down) or the v1 kern_gemv_rmsnorm (lm_head), the `_mM` launches for seqs
    2..min(8, seqs_max), then
    cuBLASLt for 9..seqs_max. With the batch-invariant MMA decode (options.invariant_mma) the MMA launches for
    seqs 1..seqs_max replace all of it, `bs1` included. Raises ManifestBuildError on an unknown batch_proj."""
    opts = plan.opts
    if invariant_mma(opts):  # the MMA entries at every row count, 1 included: no M = 1 GEMV
        return mma_launches(b, kind, n, k, args, opts, tail, lo=1), {}
    if opts.seqs_max == 1:
        return [bs1], {}
    first = {**bs1, "when": {"seqs": [1, 1]}}
    if opts.batch_proj == "mma":
        return [first, *mma_launches(b, kind, n, k, args, opts, tail)], {}
    if opts.batch_proj not in ("cublaslt", "rows"):
        raise ManifestBuildError(f"batch_proj (--batch-proj) {opts.batch_proj!r}: use one of "
                                 f"{', '.join(map(repr, BATCH_PROJ))}")
    rows: list[dict[str, Any]] = []
    v1 = kind == "rmsnorm" and bs1["entry"] == V1_ENTRY  # lm_head: a warp per W row, so n "groups" of one row
    if opts.batch_proj == "rows" and (bs1["entry"] == ROWS_ENTRY[kind] or v1):
        n_groups = n if v1 else -(-n // (2 if kind == "rmsnorm_swiglu" else 4))
        rows = rows_m_launches(b, bs1, kind, n_groups, k, opts, 2, min(ROWS_TILE_MAX, opts.seqs_max))
    lo = 2 + 7 * bool(rows)  # rows: 2..8 on the _mM entries, cuBLASLt from 9
    if lo > opts.seqs_max:
        return [first, *rows], {}
    launches, scratch = _cublaslt_launches(b, plan, kind, n, k, lo)
    return [first, *rows, *launches], scratch
