"""`kern-manifest check FILE`: verify a manifest and print what it declares, or every fault (exit 1).

The file is read by `kern_manifest.read_manifest_bytes` (a regular file of at most 64 MiB; anything else is
an unreadable file, refused before it is read).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import TextIO

from . import __version__
from .errors import ManifestParseError, ManifestVerifyError
from .model import ExternLaunch, Manifest
from .files import format_bytes as _bytes
from .files import read_manifest_bytes
from .formats import other_kern_file
from .parse import parse_manifest
from .pipes import quiet_on_closed_pipe
from .verify import verify

__all__ = ["check", "main"]  # `kern manifest check` (kern_run.cli) runs `check` itself


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key putting digit runs in number order: `k_norm.2` before `k_norm.10` (plain sorting gives
    `k_norm.0, k_norm.1, k_norm.10`)."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part)


def summary(m: Manifest) -> str:
    """A short human summary of a verified manifest: vars, modules, buffers by kind (bytes at var max),
    states, ops, programs (call counts, graph capture keys). Buffer and state names are listed in natural order
    (`natural_key`), ops and programs in the manifest's."""
    lines = [f"{m.name}  ({m.format}, digest {m.digest[:12]})"]
    lines.append("vars: " + ", ".join(f"{n}=[{v.min}, {v.max}]" for n, v in m.vars.items()))
    lines.append(f"modules ({len(m.modules)}): " + ", ".join(mod.cubin_filename for mod in m.modules.values()))
    by_kind: dict[str, list[tuple[str, int]]] = {}
    for name, buf in m.buffers.items():  # kinds in the manifest's order, names in natural order
        by_kind.setdefault(buf.kind, []).append((name, buf.nbytes_at_max(m.vars)))
    for items in by_kind.values():
        items.sort(key=lambda item: natural_key(item[0]))
    lines.append("buffers (bytes at var max):")
    for kind, items in by_kind.items():
        total = sum(n for _, n in items)
        lines.append(f"  {kind:<9} {len(items):>4} buffer(s) {_bytes(total):>10}   "
                     + ", ".join(name for name, _ in items[:6]) + (" ..." if len(items) > 6 else ""))
    if m.states:
        lines.append(f"states ({len(m.states)}):")
        groups: dict[str, list[str]] = {}
        for name, st in sorted(m.states.items(), key=lambda item: natural_key(item[0])):  # groups: first name's order
            detail = {"fixed": f"{st.bytes} B", "paged": f"{st.bytes_per_token} B/token, {st.page_tokens} tokens/page",
                      "per_seq": f"{st.bytes_per_seq} B/seq"}[st.kind]
            groups.setdefault(f"{st.kind}, {detail}", []).append(name)
        for detail, names in groups.items():
            shown = ", ".join(names[:4]) + (f" ... ({len(names)})" if len(names) > 4 else "")
            lines.append(f"  {shown}: {detail}")
    kernels = sum(1 for op in m.ops.values() for launch in op.launches if not isinstance(launch, ExternLaunch))
    externs = sum(1 for op in m.ops.values() for launch in op.launches if isinstance(launch, ExternLaunch))
    lines.append(f"ops ({len(m.ops)}, {kernels} kernel launch(es), {externs} extern): " + ", ".join(m.ops))
    lines.append("programs:")
    for name, prog in m.programs.items():
        calls = prog.num_calls(m)
        if prog.graph:
            key = ", ".join(sorted(prog.vars_read(m))) or "none"
            how = f"graph ({calls} calls -> 1 graph launch), capture key: {key}"
        else:
            how = f"{calls} call(s)"
        lines.append(f"  {name} [{prog.kind}]: {how}")
    if m.topology.groups:
        lines.append("topology: " + ", ".join(f"{n} x{g.size}" for n, g in m.topology.groups.items()))
    return "\n".join(lines)


def check(path: str, out: TextIO, err: TextIO) -> int:
    """Parse and verify `path`; print the summary (exit 0) or the faults (exit 1). A file that cannot be read,
    is not a regular file or is larger than MAX_MANIFEST_BYTES: one line `PATH: cannot read: WHY` (exit 1)."""
    try:
        text = read_manifest_bytes(path)
    except OSError as exc:
        print(f"{path}: cannot read: {exc.strerror or exc}", file=err)
        return 1
    try:
        manifest = parse_manifest(text)
        verify(manifest)
    except ManifestParseError as exc:
        other = other_kern_file(text)
        if other is not None:  # a pins file or kernels.json given for a manifest: say what it is
            print(f"{path} is {other}: pass a manifest (kern-manifest/1, e.g. manifests/*.json)", file=err)
            return 1
        print(f"{path}: parse error at {exc.path}: {exc.message}", file=err)
        return 1
    except ManifestVerifyError as exc:
        print(f"{path}: {len(exc.faults)} fault(s)", file=err)
        for fault in exc.faults:
            print(f"  {fault.path}: {fault.message}", file=err)
        return 1
    print(summary(manifest), file=out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`kern-manifest` with `argv` (default: sys.argv); the exit code. A closed stdout (`| head -1`) ends it
    quietly with exit 1 (kern_manifest.pipes)."""
    return quiet_on_closed_pipe(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="kern-manifest", description="kern manifest tools (docs/manifest.md)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p_check = sub.add_parser("check", help="verify a manifest and summarise it, or list its faults (exit 1)")
    p_check.add_argument("file", help="manifest JSON file")
    args = parser.parse_args(argv)
    if args.command == "check":
        return check(args.file, sys.stdout, sys.stderr)
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
