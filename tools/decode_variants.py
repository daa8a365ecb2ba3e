#!/usr/bin/env python3
"""Generate the Qwen3-4B decode variants an experiment compares (bench/decode.py --variants).

    python3 tools/decode_variants.py --out /tmp/variants [--only v2,v2-t512] [--ablate inv-gqa]

Writes one manifest per entry of VARIANTS (`kern manifest build` arguments on top of the 4B shape with the H200
pins) into --out, and --out/list: their paths, comma separated, in table order. The table is the record of
what was compared; docs/perf.md quotes the runs by these names. `--ablate NAME` (a variant of --only, or of the
table) also writes NAME's timing ablations (tools/ablate_manifest.py: NAME without each entry of ABLATIONS, its
decode outputs meaningless), listed after the variants: the in-place cost of every op of the step, as in
docs/perf.md "Twenty-fourth session". The batch-invariant variants (`inv*`, 1..64 rows) time with
`bench/decode.py --batch 1,64 --contexts 576 --manifest A --variants B,...`, which loads each manifest as its own
Runtime (weights and pool: about 14 GB at 64 rows x 576 tokens), so about 6 fit the H200 in one run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> `kern manifest build` arguments (beyond --shape qwen3-4b, --algos, --kernels, --out, --name)
VARIANTS: dict[str, tuple[str, ...]] = {
    "v2": ("--gemv", "v2"),  # = manifests/qwen3-4b-v2.json (the default 4B target; 16 decode splits, wide partial)
    "v2-split": ("--gemv", "v2", "--decode-attn", "split"),  # kern_attn_decode_partial_fast (before 2026-11-29 s4)
    "v2-s32": ("--gemv", "v2", "--decode-splits", "32"),  # the split count before 2026-11-29 (third session)
    "v2-s8": ("--gemv", "v2", "--decode-splits", "8"),
    "v2-pdl-gemv": ("--gemv", "v2", "--no-pdl-small"),  # PDL on the GEMVs and attention only (before 2026-11-29 s3)
    "v2-t512": ("--gemv", "v2", "--gemv-threads-per-sm", "512"),  # GEMV grids fill half an SM: PDL co-residency
    "v2-st16": ("--gemv", "v2", "--decode-split-tokens", "16"),  # minimum split length before 2026-11-29 (s5)
    "v2-nocarve": ("--gemv", "v2", "--carveout", "-1"),  # no launch carveout: the driver's choice (before s6)
    "v2-early": ("--gemv", "v2", "--decode-attn", "early"),  # the 4-warp early partial (the default before s7)
    "v2-stream": ("--gemv", "v2", "--decode-attn", "stream"),  # kern_attn_decode_partial_stream (issue 26, batch)
    # seventh session, from commit 1befd34 (its generator): v2-noring, v2-norm, v2-ring (the rows ring and the norm
    # weight copied to shared memory before the PDL wait; both lost or gained nothing, docs/perf.md) - removed
    # batch-invariant decode of 1..64 rows (issue 27's 64-row step): `inv` = manifests/qwen3-4b-inv.json, what
    # `kern serve --weights` builds for the 4B shape (stream partial)
    "inv": ("--seqs-max", "64", "--batch-invariant"),
    "inv-gqa": ("--seqs-max", "64", "--batch-invariant", "--decode-attn-batch", "gqa"),
    "inv-gqa-st128": ("--seqs-max", "64", "--batch-invariant", "--decode-attn-batch", "gqa",
                      "--decode-split-tokens", "128"),
    "inv-mma-gqa": ("--seqs-max", "64", "--batch-invariant", "--decode", "gemv", "--gemv", "v2", "--batch-proj", "mma",
                    "--decode-attn-batch", "gqa"),  # the small-M MMA projections at every row count
    # the layer projections on kern_gemm_skinny (twenty-fifth session), the SiLU-mul in gate_up's epilogue
    "inv-gqa-sk": ("--seqs-max", "64", "--batch-invariant", "--decode-attn-batch", "gqa", "--invariant-proj", "skinny"),
}
# --ablate: suffix -> (ops to drop from the decode program, entries to drop from its ops); an op or entry the
# manifest lacks is skipped (an MMA variant has no gemm_inv_* op)
ABLATIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "noreduce": ((), ("kern_attn_decode_reduce",)),
    "norope": (("qk_norm_rope_kv",), ()),
    "nosilu": (("silu_mul",), ()),
    "noaddnorm": (("add_rmsnorm",), ()),
    "noo": (("gemm_inv_2560x4096",), ()),
    "nodown": (("gemm_inv_2560x9728",), ()),
    "noattn": (("attn_decode",), ()),
}


def write_ablations(path: Path, out_dir: Path) -> list[str]:
    """The ABLATIONS of the manifest at `path` that apply to it, each written beside the variants; their paths.
    Raises AblationError (tools/ablate_manifest.py) for a manifest it cannot ablate."""
    from kern_run.files import write_files
    from kern_run.models.qwen3 import dumps, read_json_file

    from tools.ablate_manifest import ablate

    manifest, _ = read_json_file(path)
    called = {c.get("op") for c in manifest["programs"]["decode"]["calls"]}
    entries = {x.get("entry") for op in manifest["ops"].values() for x in op.get("launches", [])}
    paths = []
    for suffix, (ops, drop_entries) in ABLATIONS.items():
        ops_here = [op for op in ops if op in called]
        entries_here = [e for e in drop_entries if e in entries]
        if not ops_here and not entries_here:
            continue
        target = out_dir / f"{path.stem}-{suffix}.json"
        write_files({target: dumps(ablate(manifest, ops_here, entries_here))})
        paths.append(str(target))
    return paths


def main(argv: list[str] | None = None) -> int:
    from tools import gen_qwen3 as gq

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", default="", help="comma list of VARIANTS names (default: all)")
    ap.add_argument("--algos", type=Path, default=ROOT / "manifests" / "algos" / "h200.json")
    ap.add_argument("--kernels", type=Path, default=ROOT / "kernels")
    ap.add_argument("--ablate", default="", help="a variant whose timing ablations to write too (ABLATIONS)")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(VARIANTS)
    if args.ablate and args.ablate not in names:
        names.append(args.ablate)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        print(f"decode_variants: unknown variant(s) {unknown}; known: {list(VARIANTS)}", file=sys.stderr)
        return 1
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        print(f"decode_variants: --out {args.out} exists and is not a directory", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"decode_variants: --out {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    paths = []
    for name in names:
        out = args.out / f"qwen3-4b-{name}.json"
        rc = gq.main(["--shape", "qwen3-4b", "--algos", str(args.algos), "--kernels", str(args.kernels),
                      "--out", str(out), "--name", f"qwen3-4b-{name}", *VARIANTS[name]])
        if rc != 0:
            return rc
        paths.append(str(out))
    if args.ablate:
        from tools.ablate_manifest import AblationError

        try:
            paths += write_ablations(args.out / f"qwen3-4b-{args.ablate}.json", args.out)
        except (AblationError, OSError) as exc:
            print(f"decode_variants: --ablate {args.ablate}: {exc}", file=sys.stderr)
            return 1
    (args.out / "list").write_text(",".join(paths))
    print(f"decode_variants: {len(paths)} manifests in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
