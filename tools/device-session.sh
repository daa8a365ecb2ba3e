#!/usr/bin/env bash
# One consolidated GPU-machine call: run the named steps in order, each under a time limit, logging to
# $OUT/<step>.log, and print a summary table last. Steps never stop the session (a failing step is
# reported). Usage (from the repo root, on the GPU machine):
#   bash tools/device-session.sh runtime kernels gemv tiny parity-tiny ckpt-4b run-4b parity-4b bench-load pool-gpu bench-park
#   bash tools/device-session.sh multigpu   (2 GPUs: tests/multigpu, bench/peer_barrier.py, TP=2 vs TP=1 text on the 4B shape)
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
source tools/gpu-env.sh
OUT="${OUT:-/tmp/kern-out}"; mkdir -p "$OUT"
W="${KERN_WEIGHTS:-/tmp/kern-weights}"; mkdir -p "$W"
summary=()
step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s.%N)
  echo "=== $name: $*"
  timeout "$limit" bash -c "$*" >"$OUT/$name.log" 2>&1
  local rc=$? t1=$(date +%s.%N)
  tail -n "${KERN_TAIL:-25}" "$OUT/$name.log"
  summary+=("$(printf '%-14s rc=%-4s %6.1fs  %s' "$name" "$rc" "$(python3 -c "print($t1 - $t0)")" "$(grep -E 'passed|failed|error' "$OUT/$name.log" | tail -n1 | cut -c1-90)")")
}
export KERN_REQUIRE_GPU=1
for s in "$@"; do
  case "$s" in
    runtime)     step runtime 240 "python3 -m pytest tests/runtime -q -p no:cacheprovider -rs" ;;  # GPU + CPU (fake-driver) tests
    kernels)     step kernels 300 "python3 -m pytest tests/kernels -q -p no:cacheprovider -rf" ;;
    gemv-bench)  step gemv-bench 180 "python3 bench/gemv.py" ;;
    kern-bench)  step kern-bench 120 "python3 bench/kernels.py" ;;
    sample-phases) step sample-phases 240 "python3 bench/sample_phases.py --json $OUT/sample-phases.json" ;;  # the sampler's per-phase us (nvcc -DSAMPLE_PROFILE at run time), ~1-2 min
    tiny)        step tiny 120 "python3 tools/make_checkpoint.py --shape tiny --out $W/qwen3-tiny && python3 -m kern_run.cli run --target tiny --weights $W/qwen3-tiny --prompt 'The capital of France is' --steps 32 --log-level info" ;;
    parity-tiny) step parity-tiny 240 "python3 -m pytest tests/parity -q -p no:cacheprovider" ;;
    ckpt-4b)     step ckpt-4b 120 "python3 tools/make_checkpoint.py --shape qwen3-4b --out $W/qwen3-4b" ;;
    run-4b)      step run-4b 150 "python3 -m kern_run.cli run --target qwen3-4b --weights $W/qwen3-4b --prompt 'The capital of France is' --steps 128 --log-level info && python3 -m kern_run.cli run --target qwen3-4b --weights $W/qwen3-4b --prompt 'The capital of France is' --steps 32 --eager" ;;
    parity-4b)   step parity-4b 300 "python3 tools/parity.py --shape qwen3-4b --ckpt $W/qwen3-4b" ;;
    bench-load)  step bench-load 180 "python3 bench/load.py --gib 4 && python3 bench/load.py --gib 4 --layout cols" ;;
    prefix-4b)   step prefix-4b 180 "python3 tools/make_checkpoint.py --shape qwen3-4b --out $W/qwen3-4b && bash tools/prefix-demo.sh $W/qwen3-4b --target qwen3-4b" ;;
    tiny-en)     step tiny-en 180 "python3 -m pytest tests/parity/test_tiny_en_gpu.py -q -s -p no:cacheprovider" ;;
    hf-peer)     step hf-peer 150 "python3 bench/decode.py --ckpt $W/qwen3-4b --only hf --hf-steps 16 --contexts 128" ;;
    prefix)      step prefix 120 "python3 -m pytest tests/run/test_prefix_gpu.py -q -p no:cacheprovider" ;;
    multigpu)    bash "$0" mg-tests mg-barrier tp-parity-4b tp-parity-en ;;
    # mg-*: need 2 GPUs (nvidia-h200-x2); NCCL_NVLS_ENABLE=0 comes from gpu-env.sh and is forced again by kern
    mg-tests)    step mg-tests 240 "python3 -m pytest tests/multigpu -q -p no:cacheprovider -rs"
                 ;;
    mg-barrier)  step mg-barrier 60 "python3 bench/peer_barrier.py && python3 bench/peer_barrier.py --drop 1" ;;
    mg-tp-4b)    step mg-tp-4b 300 "python3 tools/tp_parity.py --shape qwen3-4b --ckpt $W/qwen3-4b --tp 2" ;;  # = tp-parity-4b (the old text cmp failed at bf16 ties by design)
    pick-algos)  step pick-algos 330 "python3 tools/pick_algos.py --shape qwen3-4b --shape qwen3-0.6b --shape tiny --config models/qwen3-tiny-en/config.json --tp 1 --tp 2 --m-max 2048 --out $OUT/h200.json && mkdir -p manifests/algos && cp $OUT/h200.json manifests/algos/h200.json && python3 tools/regen_manifests.py" ;;  # then fetch h200.json into manifests/algos/
    default-run) step default-run 90 "python3 -m kern_run.cli run --prompt 'The capital of France is' --steps 48 && python3 -m kern_run.cli inspect manifests/qwen3-tiny-en-gemm.json | tail -3" ;;  # README's first command (default target)
    pick-decode) step pick-decode 200 "python3 tools/pick_algos.py --shape qwen3-4b --shape qwen3-0.6b --shape tiny --config models/qwen3-tiny-en/config.json --tp 1 --tp 2 --keep-pins manifests/algos/h200.json --decode --out $OUT/h200.json && cp $OUT/h200.json manifests/algos/h200.json && python3 tools/regen_manifests.py" ;;  # M = 1 pins added; fetch h200.json
    chunk-4b)    step chunk-4b 200 "python3 -m kern_run.cli test --against chunk1 --manifest manifests/qwen3-4b-v2.json --weights $W/qwen3-4b --prompts 3 --steps 128" ;;  # after ckpt-4b
    tp-parity-4b) step tp-parity-4b 420 "python3 tools/tp_parity.py --shape qwen3-4b --ckpt $W/qwen3-4b --tp 2" ;;  # 2 GPUs
    tp-parity-4b-gemv) step tp-parity-4b-gemv 420 "python3 tools/tp_parity.py --shape qwen3-4b --ckpt $W/qwen3-4b --tp 2 --m1-gemv" ;;  # 2 GPUs; decode projections on kern_gemv_rows
    tp-parity-en) step tp-parity-en 240 "python3 tools/tp_parity.py --config models/qwen3-tiny-en/config.json --ckpt models/qwen3-tiny-en --tp 2 --max-context 2048" ;;  # 2 GPUs
    kernels-small) step kernels-small 240 "python3 -m pytest tests/kernels/test_kernels_gpu.py tests/kernels/test_step_gpu.py tests/run/test_decode_pdl_sass.py -q -p no:cacheprovider -rf" ;;  # rope, embed, argmax, attention, step + the PDL SASS check
    gemv-rms)    step gemv-rms 120 "python3 -m pytest tests/kernels/test_gemv_rows_gpu.py tests/kernels/test_gemv_gpu.py -q -p no:cacheprovider -rf -k rmsnorm" ;;
    gemm-breakdown) step gemm-breakdown 200 "python3 -m kern_run.cli manifest build --shape qwen3-4b --decode gemm --algos manifests/algos/h200.json --out /tmp/qwen3-4b-gemm.json && python3 bench/decode.py --ckpt $W/qwen3-4b --only kern --variants manifests/qwen3-4b-v2.json,/tmp/qwen3-4b-gemm.json --contexts 128 --breakdown" ;;  # after ckpt-4b
    pool-gpu)    step pool-gpu 240 "python3 -m pytest tests/runtime/test_pool_gpu.py tests/run/test_prefix_gpu.py -q -x -p no:cacheprovider" ;;
    bench-park)  step bench-park 120 "python3 bench/park_wake.py" ;;
    bench-decode)  step bench-decode 420 "python3 bench/decode.py --ckpt $W/qwen3-4b --breakdown --compile-timeout 150 --budget 330" ;;  # after ckpt-4b; ~5-6 min
    bench-decode-v2) step bench-decode-v2 240 "python3 bench/decode.py --ckpt $W/qwen3-4b --only kern --variants manifests/qwen3-4b.json,manifests/qwen3-4b-v2.json --breakdown" ;;  # after ckpt-4b; v1 vs v2 kern only, ~60-90 s
    gemv-v2)     step gemv-v2 300 "python3 -m pytest tests/kernels/test_gemv_rows_gpu.py tests/kernels/test_kernels_gpu.py tests/parity/test_parity_v2_gpu.py -q -p no:cacheprovider -k 'rows or swiglu or fast or v2'" ;;  # decode v2 entries + tiny v2 parity
    bench-prefill) step bench-prefill 240 "python3 bench/prefill.py --ckpt $W/qwen3-4b" ;;  # after ckpt-4b; ~2-3 min
    prefill-profile) step prefill-profile 300 "python3 bench/prefill_profile.py --ckpt $W/qwen3-4b --n \${KERN_PROMPT:-8192} --chunk \${KERN_CHUNK:-2048}" ;;  # after ckpt-4b; kernel ms by class, kern vs transformers
    prefill-attn) step prefill-attn 180 "python3 bench/prefill_attention.py --entry kern_attn_prefill_r32 --entry kern_attn_prefill_wg --reps 7 --cases 0+512,0+2048,1536+512,7680+512,7168+1024,6144+2048,14336+2048" ;;  # the prefill attention entries alone, side by side
    prefill-ncu) step prefill-ncu 240 "ncu --kernel-name \${KERN_ENTRY:-kern_attn_prefill_wg} --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy python3 bench/prefill_attention.py --entry \${KERN_ENTRY:-kern_attn_prefill_wg} --prefix 6144 --chunk 2048 --reps 3" ;;  # Nsight Compute sections of one 6144 + 2048 chunk
    profile)     step profile 300 "ncu --profile-from-start off --clock-control none --cache-control none --csv --page raw --metrics \$(python3 bench/profile_step.py --metrics) --log-file $OUT/ncu.csv python3 bench/profile_step.py --ckpt $W/qwen3-4b --manifest \${KERN_PROFILE_MANIFEST:-manifests/qwen3-4b-v2.json} && python3 bench/profile_step.py --summarize $OUT/ncu.csv" ;;  # after ckpt-4b; ncu per-kernel table of one eager decode step
    ab)          step ab 400 "python3 bench/decode.py --ckpt $W/qwen3-4b --only kern --contexts 128,4096 --steps 256 --variants \$KERN_AB" ;;  # after ckpt-4b; KERN_AB = comma list of manifests, side by side
    timeline)    step timeline 240 "python3 bench/profile_step.py --graph --steps 20 --trace $OUT/trace-\${KERN_CTX:-128}.json --ckpt $W/qwen3-4b --ctx \${KERN_CTX:-128} --manifest \${KERN_PROFILE_MANIFEST:-manifests/qwen3-4b-v2.json}" ;;  # after ckpt-4b; CUPTI (torch.profiler) trace of graph steps: per-op time on the critical path
    decode-variants) step decode-variants 400 "python3 tools/decode_variants.py --out /tmp/variants --only=\${KERN_VARIANTS:-} && python3 bench/decode.py --ckpt $W/qwen3-4b --only kern --contexts 128,4096 --steps 256 --variants \$(cat /tmp/variants/list)" ;;  # after ckpt-4b; tools/decode_variants.py names them
    # issue 25's done-when and the other sizes (the 2026-12-02 plan; a session holds 30 device-minutes):
    wheels-1.7b) step wheels-1.7b 240 "python3 tools/make_checkpoint.py --shape qwen3-1.7b --out $W/qwen3-1.7b && rm -rf /tmp/fresh /tmp/fresh-cache && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fresh .dist/*.whl .whl/*.whl && cd /tmp && for i in 1 2; do env -u PYTHONPATH PYTHONPATH=/tmp/fresh XDG_CACHE_HOME=/tmp/fresh-cache /tmp/fresh/bin/kern run --weights $W/qwen3-1.7b --steps 32 --prompt 'The capital of France is' || exit 1; done" ;;  # carry .dist (uv build --all-packages -o .dist) and .whl; a fresh install from the wheels alone, first run then reuse
    parity-1.7b) step parity-1.7b 300 "python3 tools/parity.py --shape qwen3-1.7b --ckpt $W/qwen3-1.7b" ;;  # the manifest kern run --weights builds (pins picked on first use)
    parity-8b)   step parity-8b 420 "python3 tools/parity.py --shape qwen3-8b --ckpt $W/qwen3-8b" ;;
    run-14b)     step run-14b 300 "python3 tools/make_checkpoint.py --shape qwen3-14b --out $W/qwen3-14b && python3 -m kern_run.cli run --weights $W/qwen3-14b --steps 32 --ignore-eos --prompt 'The capital of France is' --log-level info; rc=\$?; rm -rf $W/qwen3-14b; exit \$rc" ;;
    run-32b)     step run-32b 420 "mkdir -p \${KERN_BIG:-/dev/shm/kern-weights} && python3 tools/make_checkpoint.py --shape qwen3-32b --out \${KERN_BIG:-/dev/shm/kern-weights}/qwen3-32b && python3 -m kern_run.cli run --weights \${KERN_BIG:-/dev/shm/kern-weights}/qwen3-32b --steps 32 --ignore-eos --prompt 'The capital of France is' --log-level info; rc=\$?; rm -rf \${KERN_BIG:-/dev/shm/kern-weights}/qwen3-32b; exit \$rc" ;;  # 65.5 GB: more than the 64 GiB disk, so in memory (KERN_BIG)
    bench-sizes) step bench-sizes 560 "for s in qwen3-1.7b qwen3-8b; do python3 tools/make_checkpoint.py --shape \$s --out $W/\$s && python3 -m kern_run.cli manifest build --config $W/\$s/config.json --name \$s-v2 --gemv v2 --seqs-max 64 --out /tmp/\$s-v2.json && python3 bench/decode.py --ckpt $W/\$s --manifest /tmp/\$s-v2.json --only kern,torch-compile --contexts 128,2048 --compile-timeout 150 --budget 250 --json $OUT/bench-\$s.json; done" ;;  # bs = 1 at 1.7B and 8B, torch.compile beside (the 4B: bench-decode)
    # issue 26 / 27 / 31:
    rows-batch)  step rows-batch 200 "python3 -m kern_run.cli manifest build --shape qwen3-4b --name qwen3-4b-rows --gemv v2 --seqs-max 64 --batch-proj rows --algos manifests/algos/h200.json --out /tmp/qwen3-4b-rows.json && for m in manifests/qwen3-4b-v2.json /tmp/qwen3-4b-rows.json; do python3 bench/decode.py --batch 1,2,4,8 --contexts 128,2048 --manifest \$m --ckpt $W/qwen3-4b --steps 48 --rounds 3 --only kern; done" ;;  # after ckpt-4b; the multi-row GEMVs (2..8 rows) against cuBLASLt
    serve-bench) step serve-bench 580 "python3 bench/serve.py --ckpt $W/qwen3-4b --json $OUT/bench-serve.json \$( [ -f .traces/mooncake_conversation_trace.jsonl ] && echo --trace .traces/mooncake_conversation_trace.jsonl )" ;;  # after ckpt-4b; kern serve --weights (its own manifest, pins on first use) against transformers' continuous batching; carry .traces (cp ../shared/traces/mooncake_conversation_trace.jsonl .traces/)
    tiny-sampling) step tiny-sampling 120 "for p in 'The capital of France is' 'Once upon a time' 'The little dog'; do echo \"== greedy: \$p\"; python3 -m kern_run.cli run --prompt \"\$p\" --max-tokens 64; for s in 0 1; do echo \"== T 0.8, top-p 0.95, repetition penalty 1.1, seed \$s: \$p\"; python3 -m kern_run.cli run --prompt \"\$p\" --max-tokens 64 --temperature 0.8 --top-p 0.95 --repetition-penalty 1.1 --seed \$s; done; done" ;;  # issue 26 point 4: tiny-en greedy against a seeded sampler with a repetition penalty (the default target)
    pick-inv)    step pick-inv 420 "python3 tools/pick_algos.py --shape qwen3-4b --shape qwen3-0.6b --shape tiny --config models/qwen3-tiny-en/config.json --keep-pins manifests/algos/h200.json --invariant-decode --out $OUT/h200.json && cp $OUT/h200.json manifests/algos/h200.json && python3 tools/regen_manifests.py && cp manifests/qwen3-4b-inv.json manifests/qwen3-tiny-en-inv.json $OUT/ && python3 bench/decode.py --batch 1,8,64 --contexts 128 --manifest manifests/qwen3-4b-inv.json --ckpt $W/qwen3-4b --steps 48 --rounds 3 --only kern" ;;  # after ckpt-4b; the invariant decode pins (split-K), the -inv manifests rebuilt on them and timed: fetch h200.json and the two manifests
    batch-timeline) step batch-timeline 200 "python3 bench/decode.py --batch 1,64 --contexts 128,576,2048 --manifest manifests/qwen3-4b-inv.json --ckpt $W/qwen3-4b --only kern --no-check --steps 16 --rounds 2 --timeline 8 --json $OUT/bench-batch-timeline.json" ;;  # after ckpt-4b; issue 27: each op's advance of the serve decode's graph step (the -inv manifest is kern serve --weights' on the 4B: the committed invariant pins), 1 and 64 rows
    batch-breakdown) step batch-breakdown 300 "python3 bench/decode.py --batch 1,64 --contexts 128,576 --manifest manifests/qwen3-4b-inv.json --ckpt $W/qwen3-4b --only kern --no-check --steps 32 --rounds 2 --breakdown --json $OUT/bench-batch-breakdown.json" ;;  # after ckpt-4b; issue 27: where the invariant decode's 64-row step goes (ctx 576: the closed batch's mean context), per op and kernel
    persist-ab)  step persist-ab 420 "for s in qwen3-1.7b qwen3-4b qwen3-8b; do python3 tools/make_checkpoint.py --shape \$s --out $W/\$s && python3 -m tools.gen_persistent --config $W/\$s/config.json --out /tmp/\$s-persistent.json && python3 -m kern_run.cli manifest build --config $W/\$s/config.json --name \$s --out /tmp/\$s-v1.json && python3 bench/decode.py --ckpt $W/\$s --only kern --variants /tmp/\$s-v1.json,/tmp/\$s-persistent.json --contexts 128,4096 --steps 128 --json $OUT/bench-persist-\$s.json; done" ;;  # issue 28: the persistent manifest against today's v1 manifest, one run per size, ctx 128 and 4096
    harvest-tiny) step harvest-tiny 560 "time KERN_HARVEST_LOG=$OUT/harvest-tiny-worker.log python3 -m pytest -m gpu tests/harvest -q -p no:cacheprovider -rfE --durations=5; rc=\$?; [ -d tests/data/harvest/tiny-en ] && tar czf $OUT/harvest-tiny-en.tgz -C tests/data/harvest tiny-en; exit \$rc" ;;  # tiny-en capture, mine, generate, replay; the capture it lays down (tests/data/harvest/tiny-en) comes back as \$OUT/harvest-tiny-en.tgz, to commit
    harvest-4b)  step harvest-4b 580 "KERN_HARVEST_LOG=$OUT/harvest-4b-worker.log KERN_HARVEST_4B=1 KERN_HARVEST_KEEP=/tmp/harvest-4b python3 -m pytest tests/harvest/test_harvest_gpu.py -q -p no:cacheprovider -rf -k 4b --durations=3 && python3 bench/decode.py --ckpt $W/qwen3-4b --only kern,torch-compile,kern-harvest --harvest /tmp/harvest-4b --contexts 128 --steps 256 --json $OUT/bench-harvest-4b.json" ;;  # after ckpt-4b; issue 31: the harvested 4B gives torch.compile's tokens, then its ms/token beside kern and torch.compile
    harvest-4b-decode) step harvest-4b-decode 580 "KERN_HARVEST_AUTOTUNE_TOKENS=1 KERN_HARVEST_LOG=$OUT/harvest-4b-decode-worker.log KERN_HARVEST_4B=1 KERN_HARVEST_KEEP=/tmp/harvest-4b-decode python3 -m pytest tests/harvest/test_harvest_gpu.py -q -p no:cacheprovider -rf -k 4b --durations=3 && python3 bench/decode.py --ckpt $W/qwen3-4b --only kern-harvest,torch-harvest --harvest /tmp/harvest-4b-decode --contexts 128 --steps 256 --budget 300 --json $OUT/bench-harvest-4b-decode.json" ;;  # after ckpt-4b; the 4B harvest with its GEMMs autotuned at one row (--autotune-tokens 1), beside torch's own graph of that step (torch-harvest compiles with the hint the capture's meta names)
    *) echo "unknown step $s"; summary+=("$s: unknown step") ;;
  esac
done
echo; echo "===== summary"; printf '%s\n' "${summary[@]}"
