"""Regenerate every committed manifest (manifests/*.json) from kernels/kernels.json and the cuBLASLt pins.

The table below is the one source of how each committed manifest is made; tests/run/test_caller_manifest.py
checks that every file in manifests/ is listed and byte-identical to what this produces.

    python tools/regen_manifests.py [--algos manifests/algos/h200.json] [--kernels kernels/kernels.json]
                                    [--out-dir manifests] [--check]

Every manifest is generated (into a temporary directory) before any file of --out-dir is touched; the stale
ones are then renamed into place from temporary files together. Errors (exit 1, one line on stderr, nothing
written): an --out-dir that is not a directory, a manifest gen_qwen3 refuses (the line names the manifest and
gen_qwen3's reason, e.g. a pins file proven for a smaller M than a --chunk-max of the table), a write that
fails. --check exits 1 when a committed file differs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
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
    if not args.out_dir.is_dir():
        print(f"regen_manifests: --out-dir {args.out_dir} is not a directory", file=sys.stderr)
        return 1
    texts: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fname in COMMITTED:  # every manifest generated before any is written
            out = Path(tmp) / fname
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                rc = gq.main(gen_args(fname, out, args.kernels, args.algos))
            if rc != 0:
                reason = err.getvalue().strip().removeprefix("gen_qwen3: ") or f"gen_qwen3 exit {rc}"
                print(f"regen_manifests: {fname}: {reason}; nothing written", file=sys.stderr)
                return 1
            texts[fname] = out.read_bytes()
    stale = [f for f, data in texts.items()
             if not (args.out_dir / f).is_file() or (args.out_dir / f).read_bytes() != data]
    if stale and not args.check:
        try:
            gq.write_files({args.out_dir / f: texts[f] for f in stale})
        except OSError as exc:
            print(f"regen_manifests: {exc.filename}: {exc.strerror or exc}; nothing written", file=sys.stderr)
            return 1
    print(f"regen_manifests: {len(stale)} of {len(COMMITTED)} {'stale' if args.check else 'rewritten'}: {stale}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
