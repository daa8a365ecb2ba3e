"""Open a target for generation: preflight refusals, then the runtime load with progress and a summary.

`open_generator` is what `kern run`, `kern test`, the parity tests and the benches share: every check
that can fail without a GPU runs first (docs/caller.md "Refusals"), then the runtime loads.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .config import RunConfig
from .generate import Generator, WarmUp
from .errors import InputError, WeightsError
from .preflight import (
    ManifestFacts, check_capacity, check_kernels, check_prompt, check_weights, checkpoint_tensors, probe_device,
    read_manifest, resolve_chunk,
)
from .sampler_meta import SamplerFacts, check_params, read_sampler
from .sampling import SamplingParams
from .summary import manifest_lines, runtime_lines
from .text import TextCodec, checked_prompt, load_codec


@dataclass(frozen=True)
class Prepared:
    """A target that passed preflight: manifest facts, tokenizer, chunk."""

    cfg: RunConfig
    facts: ManifestFacts
    codec: TextCodec
    chunk: int
    prompt_ids: tuple[tuple[int, ...], ...] = ()  # the `prompts` given to prepare, tokenized and checked
    sampler: SamplerFacts | None = None  # the manifest's GPU sampler (meta.caller.sampling); None: argmax decode


def prepare(cfg: RunConfig, check_device: bool = True, prompts: Sequence[str] = (),
            shared_pool: bool = False, sampling: SamplingParams | None = None,
            sampling_from: str = "sampling") -> Prepared:
    """Every refusal that needs no GPU, then the device probe last, so a machine without a GPU still
    reports a bad manifest, capacity, kernels directory, checkpoint, chunk or prompt (each of `prompts` is
    tokenized and checked against the capacity; with several, the refusal names the prompt's number), or
    `sampling` settings the manifest cannot run (a sampled or penalized setting on an argmax manifest, more top
    logprobs than its program writes: SamplingError naming `sampling_from`). A capacity given above the
    manifest's max context is refused unless several prompts share the pool (their cached prefixes use it), or
    `shared_pool` says requests will (`kern serve`). Raises RefusalError subclasses."""
    facts = read_manifest(cfg.manifest)
    sampler = read_sampler(facts.manifest, cfg.manifest)
    if sampling is not None:
        check_params(sampler, sampling, sampling_from)
    check_capacity(cfg.capacity_tokens, cfg.capacity_from, facts, one_sequence=len(prompts) <= 1 and not shared_pool)
    chunk = resolve_chunk(cfg.chunk, facts)
    check_kernels(facts, cfg.kernels)
    tensors = checkpoint_tensors(cfg.weights)
    try:
        check_weights(facts, tensors, cfg.weights)
    except WeightsError as exc:  # name the manifest: `kern test --against B` prepares two
        raise WeightsError(f"{exc} (manifest {cfg.manifest})") from None
    codec = load_codec(cfg.weights)
    prompt_ids = []
    for i, prompt in enumerate(prompts, 1):
        try:
            ids = checked_prompt(codec, prompt)
            check_prompt(len(ids), cfg.capacity_tokens, facts)
        except InputError as exc:
            if len(prompts) == 1:
                raise
            raise InputError(f"prompt {i} of {len(prompts)}: {exc}") from None
        prompt_ids.append(tuple(ids))
    if check_device:
        probe_device(cfg.gpu)
    return Prepared(cfg, facts, codec, chunk, tuple(prompt_ids), sampler)


def progress_reporter(enabled: bool) -> tuple[Callable[[int, int], None] | None, Callable[[], None]]:
    """(callback(bytes_done, bytes_total), close) drawing a rich bar on stderr; (None, noop) when disabled."""
    if not enabled:
        return None, lambda: None
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    bar = Progress("weights", BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=Console(stderr=True),
                   transient=True)
    bar.start()
    task = bar.add_task("load", total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return update, bar.stop


def open_generator(prep: Prepared, log: Any, show_progress: bool | None = None, resident: Any = None,
                   warm_buckets: Sequence[int] | None = None, eager: bool = False) -> Generator:
    """Load the runtime for a prepared target, log the declaration summary and the weight load rate, then, given
    `warm_buckets`, warm it up (`Generator.warm_up`: a scratch-page prefill chunk per launch variant and one decode
    step at each of `warm_buckets` rows, eager or captured as a graph) and log its one line, `warm-up N ms` (kept
    as `gen.warmed`). `kern run` warms the buckets its batch can use; None (kern test, kern serve, which warms
    its own buckets): no warm-up.

    `resident`: device weights kept by `Runtime.into_resident()` of an earlier runtime on the same GPU.
    """
    for line in manifest_lines(prep.facts.manifest):
        log.info(line)
    if show_progress is None:
        show_progress = sys.stderr.isatty()
    progress, stop_progress = progress_reporter(show_progress)
    t0 = time.perf_counter()
    try:
        gen = Generator.open(prep.cfg.manifest, prep.cfg.kernels, prep.cfg.weights, prep.facts, gpu=prep.cfg.gpu,
                             capacity_tokens=prep.cfg.capacity_tokens, eos_ids=prep.codec.eos_ids, progress=progress,
                             resident=resident)
    finally:
        stop_progress()
    secs = time.perf_counter() - t0
    nbytes, wsecs = gen.rt.weight_load_stats
    log.info(f"weights: {nbytes / 1e9:.2f} GB in {wsecs:.2f} s = {nbytes / 1e9 / max(wsecs, 1e-9):.1f} GB/s; "
             f"runtime ready in {secs:.2f} s")
    for line in runtime_lines(gen.rt.describe()):
        log.debug(line)
    log.info(f"kv pool: {gen.max_positions} positions ({gen.rt.num_pages} pages of {gen.page_tokens})")
    if warm_buckets is not None:
        try:
            warmed: WarmUp = gen.warm_up(warm_buckets, eager, prep.sampler)
        except BaseException:
            gen.close()
            raise
        gen.warmed = warmed
        log.info(warmed.line())
    return gen
