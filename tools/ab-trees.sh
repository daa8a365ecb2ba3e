#!/usr/bin/env bash
# Same-run A/B of two source trees on the GPU machine (a refactor must not slow the step): bench/decode.py and
# bench/prefill.py --only kern for the tree BASE and for this checkout, alternated BASE, HEAD, BASE, HEAD, each
# bench in its own process with only its own tree's packages on PYTHONPATH. The kernels and the checkpoint
# are shared. Prints each run's kern rows, then a summary of medians per tree.
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
run() {  # run LABEL TREE INDEX
  local label=$1 tree=$2 i=$3
  env -u PYTHONPATH bash -c "cd '$tree' && source tools/gpu-env.sh >/dev/null 2>&1; \
    python3 bench/decode.py --ckpt '$ckpt' --kernels '$root/kernels' --only kern --contexts 128,4096 --steps 256 \
      --json '$OUT/ab-decode-$label-$i.json' > '$OUT/ab-decode-$label-$i.log' 2>&1; \
    python3 bench/prefill.py --ckpt '$ckpt' --kernels '$root/kernels' --only kern \
      --json '$OUT/ab-prefill-$label-$i.json' > '$OUT/ab-prefill-$label-$i.log' 2>&1"
  echo "=== $label run $i"
  grep -E '^kern' "$OUT/ab-decode-$label-$i.log" "$OUT/ab-prefill-$label-$i.log" | sed 's/^[^:]*://'
}
for i in 1 2; do run base "$base" "$i"; run head "$root" "$i"; done
