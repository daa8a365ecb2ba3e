"""The sampler's phase profile (kernels-src/sample.cu -DSAMPLE_PROFILE, tools/sample_profile.py, bench/sample_phases.py)
on the CPU: the stamp layout parsed and tabulated from synthetic stamps (exact values), malformed stamps refused, the
event ids and slot count shared with the source, and on the CPU emulator the profile build giving the same tokens,
logprobs, stats and penalized logits bit for bit as the normal one, with one well-formed log per block."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from kern_run.sampling import SamplingParams

from tools import sample_cpu_emu
from tools import sample_profile as sp

SRC = (Path(__file__).resolve().parents[2] / "kernels-src" / "sample.cu").read_text()


def block(ids: list[int], clocks: list[int], start_ns: int, end_ns: int, merged: bool = False, smid: int = 0):
    """One block's SLOTS uint64 as sample.cu writes them."""
    s = np.zeros(sp.SLOTS, np.uint64)
    s[0], s[1] = start_ns, end_ns
    s[2] = smid | (int(merged) << 32) | (len(ids) << 40)
    for i, (ev, c) in enumerate(zip(ids, clocks)):
        s[3 + i] = (ev << 56) | c
    return s


# 2 GHz clocks: 2000 cycles per us. Non-merging: start, penalties, reduce, export round, export write, ticket
OTHER = [0, 1, 2, 4, 5, 6]
# the merging block of a candidates row: ... ticket, headers, gather, count, top-p sums, 2 top-p rounds, draw, done
MERGE = OTHER + [7, 8, 9, 12, 11, 11, 13, 14]


