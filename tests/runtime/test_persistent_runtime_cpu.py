"""The runtime side of the persistent-kernel manifest features over the fake driver (fake_cuda.py): cooperative
launches (cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_COOPERATIVE, co-residency refused at load and at patch),
`zero_each_run` buffers (a memset before the first launch, inside a captured graph), and error words
(DeviceFaultError where the host waits, the word cleared, pipelined steps kept)."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_cuda import OK, FakeDriver, install
from runtime_helpers import base_manifest, scale_op

from kern_runtime import CallError, CoResidencyError, DeviceFaultError, Runtime

LAYOUT = ((0, 8), (8, 8), (16, 4), (20, 4))  # scale_op's params
PAYLOAD = b"\x7fELF fake toy for the persistent features"
SMS = 4


class CoopDriver(FakeDriver):
    """FakeDriver with an SM count and an occupancy answer: `per_sm` blocks per SM whatever the geometry."""

    per_sm = 2
    occupancy_asks: list[tuple[int, int]]

    def _cuDeviceGetAttribute(self, attribute: Any, device: Any) -> tuple:
        if int(attribute) == int(self.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT):
            return (OK, SMS)
        return super()._cuDeviceGetAttribute(attribute, device)

    def _cuOccupancyMaxActiveBlocksPerMultiprocessor(self, function: Any, threads: int, shared: int) -> tuple:
        self.occupancy_asks.append((threads, shared))
        return (OK, self.per_sm)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> CoopDriver:
    driver = CoopDriver()
    driver.occupancy_asks = []
    driver.entries = {"kern_scale": LAYOUT}
    return install(monkeypatch, driver)


def manifest(grid: Any = 8, cooperative: bool = True, graph: bool = False, **buffers: Any) -> dict[str, Any]:
    op = scale_op()
    launch = op["launches"][0]
    launch["grid"] = [grid, 1, 1]
    if cooperative:
        launch["cooperative"] = True
    m = base_manifest(ops={"scale": op})
    m["modules"] = {"toy": hashlib.sha256(PAYLOAD).hexdigest()}
    m["buffers"].update(buffers)
    m["programs"] = {"step": {"graph": graph, "calls": [{"op": "scale", "args": {"x": "x", "y": "y", "n": "tokens"}}]}}
    return m


def load(tmp_path: Path, m: dict[str, Any]) -> Runtime:
    (tmp_path / f"toy-{hashlib.sha256(PAYLOAD).hexdigest()[:12]}.cubin").write_bytes(PAYLOAD)
    return Runtime.load(m, tmp_path, None)


def names(fake: FakeDriver, since: int) -> list[str]:
    return [name for name, _ in fake.calls[since:]]


# ---------------------------------------------------------------------------------------------- cooperative


def test_a_cooperative_launch_goes_through_cuLaunchKernelEx_with_the_attribute(fake: CoopDriver, tmp_path: Path) -> None:
    with load(tmp_path, manifest(grid=SMS * CoopDriver.per_sm)) as rt:
        assert fake.occupancy_asks == [(128, 0)]  # asked once per geometry (both range ends share it)
        mark = len(fake.calls)
        rt.run("step", {"tokens": 3})
        ex = [args for name, args in fake.calls[mark:] if name == "cuLaunchKernelEx"]
        assert len(ex) == 1 and "cuLaunchKernel" not in names(fake, mark)
        config = ex[0][0]
        attrs = list(config.attrs)[: config.numAttrs]
        assert [(int(a.id), a.value.cooperative) for a in attrs] == [
            (int(fake.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE), 1)]
        assert (config.gridDimX, config.blockDimX) == (8, 128)


def test_a_launch_without_cooperative_stays_on_cuLaunchKernel(fake: CoopDriver, tmp_path: Path) -> None:
    with load(tmp_path, manifest(grid=64, cooperative=False)) as rt:
        mark = len(fake.calls)
        rt.run("step", {"tokens": 3})
        assert names(fake, mark).count("cuLaunchKernel") == 1 and "cuLaunchKernelEx" not in names(fake, mark)
        assert fake.occupancy_asks == [] and fake.called("cuOccupancyMaxActiveBlocksPerMultiprocessor") == 0


def test_a_grid_past_the_co_resident_capacity_is_refused_at_load(fake: CoopDriver, tmp_path: Path) -> None:
    with pytest.raises(CoResidencyError) as info:
        load(tmp_path, manifest(grid=SMS * CoopDriver.per_sm + 1))
    err = info.value
    assert (err.path, err.blocks, err.capacity) == ("ops.scale.launches[0]", 9, 8)
    assert "ops.scale.launches[0]: a cooperative launch of 9 blocks, but this device holds 8 at once" in str(err)
    assert "2 block(s) per SM x 4 SMs at 128 threads" in str(err)


def test_the_var_range_ends_are_checked_at_load(fake: CoopDriver, tmp_path: Path) -> None:
    fake.per_sm = 1  # capacity 4 blocks; the grid is 1 block at tokens=1 and 9 at tokens=64
    with pytest.raises(CoResidencyError, match=r"of 9 blocks, but this device holds 4"):
        load(tmp_path, manifest(grid="cdiv(tokens, 8) + 1"))


def test_a_grid_that_grows_inside_the_range_is_refused_when_patched(fake: CoopDriver, tmp_path: Path) -> None:
    fake.per_sm = 1  # capacity 4; the grid is 1 at both ends (tokens 1 and 64) and 32 at tokens = 32
    with load(tmp_path, manifest(grid="min(tokens, 65 - tokens)")) as rt:
        rt.run("step", {"tokens": 1})
        rt.run("step", {"tokens": 4})
        mark = len(fake.calls)
        with pytest.raises(CallError) as info:
            rt.run("step", {"tokens": 32})
        assert isinstance(info.value.cause, CoResidencyError) and info.value.cause.blocks == 32
        assert "cuLaunchKernelEx" not in names(fake, mark)  # refused before anything was enqueued


def test_a_cooperative_launch_is_captured_into_the_graph(fake: CoopDriver, tmp_path: Path) -> None:
    with load(tmp_path, manifest(graph=True)) as rt:
        mark = len(fake.calls)
        rt.issue("step", {"tokens": 2})
        rt.issue("step", {"tokens": 2})
        seen = [n for n in names(fake, mark) if n in ("cuStreamBeginCapture", "cuLaunchKernelEx", "cuStreamEndCapture",
                                                      "cuGraphLaunch")]
        assert seen == ["cuStreamBeginCapture", "cuLaunchKernelEx", "cuStreamEndCapture", "cuGraphLaunch",
                        "cuGraphLaunch"]


def test_the_capture_is_thread_local(fake: CoopDriver, tmp_path: Path) -> None:
    """kern captures in thread-local mode: an engine's other threads may allocate while a step is captured."""
    with load(tmp_path, manifest(graph=True)) as rt:
        mark = len(fake.calls)
        rt.issue("step", {"tokens": 2})
        modes = [args[1] for name, args in fake.calls[mark:] if name == "cuStreamBeginCapture"]
        assert modes == [fake.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL]


