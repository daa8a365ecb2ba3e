"""Bind plans: concatenation, row ranges, interleave, coverage proofs and checkpoint mismatches."""

from __future__ import annotations

import numpy as np
import pytest

from kern_runtime import WeightArtifactError, plan_bind
from kern_runtime.spec import BufferSpec, DerivedSegment, InterleaveSegment, TensorSegment
from kern_runtime.weights import TensorMeta
from kern_runtime.weights.loader import split_copy
from kern_runtime.weights.plan import BindPlan, Copy, prove_coverage
from kern_manifest import Expr


def weight(shape, bind, dtype="bf16", name="w") -> BufferSpec:
    return BufferSpec(name, "weight", dtype, tuple(Expr(d) for d in shape), bind=tuple(bind))


META = {
    "q": TensorMeta("bf16", (4, 8)), "k": TensorMeta("bf16", (2, 8)), "v": TensorMeta("bf16", (2, 8)),
    "gate": TensorMeta("bf16", (6, 8)), "up": TensorMeta("bf16", (6, 8)), "f": TensorMeta("f32", (4, 8)),
}
ROW = 8 * 2  # bytes per row of an [*, 8] bf16 buffer


def fill_bytes(plan: BindPlan, sources: dict[str, np.ndarray]) -> np.ndarray:
    """Execute a plan on host bytes (the reference semantics of a Copy)."""
    out = np.full(plan.nbytes, 0xEE, dtype=np.uint8)
    for c in plan.copies:
        src = sources[c.tensor].reshape(-1).view(np.uint8)[c.src_start:c.src_stop]
        for b in range(c.blocks):
            dst = c.dst_offset + b * c.dst_pitch_bytes
            out[dst:dst + c.block_bytes] = src[b * c.block_bytes:(b + 1) * c.block_bytes]
    return out


def sources() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {n: rng.integers(0, 2**16, size=m.shape, dtype=np.uint16) for n, m in META.items() if m.dtype == "bf16"}


def test_concatenation_is_contiguous_copies() -> None:
    plan = plan_bind(weight([8, 8], [TensorSegment("q"), TensorSegment("k"), TensorSegment("v")]), META)
    assert [(c.tensor, c.src_start, c.src_stop, c.dst_offset, c.rows) for c in plan.copies] == [
        ("q", 0, 4 * ROW, 0, 4), ("k", 0, 2 * ROW, 4 * ROW, 2), ("v", 0, 2 * ROW, 6 * ROW, 2)]
    assert all(c.contiguous for c in plan.copies)
    src = sources()
    got = fill_bytes(plan, src).view(np.uint16).reshape(8, 8)
    np.testing.assert_array_equal(got, np.concatenate([src["q"], src["k"], src["v"]]))


def test_row_ranges() -> None:
    plan = plan_bind(weight([3, 8], [TensorSegment("q", (1, 3)), TensorSegment("k", (0, 1))]), META)
    assert [(c.src_start, c.src_stop, c.dst_offset) for c in plan.copies] == [(ROW, 3 * ROW, 0), (0, ROW, 2 * ROW)]
    src = sources()
    got = fill_bytes(plan, src).view(np.uint16).reshape(3, 8)
    np.testing.assert_array_equal(got, np.concatenate([src["q"][1:3], src["k"][0:1]]))


