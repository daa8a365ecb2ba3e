"""GPU tests of kernels-src/step.cu (contract docs/kernels-step.md) against tools/reference_step.py.

kern_decode_advance: random sequences (more than one block of 32 threads' worth, so the stride loop runs),
block tables with negative and out-of-range entries, positions at page ends, at max_pos - 1 and past it,
ring wrap-around; outputs poisoned before the launch, guard regions checked after. kern_decode_advance_packed:
the same cases with an i32 token and an f32 logprob (negative, -0, 0, -inf, NaN, subnormal) per row, next_token
and the ring packed; its inputs and slots equal kern_decode_advance's for the same tokens. kern_sample_inputs_init:
the greedy params row (kern_run.sampling.pack_params of the default SamplingParams) and an empty history.
kern_spin_ns: the launch lasts at least the requested time (CUDA events).
Run on the GPU machine:  KERN_REQUIRE_GPU=1 python -m pytest tests/kernels/test_step_gpu.py -q
"""

from __future__ import annotations


import numpy as np
import pytest

pytestmark = pytest.mark.gpu


from tools.reference_step import decode_advance, decode_advance_packed, pack, sample_inputs_init  # noqa: E402


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


def _logprobs(rng: np.random.Generator, n_seqs: int) -> np.ndarray:
    """f32 [n_seqs]: logprobs with the edge bit patterns first (-0, 0, -inf, NaN, a subnormal, the f32 min)."""
    edges = np.asarray([-0.0, 0.0, -np.inf, np.nan, -1e-45, np.finfo(np.float32).min, -1e-7, -3.5], np.float32)
    lp = (-rng.exponential(4.0, size=n_seqs)).astype(np.float32)
    lp[: min(n_seqs, len(edges))] = edges[: min(n_seqs, len(edges))]
    return lp


def _advance_packed_args(d: dict, n_seqs: int, page_tokens: int, bt_stride: int, max_pos: int, ring_len: int):
    return [("p", d[k].ptr) for k in ("tok_in", "lp", "next", "tok", "pos", "lens", "slots", "bt", "ring")] + [
        ("i", n_seqs), ("i", page_tokens), ("i", bt_stride), ("i", max_pos), ("i", ring_len)]


@pytest.mark.parametrize("n_seqs,ring_len", [(1, 64), (5, 3), (70, 64), (33, 0)])
def test_decode_advance_packed_matches_reference(gpu, n_seqs: int, ring_len: int) -> None:
    rng = np.random.default_rng(n_seqs * 100 + ring_len + 1)
    page_tokens, bt_stride, max_pos = 16, 40, 600
    nxt, bt, pos = _case(rng, n_seqs, bt_stride, page_tokens, max_pos, ring_len)
    tokens = nxt.astype(np.int32)
    lp = _logprobs(rng, n_seqs)
    ring0 = rng.integers(-5, 5, size=(n_seqs, max(ring_len, 1))).astype(np.int64)
    want = {"next": np.full(n_seqs, -7, np.int64), "tok": np.full(n_seqs, -7, np.int32), "pos": pos.copy(),
            "lens": np.full(n_seqs, -7, np.int32), "slots": np.full(n_seqs, -7, np.int32),
            "ring": ring0[:, :ring_len].copy()}
    decode_advance_packed(tokens, lp, want["next"], want["tok"], want["pos"], want["lens"], want["slots"], bt,
                          want["ring"], n_seqs, page_tokens, bt_stride, max_pos)
    d = {"tok_in": gpu.array(tokens), "lp": gpu.array(lp), "bt": gpu.array(bt), "pos": gpu.array(pos),
         "ring": gpu.array(ring0)}
    d.update({k: gpu.alloc(w * n_seqs) for k, w in (("next", 8), ("tok", 4), ("lens", 4), ("slots", 4))})
    for k in ("next", "tok", "lens", "slots"):
        d[k].poison()
    gpu.kernel("kern_decode_advance_packed").launch(
        (1, 1, 1), (32, 1, 1), _advance_packed_args(d, n_seqs, page_tokens, bt_stride, max_pos, ring_len))
    got_next = d["next"].download(np.int64, n_seqs)
    np.testing.assert_array_equal(got_next, want["next"])
    # the packing itself, bit for bit: low word the token, high word the logprob's f32 bits (NaN's payload too)
    np.testing.assert_array_equal(got_next.view(np.uint32).reshape(n_seqs, 2)[:, 0], tokens.view(np.uint32))
    np.testing.assert_array_equal(got_next.view(np.uint32).reshape(n_seqs, 2)[:, 1], lp.view(np.uint32))
    assert [pack(int(t), float(v)) for t, v in zip(tokens, lp)] == got_next.tolist()
    np.testing.assert_array_equal(d["tok"].download(np.int32, n_seqs), want["tok"])
    np.testing.assert_array_equal(d["pos"].download(np.int32, n_seqs), want["pos"])
    np.testing.assert_array_equal(d["lens"].download(np.int32, n_seqs), want["lens"])
    np.testing.assert_array_equal(d["slots"].download(np.int32, n_seqs), want["slots"])
    got_ring = d["ring"].download(np.int64, ring0.shape)
    if ring_len:
        np.testing.assert_array_equal(got_ring, want["ring"])
    else:
        np.testing.assert_array_equal(got_ring, ring0)  # ring_len 0: untouched
    np.testing.assert_array_equal(d["tok_in"].download(np.int32, n_seqs), tokens)  # inputs only read
    np.testing.assert_array_equal(d["lp"].download(np.float32, n_seqs).view(np.uint32), lp.view(np.uint32))
    gpu.check_all_guards()


