"""API misuse over the fake driver (fake_cuda.py): typed kern errors, raised before anything changes."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import kern_pool
from fake_cuda import FakeDriver, fake_cuda  # noqa: F401 - the fixture
from kern_runtime import (
    KERN_ERRORS, ApiError, Capacity, HostTensors, Runtime, WeightArtifactError,
)
from kern_runtime.cuda.graphs import normalise_vars
from kern_manifest import Var
from runtime_helpers import base_manifest

Q = np.arange(128, dtype=np.uint16).reshape(8, 16)


def weight_manifest() -> dict:
    m = base_manifest()
    m["buffers"]["w"] = {"kind": "weight", "dtype": "bf16", "shape": [8, 16], "bind": [{"tensor": "q"}]}
    return m


def pool_manifest() -> dict:
    return base_manifest(states={"pa": {"kind": "paged", "bytes_per_token": 8192, "page_tokens": 16},
                                 "ss": {"kind": "per_seq", "bytes_per_seq": 4096}})


def tensors() -> HostTensors:
    return HostTensors({"q": ("bf16", Q)})


def load_pool(tmp_path: Path, **kw) -> Runtime:
    return Runtime.load(pool_manifest(), tmp_path, None, capacity=Capacity(tokens=128, seqs=2), **kw)


def allocations(fake: FakeDriver) -> int:
    return sum(fake.called(n) for n in ("cuMemAlloc", "cuMemHostAlloc", "cuStreamCreate", "cuMemCreate"))


# ---------------------------------------------------------------- 1. resident on another GPU


def test_load_refuses_resident_of_another_gpu(fake_cuda: FakeDriver, tmp_path: Path) -> None:
    fake_cuda.device_count = 2
    res = Runtime.load(weight_manifest(), tmp_path, tensors(), gpu=0).into_resident()
    kept = dict(res.buffers)
    before = allocations(fake_cuda)
    with pytest.raises(ApiError, match="GPU 0, not 1"):
        Runtime.load(weight_manifest(), tmp_path, tensors(), gpu=1, resident=res)
    with pytest.raises(ApiError, match="GPU 0, not 1"):
        Runtime.load_over(res, weight_manifest(), tmp_path, tensors(), gpu=1)
    with pytest.raises(ApiError, match="gpu must be an integer"):
        Runtime.load_over(res, weight_manifest(), tmp_path, tensors(), gpu=True)
    assert res.buffers == kept and res.context is not None  # untouched, still usable
    assert allocations(fake_cuda) == before
    with Runtime.load(weight_manifest(), tmp_path, tensors(), gpu=0, resident=res) as rt:
        assert rt.address_of("w") == next(iter(kept.values())).address


@pytest.mark.parametrize("resident", [object(), {}, 0])
def test_load_refuses_non_resident(fake_cuda: FakeDriver, tmp_path: Path, resident) -> None:
    with pytest.raises(ApiError, match="resident must be a Resident"):
        Runtime.load(weight_manifest(), tmp_path, tensors(), resident=resident)
    with pytest.raises(ApiError, match="resident must be a Resident"):
        Runtime.load_over(resident, weight_manifest(), tmp_path, tensors())
    assert fake_cuda.calls == []


# ---------------------------------------------------------------- 2. threads


@pytest.mark.parametrize("threads", [-1, 0, 1.5, "2", True])
def test_load_refuses_bad_threads(fake_cuda: FakeDriver, tmp_path: Path, threads) -> None:
    with pytest.raises(ApiError, match="threads"):
        Runtime.load(weight_manifest(), tmp_path, tensors(), threads=threads)
    assert fake_cuda.calls == []  # before anything is allocated


@pytest.mark.parametrize("threads", [None, 1, np.int64(2)])
def test_load_threads_loads_weights(fake_cuda: FakeDriver, tmp_path: Path, threads) -> None:
    with Runtime.load(weight_manifest(), tmp_path, tensors(), threads=threads) as rt:
        assert (rt.read_buffer("w") == Q).all()
        assert rt.weight_load_stats[0] == Q.nbytes


def test_load_progress_callback_error_is_typed(fake_cuda: FakeDriver, tmp_path: Path) -> None:
    """A progress callback that raises stops the load with ApiError naming it, chained to the original."""
    seen = []

    def progress(done: int, total: int) -> None:
        seen.append((done, total))
        raise KeyError("boom")

    with pytest.raises(ApiError, match="progress callback raised KeyError") as info:
        Runtime.load(weight_manifest(), tmp_path, tensors(), threads=1, progress=progress)
    assert isinstance(info.value.__cause__, KeyError) and seen and seen[0][1] == Q.nbytes


# ---------------------------------------------------------------- 3. handles of another runtime


def test_handles_of_another_runtime_refused(fake_cuda: FakeDriver, tmp_path: Path) -> None:
    rt, rt2 = load_pool(tmp_path), load_pool(tmp_path)
    rt.reserve_host(4, 2)
    rt2.reserve_host(4, 2)
    lease2 = rt2.lease(20)
    lease2.advance_to(20)
    parked2 = rt2.park(rt2.room(rt2.checkpoint(lease2, 20)))
    rt2.settle()
    waking2 = rt2.wake(parked2, 20, 32)
    pool = rt.kern_pool
    free = (pool.free_pages, pool.free_slots)
    with pytest.raises(kern_pool.Misuse, match="another pool"):
        rt.block_table([lease2], 8)
    with pytest.raises(kern_pool.Misuse, match="another host"):
        rt.awake(waking2)
    with pytest.raises(kern_pool.Misuse, match="another host"):
        rt.landed(waking2)
    with pytest.raises(kern_pool.Misuse, match="another host"):
        rt.landed(parked2)
    assert (pool.free_pages, pool.free_slots) == free
    pool.check()
    assert rt2.awake(waking2) is not None  # the owner still can
    rt.close()
    rt2.close()


def test_awake_of_closed_waking_raises_closed(fake_cuda: FakeDriver, tmp_path: Path) -> None:
    with load_pool(tmp_path) as rt:
        rt.reserve_host(4, 2)
        lease = rt.lease(20)
        lease.slots(0, 20)  # positions 0..19 written
        parked = rt.park(rt.room(rt.checkpoint(lease, 20)))
        rt.settle()
        waking = rt.wake(parked, 20, 32)
        waking.close()
        with pytest.raises(kern_pool.Closed, match="closed Waking"):
            rt.awake(waking)


# ---------------------------------------------------------------- 4. wrong types to the pool API


def test_pool_api_refuses_wrong_handle_types(fake_cuda: FakeDriver, tmp_path: Path) -> None:
    with load_pool(tmp_path) as rt:
        rt.reserve_host(4, 2)
        lease = rt.lease(20)
        lease.advance_to(16)
        parked = rt.park_now(rt.checkpoint(lease, 16))  # each at the position reached: the lease holds a slot
        lease.advance_to(20)
        cp = rt.checkpoint(lease, 20)
        pool = rt.kern_pool
        free = (pool.free_pages, pool.free_slots, rt.host_tier.free_pages)
        cases = [
            ("Lease", lambda: rt.checkpoint(None, 1)), ("Lease", lambda: rt.checkpoint(lease.inner, 1)),
            ("Lease", lambda: rt.retire(None, 1)), ("Lease", lambda: rt.retire(lease.inner, 1)),
            ("Lease", lambda: rt.fork(None, 1, 2)), ("Lease", lambda: rt.fork(lease.inner, 1, 2)),
            ("Checkpoint", lambda: rt.lease_from(None, 20)), ("Checkpoint", lambda: rt.lease_from(cp.inner, 20)),
            ("Checkpoint", lambda: rt.lease_from(lease, 20)),
            ("Checkpoint", lambda: rt.room(None)), ("Checkpoint", lambda: rt.room(cp.inner)),
            ("Checkpoint", lambda: rt.park_now(None)), ("Checkpoint", lambda: rt.park_now(cp.inner)),
            ("Parked", lambda: rt.landed(None)), ("Parked", lambda: rt.landed(cp)),
            ("Waking", lambda: rt.awake(None)), ("Waking", lambda: rt.awake(parked)),
            ("Lease", lambda: rt.block_table([1], 4)), ("Lease", lambda: rt.block_table([lease.inner], 4)),
        ]
        for expected, fn in cases:
            with pytest.raises(kern_pool.Misuse, match=expected):
                fn()
        assert (pool.free_pages, pool.free_slots, rt.host_tier.free_pages) == free
        pool.check()


@pytest.mark.parametrize(("args", "match"), [
    (([None], 0), "width"), (([None], -1), "width"), (([None], 1.5), "width"), (([None], "4"), "width"),
    (([None], True), "width"), (([], 4, -1), "rows"), (([], 4, 1.5), "rows"), ((None, 4), "list"),
    (("abc", 4), "list"),
])
def test_block_table_refuses_bad_arguments(fake_cuda: FakeDriver, tmp_path: Path, args, match) -> None:
    with load_pool(tmp_path) as rt:
        with pytest.raises(ApiError, match=match):
            rt.block_table(*args)


def test_block_table_refuses_a_lease_not_in_a_list(fake_cuda: FakeDriver, tmp_path: Path) -> None:
    with load_pool(tmp_path) as rt:
        lease = rt.lease(20)
        with pytest.raises(ApiError, match="list"):
            rt.block_table(lease, 4)
        assert rt.block_table((lease, None), np.int64(8)).shape == (2, 8)


@pytest.mark.parametrize(("table", "row", "match"), [
    (np.zeros((1, 8), np.int32), 5, "outside"), (np.zeros((1, 8), np.int32), -1, "outside"),
    (np.zeros((1, 8), np.int32), 0.5, "integer"), (np.zeros((1, 8), np.int32), True, "integer"),
    (np.zeros(8, np.int32), 0, "2-D"), ([[0] * 8], 0, "2-D"),
])
def test_seq_line_refuses_bad_row_or_table(fake_cuda: FakeDriver, tmp_path: Path, table, row, match) -> None:
    with load_pool(tmp_path) as rt:
        lease = rt.lease(20)
        with pytest.raises(ApiError, match=match):
            lease.seq_line(table, row)


# ---------------------------------------------------------------- 5. reserve_host counts


@pytest.mark.parametrize(("pages", "slots"), [(-1, 0), ("2", 0), (1.5, 0), (0, -3), (True, 0)])
def test_reserve_host_refuses_bad_counts_before_allocating(fake_cuda: FakeDriver, tmp_path: Path, pages,
                                                           slots) -> None:
    with load_pool(tmp_path) as rt:
        before, live = allocations(fake_cuda), len(fake_cuda.mem)
        with pytest.raises(kern_pool.Misuse, match="reserve_host"):
            rt.reserve_host(pages, slots)
        assert allocations(fake_cuda) == before and len(fake_cuda.mem) == live
        assert rt.reserve_host(4, 2) > 0  # still usable


def test_reserve_host_refuses_more_than_physical_memory(fake_cuda: FakeDriver, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A host tier larger than the machine's memory is refused before anything is pinned; one that fits is not."""
    import kern_runtime.kv.device_pool as pooled

    with load_pool(tmp_path) as rt:
        monkeypatch.setattr(pooled, "host_memory_bytes", lambda: 1 << 20)
        before, live = allocations(fake_cuda), len(fake_cuda.mem)
        with pytest.raises(ApiError, match=r"reserve_host\(10{30}, 0\): .* exceed this machine's 1048576 bytes"):
            rt.reserve_host(10**30, 0)
        assert allocations(fake_cuda) == before and len(fake_cuda.mem) == live
        monkeypatch.setattr(pooled, "host_memory_bytes", lambda: None)  # the OS does not say: no check
        assert rt.reserve_host(4, 2) > 0
    assert pooled.host_memory_bytes() is None or pooled.host_memory_bytes() > 1 << 20