# ---------------------------------------------------------------------------------------------- zero_each_run

COUNTERS = {"kind": "workspace", "dtype": "u32", "shape": [64], "zero_each_run": True}


def counters_manifest(graph: bool = False) -> dict[str, Any]:
    m = manifest(grid=1, cooperative=False, graph=graph, counters=COUNTERS, other={**COUNTERS})
    m["programs"]["step"]["calls"] = [
        {"op": "scale", "args": {"x": "x", "y": "y", "n": "tokens"}},
        {"op": "scale", "args": {"x": "counters", "y": "y", "n": "tokens"}},
        {"op": "scale", "args": {"x": "counters", "y": "counters", "n": "tokens"}},
    ]
    m["programs"]["plain"] = {"calls": [{"op": "scale", "args": {"x": "x", "y": "y", "n": "tokens"}}]}
    return m


def memsets(fake: FakeDriver, since: int) -> list[tuple[int, int, int]]:
    return [(int(a[0]), int(a[1]), int(a[2])) for n, a in fake.calls[since:] if n == "cuMemsetD8Async"]


def test_a_zero_each_run_buffer_is_zeroed_before_the_first_launch(fake: CoopDriver, tmp_path: Path) -> None:
    with load(tmp_path, counters_manifest()) as rt:
        address = rt.address_of("counters")
        view = fake.mem[address].view(np.uint32)  # u32[64], the fake device memory
        view[:] = 7
        mark = len(fake.calls)
        rt.run("step", {"tokens": 1})
        assert memsets(fake, mark) == [(address, 0, 256)]  # once, though two calls pass it; 'other' is not passed
        order = [n for n in names(fake, mark) if n in ("cuMemsetD8Async", "cuLaunchKernel")]
        assert order == ["cuMemsetD8Async", "cuLaunchKernel", "cuLaunchKernel", "cuLaunchKernel"]
        assert not view.any()
        mark = len(fake.calls)
        rt.run("plain", {"tokens": 1})
        assert memsets(fake, mark) == []


