"""Run kernels-src/rope.cu on the CPU (no GPU) and check it against tools/reference_kernels.py.

The source is compiled with g++ against tools/cpu_emu/ (common.cuh: a block as std::threads, real barriers, warp
shuffles through an exchange; the real block_sum of kernels-src/common.cuh appended) and driven by
tools/cpu_emu/rope_driver.cpp. Checks:

- kern_rope_table and kern_rope_table_llama3 (Llama 3.1 / 3.2's published scaling, and a narrow band) against
  `reference_kernels.rope_table`: the emulated table uses the host's powf / cosf, so entries may differ by one bf16
  ulp of their magnitude where the reference's float64 cos rounds the other way (never more; few of them);
- kern_qk_norm_rope_kv and kern_qk_norm_rope_kv_warp with both norm weights (Qwen3), with none (Llama: null
  pointers) and with one: q rows and the K / V written to the slot of each token, against
  `reference_kernels.qk_norm_rope_kv` (within the GPU test's bounds: the reference normalizes in float64; without a
  norm every operation is the reference's and the rows must match bit for bit), untouched elsewhere (a slot of -1, a position past
  the table), and the warp entry bit for bit the block entry.

A logic check of the CUDA source where no GPU is at hand, not a substitute for tests/kernels/test_kernels_gpu.py.

    uv run --frozen python -m tools.rope_cpu_emu     # from the repository root; needs g++ (C++20)

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
import traceback
from pathlib import Path

import numpy as np

from tools import reference_kernels as ref

REPO = Path(__file__).resolve().parent.parent
EMU = REPO / "tools" / "cpu_emu"
SRC = REPO / "kernels-src"
# Llama 3.1 / 3.2's rope_scaling (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings):
# 3.2-1B / 3B publish factor 32, 3.1-8B factor 8
LLAMA32 = (32.0, 1.0, 4.0, 8192)
LLAMA31 = (8.0, 1.0, 4.0, 8192)


def _device_function(text: str, name: str) -> str:
    """The definition of KERN_DEV function `name` in `text` (signature to the `}` closing it at a line start)."""
    match = re.search(rf"^KERN_DEV [\w:]+ {name}\(", text, re.M)
    if match is None:
        raise ValueError(f"no definition of {name}")
    return text[match.start():text.index("\n}\n", match.start()) + 3]


def build(work: Path) -> Path:
    """The driver binary, compiled in `work` from copies of rope.cu, the stand-ins and the real block_sum."""
    for name in ("cuda_bf16.h", "rope_driver.cpp"):
        shutil.copy(EMU / name, work / name)
    real = (SRC / "common.cuh").read_text()
    (work / "common.cuh").write_text((EMU / "common.cuh").read_text() + "\n" + _device_function(real, "block_sum"))
    shutil.copy(SRC / "rope.cu", work / "rope.cu")
    exe = work / "driver"
    cmd = ["g++", "-std=c++20", "-O2", "-pthread", "-w", "-I", str(work), str(work / "rope_driver.cpp"), "-o", str(exe)]
    subprocess.run(cmd, check=True, cwd=work)
    return exe


def _params(*words) -> bytes:
    return b"".join(struct.pack("<f", w) if isinstance(w, float) else struct.pack("<i", int(w)) for w in words)


def run_table(exe: Path, work: Path, max_pos: int, head_dim: int, theta: float,
              llama3: tuple[float, float, float, int] | None = None) -> np.ndarray:
    """f32[max_pos, head_dim]: the emulated kern_rope_table (or kern_rope_table_llama3 with `llama3`)."""
    case = work / "table"
    case.mkdir(exist_ok=True)
    extra = () if llama3 is None else (float(llama3[0]), float(llama3[1]), float(llama3[2]), float(llama3[3]))
    (case / "params.bin").write_bytes(_params(max_pos, head_dim, float(theta), *extra))
    subprocess.run([str(exe), "table" if llama3 is None else "llama3", str(case)], check=True)
    return np.fromfile(case / "rope.bin", dtype=np.float32).reshape(max_pos, head_dim)


def check_table(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Every entry written, at most one bf16 ulp of its own magnitude (2^-7 relative) from the reference plus 2^-13
    (an fp32 ulp of inv_freq, which powf may round otherwise, moves an angle of 500 by 3e-5), and few off at all."""
    assert not np.isnan(got).any(), f"{what}: unwritten entries"
    diff = np.abs(got.astype(np.float64) - want)
    bad = diff > 2.0**-7 * np.abs(want) + 2.0**-13
    assert not bad.any(), (f"{what}: {bad.sum()} entries off, first {np.argwhere(bad)[0].tolist()}: got "
                           f"{got[tuple(np.argwhere(bad)[0])]} want {want[tuple(np.argwhere(bad)[0])]}")
    assert (diff > 0).mean() < 0.05, f"{what}: {(diff > 0).mean():.2%} of the entries differ"


def _rand_bf16(rng, shape, scale=1.0) -> np.ndarray:
    return ref.bf16_round((rng.standard_normal(shape) * scale).astype(np.float32))


