"""Property tests of bind plans: staging-sized pieces of random 2-D copies, and random stacks of rows /
cols / interleave segments against numpy slicing (hypothesis; skipped where it is not installed, as on
the GPU machines)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_runtime_weights_plan import apply, interleaved, weight  # noqa: E402

from kern_runtime import plan_bind  # noqa: E402
from runtime_helpers import interleave, seg  # noqa: E402
from kern_runtime.weights import TensorMeta  # noqa: E402
from kern_runtime.weights.plan import BindPlan, Copy, prove_coverage, split_copy  # noqa: E402


@st.composite
def geometries(draw):
    width = draw(st.integers(1, 40))
    height = draw(st.integers(1, 12))
    src_pitch = width + draw(st.sampled_from([0, 0, 1, 7, 33]))
    dst_pitch = width + draw(st.sampled_from([0, 0, 3, 40]))
    src_offset, dst_offset = draw(st.integers(0, 9)), draw(st.integers(0, 9))
    limit = draw(st.integers(1, 200))
    return Copy("t", src_offset, src_pitch, dst_offset, dst_pitch, width, height), limit


@settings(max_examples=400, deadline=None)
@given(geometries())
def test_split_pieces_fit_staging_and_write_exactly_the_copy(case) -> None:
    copy, limit = case
    pieces = split_copy(copy, limit)
    assert all(0 < p.src_span <= limit for p in pieces)
    assert all(copy.src_offset <= p.src_offset and p.src_stop <= copy.src_stop for p in pieces)
    assert all(p.dense or p.height > 1 for p in pieces)
    assert sum(p.nbytes for p in pieces) == copy.nbytes
    src = {"t": np.random.default_rng(copy.width).integers(0, 256, copy.src_stop, dtype=np.uint8)}
    size = copy.dst_offset + copy.dst_span
    np.testing.assert_array_equal(apply(pieces, src, size), apply([copy], src, size))


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_binds_tile_and_their_pieces_too(data) -> None:
    """Random stacks of rows / cols / interleave segments: the plan matches numpy slicing of the
    checkpoint, and the staging-sized pieces of its copies prove coverage and write the same bytes."""
    cols_n = data.draw(st.integers(1, 6), label="buffer columns")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    meta, src, bind, want = {}, {}, [], []
    for i in range(data.draw(st.integers(1, 4), label="segments")):
        kind = data.draw(st.sampled_from(["rows", "cols", "interleave"]), label="kind")
        if kind == "interleave":
            k, r = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
            rows = r * data.draw(st.integers(1, 3))
            names = [f"i{i}.{j}" for j in range(k)]
            for n in names:
                meta[n] = TensorMeta("bf16", (rows, cols_n))
                src[n] = rng.integers(0, 2**16, (rows, cols_n), dtype=np.uint16)
            bind.append(interleave(tuple(names), r))
            want.append(interleaved(src, names, r))
            continue
        full_cols = cols_n + (data.draw(st.integers(0, 5)) if kind == "cols" else 0)
        rows = data.draw(st.integers(1, 7))
        name = f"t{i}"
        meta[name] = TensorMeta("bf16", (rows, full_cols))
        src[name] = rng.integers(0, 2**16, (rows, full_cols), dtype=np.uint16)
        r0 = data.draw(st.integers(0, rows))
        r1 = data.draw(st.integers(r0, rows))
        if kind == "cols":
            c0 = data.draw(st.integers(0, full_cols - cols_n))
            bind.append(seg(name, (r0, r1), None, (c0, c0 + cols_n)))
            want.append(src[name][r0:r1, c0:c0 + cols_n])
        else:
            bind.append(seg(name, (r0, r1)))
            want.append(src[name][r0:r1])
    total = sum(w.shape[0] for w in want)
    if total == 0:
        return
    plan = plan_bind(weight([total, cols_n], bind), meta)
    expected = np.concatenate(want)
    np.testing.assert_array_equal(apply(plan.copies, src, plan.nbytes).view(np.uint16).reshape(total, cols_n), expected)
    limit = data.draw(st.integers(1, 64), label="staging bytes")
    pieces = tuple(p for c in plan.copies for p in split_copy(c, limit))
    assert all(p.src_span <= limit for p in pieces)
    prove_coverage(BindPlan("pieces", plan.nbytes, pieces))
    np.testing.assert_array_equal(apply(pieces, src, plan.nbytes).view(np.uint16).reshape(total, cols_n), expected)
