"""The skinny GEMM's schedule and launch geometry (kern_run.models.qwen3.skinny), the host mirror of what
kernels-src/gemm_skinny.cu computes on the device: every unit in exactly one block, segments that never cross a tile,
at most two partial slots a block (slot 0 the first tile, 1 the last), contributors that are exactly the blocks
whose segments meet a tile, and a decomposition that does not depend on m (it takes none)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kern_run.errors import ManifestBuildError
from kern_run.models.qwen3.skinny import SKINNY_SMEM, cdiv, contributors, reducers, schedule, skinny_geometry


def check_schedule(geo) -> None:
    seen = []
    segments = schedule(geo)
    assert len(segments) == geo.blocks
    for b, segs in enumerate(segments):
        begin, end = geo.block_range(b)
        covered = [u for s in segs for u in range(s.begin, s.end)]
        assert covered == list(range(begin, end)), f"block {b} runs other units than its range"
        seen += covered
        slots = [s.slot for s in segs if s.slot is not None]
        assert len(slots) == len(set(slots)) and set(slots) <= {0, 1}, f"block {b}: partial slots {slots}"
        for s in segs:
            assert s.begin // geo.kc == s.tile == (s.end - 1) // geo.kc, f"segment {s} crosses a tile"
            whole = s.begin == s.tile * geo.kc and s.end == (s.tile + 1) * geo.kc
            assert (s.slot is None) == whole
            if s.slot == 0:
                assert s is segs[0]
            if s.slot == 1:
                assert s is segs[-1] and len(segs) > 1
    assert seen == list(range(geo.units)), "the blocks do not cover every unit exactly once"
    for t in range(geo.tiles):
        meet = sorted({s.block for segs in segments for s in segs if s.tile == t})
        assert list(contributors(geo, t)) == meet, f"tile {t}: contributors {list(contributors(geo, t))} != {meet}"
        partial = [s for segs in segments for s in segs if s.tile == t and s.slot is not None]
        if partial:
            ends_here = [s.block for s in partial if s.end == geo.block_range(s.block)[1]]
            assert list(reducers(geo, t)) == ends_here and ends_here, f"tile {t}: reducers"
            assert len(partial) == len(meet), f"tile {t}: a contributor without a partial"


@pytest.mark.parametrize("n,k,swiglu", [(6144, 2560, False), (2560, 4096, False), (19456, 2560, True),
                                        (2560, 9728, False), (151936, 2560, False)])
@pytest.mark.parametrize("bn", sorted(SKINNY_SMEM))
def test_qwen3_4b_shapes(n, k, swiglu, bn):
    geo = skinny_geometry(n, k, 132, swiglu, bn)
    assert geo.blocks == 132
    assert geo.tiles == cdiv(n // 2 if swiglu else n, bn // 2 if swiglu else bn)
    check_schedule(geo)


@settings(max_examples=300, deadline=None)
@given(n8=st.integers(1, 400), k8=st.integers(1, 300), sms=st.integers(1, 140), swiglu=st.booleans(),
       bn=st.sampled_from(sorted(SKINNY_SMEM)))
def test_any_shape(n8, k8, sms, swiglu, bn):
    n = n8 * (16 if swiglu else 8)
    geo = skinny_geometry(n, k8 * 8, sms, swiglu, bn)
    assert 1 <= geo.blocks <= min(sms, geo.units)
    check_schedule(geo)


def test_workspace_sizes():
    geo = skinny_geometry(2560, 4096, 132, False, 128)
    assert geo.ws_bytes == 2 * 132 * 64 * 128 * 4
    assert geo.tickets == 40
    assert geo.shared_mem == 197632


@pytest.mark.parametrize("n,k,swiglu,bn,sms,what", [(2564, 4096, False, 128, 132, "n % 8"),
                                                    (2568, 4096, True, 128, 132, "n % 16"),
                                                    (2560, 4100, False, 128, 132, "k % 8"),
                                                    (2560, 4096, False, 64, 132, "tile width 64"),
                                                    (2560, 4096, False, 128, 0, "0 SMs")])
def test_refused(n, k, swiglu, bn, sms, what):
    with pytest.raises(ManifestBuildError, match=what.split()[0]):
        skinny_geometry(n, k, sms, swiglu, bn)


@pytest.mark.parametrize("argv, message", [
    (["--m", "1,x"], "--m: '1,x' needs token rows in 1..64"),
    (["--m", "65"], "--m: '65' needs token rows in 1..64"),
    (["--only", "qkv,nope"], "--only: unknown ['nope']; known: qkv, o, gate_up, gate_up+silu, down, lm_head"),
    (["--bn", "64"], "--bn: '64' needs tile widths among 128, 256"),
])
def test_bench_refuses_bad_arguments_before_the_gpu(argv, message):
    """bench/gemm_skinny.py checks its arguments before it imports torch or touches a device."""
    from bench import gemm_skinny

    with pytest.raises(SystemExit) as err:
        gemm_skinny.main(argv)
    assert str(err.value) == message
