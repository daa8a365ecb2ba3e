"""GPU tests of kernels-src/step.cu (contract docs/kernels-step.md) against tools/reference_step.py.

kern_decode_advance: random sequences (more than one block of 32 threads' worth, so the stride loop runs),
block tables with negative and out-of-range entries, positions at page ends, at max_pos - 1 and past it,
ring wrap-around; outputs poisoned before the launch, guard regions checked after. kern_spin_ns: the
launch lasts at least the requested time (CUDA events).
Run on the GPU machine:  KERN_REQUIRE_GPU=1 python -m pytest tests/kernels/test_step_gpu.py -q
"""

from __future__ import annotations


import numpy as np
import pytest

pytestmark = pytest.mark.gpu


from tools.reference_step import decode_advance  # noqa: E402


def _case(rng: np.random.Generator, n_seqs: int, bt_stride: int, page_tokens: int, max_pos: int, ring_len: int):
    bt = rng.integers(0, 5000, size=(n_seqs, bt_stride)).astype(np.int32)
    bt[rng.random(bt.shape) < 0.1] = -1
    edges = [0, page_tokens - 2, page_tokens - 1, max_pos - 2, max_pos - 1, max_pos, bt_stride * page_tokens - 1,
             -1, 2**31 - 1]
    pos = rng.integers(0, max_pos + 8, size=n_seqs).astype(np.int32)
    pos[: len(edges)] = np.asarray(edges[:n_seqs], dtype=np.int64).astype(np.int32)
    nxt = rng.integers(0, 151936, size=n_seqs).astype(np.int64)
    return nxt, bt, pos


@pytest.mark.parametrize("n_seqs,ring_len", [(1, 64), (5, 3), (70, 64), (33, 0)])
def test_decode_advance_matches_reference(gpu, n_seqs: int, ring_len: int) -> None:
    rng = np.random.default_rng(n_seqs * 100 + ring_len)
    page_tokens, bt_stride, max_pos = 16, 40, 600
    nxt, bt, pos = _case(rng, n_seqs, bt_stride, page_tokens, max_pos, ring_len)
    ring0 = rng.integers(-5, 5, size=(n_seqs, max(ring_len, 1))).astype(np.int64)
    want = {"tok": np.full(n_seqs, -7, np.int32), "pos": pos.copy(), "lens": np.full(n_seqs, -7, np.int32),
            "slots": np.full(n_seqs, -7, np.int32), "ring": ring0[:, :ring_len].copy()}
    decode_advance(nxt, want["tok"], want["pos"], want["lens"], want["slots"], bt, want["ring"], n_seqs,
                   page_tokens, bt_stride, max_pos)
    d_nxt, d_bt, d_pos = gpu.array(nxt), gpu.array(bt), gpu.array(pos)
    d_tok, d_lens, d_slots = (gpu.alloc(4 * n_seqs) for _ in range(3))
    for b in (d_tok, d_lens, d_slots):
        b.poison()
    d_ring = gpu.array(ring0)
    k = gpu.kernel("kern_decode_advance")
    k.launch((1, 1, 1), (32, 1, 1), [("p", d_nxt.ptr), ("p", d_tok.ptr), ("p", d_pos.ptr), ("p", d_lens.ptr),
                                      ("p", d_slots.ptr), ("p", d_bt.ptr), ("p", d_ring.ptr), ("i", n_seqs),
                                      ("i", page_tokens), ("i", bt_stride), ("i", max_pos), ("i", ring_len)])
    got_ring = d_ring.download(np.int64, ring0.shape)
    np.testing.assert_array_equal(d_tok.download(np.int32, n_seqs), want["tok"])
    np.testing.assert_array_equal(d_pos.download(np.int32, n_seqs), want["pos"])
    np.testing.assert_array_equal(d_lens.download(np.int32, n_seqs), want["lens"])
    np.testing.assert_array_equal(d_slots.download(np.int32, n_seqs), want["slots"])
    if ring_len:
        np.testing.assert_array_equal(got_ring, want["ring"])
    else:
        np.testing.assert_array_equal(got_ring, ring0)  # ring_len 0: untouched
    np.testing.assert_array_equal(d_nxt.download(np.int64, n_seqs), nxt)
    np.testing.assert_array_equal(d_bt.download(np.int32, bt.shape), bt)
    gpu.check_all_guards()


def test_decode_advance_many_blocks_and_zero_seqs(gpu) -> None:
    rng = np.random.default_rng(7)
    n_seqs, page_tokens, bt_stride, max_pos = 300, 16, 8, 128
    nxt, bt, pos = _case(rng, n_seqs, bt_stride, page_tokens, max_pos, 8)
    want = [np.zeros(n_seqs, np.int32) for _ in range(3)]
    want_pos, ring = pos.copy(), np.zeros((n_seqs, 8), np.int64)
    decode_advance(nxt, want[0], want_pos, want[1], want[2], bt, ring, n_seqs, page_tokens, bt_stride, max_pos)
    d = [gpu.array(a) for a in (nxt, np.zeros(n_seqs, np.int32), pos, np.zeros(n_seqs, np.int32),
                                np.zeros(n_seqs, np.int32), bt, np.zeros((n_seqs, 8), np.int64))]
    k = gpu.kernel("kern_decode_advance")
    k.launch((3, 1, 1), (64, 1, 1), [("p", b.ptr) for b in d] + [("i", n_seqs), ("i", page_tokens),
                                                                  ("i", bt_stride), ("i", max_pos), ("i", 8)])
    np.testing.assert_array_equal(d[4].download(np.int32, n_seqs), want[2])
    np.testing.assert_array_equal(d[6].download(np.int64, (n_seqs, 8)), ring)
    before = d[2].download(np.int32, n_seqs)
    k.launch((1, 1, 1), (32, 1, 1), [("p", b.ptr) for b in d] + [("i", 0), ("i", page_tokens),
                                                                  ("i", bt_stride), ("i", max_pos), ("i", 8)])
    np.testing.assert_array_equal(d[2].download(np.int32, n_seqs), before)  # n_seqs 0: nothing written
    gpu.check_all_guards()


def test_spin_ns_lasts_at_least_the_request(gpu) -> None:
    from cuda.bindings import driver as cu
    from tests.kernels.gpu_helpers import check

    k = gpu.kernel("kern_spin_ns")
    start, stop = (check(cu.cuEventCreate(0), "cuEventCreate") for _ in range(2))
    for ns in (0, 50_000, 2_000_000):
        check(cu.cuEventRecord(start, 0), "cuEventRecord")
        k.launch((1, 1, 1), (32, 1, 1), [("q", ns)], sync=False)
        check(cu.cuEventRecord(stop, 0), "cuEventRecord")
        check(cu.cuEventSynchronize(stop), "cuEventSynchronize")
        ms = check(cu.cuEventElapsedTime(start, stop), "cuEventElapsedTime")
        assert ms * 1e6 >= 0.95 * ns, (ns, ms)
        assert ms < 50 + ns / 1e6, (ns, ms)
