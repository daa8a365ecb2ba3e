"""Build options (the `kern manifest build` flags) and their validation against a config: `validate` turns
(Qwen3Config, BuildOptions) into a `Plan`, the checked options with every automatic choice made and the derived
geometry the buffers, ops and programs read. Refusals name the option field, its flag and its value."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ...errors import ManifestBuildError
from .config import Qwen3Config
from .entries import (DECODE_ATTN, DECODE_MAX_HEAD_DIM, EARLY_PARTIALS, FUSED_PARTIALS, PREFILL_ATTN,
                      PREFILL_WG_HEAD_DIMS)
from .sampling import check_sampling_options
from .mma import MMA_TILES
from .skinny import SKINNY_M_MAX

INVARIANT_PROJ = ("cublaslt", "skinny")  # --invariant-proj choices

# cuBLASLt pins: ((n, k, ((attr, value), ...)), ...)
Pins = tuple[tuple[int, int, tuple[tuple[str, int], ...]], ...]


@dataclass(frozen=True)
class BuildOptions:
    """Builder options. `max_context` bounds positions (rope rows) and block-table width; lengths in tokens."""

    name: str
    chunk_max: int = 512  # tokens var max: the largest prefill chunk
    max_context: int = 40960  # positions 0..max_context-1
    page_tokens: int = 16
    # decode attention: MINIMUM context tokens per split (multiple of page_tokens). 64 = one tile of the decode
    # partial at head_dim 128 (4 warps x 8 slots x 2 tokens): a shorter split leaves most of its tile's lanes
    # idle and only adds working blocks; H200 4B ctx 128: 2.693 ms/token against 2.711 with 16 (docs/perf.md)
    split_tokens: int = 64
    argmax_chunks: int = 64  # two-stage argmax: first-stage blocks per row
    seqs_max: int = 1
    decode: str = "gemv"  # decode projections: "gemv" (M = 1 GEMVs, fused norms/residuals) or "gemm" (cuBLASLt)
    # with decode "gemm": the decode program's projections run kern_gemv_rows at tokens = 1 (same call table:
    # separate norms, residual adds and, on tensor-parallel ranks, the all-reduces between them)
    m1_gemv: bool = False
    decode_splits: int = 0  # decode attention splits (launch constant); 0: auto (decode_num_splits)
    sms: int = 132  # multiprocessors of the target GPU (H200): GEMV grids and the auto split count
    pdl: bool = True  # mark launches of abi.PDL_ENTRIES with `pdl: true` (decode program only)
    # also the small kernels (embed, qk_norm_rope_kv, argmax, decode_advance); their ops serve prefill too,
    # where PDL is harmless (they write nothing before the wait and read before it only what no kernel in
    # flight writes: docs/kernels.md "Programmatic dependent launch")
    pdl_small: bool = True
    ring_len: int = 64  # token ring (host-mapped output) entries per sequence
    gemv: str = "v1"  # decode GEMV wiring (--decode gemv): "v1" warp-per-row entries, "v2" rows family + swiglu
    # GEMV grids fill at most this many threads per SM (2048 max; 1024 = all a <= 64-register kernel can hold);
    # less leaves room for the next kernel's blocks to become resident early under PDL
    gemv_threads_per_sm: int = 1024
    # decode attention: "split" (kern_qk_norm_rope_kv, then the partial and reduce launches), "early" (the same
    # with kern_attn_decode_partial_early: block table and first K/V tile read before its PDL wait), "wide" (the
    # early contract on kern_attn_decode_partial_wide: 8 warps x 4 token slots, head_dim <= 128); EARLY_PARTIALS
    # holds the early-contract entries. A fused one-launch entry and an L2 prefetch of later weights measured
    # slower and were removed (docs/perf.md "Decode, fourth session"; their cubins stay in kernels/)
    decode_attn: str = "wide"
    # with seqs_max > 1: the decode partial of steps of 2.. rows ("" = decode_attn's). "stream" (cp.async + mma.sync,
    # kernels-src/attention_decode.cu) streams K/V at 76-84% of 4.3 TB/s at 32-64 rows x ctx 2048, where "wide"
    # reaches 28-29%; at one row wide stays 0.7-1.4 us faster (H200, docs/perf.md "Fourteenth session")
    decode_attn_batch: str = "stream"
    # prefill attention (PREFILL_ATTN): "wg" kern_attn_prefill_wg (Hopper wgmma, warp-specialized: a producer
    # warpgroup, two consumer warpgroups; H200 4B: 1.7-1.8x kern_attn_prefill_r32 on a 2048 chunk after a 6k-14k
    # prefix, docs/perf.md "Prefill, eleventh session"; head_dim 64 or 128), "r32" kern_attn_prefill_r32
    # (mma.sync, two m-tiles per warp), "r16" kern_attn_prefill (one); "auto": wg where the head_dim allows, else r32
    prefill_attn: str = "auto"
    # q/k norm + rope + K/V write at tokens >= 2: "warp" kern_qk_norm_rope_kv_warp (head_dim / 8 lanes per token and
    # head; head_dim a multiple of 64, at most 256, else "block"), "block" kern_qk_norm_rope_kv (one block per token
    # and head, as at tokens = 1, where decode keeps it). Bit for bit the same rows; docs/perf.md "Prefill, ninth
    # session" and "Prefill, twelfth session". "warp" falls back to "block" (and the manifest's
    # meta.caller.prefill_rope says so) at a head_dim the warp entry does not take or with chunk_max 1
    prefill_rope: str = "warp"
    # preferred shared-memory carveout (percent of the maximum) on every kernel launch (manifest `carveout`;
    # None: not written, the driver's choice). 100: every kernel prefers the largest shared-memory split, so
    # kernels overlapping under PDL never want different L1 / shared splits on one SM (our reading of why it
    # helps; not measured directly). H200 4B decode 0.9-1.8% faster (docs/perf.md "Decode, sixth session"); the TP
    # builder inherits it (not measured there)
    carveout: int | None = 100
    # cuBLASLt pins (pins.load_algos): a projection whose (n, k) is here gets its own op `gemm_<n>x<k>` with that
    # algorithm for every M (batch-invariant prefill)
    algos: Pins = ()
    # M = 1 pins for the cuBLASLt decode (--decode gemm): fastest by graph timing, split-K allowed
    decode_algos: Pins = ()
    # `--batch-invariant` decode pins (pins.invariant_decode_from_doc): split-K allowed, proven row-invariant over
    # M = 1 .. 64; a decode projection whose (n, k) is here runs it at every decode bucket (seqs_max <= 64)
    invariant_decode_algos: Pins = ()
    algos_source: tuple[tuple[str, Any], ...] = ()  # (device, cublaslt_version, m_max) of the pins file, for meta
    # the decode program's last ops (models/qwen3/sampling.py, docs/caller.md "Sampling"): "gpu" the per-row
    # sampler (kern_sample_bf16; next_token and the ring pack token and logprob), "argmax" the two-stage argmax
    # (next_token and the ring hold plain token ids; the manifest is the pre-sampler builder's, byte for byte)
    sampler: str = "gpu"
    hist_cap: int = 1024
    # with seqs_max > 1: the projections of steps of 2..seqs_max rows (batch_proj.py): "cublaslt" (heuristic
    # algorithm, separate RMSNorm / SiLU-mul launches, residual adds as beta = 1) or "mma" (kernels-src/gemv_mma.cu,
    # fused like the GEMVs; 1.7-7x slower on the H200, docs/perf.md "Twenty-third session") or "rows" (rows_m.py: the
    # multi-row rows-family GEMVs for 2..8 rows, bit-identical per row to the M = 1 entries; cuBLASLt from 9)
    batch_proj: str = "cublaslt"  # with sampler "gpu": history slots (distinct previous token ids) per row
    # one decode arithmetic for every row count, 1 included (docs/caller.md "Batch-invariant decode"): the cuBLASLt
    # decode (--decode gemm) with every projection on a pinned algorithm for every M (the prefill pins, which
    # tools/pick_algos.py proves row-invariant across M, so a decode row is also computed as a prefill row; the
    # lm_head from its pin), one decode attention entry at every row count (decode_attn_batch's, else
    # decode_attn's; each block reads only its own row, kernels-src/attention_decode.cu), one q/k rope entry for
    # every token count; the norms, SwiGLU and sampler are per row. So a row's tokens do not depend on the bucket
    batch_invariant: bool = False
    # with batch_invariant and --decode gemm: the decode projections but the lm_head on "cublaslt" (the invariant
    # decode pins) or "skinny" (kernels-src/gemm_skinny.cu: one wgmma launch shape for every row count, Stream-K over
    # the SMs, the weight prologue before the PDL wait, the SiLU-mul fused into gate_up; docs/perf.md
    # "Twenty-fifth session")
    invariant_proj: str = "cublaslt"
    # tensor-parallel ranks (--tp N, tp.py / allreduce.py): all-reduces of messages up to this many bytes run kern's
    # one-shot kernel over peer memory, larger ones NCCL (0: NCCL only, which needs --decode gemm); 256 KiB: the
    # size up to which the target asks one-shot to beat NCCL (docs/perf.md "One-shot all-reduce", unmeasured)
    allreduce_oneshot_bytes: int = 256 * 1024
    allreduce_blocks: int = 8  # the one-shot all-reduce's grid (one flag per rank and block)
    allreduce_timeout_ms: int = 1000  # a one-shot all-reduce waits this long for a peer, then reports it missing
    # tensor-parallel lm_head (--tp-lm-head): "vocab" (each rank computes the logits of its slice of the vocabulary,
    # then the one-shot all-gather kern_allgather_bf16 gives every rank the full logits) or "replicated" (every rank
    # reads the whole lm_head, as before: docs/perf.md "Tensor parallelism that pays")
    tp_lm_head: str = "vocab"

    @property
    def pdl_small_launches(self) -> bool:
        """Whether the small kernels (embed, the RMSNorms, SiLU-mul, qk_norm_rope_kv, argmax, decode_advance) launch
        with PDL: only when PDL is on at all."""
        return self.pdl and self.pdl_small


@dataclass(frozen=True)
class Plan:
    """Validated options with the automatic choices made, and the derived geometry (element counts, tokens)."""

    cfg: Qwen3Config
    opts: BuildOptions
    num_splits: int  # decode attention splits
    prefill_attn: str  # a key of PREFILL_ATTN ("auto" resolved)
    prefill_rope: str  # "warp" or "block" (the warp entry's preconditions applied)

    @property
    def q_dim(self) -> int:
        return self.cfg.q_heads * self.cfg.head_dim

    @property
    def kv_dim(self) -> int:
        return self.cfg.kv_heads * self.cfg.head_dim

    @property
    def qkv_dim(self) -> int:
        return self.q_dim + 2 * self.kv_dim

    @property
    def pages_per_seq(self) -> int:
        return -(-self.opts.max_context // self.opts.page_tokens)

    @property
    def prefill_shapes(self) -> set[tuple[int, int]]:
        """(n, k) of the four prefill projections: qkv, o, gate_up, down (`prefill_shapes`)."""
        return prefill_shapes(self.cfg)


def prefill_shapes(cfg: Qwen3Config) -> set[tuple[int, int]]:
    """(n, k) of the four prefill projections C[m, n] = A[m, k] @ W[n, k]^T of `cfg`: qkv, o, gate_up, down (the
    shapes a pins file pins). One tensor-parallel rank's: `prefill_shapes(shard_config(cfg, tp))`."""
    H, I = cfg.hidden, cfg.intermediate
    q, kv = cfg.q_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    return {(q + 2 * kv, H), (H, q), (2 * I, H), (H, I)}


