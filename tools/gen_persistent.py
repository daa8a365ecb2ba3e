#!/usr/bin/env python3
"""Write the persistent decode manifest of a Qwen3 config (kern_run.models.qwen3.persistent.manifest,
docs/persistent.md): today's manifest with the decode body replaced by one cooperative kern_persistent_decode launch.

    uv run --frozen python -m tools.gen_persistent --config tests/data/configs/Qwen3-4B.json \\
        --out /tmp/qwen3-4b-persistent.json [--sms 132] [--splits N] [--name NAME] [--algos PINS | --pick-pins GPU]
        [--stages N] [--l2-prefetch] [--fences] [--no-evict-first] [--table-ahead] [--counter-stride N]
        [--row-quantum N] [--ablate CLASS,...]
        [--attn split|fused] [--row-split auto|always|never]

`--pick-pins GPU`: the prefill's batch-invariant cuBLASLt pins as `kern run --weights` finds or picks them on that
CUDA device (kern_run.pins_cache.ensure_pins: the cache, the committed pins, else picked now), so a shape no committed
pins file covers (8B) prefills chunk-invariantly too. `--sms`: the target GPU's multiprocessor count (the grid: one
block per SM; the H200 has 132). Then time it against today's manifest in one run: `bench/decode.py --only kern
--variants manifests/qwen3-4b.json,/tmp/...json`.
Exit 0 on success, 2 with one line on stderr for a config, pins file, option or kernels.json the builder refuses,
or an --out it cannot write whole (a directory, a FIFO or device, a missing parent: nothing is written then).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from kern_run.errors import RefusalError
from kern_run.files import write_files
from kern_run.models.qwen3.abi import read_kernel_abi
from kern_run.models.qwen3.config import Qwen3Config
from kern_run.models.qwen3.jsonio import dumps, read_json_file, sha256_text
from kern_run.models.qwen3.options import BuildOptions
from kern_run.models.qwen3.persistent.isa import Op
from kern_run.models.qwen3.persistent.manifest import build_persistent_manifest
from kern_run.models.qwen3.persistent.schedule import ATTN_MODES, ROW_SPLITS
from kern_run.models.qwen3.pins import load_algos
from kern_runtime import KernError

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="a Qwen3 config.json")
    parser.add_argument("--out", type=Path, required=True, help="the manifest to write")
    parser.add_argument("--kernels", type=Path, default=REPO / "kernels", help="kernels directory (kernels.json)")
    parser.add_argument("--sms", type=int, default=132, help="multiprocessors of the target GPU: the grid")
    parser.add_argument("--splits", type=int, default=None, help="attention context splits per kv head")
    parser.add_argument("--name", default=None, help="manifest name (default: <config dir>-persistent)")
    parser.add_argument("--algos", type=Path, default=None,
                        help="a cuBLASLt pins file for the prefill GEMMs (manifests/algos/h200.json), as kern manifest build")
    parser.add_argument("--pick-pins", type=int, default=None, metavar="GPU",
                        help="find or pick the prefill pins on this CUDA device, as kern run --weights (needs a GPU)")
    parser.add_argument("--stages", type=int, default=None,
                        help="weight-ring steps per warp, 2..8 (default 4, fewer where fewer fit)")
    parser.add_argument("--row-quantum", type=int, default=8, help="projection tiles are multiples of this many rows")
    parser.add_argument("--counter-stride", type=int, default=1, help="u32 words between counters (32: a line each)")
    parser.add_argument("--fences", action="store_true", help="set the table's FLAG_FENCES")
    parser.add_argument("--l2-prefetch", action="store_true", help="set the table's FLAG_L2_PREFETCH")
    parser.add_argument("--evict-first", action=argparse.BooleanOptionalAction, default=True,
                        help="the table's FLAG_EVICT_FIRST: the weight ring's copies evict-first in L2 (default on)")
    parser.add_argument("--table-ahead", action="store_true",
                        help="set the table's FLAG_TABLE_AHEAD (the next instruction's words asked of L1 early)")
    parser.add_argument("--attn", choices=ATTN_MODES, default="split",
                        help="the attention as ROPE, ATTN_PARTIAL and ATTN_REDUCE (split, the default) or as one "
                             "ATTN instruction per kv head and split (fused; slower on the H200 at 4B and 8B)")
    parser.add_argument("--row-split", choices=ROW_SPLITS, default="auto",
                        help="O_PROJ / DOWN rows split across the warps: where it streams fewer ring steps (auto), "
                             "wherever the kernel can (always), or never")
    parser.add_argument("--ablate", default="",
                        help="comma list of instruction classes (QKV, ROPE, ...) made NOPs: timing only, the "
                             "outputs are meaningless")
    args = parser.parse_args(argv)
    try:
        try:
            ablate = frozenset(Op[name.strip().upper()] for name in args.ablate.split(",") if name.strip())
        except KeyError as exc:
            raise ValueError(f"--ablate: no instruction class {exc}; the classes are "
                             f"{', '.join(o.name for o in Op if o is not Op.NOP)}") from None
        raw, text = read_json_file(args.config)
        cfg = Qwen3Config.from_json(raw, str(args.config))
        name = args.name or f"{args.config.stem.lower()}-persistent"
        opts = BuildOptions(name=name)
        if args.algos is not None and args.pick_pins is not None:
            raise ValueError("--algos and --pick-pins both name the prefill pins; give one")
        pins = args.algos
        if args.pick_pins is not None:
            from kern_run.models.qwen3.options import validate
            from kern_run.pins_cache import ensure_pins

            pins = ensure_pins(validate(cfg, opts).prefill_shapes, args.pick_pins, opts.chunk_max,
                               command="gen_persistent")
        if pins is not None:
            algos, decode_algos, source = load_algos(pins, opts.chunk_max)
            opts = dataclasses.replace(opts, algos=algos, decode_algos=decode_algos, algos_source=source)
        manifest, sched = build_persistent_manifest(cfg, read_kernel_abi(args.kernels), opts,
                                                    num_queues=args.sms, splits=args.splits,
                                                    config_digest=sha256_text(text), stages=args.stages,
                                                    l2_prefetch=args.l2_prefetch, ablate=ablate,
                                                    row_quantum=args.row_quantum,
                                                    counter_stride=args.counter_stride,
                                                    fences=args.fences, attn=args.attn,
                                                    row_split=args.row_split, evict_first=args.evict_first,
                                                    table_ahead=args.table_ahead)
    except (RefusalError, ValueError, KernError) as exc:
        print(f"gen_persistent: {exc}", file=sys.stderr)
        return 2
    try:
        write_files({args.out: dumps(manifest)})  # whole or not at all; a directory, FIFO or device refused
    except OSError as exc:
        print(f"gen_persistent: --out {exc.filename or args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"{args.out}: {len(sched.table.instrs)} instructions over {args.sms} queues, {sched.table.num_counters} "
          f"counters, {sched.splits} attention splits ({args.attn}), a {manifest['meta']['persistent']['ring_stages']}-stage ring"
          + (f", ablated {args.ablate}" if ablate else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
