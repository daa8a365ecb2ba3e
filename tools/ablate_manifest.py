"""Timing ablations of a manifest's decode program: the same manifest with some decode calls removed.

What a call costs inside the decode step is not what it costs alone: kernels overlap under programmatic
dependent launch, and their memory traffic slows each other. Removing calls from the step and timing the rest
with `bench/decode.py --variants` measures that in place (the full step minus the step without the calls).
The outputs of an ablated manifest are meaningless (later calls read what the removed ones no longer write);
only its timing is. Its name gets the suffix `-without-<ops>` and `meta.ablation` lists the removed ops, so it
cannot be mistaken for a model manifest. The prefill program is unchanged.

    python tools/ablate_manifest.py manifests/qwen3-4b-v2.json --drop qk_norm_rope_kv,attn_decode --out /tmp/a.json

Errors (exit 1, one line): the input is not a manifest with a decode program, an op named in --drop is not
called by the decode program, or nothing would be left of it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gen_qwen3 import dumps, manifest_digest  # noqa: E402


class AblationError(Exception):
    """The manifest or the ops to drop do not make an ablation; the message says why."""


def ablate(manifest: dict[str, Any], drop: list[str]) -> dict[str, Any]:
    """A copy of `manifest` whose decode program lacks every call of the ops in `drop`, renamed, with
    `meta.ablation` = the dropped ops and a fresh digest. Raises AblationError (see the module docstring)."""
    try:
        calls = manifest["programs"]["decode"]["calls"]
    except (KeyError, TypeError):
        raise AblationError("the manifest has no programs.decode.calls") from None
    called = {c.get("op") for c in calls}
    missing = [op for op in drop if op not in called]
    if missing:
        raise AblationError(f"ops {missing} are not called by the decode program (it calls {sorted(called - {None})})")
    kept = [c for c in calls if c.get("op") not in drop]
    if not kept:
        raise AblationError("dropping those ops leaves an empty decode program")
    out = json.loads(json.dumps(manifest))
    out["programs"]["decode"]["calls"] = kept
    out["name"] = f"{manifest.get('name', 'manifest')}-without-{'-'.join(drop)}"
    out.setdefault("meta", {})["ablation"] = {"dropped_decode_ops": list(drop),
                                              "note": "timing only: the outputs of this manifest are meaningless"}
    out["digest"] = manifest_digest(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("manifest", type=Path)
    parser.add_argument("--drop", required=True, help="comma list of op names whose decode calls are removed")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        manifest = json.loads(args.manifest.read_text())
        out = ablate(manifest, [op for op in args.drop.split(",") if op])
    except (OSError, json.JSONDecodeError, AblationError) as exc:
        print(f"ablate_manifest: {args.manifest}: {exc}", file=sys.stderr)
        return 1
    args.out.write_text(dumps(out))
    print(f"ablate_manifest: wrote {args.out} ({len(out['programs']['decode']['calls'])} decode calls, "
          f"{len(manifest['programs']['decode']['calls']) - len(out['programs']['decode']['calls'])} removed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