# ---------------------------------------------------------------- 6. var values


VARS = {"tokens": Var(name="tokens", min=1, max=64)}


@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(3), np.uint8(3)])
def test_vars_accept_integers(value) -> None:
    out = normalise_vars({"tokens": value}, VARS, frozenset({"tokens"}), "step")
    assert out == {"tokens": 3} and type(out["tokens"]) is int


@pytest.mark.parametrize("values", [{"tokens": 3.0}, {"tokens": "3"}, {"tokens": True}, {"tokens": np.float64(3)},
                                    5, [("tokens", 3)], "tokens", {1: 3}])
def test_vars_refuse_non_integers_and_non_mappings(values) -> None:
    with pytest.raises(ApiError):
        normalise_vars(values, VARS, frozenset({"tokens"}), "step")


def test_run_and_issue_take_numpy_vars(fake_cuda: FakeDriver, tmp_path: Path) -> None:
    with Runtime.load(base_manifest(), tmp_path, None) as rt:
        rt.run("step", {"tokens": np.int64(3)})
        rt.issue("step", {"tokens": np.int32(3)})
        for bad in (5, [("tokens", 1)], {"tokens": 1.0}):
            with pytest.raises(ApiError, match="step"):
                rt.run("step", bad)
            with pytest.raises(ApiError, match="step"):
                rt.issue("step", bad)
        with pytest.raises(ApiError, match="unknown program"):
            rt.run(["step"], {})


