#!/usr/bin/env bash
# The whole GPU suite on the GPU machine in one call, KERN_REQUIRE_GPU=1 (a GPU test cannot pass by skipping):
# `pytest -m gpu` in five processes at once: tests/kernels (kernel references, no pool sizing: ~1100 tests, ~15
# minutes in one process on the H200, 2026-12-02) in four groups, beside the rest (runtime, pool, caller, parity:
# these size pools from free device memory, so they share one process; ~3 minutes), then tests/harvest alone
# (docs/harvest.md).
# Logs go to $OUT/gpu-<group>.log; a summary line per group and the failures are printed last.
#   source tools/gpu-env.sh && bash tools/gpu-suite.sh [LIMIT_S]     # LIMIT_S per group, default 420
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
OUT="${OUT:-/tmp/kern-out}"; mkdir -p "$OUT"
limit="${1:-420}"
export KERN_REQUIRE_GPU=1
run_group() {  # run_group NAME PYTEST_ARGS...
  local name=$1; shift
  timeout "$limit" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE "$@" >"$OUT/gpu-$name.log" 2>&1
  echo "rc=$?" >>"$OUT/gpu-$name.log"
}
run_group kernels-prefill tests/kernels/test_kernels_gpu.py -k prefill &
run_group kernels-other tests/kernels/test_kernels_gpu.py -k "not prefill" &
run_group kernels-attn-gemv tests/kernels/test_decode_attention_gpu.py tests/kernels/test_gemv_gpu.py \
  tests/kernels/test_gemv_mma_gpu.py tests/kernels/test_gemv_rows_gpu.py tests/kernels/test_gemv_rows_m_gpu.py &
run_group kernels-sample-step tests/kernels --ignore=tests/kernels/test_kernels_gpu.py \
  --ignore=tests/kernels/test_decode_attention_gpu.py --ignore=tests/kernels/test_gemv_gpu.py \
  --ignore=tests/kernels/test_gemv_mma_gpu.py --ignore=tests/kernels/test_gemv_rows_gpu.py \
  --ignore=tests/kernels/test_gemv_rows_m_gpu.py &
run_group rest tests packages --ignore=tests/kernels --ignore=tests/harvest &
wait
run_group harvest tests/harvest  # alone: a torch.compile capture through CUPTI (the cupti-python wheel in .whl/)
# the tiny-en capture the harvest test lays down when missing (tests/data/harvest/tiny-en): back in $OUT to commit
[ -d tests/data/harvest/tiny-en ] && tar czf "$OUT/harvest-tiny-en.tgz" -C tests/data/harvest tiny-en
for name in kernels-prefill kernels-other kernels-attn-gemv kernels-sample-step rest harvest; do
  echo "===== $name: $(grep -E '(passed|failed|error)' "$OUT/gpu-$name.log" | tail -n1) $(tail -n1 "$OUT/gpu-$name.log")"
  grep -E '^(FAILED|ERROR)' "$OUT/gpu-$name.log" | cut -c1-220 | head -n 40
done
