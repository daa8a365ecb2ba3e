"""Keep kernels/ to the cubins the tree names, and bring back an older commit's for an A/B.

Usage (from anywhere):
    python tools/kernels_dir.py unused           # list cubins neither kernels.json nor a manifest names
    python tools/kernels_dir.py prune            # delete them
    python tools/kernels_dir.py restore REV      # write the cubins REV named back from git (for an A/B run)

Why: the GPU machine receives the whole working tree (64 MiB at most, docs/perf.md "How to measure"), and every
rebuilt attention module adds ~1.5-1.9 MB. A cubin is named by `kernels/kernels.json` (the build) or by a
manifest in `manifests/` (its `modules`: `<module>-<sha12>.cubin`); any other one only served a manifest of an
earlier commit, and git keeps it. `restore REV` writes exactly the cubins REV's kernels.json and manifests/*.json
name (not every cubin REV's kernels/ held: those no manifest of REV named stay in older commits), each checked
against the sha256 its name pins; they are untracked, so they travel to the GPU machine with the tree, and
`prune` removes them again.

Errors (exit 2, one line on stderr): a kernels.json or manifest that is not JSON or lacks its module table;
`restore` of a revision git does not know, or a cubin whose bytes do not match its name. `unused` exits 1 when it
lists anything.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
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


def named_in_tree(root: Path = ROOT) -> set[str]:
    """Cubins named by root/kernels/kernels.json and root/manifests/*.json (the working tree, committed or not)."""
    names = _modules((root / "kernels" / "kernels.json").read_text(), str(root / "kernels" / "kernels.json"))
    for path in sorted((root / "manifests").glob("*.json")):
        names |= _modules(path.read_text(), str(path))
    return names


def unused(root: Path = ROOT) -> list[Path]:
    """The cubins in root/kernels that neither root's kernels.json nor its manifests name, sorted."""
    named = named_in_tree(root)
    return sorted(p for p in (root / "kernels").glob("*.cubin") if p.name not in named)


def _git(repo: Path, *args: str) -> bytes:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True)
    except OSError as exc:
        raise KernelsDirError(f"git {' '.join(args)}: {exc}") from None
    if done.returncode:
        raise KernelsDirError(f"git {' '.join(args)}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def _pinned(name: str, data: bytes) -> bool:
    """Whether `data` hashes to the sha256 prefix its file name `<module>-<sha12>.cubin` pins."""
    return hashlib.sha256(data).hexdigest()[:12] == name[: -len(".cubin")].rsplit("-", 1)[-1]


def restore(rev: str, out: Path = KERNELS, repo: Path = ROOT) -> list[Path]:
    """Write the cubins `rev`'s kernels.json and manifests name into `out`: those missing, or present with bytes
    that do not match their name (each through a temporary file renamed into place). Returns the written ones.
    Every cubin is read from git and checked before any is written."""
    names = _modules(_git(repo, "show", f"{rev}:kernels/kernels.json").decode(), f"{rev}:kernels/kernels.json")
    for path in _git(repo, "ls-tree", "--name-only", rev, "manifests/").decode().split():
        if path.endswith(".json"):
            names |= _modules(_git(repo, "show", f"{rev}:{path}").decode(), f"{rev}:{path}")
    todo = {}
    for name in sorted(names):
        target = out / name
        if target.is_file() and _pinned(name, target.read_bytes()):
            continue
        data = _git(repo, "show", f"{rev}:kernels/{name}")
        if not _pinned(name, data):
            raise KernelsDirError(f"{rev}:kernels/{name}: its bytes do not hash to the sha256 its name pins")
        todo[target] = data
    for target, data in todo.items():
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
    return list(todo)


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
                  f"({sum(w.stat().st_size for w in written):,} bytes); `prune` removes them")
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