@pytest.mark.parametrize(("start", "stop", "zeroed"), [(0, 1, False), (0, 2, True), (1, 2, True), (2, 3, True),
                                                       (0, 0, False), (0, 3, True)])
def test_run_range_zeroes_what_its_calls_pass(fake: CoopDriver, tmp_path: Path, start: int, stop: int,
                                              zeroed: bool) -> None:
    with load(tmp_path, counters_manifest()) as rt:
        mark = len(fake.calls)
        rt.run_range("step", {"tokens": 1}, start, stop)
        assert memsets(fake, mark) == ([(rt.address_of("counters"), 0, 256)] if zeroed else [])


def test_the_memset_is_a_node_of_the_captured_graph(fake: CoopDriver, tmp_path: Path) -> None:
    with load(tmp_path, counters_manifest(graph=True)) as rt:
        mark = len(fake.calls)
        rt.issue("step", {"tokens": 1})
        captured = names(fake, mark)
        begin, end = captured.index("cuStreamBeginCapture"), captured.index("cuStreamEndCapture")
        assert captured.index("cuMemsetD8Async") in range(begin, end)
        mark = len(fake.calls)
        rt.issue("step", {"tokens": 1})  # a replay: the graph zeroes, the host enqueues nothing else
        assert [n for n in names(fake, mark) if n.startswith(("cuMemset", "cuLaunch", "cuGraph"))] == ["cuGraphLaunch"]


# ---------------------------------------------------------------------------------------------- error words

FAULT = {"kind": "workspace", "dtype": "u32", "shape": [4], "placement": "host",
         "error": {"codes": {"1": "a counter wait timed out"}}}


def fault_manifest() -> dict[str, Any]:
    m = manifest(grid=1, cooperative=False, fault=FAULT)
    m["programs"]["step"]["calls"].append({"op": "scale", "args": {"x": "x", "y": "fault", "n": "tokens"}})
    m["programs"]["outer"] = {"calls": [{"program": "step"}]}
    return m


def plant(rt: Runtime, *words: int) -> None:
    """What a kernel does on a timeout: write the code and its detail into the mapped error word."""
    rt.host_array("fault")[: len(words)] = words


def test_an_error_word_is_zero_after_load_and_silent_while_zero(fake: CoopDriver, tmp_path: Path) -> None:
    with load(tmp_path, fault_manifest()) as rt:
        assert rt.host_array("fault").tolist() == [0, 0, 0, 0]
        rt.run("step", {"tokens": 1})
        rt.synchronize()
        rt.record_event().wait()
        assert rt.read_output("y", 1).shape == (1, 4)


