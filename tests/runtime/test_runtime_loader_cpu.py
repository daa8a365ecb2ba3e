"""The weight loader's device paths without a GPU: a fake driver whose device memory is a numpy array.

Copies queue on their stream and run only when an event recorded after them, or the stream, is
synchronised: the latest a real GPU could run them. A staging buffer refilled before the DMA out of
it finished therefore shows as wrong bytes, and freeing a staging buffer with a copy still queued
fails. Checked: interleave (3 tensors), column slices (at the row end, with row ranges), row ranges,
staging sizes that split 2-D copies by rows and rows into 1-D pieces, one driver copy per piece (never
per row), pinned buffers allocated lazily (at most two per worker, freed), and the error path.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from kern_runtime import DriverError, HostTensors, SafetensorsTensors, WeightArtifactError, plan_bind
from kern_manifest import Buffer
from runtime_helpers import buffer_of, interleave, seg, write_bf16_file
from kern_runtime.weights import DeviceBlob, loader
from kern_runtime.weights.loader import Target, WeightLoader
from kern_manifest import Expr

BASE = 1 << 50  # fake device addresses: far above any user-space host pointer


class FakeDriver:
    """`driver.call` / `driver.cu()` for the loader (thread-safe)."""

    def __init__(self, device_bytes: int, refuse_2d_dtod: bool = False) -> None:
        self.mem = np.full(device_bytes, 0xEE, dtype=np.uint8)
        self.refuse_2d_dtod = refuse_2d_dtod
        self.lock = threading.RLock()
        self.ids = itertools.count(1)
        self.pinned: dict[int, np.ndarray] = {}
        self.pinned_sizes: list[int] = []
        self.streams: dict[str, list[tuple]] = {}   # pending ops
        self.done: dict[str, int] = {}               # ops executed per stream
        self.submitted: dict[str, int] = {}
        self.events: dict[str, tuple[str, int] | None] = {}
        self.calls: list[str] = []
        self.copies: list[tuple] = []                # every copy op, as issued
        self.module = SimpleNamespace(
            CU_MEMHOSTALLOC_PORTABLE=1,
            CUDA_MEMCPY2D=SimpleNamespace,
            CUmemorytype=SimpleNamespace(CU_MEMORYTYPE_HOST="host", CU_MEMORYTYPE_DEVICE="device"),
        )

    # -------------------------------------------------------- memory

    def _bytes(self, address: int, nbytes: int) -> np.ndarray:
        if address >= BASE:
            offset = address - BASE
            assert 0 <= offset and offset + nbytes <= self.mem.size, f"device access [{offset}, +{nbytes}) out of range"
            return self.mem[offset:offset + nbytes]
        for start, arr in self.pinned.items():
            if start <= address and address + nbytes <= start + arr.size:
                return arr[address - start:address - start + nbytes]
        return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))  # a host buffer of the test

    def _run(self, op: tuple) -> None:
        _, src, src_pitch, dst, dst_pitch, width, height = op
        for r in range(height):
            self._bytes(dst + r * dst_pitch, width)[:] = self._bytes(src + r * src_pitch, width)

    def _drain(self, stream: str, upto: int) -> None:
        while self.done[stream] < upto:
            self._run(self.streams[stream].pop(0))
            self.done[stream] += 1

    def _enqueue(self, stream: str, op: tuple) -> None:
        self.streams[stream].append(op)
        self.submitted[stream] += 1
        self.copies.append(op)

    # -------------------------------------------------------- calls

    def __call__(self, name: str, *args: Any) -> Any:
        with self.lock:
            self.calls.append(name)
            if name == "cuCtxSetCurrent":
                return None
            if name == "cuStreamCreate":
                s = f"stream{next(self.ids)}"
                self.streams[s], self.done[s], self.submitted[s] = [], 0, 0
                return s
            if name == "cuEventCreate":
                e = f"event{next(self.ids)}"
                self.events[e] = None
                return e
            if name == "cuMemHostAlloc":
                size, _flags = args
                arr = np.full(size, 0xAB, dtype=np.uint8)
                self.pinned[arr.ctypes.data] = arr
                self.pinned_sizes.append(size)
                return arr.ctypes.data
            if name == "cuMemFreeHost":
                (address,) = args
                arr = self.pinned[address]
                for ops in self.streams.values():
                    for op in ops:
                        assert not (address <= op[1] < address + arr.size), "staging freed with a copy queued"
                del self.pinned[address]
                return None
            if name in ("cuMemcpyHtoDAsync", "cuMemcpyDtoDAsync", "cuMemcpyDtoHAsync"):
                dst, src, n, stream = args
                self._enqueue(stream, (name, src, n, dst, n, n, 1))
                return None
            if name == "cuMemcpy2DAsync":
                p, stream = args
                src = p.srcHost if p.srcMemoryType == "host" else p.srcDevice
                dst = p.dstHost if p.dstMemoryType == "host" else p.dstDevice
                assert (src >= BASE) == (p.srcMemoryType == "device") and (dst >= BASE) == (p.dstMemoryType == "device")
                assert p.srcPitch >= p.WidthInBytes and p.dstPitch >= p.WidthInBytes and p.Height >= 2
                if self.refuse_2d_dtod and src >= BASE and dst >= BASE:
                    raise DriverError("cuMemcpy2DAsync", "CUDA_ERROR_INVALID_VALUE", 1, "")
                self._enqueue(stream, (name, src, p.srcPitch, dst, p.dstPitch, p.WidthInBytes, p.Height))
                return None
            if name == "cuEventRecord":
                event, stream = args
                self.events[event] = (stream, self.submitted[stream])
                return None
            if name == "cuEventSynchronize":
                (event,) = args
                if self.events[event] is not None:
                    self._drain(*self.events[event])
                return None
            if name == "cuStreamSynchronize":
                (stream,) = args
                self._drain(stream, self.submitted[stream])
                return None
            if name == "cuEventDestroy":
                del self.events[args[0]]
                return None
            if name == "cuStreamDestroy":
                assert not self.streams[args[0]], "stream destroyed with copies queued"
                del self.streams[args[0]]
                return None
            raise AssertionError(f"unexpected driver call {name}{args}")

    def device(self, offset: int, nbytes: int) -> np.ndarray:
        return self.mem[offset:offset + nbytes]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    def make(device_bytes: int, **kwargs: Any) -> FakeDriver:
        driver = FakeDriver(device_bytes, **kwargs)
        monkeypatch.setattr(loader, "call", driver)
        monkeypatch.setattr(loader, "cu", lambda: driver.module)
        return driver
    return make


def buffer(name: str, shape: tuple[int, ...], bind, placement: str = "device") -> Buffer:
    return buffer_of(name, "weight", "bf16", tuple(Expr(d) for d in shape), placement=placement, bind=tuple(bind))


def checkpoint(tmp_path: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    shapes = {"gate": (24, 40), "up": (24, 40), "extra": (24, 40), "o": (33, 50), "down": (17, 61), "q": (9, 40)}
    t = {n: rng.integers(0, 2**16, s, dtype=np.uint16) for n, s in shapes.items()}
    write_bf16_file(tmp_path / "model-00001-of-00002.safetensors", {n: t[n] for n in ("gate", "o", "q")})
    write_bf16_file(tmp_path / "model-00002-of-00002.safetensors", {n: t[n] for n in ("up", "extra", "down")})
    return t


def buffers_and_expected(t: dict[str, np.ndarray]) -> list[tuple[Buffer, np.ndarray]]:
    """Every segment kind, with what numpy slicing of the checkpoint says each buffer holds."""
    tri = np.concatenate([t[n][b:b + 4] for b in range(0, 24, 4) for n in ("gate", "up", "extra")])
    return [
        (buffer("tri", (72, 40), [interleave(("gate", "up", "extra"), 4)]), tri),
        (buffer("pair1", (48, 40), [interleave(("gate", "up"), 1)]),
         np.stack([t["gate"], t["up"]], axis=1).reshape(48, 40)),
        (buffer("o_end", (33, 25), [seg("o", None, (33, 50), (25, 50))]), t["o"][:, 25:50]),
        (buffer("o_mid_rows", (20, 13), [seg("o", (5, 25), None, (7, 20))]), t["o"][5:25, 7:20]),
        (buffer("down_mix", (17 + 3, 30), [seg("down", None, None, (31, 61)),
                                           seg("down", (2, 5), None, (0, 30))]),
         np.concatenate([t["down"][:, 31:61], t["down"][2:5, 0:30]])),
        (buffer("qkv_rows", (5 + 24, 40), [seg("q", (2, 7)), seg("up")]),
         np.concatenate([t["q"][2:7], t["up"]])),
    ]


def place(specs: list[tuple[Buffer, np.ndarray]], meta) -> tuple[list[Target], list[int], int]:
    targets, offsets, at = [], [], 0
    for spec, want in specs:
        plan = plan_bind(spec, meta)
        targets.append(Target(plan, BASE + at))
        offsets.append(at)
        at += -(-plan.nbytes // 256) * 256
    return targets, offsets, at


@pytest.mark.parametrize("staging", [None, 4096, 1000, 130, 64])
@pytest.mark.parametrize("threads", [1, 3, 8])
def test_staged_copies_land_byte_for_byte(tmp_path: Path, fake, staging: int | None, threads: int) -> None:
    t = checkpoint(tmp_path)
    tensors = SafetensorsTensors.open(tmp_path)
    specs = buffers_and_expected(t)
    targets, offsets, total = place(specs, tensors.meta)
    driver = fake(total)
    seen: list[tuple[int, int]] = []
    wl = WeightLoader(tensors, "ctx", threads=threads, staging_bytes=staging, progress=lambda d, n: seen.append((d, n)))
    pieces = wl.pieces(targets)
    nbytes, _ = wl.run(targets)
    for (spec, want), offset in zip(specs, offsets):
        got = driver.device(offset, want.nbytes).view(np.uint16).reshape(want.shape)
        np.testing.assert_array_equal(got, want, err_msg=spec.name)
    assert nbytes == sum(w.nbytes for _, w in specs) and seen[-1] == (nbytes, nbytes)
    # one driver copy per piece (a 2-D copy for every multi-row piece), never one per row
    assert len(driver.copies) == len(pieces)
    assert sum(op[0] == "cuMemcpy2DAsync" for op in driver.copies) == sum(not p.copy.dense for p in pieces)
    limit = staging or loader.STAGING_BYTES
    assert all(p.copy.src_span <= limit for p in pieces)
    # staging: allocated by the workers, at most two each, sized to the largest piece, all freed
    assert len(driver.pinned_sizes) <= 2 * threads and driver.pinned == {}
    assert set(driver.pinned_sizes) == {max(p.copy.src_span for p in pieces)}
    assert not any(driver.streams.values())
    assert {"staging_alloc", "read", "wait", "issue", "wall"} <= set(wl.timings)


def test_default_staging_makes_one_2d_copy_per_column_slice(tmp_path: Path, fake) -> None:
    t = checkpoint(tmp_path)
    tensors = SafetensorsTensors.open(tmp_path)
    spec = buffer("o_end", (33, 25), [seg("o", None, (33, 50), (25, 50))])
    driver = fake(33 * 25 * 2)
    WeightLoader(tensors, "ctx", threads=4).run([Target(plan_bind(spec, tensors.meta), BASE)])
    (op,) = driver.copies
    blob = tensors.blob("o")
    assert op[0] == "cuMemcpy2DAsync" and op[2:] == (100, BASE, 50, 50, 33)  # src pitch = the checkpoint row
    assert driver.pinned_sizes == [32 * 100 + 50] and blob.nbytes == 33 * 100
    np.testing.assert_array_equal(driver.device(0, 33 * 50).view(np.uint16).reshape(33, 25), t["o"][:, 25:])


def test_host_tensors_go_through_staging_too(fake) -> None:
    rng = np.random.default_rng(3)
    a = rng.integers(0, 2**16, (10, 12), dtype=np.uint16)
    tensors = HostTensors({"a": ("bf16", a)})
    spec = buffer("a_cols", (9, 5), [seg("a", (1, 10), None, (7, 12))])
    driver = fake(9 * 5 * 2)
    WeightLoader(tensors, "ctx", threads=2, staging_bytes=60).run([Target(plan_bind(spec, tensors.meta), BASE)])
    np.testing.assert_array_equal(driver.device(0, 90).view(np.uint16).reshape(9, 5), a[1:10, 7:12])


class DeviceTensors(HostTensors):
    """Tensors already in (fake) device memory at `BASE + offset`."""

    def __init__(self, arrays, offsets) -> None:
        super().__init__(arrays)
        self.offsets = offsets

    def blob(self, name: str) -> DeviceBlob:
        return DeviceBlob(BASE + self.offsets[name], self.meta(name).nbytes)  # type: ignore[union-attr]


@pytest.mark.parametrize("refuse", [False, True])
def test_device_sources_copy_2d_and_fall_back_to_rows(fake, refuse: bool) -> None:
    rng = np.random.default_rng(4)
    o = rng.integers(0, 2**16, (6, 10), dtype=np.uint16)
    g = rng.integers(0, 2**16, (4, 10), dtype=np.uint16)
    u = rng.integers(0, 2**16, (4, 10), dtype=np.uint16)
    driver = fake(4096, refuse_2d_dtod=refuse)
    offsets = {"o": 0, "g": 512, "u": 1024}
    for name, arr in (("o", o), ("g", g), ("u", u)):
        driver.device(offsets[name], arr.nbytes)[:] = arr.reshape(-1).view(np.uint8)
    tensors = DeviceTensors({"o": ("bf16", o), "g": ("bf16", g), "u": ("bf16", u)}, offsets)
    cols = plan_bind(buffer("c", (6, 4), [seg("o", None, None, (6, 10))]), tensors.meta)
    inter = plan_bind(buffer("i", (8, 10), [interleave(("g", "u"), 2)]), tensors.meta)
    WeightLoader(tensors, "ctx").run([Target(cols, BASE + 2048), Target(inter, BASE + 3072)])
    np.testing.assert_array_equal(driver.device(2048, 48).view(np.uint16).reshape(6, 4), o[:, 6:])
    np.testing.assert_array_equal(driver.device(3072, 160).view(np.uint16).reshape(8, 10),
                                  np.concatenate([g[0:2], u[0:2], g[2:4], u[2:4]]))
    kinds = [op[0] for op in driver.copies]
    assert kinds.count("cuMemcpy2DAsync") == (0 if refuse else 3)
    assert kinds.count("cuMemcpyDtoDAsync") == (6 + 2 + 2 if refuse else 0)


def test_short_file_fails_cleanly(tmp_path: Path, fake) -> None:
    t = checkpoint(tmp_path)
    tensors = SafetensorsTensors.open(tmp_path)
    specs = buffers_and_expected(t)
    targets, _, total = place(specs, tensors.meta)
    driver = fake(total)
    shard = tmp_path / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-500])  # the end of 'down' is gone (headers were read before)
    with pytest.raises(WeightArtifactError, match="short read"):
        WeightLoader(tensors, "ctx", threads=3, staging_bytes=256).run(targets)
    assert driver.pinned == {} and not any(driver.streams.values()) and driver.events == {}


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tensor_parallel_column_slices_are_one_2d_copy_each(tmp_path: Path, fake, tp: int) -> None:
    """A TP rank's row-parallel weights (o_proj / down_proj `cols` slices, as kern_run.models.qwen3.tp binds them):
    each rank's segment is one cuMemcpy2DAsync from the staging buffer at the default staging size, source pitch =
    the checkpoint row, destination pitch = width = the rank's slice, height = every row; never a copy per row. The
    bytes land as numpy's column slice on every rank."""
    rng = np.random.default_rng(tp)
    hidden, q_full, inter = 256, 512, 1024
    t = {"o": rng.integers(0, 2**16, (hidden, q_full), dtype=np.uint16),
         "down": rng.integers(0, 2**16, (hidden, inter), dtype=np.uint16)}
    write_bf16_file(tmp_path / "model.safetensors", t)
    tensors = SafetensorsTensors.open(tmp_path)
    for rank in range(tp):
        specs = []
        for name, full in (("o", q_full), ("down", inter)):
            w = full // tp
            specs.append((buffer(f"w_{name}", (hidden, w), [seg(name, None, (hidden, full), (rank * w, (rank + 1) * w))]),
                          t[name][:, rank * w:(rank + 1) * w], full * 2, w * 2))
        targets, offsets, total = place([(s, want) for s, want, _, _ in specs], tensors.meta)
        driver = fake(total)
        WeightLoader(tensors, "ctx", threads=2).run(targets)
        assert [op[0] for op in driver.copies] == ["cuMemcpy2DAsync"] * 2
        for (spec, want, src_pitch, width), offset in zip(specs, offsets):
            (op,) = [op for op in driver.copies if op[3] == BASE + offset]
            assert op[2] == src_pitch and op[4:] == (width, width, hidden), (rank, spec.name, op)
            got = driver.device(offset, want.nbytes).view(np.uint16).reshape(want.shape)
            np.testing.assert_array_equal(got, want, err_msg=f"rank {rank} {spec.name}")
