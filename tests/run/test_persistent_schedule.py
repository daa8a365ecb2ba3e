"""The persistent decode kernel's instruction table as data (kern_run.models.qwen3.persistent): tables for the 1.7B,
4B and 8B shapes with the fused attention (ATTN) and the split one (ROPE, ATTN_PARTIAL, ATTN_REDUCE), their packing,
the simulator on them at several block counts, the data-flow against today's decode program, and hostile tables
(the ATTN tickets among them) refused."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import pytest

from kern_run.models.qwen3.config import Qwen3Config
from kern_run.models.qwen3.options import BuildOptions, validate
from kern_run.models.qwen3.persistent.isa import (
    HEADER_WORDS,
    INSTR_WORDS,
    NO_COUNTER,
    Instr,
    Op,
    Table,
    TableError,
    unpack,
)
from kern_run.models.qwen3.persistent.schedule import (
    ARG_ROW_SPLIT,
    ATTN_MODES,
    BATCH_ROWS,
    KSPLIT_MAX_ROWS,
    STEP_CHUNKS,
    WARPS,
    assign_queues,
    build_schedule,
    row_split_steps,
    tile_rows,
)
from kern_run.models.qwen3.persistent.simulate import DataflowError, check_dataflow, simulate
from kern_run.models.qwen3.programs import decode_gemv_calls

CONFIGS = Path(__file__).parents[1] / "data" / "configs"
SHAPES = ("Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B")


def config(name: str) -> Qwen3Config:
    return Qwen3Config.from_json(json.loads((CONFIGS / f"{name}.json").read_text()))


def tiny() -> Qwen3Config:
    base = config("Qwen3-1.7B")
    return dataclasses.replace(base, hidden=64, layers=2, q_heads=4, kv_heads=2, head_dim=16, intermediate=96,
                               vocab=200)


@pytest.fixture(scope="module", params=[(n, a) for n in SHAPES for a in ATTN_MODES], ids=lambda p: f"{p[0]}-{p[1]}")
def shape(request: pytest.FixtureRequest):
    name, attn = request.param
    cfg = config(name)
    return cfg, build_schedule(cfg, 132, attn=attn)


def test_instruction_counts_and_weight_bytes_match_the_model(shape) -> None:
    cfg, sched = shape
    ops = [i.op for i in sched.table.instrs]
    L, H, I, D = cfg.layers, cfg.hidden, cfg.intermediate, cfg.head_dim
    qkv_dim = (cfg.q_heads + 2 * cfg.kv_heads) * D
    if Op.ATTN in ops:
        assert ops.count(Op.ATTN) == L * cfg.kv_heads * sched.splits
        assert not {Op.ROPE, Op.ATTN_PARTIAL, Op.ATTN_REDUCE} & set(ops)
        # one signal counter and kv_heads tickets a layer for the attention, one counter for each other phase
        assert sched.table.num_counters == L * (4 + 1 + cfg.kv_heads) + 2
    else:
        assert ops.count(Op.ROPE) == L * cfg.kv_heads and ops.count(Op.ATTN_REDUCE) == L * cfg.kv_heads
        assert ops.count(Op.ATTN_PARTIAL) == L * cfg.kv_heads * sched.splits
        assert Op.ATTN not in ops
    assert ops.count(Op.ARGMAX) == 1 and ops[-1] == Op.ARGMAX and ops.count(Op.LM_HEAD) == sched.lm_tiles
    for op, rows in ((Op.QKV, qkv_dim), (Op.O_PROJ, H), (Op.GATE_UP, I), (Op.DOWN, H), (Op.LM_HEAD, cfg.vocab)):
        per_layer = [i for i in sched.table.instrs if i.op == op and i.layer == (L if op == Op.LM_HEAD else 0)]
        assert len(per_layer) <= 132 and sum(i.count for i in per_layer) == rows, op
        assert [i.first for i in per_layer] == sorted(i.first for i in per_layer)
    weights = sum(s.weight_bytes for s in sched.steps)
    per_layer = (qkv_dim * H + H * cfg.q_heads * D + 2 * I * H + H * I) * 2
    assert weights == L * per_layer + cfg.vocab * H * 2  # every projection weight byte once, nothing twice


def test_queues_are_balanced_by_weight_bytes(shape) -> None:
    _, sched = shape
    costs = sched.queue_costs()
    assert max(costs) / min(costs) < 1.03
    assert all(len(q) > 0 for q in sched.table.queues)


def test_each_phase_runs_on_distinct_blocks(shape) -> None:
    """Every (layer, class) phase has at most 132 instructions, so none shares a block with another of its phase
    (two would run one after the other on the critical path: 4B had up to 3 ATTN_PARTIALs and 2 DOWN tiles on one
    block before)."""
    _, sched = shape
    block_of = {i: q for q, queue in enumerate(sched.table.queues) for i in queue}
    phases: dict[tuple[int, Op], list[int]] = {}
    for i, ins in enumerate(sched.table.instrs):
        phases.setdefault((ins.layer, ins.op), []).append(block_of[i])
    for key, blocks in phases.items():
        assert len(blocks) <= 132 and len(set(blocks)) == len(blocks), key
    partials = phases.get((1, Op.ATTN_PARTIAL), phases.get((1, Op.ATTN)))
    assert len(partials) == 8 * sched.splits == 128  # 8 kv heads x 16 splits at every shape: 128 of the 132 blocks


def test_assign_queues_holds_a_block_for_the_rest_of_its_phase() -> None:
    # 3 queues. Without phases the least loaded queue (1) takes instructions 3, 4 and 5 in a row. With phase A of
    # 4 instructions (the 4th reuses the least loaded queue once all 3 are taken) and phase B of 2, B's two go to
    # two blocks: queue 1 (cost 2), then queue 2 (cost 5), not queue 1 again.
    costs = [10, 1, 5, 1, 1, 1]
    assert assign_queues(costs, 3) == ((0,), (1, 3, 4, 5), (2,))
    assert assign_queues(costs, 3, [("A",)] * 4 + [("B",)] * 2) == ((0,), (1, 3, 4), (2, 5))


def test_the_table_packs_and_unpacks_to_itself(shape) -> None:
    _, sched = shape
    data = sched.table.pack()
    n, q = len(sched.table.instrs), len(sched.table.queues)
    assert len(data) == 4 * (HEADER_WORDS + q + 1 + n + n * INSTR_WORDS)
    assert unpack(data) == sched.table


@pytest.mark.parametrize("num_queues", [1, 2, 3, 7, 64, 132, 200])
@pytest.mark.parametrize("attn", ATTN_MODES)
def test_every_wait_is_satisfied_at_any_block_count(num_queues: int, attn: str) -> None:
    for name in SHAPES:
        sched = build_schedule(config(name), num_queues, attn=attn)
        result = simulate(sched.table, seed=num_queues)
        assert result.finished, result.blocked[:3]
        assert sorted(result.order) == list(range(len(sched.table.instrs)))
        signals = [0] * sched.table.num_counters
        for ins in sched.table.instrs:
            signals[ins.signal_counter] += 1
        assert list(result.counters) == signals


def test_the_simulated_order_does_not_depend_on_the_pick_order() -> None:
    sched = build_schedule(tiny(), 5)
    outcomes = {simulate(sched.table, seed=s).counters for s in range(6)}
    assert len(outcomes) == 1 and all(simulate(sched.table, seed=s).finished for s in range(6))


def test_the_dataflow_is_the_sequential_programs(shape) -> None:
    _, sched = shape
    assert check_dataflow(sched) > 1_000_000  # every conflicting pair checked, not a sample


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("attn", ATTN_MODES)
def test_the_table_follows_todays_decode_program_call_by_call(name: str, attn: str) -> None:
    """Table order = programs.decode_gemv_calls (gemv v2) + the argmax: the same classes in the same order, each
    touching the same manifest buffers as the call it replaces (besides its own partials buffers, and the
    slot_mapping the early attention partial rereads after its PDL wait). Fused, the rope and the attention are one
    ATTN run touching both calls' buffers but `q`, which it keeps in shared memory."""
    cfg = config(name)
    plan = validate(cfg, BuildOptions(name="x", gemv="v2"))
    calls = decode_gemv_calls(plan) + [{"op": "argmax", "args": {"logits": "logits", "out": "next_token"}}]
    classes = {"gemv_qkv": [Op.QKV], "qk_norm_rope_kv": [Op.ROPE], "attn_decode": [Op.ATTN_PARTIAL, Op.ATTN_REDUCE],
               "gemv_o": [Op.O_PROJ], "gemv_gate_up_act": [Op.GATE_UP], "gemv_down_act": [Op.DOWN],
               "gemv_lm_head": [Op.LM_HEAD], "argmax": [Op.ARGMAX]}
    sched = build_schedule(cfg, 132, attn=attn)
    runs: list[tuple[Op, set[str]]] = []
    for ins, step in zip(sched.table.instrs, sched.steps):
        buffers = {a.buffer for a in step.accesses} - {"attn_partials", "argmax_partials"}
        if runs and runs[-1][0] == ins.op:
            runs[-1][1].update(buffers)
        else:
            runs.append((ins.op, buffers))
    expected: list[tuple[Op, set[str]]] = []
    for c in calls:
        names = {v for v in c["args"].values() if isinstance(v, str)}
        if c["op"] == "attn_decode":
            names.discard("slot_mapping")
        for k, op in enumerate(classes[c["op"]]):
            if k == 1:  # the reduce reads the partials and seq_lens, writes attn_out
                expected.append((op, {"seq_lens", "attn_out"}))
            elif c["op"] == "attn_decode":
                expected.append((op, names - {"attn_out"}))
            elif c["op"] == "argmax":
                expected.append((op, names - {"logits"}))  # it reads the LM_HEAD tiles' argmax partials
            else:
                expected.append((op, names))
    if attn == "fused":
        merged: list[tuple[Op, set[str]]] = []
        for op, names in expected:
            if op in (Op.ROPE, Op.ATTN_PARTIAL, Op.ATTN_REDUCE):
                if merged and merged[-1][0] == Op.ATTN:
                    merged[-1][1].update(names)
                else:
                    merged.append((Op.ATTN, set(names)))
            else:
                merged.append((op, names))
        expected = [(op, names - {"q"}) if op == Op.ATTN else (op, names) for op, names in merged]
    assert [op for op, _ in runs] == [op for op, _ in expected]
    assert runs == expected


