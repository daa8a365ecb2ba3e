"""`kern run --tp N`: one process, N runtimes (GPUs gpu .. gpu+N-1), tensor-parallel manifests.

The target's manifest `<dir>/<name>.json` names the TP=1 model; the rank manifests are
`<dir>/<name>-tp<N>-r<rank>.json` (tools/gen_qwen3_tp.py). Each rank loads its manifest with
`ranks={"tp": rank}`, the runtimes are joined with `kern_runtime.multigpu.connect.connect_local` (peers, and
every NCCL communicator inside one group call), and the ordinary `Generator` drives a `TpRuntime`:
inputs are written to every rank, programs are issued through the `LocalGroup` (the ranks' calls
interleaved, NCCL collectives grouped, decode captured as one graph per rank), outputs are read from
rank 0 (every rank computes the same tokens: the all-reduced activations are identical).
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from .config import RunConfig, runtime_weights
from .errors import RefusalError, WeightsError
from .generate import GenerateOptions, GenerateResult, Generator
from .preflight import (
    ManifestFacts, check_kernels, check_prompt, check_weights, checkpoint_tensors, load_verified, probe_device,
    read_manifest, resolve_chunk, weight_list_files,
)
from .text import StreamDecoder, checked_prompt, load_codec


def rank_manifest(manifest: Path, tp: int, rank: int) -> Path:
    """`<dir>/<stem>-tp<N>-r<rank>.json` beside the TP=1 manifest."""
    return manifest.with_name(f"{manifest.stem}-tp{tp}-r{rank}.json")


class TpRuntime:
    """The `RuntimeLike` of generate.py over a `LocalGroup`: writes to every rank, issues through the
    group, reads rank 0. Deliberately no `record_event` / `host_array`: the caller uses its
    write-inputs-per-step path."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.rt0 = group.runtimes[0]

    @property
    def page_tokens(self) -> int:
        return self.rt0.page_tokens

    @property
    def num_pages(self) -> int:
        return self.rt0.num_pages

    @property
    def pool(self) -> Any:
        return self.rt0.pool

    @property
    def weight_load_stats(self) -> tuple[int, float]:
        stats = [rt.weight_load_stats for rt in self.group.runtimes]
        return sum(s[0] for s in stats), max(s[1] for s in stats)

    def write_input(self, name: str, array: np.ndarray) -> None:
        self.group.write_input(name, array)

    def issue(self, program: str, values: dict[str, int], eager: bool = False) -> None:
        self.group.issue(program, values, eager=eager)

    def read_output(self, name: str, rows: int | None = None) -> np.ndarray:
        return self.rt0.read_output(name, rows)

    def read_buffer(self, name: str, rows: int | None = None) -> np.ndarray:
        return self.rt0.read_buffer(name, rows)

    def describe(self) -> dict[str, Any]:
        return self.rt0.describe()

    def close(self) -> None:
        self.group.close()


def tp_preflight(cfg: RunConfig, tp: int) -> ManifestFacts:
    """The host-side checks of a TP target: every rank manifest present, rank 0's manifest read (the ranks
    differ only in binds and meta) and its kernels pinned, then the checkpoint against every rank's binds
    (each rank manifest verified; a rank's slice of a tensor must lie inside it), as `kern run` at --tp 1
    checks it. Returns rank 0's facts. Raises RefusalError."""
    paths = [rank_manifest(Path(cfg.manifest), tp, r) for r in range(tp)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise RefusalError(f"--tp {tp}: rank manifest(s) {missing} not found: python tools/gen_qwen3_tp.py "
                           f"--tp {tp} --out-dir {Path(cfg.manifest).parent} ...")
    facts = read_manifest(paths[0])
    check_kernels(facts, cfg.kernels)
    tensors = checkpoint_tensors(cfg.weights)
    for rank, path in enumerate(paths):
        rank_facts = facts
        if rank:
            raw, parsed = load_verified(path, f"; regenerate it with tools/gen_qwen3_tp.py --tp {tp}")
            rank_facts = replace(facts, raw=raw, parsed=parsed)
        try:
            check_weights(rank_facts, tensors, cfg.weights)
        except WeightsError as exc:
            raise WeightsError(f"--tp {tp} rank {rank} ({path.name}): {exc}") from None
    return facts


def open_tp(cfg: RunConfig, tp: int, eos_ids: frozenset[int], log: Any,
            facts: ManifestFacts | None = None) -> tuple[Generator, Any]:
    """Load the rank manifests on GPUs cfg.gpu .. cfg.gpu + tp - 1, connect_local, wrap in a Generator.
    `facts`: what `tp_preflight` returned, when the caller ran it already. Returns (generator, facts of
    rank 0). Raises RefusalError / kern_runtime.KernError."""
    from kern_runtime import Capacity, Runtime, SafetensorsTensors
    from kern_runtime import connect_local

    if facts is None:
        facts = tp_preflight(cfg, tp)
    paths = [rank_manifest(Path(cfg.manifest), tp, r) for r in range(tp)]
    for r in range(tp):
        probe_device(cfg.gpu + r)
    tensors = SafetensorsTensors.open(runtime_weights(cfg.weights))
    rts = []
    t0 = time.perf_counter()
    try:
        for r, path in enumerate(paths):
            rts.append(Runtime.load(str(path), str(cfg.kernels), tensors, gpu=cfg.gpu + r,
                                    capacity=Capacity(tokens=cfg.capacity_tokens, seqs=1), ranks={"tp": r}))
        group = connect_local(rts)
    except BaseException:
        for rt in rts:
            rt.close()
        raise
    log.info(f"tp {tp}: {len(rts)} runtimes on GPUs {cfg.gpu}..{cfg.gpu + tp - 1} loaded and connected in "
             f"{time.perf_counter() - t0:.2f} s (family digest {rts[0].spec.family_digest[:12]})")
    return Generator(TpRuntime(group), facts, eos_ids), facts


def run_tp(cfg: RunConfig, prompt: str, steps: int, eager: bool, ignore_eos: bool, tp: int, log: Any,
           out: TextIO | None = None) -> GenerateResult:
    """`kern run --tp N`: like run_target, over N GPUs. Raises RefusalError / kern_runtime.KernError."""
    out = out if out is not None else sys.stdout
    weight_list_files(cfg.weights)  # a --weights list's entries before the tokenizer beside its first file
    codec = load_codec(cfg.weights)
    facts = tp_preflight(cfg, tp)  # host-only checks (prompt included) before any GPU is touched
    chunk = resolve_chunk(cfg.chunk, facts)
    prompt_ids = checked_prompt(codec, prompt)
    check_prompt(len(prompt_ids), cfg.capacity_tokens, facts)
    gen, facts = open_tp(cfg, tp, codec.eos_ids, log, facts)
    with gen:
        log.info(f"prompt: {len(prompt_ids)} tokens; chunk {chunk}; steps {steps}; tp {tp}; "
                 f"{'eager' if eager else 'graph'} decode")
        stream = StreamDecoder(codec)
        result = gen.generate(prompt_ids, GenerateOptions(steps, chunk, eager, not ignore_eos), stream.writer(out))
        stream.finish(out)
    t = result.timings
    log.info(f"tp {tp}: prefill {t.prefill_tokens} tokens + first token in {t.prefill_s * 1e3:.1f} ms "
             f"({t.prefill_tokens_per_s:.0f} tokens/s); decode {t.decode_ms_per_token:.3f} ms/token; "
             f"{len(result.tokens)} tokens generated (stop: {result.stop_reason})")
    log.info(f"tokens: {result.tokens}")
    return result
