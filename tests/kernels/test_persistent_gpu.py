"""On the GPU: kern_persistent_decode (kernels-src/persistent_decode.cu) under the runtime's general features.

* The planted hang: a table whose one instruction waits on a counter nothing signals makes the step fail with
  DeviceFaultError (code 1, the instruction, counter, value and target in the detail) within a bounded time, eager
  and as a captured graph, and the runtime runs on afterwards (the word cleared, the counters zeroed per step).
* A table that runs (one ARGMAX instruction over planted partials) writes next_token and leaves the word zero.
* A grid past the co-resident capacity is refused at load with CoResidencyError.
* ATTN (the fused attention): a slot_mapping that is not the block table's slot of the last token faults with code
  5 before anything is written; an ATTN outside the geometry or the counters faults with code 2.

Run with `KERN_REQUIRE_GPU=1 pytest tests/kernels/test_persistent_gpu.py` (the committed cubin).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from kern_run.models.qwen3.persistent.isa import NO_COUNTER, Instr, Op, Table
from kern_run.models.qwen3.persistent.manifest import ERROR_CODES, LAYER_SLOTS, MAX_LAYERS, POINTERS

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).parents[2]
KERNELS = ROOT / "kernels"
TIMEOUT_NS = 50_000_000  # 50 ms per wait


def packed(table: Table) -> bytes:
    """`table` packed without `Table.check`: the planted tables are ones check() refuses."""
    n, q = len(table.instrs), len(table.queues)
    offsets = [0]
    for queue in table.queues:
        offsets.append(offsets[-1] + len(queue))
    total = 16 + q + 1 + n + 8 * n
    header = [0x5453504B, 2, n, q, table.num_counters, 8, 16, 16 + q + 1, 16 + q + 1 + n, total, table.flags] + [0] * 5
    words = header + offsets + [i for queue in table.queues for i in queue] + [w for i in table.instrs for w in i.words()]
    return struct.pack(f"<{total}I", *words)


# the kernel's scratch at this geometry (x f32[64], 64 reduction floats, 9 head rows of 256), then a 2-step ring of
# 16 KiB steps (kRingStepBytes): the least shared memory the kernel runs with
SHARED_MIN = 4 * (64 + 64 + 9 * 256) + 2 * 16384


def manifest(table: Table, grid: int | None = None, shared_mem: int = SHARED_MIN) -> dict:
    """A one-program manifest: `step` launches kern_persistent_decode over `table` with a tiny geometry (hidden 64,
    2 q heads, 1 kv head, head_dim 16, vocab 64, one layer: no layer instruction runs in these tests)."""
    abi = json.loads((KERNELS / "kernels.json").read_text())["modules"]["persistent_decode"]
    params = abi["entries"]["kern_persistent_decode"]["params"]
    data = packed(table)
    geometry = [64, 2, 1, 16, 64, 64, 1, 16, 16, 1]
    shape = [{"offset": 4 * i, "i32": v} for i, v in enumerate(geometry)] + [{"offset": 40, "f32": 1e-6},
                                                                           {"offset": 44, "f32": 0.25}]
    small = {"kind": "workspace", "dtype": "u32", "shape": [256]}
    buffers = {name: dict(small) for name in POINTERS}
    buffers.update({
        "table": {"kind": "workspace", "dtype": "u32", "shape": [len(data) // 4],
                  "init": {"base64": base64.b64encode(data).decode()}},
        "counters": {"kind": "workspace", "dtype": "u32", "shape": [table.num_counters], "zero_each_run": True},
        "error": {"kind": "workspace", "dtype": "u32", "shape": [8], "placement": "host",
                  "error": {"codes": ERROR_CODES}},
        "argmax_partials": {"kind": "workspace", "dtype": "u32", "shape": [2, 2]},
        "next_token": {"kind": "output", "dtype": "i64", "shape": [1]},
    })
    launch = {"module": "persistent_decode", "entry": "kern_persistent_decode",
              "grid": [grid or len(table.queues), 1, 1], "block": [256, 1, 1],
              "shared_mem": shared_mem, "cooperative": True, "params": params,
              "args": [{"arg": n} for n in POINTERS] + [{"pack": {"size": 48, "fields": shape}}, {"i32": 1},
                                                        {"u64": TIMEOUT_NS},
                                                        {"pack": {"size": LAYER_SLOTS * 8 * MAX_LAYERS, "fields": []}}]}
    return {
        "format": "kern-manifest/1", "name": "persistent-test", "vars": {"tokens": {"min": 1, "max": 1}},
        "modules": {"persistent_decode": abi["sha256"]}, "buffers": buffers,
        "ops": {"persist": {"args": [{"name": n, "kind": "ptr"} for n in POINTERS], "launches": [launch]}},
        "programs": {"step": {"graph": True, "calls": [{"op": "persist", "args": {n: n for n in POINTERS}}]}},
    }


def argmax_table(wait: tuple[int, int] | None) -> Table:
    """One ARGMAX instruction over 2 partials; `wait` (counter, target) or none. Counter 0 is the one it signals,
    counter 1 is signalled by nothing."""
    wc, wt = wait if wait is not None else (NO_COUNTER, 0)
    return Table((Instr(Op.ARGMAX, 1, 0, 2, wc, wt, 0),), ((0,),), 2)


@pytest.fixture
def runtime_of():
    from kern_runtime import Runtime

    opened = []

    def load(m: dict):
        rt = Runtime.load(m, KERNELS, None)
        opened.append(rt)
        return rt

    yield load
    for rt in opened:
        rt.close()


def plant_partials(rt) -> None:
    parts = np.zeros(4, np.uint32)  # (value bits, index) x 2: 1.5 at 7, 2.5 at 3
    parts[0], parts[1] = np.float32(1.5).view(np.uint32), 7
    parts[2], parts[3] = np.float32(2.5).view(np.uint32), 3
    address = rt.address_of("argmax_partials")
    from kern_runtime.cuda.driver import call

    call("cuMemcpyHtoD", address, parts.ctypes.data, parts.nbytes)


@pytest.mark.parametrize("eager", [True, False])
def test_a_table_that_runs_writes_next_token(runtime_of, eager: bool) -> None:
    rt = runtime_of(manifest(argmax_table(None)))
    plant_partials(rt)
    rt.issue("step", {"tokens": 1}, eager=eager)
    assert int(rt.read_output("next_token")[0]) == 3
    assert rt.host_array("error").tolist() == [0] * 8


@pytest.mark.parametrize("eager", [True, False])
def test_a_planted_hang_fails_the_step_in_bounded_time(runtime_of, eager: bool) -> None:
    from kern_runtime import DeviceFaultError

    rt = runtime_of(manifest(argmax_table((1, 1))))
    start = time.perf_counter()
    rt.issue("step", {"tokens": 1}, eager=eager)
    with pytest.raises(DeviceFaultError) as info:
        rt.read_output("next_token")
    elapsed = time.perf_counter() - start
    err = info.value
    assert err.code == 1 and err.programs == ("step",) and "counter wait timed out" in str(err)
    assert err.detail[:5] == (0, 1, 0, 1, 0)  # instruction 0, counter 1 seen at 0, target 1, block 0
    assert elapsed < 5.0, f"the bounded wait took {elapsed:.2f} s"
    rt.issue("step", {"tokens": 1}, eager=eager)  # the next step faults again, and is reported again
    with pytest.raises(DeviceFaultError):
        rt.synchronize()


def test_a_pipelined_caller_reads_the_fault_with_the_step(runtime_of) -> None:
    from kern_runtime import DeviceFaultError

    rt = runtime_of(manifest(argmax_table((1, 1))))
    rt.issue("step", {"tokens": 1})
    first = rt.record_event()
    rt.issue("step", {"tokens": 1})  # step k + 1 is enqueued before step k is read
    second = rt.record_event()
    with pytest.raises(DeviceFaultError):
        first.wait()
    try:  # step k + 1 faults too: folded into step k's word when it came first (first fault wins), else its own
        second.wait()
    except DeviceFaultError as exc:
        assert exc.code == 1
    rt.synchronize()  # nothing left unreported
    assert rt.host_array("error").tolist() == [0] * 8


def test_a_grid_past_the_co_resident_capacity_is_refused_at_load(runtime_of) -> None:
    from kern_runtime import CoResidencyError

    queues = tuple((0,) if q == 0 else () for q in range(4096))
    table = Table(argmax_table(None).instrs, queues, 2)
    with pytest.raises(CoResidencyError, match=r"ops.persist.launches\[0\]: a cooperative launch of 4096 blocks"):
        runtime_of(manifest(table))


def test_a_grid_unlike_the_tables_queue_count_is_a_launch_fault(runtime_of) -> None:
    from kern_runtime import DeviceFaultError

    rt = runtime_of(manifest(argmax_table(None), grid=2))
    rt.issue("step", {"tokens": 1}, eager=True)
    with pytest.raises(DeviceFaultError) as info:
        rt.synchronize()
    assert info.value.code == 3 and info.value.detail[:2] == (2, 256)


def test_too_little_shared_memory_for_a_two_step_ring_is_a_launch_fault(runtime_of) -> None:
    from kern_runtime import DeviceFaultError

    rt = runtime_of(manifest(argmax_table(None), shared_mem=SHARED_MIN - 16))
    rt.issue("step", {"tokens": 1}, eager=True)
    with pytest.raises(DeviceFaultError) as info:
        rt.synchronize()
    assert info.value.code == 3 and info.value.detail[:3] == (1, 256, SHARED_MIN - 16)
    rt = runtime_of(manifest(argmax_table(None)))  # the least that runs
    plant_partials(rt)
    rt.issue("step", {"tokens": 1}, eager=True)
    rt.synchronize()
    assert int(rt.read_output("next_token")[0]) == 3


def test_an_unknown_table_flag_is_a_table_fault(runtime_of) -> None:
    from kern_run.models.qwen3.persistent.isa import KNOWN_FLAGS
    from kern_runtime import DeviceFaultError

    assert KNOWN_FLAGS + 1 == 16  # the first bit past the known flags (a bit the kernel knows would not fault)
    rt = runtime_of(manifest(dataclasses.replace(argmax_table(None), flags=KNOWN_FLAGS + 1)))
    rt.issue("step", {"tokens": 1}, eager=True)
    with pytest.raises(DeviceFaultError) as info:
        rt.synchronize()
    assert info.value.code == 2


def attn_table(**fields: int) -> Table:
    """One ATTN instruction (kv head 0, split 0 of the geometry's 1) signalling counter 0, its ticket counter 1;
    `fields` replace the instruction's."""
    ins = Instr(Op.ATTN, 0, 0, 1, NO_COUNTER, 0, 0, 0)
    return Table((dataclasses.replace(ins, **fields),), ((0,),), 2)


def put_i32(rt, name: str, values: list[int]) -> None:
    from kern_runtime.cuda.driver import call

    data = np.array(values, np.int32)
    call("cuMemcpyHtoD", rt.address_of(name), data.ctypes.data, data.nbytes)


@pytest.mark.parametrize("eager", [True, False])
def test_an_attn_whose_slot_is_not_the_last_tokens_faults_before_it_writes(runtime_of, eager: bool) -> None:
    """seq_len 5 with the block table's page 0: token 4's slot is 4, but slot_mapping says 7. The writer split
    faults (code 5: slot_mapping, the block table's slot, seq_len) before its rope reads a layer pointer (this
    manifest has none: a run past the check would fault on a null address, not return a code)."""
    from kern_runtime import DeviceFaultError

    rt = runtime_of(manifest(attn_table()))
    put_i32(rt, "seq_lens", [5])
    put_i32(rt, "slot_mapping", [7])
    rt.issue("step", {"tokens": 1}, eager=eager)
    with pytest.raises(DeviceFaultError) as info:
        rt.read_output("next_token")
    assert info.value.code == 5 and info.value.detail[:3] == (7, 4, 5), info.value
    assert "slot_mapping is not the block table's slot" in str(info.value)


@pytest.mark.parametrize("fields", [{"layer": 1}, {"count": 2}, {"arg": 1}, {"first": 1}, {"signal_counter": 1}])
def test_an_attn_outside_the_geometry_or_the_counters_is_a_table_fault(runtime_of, fields: dict[str, int]) -> None:
    """layer 1 of a 1-layer model, 2 splits where the geometry has 1, split 1 of 1, kv head 1 of 1, or a ticket
    (signal + 1 + kv head) past the 2 counters: code 2 naming the block and the instruction, nothing run."""
    from kern_runtime import DeviceFaultError

    rt = runtime_of(manifest(attn_table(**fields)))
    rt.issue("step", {"tokens": 1}, eager=True)
    with pytest.raises(DeviceFaultError) as info:
        rt.synchronize()
    assert info.value.code == 2 and info.value.detail[:2] == (0, 0), info.value