@pytest.mark.parametrize("rows_each", [1, 2, 3, 6])
def test_interleave_blocks(rows_each: int) -> None:
    plan = plan_bind(weight([12, 8], [InterleaveSegment(("gate", "up"), rows_each)]), META)
    assert len(plan.copies) == 2  # one strided copy per tensor: one read each
    gate, up = plan.copies
    assert (gate.dst_offset, up.dst_offset) == (0, rows_each * ROW)
    assert gate.block_bytes == rows_each * ROW and gate.dst_pitch_bytes == 2 * rows_each * ROW
    src = sources()
    got = fill_bytes(plan, src).view(np.uint16).reshape(12, 8)
    blocks = []
    for b in range(6 // rows_each):
        blocks += [src["gate"][b * rows_each:(b + 1) * rows_each], src["up"][b * rows_each:(b + 1) * rows_each]]
    np.testing.assert_array_equal(got, np.concatenate(blocks))


def test_interleave_after_a_tensor_segment() -> None:
    plan = plan_bind(weight([16, 8], [TensorSegment("q"), InterleaveSegment(("gate", "up"), 3)]), META)
    src = sources()
    got = fill_bytes(plan, src).view(np.uint16).reshape(16, 8)
    want = np.concatenate([src["q"], src["gate"][:3], src["up"][:3], src["gate"][3:], src["up"][3:]])
    np.testing.assert_array_equal(got, want)


def test_derived_has_no_copies() -> None:
    plan = plan_bind(weight([4, 8], [DerivedSegment()], dtype="f32"), META)
    assert plan.derived and plan.copies == () and plan.nbytes == 4 * 8 * 4


@pytest.mark.parametrize(
    ("shape", "bind", "message"),
    [
        ([8, 8], [TensorSegment("q"), TensorSegment("nope")], "checkpoint has no tensor 'nope'"),
        ([4, 8], [TensorSegment("f")], "tensor 'f' is f32, buffer 'w' bind\\[0\\] expects bf16"),
        ([4, 4], [TensorSegment("q")], r"tensor 'q' has shape \[4, 8\], buffer 'w' bind\[0\] expects \[rows, 4\]"),
        ([6, 8], [TensorSegment("q")], "bind covers 4 rows of the checkpoint, the buffer has 6"),
        ([3, 8], [TensorSegment("q", (2, 5))], r"rows \[2, 5\) lie outside tensor 'q' of 4 rows"),
        ([6, 8], [InterleaveSegment(("q", "k"), 1)], "interleaved tensor 'k' has 2 rows, 'q' has 4"),
        ([12, 8], [InterleaveSegment(("gate", "up"), 4)], "has 6 rows, not a multiple of 4"),
        ([4, 8], [TensorSegment("q", None, (5, 8))], r"tensor 'q' has shape \[4, 8\], buffer 'w' bind\[0\] declares \[5, 8\]"),
    ],
)
def test_checkpoint_mismatches_name_the_tensor(shape, bind, message) -> None:
    with pytest.raises(WeightArtifactError, match=message):
        plan_bind(weight(shape, bind), META)


def test_coverage_proof_rejects_gap_and_overlap() -> None:
    ok = BindPlan("b", 32, (Copy("a", 0, 16, 0, 1, 16, 16), Copy("b", 0, 16, 16, 1, 16, 16)))
    prove_coverage(ok)
    with pytest.raises(WeightArtifactError, match="gap at byte 16"):
        prove_coverage(BindPlan("b", 48, (Copy("a", 0, 16, 0, 1, 16, 16), Copy("b", 0, 16, 32, 1, 16, 16))))
    with pytest.raises(WeightArtifactError, match="overlap at byte 8"):
        prove_coverage(BindPlan("b", 24, (Copy("a", 0, 16, 0, 1, 16, 16), Copy("b", 0, 16, 8, 1, 16, 16))))
    with pytest.raises(WeightArtifactError, match="fills 16 of 32 bytes"):
        prove_coverage(BindPlan("b", 32, (Copy("a", 0, 16, 0, 1, 16, 16),)))


def test_split_copy_keeps_whole_blocks_and_bounds_pieces() -> None:
    contiguous = Copy("t", 100, 100 + 1000, 40, 10, 1000, 1000)
    pieces = split_copy(contiguous, 256)
    assert [p[1] for p in pieces] == [256, 256, 256, 232]
    assert pieces[1] == (356, 256, 296, 256, 256)
    strided = Copy("t", 0, 600, 0, 6, 100, 300)  # 6 blocks of 100 B, pitch 300
    pieces = split_copy(strided, 250)  # 2 blocks per piece
    assert pieces == [(0, 200, 0, 100, 300), (200, 200, 600, 100, 300), (400, 200, 1200, 100, 300)]
    big_blocks = split_copy(Copy("t", 0, 400, 0, 2, 200, 300), 128)  # block larger than a piece
    assert big_blocks == [(0, 128, 0, 128, 128), (128, 72, 128, 72, 72), (200, 128, 300, 128, 128), (328, 72, 428, 72, 72)]
