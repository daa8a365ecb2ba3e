"""Keep kernels/ to the cubins something at HEAD names, and bring back an older commit's for an A/B.

Usage (from anywhere):
    python tools/kernels_dir.py unused           # list cubins no kernels.json / committed manifest names
    python tools/kernels_dir.py prune            # delete them
    python tools/kernels_dir.py restore REV      # write REV's named cubins back from git (for an A/B run)

Why: the GPU machine receives the whole working tree (64 MiB at most, docs/perf.md "How to measure"), and every
rebuilt attention module adds ~1.5-1.9 MB. A cubin is named by `kernels/kernels.json` (the build) or by a
committed manifest's `modules` (`<module>-<sha12>.cubin`); any other one only served a manifest of an earlier
commit, and git keeps it: `restore REV` writes the cubins named by REV's kernels.json and manifests/*.json
(untracked, so they travel to the GPU machine with the tree; `prune` removes them again).

Errors (exit 2, one line on stderr): a kernels.json or manifest that is not JSON or lacks its module table;
`restore` of a revision git does not know. `unused` exits 1 when it lists anything.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels"


class KernelsDirError(Exception):
    """A module table that cannot be read, or a revision git cannot show."""


def _modules(text: str, source: str) -> set[str]:
    """Cubin file names a kernels.json (`modules.<m>.file`) or a manifest (`modules.<m>` = sha256) names."""
    try:
        doc = json.loads(text)
        modules = doc["modules"]
        if "format" in doc and str(doc["format"]).startswith("kern-kernels"):
            return {str(rec["file"]) for rec in modules.values()}
        return {f"{name}-{str(sha)[:12]}.cubin" for name, sha in modules.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise KernelsDirError(f"{source}: no readable module table ({type(exc).__name__}: {exc})") from None


def named_at_head(root: Path = ROOT) -> set[str]:
    """Cubins named by root/kernels/kernels.json and root/manifests/*.json."""
    names = _modules((root / "kernels" / "kernels.json").read_text(), str(root / "kernels" / "kernels.json"))
    for path in sorted((root / "manifests").glob("*.json")):
        names |= _modules(path.read_text(), str(path))
    return names


def unused(root: Path = ROOT) -> list[Path]:
    """The cubins in root/kernels that nothing at HEAD names, sorted."""
    named = named_at_head(root)
    return sorted(p for p in (root / "kernels").glob("*.cubin") if p.name not in named)


def _git(*args: str) -> bytes:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True)
    if done.returncode:
        raise KernelsDirError(f"git {' '.join(args)}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def restore(rev: str, out: Path = KERNELS) -> list[Path]:
    """Write the cubins `rev`'s kernels.json and manifests name into `out` (those missing); returns them."""
    names = _modules(_git("show", f"{rev}:kernels/kernels.json").decode(), f"{rev}:kernels/kernels.json")
    for path in _git("ls-tree", "--name-only", rev, "manifests/").decode().split():
        if path.endswith(".json"):
            names |= _modules(_git("show", f"{rev}:{path}").decode(), f"{rev}:{path}")
    written = []
    for name in sorted(names):
        target = out / name
        if not target.exists():
            target.write_bytes(_git("show", f"{rev}:kernels/{name}"))
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kernels_dir", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("unused", help="list cubins nothing at HEAD names (exit 1 if any)")
    sub.add_parser("prune", help="delete them")
    r = sub.add_parser("restore", help="write a revision's named cubins back from git")
    r.add_argument("rev")
    args = p.parse_args(argv)
    try:
        if args.command == "restore":
            written = restore(args.rev)
            print(f"kernels_dir: {len(written)} cubins of {args.rev} written "
                  f"({sum(w.stat().st_size for w in written) / 1e6:.1f} MB); `prune` removes them")
            return 0
        extra = unused()
        for path in extra:
            print(f"{path.relative_to(ROOT)} {path.stat().st_size}")
            if args.command == "prune":
                path.unlink()
        verb = "removed" if args.command == "prune" else "unused"
        print(f"kernels_dir: {len(extra)} cubins {verb}")
        return 1 if extra and args.command == "unused" else 0
    except KernelsDirError as exc:
        print(f"kernels_dir: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
