#!/usr/bin/env bash
# Prefix reuse across prompts in one `kern run` (issue 7): two prompts sharing a ~2k-token prefix, run
# together with --prompts (the second prefills only its new tokens) and each alone; the texts must match.
#   bash tools/prefix-demo.sh WEIGHTS_DIR [kern run options...]
set -euo pipefail
weights=$1; shift
work=$(mktemp -d)
python3 - "$work/prompts.txt" <<'PY'
import sys
shared = " ".join(f"Section {i}: the quick brown fox jumps over the lazy dog while the committee reviews "
                  f"item number {i} of the agenda and records its decision in the minutes." for i in range(80))
with open(sys.argv[1], "w") as f:
    f.write(shared + " Question: what did the committee decide first?\n")
    f.write(shared + " Question: which animal jumped?\n")
PY
kern() { python3 -m kern_run.cli "$@"; }
kern run --prompts "$work/prompts.txt" --weights "$weights" --steps 32 --ignore-eos "$@" > "$work/together.txt"
: > "$work/alone.txt"
while IFS= read -r prompt; do
  kern run --prompt "$prompt" --weights "$weights" --steps 32 --ignore-eos --log-level warning "$@" >> "$work/alone.txt"
done < "$work/prompts.txt"
if cmp -s "$work/together.txt" "$work/alone.txt"; then
  echo "prefix-demo: outputs with prefix reuse identical to each prompt alone"
else
  echo "prefix-demo: outputs DIFFER"; diff "$work/together.txt" "$work/alone.txt" | head -20; exit 1
fi
