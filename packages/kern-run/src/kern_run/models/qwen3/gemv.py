"""The decode projections as M = 1 GEMVs (kernels-src/gemv.cu, docs/kernels-gemv.md): v1 warp-per-row entries
with the RMSNorms folded into the qkv / gate_up / lm_head prologues and the residual adds into the o / down
epilogues; v2 the rows family with a SwiGLU epilogue on gate_up (docs/perf.md), and for a batched decode (seqs_max
> 1) the small-M MMA entries beside them (mma.py). Also the rows-family launch `--m1-gemv` uses."""

from __future__ import annotations

from typing import Any

from ...errors import ManifestBuildError
from .builder import Builder, ptr
from .batch_proj import batched
from .options import BuildOptions, Plan


def gemv_launch(b: Builder, entry: str, n: int, k: int, args: list[dict[str, Any]], opts: BuildOptions,
                tail: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """One kern_gemv_* launch (docs/kernels-gemv.md "Launch"): block 512, grid min(n, 2 * SMs), dynamic shared
    memory 16 * cdiv(k, 8) bytes (x staged as bf16). Raises ManifestBuildError off the fast path's
    preconditions."""
    if k % 8:
        raise ManifestBuildError(f"{entry}: k = {k} is not a multiple of 8 (the GEMV's vector path needs it); use "
                                 "--decode gemm")
    per_sm = max(1, opts.gemv_threads_per_sm // 512)
    return b.launch(entry, [min(n, per_sm * opts.sms), 1, 1], [512, 1, 1], args + [{"i32": n}, {"i32": k}, *tail],
                    shared_mem=16 * -(-k // 8), pdl=opts.pdl)


def rows_launch(b: Builder, entry: str, n_groups: int, k: int, args: list[dict[str, Any]], opts: BuildOptions,
                tail: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """One rows-family launch (docs/kernels-gemv.md "Rows entries"; 4 W rows per group, 2 chunk steps of 16
    bytes per batch): block = whole warps covering ceil(k / 8) chunks in as few batches as 512 threads allow
    (k = 2560: 160, 4096: 256, 9728: 320), grid = min(groups, resident blocks per SM * SMs) (at <= 64
    registers a SM holds 1024 threads), dynamic shared memory 16 * ceil(k / 8). `n_groups` is the entry's
    group count (rows / 4; swiglu: outputs / 2)."""
    if k % 8:
        raise ManifestBuildError(f"{entry}: k = {k} is not a multiple of 8 (the GEMV's vector path needs it); use "
                                 "--gemv v1")
    k8 = -(-k // 8)
    batches = -(-k8 // (2 * 512))
    block = min(1024, max(32, -(-(-(-k8 // (2 * batches))) // 32) * 32))
    grid = min(n_groups, max(1, opts.gemv_threads_per_sm // block) * opts.sms)
    return b.launch(entry, [grid, 1, 1], [block, 1, 1], args + [*tail], shared_mem=16 * k8, pdl=opts.pdl)


_NORM_ARGS = ("w", "residual", "norm_w", "y")
_RES_ARGS = ("w", "x", "residual")


def _wiring(names: tuple[str, ...]) -> list[dict[str, str]]:
    return [{"arg": n} for n in names]


def rmsnorm_gemv_op(b: Builder, name: str, n: int, k: int, opts: BuildOptions, eps: tuple[dict[str, Any], ...]
                    ) -> None:
    """Declare `name(w, residual, norm_w, y)`: one kern_gemv_rmsnorm launch, y[n] = W[n, k] rmsnorm(residual)
    (the v1 projections with a norm prologue, the lm_head of both versions at one row, a TP rank's lm_head
    slice)."""
    b.op(name, [ptr(a) for a in _NORM_ARGS],
         [gemv_launch(b, "kern_gemv_rmsnorm", n, k, _wiring(_NORM_ARGS), opts, eps)])


def add_gemv_v1_ops(b: Builder, plan: Plan) -> None:
    """The decode projections as M = 1 GEMV ops, one op per shape (n and k are launch constants):
    `gemv_qkv` / `gemv_gate_up` / `gemv_lm_head`: RMSNorm(residual) prologue -> y;
    `gemv_o`: residual += W x; `gemv_down`: residual += W (silu(gate) * up). Outputs never alias inputs."""
    cfg, opts = plan.cfg, plan.opts
    H, I = cfg.hidden, cfg.intermediate
    eps = ({"f32": cfg.eps},)
    for name, n in (("gemv_qkv", plan.qkv_dim), ("gemv_gate_up", 2 * I), ("gemv_lm_head", cfg.vocab)):
        rmsnorm_gemv_op(b, name, n, H, opts, eps)
    b.op("gemv_o", [ptr(a) for a in _RES_ARGS], [gemv_launch(
        b, "kern_gemv_residual", H, plan.q_dim, _wiring(_RES_ARGS), opts)])
    down = ("w", "gate_up", "residual")
    b.op("gemv_down", [ptr(a) for a in down], [gemv_launch(b, "kern_gemv_silu_residual", H, I, _wiring(down), opts)])


def add_gemv_v2_ops(b: Builder, plan: Plan) -> None:
    """`--gemv v2`: the decode projections on the rows family and the SwiGLU epilogue (docs/perf.md):
    `gemv_qkv`: kern_gemv_rows_rmsnorm; `gemv_gate_up_act`: kern_gemv_rmsnorm_swiglu (RMSNorm prologue, gate
    and up rows of one output in one block, writes act = bf16(silu(gate)) * up); `gemv_o` / `gemv_down_act`:
    kern_gemv_rows_residual (residual += W x, x = attn_out / act); `gemv_lm_head`: kern_gemv_rmsnorm as in v1
    (already at the bandwidth floor). With seqs_max > 1 each op keeps that launch for seqs = 1 and adds the
    launches of the same semantics for seqs 2..seqs_max (batch_proj.batched: cuBLASLt with separate norm and
    SwiGLU launches by default, or the small-M MMA entries of docs/kernels-gemv.md "Small-M MMA entries")."""
    cfg, opts = plan.cfg, plan.opts
    H, I, V = cfg.hidden, cfg.intermediate, cfg.vocab
    norm_args, norm_wiring = [ptr(a) for a in _NORM_ARGS], _wiring(_NORM_ARGS)
    eps = ({"f32": cfg.eps},)
    qkv_n = plan.qkv_dim
    ops = [
        ("gemv_qkv", norm_args, rows_launch(b, "kern_gemv_rows_rmsnorm", -(-qkv_n // 4), H,
                                            norm_wiring + [{"i32": qkv_n}, {"i32": H}], opts, eps),
         "rmsnorm", qkv_n, H, norm_wiring, eps),
        ("gemv_gate_up_act", norm_args, rows_launch(b, "kern_gemv_rmsnorm_swiglu", -(-I // 2), H,
                                                    norm_wiring + [{"i32": I}, {"i32": H}], opts, eps),
         "rmsnorm_swiglu", I, H, norm_wiring, eps),
        ("gemv_lm_head", norm_args, gemv_launch(b, "kern_gemv_rmsnorm", V, H, norm_wiring, opts, eps),
         "rmsnorm", V, H, norm_wiring, eps),
    ]
    res_args, res_wiring = [ptr(a) for a in _RES_ARGS], _wiring(_RES_ARGS)
    ops += [
        ("gemv_o", res_args, rows_launch(b, "kern_gemv_rows_residual", -(-H // 4), plan.q_dim,
                                         res_wiring + [{"i32": H}, {"i32": plan.q_dim}], opts),
         "residual", H, plan.q_dim, res_wiring, ()),
        ("gemv_down_act", res_args, rows_launch(b, "kern_gemv_rows_residual", -(-H // 4), I,
                                                res_wiring + [{"i32": H}, {"i32": I}], opts),
         "residual", H, I, res_wiring, ()),
    ]
    for name, interface, bs1, kind, n, k, wiring, tail in ops:
        launches, scratch = batched(b, plan, bs1, kind, n, k, wiring, tail)
        b.op(name, interface, launches, scratch=scratch or None)