# ---------------------------------------------------------------------------------------------- hostile tables


def small() -> Table:
    return build_schedule(tiny(), 3).table


def replace_instr(table: Table, index: int, **fields: int) -> Table:
    instrs = list(table.instrs)
    instrs[index] = dataclasses.replace(instrs[index], **fields)
    return Table(tuple(instrs), table.queues, table.num_counters)


def first_waiting(table: Table) -> int:
    return next(i for i, ins in enumerate(table.instrs) if ins.wait_counter != NO_COUNTER)


@pytest.mark.parametrize(("change", "words"), [
    (lambda t: replace_instr(t, first_waiting(t), wait_target=t.instrs[first_waiting(t)].wait_target + 1),
     "the target must be all of them"),
    (lambda t: replace_instr(t, first_waiting(t), wait_counter=t.num_counters), "past the"),
    (lambda t: replace_instr(t, 0, signal_counter=t.num_counters + 5), "signals counter"),
    (lambda t: replace_instr(t, 0, wait_counter=t.instrs[-1].signal_counter, wait_target=1), "not earlier in the table"),
    (lambda t: replace_instr(t, 0, first=-1), "does not fit a u32"),
    (lambda t: Table(t.instrs, (t.queues[0][1:],) + t.queues[1:], t.num_counters), "is in no queue"),
    (lambda t: Table(t.instrs, (t.queues[0][:1] + t.queues[0],) + t.queues[1:], t.num_counters), "queued twice"),
    (lambda t: Table(t.instrs, ((t.queues[0][1], t.queues[0][0]) + t.queues[0][2:],) + t.queues[1:], t.num_counters),
     "in table order"),
    (lambda t: Table(t.instrs, (), t.num_counters), "0 queues"),
    (lambda t: Table((), t.queues, t.num_counters), "0 instructions"),
])
def test_hostile_tables_are_refused_by_name(change, words: str) -> None:
    table = change(small())
    with pytest.raises(TableError, match=words):
        table.check()
    with pytest.raises(TableError, match=words):
        simulate(table)


