"""Run kern_attn_decode_partial_stream and kern_attn_decode_partial_gqa (kernels-src/attention_decode.cu), each with
kern_attn_decode_reduce, on the CPU (no
GPU) and check them against tools/reference_kernels.py with the checks of tests/kernels/test_decode_attention_gpu.py.

The sources are compiled with g++ against tools/cpu_emu/ (common.cuh and attn_emu.h: a block as std::threads, real
barriers, warp shuffles, ldmatrix and mma.sync through a per-warp exchange following the PTX fragment layouts,
cp.async landing only at the group wait that requires it; stream_copy.cuh for the entry's own PTX; prefill.cuh with
its PTX wrappers taken out). First kern_attn_prefill runs through the same stand-ins against the prefill reference:
its GPU results are tested, so a pass there says the emulated fragment layouts are the hardware's. Then each case's
rows: the partials of every used split against the reference, splits past the context left unwritten, the output;
bit for bit equalities the GPU tests also check (a row alone and inside a batch; slot_mapping naming a row of the
first tiles or -1). A logic check of the CUDA source where no GPU is at hand, not a substitute for the GPU tests (no
memory model, no real warps or timing; sums in the emulated mma run in another order than the tensor cores').

    uv run --frozen python -m tools.decode_attention_cpu_emu [--quick] [--entry stream|gqa]   # needs g++ (C++20)

Exit 0 when every case passes, 1 otherwise (the failures are printed), 2 without g++.
"""

from __future__ import annotations

import argparse
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from tools import reference_kernels as ref

REPO = Path(__file__).resolve().parent.parent
EMU = REPO / "tools" / "cpu_emu"
SRC = REPO / "kernels-src"
# the prefill.cuh functions that are inline PTX: attn_emu.h defines them instead
PTX_WRAPPERS = ("mma_bf16_16816", "ldsm_x4", "ldsm_x4_trans", "pf_ex2")
# the decode partials the driver runs (fused: kern_attn_decode_gqa_fused, the partial and the reduce in one
# launch, whose output must also be gqa + reduce's bits): driver mode -> threads per block
ENTRIES = {"stream": 64, "gqa": 32, "fused": 32}
R32_MARKER = "// Prefill with two m-tiles per warp"


def _strip_function(text: str, name: str) -> str:
    """`text` without the definition of KERN_DEV function `name` (from its signature to the `}` closing it at the
    start of a line). Raises ValueError when there is none."""
    match = re.search(rf"^KERN_DEV [\w:]+ {name}\(", text, re.M)
    if match is None:
        raise ValueError(f"no definition of {name}")
    end = text.index("\n}\n", match.start()) + 3
    return text[:match.start()] + text[end:]


def build(work: Path) -> Path:
    """The driver binary, compiled in `work` from copies of the sources and the stand-ins."""
    for name in ("cuda_bf16.h", "math_constants.h", "attn_emu.h", "stream_copy.cuh", "attn_driver.cpp"):
        shutil.copy(EMU / name, work / name)
    (work / "common.cuh").write_text((EMU / "common.cuh").read_text() + '\n#include "attn_emu.h"\n')
    prefill = (SRC / "prefill.cuh").read_text()
    for name in PTX_WRAPPERS:
        prefill = _strip_function(prefill, name)
    (work / "prefill.cuh").write_text(prefill)
    attention = (SRC / "attention.cu").read_text()
    cut = attention.index(R32_MARKER)
    attention = attention[:attention.rindex("// ----", 0, cut)]  # up to the r32 prefill (dynamic shared memory)
    (work / "attention.cu").write_text(attention)
    shutil.copy(SRC / "attention_decode.cu", work / "attention_decode.cu")
    exe = work / "driver"
    cmd = ["g++", "-std=c++20", "-O2", "-pthread", "-w", "-I", str(work), str(work / "attn_driver.cpp"), "-o", str(exe)]
    subprocess.run(cmd, check=True, cwd=work)
    return exe


def _params(*words) -> bytes:
    return b"".join(struct.pack("<f", w) if isinstance(w, float) else struct.pack("<i", int(w)) for w in words)