def synthetic(scale: int = 1) -> np.ndarray:
    """One launch, 2 rows x 3 slices; slice 2 merges row 0, slice 0 row 1 (by the exact path: 2 passes of top-p)."""
    st = np.zeros((1, 2, 3, sp.SLOTS), np.uint64)
    other = [1000, 1000, 3000, 5000, 7000, 9000]  # penalties 0, reduce 1 us, export round 1, write 1, ticket 1
    for r, s in ((0, 0), (0, 1), (1, 1), (1, 2)):
        st[0, r, s] = block(OTHER, [c + 100 * s for c in other], 10_000 + 100 * s, 14_000 + 100 * s, smid=s)
    merge = other + [11000, 13000, 15000, 17000, 19000 + 2000 * scale, 21000 + 4000 * scale, 23000 + 4000 * scale,
                     24000 + 4000 * scale]
    st[0, 0, 2] = block(MERGE, merge, 10_500, 10_500 + (merge[-1] - 1000) // 2, merged=True, smid=7)
    ids = OTHER + [7, 8, 9, 12, 15, 16, 11, 11, 17, 13, 14]
    clocks = other + [11000, 13000, 15000, 17000, 18000, 30000, 40000, 50000, 60000, 62000, 62200]
    st[0, 1, 0] = block(ids, clocks, 9_000, 9_000 + (62200 - 1000) // 2, merged=True, smid=3)
    return st


def test_phase_labels() -> None:
    assert sp.phase_labels(MERGE) == ["penalties", "load + reduce", "export round 1", "export write", "ticket",
                                      "merge headers", "candidate gather", "candidate count", "top-p sums",
                                      "top-p round 1", "top-p round 2", "draw", "write"]
    assert sp.phase_labels([0, 2, 6, 7, 11, 15, 10, 10, 11, 16, 17, 13, 14]) == [
        "load + reduce", "ticket", "merge headers", "top-p round 1", "to exact path", "exact top-k round 1",
        "exact top-k round 2", "exact top-p round 1", "exact mass pass", "exact kept pass", "exact draw", "exact write"]
    with pytest.raises(sp.StampError, match="event id 99"):
        sp.phase_labels([0, 99])


def test_parse_and_summarize_synthetic() -> None:
    launches = sp.parse(synthetic())
    assert len(launches) == 1 and len(launches[0]) == 6
    b = launches[0][2]  # row 0 slice 2: the merging block
    assert (b.row, b.slice, b.merged, b.smid, b.path) == (0, 2, True, 7, "candidates")
    assert b.phases[:2] == (("penalties", 0), ("load + reduce", 2000)) and b.cycles == 27000
    assert launches[0][3].path == "exact" and launches[0][0].path == "-"
    assert sp.cycles_per_ns(launches, fallback=1.5) == 2.0  # every block is 2 cycles per ns
    s = sp.summarize(launches, 2.0)
    by = {p.label: p for p in s.phases}
    assert (by["load + reduce"].merge_med, by["load + reduce"].other_max) == (1.0, 1.0)
    assert by["top-p round 2"] == sp.PhaseRow("top-p round 2", 2.0, 2.0, None, None)
    assert by["exact top-p round 1"] == sp.PhaseRow("exact top-p round 1", 5.0, 5.0, None, None)
    assert by["top-p round 1"] == sp.PhaseRow("top-p round 1", 2.0, 2.0, None, None)  # row 0 only
    assert by["total"] == sp.PhaseRow("total", (13.5 + 30.6) / 2, 30.6, 4.0, 4.0)
    labels = [p.label for p in s.phases]
    assert labels.index("top-p round 2") < labels.index("draw") < labels.index("to exact path")
    assert labels[-1] == "total"
    assert (s.rows, s.slices, s.sms, s.paths) == (2, 3, 5, {"candidates": 1, "exact": 1})
    assert s.span_us == (9_000 + 30_600 - 9_000) / 1000  # the exact row's merging block ends last
    assert s.last_start_us == (10_500 - 9_000) / 1000
    assert s.max_resident == 6
    # merges begin at the merging blocks' tickets: row 0 at 10.5 + 4.0 us, row 1 at 9.0 + 4.0 (from 9.0)
    assert (s.merge_begin_med_us, s.merge_begin_max_us) == (((5.5 + 4.0) / 2), 5.5)
    text = sp.format_case("sample rows=2 test", s, normal_us=40.0, profiled_us=42.0)
    lines = text.splitlines()
    assert lines[0] == ("sample rows=2 test [candidates x1, exact x1]: 2 rows x 3 blocks, clock 2.000 GHz; wall 40.00 "
                        "us normal, 42.00 us profiled (+5.0%)")
    assert lines[1] == ("  timeline (median of 1 launches): span 30.60 us, last block starts at +1.50, at most 6 "
                        "blocks resident on 5 SMs; merges begin at +4.75 (median row), +5.50 (last row)")
    assert lines[3] == "  penalties                          0.00       0.00       0.00       0.00"
    assert "  top-p round 2                      2.00       2.00          -          -" in lines
    assert lines[-1] == "  total                             22.05      30.60       4.00       4.00"


def test_medians_over_launches() -> None:
    st = np.concatenate([synthetic(1), synthetic(2), synthetic(6)])  # row 0's top-p round 2: 2, 3, 7 us
    s = sp.summarize(sp.parse(st), 2.0)
    assert {p.label: p for p in s.phases}["top-p round 2"].merge_med == 3.0 and s.launches == 3


def test_malformed_stamps() -> None:
    with pytest.raises(sp.StampError, match="expected uint64"):
        sp.parse(synthetic().astype(np.int64))
    with pytest.raises(sp.StampError, match="expected uint64"):
        sp.parse(synthetic()[0])
    st = synthetic()
    st[0, 1, 1, 1] = 0  # unfinished
    with pytest.raises(sp.StampError, match=r"block \(slice 1, row 1\) has no finished log"):
        sp.parse(st)
    st = synthetic()
    st[0, 1, 2, 2] |= np.uint64(1 << 32)  # a second merging block in row 1
    with pytest.raises(sp.StampError, match="row 1: 2 merging blocks"):
        sp.parse(st)
    st = synthetic()
    st[0, 0, 0, 3] = np.uint64(2 << 56)
    with pytest.raises(sp.StampError, match="first event id 2"):
        sp.parse(st)


def test_layout_is_the_sources() -> None:
    assert int(re.search(r"#define SAMPLE_PROF_SLOTS (\d+)", SRC).group(1)) == sp.SLOTS
    assert int(re.search(r"#define SAMPLE_PROF_EVENTS (\d+)", SRC).group(1)) == sp.MAX_EVENTS
    ids = {int(v): k for k, v in re.findall(r"#define (SP_\w+) (\d+)", SRC)}
    assert sorted(ids) == sorted(sp.EVENTS)
    assert (ids[sp.SP_START], ids[sp.SP_TICKET], ids[sp.SP_GATHER], ids[sp.SP_DRAW], ids[sp.SP_EXACT]) == (
        "SP_START", "SP_TICKET", "SP_GATHER", "SP_DRAW", "SP_EXACT")
    # the normal build has none of it: every profile-only line is under #ifdef SAMPLE_PROFILE
    assert "SAMPLE_PROF_ARG" in SRC and re.search(r"#else\n#define SAMPLE_PROF_ARG\n#define SAMPLE_PROF_PASS\n"
                                                 r"#define SAMPLE_STAMP\(ev\)\n#endif", SRC)


# 3 slices (the last 3617 long), a flat-ish row: greedy, plain, a top-k 50 (candidates), top-p 0.95 (exact: the
# nucleus is wider than the 3 x 2730 candidates), penalties with top-p 0.9
EMU_PARAMS = [SamplingParams(), SamplingParams(temperature=1.0, seed=3),
              SamplingParams(temperature=1.0, top_k=50, seed=4), SamplingParams(temperature=1.0, top_p=0.95, seed=5),
              SamplingParams(temperature=0.8, top_p=0.9, repetition_penalty=1.2, seed=6)]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
def test_profile_build_on_the_cpu_emulator() -> None:
    case = sample_cpu_emu.Case("bf16", 20001, 0.3, EMU_PARAMS)
    logits, positions, hist = sample_cpu_emu.case_inputs(np.random.default_rng(7), case)
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        plain, prof = Path(a), Path(b)
        exe, exe_prof = sample_cpu_emu.build(plain), sample_cpu_emu.build(prof, profile=True)
        out, tickets, paths, _ = sample_cpu_emu.run_case(exe, plain, "bf16", logits, EMU_PARAMS, positions, hist, 64,
                                                         0)
        out_p, tickets_p, paths_p, _ = sample_cpu_emu.run_case(exe_prof, prof, "bf16", logits, EMU_PARAMS, positions,
                                                               hist, 64, sample_cpu_emu.SHUFFLED_ORDER)
        stamps = sample_cpu_emu.read_stamps(prof, len(EMU_PARAMS), case.vocab)
    for x, y in zip(out, out_p):  # tokens, logprobs, stats, penalized logits, top-5 ids and logprobs
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()
    assert tickets.tolist() == tickets_p.tolist() == [0] * 5
    assert paths.tolist() == paths_p.tolist() == [0, 1, 2, 3, 3]
    (blocks,) = sp.parse(stamps[None])
    assert [b.path for b in blocks if b.merged] == ["greedy", "plain", "candidates", "exact", "exact"]
    # after the ticket, by row (the shuffled order picks which slice merges; before it, the slice's own phases)
    names = {b.row: [n for n, _ in b.phases] for b in blocks if b.merged}
    merge = {r: n[n.index("ticket") + 1 :] for r, n in names.items()}
    assert merge[0] == ["merge headers", "write"]
    assert merge[1] == ["merge headers", "draw", "write"]
    assert merge[2] == ["merge headers", "candidate gather", "candidate count", "top-k round 1", "top-k round 2",
                        "top-k round 3", "draw", "write"]
    for r in (3, 4):  # the nucleus is wider than the candidates; 5 radix rounds (2^16, 2^24, 2^16, 2^8, 1 keys),
        # the first over the mass phase's bins; one block at a time: the merge runs every slice task of each phase
        rounds = [x for i in range(2, 6) for x in (f"exact slice tasks {i}", f"exact phase wait {i - 1}",
                                                   f"exact top-p round {i}")]
        assert merge[r] == ["merge headers", "candidate gather", "candidate count", "top-p sums", "to exact path",
                            "exact slice tasks 1", "exact mass pass", "exact top-p round 1", *rounds,
                            "exact slice tasks 6", "exact kept pass", "exact draw", "exact write"]
    for b in blocks:  # before the ticket: every block's own phases
        names = [n for n, _ in b.phases]
        pre = names[: names.index("ticket")]
        assert pre[:2] == ["penalties", "load + reduce"] and (pre[2:] == [] if b.row < 2 else pre[-1] == "export write")
        assert pre[2:3] == (["export top-k bound"] if b.row == 2 else ["export round 1"] if b.row > 2 else [])
        assert b.merged or names[-1] == "ticket"


def test_profile_build_abi(monkeypatch: pytest.MonkeyPatch) -> None:
    """nvcc -DSAMPLE_PROFILE (bench/sample_phases.py's build): both sampler entries take the committed parameters
    plus one trailing pointer, the layout bench/sample_phases.profile_params stages (needs nvcc and cuobjdump)."""
    from tools import build_kernels
    from tools.kernel_abi import parse_kparam_info

    try:
        tc = build_kernels.find_toolchain()
    except build_kernels.BuildError as exc:
        pytest.skip(str(exc))
    bench = pytest.importorskip("bench.sample_phases")  # cuda.bindings
    committed = json.loads((Path(__file__).resolve().parents[2] / "kernels" / "kernels.json").read_text())
    entries = committed["modules"]["sample"]["entries"]
    with tempfile.TemporaryDirectory() as tmp:
        monkeypatch.setenv("NVCC", tc.nvcc)
        cubin = bench.compile_profile(Path(tmp))
        params = parse_kparam_info(subprocess.run([tc.cuobjdump, "-elf", str(cubin)], capture_output=True, text=True,
                                                  check=True).stdout)
    for entry in ("kern_sample_bf16", "kern_sample_f32"):
        assert params[entry] == bench.profile_params(entries[entry]["params"]) == entries[entry]["params"] + [[80, 8]]
