"""`kern harvest capture | mine | generate`: each command's work, called by kern_run.cli with parsed options.

Each returns the lines to print (stdout) or raises a RefusalError (CaptureFormatError, HarvestRefusal,
CaptureError) that the CLI prints as one line; `mine` and `generate` print a refusal's whole report (one line
per problem) on stderr first.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .capture_format import read_capture
from .errors import CaptureError, HarvestRefusal

ENVIRONMENT = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1",  # each tensor its own cudaMalloc: allocations are events
               "CUDA_MODULE_LOADING": "EAGER"}  # a module's cubin arrives inside the load call that made it


def _with_report(fn):  # type: ignore[no-untyped-def]
    try:
        return fn()
    except HarvestRefusal as refusal:
        for line in refusal.report():
            print(f"unexplained: {line}", file=sys.stderr)
        raise


def mine_lines(capture_dir: Path) -> list[str]:
    """The miner's report of a capture directory (kern_run.harvest.report)."""
    from .mine import mine
    from .report import report_lines

    return _with_report(lambda: report_lines(mine(read_capture(capture_dir))))


def generate_lines(capture_dir: Path, out: Path, name: str | None) -> list[str]:
    """Write the manifest and its kernels to `out` (kern_run.harvest.generate); a summary."""
    from .generate import generate, summary_lines

    def go() -> list[str]:
        try:
            manifest, _ = generate(capture_dir, out, name)
        except OSError as exc:
            raise CaptureError(f"--out {out}: {exc.strerror or exc}") from None
        return [*summary_lines(manifest), f"wrote {out / 'manifest.json'} and {out / 'kernels'}"]

    return _with_report(go)


def capture_lines(weights: Path, out: Path, tokens: list[int], context: int, warmup: int, dynamic: str,
                  gpu: int, scope: str = "layer", autotune_tokens: int | None = None) -> list[str]:
    """Capture the Qwen3 step (kern_run.harvest.torch_step, compiled at `scope`: layer or step; its GEMMs autotuned
    at `autotune_tokens` rows, None: inductor's hint for an unbacked size) of checkpoint `weights` into `out`. Sets
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 and CUDA_MODULE_LOADING=EAGER where unset, before torch starts CUDA."""
    if sorted(set(tokens)) != sorted(tokens) or not tokens or min(tokens) < 1:
        raise CaptureError(f"--tokens {tokens}: give distinct token counts >= 1 (e.g. --tokens 1 --tokens 2)")
    if context < max(tokens) or context < 1:
        raise CaptureError(f"--context {context}: must hold the largest token count ({max(tokens)})")
    if warmup < 1:
        raise CaptureError(f"--warmup {warmup}: at least 1 (compilation and autotuning must happen before recording)")
    if dynamic not in ("unbacked", "backed", "static"):
        raise CaptureError(f"--dynamic {dynamic!r}: expected unbacked, backed or static")
    if autotune_tokens is not None and autotune_tokens < 1:
        raise CaptureError(f"--autotune-tokens {autotune_tokens}: at least 1 (the rows the GEMMs are tuned for)")
    from .torch_step import COMPILE_SCOPES  # torch-free: torch_step imports torch only inside its methods

    if scope not in COMPILE_SCOPES:
        raise CaptureError(f"--compile-scope {scope!r}: expected {' or '.join(COMPILE_SCOPES)}")
    if not (weights / "config.json").is_file():
        raise CaptureError(f"--weights {weights}: no config.json (a Hugging Face Qwen3 checkpoint directory)")
    if out.exists():
        raise CaptureError(f"--out {out}: exists; refusing to replace it")
    for key, value in ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    try:
        import torch
        from cupti import cupti  # noqa: F401 - the capture needs it; say so before compiling for minutes
    except ImportError as exc:
        raise CaptureError(f"{exc.name} is not installed (the capture needs torch and cupti-python on the GPU "
                           f"machine; docs/harvest.md)") from None
    from .capture import CaptureOptions, capture
    from .torch_step import Qwen3Step

    torch.cuda.set_device(gpu)
    lines: list[str] = []
    result, _ = capture(lambda: Qwen3Step(weights, context, dynamic=dynamic, scope=scope,
                                          autotune_tokens=autotune_tokens),
                        CaptureOptions(tuple(tokens), warmup), out,
                        source={"model": weights.name, "context": context, "dynamic": dynamic, "scope": scope,
                                "autotune_tokens": autotune_tokens,
                                "module_loading": os.environ.get("CUDA_MODULE_LOADING")},
                        progress=lambda line: print(f"kern harvest capture: {line}", file=sys.stderr, flush=True))
    for run in result.runs:
        lines.append(f"run at {run.tokens} token(s): {len(run.launches)} launches, {len(run.events)} events, "
                     f"{len(run.tensors)} named tensors")
    lines.append(f"wrote {out}: {len(result.cubins)} cubin(s)")
    return lines