def test_a_planted_fault_raises_at_synchronize_with_code_meaning_and_programs(fake: CoopDriver, tmp_path: Path) -> None:
    with load(tmp_path, fault_manifest()) as rt:
        rt.run("step", {"tokens": 1})
        plant(rt, 1, 17, 3, 99)
        with pytest.raises(DeviceFaultError) as info:
            rt.synchronize()
        err = info.value
        assert (err.buffer, err.code, err.meaning, err.programs, err.detail) == (
            "fault", 1, "a counter wait timed out", ("step", "outer"), (17, 3, 99))
        assert "one of programs ['step', 'outer'] failed on the device: error word 'fault' holds code 1" in str(err)
        assert rt.host_array("fault").tolist() == [0, 0, 0, 0]  # cleared: the runtime runs on
        rt.synchronize()


def test_an_unknown_code_is_reported_raw(fake: CoopDriver, tmp_path: Path) -> None:
    with load(tmp_path, fault_manifest()) as rt:
        plant(rt, 0xDEAD)
        with pytest.raises(DeviceFaultError, match=r"holds code 57005 \(the manifest gives no meaning for it\)"):
            rt.read_output("y", 1)


@pytest.mark.parametrize("reader", ["read_output", "read_buffer", "readback", "event", "event_ready"])
def test_every_wait_for_the_stream_checks_the_word(fake: CoopDriver, tmp_path: Path, reader: str) -> None:
    with load(tmp_path, fault_manifest()) as rt:
        rt.run("step", {"tokens": 1})
        handle = rt.read_output_async("y", 1) if reader == "readback" else None
        event = rt.record_event() if reader.startswith("event") else None
        plant(rt, 1)
        with pytest.raises(DeviceFaultError):
            if reader == "read_output":
                rt.read_output("y", 1)
            elif reader == "read_buffer":
                rt.read_buffer("x", 1)
            elif reader == "readback":
                handle.wait()
            elif reader == "event":
                event.wait()
            else:
                event.ready()


def test_pipelined_steps_report_the_fault_at_the_first_wait_and_go_on(fake: CoopDriver, tmp_path: Path) -> None:
    """kern run enqueues step k+1 before it reads step k: the fault comes with step k's event, step k+1's event (its
    word cleared) waits clean, and the pooled events are all given back."""
    with load(tmp_path, fault_manifest()) as rt:
        rt.run("step", {"tokens": 1})
        first = rt.record_event()
        rt.run("step", {"tokens": 1})
        second = rt.record_event()
        plant(rt, 1, 5)
        mark = len(fake.calls)
        with pytest.raises(DeviceFaultError) as info:
            first.wait()
        assert info.value.detail == (5, 0, 0)
        second.wait()
        assert names(fake, mark).count("cuStreamSynchronize") == 0  # no extra synchronisation per step
        assert first.ready() and second.ready()


def test_a_manifest_without_error_words_has_no_check(fake: CoopDriver, tmp_path: Path) -> None:
    with load(tmp_path, manifest(grid=1, cooperative=False)) as rt:
        assert not rt.faults and rt.faults.names == ()


# ---------------------------------------------------------------------------------------------- init

def test_an_init_buffer_holds_its_bytes_after_load(fake: CoopDriver, tmp_path: Path) -> None:
    data = bytes(range(64))
    table = {"kind": "workspace", "dtype": "u32", "shape": [16], "init": {"base64": base64.b64encode(data).decode()}}
    with load(tmp_path, manifest(grid=1, cooperative=False, table=table)) as rt:
        address = rt.address_of("table")
        assert bytes(fake.mem[address][:64]) == data
        assert rt.read_buffer("table").tobytes() == data
        copies = [a for n, a in fake.calls if n.startswith("cuMemcpyHtoD") and int(a[0]) == address]
        # once, at load, on the runtime's stream (which the once programs reading it run on)
        assert len(copies) == 1 and int(copies[0][2]) == 64 and copies[0][3] == rt.stream