# ---------------------------------------------------------------- 7. read_output rows


@pytest.mark.parametrize("rows", [2.5, "2", True, [2]])
def test_read_output_refuses_non_integer_rows(fake_cuda: FakeDriver, tmp_path: Path, rows) -> None:
    with Runtime.load(base_manifest(), tmp_path, None) as rt:
        before = allocations(fake_cuda)
        with pytest.raises(ApiError, match="rows"):
            rt.read_output("y", rows=rows)
        with pytest.raises(ApiError, match="rows"):
            rt.read_output_async("y", rows=rows)
        assert allocations(fake_cuda) == before
        assert rt.read_output_async("y", rows=np.int64(2)).wait().shape == (2, 4)


# ---------------------------------------------------------------- 8. KERN_ERRORS


@pytest.mark.parametrize(("tokens", "seqs", "match"), [(-1, 1, "tokens must be an int >= 0, got -1"),
                                                       (16, -2, "seqs must be an int >= 0, got -2"),
                                                       (1.5, 1, "tokens"), (16, "1", "seqs")])
def test_capacity_refusal_is_a_kern_error(tokens, seqs, match) -> None:
    """kern_runtime.Capacity keeps kern_pool's sizing rules (it is one) but refuses a bad value with ApiError, a
    KernError naming the value, as the rest of Runtime.load's refusals."""
    from kern_runtime import Capacity, KernError

    with pytest.raises(ApiError, match=match) as info:
        Capacity(tokens=tokens, seqs=seqs)
    assert isinstance(info.value, KernError) and f"Capacity(tokens={tokens!r}" in str(info.value)
    good = Capacity(tokens=None, seqs=3)
    assert isinstance(good, kern_pool.Capacity) and (good.tokens, good.seqs) == (None, 3)


