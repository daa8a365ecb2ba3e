"""Which kernel entry serves which option, and the launch geometry each implies (docs/kernels.md "Entries",
"Prefill", "Decode splits")."""

from __future__ import annotations

# --decode-attn values with kern_attn_decode_partial_early's contract (reads before the PDL wait, slot_mapping
# passed): name -> (entry, threads per block, largest head_dim); docs/kernels.md "Entries". "stream"
# (kernels-src/attention_decode.cu) streams K/V through shared memory with cp.async and does the math on tensor
# cores (head_dim a multiple of 16, which the prefill entries require of every model anyway); it writes nothing
# for splits past a row's context, which kern_attn_decode_reduce never reads. "gqa" (the same module) computes the
# same results in one warp per block with tokens as the mma's rows and the GQA group as its columns: about 2.5x
# fewer instructions per K/V byte (docs/perf.md "Twenty-second session"); "gqa-fused" is gqa with the reduce done
# by each row's last split (FUSED_PARTIALS).
EARLY_PARTIALS: dict[str, tuple[str, int, int]] = {
    "early": ("kern_attn_decode_partial_early", 128, 256),
    "wide": ("kern_attn_decode_partial_wide", 256, 128),
    "stream": ("kern_attn_decode_partial_stream", 64, 128),
    "gqa": ("kern_attn_decode_partial_gqa", 32, 128),
    "gqa-fused": ("kern_attn_decode_gqa_fused", 32, 128),
}
# EARLY_PARTIALS entries that also merge the splits (no kern_attn_decode_reduce launch after them): the last split
# of a (row, kv head) to finish merges, counted by tickets in the fixed state DECODE_TICKETS (int32 [seqs_max,
# kv_heads], zero-filled at load, returned to zero by every launch).
FUSED_PARTIALS = frozenset({"gqa-fused"})
DECODE_TICKETS = "attn_tickets"
DECODE_ATTN = ("split", *EARLY_PARTIALS)
# --prefill-attn values: name -> (entry, query rows per grid.x step at a GQA group of 4, dynamic shared memory
# bytes, threads per block); docs/kernels.md "Prefill". Every entry computes every row bit for bit alike
# (tests/kernels/test_kernels_gpu.py): r16 / r32 on mma.sync, wg on Hopper wgmma (attention_wg.cu, a producer
# warpgroup and two consumer warpgroups; head_dim 64 or 128 only: PREFILL_WG_HEAD_DIMS). "auto" (the default) is
# wg where the head_dim allows, else r32.
PREFILL_ATTN: dict[str, tuple[str, int, int, int]] = {
    "r16": ("kern_attn_prefill", 16, 0, 128),
    "r32": ("kern_attn_prefill_r32", 32, 105472, 128),
    "wg": ("kern_attn_prefill_wg", 32, 169024, 384),
}
# head_dims kern_attn_prefill_wg is compiled for (its O += P V is one wgmma of N = head_dim)
PREFILL_WG_HEAD_DIMS = (64, 128)
# DEC_MAX_D of kernels-src/attention.cu: every decode partial entry writes nothing past it
DECODE_MAX_HEAD_DIM = 256


def prefill_rows_per_block(rows_at_group4: int, group: int) -> int:
    """Query rows (tokens) one block of a prefill attention entry covers for a GQA group of `group` q heads per kv
    head: the entries give hpb = group heads to a pass when group divides 4, else 4, and 4 / hpb times the rows
    of a group of 4 (kernels-src/prefill.cuh `pf_block`, which every prefill entry calls). The launch's grid.x is
    cdiv(tokens, this); a larger grid is allowed (its extra blocks exit)."""
    hpb = group if group <= 4 and 4 % group == 0 else 4
    return rows_at_group4 * (4 // hpb)


def rope_warp_heads(head_dim: int) -> int:
    """Heads one 256-thread block of kern_qk_norm_rope_kv_warp covers: head_dim / 8 lanes per head, so 8 warps x
    max(1, 256 / head_dim) (kernels-src/rope.cu)."""
    return 8 * max(1, 256 // head_dim)

