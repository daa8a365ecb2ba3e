"""The GPU tests' torch side, run as `python -m tests.harvest.harvest_gpu_worker` (a process of its own: the
capture needs PYTORCH_NO_CUDA_MEMORY_CACHING=1 and CUDA_MODULE_LOADING=EAGER before torch starts CUDA).

Captures the Qwen3 step of `--weights` at `--tokens` into `--out`/capture, then, with the same compiled step (the
very kernels captured), runs torch's greedy reference from `--prompt` for `--steps` tokens into
`--out`/reference.npz (`tokens` i64 [steps], `logits` f32 [prompt + steps - 1, vocab]). Every 120 s it dumps its
threads' stacks to stderr (faulthandler): the test keeps stderr in $KERN_HARVEST_LOG when that is set.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
from pathlib import Path

from kern_run.harvest.command import ENVIRONMENT


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--weights", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tokens", default="1,2")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--prompt", default="1,2,3,4")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--scope", default=os.environ.get("KERN_HARVEST_SCOPE", "layer"), help="torch_step's compile "
                   "scope: layer or step (default $KERN_HARVEST_SCOPE, else layer)")
    p.add_argument("--autotune-tokens", type=int,
                   default=int(os.environ.get("KERN_HARVEST_AUTOTUNE_TOKENS", 0)) or None,
                   help="rows the GEMMs are autotuned for (default $KERN_HARVEST_AUTOTUNE_TOKENS, else inductor's)")
    args = p.parse_args()
    faulthandler.dump_traceback_later(120, repeat=True, file=sys.stderr)  # where a slow compile spends its time
    for key, value in ENVIRONMENT.items():
        os.environ[key] = value
    import numpy as np
    import torch

    from kern_run.harvest.capture import CaptureOptions, capture
    from kern_run.harvest.torch_step import Qwen3Step, reference_greedy

    tokens = tuple(int(t) for t in args.tokens.split(","))
    result, step = capture(lambda: Qwen3Step(args.weights, args.context, scope=args.scope,
                                             autotune_tokens=args.autotune_tokens), CaptureOptions(tokens),
                           args.out / "capture", source={"model": args.weights.name, "context": args.context,
                                                         "scope": args.scope, "autotune_tokens": args.autotune_tokens})
    for state in step.states().values():  # the reference starts from a zero cache, as kern's fixed states do
        state.zero_()
    torch.cuda.synchronize()
    prompt = [int(t) for t in args.prompt.split(",")]
    greedy, logits = reference_greedy(step, prompt, args.steps)
    np.savez(args.out / "reference.npz", tokens=np.array(greedy, dtype=np.int64), logits=logits)
    print(json.dumps({"launches": [len(r.launches) for r in result.runs], "cubins": len(result.cubins),
                      "tokens": greedy[:8]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