def run_rope_kv(exe: Path, work: Path, entry: str, c: dict, norms: int) -> tuple[np.ndarray, np.ndarray]:
    """(q_out [n, hq, D], kv cache [pages, 2, pt, hkv, D]) as bf16 values after the emulated `entry` ("block" or
    "warp") over case `c`; `norms` bit 0 passes q_norm, bit 1 k_norm (else null)."""
    d, n = c["d"], c["qkv"].shape[0]
    if entry == "block":
        grid_y, block = c["hq"] + c["hkv"], d
    else:
        grid_y, block = -(-(c["hq"] + c["hkv"]) // (8 * max(1, 256 // d))), 256
    case = work / "rope_kv"
    case.mkdir(exist_ok=True)
    (case / "params.bin").write_bytes(_params(n, c["hq"], c["hkv"], d, c["pt"], c["rope"].shape[0], c["pages"],
                                              float(c["eps"]), grid_y, block, norms))
    for name, arr in (("qkv", c["qkv"]), ("qn", c["qn"]), ("kn", c["kn"]), ("q", c["q0"]), ("kv", c["kv0"])):
        (case / f"{name}.bin").write_bytes(ref.bf16_bits(arr).tobytes())
    (case / "rope.bin").write_bytes(c["rope"].astype(np.float32).tobytes())
    (case / "pos.bin").write_bytes(c["pos"].astype(np.int32).tobytes())
    (case / "slots.bin").write_bytes(c["slots"].astype(np.int32).tobytes())
    subprocess.run([str(exe), entry, str(case)], check=True)
    q = ref.from_bf16_bits(np.fromfile(case / "q.bin", dtype=np.uint16)).reshape(c["q0"].shape)
    kv = ref.from_bf16_bits(np.fromfile(case / "kv.bin", dtype=np.uint16)).reshape(c["kv0"].shape)
    return q, kv


def make_case(rng, hq: int, hkv: int, d: int, llama3=LLAMA32) -> dict:
    """Five tokens (one at a position past the table, one with slot -1) over a 3-page cache of 4-token pages."""
    pt, pages, max_pos = 4, 3, 64
    n = 5
    return {"hq": hq, "hkv": hkv, "d": d, "pt": pt, "pages": pages, "eps": 1e-6,
            "qkv": _rand_bf16(rng, (n, (hq + 2 * hkv) * d), 2.0), "qn": _rand_bf16(rng, (d,), 0.3) + 1.0,
            "kn": _rand_bf16(rng, (d,), 0.3) + 1.0, "rope": ref.rope_table(max_pos, d, 500000.0, llama3),
            "pos": np.array([0, 7, 63, 64, 30]), "slots": np.array([0, 5, 11, 3, -1]),
            "q0": np.full((n, hq, d), 7.0, np.float32), "kv0": np.full((pages, 2, pt, hkv, d), -3.0, np.float32)}


def check_rope_kv(exe: Path, work: Path, c: dict, norms: int) -> None:
    """Both entries against the reference, and against each other bit for bit."""
    from tests.kernels.test_kernels_gpu import assert_close

    qn = c["qn"] if norms & 1 else None
    kn = c["kn"] if norms & 2 else None
    want_q, want_kv = c["q0"].copy(), c["kv0"].copy()
    ref.qk_norm_rope_kv(c["qkv"], qn, kn, c["rope"], c["pos"], c["slots"], want_q, want_kv, c["hq"], c["hkv"],
                        c["d"], c["eps"])
    block = run_rope_kv(exe, work, "block", c, norms)
    for got, want, what in zip(block, (want_q, want_kv), ("q_out", "kv cache")):
        if norms == 0:  # no rsqrtf: the rows are exact
            np.testing.assert_array_equal(got, want, err_msg=f"block entry {what}, no norm")
        else:  # the GPU test's bound: RoPE can cancel, so a one-ulp flip in the normed head is absolute
            assert_close(f"block entry {what}", got, want, elem_abs=2.0**-6)
    np.testing.assert_array_equal(block[0][3], c["q0"][3], err_msg="a position past the table wrote q")
    if c["d"] % 64 == 0:
        warp = run_rope_kv(exe, work, "warp", c, norms)
        for got, want, what in zip(warp, block, ("q_out", "kv cache")):
            np.testing.assert_array_equal(got, want, err_msg=f"warp entry {what} differs from the block entry's")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if shutil.which("g++") is None:
        print("rope_cpu_emu: no g++ on PATH", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        exe = build(work)
        checks = [
            ("kern_rope_table D128 theta 1e6", lambda: check_table(
                run_table(exe, work, 512, 128, 1e6), ref.rope_table(512, 128, 1e6), "plain")),
            ("kern_rope_table_llama3 D64 (3.2-1B)", lambda: check_table(
                run_table(exe, work, 512, 64, 5e5, LLAMA32), ref.rope_table(512, 64, 5e5, LLAMA32), "llama3 D64")),
            ("kern_rope_table_llama3 D128 (3.1-8B)", lambda: check_table(
                run_table(exe, work, 512, 128, 5e5, LLAMA31), ref.rope_table(512, 128, 5e5, LLAMA31), "llama3 D128")),
            ("kern_rope_table_llama3 a narrow band", lambda: check_table(
                run_table(exe, work, 256, 64, 1e4, (4.0, 2.0, 3.0, 1024)),
                ref.rope_table(256, 64, 1e4, (4.0, 2.0, 3.0, 1024)), "llama3 narrow")),
        ]
        for hq, hkv, d in ((8, 2, 128), (6, 2, 64), (3, 1, 32)):
            for norms, kind in ((3, "q/k norm"), (0, "no norm"), (2, "k norm only")):
                checks.append((f"kern_qk_norm_rope_kv{'(_warp)' if d % 64 == 0 else ''} {hq}/{hkv} D{d} {kind}",
                               lambda hq=hq, hkv=hkv, d=d, norms=norms: check_rope_kv(
                                   exe, work, make_case(rng, hq, hkv, d), norms)))
        for name, check in checks:
            try:
                check()
                print(f"{name}: ok")
            except (AssertionError, subprocess.CalledProcessError):
                failures += 1
                print(f"{name}: FAIL")
                traceback.print_exc(file=sys.stdout)
    print("all passed" if not failures else f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
