"""Run kernels-src/allreduce.cu on the CPU (no GPU) with N simulated ranks and check it against
tools/reference_kernels.allreduce_bf16.

The kernel source is compiled with g++ against tools/cpu_emu_allreduce/ (stand-ins for common.cuh, peer_mem.cuh and
the CUDA builtins; the bf16 type from tools/cpu_emu_mma/cuda_bf16.h); every rank is a forked process, every thread of a block a std::thread, the ranks' exported
buffers one shared mapping, system-scope loads and stores std::atomic_ref acquire / release. Checks, each for both
entries (plain sum and the residual add):

- every rank's output of every call bit for bit equal to the reference (float32, rank order 0..N-1), over several
  calls in a row (the epoch parity and its two slots), ranks starting each call after a random delay (arrival
  order varies), at N = 2, 3, 4, 8, grids of 1 and 3 blocks, counts that leave blocks empty or end mid-chunk;
- the data: at N >= 3, values whose float32 sum depends on the order, so a kernel summing in another order fails
  (checked: the reverse order differs somewhere);
- a rank that never arrives: the others report status {1, that rank, block 0, epoch 1} after the timeout, and
  their later calls do not wait again (well under the timeout);
- refused arguments (a count not a multiple of 8, above capacity): status {2, count, grid, size} on every rank at
  once, nothing waited for.

and for kern_allgather_bf16 (the vocabulary-parallel lm_head's logits gather):

- every rank's gathered [rows, vocab] buffer bit for bit equal to tools/reference_kernels.allgather_bf16 (each
  column from the rank that owns it, the last rank's window ending at vocab), every column written (the output
  starts as 0xffff), over several calls with shuffled arrival, at N = 2, 3, 4, 8: vocab a multiple of N * 8 (the
  vector path), vocab not divisible by N (the last rank short, its window overlapping its neighbour's), vocab and
  slice not multiples of 8 (the element path, a count ending mid-vector), one and several rows;
- a rank that never arrives: status {1, that rank, block 0, epoch 1} on the others after the timeout, as the
  all-reduce reports it, and no second wait;
- refused arguments (a slice of rows above capacity, a last rank that would own no column): status {2, count,
  grid, size} on every rank at once, nothing waited for, nothing written.

A logic check of the CUDA source (indices, parity, handshake, sum order, status words) where no GPU is at hand, not
a substitute for tests/multigpu/test_allreduce_gpu.py: x86 memory is stronger than the GPU's, so ordering bugs
between the data and the flags cannot show here.

    uv run --frozen python -m tools.allreduce_cpu_emu [--seed N] [--quick]   # from the repository root; g++ (C++20)

Exit 0 when every check passes, 1 otherwise (the failures are printed), 2 without g++.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tools.reference_kernels import allgather_bf16, allreduce_bf16, bf16_bits

REPO = Path(__file__).resolve().parent.parent
THREADS = 32


def build(work: Path) -> Path:
    """Copy the kernel source and the stand-ins into `work` and compile the driver; its path."""
    for f in (REPO / "tools" / "cpu_emu_allreduce").iterdir():
        shutil.copy(f, work / f.name)
    shutil.copy(REPO / "tools" / "cpu_emu_mma" / "cuda_bf16.h", work / "cuda_bf16.h")  # the bf16 stand-in
    shutil.copy(REPO / "kernels-src" / "allreduce.cu", work / "allreduce.cu")
    exe = work / "driver"
    subprocess.run(["g++", "-std=c++20", "-O1", "-ffp-contract=off", f"-I{work}", "-x", "c++", str(work / "driver.cpp"),
                    "-o", str(exe), "-lpthread"], check=True)
    return exe


@dataclass(frozen=True)
class Case:
    """One driver run: `size` ranks, `blocks` x THREADS, `calls` launches of `count` elements in a row."""

    add: bool
    size: int
    blocks: int
    count: int
    capacity: int
    calls: int = 3
    timeout_ns: int = 2_000_000_000
    absent: int = -1
    delay_us: int = 300

    def __str__(self) -> str:
        kind = "add" if self.add else "sum"
        return (f"{kind} size {self.size} blocks {self.blocks} count {self.count} (capacity {self.capacity}) x "
                f"{self.calls}" + (f", rank {self.absent} absent" if self.absent >= 0 else ""))


@dataclass(frozen=True)
class Result:
    out: np.ndarray  # uint16[calls, size, count]
    status: np.ndarray  # int32[size, 4]
    ns: np.ndarray  # uint64[calls, size]


def partials(rng: np.random.Generator, case: Case) -> np.ndarray:
    """bf16 bits [calls, size, count]: normal values, and at every other element two ranks holding +L and -L (L a
    power of two, 2^20..2^30) beside small values, so that float32 sums in different orders differ (in rank order
    the small values may be absorbed by L or survive its cancellation, depending on where the pair sits)."""
    n = max(case.count, 0)
    vals = rng.standard_normal((case.calls, case.size, n)).astype(np.float32)
    if case.size >= 3:
        big = np.exp2(rng.integers(20, 31, (case.calls, n))).astype(np.float32)
        for c in range(case.calls):
            for i in range(0, n, 2):
                plus, minus = rng.choice(case.size, 2, replace=False)
                vals[c, plus, i], vals[c, minus, i] = big[c, i], -big[c, i]
    return bf16_bits(vals)


def run(exe: Path, work: Path, case: Case, x: np.ndarray, residual: np.ndarray | None, seed: int) -> Result:
    (work / "x.bin").write_bytes(np.ascontiguousarray(x, dtype=np.uint16).tobytes())
    if residual is not None:
        (work / "res.bin").write_bytes(np.ascontiguousarray(residual, dtype=np.uint16).tobytes())
    args = [int(case.add), case.size, case.blocks, THREADS, case.count, case.capacity, case.calls, case.timeout_ns,
            case.absent, case.delay_us, seed, work]
    subprocess.run([str(exe), *map(str, args)], check=True, timeout=600)
    n = max(case.count, 0)
    out = np.frombuffer((work / "out.bin").read_bytes(), dtype=np.uint16).reshape(case.calls, case.size, n)
    status = np.frombuffer((work / "status.bin").read_bytes(), dtype=np.int32).reshape(case.size, 4)
    ns = np.frombuffer((work / "ns.bin").read_bytes(), dtype=np.uint64).reshape(case.calls, case.size)
    return Result(out.copy(), status.copy(), ns.copy())


def expected(case: Case, x: np.ndarray, residual: np.ndarray | None) -> np.ndarray:
    """uint16[calls, size, count]: what every rank must hold after each call (the residual chains across calls)."""
    out = np.zeros((case.calls, case.size, x.shape[2]), dtype=np.uint16)
    res = None if residual is None else residual.copy()
    for c in range(case.calls):
        for r in range(case.size):
            out[c, r] = allreduce_bf16(x[c], None if res is None else res[r])
        if res is not None:
            res = out[c].copy()
    return out


def sum_checks(exe: Path, work: Path, rng: np.random.Generator, case: Case, seed: int) -> list[str]:
    x = partials(rng, case)
    residual = bf16_bits(rng.standard_normal((case.size, case.count)).astype(np.float32)) if case.add else None
    want = expected(case, x, residual)
    got = run(exe, work, case, x, residual, seed)
    fails = []
    if (got.status != 0).any():
        fails.append(f"{case}: status {got.status.tolist()}, expected all zero")
    bad = np.argwhere(got.out != want)
    if bad.size:
        c, r, i = bad[0]
        fails.append(f"{case}: {len(bad)} elements differ from the reference, first call {c} rank {r} element {i}: "
                     f"{got.out[c, r, i]:#06x} vs {want[c, r, i]:#06x}")
    reverse = allreduce_bf16(x[0][::-1])  # the sum in the opposite order
    if case.size >= 3 and case.count >= 64 and (reverse == want[0, 0]).all() and not case.add:
        fails.append(f"{case}: the data does not tell rank order from reverse order (test too weak)")
    return fails


def timeout_checks(exe: Path, work: Path, rng: np.random.Generator, add: bool, seed: int) -> list[str]:
    timeout_ns = 300_000_000
    case = Case(add, 3, 2, 64, 64, calls=3, timeout_ns=timeout_ns, absent=1, delay_us=0)
    x = partials(rng, case)
    residual = bf16_bits(rng.standard_normal((3, 64)).astype(np.float32)) if add else None
    return absent_rank_fails(case, run(exe, work, case, x, residual, seed), timeout_ns)


def absent_rank_fails(case: object, got: Any, timeout_ns: int) -> list[str]:
    """Rank 1 of 3 never calls: ranks 0 and 2 report {1, 1, 0, 1} (timeout, rank 1 missing, block 0, epoch 1),
    their first call waits the whole timeout and their later calls do not wait again (`failed` is set)."""
    fails = []
    for r in (0, 2):
        if got.status[r].tolist() != [1, 1, 0, 1]:
            fails.append(f"{case}: rank {r} status {got.status[r].tolist()}, expected [1, 1, 0, 1] (timeout, rank 1 "
                         "missing, block 0, epoch 1)")
        if got.ns[0, r] < timeout_ns:
            fails.append(f"{case}: rank {r}'s first call took {got.ns[0, r] / 1e6:.1f} ms, under the timeout")
        if got.ns[1:, r].max() > timeout_ns // 3:
            fails.append(f"{case}: rank {r}'s later calls took {got.ns[1:, r].max() / 1e6:.1f} ms: they waited again")
    return fails


def refusal_checks(exe: Path, work: Path, rng: np.random.Generator, add: bool, seed: int) -> list[str]:
    fails = []
    for count, capacity in ((12, 64), (72, 64)):
        case = Case(add, 2, 2, count, capacity, calls=1, timeout_ns=5_000_000_000, delay_us=0)
        x = partials(rng, case)
        residual = bf16_bits(np.ones((2, count), dtype=np.float32)) if add else None
        got = run(exe, work, case, x, residual, seed)
        for r in range(2):
            if got.status[r].tolist() != [2, count, 2, 2]:
                fails.append(f"{case}: rank {r} status {got.status[r].tolist()}, expected [2, {count}, 2, 2]")
        if got.ns.max() > 1_000_000_000:
            fails.append(f"{case}: a refused launch took {got.ns.max() / 1e6:.0f} ms (it waited)")
        untouched = residual if add else np.zeros((2, count), dtype=np.uint16)
        if (got.out[0] != untouched).any():
            fails.append(f"{case}: a refused launch wrote its output")
    return fails


@dataclass(frozen=True)
class Gather:
    """One driver run of kern_allgather_bf16: `size` ranks, slices of `rows` x `slice`, `vocab` columns."""

    size: int
    blocks: int
    rows: int
    vocab: int
    slice: int
    capacity: int
    calls: int = 3
    timeout_ns: int = 2_000_000_000
    absent: int = -1
    delay_us: int = 300

    def __str__(self) -> str:
        return (f"gather size {self.size} blocks {self.blocks} rows {self.rows} vocab {self.vocab} slice "
                f"{self.slice} (capacity {self.capacity}) x {self.calls}" +
                (f", rank {self.absent} absent" if self.absent >= 0 else ""))

    @property
    def count(self) -> int:
        return self.rows * self.slice


def run_gather(exe: Path, work: Path, g: Gather, x: np.ndarray, seed: int) -> Result:
    """x: bf16 bits [calls, size, rows * slice]; the Result's out is [calls, size, rows * vocab]."""
    (work / "x.bin").write_bytes(np.ascontiguousarray(x, dtype=np.uint16).tobytes())
    args = [2, g.size, g.blocks, THREADS, g.count, g.capacity, g.calls, g.timeout_ns, g.absent, g.delay_us, seed,
            work, g.rows, g.vocab, g.slice]
    subprocess.run([str(exe), *map(str, args)], check=True, timeout=600)
    out = np.frombuffer((work / "out.bin").read_bytes(), dtype=np.uint16).reshape(g.calls, g.size,
                                                                                   g.rows * g.vocab)
    status = np.frombuffer((work / "status.bin").read_bytes(), dtype=np.int32).reshape(g.size, 4)
    ns = np.frombuffer((work / "ns.bin").read_bytes(), dtype=np.uint64).reshape(g.calls, g.size)
    return Result(out.copy(), status.copy(), ns.copy())


