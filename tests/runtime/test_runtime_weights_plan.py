"""Bind plans: concatenation, row ranges, interleave, column slices as 2-D copies, coverage proofs,
staging-sized pieces and checkpoint mismatches."""

from __future__ import annotations

import numpy as np
import pytest

from kern_runtime import WeightArtifactError, plan_bind
from kern_manifest import DerivedSegment
from kern_manifest import Buffer
from runtime_helpers import buffer_of, interleave, seg
from kern_runtime.weights import TensorMeta
from kern_runtime.weights.plan import MAX_PITCH, BindPlan, Copy, prove_coverage, split_copy
from kern_manifest import Expr


def weight(shape, bind, dtype="bf16", name="w") -> Buffer:
    return buffer_of(name, "weight", dtype, tuple(Expr(d) for d in shape), bind=tuple(bind))


META = {
    "q": TensorMeta("bf16", (4, 8)), "k": TensorMeta("bf16", (2, 8)), "v": TensorMeta("bf16", (2, 8)),
    "gate": TensorMeta("bf16", (6, 8)), "up": TensorMeta("bf16", (6, 8)), "extra": TensorMeta("bf16", (6, 8)),
    "f": TensorMeta("f32", (4, 8)), "o": TensorMeta("bf16", (5, 12)), "down": TensorMeta("bf16", (7, 9)),
    "vec": TensorMeta("bf16", (12,)),
}
ROW = 8 * 2  # bytes per row of an [*, 8] bf16 buffer


def apply(copies, sources: dict[str, np.ndarray], nbytes: int) -> np.ndarray:
    """Execute copies on host bytes, row by row: the reference semantics of a Copy (0xEE = untouched)."""
    out = np.full(nbytes, 0xEE, dtype=np.uint8)
    written = np.zeros(nbytes, dtype=np.int32)
    for c in copies:
        src = sources[c.tensor].reshape(-1).view(np.uint8)
        for s, d in c.rows():
            assert 0 <= s and s + c.width <= src.size, f"{c} reads outside {c.tensor}"
            out[d:d + c.width] = src[s:s + c.width]
            written[d:d + c.width] += 1
    assert written.max(initial=1) == 1, "a byte was written twice"
    return out


def sources() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {n: rng.integers(0, 2**16, size=m.shape, dtype=np.uint16) for n, m in META.items() if m.dtype == "bf16"}


def filled(plan: BindPlan, shape: tuple[int, ...]) -> np.ndarray:
    return apply(plan.copies, sources(), plan.nbytes).view(np.uint16).reshape(shape)


def test_concatenation_is_dense_copies() -> None:
    plan = plan_bind(weight([8, 8], [seg("q"), seg("k"), seg("v")]), META)
    assert plan.copies == (Copy.linear("q", 0, 0, 4 * ROW), Copy.linear("k", 0, 4 * ROW, 2 * ROW),
                           Copy.linear("v", 0, 6 * ROW, 2 * ROW))
    assert all(c.dense and c.height == 1 for c in plan.copies)
    src = sources()
    np.testing.assert_array_equal(filled(plan, (8, 8)), np.concatenate([src["q"], src["k"], src["v"]]))


def test_row_ranges() -> None:
    plan = plan_bind(weight([3, 8], [seg("q", (1, 3)), seg("k", (0, 1))]), META)
    assert [(c.src_offset, c.src_stop, c.dst_offset) for c in plan.copies] == [(ROW, 3 * ROW, 0), (0, ROW, 2 * ROW)]
    src = sources()
    np.testing.assert_array_equal(filled(plan, (3, 8)), np.concatenate([src["q"][1:3], src["k"][0:1]]))


def test_empty_row_range_makes_no_copy() -> None:
    plan = plan_bind(weight([4, 8], [seg("k", (1, 1)), seg("q")]), META)
    assert plan.copies == (Copy.linear("q", 0, 0, 4 * ROW),)


def interleaved(src: dict[str, np.ndarray], names: list[str], r: int) -> np.ndarray:
    rows = src[names[0]].shape[0]
    return np.concatenate([src[n][b:b + r] for b in range(0, rows, r) for n in names])


