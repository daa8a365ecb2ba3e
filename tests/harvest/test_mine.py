"""The miner on the synthetic capture: every pointer class, the fits, and each refusal naming run, launch and
parameter (docs/harvest.md "Pointer classes", "Refusals")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kern_run.harvest.capture_format import Api, Launch
from kern_run.harvest.errors import HarvestRefusal
from kern_run.harvest.mine import PointerArg, RawArg, ScalarArg, mine
from kern_run.harvest.report import report_lines
from tests.harvest.harvest_testkit import (
    EMBED, NORM, WEIGHTS, alloc_address, launch_event_index, synthetic_capture, u64, with_event, with_param,
)


def test_every_pointer_class_and_fit() -> None:
    m = mine(synthetic_capture())
    assert m.domain == (1, 2) and m.tokens == (1, 2)
    assert [(ml.function, ml.module) for ml in m.launches] == [
        ("kern_embed_gather", EMBED[0]), ("kern_add_rmsnorm", NORM[0]), ("kern_argmax_partial", m.launches[2].module),
        ("kern_argmax_final", m.launches[2].module), ("kern_embed_gather", EMBED[0])]
    ptr = lambda i, j: m.launches[i].args[j]  # noqa: E731
    assert (ptr(0, 0).kind, ptr(0, 0).target, ptr(0, 0).offset.expr) == ("weight", "model.embed_tokens.weight", 0)
    assert (ptr(4, 0).kind, ptr(4, 0).offset.expr) == ("weight", 128)  # a row into the table
    assert (ptr(0, 1).kind, ptr(0, 1).target) == ("input", "token_ids")
    assert (ptr(1, 1).kind, ptr(1, 1).target, ptr(1, 1).offset.expr) == ("state", "kv.0", 256)
    assert (ptr(3, 3).kind, ptr(3, 3).target) == ("output", "next_token")
    assert (ptr(4, 1).kind, ptr(4, 1).target) == ("input", "positions")
    assert (ptr(2, 0).kind, ptr(2, 0).target, ptr(2, 0).offset.expr) == ("output", "logits", "128 * tokens - 128")
    assert [(ptr(i, j).target, ptr(i, j).offset.expr) for i, j in ((0, 2), (1, 0), (2, 3), (2, 4), (3, 0), (4, 2))] \
        == [("#0", 0), ("#0", 0), ("#1", 0), ("#2", 0), ("#1", 0), ("#3", 0)]
    assert m.launches[0].args[3] == ScalarArg(4, m.launches[0].args[3].value) and m.launches[0].args[3].value.expr == "tokens"
    assert m.launches[0].args[4].value.expr == 64 and m.launches[4].args[4].value.expr == 32
    assert [f.expr for f in m.launches[2].grid] == [4, "tokens", 1]
    assert [(a.ordinal, a.size.expr, a.first, a.last) for a in m.allocations] == [
        (0, "128 * tokens", 0, 1), (1, "16 * tokens", 2, 3), (2, "16 * tokens", 2, 3), (3, "64 * tokens", 4, 4)]
    assert {n: (t.kind, [d.expr for d in t.shape]) for n, t in m.tensors.items()} == {
        "model.embed_tokens.weight": ("weight", [256, 64]), "model.norm.weight": ("weight", [64]),
        "kv.0": ("state", [16, 64]), "token_ids": ("input", ["tokens"]), "positions": ("input", ["tokens"]),
        "next_token": ("output", ["tokens"]), "logits": ("output", ["tokens", 64])}
    assert not any(isinstance(a, RawArg) for ml in m.launches for a in ml.args)
    lines = report_lines(m)
    assert lines[1] == ("pointers: 3 weight (2 distinct), 1 state (1 distinct), 2 input (2 distinct), 3 output "
                        "(2 distinct), 7 workspace (4 distinct)")
    assert "launch 2 param 0 offset into output logits = 128 * tokens - 128 (linear: 0 at tokens=1, 128 at tokens=2; " \
           "exact on the domain)" in lines


def refused(capture) -> list[str]:  # type: ignore[no-untyped-def]
    with pytest.raises(HarvestRefusal) as info:
        mine(capture)
    return info.value.report()


def test_a_pointer_into_unnamed_memory_names_run_launch_and_param() -> None:
    capture = with_param(synthetic_capture(), 1, 2, 3, u64(0x7E00_0000_0000))
    assert refused(capture) == ["run 1 launch 2 param 3: 0x7e0000000000 points into no tensor the capture names and "
                                "no allocation alive at this launch"]


def test_a_pointer_into_a_freed_allocation_is_a_fault() -> None:
    capture = with_param(synthetic_capture(), 0, 2, 3, u64(alloc_address(0, 0)))  # #0 was freed after launch 1
    assert refused(capture) == [f"run 0 launch 2 param 3: 0x{alloc_address(0, 0):x} points into no tensor the capture "
                                f"names and no allocation alive at this launch"]


def test_runs_that_disagree_on_a_class_or_target() -> None:
    capture = with_param(synthetic_capture(), 1, 1, 2, u64(WEIGHTS))  # run 1 reads the embed table instead
    [line] = refused(capture)
    assert line.startswith("launch 1 param 2: points into different memory in different runs: run 0 weight "
                           "model.norm.weight + 0, run 1 weight model.embed_tokens.weight + 0")
    capture = with_param(synthetic_capture(), 1, 0, 4, u64(5)[:4])  # fine: an integer in both runs, fitted
    assert mine(capture).launches[0].args[4].value.expr == "-59 * tokens + 123"


def test_a_value_no_expression_fits() -> None:
    capture = synthetic_capture((1, 2, 3))
    capture = with_param(capture, 1, 0, 5, (300).to_bytes(4, "little"))
    capture = with_param(capture, 2, 0, 5, (301).to_bytes(4, "little"))  # vocab 256, 300, 301
    assert refused(capture) == ["launch 0 param 5: value: no expression in tokens reproduces 256 at tokens=1, 300 at "
                                "tokens=2, 301 at tokens=3 (tried a*tokens+b, a*cdiv(tokens,d)+b and "
                                "a*(tokens//d)+b for d up to 4096)"]


def test_a_layout_that_changed_between_captures() -> None:
    capture = synthetic_capture()
    at = launch_event_index(capture, 1, 1)
    e = capture.runs[1].events[at]
    layout = e.params[:6] + ((40, 8),)
    capture = with_event(capture, 1, at, replace(e, params=layout, data=e.data[:40] + bytes(8)))
    assert refused(capture)[0] == ("run 1 launch 1: kern_add_rmsnorm: parameter layout [[0, 8], [8, 8], [16, 8], "
                                   "[24, 8], [32, 4], [36, 4], [40, 8]] changed from run 0's [[0, 8], [8, 8], [16, 8], "
                                   "[24, 8], [32, 4], [36, 4], [40, 4]]")


def test_a_missing_cubin_and_a_kernel_its_cubin_lacks() -> None:
    capture = synthetic_capture()
    capture = replace(capture, cubins={k: v for k, v in capture.cubins.items() if k != NORM[0]})
    assert refused(capture) == [f"launch 1: kern_add_rmsnorm: its cubin {NORM[0]} is missing from the capture"]
    capture = synthetic_capture()
    for run in (0, 1):
        at = launch_event_index(capture, run, 1)
        capture = with_event(capture, run, at, replace(capture.runs[run].events[at], module=EMBED[0]))
    assert refused(capture) == [f"launch 1: kern_add_rmsnorm is no kernel of its cubin {EMBED[0][:12]}"]


def test_an_unrecorded_module_is_resolved_by_name_and_layout() -> None:
    capture = synthetic_capture()
    for run in (0, 1):
        for launch in (0, 1):
            at = launch_event_index(capture, run, launch)
            capture = with_event(capture, run, at, replace(capture.runs[run].events[at], module=None))
    m = mine(capture)
    assert [ml.module for ml in m.launches[:2]] == [EMBED[0], NORM[0]]
    twin = EMBED[1] + b"\0"  # another cubin with the same kernel and layout: ambiguous
    capture = replace(capture, cubins={**capture.cubins, "f" * 64: twin})
    assert refused(capture)[0].startswith("launch 0: kern_embed_gather: ambiguous, cubins ")
    account = {"module_loads": {"loads": 3, "unmapped": 3}}  # what the recorder writes to source.recorder
    first = refused(replace(capture, source={**capture.source, "recorder": account}))
    assert first[0] == ('capture: launches without a recorded module; the recorder\'s account: '
                        '{"module_loads": {"loads": 3, "unmapped": 3}}')
    assert first[1].startswith("launch 0: kern_embed_gather: ambiguous, cubins ")


def test_launch_streams_that_differ() -> None:
    capture = synthetic_capture()
    capture = with_event(capture, 1, launch_event_index(capture, 1, 4), None)
    assert refused(capture)[0] == ("run 1: 4 launches, run 0 has 5: the runs did not execute the same compiled step")
    capture = synthetic_capture()
    at = launch_event_index(capture, 1, 4)
    e: Launch = capture.runs[1].events[at]
    capture = with_event(capture, 1, at, replace(e, function="kern_other"))
    assert refused(capture)[0].startswith("run 1 launch 4: kern_other (cubin ee692e8b916a), run 0 launched "
                                          "kern_embed_gather")


def test_a_memcpy_inside_the_step() -> None:
    capture = synthetic_capture()
    capture = with_event(capture, 0, 3, Api("cuMemcpyDtoDAsync_v2"))  # replaces Free(#0): #0 stays alive
    assert refused(capture) == ["run 0 after launch 1: cuMemcpyDtoDAsync_v2 inside the step: a manifest only launches "
                                "kernels (no copies, no sets)"]


def test_a_struct_holding_a_pointer() -> None:
    capture = synthetic_capture()
    for run in (0, 1):
        at = launch_event_index(capture, run, 3)
        e = capture.runs[run].events[at]
        data = e.data[:16] + u64(WEIGHTS) + e.data[24:]  # params 2..: the 4-byte count and 4 padding become one
        capture = with_event(capture, run, at, replace(e, params=((0, 8), (8, 8), (16, 16)), data=data[:32]))
    report = refused(capture)
    assert report[0].startswith("launch 3: kern_argmax_final: cuFuncGetParamInfo gave [[0, 8], [8, 8], [16, 16]]")
    assert "run 0 launch 3 param 2: a 16-byte parameter holds a pointer (0x7f0000000000) at byte 0: a struct of " \
           "pointers cannot be wired" in report


def test_overlapping_tensors() -> None:
    capture = synthetic_capture()
    t = capture.runs[0].tensors
    bad = replace(t[1], address=t[0].address + 64)  # model.norm.weight inside the embed table
    capture = replace(capture, runs=(replace(capture.runs[0], tensors=(t[0], bad) + t[2:]),) + capture.runs[1:])
    assert refused(capture)[0].startswith("run 0 tensor model.norm.weight: [0x7f0000000040, 0x7f00000000c0) overlaps "
                                          "weight model.embed_tokens.weight")


def test_the_report_lists_every_problem() -> None:
    capture = with_param(synthetic_capture(), 0, 0, 1, u64(0x7E00_0000_0000))
    capture = with_param(capture, 1, 3, 3, u64(0x7E00_0000_0008))
    with pytest.raises(HarvestRefusal) as info:
        mine(capture)
    assert [p.where for p in info.value.problems] == ["run 0 launch 0 param 1", "run 1 launch 3 param 3"]
    assert str(info.value).startswith("2 unexplained: run 0 launch 0 param 1: 0x7e0000000000 points into no tensor")


def test_pointer_args_types() -> None:
    m = mine(synthetic_capture())
    assert sum(isinstance(a, PointerArg) for ml in m.launches for a in ml.args) == 16


def test_an_output_that_is_a_view_into_an_intermediate() -> None:
    from kern_run.harvest.capture_format import Alloc, Free, Tensor

    capture = synthetic_capture()
    runs = []
    for r, run in enumerate(capture.runs):
        # next_token becomes the last 8 bytes of allocation #1 (argmax's partial values), which launches 2 and 3 use
        t = run.tokens
        # (and stays allocated: the output holds it)
        events = [Alloc(e.address, e.nbytes + 8) if isinstance(e, Alloc) and e.address == alloc_address(r, 1) else e
                  for e in run.events if not (isinstance(e, Free) and e.address == alloc_address(r, 1))]
        tensors = tuple(Tensor(x.name, x.kind, alloc_address(r, 1) + t * 16, x.nbytes, x.dtype, x.shape)
                        if x.name == "next_token" else x for x in run.tensors)
        runs.append(replace(run, events=tuple(events), tensors=tensors))
    capture = replace(capture, runs=tuple(runs))
    capture = with_param(capture, 0, 3, 3, u64(alloc_address(0, 1) + 16))
    capture = with_param(capture, 1, 3, 3, u64(alloc_address(1, 1) + 32))
    assert "run 0 tensor next_token: an output inside allocation #1, which launches [2, 3] also reach outside it: " \
           "replayed as separate buffers they would not alias" in refused(capture)


def _relocated(run, old: int, new: int):  # type: ignore[no-untyped-def]
    """`run` with the allocation at `old` moved to `new`: its Alloc and Free, and every pointer parameter equal to
    `old`."""
    from kern_run.harvest.capture_format import Alloc, Free, pack_params

    events = []
    for e in run.events:
        if isinstance(e, (Alloc, Free)) and e.address == old:
            e = replace(e, address=new)
        elif isinstance(e, Launch):
            values = [u64(new) if len(e.param(j)) == 8 and e.param(j) == u64(old) else e.param(j)
                      for j in range(len(e.params))]
            e = replace(e, data=pack_params(e.params, values))
        events.append(e)
    return replace(run, events=tuple(events))


def test_an_output_in_memory_an_earlier_intermediate_had_is_that_intermediate_until_it_is_allocated() -> None:
    """The H200 captures of 2026-12-03: the step allocates `next_token` where the embedding's intermediate (#0) had
    been, in one run and not the other. Before its own allocation exists, the address is #0's."""
    from kern_run.harvest.capture_format import Alloc, Free, Tensor

    capture = synthetic_capture()
    runs = []
    for r, run in enumerate(capture.runs):
        at = alloc_address(r, 0) if r == 1 else alloc_address(r, 9)  # run 1 reuses #0's memory, run 0 does not
        events = list(run.events)
        events.insert(next(i for i, e in enumerate(events) if isinstance(e, Free)) + 1, Alloc(at, run.tokens * 8))
        tensors = tuple(Tensor(x.name, x.kind, at, x.nbytes, x.dtype, x.shape) if x.name == "next_token" else x
                        for x in run.tensors)
        runs.append(replace(run, events=tuple(events), tensors=tensors))
    capture = replace(capture, runs=tuple(runs))
    for r in (0, 1):
        capture = with_param(capture, r, 3, 3, u64(alloc_address(r, 0) if r == 1 else alloc_address(r, 9)))
    m = mine(capture)
    ptr = lambda i, j: m.launches[i].args[j]  # noqa: E731
    assert [(ptr(i, j).kind, ptr(i, j).target) for i, j in ((0, 2), (1, 0), (3, 3))] == [
        ("workspace", "#0"), ("workspace", "#0"), ("output", "next_token")]