def decode_num_splits(cfg: Qwen3Config, opts: BuildOptions) -> int:
    """Decode attention splits: the given number, else the largest power of two with kv_heads * splits <=
    the SM count (one wave of partial blocks; at least 1, capped at 64 and at the splits the longest context
    can use). The split length itself is derived on the device from seq_lens (docs/kernels.md "Decode
    splits"), so one captured grid serves every context length. Measured on the H200, Qwen3-4B (8 kv heads,
    docs/perf.md): 16 splits 2.886 / 3.280 ms per token at ctx 128 / 4096, against 2.937 / 3.271 with 32
    (the earlier rule, smallest power of two covering the SMs) and 2.857 / 3.491 with 8."""
    cap = -(-opts.max_context // opts.split_tokens)
    if opts.decode_splits:
        return min(opts.decode_splits, cap)
    splits = 1
    while splits * 2 * cfg.kv_heads <= opts.sms and splits < 64:
        splits *= 2
    return max(1, min(splits, cap))


def _check_context(cfg: Qwen3Config, opts: BuildOptions) -> None:
    if opts.max_context > cfg.max_position_embeddings:
        raise ManifestBuildError(f"max_context (--max-context) {opts.max_context} exceeds max_position_embeddings "
                                 f"{cfg.max_position_embeddings}")
    if opts.split_tokens < 1:
        raise ManifestBuildError(f"split_tokens (--decode-split-tokens) {opts.split_tokens}: the minimum context "
                                 "tokens per decode split must be >= 1")
    if opts.split_tokens % opts.page_tokens:
        raise ManifestBuildError(f"split_tokens (--decode-split-tokens) {opts.split_tokens} is not a multiple of "
                                 f"page_tokens {opts.page_tokens}")
    if not 1 <= opts.chunk_max <= opts.max_context:
        raise ManifestBuildError(f"chunk_max (--chunk-max) {opts.chunk_max} must lie in [1, max_context "
                                 f"{opts.max_context}]")


def _check_decode(opts: BuildOptions) -> None:
    if opts.decode not in ("gemv", "gemm"):
        raise ManifestBuildError(f"decode (--decode) {opts.decode!r}: use 'gemv' (M = 1 GEMVs) or 'gemm' (cuBLASLt)")
    if opts.m1_gemv and opts.decode != "gemm":
        raise ManifestBuildError("--m1-gemv is an option of --decode gemm (the gemv decode has its own fused GEMVs)")
    if opts.gemv not in ("v1", "v2"):
        raise ManifestBuildError(f"gemv (--gemv) {opts.gemv!r}: use 'v1' or 'v2'")
    if opts.gemv == "v2" and opts.decode != "gemv":
        raise ManifestBuildError("--gemv v2 is a wiring of --decode gemv")
    if not 32 <= opts.gemv_threads_per_sm <= 2048:
        raise ManifestBuildError(f"gemv_threads_per_sm (--gemv-threads-per-sm) {opts.gemv_threads_per_sm}: use "
                                 "32..2048 (threads an SM holds)")


def _check_attention(cfg: Qwen3Config, opts: BuildOptions) -> None:
    """The attention options against the head_dim the kernels cover (docs/kernels.md "Attention limits")."""
    if opts.prefill_rope not in ("warp", "block"):
        raise ManifestBuildError(f"prefill_rope (--prefill-rope) {opts.prefill_rope!r}: use 'warp' or 'block'")
    if opts.prefill_attn not in (*PREFILL_ATTN, "auto"):
        raise ManifestBuildError(f"prefill_attn (--prefill-attn) {opts.prefill_attn!r}: use 'auto' or one of "
                                 f"{', '.join(map(repr, PREFILL_ATTN))}")
    if opts.prefill_attn == "wg" and cfg.head_dim not in PREFILL_WG_HEAD_DIMS:
        raise ManifestBuildError(f"prefill_attn (--prefill-attn) 'wg': head_dim {cfg.head_dim} is not one of "
                                 f"{PREFILL_WG_HEAD_DIMS} (kern_attn_prefill_wg's compiled widths); use 'r32' or "
                                 "'auto'")
    if opts.decode_attn_batch and opts.decode_attn_batch not in EARLY_PARTIALS:
        raise ManifestBuildError(f"decode_attn_batch (--decode-attn-batch) {opts.decode_attn_batch!r}: use one of "
                                 f"{', '.join(map(repr, EARLY_PARTIALS))} (the early contract), or '' for "
                                 "decode_attn's entry")
    if (opts.seqs_max > 1 and opts.decode_attn_batch and opts.decode_attn_batch != opts.decode_attn
            and opts.decode_attn not in EARLY_PARTIALS):
        raise ManifestBuildError(f"decode_attn_batch (--decode-attn-batch) {opts.decode_attn_batch!r} needs an "
                                 f"early-contract decode_attn (--decode-attn), not {opts.decode_attn!r}; pass "
                                 "--decode-attn-batch '' to keep one entry")
    batch = opts.decode_attn_batch
    if (opts.seqs_max > 1 and batch and batch != opts.decode_attn
            and (batch in FUSED_PARTIALS) != (opts.decode_attn in FUSED_PARTIALS)):
        fused, other = (batch, opts.decode_attn) if batch in FUSED_PARTIALS else (opts.decode_attn, batch)
        raise ManifestBuildError(f"decode_attn_batch (--decode-attn-batch) {batch!r} with decode_attn "
                                 f"(--decode-attn) {opts.decode_attn!r}: {fused!r} merges its own splits and "
                                 f"{other!r} needs the reduce launch, which a manifest cannot run for only some row "
                                 f"counts; use {fused!r} for both, or --batch-invariant")
    if opts.seqs_max > 1 and batch in EARLY_PARTIALS and cfg.head_dim > EARLY_PARTIALS[batch][2]:
        raise ManifestBuildError(f"decode_attn_batch (--decode-attn-batch) {batch!r}: head_dim {cfg.head_dim} > "
                                 f"{EARLY_PARTIALS[batch][2]} ({EARLY_PARTIALS[batch][0]}'s limit)")
    if opts.decode_attn not in DECODE_ATTN:
        raise ManifestBuildError(f"decode_attn (--decode-attn) {opts.decode_attn!r}: use one of "
                                 f"{', '.join(map(repr, DECODE_ATTN))}")
    if cfg.head_dim > DECODE_MAX_HEAD_DIM:
        raise ManifestBuildError(f"decode_attn {opts.decode_attn!r}: head_dim {cfg.head_dim} > {DECODE_MAX_HEAD_DIM} "
                                 "(the decode partial's limit)")
    if opts.decode_attn in EARLY_PARTIALS and cfg.head_dim > EARLY_PARTIALS[opts.decode_attn][2]:
        entry, _, max_d = EARLY_PARTIALS[opts.decode_attn]
        raise ManifestBuildError(f"decode_attn {opts.decode_attn!r}: head_dim {cfg.head_dim} > {max_d} ({entry}'s "
                                 "limit)")
    if cfg.head_dim % 16 or cfg.head_dim > 128:  # PF_MAX_D; the mma.sync tiles
        raise ManifestBuildError(f"head_dim {cfg.head_dim}: kern_attn_prefill needs a multiple of 16 and at most 128")


def _check_launch(opts: BuildOptions) -> None:
    if opts.sms < 1:
        raise ManifestBuildError(f"sms (--sms) {opts.sms}: the target GPU's multiprocessor count must be >= 1")
    if opts.decode_splits < 0:
        raise ManifestBuildError(f"decode_splits (--decode-splits) {opts.decode_splits}: use >= 1, or 0 for the "
                                 "automatic count")
    if opts.carveout is not None and not 0 <= opts.carveout <= 100:
        raise ManifestBuildError(f"carveout (--carveout) {opts.carveout}: a percent of the maximum shared memory, "
                                 "0..100 (None: write none; the CLI's --carveout -1)")
    if opts.seqs_max < 1:
        raise ManifestBuildError(f"seqs_max (--seqs-max) {opts.seqs_max}: the rows of a decode step must be >= 1")
    if opts.decode == "gemv" and opts.seqs_max > 1 and opts.gemv != "v2":
        raise ManifestBuildError(f"seqs_max (--seqs-max) {opts.seqs_max} with gemv (--gemv) {opts.gemv!r}: the v1 "
                                 "decode GEMVs compute one row (bs = 1); use --gemv v2 (small-M MMA projections for "
                                 "2..64 rows) or --decode gemm")
    if opts.decode == "gemv" and opts.seqs_max > MMA_TILES[-1]:
        raise ManifestBuildError(f"seqs_max (--seqs-max) {opts.seqs_max} with decode (--decode) 'gemv': the MMA "
                                 f"projections take at most {MMA_TILES[-1]} rows; use --decode gemm")


def invariant_mma(opts: BuildOptions) -> bool:
    """Whether `opts` ask for the batch-invariant decode on the small-M MMA projections (`--batch-invariant
    --decode gemv --gemv v2 --batch-proj mma`): every projection, lm_head included, on kern_mma_* at every row
    count, 1 included (batch_proj.batched)."""
    return opts.batch_invariant and opts.decode == "gemv" and opts.gemv == "v2" and opts.batch_proj == "mma"


def _invariant_options(opts: BuildOptions) -> BuildOptions:
    """`--batch-invariant`: the options with one decode attention entry (decode_attn_batch's, else decode_attn's)
    for every row count. Raises ManifestBuildError for a GEMV decode other than v2 on the MMA projections, or
    --m1-gemv."""
    if opts.invariant_proj not in INVARIANT_PROJ:
        raise ManifestBuildError(f"invariant_proj (--invariant-proj) {opts.invariant_proj!r}: use one of "
                                 f"{', '.join(INVARIANT_PROJ)}")
    if opts.invariant_proj == "skinny" and (opts.decode != "gemm" or opts.seqs_max > SKINNY_M_MAX):
        raise ManifestBuildError(f"invariant_proj (--invariant-proj) skinny needs --decode gemm and seqs_max "
                                 f"(--seqs-max) <= {SKINNY_M_MAX} (the kernel's 64 MMA rows), got --decode "
                                 f"{opts.decode} and {opts.seqs_max}")
    if opts.m1_gemv or (opts.decode != "gemm" and not invariant_mma(opts)):
        given = ("--m1-gemv" if opts.m1_gemv else
                 f"--decode {opts.decode} --gemv {opts.gemv} --batch-proj {opts.batch_proj}")
        raise ManifestBuildError(f"batch_invariant (--batch-invariant) with {given}: the M = 1 GEMVs sum a row in "
                                 "another order than the batched projections; the batch-invariant decode runs the "
                                 "pinned cuBLASLt projections (--decode gemm, without --m1-gemv) or the small-M MMA "
                                 "projections (--decode gemv --gemv v2 --batch-proj mma) at every row count")
    return replace(opts, decode_attn=opts.decode_attn_batch or opts.decode_attn, decode_attn_batch="")


def validate(cfg: Qwen3Config, opts: BuildOptions) -> Plan:
    """The Plan of `opts` for `cfg` (with `batch_invariant`, its opts carry the one decode attention entry as
    decode_attn and decode_attn_batch ""). Raises ManifestBuildError, naming the field and its flag, for an option
    out of range, an inconsistent combination, or a head_dim the chosen kernels do not cover."""
    if opts.batch_invariant:
        opts = _invariant_options(opts)
    elif opts.invariant_proj != "cublaslt":
        raise ManifestBuildError(f"invariant_proj (--invariant-proj) {opts.invariant_proj!r} needs batch_invariant "
                                 "(--batch-invariant)")
    _check_context(cfg, opts)
    _check_decode(opts)
    _check_attention(cfg, opts)
    _check_launch(opts)
    check_sampling_options(cfg, opts)
    prefill_attn = opts.prefill_attn
    if prefill_attn == "auto":
        prefill_attn = "wg" if cfg.head_dim in PREFILL_WG_HEAD_DIMS else "r32"
    D = cfg.head_dim
    warp = opts.prefill_rope == "warp" and D % 64 == 0 and D <= 256 and opts.chunk_max > 1
    return Plan(cfg, opts, decode_num_splits(cfg, opts), prefill_attn, "warp" if warp else "block")