def words_of(table: Table) -> list[int]:
    data = table.pack()
    return list(struct.unpack(f"<{len(data) // 4}I", data))


@pytest.mark.parametrize(("edit", "words"), [
    (lambda w: w.__setitem__(0, 0), "not the table magic"),
    (lambda w: w.__setitem__(1, 1), "version 1"),
    (lambda w: w.__setitem__(10, 16), "flags 0x10"),
    (lambda w: w.__setitem__(5, 9), "instructions of 9 words"),
    (lambda w: w.__setitem__(2, 1 << 30), "outside 1.."),
    (lambda w: w.__setitem__(3, 0), "outside 1.."),
    (lambda w: w.__setitem__(9, w[9] + 1), "not the packed layout"),
    (lambda w: w.__setitem__(12, 1), "reserved header words"),
    (lambda w: w.__setitem__(HEADER_WORDS + 1, 10_000), "queue offsets must rise"),
    (lambda w: w.__setitem__(w[8], 77), "unknown opcode 77"),
    (lambda w: w.__setitem__(w[8] + INSTR_WORDS * first_waiting(small()) + 5, 999), "the target must be all of them"),
])
def test_hostile_packed_tables_are_refused(edit, words: str) -> None:
    w = words_of(small())
    edit(w)
    with pytest.raises(TableError, match=words):
        unpack(struct.pack(f"<{len(w)}I", *w))