@pytest.mark.parametrize("rows_each", [1, 2, 3, 6])
def test_interleave_is_one_2d_copy_per_tensor(rows_each: int) -> None:
    plan = plan_bind(weight([12, 8], [interleave(("gate", "up"), rows_each)]), META)
    block = rows_each * ROW
    # each tensor read whole (source pitch = width), its blocks every 2 blocks of the buffer
    assert plan.copies == (Copy("gate", 0, block, 0, 2 * block, block, 6 // rows_each),
                           Copy("up", 0, block, block, 2 * block, block, 6 // rows_each))
    assert all(c.src_dense and c.src_span == 6 * ROW for c in plan.copies)
    assert all(not c.dst_dense for c in plan.copies) or rows_each == 6
    np.testing.assert_array_equal(filled(plan, (12, 8)), interleaved(sources(), ["gate", "up"], rows_each))


@pytest.mark.parametrize("rows_each", [1, 2, 3, 6])
def test_interleave_of_three_tensors(rows_each: int) -> None:
    plan = plan_bind(weight([18 + 2, 8], [seg("k"), interleave(("gate", "up", "extra"), rows_each)]),
                     META)
    block = rows_each * ROW
    assert [(c.tensor, c.dst_offset, c.dst_pitch, c.width, c.height) for c in plan.copies[1:]] == [
        (t, 2 * ROW + j * block, 3 * block, block, 6 // rows_each) for j, t in enumerate(["gate", "up", "extra"])]
    src = sources()
    want = np.concatenate([src["k"], interleaved(src, ["gate", "up", "extra"], rows_each)])
    np.testing.assert_array_equal(filled(plan, (20, 8)), want)


def test_interleave_after_a_tensor_segment() -> None:
    plan = plan_bind(weight([16, 8], [seg("q"), interleave(("gate", "up"), 3)]), META)
    src = sources()
    want = np.concatenate([src["q"], src["gate"][:3], src["up"][:3], src["gate"][3:], src["up"][3:]])
    np.testing.assert_array_equal(filled(plan, (16, 8)), want)


@pytest.mark.parametrize(("cols", "rows"), [
    ((0, 6), None), ((3, 9), None), ((6, 12), None),  # start, middle, end of the row
    ((0, 12), None),                                   # every column: still a (dense) copy
    ((7, 12), (1, 4)), ((2, 3), (0, 5)), ((11, 12), (4, 5)), ((5, 9), (2, 2)),  # with row ranges
])
def test_cols_are_one_2d_copy(cols: tuple[int, int], rows: tuple[int, int] | None) -> None:
    c0, c1 = cols
    r0, r1 = rows or (0, 5)
    plan = plan_bind(weight([r1 - r0, c1 - c0], [seg("o", rows, (5, 12), cols)]), META)
    if r1 == r0:
        assert plan.copies == ()
        return
    (copy,) = plan.copies
    width = (c1 - c0) * 2
    assert copy == Copy("o", r0 * 24 + c0 * 2, 24, 0, width, width, r1 - r0)
    assert copy.dst_dense and copy.src_stop == (r1 - 1) * 24 + c1 * 2  # ends at the last row's c1
    assert copy.dense == (cols == (0, 12) or r1 - r0 == 1)  # one row, or whole rows: a 1-D copy
    np.testing.assert_array_equal(filled(plan, (r1 - r0, c1 - c0)), sources()["o"][r0:r1, c0:c1])


def test_cols_segments_stacked_with_rows_and_cols() -> None:
    """Two column slices of different tensors (one with a row range) stacked in one buffer."""
    bind = [seg("o", (1, 5), None, (8, 11)), seg("down", None, None, (6, 9))]
    plan = plan_bind(weight([4 + 7, 3], bind), META)
    assert [(c.tensor, c.src_offset, c.src_pitch, c.dst_offset, c.dst_pitch, c.width, c.height) for c in plan.copies] == [
        ("o", 1 * 24 + 16, 24, 0, 6, 6, 4), ("down", 12, 18, 4 * 6, 6, 6, 7)]
    src = sources()
    np.testing.assert_array_equal(filled(plan, (11, 3)), np.concatenate([src["o"][1:5, 8:11], src["down"][:, 6:9]]))


def test_one_dimensional_tensor() -> None:
    plan = plan_bind(weight([12], [seg("vec")]), META)
    assert plan.copies == (Copy.linear("vec", 0, 0, 24),)


def test_derived_has_no_copies() -> None:
    plan = plan_bind(weight([4, 8], [DerivedSegment()], dtype="f32"), META)
    assert plan.derived and plan.copies == () and plan.nbytes == 4 * 8 * 4


@pytest.mark.parametrize(
    ("shape", "bind", "message"),
    [
        ([8, 8], [seg("q"), seg("nope")], "checkpoint has no tensor 'nope'"),
        ([4, 8], [seg("f")], "tensor 'f' is f32, buffer 'w' bind\\[0\\] expects bf16"),
        ([4, 4], [seg("q")], r"tensor 'q' has shape \[4, 8\], buffer 'w' bind\[0\] expects \[rows, 4\]"),
        ([6, 8], [seg("q")], "bind covers 4 rows of the checkpoint, the buffer has 6"),
        ([3, 8], [seg("q", (2, 5))], r"rows \[2, 5\) lie outside tensor 'q' of 4 rows"),
        ([6, 8], [interleave(("q", "k"), 1)], "interleaved tensor 'k' has 2 rows, 'q' has 4"),
        ([12, 8], [interleave(("gate", "up"), 4)], "has 6 rows, not a multiple of 4"),
        ([4, 8], [seg("q", None, (5, 8))], r"tensor 'q' has shape \[4, 8\], buffer 'w' bind\[0\] declares \[5, 8\]"),
        ([5, 6], [seg("o", None, None, (8, 14))], r"columns \[8, 14\) of tensor 'o' \(12 columns\)"),
        ([5, 5], [seg("o", None, None, (0, 6))], r"do not fill the buffer's 5-column rows"),
        ([12, 1], [seg("vec", None, None, (0, 1))], r"a column range needs a 2-D tensor"),
        ([3, 4], [seg("o", (3, 6), None, (0, 4))], r"rows \[3, 6\) lie outside tensor 'o' of 5 rows"),
        ([5, 4], [seg("f", None, None, (0, 4))], "tensor 'f' is f32"),
    ],
)
def test_checkpoint_mismatches_name_the_tensor(shape, bind, message) -> None:
    with pytest.raises(WeightArtifactError, match=message):
        plan_bind(weight(shape, bind), META)


# ---------------------------------------------------------------- coverage proofs


def test_coverage_proof_rejects_gap_and_overlap() -> None:
    ok = BindPlan("b", 32, (Copy.linear("a", 0, 0, 16), Copy.linear("b", 0, 16, 16)))
    prove_coverage(ok)
    with pytest.raises(WeightArtifactError, match="gap at byte 16"):
        prove_coverage(BindPlan("b", 48, (Copy.linear("a", 0, 0, 16), Copy.linear("b", 0, 32, 16))))
    with pytest.raises(WeightArtifactError, match="overlap at byte 8"):
        prove_coverage(BindPlan("b", 24, (Copy.linear("a", 0, 0, 16), Copy.linear("b", 0, 8, 16))))
    with pytest.raises(WeightArtifactError, match="fills 16 of 32 bytes"):
        prove_coverage(BindPlan("b", 32, (Copy.linear("a", 0, 0, 16),)))


def test_coverage_proof_of_2d_copies() -> None:
    a = Copy("a", 0, 4, 0, 12, 4, 3)   # 3 rows of 4 bytes every 12
    b = Copy("b", 0, 4, 4, 12, 4, 3)
    c = Copy("c", 0, 8, 8, 12, 4, 3)   # strided source too
    prove_coverage(BindPlan("w", 36, (c, a, b)))  # any order
    prove_coverage(BindPlan("w", 36 + 10, (a, b, c, Copy.linear("d", 0, 36, 10))))
    prove_coverage(BindPlan("w", 36, (Copy("a", 0, 4, 0, 12, 4, 3), Copy("b", 0, 8, 4, 12, 8, 3))))  # unequal widths
    cases = [
        ((a, b), 36, "gap at byte 8"),                                             # c missing: hole in the pitch
        ((a, c), 36, "gap at byte 4"),
        ((a, b, c, Copy.linear("d", 0, 30, 6)), 36, "overlap at byte 30"),         # dense over a strided group
        ((a, b, Copy("c", 0, 4, 8, 12, 4, 2)), 36, "has pitch 12 x 2 rows beside pitch 12 x 3 rows"),
        ((a, b, Copy("c", 0, 4, 8, 16, 4, 3)), 36, "has pitch 16 x 3 rows"),
        ((a, b, Copy("c", 0, 8, 8, 12, 8, 3)), 36, "overlap at byte 12"),          # overfills the pitch
        ((a, Copy("b", 0, 4, 2, 12, 4, 3), c), 36, "overlap at byte 2"),
        ((Copy("a", 0, 16, 0, 8, 16, 2),), 24, "overlap at byte 8"),               # rows overlap each other
        ((Copy("a", 0, 2, 0, 4, 4, 2),), 8, "source pitch 2 < width 4"),
        ((a, b, c), 40, "fills 36 of 40 bytes"),
    ]
    for copies, nbytes, message in cases:
        with pytest.raises(WeightArtifactError, match=message):
            prove_coverage(BindPlan("w", nbytes, copies))


# ---------------------------------------------------------------- staging-sized pieces


def test_split_dense_copy_into_linear_pieces() -> None:
    pieces = split_copy(Copy.linear("t", 100, 40, 1000), 256)
    assert pieces == [Copy.linear("t", 100, 40, 256), Copy.linear("t", 356, 296, 256), Copy.linear("t", 612, 552, 256),
                      Copy.linear("t", 868, 808, 232)]
    assert split_copy(Copy.linear("t", 0, 0, 100), 100) == [Copy.linear("t", 0, 0, 100)]


def test_split_interleave_keeps_whole_blocks() -> None:
    strided = Copy("t", 0, 100, 0, 300, 100, 6)  # 6 blocks of 100 B, pitch 300
    assert split_copy(strided, 250) == [Copy("t", 0, 100, 0, 300, 100, 2), Copy("t", 200, 100, 600, 300, 100, 2),
                                        Copy("t", 400, 100, 1200, 300, 100, 2)]
    assert split_copy(strided, 500) == [Copy("t", 0, 100, 0, 300, 100, 5), Copy.linear("t", 500, 1500, 100)]
    # a block larger than the staging buffer: 1-D pieces of each block
    assert split_copy(Copy("t", 0, 200, 0, 300, 200, 2), 128) == [
        Copy.linear("t", 0, 0, 128), Copy.linear("t", 128, 128, 72),
        Copy.linear("t", 200, 300, 128), Copy.linear("t", 328, 428, 72)]


def test_split_cols_by_rows_at_the_staging_boundary() -> None:
    """A column slice: 6 of 20 bytes of 10 rows. A piece of h rows reads (h - 1) * 20 + 6 bytes."""
    cols = Copy("t", 14, 20, 0, 6, 6, 10)  # columns at the end of each 20-byte row
    for limit, per in [(46, 3), (45, 2), (26, 2), (25, 1), (6, 1), (186, 10), (1000, 10)]:
        pieces = split_copy(cols, limit)
        assert [p.height for p in pieces] == [min(per, 10 - r) for r in range(0, 10, per)], limit
        assert all(p.src_span <= limit for p in pieces)
        assert pieces[0].src_span == (per - 1) * 20 + 6
        assert [p.src_offset for p in pieces] == [14 + r * 20 for r in range(0, 10, per)]
        assert [p.dst_offset for p in pieces] == [r * 6 for r in range(0, 10, per)]
    # a row wider than the staging buffer: each row in 1-D pieces
    assert split_copy(cols, 4) == [p for r in range(10) for p in (Copy.linear("t", 14 + 20 * r, 6 * r, 4),
                                                                   Copy.linear("t", 18 + 20 * r, 6 * r + 4, 2))]


def test_split_pitch_over_the_driver_limit_gives_one_row_pieces() -> None:
    wide = Copy("t", 0, 8, 0, MAX_PITCH + 1, 8, 3)
    assert split_copy(wide, 1 << 20) == [Copy.linear("t", 8 * r, (MAX_PITCH + 1) * r, 8) for r in range(3)]
    assert split_copy(Copy("t", 0, 16, 0, 8, 8, 3), 1 << 20, max_pitch=12) == [
        Copy.linear("t", 16 * r, 8 * r, 8) for r in range(3)]
