"""Bind plans: a weight buffer's bind segments turned into 2-D byte copies, with coverage proven.

A `Copy` moves `height` rows of `width` bytes from one checkpoint tensor into the buffer: row i reads
tensor bytes `[src_offset + i * src_pitch, + width)` and writes buffer bytes `[dst_offset + i *
dst_pitch, + width)` (the geometry of `cuMemcpy2DAsync`). The source rows of a copy always lie in one
contiguous tensor range, `[src_offset, src_stop)`, which the loader reads whole.

| segment | copies | geometry |
|---|---|---|
| whole tensor / `rows` | 1 | dense: `height` 1, `width` = the rows' bytes |
| `interleave` of k tensors, blocks of r rows | k (one per tensor) | width r * row, src pitch = width (the tensor is read whole), dst pitch k * r * row, dst offset + j * r * row for tensor j, height = rows / r |
| `cols [c0, c1)` (with or without `rows`) | 1 | width (c1 - c0) * item, src pitch = the tensor's row bytes, dst pitch = width, height = rows |

`split_copy` cuts a copy into pieces whose source range fits a staging buffer (whole rows of a 2-D
copy; a row wider than the buffer becomes 1-D pieces). `plan_bind`, `prove_coverage` and
`split_copy` are pure: they need only the buffer's dtype/shape/bind and the checkpoint's metadata.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

from kern_manifest import Buffer, DerivedSegment, InterleaveSegment, RowsSegment, TensorSegment

from ..cuda.dtypes import item_bytes
from ..errors import WeightArtifactError
from .tensors import TensorMeta

MAX_PITCH = (1 << 31) - 1
"""Largest pitch `cuMemcpy2DAsync` takes (CU_DEVICE_ATTRIBUTE_MAX_PITCH on sm_90); a copy with a larger
pitch is split into one-row pieces."""


@dataclass(frozen=True)
class Copy:
    """`height` rows of `width` bytes of `tensor`: row i reads tensor bytes `src_offset + i * src_pitch`
    and writes buffer bytes `dst_offset + i * dst_pitch` (offsets into the tensor and the buffer)."""

    tensor: str
    src_offset: int
    src_pitch: int
    dst_offset: int
    dst_pitch: int
    width: int
    height: int

    @classmethod
    def linear(cls, tensor: str, src_offset: int, dst_offset: int, nbytes: int) -> "Copy":
        """A plain 1-D copy of `nbytes` bytes."""
        return cls(tensor, src_offset, nbytes, dst_offset, nbytes, nbytes, 1)

    @property
    def nbytes(self) -> int:
        """Bytes written into the buffer."""
        return self.width * self.height

    @property
    def src_span(self) -> int:
        """Bytes of the contiguous source range the rows lie in (what a read of the copy fetches)."""
        return (self.height - 1) * self.src_pitch + self.width if self.height > 0 and self.width > 0 else 0

    @property
    def src_stop(self) -> int:
        return self.src_offset + self.src_span

    @property
    def dst_span(self) -> int:
        return (self.height - 1) * self.dst_pitch + self.width if self.height > 0 and self.width > 0 else 0

    @property
    def src_dense(self) -> bool:
        return self.height <= 1 or self.src_pitch == self.width

    @property
    def dst_dense(self) -> bool:
        return self.height <= 1 or self.dst_pitch == self.width

    @property
    def dense(self) -> bool:
        """Both sides contiguous: one 1-D copy of `nbytes`."""
        return self.src_dense and self.dst_dense

    def rows(self) -> Iterator[tuple[int, int]]:
        """(source offset, destination offset) of every row (tests and proofs)."""
        for i in range(self.height):
            yield self.src_offset + i * self.src_pitch, self.dst_offset + i * self.dst_pitch

    def dst_ranges(self) -> list[tuple[int, int]]:
        """Every destination byte range [start, stop), one per row unless the destination is dense."""
        if self.dst_dense:
            return [(self.dst_offset, self.dst_offset + self.nbytes)] if self.nbytes else []
        return [(d, d + self.width) for _, d in self.rows()]


@dataclass(frozen=True)
class BindPlan:
    """The copies filling buffer `buffer` (`nbytes` bytes); `derived`: filled by a program instead."""

    buffer: str
    nbytes: int
    copies: tuple[Copy, ...]
    derived: bool = False

    @property
    def copy_bytes(self) -> int:
        return sum(c.nbytes for c in self.copies)


MetaLookup = Mapping[str, TensorMeta] | Callable[[str], TensorMeta | None]


def _lookup(meta: MetaLookup, name: str) -> TensorMeta | None:
    return meta(name) if callable(meta) else meta.get(name)


def _checked_meta(meta: MetaLookup, name: str, buffer: Buffer, trailing: tuple[int, ...], where: str) -> TensorMeta:
    tm = _lookup(meta, name)
    if tm is None:
        raise WeightArtifactError(f"checkpoint has no tensor {name!r} (bound by {where})")
    if tm.dtype != buffer.dtype:
        raise WeightArtifactError(
            f"tensor {name!r} is {tm.dtype}, {where} expects {buffer.dtype}"
        )
    if tuple(tm.shape[1:]) != trailing or (not tm.shape and trailing):
        raise WeightArtifactError(
            f"tensor {name!r} has shape {list(tm.shape)}, {where} expects [rows, {', '.join(map(str, trailing))}]"
            if trailing else f"tensor {name!r} has shape {list(tm.shape)}, {where} expects a 1-D tensor [rows]"
        )
    return tm


def plan_bind(buffer: Buffer, meta: MetaLookup, values: Mapping[str, int] | None = None) -> BindPlan:
    """Copies that fill `buffer` from the checkpoint described by `meta` (name -> TensorMeta).

    `values`: var values for the buffer's shape (default: the shape must be constant).
    Raises WeightArtifactError naming the tensor for a missing tensor, a dtype or trailing-shape
    mismatch, a row or column range outside the tensor, interleaved tensors of unequal or indivisible
    rows, and when the segments do not cover dim 0 of the buffer exactly (names the rows covered and
    expected).
    """
    if buffer.bind is None:
        raise WeightArtifactError(f"buffer {buffer.name!r} has no bind")
    shape = buffer.shape_at(values or {})
    nbytes = math.prod(shape) * item_bytes(buffer.dtype)
    if any(isinstance(s, DerivedSegment) for s in buffer.bind):
        return BindPlan(buffer.name, nbytes, (), derived=True)
    rows_total = shape[0] if shape else 1
    trailing = tuple(shape[1:])
    row_bytes = math.prod(trailing) * item_bytes(buffer.dtype)
    copies: list[Copy] = []
    row = 0  # next buffer row to fill
    for si, seg in enumerate(buffer.bind):
        where = f"buffer {buffer.name!r} bind[{si}]"
        if isinstance(seg, (TensorSegment, RowsSegment)):
            if seg.cols is not None:
                row = _plan_cols(seg, buffer, meta, trailing, row, where, copies)
                continue
            tm = _checked_meta(meta, seg.tensor, buffer, trailing, where)
            if seg.shape is not None and tuple(seg.shape) != tm.shape:
                raise WeightArtifactError(
                    f"tensor {seg.tensor!r} has shape {list(tm.shape)}, {where} declares {list(seg.shape)}"
                )
            start, stop = _rows(seg, tm)
            if not 0 <= start <= stop <= tm.rows:
                raise WeightArtifactError(f"{where}: rows [{start}, {stop}) lie outside tensor {seg.tensor!r} of {tm.rows} rows")
            if stop > start:
                copies.append(_in_source(Copy.linear(seg.tensor, start * row_bytes, row * row_bytes,
                                                     (stop - start) * row_bytes), tm, where))
            row += stop - start
        elif isinstance(seg, InterleaveSegment):
            metas = [_checked_meta(meta, t, buffer, trailing, where) for t in seg.tensors]
            each = metas[0].rows
            r = seg.rows
            if r <= 0:
                raise WeightArtifactError(f"{where}: interleave rows {r} is not positive")
            for t, tm in zip(seg.tensors, metas):
                if tm.rows != each:
                    raise WeightArtifactError(f"{where}: interleaved tensor {t!r} has {tm.rows} rows, {seg.tensors[0]!r} has {each}")
                if each % r:
                    raise WeightArtifactError(f"{where}: interleaved tensor {t!r} has {each} rows, not a multiple of {r}")
            k = len(seg.tensors)
            block = r * row_bytes  # one block of r rows: the 2-D copy's row
            for j, (t, tm) in enumerate(zip(seg.tensors, metas)):
                if each and block:
                    copies.append(_in_source(Copy(t, 0, block, (row + j * r) * row_bytes, k * block, block, each // r),
                                             tm, where))
            row += each * k
        else:  # pragma: no cover - DerivedSegment handled above
            raise AssertionError(seg)
    if row != rows_total:
        raise WeightArtifactError(
            f"buffer {buffer.name!r}: bind covers {row} rows of the checkpoint, the buffer has {rows_total}"
        )
    plan = BindPlan(buffer.name, nbytes, tuple(copies))
    prove_coverage(plan)
    return plan


def _in_source(copy: Copy, tm: TensorMeta, where: str) -> Copy:
    """`copy`, after checking its source range lies inside the tensor (a kern bug otherwise)."""
    if copy.src_offset < 0 or copy.src_stop > tm.nbytes:
        raise WeightArtifactError(f"{where}: kern bug: copy reads bytes [{copy.src_offset}, {copy.src_stop}) of "
                                  f"tensor {copy.tensor!r}, which has {tm.nbytes}")
    return copy


def _rows(seg: TensorSegment | RowsSegment, tm: TensorMeta) -> tuple[int, int]:
    """Rows `[start, stop)` of the tensor a segment takes: a `rows` range, or every row."""
    return (seg.start, seg.stop) if isinstance(seg, RowsSegment) else (0, tm.rows)


def _plan_cols(seg: TensorSegment | RowsSegment, buffer: Buffer, meta: MetaLookup, trailing: tuple[int, ...], row: int,
               where: str, copies: list[Copy]) -> int:
    """A column range `[c0, c1)` of rows `[r0, r1)` of a 2-D tensor: one 2-D copy, `(c1 - c0) * item`
    bytes of each source row (source pitch: the tensor's row) into consecutive buffer rows. Returns
    the next buffer row."""
    assert seg.cols is not None
    c0, c1 = seg.cols
    tm = _lookup(meta, seg.tensor)
    if tm is None:
        raise WeightArtifactError(f"checkpoint has no tensor {seg.tensor!r} (bound by {where})")
    if tm.dtype != buffer.dtype:
        raise WeightArtifactError(f"tensor {seg.tensor!r} is {tm.dtype}, {where} expects {buffer.dtype}")
    if len(tm.shape) != 2 or len(trailing) != 1:
        raise WeightArtifactError(f"{where}: a column range needs a 2-D tensor and buffer; tensor {seg.tensor!r} "
                                  f"has shape {list(tm.shape)}")
    if seg.shape is not None and tuple(seg.shape) != tm.shape:
        raise WeightArtifactError(f"tensor {seg.tensor!r} has shape {list(tm.shape)}, {where} declares {list(seg.shape)}")
    if not 0 <= c0 < c1 <= tm.shape[1] or c1 - c0 != trailing[0]:
        raise WeightArtifactError(f"{where}: columns [{c0}, {c1}) of tensor {seg.tensor!r} ({tm.shape[1]} columns) "
                                  f"do not fill the buffer's {trailing[0]}-column rows")
    start, stop = _rows(seg, tm)
    if not 0 <= start <= stop <= tm.rows:
        raise WeightArtifactError(f"{where}: rows [{start}, {stop}) lie outside tensor {seg.tensor!r} of {tm.rows} rows")
    item = item_bytes(buffer.dtype)
    src_row, width = tm.shape[1] * item, (c1 - c0) * item
    if stop > start:
        copies.append(_in_source(Copy(seg.tensor, start * src_row + c0 * item, src_row, row * width, width, width,
                                      stop - start), tm, where))
    return row + stop - start


def prove_coverage(plan: BindPlan) -> None:
    """Check the copies tile [0, plan.nbytes) exactly (no gap, no overlap), without listing rows.

    A copy whose destination is dense is one interval. Copies with a strided destination (an
    interleave) must come in groups that fill their pitch: sorted by offset, copies of equal
    `dst_pitch` and `height` whose rows sit side by side (offsets s, s + w0, s + w0 + w1, ... with
    widths summing to the pitch); such a group tiles [s, s + pitch * height) and counts as that
    interval. Then the intervals must tile the buffer. Sound for any copies (a valid tiling the
    grouping does not recognise is refused, never a wrong one accepted). Raises WeightArtifactError
    naming the byte of a gap or overlap (a bug in the bind or in kern).
    """
    where = f"buffer {plan.buffer!r}"
    spans: list[tuple[int, int]] = []
    strided: list[Copy] = []
    for c in plan.copies:
        if min(c.width, c.height, c.src_offset, c.dst_offset, c.src_pitch, c.dst_pitch) < 0:
            raise WeightArtifactError(f"{where}: copy of {c.tensor!r} has a negative geometry field: {c}")
        if c.nbytes == 0:
            continue
        if c.height > 1 and c.src_pitch < c.width:
            raise WeightArtifactError(f"{where}: copy of {c.tensor!r} has source pitch {c.src_pitch} < width {c.width}")
        if c.dst_dense:
            spans.append((c.dst_offset, c.dst_offset + c.nbytes))
        elif c.dst_pitch < c.width:
            raise WeightArtifactError(f"{where}: bind has an overlap at byte {c.dst_offset + c.dst_pitch} "
                                      f"(copy of {c.tensor!r}: destination pitch {c.dst_pitch} < width {c.width})")
        else:
            strided.append(c)
    strided.sort(key=lambda c: c.dst_offset)
    i = 0
    while i < len(strided):
        first = strided[i]
        start, pitch, height = first.dst_offset, first.dst_pitch, first.height
        filled = 0
        while filled < pitch:
            at = start + filled
            c = strided[i] if i < len(strided) else None
            if c is None or c.dst_offset > at:
                raise WeightArtifactError(f"{where}: bind has a gap at byte {at} (strided copies from byte {start} "
                                          f"fill {filled} of their pitch {pitch})")
            if c.dst_offset < at:
                raise WeightArtifactError(f"{where}: bind has an overlap at byte {c.dst_offset} (copy of {c.tensor!r})")
            if (c.dst_pitch, c.height) != (pitch, height):
                raise WeightArtifactError(f"{where}: copy of {c.tensor!r} at byte {at} has pitch {c.dst_pitch} x "
                                          f"{c.height} rows beside pitch {pitch} x {height} rows of {first.tensor!r}")
            filled += c.width
            i += 1
        if filled != pitch:
            raise WeightArtifactError(f"{where}: bind has an overlap at byte {start + pitch} (strided copies from "
                                      f"byte {start} fill {filled} bytes of their pitch {pitch})")
        spans.append((start, start + pitch * height))
    spans.sort()
    pos = 0
    for start, stop in spans:
        if start != pos:
            kind = "overlap" if start < pos else "gap"
            raise WeightArtifactError(f"{where}: bind has a {kind} at byte {min(start, pos)}")
        pos = stop
    if pos != plan.nbytes:
        raise WeightArtifactError(f"{where}: bind fills {pos} of {plan.nbytes} bytes")


def split_copy(copy: Copy, limit: int, max_pitch: int = MAX_PITCH) -> list[Copy]:
    """`copy` cut into pieces whose source range (`src_span`) is at most `limit` bytes: what one
    staging buffer of `limit` bytes holds.

    A dense copy: 1-D pieces of `limit` bytes. A 2-D copy: runs of whole rows, as many as fit,
    `(h - 1) * src_pitch + width <= limit` (a piece of one row is 1-D); a row wider than `limit`:
    1-D pieces of each row. A pitch above `max_pitch` gives one-row pieces. The pieces write exactly
    the bytes of `copy`, in row order.
    """
    if limit <= 0:
        raise ValueError(f"split_copy: limit {limit} is not positive")
    if copy.nbytes == 0:
        return []
    t = copy.tensor
    if copy.dense:
        n = copy.nbytes
        return [Copy.linear(t, copy.src_offset + s, copy.dst_offset + s, min(limit, n - s)) for s in range(0, n, limit)]
    out: list[Copy] = []
    if copy.width > limit:
        for src, dst in copy.rows():
            out += [Copy.linear(t, src + s, dst + s, min(limit, copy.width - s)) for s in range(0, copy.width, limit)]
        return out
    per = (limit - copy.width) // copy.src_pitch + 1 if copy.src_pitch else copy.height
    if max(copy.src_pitch, copy.dst_pitch) > max_pitch:
        per = 1
    for r in range(0, copy.height, per):
        h = min(per, copy.height - r)
        src, dst = copy.src_offset + r * copy.src_pitch, copy.dst_offset + r * copy.dst_pitch
        out.append(Copy.linear(t, src, dst, copy.width) if h == 1 else
                   Copy(t, src, copy.src_pitch, dst, copy.dst_pitch, copy.width, h))
    return out