def test_short_and_ragged_buffers_are_refused() -> None:
    data = small().pack()
    with pytest.raises(TableError, match="whole u32 words"):
        unpack(data[:-1])
    with pytest.raises(TableError, match="shorter than the 16-word header"):
        unpack(data[:32])
    with pytest.raises(TableError, match="not the packed layout"):
        unpack(data + b"\0\0\0\0")


def test_a_header_claiming_a_huge_table_is_refused_without_allocating() -> None:
    w = words_of(small())
    w[2] = (1 << 20)  # the largest count allowed, but the sections do not match the buffer
    with pytest.raises(TableError, match="not the packed layout"):
        unpack(struct.pack(f"<{len(w)}I", *w))


@pytest.mark.parametrize(("attn", "op"), [("split", Op.ROPE), ("fused", Op.ATTN)])
def test_a_missing_wait_breaks_the_dataflow_check_though_nothing_deadlocks(attn: str, op: Op) -> None:
    sched = build_schedule(tiny(), 4, attn=attn)
    first = next(i for i, ins in enumerate(sched.table.instrs) if ins.op == op)
    table = replace_instr(sched.table, first, wait_counter=NO_COUNTER, wait_target=0)
    broken = dataclasses.replace(sched, table=table)
    assert simulate(table).finished
    with pytest.raises(DataflowError,
                       match=rf"instruction {first} \({op.name}\) may read qkv\[.*before instruction \d+ \(QKV\)"):
        check_dataflow(broken)