def gather_slices(rng: np.random.Generator, g: Gather) -> np.ndarray:
    """bf16 bits [calls, size, rows * slice] of normal values (never 0xffff, the driver's unwritten mark)."""
    return bf16_bits(rng.standard_normal((g.calls, g.size, g.count)).astype(np.float32))


def gather_checks(exe: Path, work: Path, rng: np.random.Generator, g: Gather, seed: int) -> list[str]:
    x = gather_slices(rng, g)
    got = run_gather(exe, work, g, x, seed)
    fails = []
    if (got.status != 0).any():
        fails.append(f"{g}: status {got.status.tolist()}, expected all zero")
    for c in range(g.calls):
        want = allgather_bf16(x[c].reshape(g.size, g.rows, g.slice), g.vocab).reshape(-1)
        for r in range(g.size):
            bad = np.flatnonzero(got.out[c, r] != want)
            if bad.size:
                i = bad[0]
                fails.append(f"{g}: call {c} rank {r}: {bad.size} elements differ from the reference, first row "
                             f"{i // g.vocab} column {i % g.vocab}: {got.out[c, r, i]:#06x} vs {want[i]:#06x}")
    return fails


def gather_timeout_checks(exe: Path, work: Path, rng: np.random.Generator, seed: int) -> list[str]:
    timeout_ns = 300_000_000
    g = Gather(3, 2, 1, 60, 24, 24, calls=3, timeout_ns=timeout_ns, absent=1, delay_us=0)
    return absent_rank_fails(g, run_gather(exe, work, g, gather_slices(rng, g), seed), timeout_ns)


