// L2 prefetch of weights ahead of the kernel that reads them (contract: docs/kernels.md "prefetch").
//
// A decode step leaves DRAM nearly idle while a layer's attention runs (a latency chain over ~0.5 MB);
// kern_prefetch_l2, launched with PDL right after the qkv GEMV, asks L2 for the bytes the o projection (and
// optionally the heads of gate_up's gate and up halves) will read, so they stream during the attention
// instead of after it.
//
// kern_prefetch_l2(p0, n0, p1, n1, p2, n2, chunk): up to three byte ranges [p, p + n) (n <= 0: unused).
// chunk == 128: one prefetch.global.L2 per 128-byte line, lines dealt round-robin over every thread of the
// grid. Otherwise (a multiple of 16, >= 16) each range is cut into `chunk`-byte pieces dealt round-robin; a
// piece is one cp.async.bulk.prefetch.L2 (sm_90) of its 16-byte-aligned part, the unaligned head / tail
// bytes covered by prefetch.global.L2 of their lines. Other chunks prefetch nothing. Only whole lines inside the range are
// touched, nothing is read into registers and nothing is written: the ranges must be readable (and are
// never written by a kernel in flight: weights). Any grid and block.
//
// PDL: griddepcontrol.wait first, then launch_dependents, then the prefetches, as the small kernels do. The
// wait is what times the prefetch: launched with PDL after a GEMV, this grid's blocks become resident while
// the GEMV still streams (they need few registers), and prefetching then would only take DRAM bandwidth
// from it; after the wait DRAM is idle until the o projection, and the prefetches are fire-and-forget (the
// grid exits with them in flight).
#include <stdint.h>

#include "common.cuh"

namespace {

KERN_DEV void prefetch_line(const char* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

KERN_DEV void prefetch_bulk(const char* p, uint32_t bytes) {  // p 16-byte aligned, bytes a multiple of 16
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

// Piece i (of `chunk` bytes) of [base, base + n), for every i this thread owns.
KERN_DEV void prefetch_range(const char* base, int64_t n, int64_t chunk, int64_t thread, int64_t threads) {
    if (base == nullptr || n <= 0) return;
    const int64_t pieces = (n + chunk - 1) / chunk;
    for (int64_t i = thread; i < pieces; i += threads) {
        const char* lo = base + i * chunk;
        const char* hi = base + min(n, (i + 1) * chunk);
        const uintptr_t a = (reinterpret_cast<uintptr_t>(lo) + 15) & ~uintptr_t(15);
        const uintptr_t b = reinterpret_cast<uintptr_t>(hi) & ~uintptr_t(15);
        if (a < b) {
            prefetch_bulk(reinterpret_cast<const char*>(a), static_cast<uint32_t>(b - a));
            if (reinterpret_cast<uintptr_t>(lo) < a) prefetch_line(lo);
            if (b < reinterpret_cast<uintptr_t>(hi)) prefetch_line(reinterpret_cast<const char*>(b));
        } else {
            prefetch_line(lo);  // a piece shorter than 16 aligned bytes: its line(s)
            prefetch_line(hi - 1);
        }
    }
}

}  // namespace

// Lines mode: one prefetch.global.L2 per 128-byte line of [base, base + n), lines dealt round-robin.
KERN_DEV void prefetch_lines(const char* base, int64_t n, int64_t thread, int64_t threads) {
    if (base == nullptr || n <= 0) return;
    const uintptr_t first = reinterpret_cast<uintptr_t>(base) & ~uintptr_t(127);
    const int64_t lines = static_cast<int64_t>((reinterpret_cast<uintptr_t>(base) + n - 1 - first) / 128) + 1;
    for (int64_t i = thread; i < lines; i += threads) {
        const uintptr_t a = first + static_cast<uintptr_t>(i) * 128;
        prefetch_line(reinterpret_cast<const char*>(a < reinterpret_cast<uintptr_t>(base) ? base : reinterpret_cast<const char*>(a)));
    }
}

extern "C" __global__ void kern_prefetch_l2(const char* p0, int64_t n0, const char* p1, int64_t n1, const char* p2,
                                            int64_t n2, int32_t chunk) {
    kern_pdl_wait();
    kern_pdl_launch_dependents();
    const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (chunk == 128) {
        prefetch_lines(p0, n0, thread, threads);
        prefetch_lines(p1, n1, thread, threads);
        prefetch_lines(p2, n2, thread, threads);
    } else if (chunk >= 16 && chunk % 16 == 0) {
        prefetch_range(p0, n0, chunk, thread, threads);
        prefetch_range(p1, n1, chunk, thread, threads);
        prefetch_range(p2, n2, chunk, thread, threads);
    }
}
