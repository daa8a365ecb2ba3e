"""Micro-benchmark of kern's kernels at Qwen3-4B shapes: device time per launch vs the bytes-moved floor.

Each case is captured into a CUDA graph of REPS back-to-back launches (so Python launch cost is not
measured) and timed by CUDA events over several replays; the median per launch is reported. Where the
working set would fit in L2 (50 MB), launches rotate over several input sets.
Floor = fewest bytes each launch must move (inputs read once, outputs written once) / 4.3 TB/s (measured
H200 copy rate, shared/design/GPU-MACHINE.md). Prefill attention also reports TFLOP/s.

    python bench/kernels.py            # on the GPU machine
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from cuda.bindings import driver as cu

from kern_run.models.qwen3 import EARLY_PARTIALS, PREFILL_ATTN, rope_warp_heads
from kern_run.sampling import SAMPLE_THREADS, WORK_BYTES_PER_ROW, SamplingParams, pack_params, sampler_splits
from tests.kernels.gpu_helpers import check, open_gpu
from tools import reference_kernels as ref


PEAK_BYTES_PER_S = 4.3e12
HIDDEN, HQ, HKV, D, INTER, VOCAB = 2560, 32, 8, 128, 9728, 151936
PAGE = 16
REPS, REPLAYS = 20, 15
STREAM_ENTRY, STREAM_THREADS, _ = EARLY_PARTIALS["stream"]  # kern_attn_decode_partial_stream, 64 threads
# (rows, context) of the batched decode attention cases (issue 26)
BATCHED_DECODE = ((8, 128), (32, 128), (64, 128), (8, 2048), (32, 2048), (64, 2048))
# the sampler's cases (label, parameters) and row counts (bench/sample_phases.py profiles the same)
SAMPLE_CASES = (("greedy", SamplingParams()), ("T=1", SamplingParams(temperature=1.0, seed=1)),
                ("T=0.7 k=50 p=0.9", SamplingParams(temperature=0.7, top_k=50, top_p=0.9, seed=1)),
                ("T=1 min_p=0.05", SamplingParams(temperature=1.0, min_p=0.05, seed=1)),
                ("T=1 p=0.9", SamplingParams(temperature=1.0, top_p=0.9, seed=1)),
                ("T=1 p=0.95 alone (exact path here)", SamplingParams(temperature=1.0, top_p=0.95, seed=1)))
SAMPLE_ROWS = (1, 8, 64)


def cdiv(a, b):
    return -(-a // b)


def rand_bits(rng, shape, scale=1.0):
    return ref.bf16_bits((rng.standard_normal(shape) * scale).astype(np.float32))


def time_graph(stream, launches) -> float:
    """Median microseconds per launch of `launches` (callables taking a stream), captured REPS times."""
    check(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL), "BeginCapture")
    for i in range(REPS):
        launches[i % len(launches)](stream)
    graph = check(cu.cuStreamEndCapture(stream), "EndCapture")
    exe = check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    start, end = check(cu.cuEventCreate(0), "cuEventCreate"), check(cu.cuEventCreate(0), "cuEventCreate")
    for _ in range(3):
        check(cu.cuGraphLaunch(exe, stream), "cuGraphLaunch")
    times = []
    for _ in range(REPLAYS):
        check(cu.cuEventRecord(start, stream), "cuEventRecord")
        check(cu.cuGraphLaunch(exe, stream), "cuGraphLaunch")
        check(cu.cuEventRecord(end, stream), "cuEventRecord")
        check(cu.cuEventSynchronize(end), "cuEventSynchronize")
        times.append(check(cu.cuEventElapsedTime(start, end), "cuEventElapsedTime") * 1000.0 / REPS)
    check(cu.cuGraphExecDestroy(exe), "cuGraphExecDestroy")
    check(cu.cuGraphDestroy(graph), "cuGraphDestroy")
    return statistics.median(times)


def print_decode_attention_table(rows) -> None:
    """The decode attention pair (partial + reduce) per layer, wide against stream: one row (1 sequence) at ctx 128,
    1024, 4096 and BATCHED_DECODE, us and % of 4.3 TB/s for every row's K/V read once (+ q in, out)."""
    by_name = {name: (us, floor_us) for name, us, _, floor_us, _ in rows}
    cases = [(1, ctx, f"partial+reduce ctx={ctx}") for ctx in (128, 1024, 4096)]
    cases += [(seqs, ctx, f"pair seqs={seqs} ctx={ctx}") for seqs, ctx in BATCHED_DECODE]
    print(f"\n{'decode attention per layer':30s} {'wide us':>9s} {'% BW':>6s} {'stream us':>10s} {'% BW':>6s} "
          f"{'speedup':>8s}")
    for seqs, ctx, suffix in cases:
        (wide_us, floor_us), (stream_us, _) = by_name[f"attn_decode wide {suffix}"], by_name[f"attn_decode stream {suffix}"]
        print(f"{f'{seqs} rows ctx {ctx}':30s} {wide_us:9.2f} {100 * floor_us / wide_us:5.1f}% {stream_us:10.2f} "
              f"{100 * floor_us / stream_us:5.1f}% {wide_us / stream_us:7.2f}x")


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)  # --help; takes no options
    gpu = open_gpu()
    stream = check(cu.cuStreamCreate(1), "cuStreamCreate")  # non-blocking: capturable
    rng = np.random.default_rng(0)
    rows = []

    def bench(name, kernel, grid, block, arg_sets, nbytes, flops=0.0, shared_mem=0):
        k = gpu.kernel(kernel)
        launches = [lambda st, a=a: k.launch(grid, block, a, stream=st, sync=False, shared_mem=shared_mem)
                    for a in arg_sets]
        us = time_graph(stream, launches)
        floor_us = nbytes / PEAK_BYTES_PER_S * 1e6
        rows.append((name, us, nbytes, floor_us, flops / (us * 1e-6) / 1e12 if flops else None))

    def arr(data):
        return gpu.array(data).ptr

    # embed / rmsnorm / silu / qk-norm-rope at 1 and 512 tokens
    table = arr(rand_bits(rng, (VOCAB, HIDDEN)))
    rope = arr(ref.rope_table(4096, D, 1e6))
    for n in (1, 512, 2048):
        ids = arr(rng.integers(0, VOCAB, n).astype(np.int32))
        out = gpu.alloc(n * HIDDEN * 2).ptr
        bench(f"embed_gather n={n}", "kern_embed_gather", (n,), (256,),
              [[("p", table), ("p", ids), ("p", out), ("i", n), ("i", HIDDEN), ("i", VOCAB)]], n * HIDDEN * 4 + n * 4)
        sets = [[("p", arr(rand_bits(rng, (n, HIDDEN)))), ("p", arr(rand_bits(rng, (n, HIDDEN)))),
                 ("p", arr(rand_bits(rng, (HIDDEN,)))), ("p", gpu.alloc(n * HIDDEN * 2).ptr),
                 ("i", n), ("i", HIDDEN), ("f", 1e-6)] for _ in range(4 if n > 1 else 1)]
        bench(f"add_rmsnorm n={n}", "kern_add_rmsnorm", (n,), (256,), sets, n * HIDDEN * 2 * 4 + HIDDEN * 2)
        sets = [[("p", arr(rand_bits(rng, (n, 2 * INTER)))), ("p", gpu.alloc(n * INTER * 2).ptr), ("i", n), ("i", INTER)]
                for _ in range(4 if n > 1 else 1)]
        bench(f"silu_mul n={n}", "kern_silu_mul", (n, cdiv(INTER, 1024)), (256,), sets, n * INTER * 2 * 3)
        width = (HQ + 2 * HKV) * D
        num_pages = cdiv(n, PAGE) + 1
        sets = [[("p", arr(rand_bits(rng, (n, width)))), ("p", arr(rand_bits(rng, (D,)))), ("p", arr(rand_bits(rng, (D,)))),
                 ("p", rope), ("p", arr(np.arange(n, dtype=np.int32))), ("p", arr(np.arange(n, dtype=np.int32))),
                 ("p", gpu.alloc(n * HQ * D * 2).ptr), ("p", gpu.alloc(num_pages * PAGE * 2 * HKV * D * 2).ptr),
                 ("i", n), ("i", HQ), ("i", HKV), ("i", D), ("i", PAGE), ("i", 4096), ("i", num_pages * PAGE), ("f", 1e-6)]
                for _ in range(4 if n > 1 else 1)]
        rope_bytes = n * (width * 2 + HQ * D * 2 + 2 * HKV * D * 2 + D * 4) + 4 * D
        bench(f"qk_norm_rope_kv n={n}", "kern_qk_norm_rope_kv", (n, HQ + HKV), (D,), sets, rope_bytes)
        if n > 1:  # the prefill entry (chunks of 2 or more tokens)
            bench(f"qk_norm_rope_kv_warp n={n}", "kern_qk_norm_rope_kv_warp", (n, cdiv(HQ + HKV, rope_warp_heads(D))),
                  (256,), sets, rope_bytes)

    # decode attention, one sequence, the launch shape of manifests/qwen3-4b-v2.json: kern_attn_decode_partial_wide
    # (gen_qwen3 --decode-attn wide, 256 threads; and the 4-warp kern_attn_decode_partial_early for comparison)
    # with num_splits = 16 (decode_num_splits: 8 kv heads x 16 <= 132 SMs, one wave) and split_tokens = 64 the
    # minimum split (each split's length derived on device from seq_lens), then the reduce; launched without
    # PDL here, so the partial's early reads simply run first. 8 sequences' worth of distinct pages rotate to
    # defeat L2
    num_splits, split_min = 16, 64
    # kern_attn_decode_partial_stream (kernels-src/attention_decode.cu, --decode-attn stream): 64 threads, 36,864
    # bytes of static shared memory; the preferred carveout at 100% as every manifest launch gives it (6 blocks per SM)
    stream_fn = gpu.kernel(STREAM_ENTRY).func
    check(cu.cuFuncSetAttribute(stream_fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                                100), "cuFuncSetAttribute(carveout)")
    for ctx in (128, 1024, 4096):
        pages_per_seq = cdiv(ctx, PAGE)
        n_sets = 8
        cache = gpu.alloc(n_sets * pages_per_seq * PAGE * 2 * HKV * D * 2)
        check(cu.cuMemsetD16(cache.ptr, 0x3C00, cache.nbytes // 2), "cuMemsetD16")  # bf16 1.0 (not zeros)
        used = cdiv(ctx, ref.decode_split_len(ctx, split_min, num_splits))
        q = arr(rand_bits(rng, (1, HQ, D)))
        lens = arr(np.array([ctx], dtype=np.int32))
        po, ml = gpu.alloc(HQ * num_splits * D * 4).ptr, gpu.alloc(HQ * num_splits * 8).ptr
        out = gpu.alloc(HQ * D * 2).ptr
        # the new token's slot (the last position): the row the early entry reloads after its wait
        slots = [arr(np.array([(i * pages_per_seq + (ctx - 1) // PAGE) * PAGE + (ctx - 1) % PAGE], dtype=np.int32))
                 for i in range(n_sets)]
        sets = [[("p", q), ("p", cache.ptr), ("p", arr(np.arange(i * pages_per_seq, (i + 1) * pages_per_seq, dtype=np.int32))),
                 ("p", lens), ("p", slots[i]), ("p", po), ("p", ml), ("i", HQ), ("i", HKV), ("i", D), ("i", PAGE),
                 ("i", pages_per_seq), ("i", n_sets * pages_per_seq), ("i", split_min), ("i", num_splits), ("f", D**-0.5)]
                for i in range(n_sets)]
        red_args = [("p", po), ("p", ml), ("p", lens), ("p", out), ("i", HQ), ("i", D), ("i", split_min), ("i", num_splits)]
        kv_bytes = ctx * HKV * D * 2 * 2
        part_bytes = HQ * num_splits * (D + 2) * 4  # every split writes its row (empty ones zeros)
        for entry, threads in (("kern_attn_decode_partial_early", 128), ("kern_attn_decode_partial_wide", 256)):
            bench(f"{entry[len('kern_'):]} ctx={ctx} splits={num_splits}({used})", entry,
                  (HKV, num_splits, 1), (threads,), sets, kv_bytes + HQ * D * 2 + part_bytes)
        # the stream partial writes only the used splits
        bench(f"{STREAM_ENTRY[len('kern_'):]} ctx={ctx} splits={num_splits}({used})", STREAM_ENTRY,
              (HKV, num_splits, 1), (STREAM_THREADS,), sets, kv_bytes + HQ * D * 2 + HQ * used * (D + 2) * 4)
        bench(f"attn_decode_reduce ctx={ctx}", "kern_attn_decode_reduce", (HQ, 1), (D,), [red_args],
              HQ * used * (D + 2) * 4 + HQ * D * 2)
        kr = gpu.kernel("kern_attn_decode_reduce")
        for label, entry, threads in (("wide", "kern_attn_decode_partial_wide", 256),
                                      ("stream", STREAM_ENTRY, STREAM_THREADS)):
            kp = gpu.kernel(entry)

            def pair(st, a, kp=kp, kr=kr, red_args=red_args, threads=threads):
                kp.launch((HKV, num_splits, 1), (threads,), a, stream=st, sync=False)
                kr.launch((HQ, 1), (D,), red_args, stream=st, sync=False)

            us = time_graph(stream, [lambda st, a=a, pair=pair: pair(st, a) for a in sets])
            nbytes = kv_bytes + HQ * D * 2 * 2
            rows.append((f"attn_decode {label} partial+reduce ctx={ctx}", us, nbytes, nbytes / PEAK_BYTES_PER_S * 1e6,
                         None))

    # batched decode attention (issue 26): `seqs` rows of one query token each, every row at context ctx over its
    # own pages (row r: pages r * pages_per_seq ...), the same launch pair at grid (HKV, num_splits, seqs); the
    # floor is every row's K/V read once. The cache is 2 * seqs * ctx * 16 KiB (ctx 2048, 64 rows: 4.3 GB)
    for seqs, ctx in BATCHED_DECODE:
        pages_per_seq = cdiv(ctx, PAGE)
        cache = gpu.alloc(seqs * pages_per_seq * PAGE * 2 * HKV * D * 2)
        check(cu.cuMemsetD16(cache.ptr, 0x3C00, cache.nbytes // 2), "cuMemsetD16")
        q = arr(rand_bits(rng, (seqs, HQ, D)))
        lens = arr(np.full(seqs, ctx, dtype=np.int32))
        table = arr(np.arange(seqs * pages_per_seq, dtype=np.int32))
        slots = arr(np.array([(r * pages_per_seq + (ctx - 1) // PAGE) * PAGE + (ctx - 1) % PAGE for r in range(seqs)],
                             dtype=np.int32))
        po, ml = gpu.alloc(seqs * HQ * num_splits * D * 4).ptr, gpu.alloc(seqs * HQ * num_splits * 8).ptr
        out = gpu.alloc(seqs * HQ * D * 2).ptr
        part = [("p", q), ("p", cache.ptr), ("p", table), ("p", lens), ("p", slots), ("p", po), ("p", ml), ("i", HQ),
                ("i", HKV), ("i", D), ("i", PAGE), ("i", pages_per_seq), ("i", seqs * pages_per_seq), ("i", split_min),
                ("i", num_splits), ("f", D**-0.5)]
        red = [("p", po), ("p", ml), ("p", lens), ("p", out), ("i", HQ), ("i", D), ("i", split_min), ("i", num_splits)]
        kr = gpu.kernel("kern_attn_decode_reduce")
        nbytes = seqs * (ctx * HKV * D * 2 * 2 + HQ * D * 2 * 2)
        for label, entry, threads in (("wide", "kern_attn_decode_partial_wide", 256),
                                      ("stream", STREAM_ENTRY, STREAM_THREADS)):
            kp = gpu.kernel(entry)

            def batch_pair(st, kp=kp, kr=kr, part=part, red=red, seqs=seqs, threads=threads):
                kp.launch((HKV, num_splits, seqs), (threads,), part, stream=st, sync=False)
                kr.launch((HQ, seqs), (D,), red, stream=st, sync=False)

            us = time_graph(stream, [batch_pair])
            rows.append((f"attn_decode {label} pair seqs={seqs} ctx={ctx}", us, nbytes, nbytes / PEAK_BYTES_PER_S * 1e6,
                         None))
        cache.free()

    # prefill attention: a 512-token chunk with no prefix, one after a 1536-token prefix, a whole 2048 prompt
    for prefix, chunk in ((0, 512), (1536, 512), (0, 2048), (6144, 2048)):
        ctx = prefix + chunk
        pages = cdiv(ctx, PAGE)
        cache = gpu.alloc(pages * PAGE * 2 * HKV * D * 2)
        cache.upload(rand_bits(rng, (pages * PAGE * 2 * HKV * D,)))
        args = [("p", arr(rand_bits(rng, (chunk, HQ, D)))), ("p", cache.ptr), ("p", arr(rng.permutation(pages).astype(np.int32))),
                ("p", arr(np.array([0, chunk], dtype=np.int32))), ("p", arr(np.array([ctx], dtype=np.int32))),
                ("p", gpu.alloc(chunk * HQ * D * 2).ptr), ("i", HQ), ("i", HKV), ("i", D), ("i", PAGE), ("i", pages),
                ("i", pages), ("f", D**-0.5)]
        pairs = chunk * prefix + chunk * (chunk + 1) / 2  # (query, key) pairs attended
        bench(f"attn_prefill prefix={prefix} chunk={chunk}", "kern_attn_prefill", (cdiv(chunk, 16), HKV, 1), (128,), [args],
              ctx * HKV * D * 4 + chunk * HQ * D * 4, flops=4.0 * HQ * D * pairs)
        for name in ("r32", "wg"):
            entry, step_rows, smem, threads = PREFILL_ATTN[name]  # (`rows` is the result table)
            bench(f"attn_prefill_{name} prefix={prefix} chunk={chunk}", entry, (cdiv(chunk, step_rows), HKV, 1),
                  (threads,), [args], ctx * HKV * D * 4 + chunk * HQ * D * 4, flops=4.0 * HQ * D * pairs,
                  shared_mem=smem)

    # argmax over the vocabulary, one row
    chunk = 1024
    num_chunks = cdiv(VOCAB, chunk)
    pv, pi, o = gpu.alloc(num_chunks * 4).ptr, gpu.alloc(num_chunks * 4).ptr, gpu.alloc(8).ptr
    logits = arr(rand_bits(rng, (VOCAB,)))
    bench(f"argmax_partial n={VOCAB} chunks={num_chunks}", "kern_argmax_partial", (num_chunks, 1), (256,),
          [[("p", logits), ("i", VOCAB), ("i", chunk), ("p", pv), ("p", pi), ("i", num_chunks)]], VOCAB * 2 + num_chunks * 8)
    bench("argmax_final", "kern_argmax_final", (1,), (256,), [[("p", pv), ("p", pi), ("i", num_chunks), ("p", o)]],
          num_chunks * 8 + 8)

    # the sampler (kernels-src/sample.cu): a row over cdiv(VOCAB, 8192) = 19 blocks of 512 threads, the last to finish
    # merging, over [rows, VOCAB] bf16 logits (normal x 3), no penalties (they rewrite the logits in place);
    # positions differ per row. Greedy is the short path (one pass, one merge of 19 partials), p=0.9 the candidate
    # path (the nucleus, ~6.5k logits here, among the 8192 candidates), p=0.95 alone the exact path (~13k kept)
    splits = sampler_splits(VOCAB)
    for n_rows in SAMPLE_ROWS:
        n_sets = max(1, cdiv(60_000_000, n_rows * VOCAB * 2))  # rotate past the 50 MB L2
        logit_sets = [arr(rand_bits(rng, (n_rows, VOCAB), 3.0)) for _ in range(min(n_sets, 4))]
        positions = arr(np.arange(n_rows, dtype=np.int32))
        out = gpu.alloc(n_rows * 8).ptr
        work = arr(np.zeros((n_rows, WORK_BYTES_PER_ROW // 4), dtype=np.uint32))  # tickets 0, left at 0
        for label, params in SAMPLE_CASES:
            prm = arr(np.frombuffer(pack_params([params] * n_rows), dtype=np.uint8).copy())
            sets = [[("p", lg), ("p", prm), ("p", positions), ("p", 0), ("p", 0), ("i", 0), ("i", VOCAB), ("p", out),
                     ("p", out + 4 * n_rows), ("p", 0), ("p", work)] for lg in logit_sets]
            bench(f"sample rows={n_rows} {label}", "kern_sample_bf16", (splits, n_rows), (SAMPLE_THREADS,), sets,
                  n_rows * (VOCAB * 2 + 8))

    print(f"{'kernel':46s} {'us':>9s} {'MB moved':>9s} {'floor us':>9s} {'% 4.3TB/s':>10s} {'TFLOP/s':>8s}")
    for name, us, nbytes, floor_us, tflops in rows:
        tf = f"{tflops:8.1f}" if tflops else ""
        print(f"{name:46s} {us:9.2f} {nbytes / 1e6:9.3f} {floor_us:9.2f} {100 * floor_us / us:9.1f}% {tf:>8s}")
    prefill_2k = next(us for name, us, *_ in rows if name == "attn_prefill_wg prefix=0 chunk=2048")
    print(f"2048-token prompt, 36 layers of attn_prefill_wg (the default): {36 * prefill_2k / 1000:.2f} ms "
          "(target well under 15 ms)")
    for ctx in (128, 1024, 4096):
        pair_us = next(us for name, us, *_ in rows if name == f"attn_decode wide partial+reduce ctx={ctx}")
        print(f"decode attention ctx={ctx}: {pair_us:.2f} us per layer, 36 layers {36 * pair_us / 1000:.3f} ms")
    print_decode_attention_table(rows)
    print_sampler_summary(rows)
    gpu.free_all()
    return 0


def print_sampler_summary(rows) -> None:
    """The sampler against docs/perf.md's prediction: greedy at 1 row (the argmax pair it replaced beside it) and
    top-p 0.9 at 1 / 8 / 64 rows."""
    us = {name: t for name, t, *_ in rows}
    argmax = us["argmax_final"] + next(t for name, t in us.items() if name.startswith("argmax_partial"))
    print(f"sampler greedy rows=1: {us['sample rows=1 greedy']:.2f} us (prediction <= 6; argmax partial + final "
          f"{argmax:.2f} us)")
    for n in (1, 8, 64):
        print(f"sampler T=1 p=0.9 rows={n}: {us[f'sample rows={n} T=1 p=0.9']:.2f} us (prediction <= 15)")


if __name__ == "__main__":
    sys.exit(main())
