"""Build the API reference of the four kern packages from their docstrings, with pdoc, into build/api/.

Usage (from the repository root):
    uv run python tools/api_docs.py                 # writes build/api/index.html (git-ignored)
    uv run python tools/api_docs.py --out DIR

What is documented is each package's public API: pdoc follows the top-level `__all__` of kern_manifest,
kern_pool, kern_runtime and kern_run (the names tests/test_layering.py lets callers import).

The build fails (exit 1, one line per fault on stderr) when pdoc warns (a module that does not import, a name
in `__all__` that does not resolve, an annotation it cannot read), when a docstring's backticked reference does
not resolve (`kern_pkg.name.attr` anywhere, or `Class.attr` for a class of the same module), or when building
imported CUDA (`import kern_runtime` must not: it loads the driver, cuBLASLt and NCCL on first use). Exit 2: a
bad argument.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

PACKAGES = ("kern_manifest", "kern_pool", "kern_runtime", "kern_run")
ROOT = Path(__file__).resolve().parent.parent
QUALIFIED = re.compile(r"`((?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)+)(?:\([^`]*\))?`")
CLASS_ATTR = re.compile(r"`([A-Z]\w*)\.([a-z_]\w*)(?:\([^`]*\))?`")
CUDA_MODULES = ("cuda.bindings", "cupy", "nvmath")


def resolves(dotted: str) -> bool:
    """Whether `a.b.c` names something: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name) and name not in getattr(obj, "__dataclass_fields__", {}):
                return False
            obj = getattr(obj, name, None)
        return True
    return False


def has_member(cls: type, name: str) -> bool:
    return hasattr(cls, name) or name in getattr(cls, "__dataclass_fields__", {}) or \
        any(name in getattr(k, "__annotations__", {}) for k in cls.__mro__)


def broken_references(docs: Iterable[tuple[str, str, Mapping[str, Any]]]) -> list[str]:
    """Faults of `(where, docstring, module namespace)` items: a `kern_pkg.x.y` reference that does not resolve,
    or a `Class.attr` whose class (found in the namespace) has no such attribute."""
    out = []
    for where, doc, namespace in docs:
        out += [f"{where}: `{ref}` does not resolve" for ref in QUALIFIED.findall(doc) if not resolves(ref)]
        for cls, attr in CLASS_ATTR.findall(doc):
            obj = namespace.get(cls)
            if isinstance(obj, type) and not has_member(obj, attr):
                out.append(f"{where}: `{cls}.{attr}`: {cls} has no attribute {attr!r}")
    return out


def _walk(doc: Any) -> Iterator[Any]:
    import pdoc.doc

    yield doc
    if isinstance(doc, pdoc.doc.Namespace):
        for member in doc.own_members:
            yield from _walk(member)


def build(out: Path) -> list[str]:
    """Write the HTML reference into `out`; the faults (empty when the build is clean)."""
    import pdoc
    import pdoc.doc

    faults: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(*PACKAGES, output_directory=out)
        docs = [(d.fullname, d.docstring, vars(sys.modules[d.modulename]))
                for name in PACKAGES for d in _walk(pdoc.doc.Module(importlib.import_module(name)))]
    faults += [f"pdoc: {str(w.message).splitlines()[0]}" for w in caught]
    faults += broken_references(docs)
    faults += [f"building the docs imported {m}: a kern package imports CUDA at import time"
               for m in sorted(sys.modules) if m.startswith(CUDA_MODULES) and m.count(".") <= 1]
    return faults


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "api", help="output directory (build/api)")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        parser.exit(2, f"api_docs.py: --out {args.out}: exists and is not a directory\n")
    faults = build(args.out)
    for fault in faults:
        print(f"api_docs.py: {fault}", file=sys.stderr)
    if faults:
        return 1
    pages = sum(1 for _ in args.out.rglob("*.html"))
    print(f"API reference: {args.out / 'index.html'} ({pages} pages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
