"""`kern run --tp N --tp-local`: one process, N runtimes (GPUs gpu .. gpu+N-1), tensor-parallel manifests (the
default, one process per GPU, is tp_procs.py; this module's host checks and reporting serve both).

The target's manifest `<dir>/<name>.json` names the TP=1 model; the rank manifests are
`<dir>/<name>-tp<N>-r<rank>.json` (kern manifest build --tp N). Each rank loads its manifest with
`ranks={"tp": rank}`, the runtimes are joined with `kern_runtime.connect_local` (peers, and
every NCCL communicator inside one group call), and the ordinary `Generator` drives a `TpRuntime`, the
group's `contract.CallerRuntime`: inputs are written to every rank, programs are issued through the
`LocalGroup` (the ranks' calls interleaved, NCCL collectives grouped, decode captured as one graph per
rank), outputs are read from rank 0 (every rank computes the same tokens: the all-reduced activations are
identical). Every rank manifest is parsed and verified once, by the preflight, and handed to its runtime.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, TextIO

import numpy as np

from .config import RunConfig, runtime_weights
from .contract import SeqLease
from .errors import RefusalError, WeightsError
from .generate import GenerateOptions, GenerateResult, Generator
from .preflight import (
    ManifestFacts, check_capacity, check_kernels, check_prompt, check_weights, checkpoint_tensors, load_verified,
    probe_device, read_manifest, resolve_chunk, weight_list_files,
)
from .text import StreamDecoder, checked_prompt, load_codec


def rank_manifest(manifest: Path, tp: int, rank: int) -> Path:
    """`<dir>/<stem>-tp<N>-r<rank>.json` beside the TP=1 manifest."""
    return manifest.with_name(f"{manifest.stem}-tp{tp}-r{rank}.json")


class GroupPages:
    """Leases of one kern_pool `Pool` over rank 0's pool layout (`Runtime.pool.layout`), for a TP group's caller: the
    ranks share page ids (same manifest family, same capacity); a lease's plan is executed on no device, and with
    paged states only (the Qwen3 manifests) a fresh lease plans no copies."""

    def __init__(self, rt0: Any) -> None:
        from kern_pool import Pool

        layout = rt0.pool
        self._pool = Pool(layout.layout) if layout is not None else None

    def lease(self, num_tokens: int) -> SeqLease:
        """Pages for `num_tokens` tokens, the same ids on every rank. Raises kern_pool `PoolError` (ExceedsPool,
        Busy), ApiError without paged states."""
        if self._pool is None:
            from kern_runtime import ApiError

            raise ApiError("the manifest declares no paged or per-seq states: there is no pool")
        return self._pool.lease(num_tokens)


class TpRuntime:
    """The `contract.CallerRuntime` of a `LocalGroup`: writes to every rank (the group's `write_input`), issues
    through the group, reads rank 0. Its pages are leases of one kern_pool `Pool` over rank 0's pool layout
    (`Runtime.pool.layout`): the ranks share page ids (same manifest family, same capacity); a lease's plan is
    not executed, and with paged states only (the Qwen3 manifests) a fresh lease plans no copies. Deliberately not a `DeviceSteps` (no `record_event` / `host_array`) nor a `PrefixRuntime`: the
    Generator uses its write-inputs-per-step loop, and prefix reuse is single-GPU."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.rt0 = group.runtimes[0]
        self._pages = GroupPages(self.rt0)

    @property
    def page_tokens(self) -> int | None:
        return self.rt0.page_tokens

    @property
    def num_pages(self) -> int | None:
        return self.rt0.num_pages

    @property
    def weight_load_stats(self) -> tuple[int, float]:
        """(bytes of every rank, seconds of the slowest rank)."""
        stats = [rt.weight_load_stats for rt in self.group.runtimes]
        return sum(s[0] for s in stats), max(s[1] for s in stats)

    def write_input(self, name: str, array: np.ndarray) -> None:
        self.group.write_input(name, array)

    def issue(self, program: str, vars: Mapping[str, int] | None = None, eager: bool = False) -> None:
        self.group.issue(program, vars, eager=eager)

    def read_output(self, name: str, rows: int | None = None) -> np.ndarray:
        return self.rt0.read_output(name, rows)

    def read_buffer(self, name: str, rows: int | None = None) -> np.ndarray:
        return self.rt0.read_buffer(name, rows)

    def lease(self, num_tokens: int, *, wait: bool = True) -> SeqLease:
        """GroupPages.lease (`wait` is the contract's: these leases never wait for a remap)."""
        return self._pages.lease(num_tokens)

    def describe(self) -> dict[str, Any]:
        return self.rt0.describe()

    def into_resident(self) -> None:
        """None: the group does not keep weights for a next load (it stays open)."""
        return None

    def close(self) -> None:
        self.group.close()


def tp_preflight(cfg: RunConfig, tp: int) -> list[ManifestFacts]:
    """The host-side checks of a TP target: every rank manifest present, rank 0's manifest read (the ranks
    differ only in binds and meta) and its kernels pinned, then the checkpoint against every rank's binds
    (each rank manifest parsed and verified, once; a rank's slice of a tensor must lie inside it), as `kern run`
    at --tp 1 checks it. Returns the facts of every rank, rank 0 first: rank 0's facts with each rank's own
    verified Manifest. Raises RefusalError."""
    paths = [rank_manifest(Path(cfg.manifest), tp, r) for r in range(tp)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        shown = missing if len(missing) <= 4 else [*missing[:3], f"... ({len(missing)} in all)"]
        raise RefusalError(f"--tp {tp}: rank manifest(s) {shown} not found: kern manifest build "
                           f"--tp {tp} --out {cfg.manifest} ...")
    facts = read_manifest(paths[0])
    check_capacity(cfg.capacity_tokens, cfg.capacity_from, facts)
    check_kernels(facts, cfg.kernels)
    tensors = checkpoint_tensors(cfg.weights)
    ranks = []
    for rank, path in enumerate(paths):
        rank_facts = facts
        if rank:
            manifest = load_verified(path, f"; regenerate it with kern manifest build --tp {tp}")
            rank_facts = replace(facts, manifest=manifest)
        try:
            check_weights(rank_facts, tensors, cfg.weights)
        except WeightsError as exc:
            raise WeightsError(f"--tp {tp} rank {rank} ({path.name}): {exc}") from None
        ranks.append(rank_facts)
    return ranks


def open_tp(cfg: RunConfig, tp: int, eos_ids: frozenset[int], log: Any,
            ranks: list[ManifestFacts] | None = None) -> tuple[Generator, ManifestFacts]:
    """Load the rank manifests on GPUs cfg.gpu .. cfg.gpu + tp - 1, connect_local, wrap in a Generator.
    `ranks`: what `tp_preflight` returned, when the caller ran it already (each rank's runtime loads its verified
    Manifest, as it is). Returns (generator, facts of rank 0). Raises RefusalError /
    kern_runtime.KernError."""
    from kern_runtime import Capacity, Runtime, SafetensorsTensors
    from kern_runtime import connect_local

    if ranks is None:
        ranks = tp_preflight(cfg, tp)
    paths = [rank_manifest(Path(cfg.manifest), tp, r) for r in range(tp)]
    for r in range(tp):
        probe_device(cfg.gpu + r)
    tensors = SafetensorsTensors.open(runtime_weights(cfg.weights))
    rts = []
    t0 = time.perf_counter()
    try:
        for r, (path, rank_facts) in enumerate(zip(paths, ranks)):
            rts.append(Runtime.load(rank_facts.manifest, str(cfg.kernels), tensors,
                                    gpu=cfg.gpu + r, capacity=Capacity(tokens=cfg.capacity_tokens, seqs=1),
                                    ranks={"tp": r}))
        group = connect_local(rts)
    except BaseException:
        for rt in rts:
            rt.close()
        raise
    facts = ranks[0]
    log.info(f"tp {tp}: {len(rts)} runtimes on GPUs {cfg.gpu}..{cfg.gpu + tp - 1} loaded and connected in "
             f"{time.perf_counter() - t0:.2f} s (family digest {facts.manifest.family_digest[:12]})")
    return Generator(TpRuntime(group), facts, eos_ids), facts


def generate_tp(gen: Generator, codec: Any, prompt_ids: list[int], chunk: int, steps: int, eager: bool,
                ignore_eos: bool, tp: int, log: Any, out: TextIO) -> GenerateResult:
    """Generate with a TP group's Generator, streaming text to `out`, and log the timings and tokens (what
    `kern run --tp N` prints, whichever process model holds the ranks)."""
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


def tp_host_checks(cfg: RunConfig, prompt: str, tp: int) -> tuple[list[ManifestFacts], int, Any, list[int]]:
    """`kern run --tp N`'s checks before any GPU: the rank manifests, checkpoint, chunk, tokenizer and prompt.
    Returns (every rank's facts, chunk, codec, prompt ids). Raises RefusalError."""
    ranks = tp_preflight(cfg, tp)
    chunk = resolve_chunk(cfg.chunk, ranks[0])
    weight_list_files(cfg.weights)  # a --weights list's entries before the tokenizer beside its first file
    codec = load_codec(cfg.weights)  # after the weights: weights never made are refused as such, not as no tokenizer
    prompt_ids = checked_prompt(codec, prompt)
    check_prompt(len(prompt_ids), cfg.capacity_tokens, ranks[0])
    return ranks, chunk, codec, prompt_ids


def run_tp(cfg: RunConfig, prompt: str, steps: int, eager: bool, ignore_eos: bool, tp: int, log: Any,
           out: TextIO | None = None) -> GenerateResult:
    """`kern run --tp N --tp-local`: like run_target, over N GPUs of this process (connect_local). Raises
    RefusalError / kern_runtime.KernError."""
    out = out if out is not None else sys.stdout
    ranks, chunk, codec, prompt_ids = tp_host_checks(cfg, prompt, tp)  # host-only checks before any GPU is touched
    gen, _ = open_tp(cfg, tp, codec.eos_ids, log, ranks)
    with gen:
        return generate_tp(gen, codec, prompt_ids, chunk, steps, eager, ignore_eos, tp, log, out)