def test_an_output_in_memory_the_step_freed_is_refused() -> None:
    from kern_run.harvest.capture_format import Tensor

    capture = synthetic_capture()
    run = capture.runs[1]
    tensors = tuple(Tensor(x.name, x.kind, alloc_address(1, 3), x.nbytes, x.dtype, x.shape) if x.name == "next_token"
                    else x for x in run.tensors)
    capture = replace(capture, runs=(capture.runs[0], replace(run, tensors=tensors)))
    assert "run 1 tensor next_token: lies in memory the step freed (allocation #3): its bytes may be another's" \
        in refused(capture)


def test_an_intermediate_that_starts_where_a_state_ends_is_the_intermediate() -> None:
    """A value equal to a tensor's end (a zero-size view's pointer) and strictly inside a live allocation is the
    allocation: the 4B capture's intermediate at `k_cache.0 + 1048576`."""
    capture = synthetic_capture()
    kv_end = next(t.end for t in capture.runs[1].tensors if t.name == "kv.0")
    capture = replace(capture, runs=(capture.runs[0], _relocated(capture.runs[1], alloc_address(1, 0), kv_end)))
    m = mine(capture)
    assert [(m.launches[i].args[j].kind, m.launches[i].args[j].target) for i, j in ((0, 2), (1, 0))] == [
        ("workspace", "#0"), ("workspace", "#0")]


def test_a_hostile_run_is_refused_in_bounded_time() -> None:
    import time

    from kern_run.harvest.capture_format import Alloc

    capture = synthetic_capture()
    flood = tuple(Alloc(0x7E00_0000_0000 + k * 4096, 4096) for k in range(200_000))  # never freed
    capture = replace(capture, runs=(replace(capture.runs[0], events=flood + capture.runs[0].events),)
                      + capture.runs[1:])
    start = time.perf_counter()
    report = refused(capture)
    assert time.perf_counter() - start < 5
    assert "run 0 event 1024: more than 1024 allocations of the step alive at once; the rest of the run is not read" \
        in report
