"""Timing ablations of a manifest's decode program: the same manifest with some decode calls (or launches) removed.

What a call costs inside the decode step is not what it costs alone: kernels overlap under programmatic
dependent launch, and their memory traffic slows each other. Removing calls from the step and timing the rest
with `bench/decode.py --variants` measures that in place (the full step minus the step without the calls).
The outputs of an ablated manifest are meaningless (later calls read what the removed ones no longer write);
only its timing is. Its name gets the suffix `-without-<ops / entries>` and `meta.ablation` lists what was
removed, so it cannot be mistaken for a model manifest. `--drop` removes an op's calls from the decode program
(the prefill program is unchanged); `--drop-entry` removes every launch of a kernel entry from the ops the
decode program calls (e.g. the split reduce of the decode attention; an op it is also used by in prefill then
loses it there too, so time only the decode program).

    python tools/ablate_manifest.py manifests/qwen3-4b-v2.json --drop qk_norm_rope_kv,attn_decode --out /tmp/a.json
    python tools/ablate_manifest.py manifests/qwen3-4b-v2.json --drop-entry kern_attn_decode_reduce --out /tmp/b.json

Errors (exit 1, one line): the input cannot be read, is not UTF-8 JSON or is not a manifest with a decode
program (programs.decode.calls a list of call objects with op names; the ops --drop-entry touches with lists
of launch objects), an op named in --drop is not called by the decode program, an entry of --drop-entry is
launched by none of its ops, is the only launch of one (drop the op's calls instead) or one range of a
`when`-group (the group would leave tokens values without a launch), nothing to drop, or
nothing would be left of it; an --out that cannot be written (written through a temporary file and renamed:
never left half-written).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kern_run.errors import ManifestBuildError
from kern_run.files import write_files
from kern_run.models.qwen3 import dumps, manifest_digest, read_json_file


class AblationError(Exception):
    """The manifest or the ops to drop do not make an ablation; the message says why."""


def ablate(manifest: dict[str, Any], drop: list[str], drop_entries: list[str] = ()) -> dict[str, Any]:
    """A copy of `manifest` whose decode program lacks every call of the ops in `drop` and whose decode ops lack
    every launch of the entries in `drop_entries`, renamed, with `meta.ablation` = what was dropped and a fresh
    digest. Raises AblationError (see the module docstring)."""
    try:
        calls = manifest["programs"]["decode"]["calls"]
    except (KeyError, TypeError):
        raise AblationError("the manifest has no programs.decode.calls") from None
    if not isinstance(calls, list):
        raise AblationError(f"programs.decode.calls is a JSON {type(calls).__name__}, expected a list of calls")
    for i, c in enumerate(calls):
        if not isinstance(c, dict) or not isinstance(c.get("op", ""), str):
            raise AblationError(f"programs.decode.calls[{i}] is not a call object with an op name: "
                                f"{json.dumps(c)[:80]}")
    if not drop and not drop_entries:
        raise AblationError("nothing to drop: give ops (--drop) or entries (--drop-entry)")
    called = {c.get("op") for c in calls}
    missing = [op for op in drop if op not in called]
    if missing:
        raise AblationError(f"ops {missing} are not called by the decode program (it calls {sorted(called - {None})})")
    kept = [c for c in calls if c.get("op") not in drop]
    if not kept:
        raise AblationError("dropping those ops leaves an empty decode program")
    out = json.loads(json.dumps(manifest))
    out["programs"]["decode"]["calls"] = kept
    decode_ops = {c.get("op") for c in kept}
    ops = out.get("ops", {})
    if drop_entries and not isinstance(ops, dict):
        raise AblationError(f"ops is a JSON {type(ops).__name__}, expected an object")
    for entry in drop_entries:
        hits = 0
        for name in sorted(op for op in decode_ops if op in ops):
            launches = ops[name].get("launches") if isinstance(ops[name], dict) else None
            if not isinstance(launches, list) or not all(isinstance(launch, dict) for launch in launches):
                raise AblationError(f"ops.{name}.launches is not a list of launch objects")
            left = [launch for launch in launches if launch.get("entry") != entry]
            if len(left) == len(launches):
                continue
            ranged = [launch["when"] for launch in launches if launch.get("entry") == entry and "when" in launch]
            if ranged:
                raise AblationError(f"{entry}'s launch in op {name!r} covers {ranged[0]} of a `when`-group: dropping "
                                    f"it leaves that range without a launch")
            if not left:
                raise AblationError(f"{entry} is the only launch of op {name!r}: drop the op's calls (--drop) instead")
            ops[name]["launches"] = left
            hits += 1
        if not hits:
            raise AblationError(f"no op the decode program calls launches {entry}")
    if not isinstance(out.get("meta", {}), dict):
        raise AblationError(f"meta is a JSON {type(out['meta']).__name__}, expected an object")
    out["name"] = f"{manifest.get('name', 'manifest')}-without-{'-'.join([*drop, *drop_entries])}"
    out.setdefault("meta", {})["ablation"] = {"dropped_decode_ops": list(drop), "dropped_entries": list(drop_entries),
                                              "note": "timing only: the outputs of this manifest are meaningless"}
    out["digest"] = manifest_digest(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("manifest", type=Path)
    parser.add_argument("--drop", default="", help="comma list of op names whose decode calls are removed")
    parser.add_argument("--drop-entry", default="", help="comma list of kernel entries whose launches are removed "
                                                         "from the ops the decode program calls")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        manifest = read_json_file(args.manifest)[0]  # ManifestBuildError "{path}: {why}" when unreadable, not UTF-8 or JSON
        out = ablate(manifest, [op for op in args.drop.split(",") if op],
                     [entry for entry in args.drop_entry.split(",") if entry])
    except ManifestBuildError as exc:
        print(f"ablate_manifest: {exc}", file=sys.stderr)
        return 1
    except AblationError as exc:
        print(f"ablate_manifest: {args.manifest}: {exc}", file=sys.stderr)
        return 1
    try:
        write_files({args.out: dumps(out)})  # through a temporary file: never a half-written --out
    except OSError as exc:
        print(f"ablate_manifest: --out {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"ablate_manifest: wrote {args.out} ({len(out['programs']['decode']['calls'])} decode calls, "
          f"{len(manifest['programs']['decode']['calls']) - len(out['programs']['decode']['calls'])} removed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
