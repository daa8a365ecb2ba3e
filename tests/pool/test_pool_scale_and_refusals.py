"""The pool at scale and the simulator's refusals: an explicit capacity past `free_bytes` is ExceedsPool naming
both, and so is a pool this process cannot allocate (not a bare MemoryError); a pool of 1e9 tokens is set up
without an entry per block (the implicit initial mapping equals the eager one, remaps included); a trace over
4 GiB, a truncated JSON line, a 5000-digit number, an out-of-range option and a bad or missing timestamp are one
line each naming what is wrong; the handle and pool classes document every public member; docs/pool.md's page
count at other page sizes is the code's. (From a fresh user's report of 2026-12-03.)"""

from __future__ import annotations

import errno
import json
import random
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest

import kern_pool
from kern_pool import Capacity, ExceedsPool, Host, Layout, Misuse, Pool, PooledState
from kern_pool.cli import main
from kern_pool.simulate import QWEN3_4B_BYTES_PER_TOKEN, read_trace
from kern_pool.sizing import GIB, MAX_IDS, MIB

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "pool.md"
TRACES = ROOT.parent / "shared" / "traces"
GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}\n'


def qwen3_kv(page_tokens: int = 512) -> list[PooledState]:
    return [PooledState("kv", bytes_per_token=QWEN3_4B_BYTES_PER_TOKEN, page_tokens=page_tokens)]