@pytest.mark.parametrize("cls", [kern_pool.Misuse, kern_pool.Closed, kern_pool.Busy, kern_pool.ExceedsPool,
                                 kern_pool.Remapping, kern_pool.NotLanded])
def test_kern_errors_catch_pool_errors(cls) -> None:
    assert issubclass(cls, KERN_ERRORS)


# ---------------------------------------------------------------- 9. wrong types to Runtime.load


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"capacity": 4096}, "capacity"), ({"capacity": {"tokens": 128, "seqs": 1}}, "capacity"),
    ({"capacity": (128, 1)}, "capacity"), ({"gpu": "0"}, "gpu"), ({"gpu": None}, "gpu"), ({"gpu": True}, "gpu"),
    ({"gpu": 0.0}, "gpu"), ({"kernels_dir": None}, "kernels_dir"), ({"kernels_dir": 5}, "kernels_dir"),
    ({"tensors": {"q": Q}}, "tensors"), ({"ranks": [1]}, "ranks"), ({"ranks": {"tp": "0"}}, "ranks"),
    ({"ranks": {1: 0}}, "ranks"), ({"progress": 5}, "progress"),
])
def test_load_refuses_wrong_argument_types(fake_cuda: FakeDriver, tmp_path: Path, kwargs, match) -> None:
    args = {"kernels_dir": tmp_path, "tensors": tensors(), **kwargs}
    with pytest.raises(ApiError, match=match):
        Runtime.load(weight_manifest(), args.pop("kernels_dir"), args.pop("tensors"), **args)
    assert fake_cuda.calls == []


def test_load_takes_numpy_gpu(fake_cuda: FakeDriver, tmp_path: Path) -> None:
    with Runtime.load(base_manifest(), tmp_path, None, gpu=np.int64(0)) as rt:
        assert type(rt.gpu) is int and type(rt.describe()["gpu"]) is int


def test_run_hooked_refuses_non_callable(fake_cuda: FakeDriver, tmp_path: Path) -> None:
    with Runtime.load(base_manifest(), tmp_path, None) as rt:
        with pytest.raises(ApiError, match="on_launch"):
            rt.run_hooked("step", {"tokens": 1}, None)
        rt.run_hooked("step", {"tokens": 1}, lambda i, r: None)


# ---------------------------------------------------------------- 10. absurd capacity