def test_decode_advance_packed_writes_the_inputs_decode_advance_writes(gpu) -> None:
    """For the same tokens both entries leave the same token_ids / positions / seq_lens / slot_mapping, and the
    ring's low words are kern_decode_advance's ring (many blocks, so the grid-stride loop runs)."""
    rng = np.random.default_rng(3)
    n_seqs, page_tokens, bt_stride, max_pos, ring_len = 300, 16, 8, 128, 8
    nxt, bt, pos = _case(rng, n_seqs, bt_stride, page_tokens, max_pos, ring_len)
    lp = _logprobs(rng, n_seqs)
    plain = [gpu.array(a) for a in (nxt, np.zeros(n_seqs, np.int32), pos, np.zeros(n_seqs, np.int32),
                                    np.zeros(n_seqs, np.int32), bt, np.zeros((n_seqs, ring_len), np.int64))]
    gpu.kernel("kern_decode_advance").launch((3, 1, 1), (64, 1, 1), [("p", b.ptr) for b in plain] + [
        ("i", n_seqs), ("i", page_tokens), ("i", bt_stride), ("i", max_pos), ("i", ring_len)])
    d = {"tok_in": gpu.array(nxt.astype(np.int32)), "lp": gpu.array(lp), "bt": gpu.array(bt), "pos": gpu.array(pos),
         "ring": gpu.array(np.zeros((n_seqs, ring_len), np.int64))}
    d.update({k: gpu.array(np.zeros(n_seqs, dt)) for k, dt in (("next", np.int64), ("tok", np.int32),
                                                                 ("lens", np.int32), ("slots", np.int32))})
    gpu.kernel("kern_decode_advance_packed").launch(
        (3, 1, 1), (64, 1, 1), _advance_packed_args(d, n_seqs, page_tokens, bt_stride, max_pos, ring_len))
    for key, i, dt in (("tok", 1, np.int32), ("pos", 2, np.int32), ("lens", 3, np.int32), ("slots", 4, np.int32)):
        np.testing.assert_array_equal(d[key].download(dt, n_seqs), plain[i].download(dt, n_seqs), err_msg=key)
    ring = d["ring"].download(np.int64, (n_seqs, ring_len))
    plain_ring = plain[6].download(np.int64, (n_seqs, ring_len))
    np.testing.assert_array_equal(ring.view(np.uint32)[:, 0::2], plain_ring.view(np.uint32)[:, 0::2])
    gpu.check_all_guards()


@pytest.mark.parametrize("rows,hist_cap,grid,block", [(1, 1024, (1, 1, 1), (256, 1, 1)),
                                                     (64, 1024, (64, 1, 1), (256, 1, 1)),
                                                     (3, 5, (1, 1, 1), (32, 1, 1)), (7, 1, (2, 1, 1), (64, 1, 1))])
def test_sample_inputs_init_writes_greedy_rows_and_empty_histories(gpu, rows: int, hist_cap: int, grid,
                                                                   block) -> None:
    from kern_run.sampling import SamplingParams, pack_params

    extra = 2  # rows past `rows`: untouched
    rng = np.random.default_rng(rows)
    params0 = rng.integers(0, 2**32, size=(rows + extra, 12), dtype=np.uint64).astype(np.uint32)
    toks0 = rng.integers(-9, 9, size=(rows + extra, hist_cap)).astype(np.int32)
    counts0 = rng.integers(-9, 9, size=(rows + extra, hist_cap)).astype(np.int32)
    d = [gpu.array(a) for a in (params0, toks0, counts0)]
    gpu.kernel("kern_sample_inputs_init").launch(grid, block, [("p", b.ptr) for b in d] + [("i", rows),
                                                                                          ("i", hist_cap)])
    want = [a.copy() for a in (params0, toks0, counts0)]
    sample_inputs_init(*want, rows)
    got = [b.download(a.dtype, a.shape) for b, a in zip(d, want)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert got[0][:rows].tobytes() == pack_params([SamplingParams()] * rows)  # the host's greedy row, byte for byte
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
