#!/usr/bin/env bash
# Same-run A/B of two source trees on the GPU machine (a refactor must not slow the step): bench/decode.py and
# bench/prefill.py --only kern for the tree BASE and for this checkout (decode alternated BASE, HEAD, BASE, HEAD;
# prefill BASE, HEAD), each bench in its own process with only its own tree's packages on PYTHONPATH. The kernels and the checkpoint
# are shared. Prints each run's kern rows (the full logs and JSON under $OUT).
#   git archive REV packages tools bench manifests kern.toml kernels | tar -x -C .base    # BASE (not committed)
#   bash tools/ab-trees.sh .base [CKPT_DIR]        # CKPT_DIR defaults to $KERN_WEIGHTS/qwen3-4b
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
base="$(cd "${1:?usage: tools/ab-trees.sh BASE_DIR [CKPT_DIR]}" && pwd)"
W="${KERN_WEIGHTS:-/tmp/kern-weights}"
ckpt="${2:-$W/qwen3-4b}"
OUT="${OUT:-/tmp/kern-out}"; mkdir -p "$OUT"
[ -f "$ckpt/config.json" ] || { echo "tools/ab-trees.sh: no checkpoint at $ckpt (tools/make_checkpoint.py --shape qwen3-4b)" >&2; exit 2; }
source "$root/tools/gpu-env.sh"   # installs the carried wheels into /tmp/site once, for both trees
bench() {  # bench decode|prefill LABEL TREE INDEX
  local what=$1 label=$2 tree=$3 i=$4 args
  if [ "$what" = decode ]; then args="--only kern --contexts 128,4096 --steps 256"; else args="--only kern"; fi
  env -u PYTHONPATH bash -c "cd '$tree' && source tools/gpu-env.sh >/dev/null 2>&1; \
    python3 bench/$what.py --ckpt '$ckpt' --kernels '$root/kernels' $args --json '$OUT/ab-$what-$label-$i.json'" \
    > "$OUT/ab-$what-$label-$i.log" 2>&1
  echo "=== $what $label run $i"
  grep -E '^kern' "$OUT/ab-$what-$label-$i.log"
}
# decode twice per tree, alternated (the machines are noisy); prefill once per tree
for i in 1 2; do bench decode base "$base" "$i"; bench decode head "$root" "$i"; done
bench prefill base "$base" 1; bench prefill head "$root" 1
