"""Batch-invariant cuBLASLt pins: one algorithm per prefill GEMM shape, found and proven on this GPU.

Why: a prefill GEMM runs at every M from 1 to the chunk maximum. Left to the heuristic, cuBLASLt picks a
different kernel (tile, split-K, stream-K) for different M, and each kernel sums the k products of an output
element in its own order, so the same token's row of `normed @ W^T` differs in its last bits between a
512-token chunk and a 1-token chunk. Those bits reach the KV cache, and with small top-2 margins greedy
decoding diverges (issue 6: chunk=512 vs chunk=1 tokens differed from step 3 on the random 4B checkpoint).
One kernel configuration without split-K, pinned for every M, computes each row the same way whatever the
other rows are ("batch invariance"; He et al., Thinking Machines, "Defeating Nondeterminism in LLM
Inference", 2025). `PinPicker.prefill` finds such a configuration per (n, k) and proves it on this GPU
(search.pick_prefill_pin):

1. candidates: cuBLASLt's heuristic at M = 1, 64, 512 and m_max (up to 24 results each), every configuration
   with SPLITK_NUM <= 1 and no reduction scheme, deduplicated;
2. applicability: cublasLtMatmulAlgoCheck at M = 1 and M = m_max (the runtime checks the same at load);
3. invariance: C = A @ W^T at M = m_max on random bf16 data, then the same rows recomputed as separate GEMMs
   of M in {1, 2, 3, 4, 7, 8, 16, 17, 32, 64, 100, 511, m_max - 1} (each from the start of its own buffer, as a chunk is)
   must equal those rows of C bit for bit;
4. speed: median time at M = 512 and M = m_max (CUDA events over 10 back-to-back calls, 5 repeats); the
   fastest invariant candidate by the sum of the two wins. The heuristic's own choice is timed too.

`PinPicker.decode` picks the fastest configuration at M = 1 (split-K allowed, graph-timed) for a cuBLASLt
decode. `PinPicker.invariant_decode` picks one for the batch-invariant decode (search.pick_invariant_decode_pin):
split-K allowed but never the in-place reduction, proven invariant like a prefill pin over M = 1 .. 64 (the
batched decode's buckets), fastest by the sum of its graph times at M = 1, 8 and 64. Split-K is invariant when
the split does not depend on M: one tile and split count at every M adds each element's k partial sums in one
order whatever the other rows are. The prefill pins do without it: a chunk's M has tiles enough to fill the
GPU, and a split's workspace grows with M. `pins_document` / `pins_text` make the pins file (document.py) that `kern manifest build --algos`
reads. Users: `kern run --weights DIR` on first use of a shape (kern_run.pins_cache), tools/pick_algos.py.
The search is host logic over the `GemmBench` protocol; CPU tests drive it with a numpy bench.
"""

from .bench import DeviceBench
from .document import PINS_FORMAT, pins_document, pins_text
from .picker import PinPicker, cublaslt_version, device_name
from .search import (
    INVARIANT_DECODE_M_MAX, PROBE_MS, GemmBench, Pin, invariant_decode_ms, is_invariant, pick_decode_pin,
    pick_invariant_decode_pin, pick_prefill_pin, probe_ms, reduction_refusal, timed_ms,
)

__all__ = [
    "INVARIANT_DECODE_M_MAX", "PINS_FORMAT", "PROBE_MS", "DeviceBench", "GemmBench", "Pin", "PinPicker",
    "cublaslt_version", "device_name", "invariant_decode_ms", "is_invariant", "pick_decode_pin",
    "pick_invariant_decode_pin", "pick_prefill_pin", "pins_document", "pins_text", "probe_ms", "reduction_refusal",
    "timed_ms",
]
