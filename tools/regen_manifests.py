"""Regenerate every committed manifest (manifests/*.json) from kernels/kernels.json and the cuBLASLt pins, with
the package's builder (kern_run.models.qwen3, what `kern manifest build` runs).

The table below is the one source of how each committed manifest is made; tests/run/test_caller_manifest.py
checks that every file in manifests/ is listed and byte-identical to what this produces.

    python tools/regen_manifests.py [--algos manifests/algos/h200.json] [--kernels kernels]
                                    [--out-dir manifests] [--check]

Every manifest is generated in memory before any file of --out-dir is touched; the stale ones are then renamed
into place from temporary files together. Errors (exit 1, one line on stderr, nothing written): an --out-dir
that is not a directory, a manifest the builder refuses (the line names the manifest and the builder's reason,
e.g. a pins file proven for a smaller M than a --chunk-max of the table), a write that fails. --check exits 1
when a committed file differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kern_run.errors import ManifestBuildError
from kern_run.files import write_files
from kern_run.models.qwen3 import BuildRequest, build_texts

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ROOT / "manifests" / "algos" / "h200.json"
TINY_EN = "config:models/qwen3-tiny-en/config.json"

# file -> (source: a known shape or "config:<path>", name or None, `kern manifest build` options beyond the source,
# --name, --kernels and --algos: BuildRequest's max_context, else BuildOptions fields)
COMMITTED: dict[str, tuple[str, str | None, dict[str, Any]]] = {
    "qwen3-4b.json": ("qwen3-4b", None, {}),
    "qwen3-0.6b.json": ("qwen3-0.6b", None, {}),
    "qwen3-tiny.json": ("tiny", "qwen3-tiny", {}),
    "qwen3-4b-c2048.json": ("qwen3-4b", "qwen3-4b-c2048", {"chunk_max": 2048}),
    # decode steps of 1..64 rows (docs/caller.md "Batched decode"): the qwen3-4b target, tiny-v2 and the default
    "qwen3-4b-v2.json": ("qwen3-4b", "qwen3-4b-v2", {"gemv": "v2", "seqs_max": 64}),
    "qwen3-tiny-v2.json": ("tiny", "qwen3-tiny-v2", {"gemv": "v2", "seqs_max": 64}),
    # the default target: generated from the trained checkpoint's own config.json
    "qwen3-tiny-en.json": (TINY_EN, "qwen3-tiny-en", {"max_context": 2048, "gemv": "v2", "seqs_max": 64}),
    "qwen3-tiny-en-gemm.json": (TINY_EN, "qwen3-tiny-en-gemm", {"max_context": 2048, "decode": "gemm"}),
    # batch-invariant decode of 1..64 rows (docs/caller.md "Batch-invariant decode"): what `kern serve` runs for the
    # tiny-en and qwen3-4b targets (kern.toml serve_manifest), so a response equals the prompt run alone
    "qwen3-tiny-en-inv.json": (TINY_EN, "qwen3-tiny-en-inv", {"max_context": 2048, "seqs_max": 64,
                                                              "batch_invariant": True}),
    "qwen3-4b-inv.json": ("qwen3-4b", "qwen3-4b-inv", {"seqs_max": 64, "batch_invariant": True}),
}


def request(fname: str, kernels: Path, algos: Path | None, out_dir: Path = ROOT / "manifests") -> BuildRequest:
    """The build of committed manifest `fname` (unverified: the tests verify the committed files)."""
    source, name, extra = COMMITTED[fname]
    options = dict(extra)
    max_context = options.pop("max_context", None)
    where = {"config": ROOT / source[len("config:"):]} if source.startswith("config:") else {"shape": source}
    return BuildRequest(out=out_dir / fname, kernels=kernels, name=name, max_context=max_context, algos=algos,
                        verify=False, options=options, **where)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algos", type=Path, default=ALGOS, help="pins file (tools/pick_algos.py)")
    ap.add_argument("--kernels", type=Path, default=ROOT / "kernels", help="kernels directory (or its kernels.json)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "manifests")
    ap.add_argument("--check", action="store_true", help="only compare with the committed files; exit 1 on a difference")
    args = ap.parse_args(argv)
    if not args.out_dir.is_dir():
        print(f"regen_manifests: --out-dir {args.out_dir} is not a directory", file=sys.stderr)
        return 1
    texts: dict[str, bytes] = {}
    for fname in COMMITTED:  # every manifest generated before any is written
        try:
            (text,) = build_texts(request(fname, args.kernels, args.algos, args.out_dir)).values()
        except ManifestBuildError as exc:
            print(f"regen_manifests: {fname}: {exc}; nothing written", file=sys.stderr)
            return 1
        texts[fname] = text.encode()
    stale = [f for f, data in texts.items()
             if not (args.out_dir / f).is_file() or (args.out_dir / f).read_bytes() != data]
    if stale and not args.check:
        try:
            write_files({args.out_dir / f: texts[f] for f in stale})
        except OSError as exc:
            print(f"regen_manifests: {exc.filename}: {exc.strerror or exc}; nothing written", file=sys.stderr)
            return 1
    print(f"regen_manifests: {len(stale)} of {len(COMMITTED)} {'stale' if args.check else 'rewritten'}: {stale}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
