"""The miner's report (`kern harvest mine`): what the capture holds, how each pointer was classified, and every
value that was fitted as an expression in the token count."""

from __future__ import annotations

from collections import Counter

from .fit import Fit
from .mine import Mined, PointerArg, RawArg, ScalarArg
from .workspace import Lifetime, pack


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _fit_text(fit: Fit, var: str) -> str:
    where = ", ".join(f"{v} at {var}={t}" for t, v in fit.samples)
    exact = "exact on the domain" if fit.exact_on_domain else "between the runs: the family's prediction"
    return f"{fit.expr} ({fit.family}: {where}; {exact})"


def report_lines(mined: Mined) -> list[str]:
    """Lines of the report: a summary, pointer classes, workspace, then one line per fitted (non-literal) value."""
    var = mined.var
    lines = [f"runs at {var} = {', '.join(map(str, mined.tokens))}; {len(mined.launches)} launches each, "
             f"{len({(m.module, m.function) for m in mined.launches})} kernels in {len(mined.cubins)} cubins"]
    pointers = Counter(a.kind for m in mined.launches for a in m.args if isinstance(a, PointerArg))
    targets = {kind: len({a.target for m in mined.launches for a in m.args if isinstance(a, PointerArg)
                          and a.kind == kind}) for kind in pointers}
    lines.append("pointers: " + (", ".join(f"{pointers[k]} {k} ({targets[k]} distinct)" for k in
                                           ("weight", "state", "input", "output", "workspace") if k in pointers)
                                 or "none"))
    scalars = [a for m in mined.launches for a in m.args if isinstance(a, ScalarArg)]
    raws = sum(1 for m in mined.launches for a in m.args if isinstance(a, RawArg))
    lines.append(f"scalars: {sum(1 for a in scalars if a.value.is_literal)} literal, "
                 f"{sum(1 for a in scalars if not a.value.is_literal)} fitted; raw parameters: {raws}")
    offsets, arena = pack([Lifetime(f"#{a.ordinal}", a.nbytes_max, a.first, a.last) for a in mined.allocations])
    total = sum(a.nbytes_max for a in mined.allocations)
    lines.append(f"workspace: {len(mined.allocations)} intermediate allocation(s), {_bytes(total)} in all, packed by "
                 f"lifetime into {_bytes(arena)}")
    for a in mined.allocations:
        lines.append(f"  allocation #{a.ordinal}: {_fit_text(a.size, var)} bytes, launches {a.first}..{a.last}, "
                     f"at workspace offset {offsets[f'#{a.ordinal}']}")
    for m in mined.launches:
        for d, f in enumerate(m.grid):
            if not f.is_literal:
                lines.append(f"launch {m.index} grid.{'xyz'[d]} = {_fit_text(f, var)}")
        for j, a in enumerate(m.args):
            fit = a.value if isinstance(a, ScalarArg) else a.offset if isinstance(a, PointerArg) else None
            if fit is not None and not fit.is_literal:
                what = "value" if isinstance(a, ScalarArg) else f"offset into {a.kind} {a.target}"  # type: ignore[union-attr]
                lines.append(f"launch {m.index} param {j} {what} = {_fit_text(fit, var)}")
    for t in mined.tensors.values():
        if any(not d.is_literal for d in t.shape):
            lines.append(f"{t.kind} {t.name} shape = [{', '.join(str(d.expr) for d in t.shape)}]")
    return lines