def make_rows(rng, hq, hkv, head_dim, page_tokens, seq_lens, bound=None):
    """The inputs of tests/kernels/test_decode_attention_gpu.py's Rows, on the host."""
    from tests.kernels.test_kernels_gpu import bound_pages, make_paged_cache, rand_bf16

    seq_lens = np.asarray(seq_lens, dtype=np.int32)
    cache, table = make_paged_cache(rng, page_tokens, hkv, head_dim, seq_lens, spare_pages=3, spare_cols=2)
    num_pages, table = bound_pages(rng, table, seq_lens, page_tokens, cache.shape[0], bound)
    q = rand_bf16(rng, (len(seq_lens), hq, head_dim))
    q[-1] *= 8.0
    return SimpleNamespace(hq=hq, hkv=hkv, d=head_dim, page_tokens=page_tokens, seq_lens=seq_lens,
                           seqs=len(seq_lens), cache=cache, table=table, bt_stride=table.shape[1],
                           num_pages=num_pages, q=ref.bf16_round(q), scale=head_dim**-0.5,
                           slots=np.full(len(seq_lens), -1, dtype=np.int32))


def run_stream(exe: Path, work: Path, rows, split_tokens, num_splits, entry="stream", q_off=0, cache_off=0):
    """(part_out bits [seqs, hq, splits, D], part_ml bits [..., 2], output bits [seqs, hq * D]) from the driver's
    `entry` (an ENTRIES key) and the reduce."""
    block = ENTRIES[entry]
    case = work / "case"
    case.mkdir(exist_ok=True)
    (case / "params.bin").write_bytes(_params(rows.hq, rows.hkv, rows.d, rows.page_tokens, rows.bt_stride,
                                              rows.num_pages, split_tokens, num_splits, rows.seqs, block,
                                              float(rows.scale), q_off, cache_off))
    (case / "q.bin").write_bytes(ref.bf16_bits(rows.q).tobytes())
    (case / "cache.bin").write_bytes(ref.bf16_bits(rows.cache).tobytes())
    (case / "bt.bin").write_bytes(rows.table.astype(np.int32).tobytes())
    (case / "lens.bin").write_bytes(rows.seq_lens.astype(np.int32).tobytes())
    (case / "slots.bin").write_bytes(rows.slots.astype(np.int32).tobytes())
    subprocess.run([str(exe), entry, str(case)], check=True)
    n = rows.seqs
    po = np.fromfile(case / "po.bin", dtype=np.uint32).reshape(n, rows.hq, num_splits, rows.d)
    ml = np.fromfile(case / "ml.bin", dtype=np.uint32).reshape(n, rows.hq, num_splits, 2)
    out = np.fromfile(case / "out.bin", dtype=np.uint16).reshape(n, rows.hq * rows.d)
    return po, ml, out