def _stderr_of(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one-line refusal, exit 2 (argparse's own refusals too: no usage lines before them)."""
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own refusal of an option
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    return err


# ---------------------------------------------------------------- 1. capacity past free_bytes, pools too large


def test_explicit_tokens_past_free_bytes_are_exceeds_pool_naming_both() -> None:
    with pytest.raises(ExceedsPool) as info:
        Layout.from_capacity(qwen3_kv(), Capacity(tokens=10**12, seqs=8), free_bytes=40 * GIB)
    assert str(info.value) == ("Capacity(tokens=1000000000000, seqs=8) needs 147456000075497472 bytes (3906250002 "
                               "blocks of 37748736 B); free_bytes says the device has 42949672960 bytes free")
    asked = Capacity(tokens=200_000, seqs=8)  # 27.5 GiB of KV
    fits = Layout.from_capacity(qwen3_kv(), asked, free_bytes=40 * GIB)
    assert fits == Layout.from_capacity(qwen3_kv(), asked)  # free_bytes only bounds it
    need = fits.num_blocks * fits.block_bytes
    assert need == 29_519_511_552
    assert Layout.from_capacity(qwen3_kv(), asked, free_bytes=need) == fits
    with pytest.raises(ExceedsPool, match=f"needs {need} bytes .* has {need - 1} bytes free"):
        Layout.from_capacity(qwen3_kv(), asked, free_bytes=need - 1)


def test_more_pages_or_slots_than_int32_ids_are_refused() -> None:
    tiny = [PooledState("kv", bytes_per_token=1, page_tokens=1)]
    with pytest.raises(ExceedsPool, match=f"Capacity\\(tokens={MAX_IDS}, seqs=0\\) needs {MAX_IDS + 1} pages "
                                          f"\\(scratch included\\): ids are int32 on the device, at most {MAX_IDS}"):
        Layout.from_capacity(tiny, Capacity(tokens=MAX_IDS, seqs=0))
    rec = [PooledState("rec", bytes_per_seq=1)]
    with pytest.raises(ExceedsPool, match=f"needs {MAX_IDS + 1} slots"):
        Layout.from_capacity(rec, Capacity(tokens=0, seqs=MAX_IDS - 1))
    # one page short of the cap is sized, and rounding up to whole blocks stops at the cap
    edge = Layout.from_capacity(tiny, Capacity(tokens=MAX_IDS - 1, seqs=0))
    assert edge.initial_pages == MAX_IDS and edge.num_blocks * edge.block_bytes >= MAX_IDS
    with pytest.raises(Misuse, match=f"Layout initial_pages {MAX_IDS + 1}: ids are int32 on the device"):
        Layout(page_tokens=1, page_bytes=(1,), slot_bytes=(), block_bytes=MIB, num_blocks=2 * 2**31 // MIB,
               initial_pages=MAX_IDS + 1, initial_slots=0)


def test_a_pool_this_process_cannot_allocate_is_exceeds_pool_not_memory_error() -> None:
    """1e12 tokens at 512-token pages is 1.95e9 pages: within the int32 ids, but 15.6 GB of refcounts. Under a 1 GiB
    address-space limit `Pool()` raised a bare MemoryError (it built every block's entry first)."""
    code = textwrap.dedent("""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))
        from kern_pool import Capacity, ExceedsPool, Layout, Pool, PooledState
        layout = Layout.from_capacity([PooledState("kv", bytes_per_token=147456, page_tokens=512)],
                                      Capacity(tokens=10**12, seqs=8))
        try:
            Pool(layout)
        except ExceedsPool as e:
            print(e)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == ("Pool: 1953125001 pages + 0 slots need 15625000008 bytes of host memory for their "
                           "refcounts, more than this process can allocate\n")


# ---------------------------------------------------------------- 3. setup cost proportional to use


def test_a_pool_of_1e9_tokens_is_set_up_without_an_entry_per_block() -> None:
    """--capacity 1e9 --page-tokens 239: 4,184,100 pages over 8,789,064 blocks took 20 s and 2 GB; what is left is
    one refcount per page id (8 bytes: 33.5 MB)."""
    layout = Layout.from_capacity(qwen3_kv(239), Capacity(tokens=10**9, seqs=1))
    assert (layout.initial_pages, layout.num_blocks) == (4_184_101, 8_789_064)
    tracemalloc.start()
    try:
        pool = Pool(layout)
        host = Host(pool, 4_184_100)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * layout.initial_pages + 4 * MIB  # was about 2 GB
    assert (pool.free_pages, pool.leasable_pages, host.free_pages) == (4_184_100, 4_184_100, 4_184_100)
    lease = pool.lease(239 * 3 + 1)
    assert lease.page_ids() == [1, 2, 3, 4]
    lease.close()
    assert pool.free_pages == 4_184_100 and pool.lease(1).page_ids() == [1]


def _eager_mapping(layout: Layout) -> list[tuple[int, int, int]]:
    """The initial mapping as the eager code built it: each state in turn, objects in order, blocks popped 0, 1, ..."""
    out, next_phys = [], 0
    objects = [(b, layout.initial_pages) for b in layout.page_bytes] + [(b, layout.initial_slots)
                                                                        for b in layout.slot_bytes]
    for state, (size, count) in enumerate(objects):
        blocks = -(-count * size // layout.block_bytes)
        out += [(state, b, next_phys + b) for b in range(blocks)]
        next_phys += blocks
    return out


@pytest.mark.parametrize("layout", [
    Layout.simple(16, 7, 3),
    Layout.simple(16, 5, 0, blocks_per_page=3),
    Layout(page_tokens=4, page_bytes=(3 * MIB, 5 * MIB), slot_bytes=(3 * MIB,), block_bytes=2 * MIB, num_blocks=60,
           initial_pages=6, initial_slots=4),
    Layout.from_capacity([PooledState("a", bytes_per_token=3 * MIB, page_tokens=1),
                          PooledState("r", bytes_per_seq=7 * MIB)], Capacity(tokens=9, seqs=3),
                         granularity_bytes=2 * MIB, cap_bytes=2 * MIB),
])
def test_the_implicit_initial_mapping_is_the_eager_one_and_survives_remaps(layout: Layout) -> None:
    pool = Pool(layout)
    assert [(m.state_index, m.block_index, m.physical_block_id) for m in pool.mapping()] == _eager_mapping(layout)
    pool.check()
    # lease until refused, landing every remap (blocks move between pages and slots), then the other way round
    for take in (lambda: pool.lease(layout.page_tokens), pool.lease_slot if layout.has_slots else None):
        if take is None:
            continue
        leases = []
        while True:
            try:
                leases.append(take())
            except kern_pool.Remapping as r:
                pool.check()
                pool.land(r.plan)
            except (kern_pool.Busy, ExceedsPool):
                break
            pool.check()
        assert leases
        for lease in leases:
            lease.close()
        pool.check()


def test_id_stack_pops_as_the_list_it_stands_for() -> None:
    from kern_pool.blocks import IdStack  # the free stacks: a run of never-used ids below a pushed list

    rng = random.Random(7)
    for _ in range(200):
        lo, hi = rng.randrange(0, 5), rng.randrange(0, 40)
        stack, model = IdStack(lo, hi), list(range(hi - 1, lo - 1, -1))
        pushed = max(hi, lo) + 100
        for _ in range(60):
            op = rng.randrange(4)
            if op == 0 and model:
                assert stack.pop() == model.pop()
            elif op == 1:
                stack.append(pushed)
                model.append(pushed)
                pushed += 1
            elif op == 2 and model:
                n = rng.randrange(len(model) + 1)
                assert stack.pop_many(n) == [model.pop() for _ in range(n)]
            elif op == 3 and model:
                gone = set(rng.sample(sorted(set(model)), rng.randrange(min(4, len(model)) + 1)))
                if rng.random() < 0.5:  # the highest ids, as a remap takes them
                    gone = set(sorted(model, reverse=True)[:rng.randrange(len(model) + 1)])
                stack.discard(gone)
                model = [o for o in model if o not in gone]
            assert list(stack) == model and len(stack) == len(model)


def test_simulate_at_1e9_tokens_sets_up_quickly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(GOOD * 3)
    tracemalloc.start()
    try:
        assert main(["simulate", str(trace), "--capacity", "1e9", "--page-tokens", "239", "--json"]) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert json.loads(capsys.readouterr().out)["pool_pages"] == 4_184_100
    assert peak < 64 * MIB  # was about 2 GB


# ---------------------------------------------------------------- 2, 4-7. the CLI's refusals


def test_a_trace_over_4_gib_is_refused_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "huge.jsonl"
    with trace.open("wb") as f:
        f.truncate(5 * 2**30)  # sparse: no disk used
    assert _stderr_of(capsys, ["simulate", str(trace)]) == (
        f"kern-pool: [Errno {errno.EFBIG}] too large (5368709120 bytes; at most 4294967296 are read): "
        f"{str(trace)!r}\n")
    with pytest.raises(OSError) as info:
        read_trace(trace)
    assert (info.value.errno, info.value.filename) == (errno.EFBIG, str(trace))


@pytest.mark.parametrize("option, message", [
    (["--host-tokens", "1e30"], "argument --host-tokens: host tokens must be a whole number in [0, 1e+09] tokens, "
                                "got 1e30"),
    (["--limit", "99999999999999999999"], "argument --limit: limit must be a whole number in [1, 1e+09] requests, "
                                          "got 99999999999999999999"),
    (["--page-tokens", "99999999999"], "argument --page-tokens: page tokens must be a whole number in [1, 1e+09] "
                                       "tokens, got 99999999999"),
    (["--limit", "0"], "argument --limit: limit must be a whole number in [1, 1e+09] requests, got 0"),
    (["--host-tokens", "-1"], "argument --host-tokens: host tokens must be a whole number in [0, 1e+09] tokens, "
                              "got -1"),
])
def test_option_ranges_are_stated(tmp_path: Path, capsys: pytest.CaptureFixture[str], option: list[str],
                                  message: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(GOOD)
    assert _stderr_of(capsys, ["simulate", str(trace), *option]) == f"kern-pool simulate: error: {message}\n"
    for edge in (["--host-tokens", "1e9"], ["--limit", "1e9"]):  # the bounds themselves are accepted
        assert main(["simulate", str(trace), *edge, "--json"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("line, message", [
    # a file cut off in the middle of a string (no newline at its end)
    ('{"timestamp": 0, "input_length": 600, "x": "ab', "not JSON (Unterminated string starting at column 44)"),
    ('{"timestamp": 0, "input_length": 600, "x": "ab\n', "not JSON (Invalid control character at column 47)"),
    ('{"timestamp": 0, "input_length": 600,\n', "not JSON (Expecting property name enclosed in double quotes at "
                                              "column 39)"),
    ('{"timestamp": 0 "input_length": 600}\n', "not JSON (Expecting ',' delimiter at column 17)"),
])
def test_json_errors_read_as_english(tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str,
                                     message: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(GOOD + line)
    assert _stderr_of(capsys, ["simulate", str(trace)]) == f"kern-pool: {trace}:2: {message}\n"


@pytest.mark.parametrize("timestamp, shown", [
    ('"x"', "'x'"), ("-7", "-7"), ("-0.5", "-0.5"), ("NaN", "nan"), ("Infinity", "inf"), ("null", "None"),
    ("true", "True"), ("[0]", "[0]"),
])
def test_a_bad_timestamp_is_refused_with_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  timestamp: str, shown: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(GOOD + f'{{"timestamp": {timestamp}, "input_length": 600, "hash_ids": [1, 2]}}\n')
    assert _stderr_of(capsys, ["simulate", str(trace)]) == (
        f"kern-pool: {trace}:2: timestamp must be a finite number >= 0 (ms), got {shown}\n")


def test_a_missing_timestamp_is_refused_and_good_ones_accepted(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(GOOD + '{"input_length": 600, "hash_ids": [1, 2]}\n')
    assert _stderr_of(capsys, ["simulate", str(trace)]) == (
        f"kern-pool: {trace}:2: missing field 'timestamp' (the arrival time in ms, a number >= 0)\n")
    trace.write_text(GOOD + '{"timestamp": 12.5, "input_length": 600, "hash_ids": [1, 2]}\n'
                     '{"timestamp": 0, "input_length": 512, "hash_ids": [7]}\n')
    assert len(read_trace(trace)) == 3


def test_every_record_of_the_real_traces_has_a_timestamp_and_loads() -> None:
    for name, count in (("mooncake_conversation_trace.jsonl", 12031), ("mooncake_synthetic_trace.jsonl", 3993)):
        path = TRACES / name
        if not path.is_file():
            pytest.fail(f"trace {path} missing: CI must provide ../shared/traces next to the repository")
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        assert len(records) == count
        assert all(type(r["timestamp"]) is int and r["timestamp"] >= 0 for r in records)
        assert len(read_trace(path)) == count


# ---------------------------------------------------------------- 8. docstrings


@pytest.mark.parametrize("cls, names", [
    (kern_pool.Pool, ["free_pages", "free_slots", "remap_in_flight"]),
    (kern_pool.Lease, ["closed", "num_pages", "frozen_tokens"]),
    (kern_pool.Checkpoint, ["closed", "has_slot", "num_pages"]),
    (kern_pool.Layout, ["paged", "has_slots"]),
    (kern_pool.Parked, ["close", "host_page_ids", "has_slot", "closed"]),
    (kern_pool.Waking, ["close", "landed"]),
])
def test_the_reported_members_have_docstrings(cls: type, names: list[str]) -> None:
    for name in names:
        member = vars(cls)[name]
        doc = (member.fget if isinstance(member, property) else member).__doc__
        assert doc and doc.strip(), f"{cls.__name__}.{name} has no docstring"


def test_every_public_member_of_the_handle_and_pool_classes_has_a_docstring() -> None:
    missing = []
    for cls in (kern_pool.Pool, kern_pool.Lease, kern_pool.Checkpoint, kern_pool.Layout, kern_pool.Parked,
                kern_pool.Waking, kern_pool.Room, kern_pool.Host, kern_pool.Hit, kern_pool.PooledState):
        for name, member in vars(cls).items():
            if name.startswith("_"):
                continue
            func = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
            if (isinstance(member, property) or callable(func)) and not (func.__doc__ or "").strip():
                missing.append(f"{cls.__name__}.{name}")
    assert missing == []


# ---------------------------------------------------------------- 9-10. docs/pool.md


def test_the_page_count_at_other_page_sizes_is_the_one_the_doc_states() -> None:
    layout = Layout.from_capacity(qwen3_kv(16), Capacity(tokens=3 * 10**6, seqs=1))
    assert layout.initial_pages - 1 == 187_504
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    assert "`--capacity 3e6 --page-tokens 16` gives 187,504 pages, not 187,500" in text


@pytest.mark.parametrize("argv, message", [
    (["simulate", "T", "--capacity", "1.5"], "kern-pool simulate: error: argument --capacity: capacity must be a "
                                             "whole number of tokens, got 1.5"),
    (["simulate"], "kern-pool simulate: error: the following arguments are required: trace"),
    (["simulate", "T", "--bogus"], "kern-pool: error: unrecognized arguments: --bogus"),
    ([], "kern-pool: error: the following arguments are required: command"),
])
def test_argparse_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                        message: str) -> None:
    """docs/pool.md: refused "with one line ... and exit 2"; argparse used to print its usage lines first."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(GOOD)
    argv = [str(trace) if a == "T" else a for a in argv]
    assert _stderr_of(capsys, argv) == message + "\n"