def gather_refusal_checks(exe: Path, work: Path, rng: np.random.Generator, seed: int) -> list[str]:
    fails = []
    # rows * slice above capacity; a last rank that would own nothing ((size - 1) * slice >= vocab)
    for g in (Gather(2, 2, 3, 64, 32, 64, calls=1, timeout_ns=5_000_000_000, delay_us=0),
              Gather(3, 2, 1, 32, 16, 64, calls=1, timeout_ns=5_000_000_000, delay_us=0)):
        got = run_gather(exe, work, g, gather_slices(rng, g), seed)
        for r in range(g.size):
            if got.status[r].tolist() != [2, g.count, g.blocks, g.size]:
                fails.append(f"{g}: rank {r} status {got.status[r].tolist()}, expected "
                             f"[2, {g.count}, {g.blocks}, {g.size}]")
        if got.ns.max() > 1_000_000_000:
            fails.append(f"{g}: a refused launch took {got.ns.max() / 1e6:.0f} ms (it waited)")
        if (got.out[0] != 0xFFFF).any():
            fails.append(f"{g}: a refused launch wrote its output")
    return fails


def gathers(quick: bool) -> list[Gather]:
    """vocab = size * slice (vector path); not divisible (slice = cdiv rounded to 8, the last rank short); vocab and
    slice not multiples of 8 (element path, counts ending mid-vector)."""
    out = [Gather(2, 2, 1, 256, 128, 128), Gather(3, 3, 1, 200, 72, 72), Gather(4, 2, 3, 203, 51, 160, calls=4),
           Gather(8, 3, 2, 1000, 128, 256, calls=2)]
    if not quick:
        out += [Gather(3, 1, 5, 201, 67, 336, calls=5), Gather(2, 3, 1, 24, 16, 16, calls=6, delay_us=2000)]
    return out


