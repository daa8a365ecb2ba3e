#!/usr/bin/env python3
"""Tensor-parallel Qwen3 manifests under their old command: `python tools/gen_qwen3_tp.py --out-dir DIR [--tp N]
ARGS` runs `kern manifest build --tp N --out DIR/<name>.json ARGS`, which writes `DIR/<name>-tp<N>-r<rank>.json`
(kern_run.models.qwen3.tp; docs/manifest.md "Tensor parallelism"). --tp defaults to 2; <name> is --name, else
the --shape, else the --config's directory name.

    python tools/gen_qwen3_tp.py --shape qwen3-4b --tp 2 --out-dir manifests     # qwen3-4b-tp2-r{0,1}.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.gen_qwen3 import main as build_main


def main(argv: list[str] | None = None) -> int:
    """Run `kern manifest build --tp N --out DIR/<name>.json` for these arguments; its exit status."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--out-dir", type=Path)
    parser.add_argument("--tp", default="2")
    known, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if known.out_dir is None:
        if "--help" in rest:
            return build_main(["--help"])
        print("gen_qwen3_tp: --out-dir DIR is required (the rank manifests go there)", file=sys.stderr)
        return 2
    names = argparse.ArgumentParser(add_help=False)
    for flag in ("--name", "--shape", "--config"):
        names.add_argument(flag)
    given = names.parse_known_args(rest)[0]
    name = given.name or given.shape or (Path(given.config).resolve().parent.name if given.config else "qwen3")
    return build_main([*rest, "--tp", known.tp, "--out", str(known.out_dir / f"{name}.json")])


if __name__ == "__main__":
    sys.exit(main())
