"""Weight-streaming probe: GB/s of one resident block per SM streaming ~1 GB of weights by load method (H200).

Compiles bench/stream_probe.cu here (nvcc on PATH, sm_90) and times each entry over two row lengths (5120 bytes:
a k = 2560 projection's rows; 20480: k = 10240), one launch of 132 blocks (one per SM: every entry gets 192 KiB
of dynamic shared memory, so no SM holds two), median of 5 after 2 warm-ups, CUDA events. The question it answers
is the one the small-M MMA projections (kernels-src/gemv_mma.cu) and the persistent decode (issue 28) share:
which way of loading weights reaches the HBM rate with few warps per SM. The table prints GB/s and % of 4.3 TB/s
(the measured copy rate, shared/design/GPU-MACHINE.md), entry by entry (the kinds: bench/stream_probe.cu).

    python bench/stream_probe.py            # on the GPU machine, after `source tools/gpu-env.sh`
"""

from __future__ import annotations

import ctypes
import statistics
import subprocess
import tempfile
from pathlib import Path

import torch
from cuda.bindings import driver as cu

HERE = Path(__file__).resolve().parent
COPY_RATE = 4.3e12
SMEM = 192 * 1024
ENTRIES = ("frag_u5_w8", "frag_u8_w8", "frag_u5_w16", "row_u8_w8", "row_u8_w16", "row_u4_w32", "async_u8_s3_w8",
           "async_u4_s6_w8", "bulk_u8_s3_w8", "bulk_u4_s6_w8", "bulk_u8_s6_w4", "bulk_u16_s3_w4")
SHAPES = ((196608, 5120), (49152, 20480))  # (rows, row bytes): ~1 GB each, rows a multiple of 16


def check(result: tuple, what: str):
    err, *rest = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {err}")
    return rest[0] if len(rest) == 1 else rest


def main() -> int:
    torch.cuda.init()
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "stream_probe.cubin"
        subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-O3", "-std=c++17", "-o", str(cubin),
                        str(HERE / "stream_probe.cu")], check=True)
        image = cubin.read_bytes()
    torch.zeros(1, device="cuda")  # the primary context
    module = check(cu.cuModuleLoadData(image), "cuModuleLoadData")
    out = torch.zeros(sms * 1024, dtype=torch.int32, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    print(f"device {props.name}, {sms} SMs; one block per SM, {SMEM >> 10} KiB dynamic shared memory each")
    print(f"{'entry':16s} " + " ".join(f"{f'{rb} B rows':>22s}" for _, rb in SHAPES))
    buffers = [torch.randint(0, 255, (rows * rb,), dtype=torch.uint8, device="cuda") for rows, rb in SHAPES]
    for name in ENTRIES:
        func = check(cu.cuModuleGetFunction(module, name.encode()), name)
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(cu.cuFuncSetAttribute(func, attr, SMEM), f"{name} smem")
        threads = 32 * int(name.rsplit("_w", 1)[1])
        cells = []
        for (rows, rb), buf in zip(SHAPES, buffers):
            args = [ctypes.c_uint64(buf.data_ptr()), ctypes.c_int32(rows), ctypes.c_int32(rb),
                    ctypes.c_uint64(out.data_ptr())]
            ptrs = (ctypes.c_void_p * 4)(*[ctypes.addressof(a) for a in args])

            def launch() -> None:
                check(cu.cuLaunchKernel(func, sms, 1, 1, threads, 1, 1, SMEM, stream, ctypes.addressof(ptrs), 0),
                      name)
            times = []
            for i in range(7):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                launch()
                end.record()
                end.synchronize()
                if i >= 2:
                    times.append(start.elapsed_time(end) * 1e-3)
            rate = rows * rb / statistics.median(times)
            cells.append(f"{rate / 1e9:8.0f} GB/s ({100 * rate / COPY_RATE:5.1f}%)")
        print(f"{name:16s} " + " ".join(f"{c:>22s}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