def cases(quick: bool) -> list[Case]:
    out = []
    for add in (False, True):
        out += [Case(add, 2, 1, 256, 256), Case(add, 3, 3, 296, 512), Case(add, 4, 3, 8, 64, calls=4),
                Case(add, 8, 2, 120, 128, calls=2)]
        if not quick:
            out += [Case(add, 8, 3, 1000, 1024, calls=5), Case(add, 2, 3, 24, 24, calls=6, delay_us=2000)]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="fewer and smaller cases")
    args = parser.parse_args(argv)
    if shutil.which("g++") is None:
        print("allreduce_cpu_emu: g++ not found", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    fails: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kern-ar-emu-") as tmp:
        work = Path(tmp)
        exe = build(work)
        for case in cases(args.quick):
            found = sum_checks(exe, work, rng, case, args.seed)
            print(f"{case}: {'ok' if not found else 'FAILED'}")
            fails += found
        for g in gathers(args.quick):
            found = gather_checks(exe, work, rng, g, args.seed)
            print(f"{g}: {'ok' if not found else 'FAILED'}")
            fails += found
        for name, check in (("timeout (gather)", gather_timeout_checks), ("refusals (gather)", gather_refusal_checks)):
            found = check(exe, work, rng, args.seed)
            print(f"{name}: {'ok' if not found else 'FAILED'}")
            fails += found
        for add in (False, True):
            for name, check in (("timeout", timeout_checks), ("refusals", refusal_checks)):
                found = check(exe, work, rng, add, args.seed)
                print(f"{name} ({'add' if add else 'sum'}): {'ok' if not found else 'FAILED'}")
                fails += found
    for f in fails:
        print(f"  {f}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
