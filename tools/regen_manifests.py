"""Regenerate every committed manifest (manifests/*.json) from kernels/kernels.json and the cuBLASLt pins.

The table below is the one source of how each committed manifest is made; tests/run/test_caller_manifest.py
checks that every file in manifests/ is listed and byte-identical to what this produces.

    python tools/regen_manifests.py [--algos manifests/algos/h200.json] [--check]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

ALGOS = ROOT / "manifests" / "algos" / "h200.json"

# file -> (source: a make_checkpoint shape or "config:<path>", name or None, extra gen_qwen3 flags)
COMMITTED: dict[str, tuple[str, str | None, tuple[str, ...]]] = {
    "qwen3-4b.json": ("qwen3-4b", None, ()),
    "qwen3-0.6b.json": ("qwen3-0.6b", None, ()),
    "qwen3-tiny.json": ("tiny", "qwen3-tiny", ()),
    "qwen3-4b-c2048.json": ("qwen3-4b", "qwen3-4b-c2048", ("--chunk-max", "2048")),
    "qwen3-4b-v2.json": ("qwen3-4b", "qwen3-4b-v2", ("--gemv", "v2")),
    "qwen3-tiny-v2.json": ("tiny", "qwen3-tiny-v2", ("--gemv", "v2")),
    # the default target: generated from the trained checkpoint's own config.json
    "qwen3-tiny-en.json": ("config:models/qwen3-tiny-en/config.json", "qwen3-tiny-en", ("--max-context", "2048")),
    "qwen3-tiny-en-gemm.json": ("config:models/qwen3-tiny-en/config.json", "qwen3-tiny-en-gemm",
                                ("--max-context", "2048", "--decode", "gemm")),
}


def gen_args(fname: str, out: Path, kernels_json: Path, algos: Path | None) -> list[str]:
    """gen_qwen3.py arguments that make committed manifest `fname` at `out`."""
    shape, name, extra = COMMITTED[fname]
    source = ["--config", str(ROOT / shape[len("config:"):])] if shape.startswith("config:") else ["--shape", shape]
    args = [*source, "--kernels", str(kernels_json), "--out", str(out), "--no-verify", *extra]
    if name:
        args += ["--name", name]
    if algos is not None:
        args += ["--algos", str(algos)]
    return args


def main(argv: list[str] | None = None) -> int:
    import gen_qwen3 as gq

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algos", type=Path, default=ALGOS, help="pins file (tools/pick_algos.py)")
    ap.add_argument("--kernels", type=Path, default=ROOT / "kernels" / "kernels.json")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "manifests")
    ap.add_argument("--check", action="store_true", help="only compare with the committed files; exit 1 on a difference")
    args = ap.parse_args(argv)
    stale = []
    with tempfile.TemporaryDirectory() as tmp:
        for fname in COMMITTED:
            out = Path(tmp) / fname
            if gq.main(gen_args(fname, out, args.kernels, args.algos)) != 0:
                return 1
            target = args.out_dir / fname
            if not target.exists() or target.read_bytes() != out.read_bytes():
                stale.append(fname)
                if not args.check:
                    target.write_bytes(out.read_bytes())
    print(f"regen_manifests: {len(stale)} of {len(COMMITTED)} {'stale' if args.check else 'rewritten'}: {stale}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