@pytest.mark.parametrize("tokens", [10**8, 10**30])
def test_capacity_beyond_device_memory_refused_quickly(fake_cuda: FakeDriver, tmp_path: Path, tokens) -> None:
    start = time.perf_counter()
    with pytest.raises(ApiError, match=r"needs \d+ bytes.*has \d+ bytes free"):
        Runtime.load(pool_manifest(), tmp_path, None, capacity=Capacity(tokens=tokens, seqs=1))
    assert time.perf_counter() - start < 5
    assert fake_cuda.called("cuMemCreate") == 0 and not fake_cuda.mem  # nothing mapped, everything freed


def test_capacity_within_device_memory_loads(fake_cuda: FakeDriver, tmp_path: Path) -> None:
    for capacity in (Capacity(tokens=4096, seqs=4), Capacity(tokens=None, seqs=1)):
        with Runtime.load(pool_manifest(), tmp_path, None, capacity=capacity) as rt:
            assert rt.num_pages > 0


# ---------------------------------------------------------------- 11. byte order


def test_host_tensors_refuse_big_endian() -> None:
    with pytest.raises(WeightArtifactError, match="big-endian"):
        HostTensors({"q": ("bf16", Q.astype(">u2"))})
    with pytest.raises(WeightArtifactError, match="big-endian"):
        HostTensors.from_numpy({"q": np.arange(4, dtype=">i4")})
    assert HostTensors.from_numpy({"q": np.arange(4, dtype="<i4")}).meta("q").shape == (4,)


def test_dropped_readback_handles_give_their_pinned_staging_back(fake_cuda: FakeDriver, tmp_path: Path) -> None:
    """A read_output_async handle dropped without wait() keeps its pinned staging only while its copy runs:
    once the event has completed the next readback reuses it (no new cuMemHostAlloc); while it has not, a new
    buffer is taken and the running copy's is left alone."""
    import gc

    with Runtime.load(base_manifest(), tmp_path, None) as rt:
        rt.read_output_async("y", rows=2).wait()  # one staging buffer, now free
        pinned = fake_cuda.called("cuMemHostAlloc")
        for _ in range(5):  # dropped unwaited, each copy complete (the fake's events are always done)
            rt.read_output_async("y", rows=2)
            gc.collect()
        assert rt.read_output_async("y", rows=2).wait().shape == (2, 4)  # reclaims the last dropped one
        assert fake_cuda.called("cuMemHostAlloc") == pinned
        fake_cuda.fail["cuEventQuery"] = 600  # CUDA_ERROR_NOT_READY: a dropped handle's copy still runs
        rt.read_output_async("y", rows=2)  # takes the one free buffer, then is dropped mid-copy
        gc.collect()
        second = rt.read_output_async("y", rows=2)
        assert fake_cuda.called("cuMemHostAlloc") == pinned + 1
        del fake_cuda.fail["cuEventQuery"]
        assert second.wait().shape == (2, 4)
        gc.collect()
        third = rt.read_output_async("y", rows=2)  # both earlier buffers are free again: no new one
        assert fake_cuda.called("cuMemHostAlloc") == pinned + 1
        # a handle still held is never robbed, though its copy has completed: the next readback takes the
        # other free buffer, and the one after that a new one
        fourth = rt.read_output_async("y", rows=2)
        assert fake_cuda.called("cuMemHostAlloc") == pinned + 1
        fifth = rt.read_output_async("y", rows=2)
        assert fake_cuda.called("cuMemHostAlloc") == pinned + 2
        assert third.wait().shape == fourth.wait().shape == fifth.wait().shape == (2, 4)


def test_wrong_buffer_kind_is_named_with_its_article(fake_cuda: FakeDriver, tmp_path: Path) -> None:
    """`read_output` of an input, `write_input` of an output or a weight: the message names the buffer's kind
    ("an input buffer", not "a input buffer")."""
    with Runtime.load(weight_manifest(), tmp_path, tensors()) as rt:
        with pytest.raises(ApiError, match=r"^buffer 'x' is an input buffer, expected output$"):
            rt.read_output("x")
        with pytest.raises(ApiError, match=r"^buffer 'y' is an output buffer, expected input$"):
            rt.write_input("y", np.zeros((1, 4), np.float32))
        with pytest.raises(ApiError, match=r"^buffer 'w' is a weight buffer, expected output$"):
            rt.read_output_async("w")