def test_the_cohort_excuses_only_its_own_pairs() -> None:
    """Two ATTN instructions of one ticket may touch the same K / V and attn_out unordered (the kernel orders
    them); checked like any other pair, the same table fails the data-flow check on exactly those pairs."""
    sched = build_schedule(tiny(), 4, attn="fused")
    assert check_dataflow(sched) > 0
    with pytest.raises(DataflowError, match=r"\(ATTN\) may (read|write) (kv\.0|attn_partials|attn_out)\[.*\(ATTN\)"):
        check_dataflow(sched, cohorts=False)


def test_a_huge_split_count_is_refused_in_bounded_memory() -> None:
    """One ATTN claiming 2^32 - 1 splits: refused by its splits' count, not by building a list that long."""
    import tracemalloc

    table = _attn_table()
    first = _first_attn(table)
    tracemalloc.start()
    try:
        with pytest.raises(TableError, match="shares ticket|its splits are"):
            replace_instr(table, first, count=2**32 - 1).check()
        assert tracemalloc.get_traced_memory()[1] < 16 << 20
    finally:
        tracemalloc.stop()


def _attn_table() -> Table:
    return build_schedule(tiny(), 3, splits=3, attn="fused").table


def _first_attn(table: Table) -> int:
    return next(i for i, ins in enumerate(table.instrs) if ins.op == Op.ATTN)


@pytest.mark.parametrize(("change", "words"), [
    (lambda t: replace_instr(t, _first_attn(t), arg=1), r"its splits are \[1, 1"),
    (lambda t: replace_instr(t, _first_attn(t), count=t.instrs[_first_attn(t)].count + 1),
     "shares ticket .* splits"),
    # the last counter as the signal: its tickets run past the counters
    (lambda t: replace_instr(t, _first_attn(t), signal_counter=t.num_counters - 1), "past the .* counters|signal"),
    # the ticket of kv head 0 made the ARGMAX's signal counter
    (lambda t: replace_instr(t, _first_attn(t), signal_counter=t.instrs[-1].signal_counter - 1),
     "also a signal or wait counter|target must be all"),
])
def test_bad_attn_tickets_are_refused_by_name(change, words: str) -> None:
    with pytest.raises(TableError, match=words):
        change(_attn_table()).check()


def test_one_queue_runs_the_table_in_order() -> None:
    sched = build_schedule(tiny(), 1)
    assert sched.table.queues == (tuple(range(len(sched.table.instrs))),)
    assert simulate(sched.table).order == tuple(range(len(sched.table.instrs)))
    assert check_dataflow(sched) > 0


def test_tile_rows_and_bad_arguments() -> None:
    assert tile_rows(4096, 132, 8) == 32 and tile_rows(151936, 132, 8) == 1152 and tile_rows(5, 132, 8) == 8
    for kwargs in ({"num_queues": 0}, {"num_queues": 2, "row_quantum": 0}, {"num_queues": 2, "splits": 0},
                   {"num_queues": 2, "ctx_tokens": 0}):
        with pytest.raises(ValueError, match="must be >= 1"):
            build_schedule(tiny(), **kwargs)
    with pytest.raises(ValueError, match="attn 'merged': one of fused, split"):
        build_schedule(tiny(), 2, attn="merged")


# ---------------------------------------------------------------------------------------------- the row split


