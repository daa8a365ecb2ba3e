"""`kern-pool simulate --sweep --png`: the hit-rate curve, beside reference curves only where they apply.

The reference points (the FAST'25 paper's Figure 9 and the helper baseline of ../shared/traces/README.md, beside the
kern checkout) were measured on two exact files: the complete Mooncake conversation and synthetic traces, all
requests, 512-token blocks, no host tier, prompt tokens only. A `Reference` carries that provenance (the file's
sha256 and request count, from ../shared/traces/README.md) and `reference_for` draws one only for a replay of the
same bytes under the same settings: a file merely named `*conversation*`, a `--limit` shorter than the trace, other
pages, a host tier or `--reserve-output` get no reference, and the reason is said. `check_png_path` refuses an
output path that could not be written before any replay runs (a sweep takes about 40 s).
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

from .simulate import TRACE_BLOCK_TOKENS, SimConfig, SimResult

Points = tuple[tuple[float, float], ...]  # (capacity in tokens, hit rate by tokens); math.inf: everything fits


@dataclass(frozen=True)
class Reference:
    """Reference curves measured on one trace file. `sha256`: the file's digest; `requests`: its request count;
    `published`: FAST'25 Fig. 9 read off the plot (+-0.02; 1e9 stands for the plot's rightmost point);
    `baseline`: the helper's block-LRU replay (../shared/traces/README.md)."""

    name: str
    sha256: str
    requests: int
    published: Points
    baseline: Points

    def caption(self) -> str:
        """Which measurements the reference curves are: file, digest and settings."""
        return (f"references: {self.name} (sha256 {self.sha256[:12]}), all {self.requests:,} requests, "
                f"{TRACE_BLOCK_TOKENS}-token pages, no host tier, prompt tokens only")


REFERENCES = (
    Reference("mooncake_conversation_trace.jsonl",
              "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df", 12031,
              ((1e4, .045), (1e5, .07), (1e6, .09), (2e6, .12), (3e6, .165), (1e7, .33), (5e7, .40), (1e9, .40)),
              ((1e4, .026), (1e5, .043), (1e6, .054), (2e6, .086), (3e6, .138), (5e6, .210), (1e7, .291),
               (2e7, .358), (5e7, .371), (math.inf, .374))),
    Reference("mooncake_synthetic_trace.jsonl",
              "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131", 3993,
              ((1e4, .00), (1e5, .012), (1e6, .15), (2e6, .23), (3e6, .30), (1e7, .59), (5e7, .66), (1e9, .66)),
              ((1e4, .000), (1e5, .012), (1e6, .142), (2e6, .232), (3e6, .315), (5e6, .428), (1e7, .577),
               (2e7, .651), (5e7, .651), (math.inf, .651))),
)


def file_sha256(path: Path) -> str:
    """Hex sha256 of the file at `path`, read in 1 MiB pieces. Raises OSError."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(1 << 20):
            digest.update(piece)
    return digest.hexdigest()


def reference_for(trace: Path, cfg: SimConfig) -> tuple[Reference | None, str]:
    """(the reference measured on this replay's trace and settings, or None; a line saying which it is or why
    there is none). Raises OSError when the trace cannot be read."""
    sha = file_sha256(trace)
    ref = next((r for r in REFERENCES if r.sha256 == sha), None)
    if ref is None:
        return None, (f"no reference curves: {trace.name} (sha256 {sha[:12]}) is not a trace they were measured on "
                      f"({', '.join(r.name for r in REFERENCES)})")
    differs = []
    if cfg.limit is not None and cfg.limit < ref.requests:
        differs.append(f"--limit {cfg.limit} replays {cfg.limit:,} of its {ref.requests:,} requests")
    if cfg.page_tokens != TRACE_BLOCK_TOKENS:
        differs.append(f"--page-tokens {cfg.page_tokens}, not {TRACE_BLOCK_TOKENS}")
    if cfg.host_tokens:
        differs.append(f"--host-tokens {cfg.host_tokens} adds a host tier")
    if cfg.reserve_output:
        differs.append("--reserve-output leases output tokens too")
    if differs:
        return None, f"no reference curves: they were measured on all of {ref.name}; " + "; ".join(differs)
    return ref, ref.caption()


def check_png_path(path: Path) -> str | None:
    """Why the plot could not be written to `path` (a line), or None: the name must end in .png, the folder must
    exist and be writable, and an existing file there must be a writable regular file."""
    if path.suffix.lower() != ".png":
        return f"--png {path}: the file name must end in .png (the curve is written as a PNG image)"
    folder = path.parent
    if not folder.is_dir():
        return f"--png {path}: the folder {folder} does not exist"
    if path.exists() and not path.is_file():
        return f"--png {path} exists and is not a regular file"
    if not os.access(path if path.exists() else folder, os.W_OK):
        return f"--png {path}: {'the file' if path.exists() else f'the folder {folder}'} is not writable"
    return None


def plot_sweep(results: list[SimResult], reference: Reference | None, out_png: Path) -> None:
    """Hit rate vs capacity (log x) of this run, beside `reference`'s published and baseline points when given
    (labelled with the file they were measured on, and a caption saying which). Needs matplotlib
    (`pip install 'kern-pool[plot]'`); raises `RuntimeError` with that hint when it is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RuntimeError("plotting needs matplotlib: pip install 'kern-pool[plot]'") from e
    finite = [r.capacity_tokens for r in results if not math.isinf(r.capacity_tokens)]
    inf_x = (max(finite) if finite else 1e7) * 4

    def x(v: float) -> float:
        return inf_x if math.isinf(v) else v

    fig, ax = plt.subplots(figsize=(7, 4.8))
    runs = f"{results[0].requests:,} requests" if results else ""
    ax.plot([x(r.capacity_tokens) for r in results], [r.hit_rate for r in results], "o-",
            label=f"kern-pool (this run, {runs})")
    if reference is not None:
        pub, base = reference.published, reference.baseline
        ax.plot([p[0] for p in pub], [p[1] for p in pub], "s--", label=f"FAST'25 Fig. 9, {reference.name} "
                                                                       "(read off, +-0.02)")
        ax.plot([x(p[0]) for p in base], [p[1] for p in base], "^:",
                label=f"helper baseline (block LRU), {reference.name}")
        fig.text(0.01, 0.01, reference.caption(), fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("cache capacity (tokens; rightmost = everything fits)")
    ax.set_ylabel("prefix hit rate (tokens)")
    ax.set_title(f"{results[0].trace if results else ''}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