def check_prefill(exe: Path, work: Path, rng) -> None:
    """kern_attn_prefill (GPU-tested) through the stand-ins against ref.attn_prefill: chunks after a prefix."""
    from tests.kernels.test_kernels_gpu import assert_close, make_paged_cache, rand_bf16

    hq, hkv, head_dim, page_tokens = 8, 2, 64, 16
    seq_lens = np.asarray([70, 33], dtype=np.int32)
    q_lens = np.asarray([20, 33], dtype=np.int32)
    cache, table = make_paged_cache(rng, page_tokens, hkv, head_dim, seq_lens, spare_pages=1, spare_cols=1)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    total = int(cu[-1])
    q = ref.bf16_round(rand_bf16(rng, (total, hq, head_dim)))
    scale = head_dim**-0.5
    hpb = hq // hkv if hq // hkv <= 4 and 4 % (hq // hkv) == 0 else 4
    grid_x = -(-int(q_lens.max()) // (16 * (4 // hpb)))
    case = work / "prefill"
    case.mkdir(exist_ok=True)
    (case / "params.bin").write_bytes(_params(hq, hkv, head_dim, page_tokens, table.shape[1], cache.shape[0],
                                              len(seq_lens), total, grid_x, float(scale)))
    (case / "q.bin").write_bytes(ref.bf16_bits(q).tobytes())
    (case / "cache.bin").write_bytes(ref.bf16_bits(cache).tobytes())
    (case / "bt.bin").write_bytes(table.tobytes())
    (case / "cu.bin").write_bytes(cu.tobytes())
    (case / "lens.bin").write_bytes(seq_lens.tobytes())
    subprocess.run([str(exe), "prefill", str(case)], check=True)
    got = ref.from_bf16_bits(np.fromfile(case / "out.bin", dtype=np.uint16).reshape(total, hq * head_dim))
    want = ref.attn_prefill(q, cache, table, cu, seq_lens, scale).reshape(total, hq * head_dim)
    assert_close("emulated kern_attn_prefill", got, want, elem_rel=2.0**-5, elem_abs=8e-3)


def cases(quick: bool):
    """(name, rows kwargs, split_tokens, num_splits) of the stream checks."""
    lens = [1, 15, 16, 17, 127, 128, 300, 0]
    out = [("G4 D128", dict(hq=8, hkv=2, head_dim=128, page_tokens=16, seq_lens=lens), 64, 4),
           ("G5 D64 absent pages", dict(hq=10, hkv=2, head_dim=64, page_tokens=16, seq_lens=[300, 1, 17, 129, 48, 0],
                                        bound=lambda cache_pages: cache_pages - 2), 16, 8),
           ("G2 D32 pages of 4", dict(hq=4, hkv=2, head_dim=32, page_tokens=4, seq_lens=lens), 32, 7)]
    if not quick:
        out += [("G1 D64", dict(hq=2, hkv=2, head_dim=64, page_tokens=16, seq_lens=lens), 64, 4),
                ("G8 D128", dict(hq=8, hkv=1, head_dim=128, page_tokens=16, seq_lens=lens), 16, 16),
                ("G3 D96", dict(hq=6, hkv=2, head_dim=96, page_tokens=16, seq_lens=lens), 96, 3),
                ("G32 D64 (two passes)", dict(hq=32, hkv=1, head_dim=64, page_tokens=16, seq_lens=[1, 100, 33]), 64, 2),
                ("G4 D128 a split of 1", dict(hq=8, hkv=2, head_dim=128, page_tokens=16, seq_lens=[200, 7]), 16, 1)]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="three cases per entry instead of eight")
    parser.add_argument("--entry", choices=sorted(ENTRIES), action="append",
                        help="the decode partial to run (repeatable; default: every one)")
    args = parser.parse_args(argv)
    if shutil.which("g++") is None:
        print("decode_attention_cpu_emu: no g++ on PATH", file=sys.stderr)
        return 2
    from tests.kernels.test_decode_attention_gpu import check_against_reference

    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        t0 = time.time()
        exe = build(work)
        print(f"built the emulator in {time.time() - t0:.1f} s")
        rng = np.random.default_rng(0)
        try:
            t0 = time.time()
            check_prefill(exe, work, rng)
            print(f"ok    kern_attn_prefill through the stand-ins ({time.time() - t0:.1f} s)")
        except AssertionError:
            failures += 1
            print("FAIL  kern_attn_prefill through the stand-ins: the emulation itself is off")
            traceback.print_exc()
        for entry, (name, kw, split_tokens, num_splits) in ((e, c) for e in (args.entry or ENTRIES)
                                                             for c in cases(args.quick)):
            name = f"{entry}: {name}"
            t0 = time.time()
            try:
                rows = make_rows(rng, **kw)
                bits = run_stream(exe, work, rows, split_tokens, num_splits, entry)
                check_against_reference(rows, split_tokens, num_splits, *bits)
                if entry == "fused":  # the merge in the last block: the two launches' bits
                    two = run_stream(exe, work, rows, split_tokens, num_splits, "gqa")
                    assert all(np.array_equal(a, b) for a, b in zip(two, bits)), "fused: not gqa + reduce's bits"
                # slot_mapping naming each row's first-tile row 3 (loaded after the wait) or its last token: same bits
                t = rows.table
                for pos in (lambda n: min(3, n - 1), lambda n: n - 1):
                    rows.slots = np.array([int(t[s, max(pos(int(n)), 0) // rows.page_tokens]) * rows.page_tokens
                                           + max(pos(int(n)), 0) % rows.page_tokens if n > 0 and t[s, 0] >= 0 else -1
                                           for s, n in enumerate(rows.seq_lens)], dtype=np.int32)
                    again = run_stream(exe, work, rows, split_tokens, num_splits, entry)
                    assert all(np.array_equal(a, b) for a, b in zip(again, bits)), "deferred slot row: other bits"
                rows.slots[:] = -1
                # the first row alone: the same bits as inside the launch
                alone = SimpleNamespace(**{**vars(rows), "seqs": 1, "seq_lens": rows.seq_lens[:1], "q": rows.q[:1],
                                           "table": rows.table[:1], "slots": rows.slots[:1]})
                one = run_stream(exe, work, alone, split_tokens, num_splits, entry)
                used = -(-int(rows.seq_lens[0]) // ref.decode_split_len(int(rows.seq_lens[0]), split_tokens, num_splits))
                assert np.array_equal(one[0][0, :, :used], bits[0][0, :, :used]), "row alone: part_out bits"
                assert np.array_equal(one[2][0], bits[2][0]), "row alone: output bits"
                print(f"ok    {name} ({time.time() - t0:.1f} s)")
            except (AssertionError, subprocess.CalledProcessError):
                failures += 1
                print(f"FAIL  {name}")
                traceback.print_exc()
    print("all passed" if not failures else f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