def test_the_schedules_kernel_constants_are_the_kernels() -> None:
    """The step-count model and the split bit restate kernels-src/persistent_decode.cu's constants: read them there."""
    import re

    src = (Path(__file__).parents[2] / "kernels-src" / "persistent_decode.cu").read_text()

    def const(name: str) -> str:
        m = re.search(rf"constexpr (?:int|uint32_t) {name} = ([^;]+);", src)
        assert m, name
        return m.group(1).strip()

    assert (const("kStepChunks"), const("kBatchRows"), const("kArgRowSplit")) == (
        str(STEP_CHUNKS), str(BATCH_ROWS), f"{ARG_ROW_SPLIT}u")
    assert const("kSplitMaxRows") == "(kMaxGroup + 1) * kMaxHeadDim / PD_WARPS"
    assert (const("kMaxGroup"), const("kMaxHeadDim"), const("PD_THREADS")) == ("8", "256", "256")
    assert KSPLIT_MAX_ROWS == (8 + 1) * 256 // WARPS and WARPS == 256 // 32
    from kern_run.models.qwen3.persistent import isa

    flags = {"kFlagL2Prefetch": isa.FLAG_L2_PREFETCH, "kFlagFences": isa.FLAG_FENCES,
             "kFlagEvictFirst": isa.FLAG_EVICT_FIRST, "kFlagTableAhead": isa.FLAG_TABLE_AHEAD}
    assert {name: const(name) for name in flags} == {name: f"{v}u" for name, v in flags.items()}
    assert const("kKnownFlags") == " | ".join(flags) and isa.KNOWN_FLAGS == sum(flags.values())


@pytest.mark.parametrize(("name", "o_steps", "down_steps"), [
    ("Qwen3-1.7B", (4, 8), (12, 16)), ("Qwen3-4B", (16, 10), (38, 30)), ("Qwen3-8B", (16, 16), (48, 48))])
def test_the_row_split_goes_where_it_streams_fewer_steps(name: str, o_steps, down_steps) -> None:
    """auto: O_PROJ / DOWN split their rows (arg 1, 1-row tiles) only where a warp streams strictly fewer ring steps:
    both at 4B, neither at 1.7B and 8B (where the twenty-sixth session measured the split slower: 1.740 -> 1.929
    and 4.998 -> 5.223 ms). always / never override it; the weights streamed are the same bytes either way."""
    cfg = config(name)
    q_dim = cfg.q_heads * cfg.head_dim
    assert row_split_steps(cfg.hidden, q_dim, 132, 8) == o_steps
    assert row_split_steps(cfg.hidden, cfg.intermediate, 132, 8) == down_steps
    for mode in ("auto", "always", "never"):
        sched = build_schedule(cfg, 132, row_split=mode)
        for op, (whole, split) in ((Op.O_PROJ, o_steps), (Op.DOWN, down_steps)):
            tiles_of = [i for i in sched.table.instrs if i.op == op and i.layer == 0]
            on = mode == "always" or (mode == "auto" and split < whole)
            assert {i.arg for i in tiles_of} == {ARG_ROW_SPLIT if on else 0}, (mode, op)
            assert tiles_of[0].count == tile_rows(cfg.hidden, 132, 1 if on else 8), (mode, op)
            assert sum(i.count for i in tiles_of) == cfg.hidden
        assert check_dataflow(sched) > 0 and simulate(sched.table).finished


def test_the_row_split_is_refused_where_the_kernel_cannot_split() -> None:
    """k not a multiple of 64 (the tiny shape's DOWN, k 96): no split even when asked; a tile past KSPLIT_MAX_ROWS
    (one queue for 2048 rows): none either."""
    assert row_split_steps(64, 96, 3, 8)[1] is None
    assert row_split_steps(2048, 6144, 1, 8)[1] is None
    down = [i for i in build_schedule(tiny(), 3, row_split="always").table.instrs if i.op == Op.DOWN]
    assert {i.arg for i in down} == {0}
    with pytest.raises(ValueError, match="row_split 'sometimes': one of auto, always, never"):
        build_schedule(tiny(), 3, row_split="sometimes")


def test_an_o_proj_arg_other_than_the_split_bit_is_refused() -> None:
    table = build_schedule(tiny(), 3).table
    o = next(i for i, ins in enumerate(table.instrs) if ins.op == Op.O_PROJ)
    with pytest.raises(TableError, match=r"arg 2; O_PROJ / DOWN take 0 \(whole rows\) or 1 \(the row split\)"):
        replace_instr(table, o, arg=2).check()
