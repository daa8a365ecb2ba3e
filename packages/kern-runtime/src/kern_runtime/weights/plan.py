"""Bind plans: a weight buffer's bind segments turned into byte copies, with coverage proven.

A `Copy` moves one contiguous source byte range of a checkpoint tensor into the buffer, written as
`blocks` blocks of `block_bytes` bytes, block i at `dst_offset + i * dst_pitch_bytes` (a plain
contiguous copy is one block). Interleave segments are one strided copy per source tensor: the
whole tensor is read once and scattered block by block (one pread, one 2-D copy).

`plan_bind` is pure: it needs only the buffer's dtype/shape/bind and the checkpoint's metadata.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

from ..dtypes import item_bytes
from ..errors import WeightArtifactError
from ..spec import BufferSpec, DerivedSegment, InterleaveSegment, TensorSegment
from .tensors import TensorMeta


@dataclass(frozen=True)
class Copy:
    """`src_stop - src_start` bytes of `tensor` (byte offsets into the tensor), holding `rows`
    tensor rows, written as `blocks` blocks of `block_bytes` at `dst_offset + i * dst_pitch_bytes`."""

    tensor: str
    src_start: int
    src_stop: int
    dst_offset: int
    rows: int
    block_bytes: int
    dst_pitch_bytes: int

    @property
    def nbytes(self) -> int:
        return self.src_stop - self.src_start

    @property
    def blocks(self) -> int:
        return self.nbytes // self.block_bytes if self.block_bytes else 0

    @property
    def contiguous(self) -> bool:
        return self.blocks <= 1 or self.block_bytes == self.dst_pitch_bytes

    def dst_ranges(self) -> list[tuple[int, int]]:
        """Every destination byte range [start, stop) (tests and proofs)."""
        if self.contiguous:
            return [(self.dst_offset, self.dst_offset + self.nbytes)]
        return [(self.dst_offset + i * self.dst_pitch_bytes, self.dst_offset + i * self.dst_pitch_bytes + self.block_bytes)
                for i in range(self.blocks)]


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


def _checked_meta(meta: MetaLookup, name: str, buffer: BufferSpec, trailing: tuple[int, ...], where: str) -> TensorMeta:
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


def plan_bind(buffer: BufferSpec, meta: MetaLookup, values: Mapping[str, int] | None = None) -> BindPlan:
    """Copies that fill `buffer` from the checkpoint described by `meta` (name -> TensorMeta).

    `values`: var values for the buffer's shape (default: the shape must be constant).
    Raises WeightArtifactError naming the tensor for a missing tensor, a dtype or trailing-shape
    mismatch, a row range outside the tensor, interleaved tensors of unequal or indivisible rows, and
    when the segments do not cover dim 0 of the buffer exactly (names the rows covered and expected).
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
        if isinstance(seg, TensorSegment):
            if seg.cols is not None:
                row = _plan_cols(seg, buffer, meta, trailing, row, where, copies)
                continue
            tm = _checked_meta(meta, seg.tensor, buffer, trailing, where)
            if seg.shape is not None and tuple(seg.shape) != tm.shape:
                raise WeightArtifactError(
                    f"tensor {seg.tensor!r} has shape {list(tm.shape)}, {where} declares {list(seg.shape)}"
                )
            start, stop = seg.rows if seg.rows is not None else (0, tm.rows)
            if not 0 <= start <= stop <= tm.rows:
                raise WeightArtifactError(f"{where}: rows [{start}, {stop}) lie outside tensor {seg.tensor!r} of {tm.rows} rows")
            n = (stop - start) * row_bytes
            copies.append(Copy(seg.tensor, start * row_bytes, stop * row_bytes, row * row_bytes, stop - start, n, n))
            row += stop - start
        elif isinstance(seg, InterleaveSegment):
            metas = [_checked_meta(meta, t, buffer, trailing, where) for t in seg.tensors]
            each = metas[0].rows
            r = seg.rows_each
            if r <= 0:
                raise WeightArtifactError(f"{where}: interleave rows {r} is not positive")
            for t, tm in zip(seg.tensors, metas):
                if tm.rows != each:
                    raise WeightArtifactError(f"{where}: interleaved tensor {t!r} has {tm.rows} rows, {seg.tensors[0]!r} has {each}")
                if each % r:
                    raise WeightArtifactError(f"{where}: interleaved tensor {t!r} has {each} rows, not a multiple of {r}")
            k = len(seg.tensors)
            block = r * row_bytes
            for j, t in enumerate(seg.tensors):
                copies.append(Copy(t, 0, each * row_bytes, (row + j * r) * row_bytes, each, block, k * block))
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


def _plan_cols(seg: TensorSegment, buffer: BufferSpec, meta: MetaLookup, trailing: tuple[int, ...], row: int,
               where: str, copies: list[Copy]) -> int:
    """A column range `[c0, c1)` of rows `[r0, r1)` of a 2-D tensor: one contiguous copy per row
    (`(c1 - c0) * item` bytes from each source row). Returns the next buffer row."""
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
    start, stop = seg.rows if seg.rows is not None else (0, tm.rows)
    if not 0 <= start <= stop <= tm.rows:
        raise WeightArtifactError(f"{where}: rows [{start}, {stop}) lie outside tensor {seg.tensor!r} of {tm.rows} rows")
    item = item_bytes(buffer.dtype)
    src_row, width = tm.shape[1] * item, (c1 - c0) * item
    for r in range(start, stop):
        src = r * src_row + c0 * item
        copies.append(Copy(seg.tensor, src, src + width, (row + r - start) * width, 1, width, width))
    return row + stop - start


def prove_coverage(plan: BindPlan) -> None:
    """Check the copies tile [0, plan.nbytes) exactly (no gap, no overlap).

    Contiguous copies are intervals; a strided copy set (an interleave) is proven arithmetically:
    its k copies share pitch k * block_bytes and start at consecutive blocks. Raises
    WeightArtifactError on a gap or overlap (a bug in the bind or in kern).
    """
    spans: list[tuple[int, int]] = []
    strided: dict[tuple[int, int, int], list[Copy]] = {}
    for c in plan.copies:
        if c.contiguous:
            spans.append((c.dst_offset, c.dst_offset + c.nbytes))
        else:
            strided.setdefault((c.dst_pitch_bytes, c.block_bytes, c.blocks), []).append(c)
    for (pitch, block, blocks), group in strided.items():
        group.sort(key=lambda c: c.dst_offset)
        base = group[0].dst_offset
        # candidate interleave groups: consecutive block starts, k * block == pitch
        for start in range(0, len(group), pitch // block):
            chunk = group[start : start + pitch // block]
            first = chunk[0].dst_offset
            for j, c in enumerate(chunk):
                if c.dst_offset != first + j * block:
                    raise WeightArtifactError(f"buffer {plan.buffer!r}: interleave copy of {c.tensor!r} leaves a gap")
            if len(chunk) * block != pitch:
                raise WeightArtifactError(f"buffer {plan.buffer!r}: interleave of {len(chunk)} tensors does not fill pitch {pitch}")
            spans.append((first, first + pitch * blocks))
        del base
    spans.sort()
    pos = 0
    for start, stop in spans:
        if start != pos:
            kind = "overlap" if start < pos else "gap"
            raise WeightArtifactError(f"buffer {plan.buffer!r}: bind has a {kind} at byte {min(start, pos)}")
        pos = stop
    if pos != plan.nbytes:
        raise WeightArtifactError(f"buffer {plan.buffer!r}: bind fills {pos} of {plan.nbytes} bytes")
