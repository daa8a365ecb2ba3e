"""`kern run`: one target, one prompt, greedy generation streamed to stdout.

stdout carries only the generated text, written as tokens arrive and flushed; everything else goes to
stderr through structlog. After generation one stderr line gives prefill tokens/s, decode ms/token and
the number of tokens generated.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, TextIO

from .config import RunConfig
from .generate import GenerateOptions, GenerateResult
from .session import open_generator, prepare
from .text import StreamDecoder


@dataclass(frozen=True)
class RunRequest:
    prompt: str
    steps: int = 128
    eager: bool = False
    ignore_eos: bool = False


def run_target(cfg: RunConfig, req: RunRequest, log: Any, out: TextIO | None = None) -> GenerateResult:
    """Preflight, load, generate, stream to `out` (default: stdout). Raises RefusalError / kern_runtime.KernError."""
    out = out if out is not None else sys.stdout
    prep = prepare(cfg, prompts=[req.prompt])  # the prompt is checked before the device probe
    prompt_ids = list(prep.prompt_ids[0])
    log.info(f"prompt: {len(prompt_ids)} tokens; chunk {prep.chunk}; steps {req.steps}; "
             f"{'eager' if req.eager else 'graph'} decode")
    with open_generator(prep, log) as gen:
        stream = StreamDecoder(prep.codec)
        opts = GenerateOptions(req.steps, prep.chunk, req.eager, not req.ignore_eos)
        result = gen.generate(prompt_ids, opts, stream.writer(out))
        stream.finish(out)
    t = result.timings
    log.info(f"prefill {t.prefill_tokens} tokens + first token in {t.prefill_s * 1e3:.1f} ms "
             f"({t.prefill_tokens_per_s:.0f} tokens/s); decode {t.decode_ms_per_token:.3f} ms/token; "
             f"{len(result.tokens)} tokens generated (stop: {result.stop_reason})")
    return result
