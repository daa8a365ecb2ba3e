#!/usr/bin/env bash
# On a 2-GPU machine: the 2-GPU steps first, then timing on GPU 0 beside correctness on GPU 1, in one
# call. Every log is packed into $OUT/logs.tgz (the device tool brings back at most 8 files).
#   bash tools/device-parallel.sh "<2-gpu steps>" "<gpu0 steps>" "<gpu1 steps>"
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
FINAL="${OUT:-/tmp/kern-out}"; mkdir -p "$FINAL"
export KERN_WEIGHTS=/tmp/kern-weights
OUT="$FINAL/both" bash "$root/tools/device-session.sh" $1 2>&1 | tail -n 40
(CUDA_VISIBLE_DEVICES=0 OUT="$FINAL/gpu0" bash "$root/tools/device-session.sh" $2 > "$FINAL/gpu0.txt" 2>&1) &
(CUDA_VISIBLE_DEVICES=1 OUT="$FINAL/gpu1" bash "$root/tools/device-session.sh" $3 > "$FINAL/gpu1.txt" 2>&1) &
wait
tail -n 60 "$FINAL/gpu1.txt"; tail -n 80 "$FINAL/gpu0.txt"
cd "$FINAL" && tar czf logs.tgz both gpu0 gpu1 gpu0.txt gpu1.txt && rm -rf both gpu0 gpu1
