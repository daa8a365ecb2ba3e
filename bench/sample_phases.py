"""Phase profile of the sampler (kernels-src/sample.cu) on the GPU: which phase costs what, per path and row count.

Compiles kernels-src/sample.cu with -DSAMPLE_PROFILE (nvcc with the committed build's flags, into a temporary
directory; never into kernels/) or loads --cubin, then for each of bench/kernels.py's sampler cases (SAMPLE_CASES x
SAMPLE_ROWS, the same bf16 logits normal x 3, params, positions and work area):
  - the wall time per launch of the normal build (kernels/) and of the profiled one (bench/kernels.py's time_graph:
    a graph of 20 launches, median of 15 replays), the instrumentation's cost;
  - one graph of --launches launches of the profiled build, each writing its own stamps (uint64 [rows, 19, 64] per
    launch, tools/sample_profile.py's layout), parsed into a table: per phase, the median over launches of the
    merging blocks' median and max over rows and of the other blocks' median and max (us, at the SM clock fitted
    from the blocks' globaltimer spans), and a timeline (launch span, when the last block starts, how many blocks
    are resident at once, when the merges begin);
  - a check that the profiled build writes the normal build's tokens and logprobs and leaves the tickets at 0.
Then a summary line per case. Exit 0, or 1 when a case's stamps or outputs are wrong, 2 when nvcc fails, 3
without a GPU.

    python bench/sample_phases.py [--rows 1,8,64] [--launches 20] [--cubin PATH] [--json PATH]   # on the GPU machine
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from cuda.bindings import driver as cu
from kern_run.sampling import (
    SAMPLE_THREADS,
    WORK_BYTES_PER_ROW,
    pack_params,
    sampler_splits,
)

from bench.kernels import SAMPLE_CASES, SAMPLE_ROWS, VOCAB, cdiv, rand_bits, time_graph
from tests.kernels.gpu_helpers import Kernel, check, open_gpu
from tools import sample_profile as sp
from tools.build_kernels import module_flags

REPO = Path(__file__).resolve().parent.parent
ENTRY = "kern_sample_bf16"


def compile_profile(out_dir: Path) -> Path:
    """kernels-src/sample.cu -> out_dir/sample_profile.cubin with the committed flags plus -DSAMPLE_PROFILE (nvcc:
    $NVCC, else PATH, else /usr/local/cuda/bin). Exits 2 with nvcc's output when there is none or it fails."""
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cubin = out_dir / "sample_profile.cubin"
    cmd = [nvcc, *module_flags("sample"), "-DSAMPLE_PROFILE", "-o", str(cubin), "sample.cu"]
    try:
        proc = subprocess.run(cmd, cwd=REPO / "kernels-src", capture_output=True, text=True, check=False)
    except OSError as exc:
        raise SystemExit(f"sample_phases: {nvcc} cannot be run: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        print(f"sample_phases: {' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}",
              file=sys.stderr)
        raise SystemExit(2)
    return cubin


def profile_params(committed: list[list[int]]) -> list[list[int]]:
    """The profiled entry's [offset, size] parameters: the committed entry's plus the trailing u64* prof."""
    params = [list(p) for p in committed]
    off = params[-1][0] + params[-1][1]
    return params + [[off + (-off % 8), 8]]


def profile_kernel(gpu, cubin: Path) -> Kernel:
    """The profiled kern_sample_bf16 of `cubin`, staged by profile_params."""
    params = profile_params(gpu.meta["modules"]["sample"]["entries"][ENTRY]["params"])
    module = check(cu.cuModuleLoadData(cubin.read_bytes()), f"cuModuleLoadData({cubin})")
    func = check(cu.cuModuleGetFunction(module, ENTRY.encode()), f"cuModuleGetFunction({ENTRY}, profile)")
    return Kernel(f"{ENTRY} (profile)", func, params)


def launcher(kernel: Kernel, grid, block, args):
    """A callable launching `kernel` with `args` on the stream it is given (for time_graph / replay_once)."""
    return lambda st: kernel.launch(grid, block, args, stream=st, sync=False)


def replay_once(stream, launches) -> None:
    """Capture `launches` (callables taking a stream) into one graph, run it once, wait."""
    check(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL), "BeginCapture")
    for launch in launches:
        launch(stream)
    graph = check(cu.cuStreamEndCapture(stream), "EndCapture")
    exe = check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    check(cu.cuGraphLaunch(exe, stream), "cuGraphLaunch")
    check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    check(cu.cuGraphExecDestroy(exe), "cuGraphExecDestroy")
    check(cu.cuGraphDestroy(graph), "cuGraphDestroy")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(map(str, SAMPLE_ROWS)), help="row counts, comma-separated")
    parser.add_argument("--launches", type=int, default=20, help="profiled launches per case (each its own stamps)")
    parser.add_argument("--cubin", type=Path, help="a prebuilt -DSAMPLE_PROFILE cubin (default: compile one)")
    parser.add_argument("--json", type=Path, help="also write every case's summary here")
    args = parser.parse_args(argv)
    row_counts = [int(r) for r in args.rows.split(",") if r]
    gpu = open_gpu()
    with tempfile.TemporaryDirectory() as tmp:
        cubin = args.cubin or compile_profile(Path(tmp))
        kp = profile_kernel(gpu, cubin)
    k = gpu.kernel(ENTRY)
    stream = check(cu.cuStreamCreate(1), "cuStreamCreate")
    khz = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLOCK_RATE, gpu.device), "ClockRate")
    rng = np.random.default_rng(0)
    splits = sampler_splits(VOCAB)
    block = (SAMPLE_THREADS,)
    results, bad = [], 0
    for n_rows in row_counts:
        grid = (splits, n_rows)
        n_sets = max(1, cdiv(60_000_000, n_rows * VOCAB * 2))  # rotate past the 50 MB L2, as bench/kernels.py
        logit_sets = [gpu.array(rand_bits(rng, (n_rows, VOCAB), 3.0)).ptr for _ in range(min(n_sets, 4))]
        positions = gpu.array(np.arange(n_rows, dtype=np.int32)).ptr
        out = gpu.alloc(n_rows * 8)
        work = gpu.array(np.zeros((n_rows, WORK_BYTES_PER_ROW // 4), dtype=np.uint32))  # tickets 0, left at 0
        block_bytes = n_rows * splits * sp.SLOTS * 8
        prof = gpu.alloc(args.launches * block_bytes)
        for label, params in SAMPLE_CASES:
            name = f"sample rows={n_rows} {label}"
            prm = gpu.array(np.frombuffer(pack_params([params] * n_rows), dtype=np.uint8).copy()).ptr
            sets = [[("p", lg), ("p", prm), ("p", positions), ("p", 0), ("p", 0), ("i", 0), ("i", VOCAB),
                     ("p", out.ptr), ("p", out.ptr + 4 * n_rows), ("p", 0), ("p", work.ptr)] for lg in logit_sets]
            normal_us = time_graph(stream, [launcher(k, grid, block, a) for a in sets])
            profiled_us = time_graph(stream, [launcher(kp, grid, block, a + [("p", prof.ptr)]) for a in sets])
            # the profiled build's outputs against the normal one's (same logits: no penalties rewrite them)
            k.launch(grid, block, sets[0])
            want = out.download(np.uint8, (n_rows * 8,))
            kp.launch(grid, block, sets[0] + [("p", prof.ptr)])
            same = np.array_equal(out.download(np.uint8, (n_rows * 8,)), want)
            check(cu.cuMemsetD8(prof.ptr, 0, args.launches * block_bytes), "cuMemsetD8")
            replay_once(stream, [launcher(kp, grid, block, sets[i % len(sets)] + [("p", prof.ptr + i * block_bytes)])
                                 for i in range(args.launches)])
            tickets = work.download(np.uint32, (n_rows, WORK_BYTES_PER_ROW // 4))[:, 0]
            stamps = prof.download(np.uint64, (args.launches, n_rows, splits, sp.SLOTS))
            try:
                launches = sp.parse(stamps)
            except sp.StampError as exc:
                print(f"{name}: stamps unusable: {exc}")
                bad += 1
                continue
            rate = sp.cycles_per_ns(launches, fallback=khz / 1e6)
            summary = sp.summarize(launches, rate)
            print(sp.format_case(name, summary, normal_us, profiled_us))
            if not same or tickets.any():
                print(f"  WRONG: profiled outputs {'equal' if same else 'differ from the normal build'}, "
                      f"{int(np.count_nonzero(tickets))} ticket(s) left nonzero")
                bad += 1
            print()
            results.append({"case": name, "rows": n_rows, "normal_us": normal_us, "profiled_us": profiled_us,
                            "outputs_equal": bool(same), "summary": dataclasses.asdict(summary)})
    print(f"{'case':48s} {'normal us':>10s} {'profiled':>9s} {'span us':>8s} {'merge us':>9s} {'others max':>10s}")
    for r in results:
        total = next(p for p in r["summary"]["phases"] if p["label"] == "total")
        print(f"{r['case']:48s} {r['normal_us']:10.2f} {r['profiled_us']:9.2f} {r['summary']['span_us']:8.2f} "
              f"{total['merge_med']:9.2f} {total['other_max'] or 0.0:10.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    gpu.free_all()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
