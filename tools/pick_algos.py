"""Pick one batch-invariant cuBLASLt algorithm per prefill GEMM shape, by timing on this GPU.

Why: a prefill GEMM runs at every M from 1 to the chunk maximum. Left to the heuristic, cuBLASLt picks a
different kernel (tile, split-K, stream-K) for different M, and each kernel sums the k products of an output
element in its own order, so the same token's row of `normed @ W^T` differs in its last bits between a
512-token chunk and a 1-token chunk. Those bits reach the KV cache, and with small top-2 margins greedy
decoding diverges (issue 6: chunk=512 vs chunk=1 tokens differed from step 3 on the random 4B checkpoint).
One kernel configuration without split-K, pinned for every M, computes each row the same way whatever
the other rows are ("batch invariance"; He et al., Thinking Machines, "Defeating Nondeterminism in LLM
Inference", 2025). This tool finds such a configuration per (n, k) and proves it on this GPU:

1. candidates: cuBLASLt's heuristic at M = 1, 64, 512 and m_max (up to 24 results each), every configuration with
   SPLITK_NUM <= 1 and no reduction scheme, deduplicated;
2. applicability: cublasLtMatmulAlgoCheck at M = 1 and M = m_max (the runtime checks the same at load);
3. invariance: C = A @ W^T at M = m_max on random bf16 data, then the same rows recomputed as separate
   GEMMs of M in {1, 2, 3, 4, 7, 8, 16, 17, 32, 64, 100, 511, m_max - 1} (each from the start of its own buffer,
   as a chunk is; 1 .. 64 in powers of two are the batched decode's buckets, which `--batch-invariant` manifests
   run on these pins too) must equal those rows of C bit for bit;
4. speed: median time at M = 512 and M = m_max (CUDA events over 10 back-to-back calls, 5 repeats);
   the fastest invariant candidate by the sum of the two wins. The heuristic's own choice is timed too.

`--lm-head` adds each config's lm_head shape (vocab x hidden) to the pinned shapes: `kern manifest build
--batch-invariant` runs the decode's lm_head on it (without it, on a decode pin without split-K, unproven).

Writes JSON (`--out`, default stdout) read by `kern manifest build --algos`:

    {"format": "kern-cublaslt-pins/1", "device": "...", "cublaslt_version": 130xxx, "m_max": 2048,
     "pins": [{"n": 6144, "k": 2560, "algo": {"id": .., "tile": .., ...}, "us_512": .., "us_max": ..,
               "heuristic_us_512": .., "heuristic_us_max": .., "heuristic_invariant": false}, ...]}

Host-side refusals (exit 2, one line on stderr, before the device is touched): an unknown --shape, a --config
that cannot be read, is not UTF-8 JSON or holds a value the builder (kern_run.models.qwen3) refuses (named by
key), a --tp below 1 or not dividing every shape's q / kv heads and MLP width, an --m-max below 1, a malformed --keep-pins file,
no shape to pick. Then no CUDA device, or --keep-pins --decode stamped by another device or cuBLASLt.

Run on the GPU machine (needs a CUDA device, cuda-bindings and nvmath-python):

    python tools/pick_algos.py --shape qwen3-4b --shape qwen3-0.6b --shape tiny \
        --config models/qwen3-tiny-en/config.json --tp 1 --tp 2 --m-max 2048 --out manifests/algos/h200.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

PROBE_MS = (1, 2, 3, 4, 7, 8, 16, 17, 32, 64, 100, 511)
TIMED_MS = (512,)


def gemm_shapes(cfg: Any, tp: int) -> list[tuple[int, int]]:
    """(n, k) of the four prefill projections of one rank (qkv, o, gate_up, down), as kern_run.models.qwen3
    wires them at tp 1 and for tensor-parallel ranks (column-parallel qkv/gate_up: n / tp; row-parallel o/down: k / tp)."""
    D, H = cfg.head_dim, cfg.hidden
    q, kv, inter = cfg.q_heads * D // tp, cfg.kv_heads * D // tp, cfg.intermediate // tp
    return [(q + 2 * kv, H), (H, q), (2 * inter, H), (H, inter)]


def bf16(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    """Random bf16 (as uint16 bits, round to nearest even) of N(0, scale^2)."""
    x = (rng.standard_normal(shape, dtype=np.float32) * scale).view(np.uint32)
    return ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16)


class Bench:
    """Device buffers, a stream and events for one (n, k) shape at M up to m_max."""

    def __init__(self, blas: Any, n: int, k: int, m_max: int, seed: int) -> None:
        from kern_runtime.cuda import call

        self.call, self.blas, self.n, self.k, self.m_max = call, blas, n, k, m_max
        rng = np.random.default_rng(seed)
        self.host_a = bf16(rng, (m_max, k), 1.0)
        host_w = bf16(rng, (n, k), k ** -0.5)
        self.a, self.a2, self.w = (int(call("cuMemAlloc", m_max * k * 2)), int(call("cuMemAlloc", m_max * k * 2)),
                                   int(call("cuMemAlloc", n * k * 2)))
        self.c, self.c2 = int(call("cuMemAlloc", m_max * n * 2)), int(call("cuMemAlloc", m_max * n * 2))
        call("cuMemcpyHtoD", self.a, self.host_a.ctypes.data, self.host_a.nbytes)
        call("cuMemcpyHtoD", self.w, host_w.ctypes.data, host_w.nbytes)
        self.stream = call("cuStreamCreate", 1)
        self.start, self.stop = call("cuEventCreate", 0), call("cuEventCreate", 0)

    def close(self) -> None:
        for ptr in (self.a, self.a2, self.w, self.c, self.c2):
            self.call("cuMemFree", ptr)
        self.call("cuEventDestroy", self.start)
        self.call("cuEventDestroy", self.stop)
        self.call("cuStreamDestroy", self.stream)

    def gemm(self, a: int, c: int, m: int) -> Any:
        from kern_runtime.cuda import gemm_call

        return gemm_call("cublaslt_bf16_tn", (a, self.w, c, m, self.n, self.k), f"pick_algos n={self.n} k={self.k}")

    def run(self, a: int, c: int, m: int, pin: dict[str, int] | None) -> None:
        self.blas.matmul(self.gemm(a, c, m), int(self.stream), pin, "pick_algos")

    def rows(self, c: int, m: int) -> np.ndarray:
        self.call("cuStreamSynchronize", self.stream)
        out = np.empty((m, self.n), dtype=np.uint16)
        self.call("cuMemcpyDtoH", out.ctypes.data, c, out.nbytes)
        return out

    def invariant(self, pin: dict[str, int] | None) -> bool:
        """Rows recomputed at small M equal the M = m_max result bit for bit (module docstring, step 3)."""
        self.run(self.a, self.c, self.m_max, pin)
        full = self.rows(self.c, self.m_max)
        for m in [p for p in PROBE_MS if p < self.m_max] + [self.m_max - 1]:
            r0 = (self.m_max - m) // 2
            self.call("cuMemcpyDtoD", self.a2, self.a + r0 * self.k * 2, m * self.k * 2)
            self.run(self.a2, self.c2, m, pin)
            if not np.array_equal(self.rows(self.c2, m), full[r0:r0 + m]):
                return False
        return True

    def time_us(self, m: int, pin: dict[str, int] | None, reps: int = 5, burst: int = 10) -> float:
        call = self.call
        for _ in range(3):
            self.run(self.a, self.c, m, pin)
        samples = []
        for _ in range(reps):
            call("cuEventRecord", self.start, self.stream)
            for _ in range(burst):
                self.run(self.a, self.c, m, pin)
            call("cuEventRecord", self.stop, self.stream)
            call("cuEventSynchronize", self.stop)
            samples.append(float(call("cuEventElapsedTime", self.start, self.stop)) * 1000.0 / burst)
        return statistics.median(samples)


    def time_graph_us(self, m: int, pin: dict[str, int] | None, reps: int = 7, burst: int = 20) -> float:
        """Median us per GEMM of `burst` back-to-back GEMMs captured in one CUDA graph (no host in the way:
        what a GEMM costs inside kern's captured decode step)."""
        from cuda.bindings import driver

        call = self.call
        self.run(self.a, self.c, m, pin)  # plan outside the capture
        call("cuStreamBeginCapture", self.stream, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
        try:
            for _ in range(burst):
                self.run(self.a, self.c, m, pin)
        finally:
            graph = call("cuStreamEndCapture", self.stream)
        try:
            exec_ = call("cuGraphInstantiate", graph, 0)
        finally:
            call("cuGraphDestroy", graph)
        try:
            call("cuGraphLaunch", exec_, self.stream)
            samples = []
            for _ in range(reps):
                call("cuEventRecord", self.start, self.stream)
                call("cuGraphLaunch", exec_, self.stream)
                call("cuEventRecord", self.stop, self.stream)
                call("cuEventSynchronize", self.stop)
                samples.append(float(call("cuEventElapsedTime", self.start, self.stop)) * 1000.0 / burst)
        finally:
            call("cuGraphExecDestroy", exec_)
        return statistics.median(samples)


def algo_config(algo: np.ndarray) -> dict[str, int]:
    """Every pinnable attribute of a cublasLtMatmulAlgo_t (kern_runtime.cuda.blas.ALGO_KEYS)."""
    from nvmath.bindings import cublasLt as lt

    from kern_runtime.cuda import ALGO_KEYS

    out = {}
    for key, name in ALGO_KEYS.items():
        attr = getattr(lt.MatmulAlgoConfigAttribute, name)
        buf = np.zeros(1, dtype=lt.get_matmul_algo_config_attribute_dtype(attr))
        written = np.zeros(1, dtype=np.uint64)
        lt.matmul_algo_config_get_attribute(algo.ctypes.data, int(attr), buf.ctypes.data, buf.nbytes,
                                            written.ctypes.data)
        out[key] = int(buf[0])
    return out


def candidates(bench: Bench, ms: list[int], count: int = 24, split_k: bool = False) -> list[dict[str, int]]:
    """Distinct heuristic configurations at each M; with no split-K and no reduction scheme unless `split_k`."""
    from nvmath.bindings import cublasLt as lt

    from kern_runtime.cuda import WORKSPACE_BYTES, alignment_bytes, blas_call

    blas, seen, out = bench.blas, set(), []
    for m in ms:
        g = bench.gemm(bench.a, bench.c, m)
        desc, a, b, c = blas.describe_gemm(g)
        pref = blas_call("cublasLtMatmulPreferenceCreate", lt.matmul_preference_create)
        try:
            P = lt.MatmulPreferenceAttribute
            for attr, value, dtype in ((P.MAX_WORKSPACE_BYTES, WORKSPACE_BYTES, np.uint64),
                                       (P.MIN_ALIGNMENT_A_BYTES, alignment_bytes(g.w), np.uint32),
                                       (P.MIN_ALIGNMENT_B_BYTES, alignment_bytes(g.a), np.uint32),
                                       (P.MIN_ALIGNMENT_C_BYTES, alignment_bytes(g.c), np.uint32),
                                       (P.MIN_ALIGNMENT_D_BYTES, alignment_bytes(g.c), np.uint32)):
                buf = np.array([value], dtype=dtype)
                blas_call("cublasLtMatmulPreferenceSetAttribute", lt.matmul_preference_set_attribute, pref,
                          int(attr), buf.ctypes.data, buf.nbytes)
            results = np.zeros(count, dtype=lt.matmul_heuristic_result_dtype)
            found = np.zeros(1, dtype=np.int32)
            blas_call("cublasLtMatmulAlgoGetHeuristic", lt.matmul_algo_get_heuristic, blas.handle, desc, a, b, c, c,
                      pref, count, results.ctypes.data, found.ctypes.data)
        finally:
            lt.matmul_preference_destroy(pref)
            for layout in (a, b, c):
                lt.matrix_layout_destroy(layout)
            lt.matmul_desc_destroy(desc)
        for i in range(int(found[0])):
            algo = np.zeros(1, dtype=lt.matmul_algo_dtype)
            algo[0] = results[i]["algo"]
            cfg = algo_config(algo)
            if not split_k and (cfg["split_k"] > 1 or cfg["reduction"] != 0):
                continue
            pin = {k: v for k, v in cfg.items() if k == "id" or v != 0 or k == "split_k"}
            key = tuple(sorted(pin.items()))
            if key not in seen:
                seen.add(key)
                out.append(pin)
    return out


def pick(blas: Any, n: int, k: int, m_max: int, log: Any) -> dict[str, Any]:
    from kern_runtime import KernelArtifactError

    bench = Bench(blas, n, k, m_max, seed=n * 131 + k)
    try:
        timed = sorted({m for m in TIMED_MS if m < m_max} | {m_max})
        heur = {m: bench.time_us(m, None) for m in timed}
        heur_inv = bench.invariant(None)
        best: tuple[float, dict[str, int], dict[int, float]] | None = None
        cands = candidates(bench, sorted({m_max, 1, 64, 512} & set(range(1, m_max + 1))))
        tried = 0
        for pin in cands:
            try:
                blas.plan(bench.gemm(bench.a, bench.c, 1), pin, "pick_algos")
                blas.plan(bench.gemm(bench.a, bench.c, m_max), pin, "pick_algos")
            except KernelArtifactError:
                continue
            tried += 1
            if not bench.invariant(pin):
                log(f"  n={n} k={k} {pin}: not batch-invariant")
                continue
            times = {m: bench.time_us(m, pin) for m in timed}
            total = sum(times.values())
            log(f"  n={n} k={k} {pin}: invariant, " + ", ".join(f"M={m} {t:.1f} us" for m, t in times.items()))
            if best is None or total < best[0]:
                best = (total, pin, times)
        if best is None:
            raise SystemExit(f"pick_algos: no batch-invariant cuBLASLt configuration for n={n} k={k} "
                             f"({len(cands)} candidates, {tried} applicable)")
        _, pin, times = best
        row = {"n": n, "k": k, "algo": pin}
        row.update({f"us_{m}" if m != m_max else "us_max": round(t, 2) for m, t in times.items()})
        row.update({f"heuristic_us_{m}" if m != m_max else "heuristic_us_max": round(t, 2) for m, t in heur.items()})
        row["heuristic_invariant"] = heur_inv
        row["candidates"] = len(cands)
        return row
    finally:
        bench.close()


def pick_m1(blas: Any, n: int, k: int, log: Any) -> dict[str, Any]:
    """The fastest configuration at M = 1 (decode: no invariance needed, split-K allowed), graph-timed, against
    the heuristic's own choice."""
    from kern_runtime import KernelArtifactError

    bench = Bench(blas, n, k, 1, seed=n * 131 + k)
    try:
        heur = bench.time_graph_us(1, None)
        best: tuple[float, dict[str, int]] | None = None
        cands = candidates(bench, [1], count=32, split_k=True)
        for pin in cands:
            try:
                blas.plan(bench.gemm(bench.a, bench.c, 1), pin, "pick_algos")
            except KernelArtifactError:
                continue
            t = bench.time_graph_us(1, pin)
            log(f"  M=1 n={n} k={k} {pin}: {t:.2f} us")
            if best is None or t < best[0]:
                best = (t, pin)
        if best is None:
            raise SystemExit(f"pick_algos: no applicable cuBLASLt configuration at M = 1 for n={n} k={k}")
        return {"n": n, "k": k, "algo": best[1], "us_1": round(best[0], 2), "heuristic_us_1": round(heur, 2),
                "candidates": len(cands)}
    finally:
        bench.close()


def main(argv: list[str] | None = None) -> int:
    from kern_run.files import write_files
    from kern_run.models import qwen3 as gq

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", default=[], help="a known shape of kern_run.models.qwen3 (repeatable)")
    ap.add_argument("--config", action="append", default=[], help="a Hugging Face config.json (repeatable)")
    ap.add_argument("--tp", action="append", type=int, default=[], help="tensor-parallel degrees (default 1)")
    ap.add_argument("--m-max", type=int, default=2048, help="largest M (tokens var max) the pins must serve")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--out", type=Path, help="JSON output (default stdout)")
    ap.add_argument("--keep-pins", type=Path, help="take the prefill pins (and m_max) from this pins file instead of "
                                                   "picking them again (with --decode: add decode pins to it; "
                                                   "with --lm-head: add the lm_head pins it lacks)")
    ap.add_argument("--lm-head", action="store_true",
                    help="also pin each config's lm_head shape (vocab x hidden), proven like the prefill pins "
                         "(what --batch-invariant manifests decode the lm_head with)")
    ap.add_argument("--decode", action="store_true",
                    help="also pick the fastest M = 1 configuration per shape (split-K allowed) for cuBLASLt decode "
                         "(`decode_pins`; the lm_head shape included)")
    args = ap.parse_args(argv)

    def refuse(msg: str) -> int:
        print(f"pick_algos: {msg}", file=sys.stderr)
        return 2

    # everything the host can check comes before the device
    unknown = [s for s in args.shape if s not in gq.SHAPES]
    if unknown:
        return refuse(f"--shape {unknown[0]!r} is not a known shape ({', '.join(sorted(gq.SHAPES))})")
    configs = [gq.Qwen3Config.from_name(s) for s in args.shape]
    labels = [f"--shape {s}" for s in args.shape]
    for c in args.config:
        try:  # ManifestBuildError names the file and the key (Qwen3Config.from_json checks types and ranges)
            configs.append(gq.Qwen3Config.from_json(gq.read_json_file(Path(c))[0], c))
        except gq.ManifestBuildError as exc:
            return refuse(f"--config {exc}")
        labels.append(f"--config {c}")
    if not configs and (args.decode or args.lm_head or not args.keep_pins):
        return refuse("no shapes to pick: pass --shape or --config")
    for tp in args.tp:  # gemm_shapes divides by tp as kern_run.models.qwen3.shard_config does: exactly
        if tp < 1:
            return refuse(f"--tp {tp}: a tensor-parallel degree is >= 1")
        for label, cfg in zip(labels, configs):
            for what, n in (("num_attention_heads", cfg.q_heads), ("num_key_value_heads", cfg.kv_heads),
                            ("intermediate_size", cfg.intermediate)):
                if n % tp:
                    return refuse(f"--tp {tp}: {what} {n} of {label} is not divisible by it")
    if args.m_max < 1:
        return refuse(f"--m-max {args.m_max}: the largest M must be >= 1")
    kept = None
    if args.keep_pins:
        try:  # the builder must accept the file we write: its format, stamp and every pin checked as it will be
            gq.load_algos(args.keep_pins, 1)
            kept = json.loads(args.keep_pins.read_text(encoding="utf-8"))
        except (OSError, gq.ManifestBuildError) as exc:
            return refuse(f"--keep-pins: {exc}")

    from kern_run.errors import RefusalError
    from kern_run.preflight import probe_device

    try:
        probe_device(args.gpu)
    except RefusalError as exc:
        return refuse(str(exc))

    from nvmath.bindings import cublasLt as lt

    from kern_runtime.cuda import WORKSPACE_BYTES, Blas
    from kern_runtime.cuda import call

    shapes = sorted({s for cfg in configs for tp in (args.tp or [1]) for s in gemm_shapes(cfg, tp)})
    gemm_shapes_all = list(shapes)
    call("cuInit", 0)
    device = call("cuDeviceGet", args.gpu)
    ctx = call("cuDevicePrimaryCtxRetain", device)
    call("cuCtxSetCurrent", ctx)
    name = call("cuDeviceGetName", 256, device)
    name = (name.decode() if isinstance(name, bytes) else str(name)).split("\x00")[0]
    version = int(lt.get_version())
    if (kept is not None and (args.decode or args.lm_head)
            and (name, version) != (kept["device"], kept["cublaslt_version"])):
        return refuse(f"--keep-pins {args.keep_pins} was picked on {kept['device']} with cuBLASLt "
                      f"{kept['cublaslt_version']}, this is {name} with cuBLASLt {version}: pins picked here "
                      "would not match its stamp; drop --keep-pins to pick every pin on this device")
    workspace = int(call("cuMemAlloc", WORKSPACE_BYTES))
    blas = Blas(workspace)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    lm_heads = sorted({(cfg.vocab, cfg.hidden) for cfg in configs})
    pins = []
    if kept is not None:
        pins, args.m_max = list(kept["pins"]), int(kept["m_max"])
        shapes = []  # kept as they are
    for n, k in sorted(set(shapes) | (set(lm_heads) if args.lm_head else set())):
        if any((p["n"], p["k"]) == (n, k) for p in pins):
            continue
        log(f"n={n} k={k}")
        pins.append(pick(blas, n, k, args.m_max, log))  # after the kept ones, in (n, k) order
    decode_pins = []
    if args.decode:
        for n, k in sorted(set(gemm_shapes_all) | set(lm_heads)):
            decode_pins.append(pick_m1(blas, n, k, log))
    blas.close()
    stamp = kept if kept is not None else {"device": name, "cublaslt_version": version}  # the kept pins' device
    doc = {"format": "kern-cublaslt-pins/1", "device": stamp["device"], "cublaslt_version": stamp["cublaslt_version"],
           "m_max": args.m_max, "pins": pins}
    if args.decode:
        doc["decode_pins"] = decode_pins
    elif kept is not None and "decode_pins" in kept:
        doc["decode_pins"] = kept["decode_pins"]  # nothing of the kept file is dropped
    text = json.dumps(doc, indent=1) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_files({args.out: text})  # through a temporary file: never a half-written pins file
    else:
        sys.stdout.write(text)
    log(f"{'n':>7} {'k':>6} {'pinned us@512':>13} {'heur us@512':>11} {'pinned us@max':>13} {'heur us@max':>11} heur-inv")
    for p in [p for p in pins if "us_max" in p and (not kept or p not in kept["pins"])]:
        log(f"{p['n']:>7} {p['k']:>6} {p.get('us_512', 0):>13.1f} {p.get('heuristic_us_512', 0):>11.1f} "
            f"{p['us_max']:>13.1f} {p['heuristic_us_max']:>11.1f} {p['heuristic_invariant']}")
    if decode_pins:
        log(f"{'n':>7} {'k':>6} {'M=1 pinned us':>13} {'M=1 heur us':>11}  (graph-timed)")
        for p in decode_pins:
            log(f"{p['n']:>7} {p['k']:>6} {p['us_1']:>13.2f} {p['heuristic_us_1']:>11.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
