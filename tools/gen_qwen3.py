#!/usr/bin/env python3
"""`kern manifest build` under its old name: `python tools/gen_qwen3.py ARGS` runs `kern manifest build ARGS`.

The Qwen3 manifest builder is kern_run.models.qwen3 (docs/manifest.md "Building a manifest"); this script stays
for the commands and docs that spell it this way. Example:

    python tools/gen_qwen3.py --shape qwen3-4b --kernels kernels --out manifests/qwen3-4b.json
"""

from __future__ import annotations

import sys

from kern_run.cli import app


def main(argv: list[str] | None = None) -> int:
    """Run `kern manifest build` with `argv` (default: the command line); its exit status."""
    try:
        app(["manifest", "build", *(sys.argv[1:] if argv is None else argv)], prog_name="kern")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
